"""Idle strategies for polling agents: what to do after a loop that found no work.

Each agent's loop returns how much work it did; ``idle(work)`` resets on work
and otherwise escalates. ``backoff`` (spin, then yield, then park for growing
periods) is the default because on a 2-core machine the model, the dataplane
and emulated ducks share the cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["IDLE_STRATEGIES", "IdleStrategy"]

IDLE_STRATEGIES = ("spin", "yield", "backoff")


class IdleStrategy:
    """``park(seconds)`` is how the agent sleeps; a poller that wakes on control traffic is best."""

    def __init__(
        self,
        kind: str = "backoff",
        *,
        park: Callable[[float], object] = time.sleep,
        spins: int = 200,
        yields: int = 50,
        min_park_s: float = 20e-6,
        max_park_s: float = 1e-3,
    ) -> None:
        if kind not in IDLE_STRATEGIES:
            raise ValueError(f"idle strategy must be one of {IDLE_STRATEGIES}, not {kind!r}")
        self.kind = kind
        self._park = park
        self._spins, self._yields = spins, yields
        self._min, self._max = min_park_s, max_park_s
        self._count = 0
        self._period = min_park_s

    def idle(self, work: int) -> None:
        if work > 0:
            self._count = 0
            self._period = self._min
            return
        if self.kind == "spin":
            return
        if self.kind == "yield":
            os.sched_yield()
            return
        self._count += 1
        if self._count <= self._spins:
            return
        if self._count <= self._spins + self._yields:
            os.sched_yield()
            return
        self._park(self._period)
        self._period = min(self._period * 2, self._max)
