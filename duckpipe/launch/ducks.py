"""Run the duck emulator ``duckpipe-ducks`` as a child process, and the ``duckpipe ducks`` command.

``duckpipe-ducks`` emulates up to 32 ducks in one process (on ``--threads`` worker threads,
by default one per CPU it may use, each computing its own group of ducks): duck ``i`` has id
``first_id + i`` and listens on UDP ``bind[i]:base_port + i``. It speaks the wire
protocol of :mod:`duckpipe.schema.wire` and computes real MLP shards::

    with DucksProcess(ducks=24, base_port=47100) as ducks:
        for duck_id, ip, port in ducks.addresses:
            ...
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from .. import host
from ..errors import DuckpipeError
from ..schema.abi import EMULATOR_MAX_DUCKS
from ..schema.abi import MAX_DUCKS as DATAPLANE_MAX_DUCKS
from .binaries import find_binary

__all__ = [
    "BINARY",
    "DEFAULT_BASE_PORT",
    "MAX_DUCKS",
    "DucksProcess",
    "add_parser",
    "command_line",
    "format_counters",
    "parse_counters",
]

BINARY = "duckpipe-ducks"
DEFAULT_BASE_PORT = 47100
MAX_DUCKS = EMULATOR_MAX_DUCKS  # the C emulator's DP_EMULATOR_MAX_DUCKS (dp_abi.h)

READY = re.compile(
    rb"^duckpipe-ducks: (\d+) ducks, ids (\d+)\.\.(\d+), on (\S+):(\d+)\.\.(\d+) \(pid (\d+)\)$"
)
COUNTER = re.compile(r"([a-z][a-z0-9_]*)=(\d+)")


def parse_counters(text: str) -> dict[str, int]:
    """The counters line the emulator prints to stderr when it stops (the last one wins)."""
    for line in reversed(text.splitlines()):
        pairs = line.split()
        if pairs and all(COUNTER.fullmatch(p) for p in pairs):
            return {k: int(v) for k, v in (p.split("=", 1) for p in pairs)}
    return {}


def format_counters(counters: dict[str, int], width: int = 80) -> str:
    """The emulator's counters as an aligned table, filled down columns to ``width``."""
    if not counters:
        return ""
    names = max(len(k) for k in counters)
    values = max(len(f"{v:,}") for v in counters.values())
    cell = names + 2 + values
    cols = max(1, (width + 4) // (cell + 4))
    rows = -(-len(counters) // cols)
    items = list(counters.items())
    lines = []
    for r in range(rows):
        cells = [
            f"{k:<{names}}  {v:>{values},}" for k, v in items[r::rows]
        ]  # column c holds items c*rows .. c*rows + rows - 1
        lines.append("    ".join(cells).rstrip())
    return "\n".join(lines)


class DucksProcess:
    """``with DucksProcess(ducks=8) as ducks: ...``: a running ``duckpipe-ducks``.

    ``bind`` is one IPv4 address for every duck or a comma list with one per duck;
    ``args`` are further options (``["--compute", "echo", "--drop", "0.1"]``).
    """

    def __init__(
        self,
        *,
        ducks: int = 8,
        bind: str = "127.0.0.1",
        base_port: int = DEFAULT_BASE_PORT,
        first_id: int = 0,
        args: Sequence[str] = (),
        ready_timeout: float = 10.0,
    ) -> None:
        ips = bind.split(",")
        if not 1 <= ducks <= MAX_DUCKS:
            raise DuckpipeError(f"the duck emulator runs 1..{MAX_DUCKS} ducks, not {ducks}")
        if len(ips) not in (1, ducks):
            raise DuckpipeError(
                f"bind lists {len(ips)} addresses for {ducks} ducks: give one, or one per duck"
            )
        self.ducks = ducks
        self.bind = bind
        self.base_port = base_port
        self.first_id = first_id
        self.args = list(args)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_line = ""
        self._ips = ips
        self._stdout = b""
        self._log = tempfile.TemporaryFile()

    @property
    def addresses(self) -> list[tuple[int, str, int]]:
        """``(duck id, ip, port)`` of every duck."""
        return [
            (self.first_id + i, self._ips[i if len(self._ips) > 1 else 0], self.base_port + i)
            for i in range(self.ducks)
        ]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            str(find_binary(BINARY)),
            "--ducks",
            str(self.ducks),
            "--bind",
            self.bind,
            "--base-port",
            str(self.base_port),
            "--first-id",
            str(self.first_id),
            *self.args,
        ]

    def start(self) -> DucksProcess:
        """Start it and wait for its ready line; DuckpipeError with its output if it fails."""
        if self.proc is not None:
            raise DuckpipeError("this DucksProcess was already started")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.ready_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._stdout:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise DuckpipeError(
                        f"{BINARY} did not report ready in {self.ready_timeout:g} s:\n"
                        f"{self.output()}"
                    )
                if sel.select(left):
                    chunk = os.read(fd, 4096)
                    if not chunk:  # stdout closed: it exited (or is about to)
                        rc = self.proc.wait(self.ready_timeout)
                        raise DuckpipeError(f"{BINARY} exited with {rc}:\n{self.output()}")
                    self._stdout += chunk
        line = self._stdout.split(b"\n", 1)[0]
        if not READY.match(line):
            self.kill()
            raise DuckpipeError(f"{BINARY} printed an unexpected first line:\n{self.output()}")
        self.ready_line = line.decode()
        return self

    def output(self) -> str:
        """What it printed so far, stdout then stderr."""
        self._log.seek(0)
        err = self._log.read()
        return (self._stdout + err).decode(errors="replace")

    def counters(self) -> dict[str, int]:
        """Its counters, once it has stopped (empty before)."""
        self._log.seek(0)
        return parse_counters(self._log.read().decode(errors="replace"))

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM (it prints its counters and exits 0), then SIGKILL; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_stdout()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close_stdout()

    def _close_stdout(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> DucksProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


# ----------------------------------------------------------------------------- CLI

_OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--ducks", {"type": int, "help": f"ducks to emulate (default 8, at most {MAX_DUCKS})"}),
    ("--bind", {"help": "IP of every duck, or a comma list, one per duck (default 127.0.0.1)"}),
    (
        "--base-port",
        {
            "type": int,
            "help": f"duck i listens on P + i (default: this user's, {DEFAULT_BASE_PORT} for "
            "root; docs/walkthrough.md, ports)",
        },
    ),
    ("--first-id", {"type": int, "help": "duck i has id K + i (default 0)"}),
    ("--mtu", {"type": int, "help": "MTU that sizes the partials' datagrams (default 1500)"}),
    ("--compute", {"choices": ("real", "echo"), "help": "real MLP shards, or x * (id + 1)"}),
    ("--drop", {"type": float, "help": "fault: lose each datagram in and out with this chance"}),
    ("--delay-us", {"type": int, "help": "fault: hold every reply this many microseconds"}),
    ("--stop-after", {"type": int, "help": "fault: stop answering after N computed forwards"}),
    ("--restart-after", {"type": int, "help": "fault: forget all layers after N forwards"}),
    ("--seed", {"type": int, "help": "seed of --drop"}),
    (
        "--threads",
        {
            "type": int,
            "help": "worker threads, each computing its own group of ducks "
            "(default: every CPU it may use)",
        },
    ),
    (
        "--isa",
        {"choices": ("auto", "avx2", "portable"), "help": "the compute kernels (default auto)"},
    ),
)


def command_line(args: argparse.Namespace) -> list[str]:
    """The ``duckpipe-ducks`` argv for the options given to ``duckpipe ducks``."""
    argv = [str(find_binary(BINARY))]
    for flag, _ in _OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None:
            argv += [flag, str(value)]
    if getattr(args, "no_gso", False):
        argv.append("--no-gso")
    if getattr(args, "verbose", False):
        argv.append("--verbose")
    return argv


def _too_many(ducks: int, base_port: int, first_id: int) -> str:
    """How to emulate more ducks than one process does: several, side by side."""
    n = -(-ducks // MAX_DUCKS)
    lines = [
        f"duckpipe ducks: one emulator runs at most {MAX_DUCKS} ducks, not {ducks}; run {n} "
        f"emulators side by side, each with its own --first-id and --base-port:"
    ]
    shown = list(range(n)) if n <= 4 else [0, 1, 2, n - 1]
    for k in shown:
        if k == n - 1 and n > 4:
            lines.append(f"  ... ({n - 4} more, the same way)")
        count = min(MAX_DUCKS, ducks - k * MAX_DUCKS)
        lines.append(
            f"  duckpipe ducks --ducks {count} --first-id {first_id + k * MAX_DUCKS} "
            f"--base-port {base_port + k * MAX_DUCKS} &"
        )
    if ducks <= DATAPLANE_MAX_DUCKS:
        lines.append(f"then one dataplane for all of them: duckpipe dataplane --ducks {ducks}")
    else:
        lines.append(
            f"(one dataplane serves at most {DATAPLANE_MAX_DUCKS} ducks: more take another "
            "dataplane, with its own --control and ports)"
        )
    return "\n".join(lines)


def _die_with_parent() -> None:
    """In the child: SIGTERM when ``duckpipe ducks`` dies (even by SIGKILL)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _run(args: argparse.Namespace) -> int:
    """Run the emulator as a child: its stdout passes through, its stderr is read here so
    that the counters it prints when it stops come out as a table."""
    if args.base_port is None:
        args.base_port = host.default_ports()[1]
    ducks = 8 if args.ducks is None else args.ducks
    if ducks > MAX_DUCKS:
        print(_too_many(ducks, args.base_port, args.first_id or 0), file=sys.stderr)
        return 2
    try:
        argv = command_line(args)
    except DuckpipeError as e:
        print(f"duckpipe: {e}", file=sys.stderr)
        return 1
    started: list[subprocess.Popen[str]] = []
    early: list[int] = []  # signals that came before the emulator did

    def forward(signum: int, _frame: object) -> None:
        # Ctrl-C reaches the whole process group already; kill(1) reaches only us
        if not started:
            early.append(signum)
        elif started[0].poll() is None:
            started[0].send_signal(signum)

    # before the start: a SIGTERM sent as soon as the emulator says it is ready (it prints
    # that itself) must reach it, not end this process and leave the table unprinted
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        proc = subprocess.Popen(
            argv, stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=_die_with_parent
        )
    except OSError as e:
        print(f"duckpipe: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 1
    started.append(proc)
    for signum in early:
        proc.send_signal(signum)
    assert proc.stderr is not None
    for line in proc.stderr:  # until it exits
        counters = parse_counters(line)
        if counters:
            print(f"{BINARY} counters:\n{format_counters(counters)}", file=sys.stderr)
        else:
            sys.stderr.write(line)
    return proc.wait()


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``duckpipe ducks [options]``: run the duck emulator in the foreground."""
    p = subparsers.add_parser(
        "ducks",
        help="run the duck emulator (duckpipe-ducks) in the foreground",
        description=f"Emulate up to {MAX_DUCKS} ducks on UDP sockets; for more, run more "
        "emulators with their own --first-id and --base-port. Ctrl-C prints the counters "
        "as a table and exits.",
    )
    for flag, kw in _OPTIONS:
        p.add_argument(flag, **kw)
    p.add_argument("--no-gso", action="store_true", help="send partials with sendmmsg, not GSO")
    p.add_argument(
        "-v", "--verbose", action="store_true", help="say why dropped routed forwards were dropped"
    )
    p.set_defaults(func=_run)
    return p
