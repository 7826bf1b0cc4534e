"""A progress bar for long transfers, drawn on stderr only when it is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``with Progress(total, "weights") as bar: bar.advance(n)``; silent when not a tty."""

    def __init__(
        self, total: int, label: str, *, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last_draw > 0.1 or self.done >= self.total):
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = self.done / max(now - self._start, 1e-9) / 1e6
        self.stream.write(
            f"\r{self.label} [{bar}] {frac * 100:5.1f}% "
            f"{self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB {rate:7.1f} MB/s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            if self._last_draw == 0.0 or self.done < self.total:
                self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
