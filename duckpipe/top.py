"""duckpipe-top: the live inspector of rings, NIC workers, ducks and processes (its own issue)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    print(
        "duckpipe-top: not yet implemented; `duckpipe stats` and `duckpipe shm ls` show the "
        "counters and segments meanwhile",
        file=sys.stderr,
    )
    return 2
