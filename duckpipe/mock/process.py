"""Run a mock dataplane as a child process (for tests, examples and the demo)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..launch.process import DataplaneChild, control_request, ping

__all__ = ["MockDataplaneProcess", "control_request", "ping"]


class MockDataplaneProcess(DataplaneChild):
    """``with MockDataplaneProcess(ducks=24) as dp: duckpipe.connect(dp.control)``."""

    what = "mock dataplane"

    def __init__(
        self,
        *,
        ducks: int = 8,
        control: str | None = None,
        args: Sequence[str] = (),
        ready_timeout: float = 30.0,
    ) -> None:
        super().__init__(control=control, ready_timeout=ready_timeout)
        self.ducks = ducks
        self.args = list(args)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "duckpipe",
            "mock-dataplane",
            "--control",
            self.control,
            "--ducks",
            str(self.ducks),
            *self.args,
        ]
