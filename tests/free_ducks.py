"""An emulator on a random run of free ports, for tests that start their own ducks.

Tests never take fixed ports (another dataplane or CI run may hold them): this picks a
random run in 40000..60000 and tries again when one of its ports is taken.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from duckpipe.errors import DuckpipeError
from duckpipe.launch.ducks import DucksProcess


def start_ducks(ducks: int = 1, args: Sequence[str] = (), first_id: int = 0) -> DucksProcess:
    """A started DucksProcess of ``ducks`` ducks with ``args``, ids from ``first_id``."""
    last: DuckpipeError | None = None
    for _ in range(20):
        base = random.randrange(40000, 60000 - ducks)
        proc = DucksProcess(ducks=ducks, base_port=base, first_id=first_id, args=args)
        try:
            return proc.start()
        except DuckpipeError as e:
            if "port in use?" not in str(e):
                raise
            last = e
    raise AssertionError(f"no free ports found: {last}")
