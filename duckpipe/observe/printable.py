"""Text that is safe to put on a person's terminal.

A client names itself and its segment; a process names its threads. Those strings reach
duckpipe-top, ``duckpipe stats``, ``duckpipe shm ls`` and the logs, where an escape
sequence (``ESC]0;...BEL`` retitles the window, ``ESC[2J`` clears it) or a bidi override
would act on the admin's terminal instead of being shown. The dataplanes refuse such
names at attach (``schema.control.PRINTABLE_ASCII``); every human-readable output escapes
what it shows anyway, since a stats segment, /proc or an older dataplane may still hold
one (issue 17).
"""

from __future__ import annotations

import logging
from types import TracebackType

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

__all__ = ["PrintableFormatter", "printable"]


def _escape(ch: str) -> str:
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal could act on or hide (C0 and C1 controls,
    DEL, Unicode format characters such as bidi overrides, line and paragraph separators,
    unassigned code points) written as a Python escape: ``"\\x1b]0;PWN\\x07"``."""
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


class PrintableFormatter(logging.Formatter):
    """A log formatter whose lines hold no control character: a message that carries a
    client's string cannot forge a log line (a newline) or drive the terminal tailing it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))  # a newline in it too: one line

    def formatException(self, ei: ExcInfo) -> str:
        # a traceback keeps its lines, each of them escaped
        return "\n".join(printable(line) for line in super().formatException(ei).split("\n"))
