"""The pytest plugin's fixtures (entry point ``pytest11``: ``duckpipe.testing.plugin``).

They live apart from :mod:`duckpipe.testing` so that its helpers (``set_faults``,
``null_backend_result``, ``null_topology``...) import without pytest, in scripts; this
module is imported only by pytest. Each fixture's docstring is what ``pytest --fixtures``
shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from ..mock.process import MockDataplaneProcess
from . import assert_clean_exit, cluster_class_or_skip, null_topology

__all__ = [
    "duckpipe_client",
    "duckpipe_cluster_factory",
    "duckpipe_mock",
    "duckpipe_mock_factory",
    "duckpipe_null_factory",
]


@pytest.fixture(scope="module")
def duckpipe_mock() -> Iterator[MockDataplaneProcess]:
    """A mock dataplane with 8 ducks, shared by the test module.

    Connect to it with ``duckpipe.connect(duckpipe_mock)`` (or its address,
    ``duckpipe_mock.control``); or take a ready client from ``duckpipe_client``."""
    with MockDataplaneProcess(ducks=8) as dp:
        yield dp


@pytest.fixture
def duckpipe_client(duckpipe_mock: MockDataplaneProcess) -> Iterator:
    """A ``duckpipe.Client`` connected to the module's ``duckpipe_mock`` (8 ducks),
    closed after the test: its layers go with it."""
    from ..client.api import connect

    with connect(duckpipe_mock, name="pytest") as client:
        yield client


@pytest.fixture
def duckpipe_cluster_factory() -> Iterator:
    """``duckpipe_cluster_factory(ducks, duck_args=[...], **settings)``: emulated ducks and
    the C dataplane on loopback, stopped (and checked for a clean exit) after the test."""
    cluster_cls = cluster_class_or_skip()
    started = []

    def start(ducks: int = 4, **kw):
        cl = cluster_cls(ducks, **kw).start()
        started.append(cl)
        return cl

    yield start
    for cl in started:
        assert_clean_exit(cl)


@pytest.fixture
def duckpipe_mock_factory() -> Iterator:
    """``duckpipe_mock_factory(ducks=8, args=[...])``: a private mock dataplane for this
    test (``args``: its command-line flags, e.g. ``["--dead-duck", "3"]``), stopped after
    it. ``.control`` is its address; pass it (or the object) to ``duckpipe.connect``."""
    started: list[MockDataplaneProcess] = []

    def start(*, ducks: int = 8, args: Sequence[str] = ()) -> MockDataplaneProcess:
        dp = MockDataplaneProcess(ducks=ducks, args=args)
        started.append(dp)
        return dp.start()

    yield start
    for dp in started:
        dp.__exit__(None, None, None)


@pytest.fixture
def duckpipe_null_factory() -> Iterator:
    """``duckpipe_null_factory(ducks=8, nics=1, broadcast=False, **settings)``: the C
    dataplane with the ``null`` backend (see :func:`null_backend_result`), stopped and
    checked for a clean exit after the test."""
    from ..errors import DuckpipeError
    from ..launch.binaries import find_binary
    from ..launch.dataplane import DataplaneProcess

    try:
        find_binary("duckpipe-dataplane")
    except DuckpipeError as e:
        pytest.skip(str(e))
    started: list[DataplaneProcess] = []

    def start(ducks: int = 8, **kw) -> DataplaneProcess:
        dp = DataplaneProcess(null_topology(ducks, **kw))
        started.append(dp)
        return dp.start()

    yield start
    for dp in started:
        assert_clean_exit(dp)
