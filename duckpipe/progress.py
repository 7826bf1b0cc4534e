"""A progress bar for long transfers on stderr: ``\\r`` frames on a terminal only."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

#: Seconds between plain lines when the stream is not a terminal (a log file, a pipe).
LINE_INTERVAL_S = 2.0


class Progress:
    """``with Progress(total, "weights") as bar: bar.advance(n)``: ``total`` bytes, or
    ``total`` of what ``unit`` names (``Progress(256, "experts read", unit="experts")``).

    ``enabled=None``: drawn only when the stream is a terminal. ``enabled=True`` on a
    stream that is not a terminal: a plain line every ``LINE_INTERVAL_S`` seconds and
    one at the end, never a ``\\r`` frame (a log file keeps readable lines).
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        unit: str | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.enabled = self.tty if enabled is None else enabled
        self.total = max(total, 1)
        self.label = label
        #: None: ``total`` is bytes (MB and MB/s shown); else what is counted ("experts")
        self.unit = unit
        self.done = 0
        #: what the transfer waits on, after the figures (``note``): "" when nothing
        self.waiting = ""
        self._start = time.monotonic()
        self._last_draw = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        self.tick(force=self.done >= self.total)

    def note(self, waiting: str) -> None:
        """Say what the transfer is waiting on (``""``: nothing); drawn with the figures."""
        if waiting != self.waiting:
            self.waiting = waiting
            self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        """Redraw if it is time: a bar whose figures do not move (nothing acknowledged)
        still shows that it waits, and on what."""
        now = time.monotonic()
        if not self.enabled:
            return
        if self.tty:
            draw = force or now - self._last_draw > 0.1
        else:  # a plain line once the transfer has taken a while, then one per interval
            draw = now - max(self._last_draw, self._start) >= LINE_INTERVAL_S
        if draw:
            self._last_draw = now
            self._draw(now)

    def _text(self, now: float) -> str:
        frac = min(self.done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = self.done / max(now - self._start, 1e-9)
        if self.unit is None:
            figures = f"{self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB {rate / 1e6:7.1f} MB/s"
        else:
            figures = f"{self.done}/{self.total} {self.unit} {rate:7.1f}/s"
        text = f"{self.label} [{bar}] {frac * 100:5.1f}% {figures}"
        return f"{text}, {self.waiting}" if self.waiting else text

    def _draw(self, now: float) -> None:
        if self.tty:  # \x1b[K: a shorter line (the note gone) leaves no tail of the last
            self.stream.write("\r" + self._text(now) + "\x1b[K")
        else:
            self.stream.write(self._text(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if self._last_draw == 0.0 or self.done < self.total:
                self._draw(now)
            self.stream.write("\n")
            self.stream.flush()
        else:
            self._draw(now)  # the final state, once

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
