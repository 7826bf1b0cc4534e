"""pytest plugin: a mock dataplane to test duckpipe clients against.

Installed with duckpipe (entry point ``pytest11``)::

    def test_my_model(duckpipe_mock):
        with duckpipe.connect(duckpipe_mock.control) as client:
            ...

``duckpipe_mock`` is one mock dataplane with 8 ducks per test module;
``duckpipe_mock_factory(ducks=24, args=[...])`` starts private ones for a test
(faults, crashes) and stops them after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from .errors import DataplaneRefused, DataplaneUnavailable
from .mock.process import MockDataplaneProcess, control_request
from .schema import control as ctl

__all__ = ["MockDataplaneProcess", "duckpipe_mock", "duckpipe_mock_factory", "set_faults"]


def set_faults(
    control: str,
    *,
    delay_ms: float = 0.0,
    dead_ducks: Sequence[int] = (),
    crash_after: int | None = None,
) -> None:
    """Change a running mock dataplane's fault knobs (replacing the previous ones)."""
    msg = ctl.SetFaults(
        req_id=1, delay_ms=delay_ms, dead_ducks=list(dead_ducks), crash_after=crash_after
    )
    reply = control_request(control, msg, 5.0)
    if reply is None:
        raise DataplaneUnavailable(f"no dataplane answered at {control}")
    if isinstance(reply, ctl.Error):
        raise DataplaneRefused(reply.code, reply.message)


@pytest.fixture(scope="module")
def duckpipe_mock() -> Iterator[MockDataplaneProcess]:
    with MockDataplaneProcess(ducks=8) as dp:
        yield dp


@pytest.fixture
def duckpipe_mock_factory() -> Iterator:
    started: list[MockDataplaneProcess] = []

    def start(*, ducks: int = 8, args: Sequence[str] = ()) -> MockDataplaneProcess:
        dp = MockDataplaneProcess(ducks=ducks, args=args)
        started.append(dp)
        return dp.start()

    yield start
    for dp in started:
        dp.__exit__(None, None, None)
