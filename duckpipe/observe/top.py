"""duckpipe-top: the live inspector of rings, NIC workers, ducks and processes (issue 10).

It reads the dataplane's stats segment (``duckpipe.observe.stats_reader.read_snapshot``: no lock, no
message) once per interval, samples the processes involved with psutil and /proc, and
draws what ``duckpipe.observe.topview.build_view`` makes of the last two reads. Nothing it does
changes a counter.

    duckpipe-top                    the dataplane at the default control endpoint, live
    duckpipe-top --stats PATH       the dataplane whose stats segment is PATH
    duckpipe-top --once             every pane once, as plain text (rates over 0.5 s)
    duckpipe-top --json             every counter and derived rate as one JSON document

Keys: 1-6 or Tab / Shift-Tab switch panes (6, MoE experts, once a MoE layer ran), s
cycles the sort column, r reverses it, arrows / PgUp / PgDn scroll, q quits. The chosen
pane sits under a two-line summary and the alerts; below 40 rows it has the screen to
itself (at 80x24 a split would leave too few rows for 24 ducks), from 40 rows the
latency pane (or the rings, when latency is chosen) stays under it. A wide terminal
shows more columns (the least needed go first).
"""

from __future__ import annotations

import argparse
import curses
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil

from ..errors import DuckpipeError
from .printable import printable
from .topview import (
    PANES,
    ProcSample,
    ThreadSample,
    View,
    alert_rows,
    build_view,
    derive_rates,
    fit_columns,
    render_table,
    render_text,
    same_dataplane,
    wrap_phrases,
)

__all__ = ["ProcessSampler", "main"]

ONCE_INTERVAL = 0.5  # --once / --json: two reads this far apart, unless -u says otherwise
EMULATOR_NAME = "duckpipe-ducks"
TALL = 40  # rows from which the live screen shows a second pane under the chosen one


# ---------------------------------------------------------------- reading


def _reader(args: argparse.Namespace) -> Callable[[], Any]:
    from . import stats_reader as stats

    path = Path(args.stats) if args.stats else None

    def read() -> Any:
        snap = stats.read_snapshot(path=path, control=args.control)
        if not psutil.pid_exists(snap.dataplane.pid):  # a segment its writer left behind
            raise stats.NoDataplane(
                f"no dataplane running: pid {snap.dataplane.pid}, which wrote "
                f"{snap.dataplane.stats_path}, has exited"
            )
        return snap

    return read


def _no_dataplane_errors() -> tuple[type[BaseException], ...]:
    from .stats_reader import NoDataplane

    # OSError, ValueError: a segment unmapped or cut short under the reader, as the
    # dataplane exits; the live screen says so and keeps polling
    return (NoDataplane, DuckpipeError, OSError, ValueError)


def _thread_core(pid: int, tid: int) -> int | None:
    """The CPU thread ``tid`` last ran on: field 39 of /proc/<pid>/task/<tid>/stat."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()  # fields 3.. (comm may hold spaces)
    try:
        return int(fields[39 - 3])
    except (IndexError, ValueError):
        return None


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class ProcessSampler:
    """CPU %, RSS and threads of the dataplane, its clients and the duck emulators; CPU
    shares are measured between two calls of :meth:`sample` (None at the first)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._thread_times: dict[tuple[int, int], float] = {}
        self._last: float | None = None

    @staticmethod
    def emulators(snap: Any) -> list[int]:
        """The duck emulators serving this dataplane's ducks: ``duckpipe-ducks`` processes
        bound to one of the ducks' UDP addresses (others on the host are not its own)."""
        ports = set()
        for d in snap.ducks:
            host, _, port = d.address.rpartition(":")
            if host and port.isdigit():
                ports.add(int(port))
        if not ports:
            return []
        pids = []
        for p in psutil.process_iter(["name", "cmdline"]):
            cmd = p.info.get("cmdline") or []
            if p.info.get("name") != EMULATOR_NAME and not (
                cmd and os.path.basename(cmd[0]) == EMULATOR_NAME
            ):
                continue
            try:
                conns = p.net_connections(kind="udp")
            except (psutil.Error, OSError):
                continue
            if any(c.laddr and c.laddr.port in ports for c in conns):
                pids.append(p.pid)
        return pids

    def sample(self, snap: Any) -> list[ProcSample]:
        now = time.monotonic()
        dt = now - self._last if self._last is not None else 0.0
        self._last = now
        wanted: dict[int, str] = {snap.dataplane.pid: "dataplane"}
        names = {snap.dataplane.pid: f"{snap.dataplane.kind} dataplane"}
        for c in snap.clients:
            wanted.setdefault(c.pid, "client")
            names.setdefault(c.pid, c.name)
        for pid in self.emulators(snap):
            wanted.setdefault(pid, "ducks")
        out = []
        times: dict[tuple[int, int], float] = {}
        for pid, role in wanted.items():
            proc = self._procs.get(pid)
            try:
                if proc is None or not proc.is_running():
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call only starts the clock
                    cpu = None
                else:
                    cpu = proc.cpu_percent(None)
                self._procs[pid] = proc
                with proc.oneshot():
                    name = proc.name()
                    if name.startswith("python") and pid in names:
                        name = names[pid]  # "python" says less than the client's own name
                    rss = proc.memory_info().rss
                    threads = proc.threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs.pop(pid, None)
                continue
            ts = []
            for t in threads:
                total = t.user_time + t.system_time
                times[(pid, t.id)] = total
                before = self._thread_times.get((pid, t.id))
                tcpu = (total - before) / dt * 100 if before is not None and dt > 0 else None
                ts.append(
                    ThreadSample(
                        tid=t.id,
                        name=_thread_name(pid, t.id),
                        core=_thread_core(pid, t.id),
                        cpu_percent=tcpu,
                    )
                )
            out.append(
                ProcSample(pid=pid, role=role, name=name, cpu_percent=cpu, rss=rss, threads=ts)
            )
        self._thread_times = times
        for pid in list(self._procs):
            if pid not in wanted:
                del self._procs[pid]
        return out


# ---------------------------------------------------------------- --once and --json


def _once(args: argparse.Namespace) -> int:
    from .stats_reader import StatsNotReadable

    read = _reader(args)
    missing = _no_dataplane_errors()
    sampler = ProcessSampler()
    try:
        first = read()
        sampler.sample(first)
        time.sleep(args.interval if args.interval is not None else ONCE_INTERVAL)
        second = read()
    except missing as e:
        # a segment there but closed to us says what to do instead: no "start one"
        hint = "" if "--stats" in str(e) or isinstance(e, StatsNotReadable) else _HINT
        print(f"duckpipe-top: {e}{hint}", file=sys.stderr)
        return 1
    procs = sampler.sample(second)
    old = first if same_dataplane(second, first) else None
    if args.json:
        doc = {"snapshot": second, "rates": derive_rates(second, old), "processes": procs}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return 0
    width = args.width or (shutil.get_terminal_size().columns if sys.stdout.isatty() else 160)
    sys.stdout.write(render_text(build_view(second, old, procs), width))
    return 0


_HINT = (
    "; start one (`duckpipe dataplane` or `duckpipe mock-dataplane`), or name it with "
    "--stats PATH or --control ENDPOINT"
)


# ---------------------------------------------------------------- the live screen


class Screen:
    """The curses loop: read every ``interval`` seconds, draw, answer keys."""

    def __init__(self, stdscr: Any, args: argparse.Namespace) -> None:
        self.scr = stdscr
        self.interval = args.interval if args.interval is not None else 1.0
        self.read = _reader(args)
        self.missing_errors = _no_dataplane_errors()
        self.sampler = ProcessSampler()
        self.pane = 0
        self.sort: dict[str, int] = {}
        self.reverse: dict[str, bool] = {}
        self.scroll = 0
        self.prev: Any = None
        self.view: View | None = None
        self.missing: str | None = None
        self.missing_since: float | None = None
        self.refreshed = 0.0
        self.red = curses.A_BOLD
        try:
            curses.start_color()
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            self.red = curses.color_pair(1) | curses.A_BOLD
        except curses.error:
            pass

    def poll(self) -> None:
        try:
            snap = self.read()
        except self.missing_errors as e:
            self.view, self.prev = None, None
            self.missing = str(e)
            if self.missing_since is None:
                self.missing_since = time.time()
            return
        self.missing = self.missing_since = None
        old = self.prev if same_dataplane(snap, self.prev) else None
        self.view = build_view(snap, old, self.sampler.sample(snap))
        self.prev = snap
        self.refreshed = time.time()

    def panes(self) -> list[str]:
        """The panes to show: the view's (the MoE pane once a MoE layer ran), else the
        ones every dataplane has."""
        return self.view.panes if self.view is not None else [p for p in PANES if p != "moe"]

    def put(self, y: int, x: int, text: str, attr: int = 0) -> None:
        h, w = self.scr.getmaxyx()
        if y >= h or x >= w:
            return
        text = printable(text)  # everything drawn passes here: names are shown, not obeyed
        try:
            self.scr.addnstr(y, x, text, w - x - (1 if y == h - 1 else 0), attr)
        except curses.error:
            pass

    def draw(self) -> None:
        self.scr.erase()
        h, w = self.scr.getmaxyx()
        panes = self.panes()
        self.pane = min(self.pane, len(panes) - 1)  # the MoE pane goes with its dataplane
        name = panes[self.pane]
        y = 0
        if self.view is None:
            since = time.strftime("%H:%M:%S", time.localtime(self.missing_since or time.time()))
            self.put(0, 0, f"no dataplane (since {since}); still looking", self.red)
            self.put(1, 0, self.missing or "")
            y = 2
        else:
            for k, line in enumerate(self.view.header):
                for part in wrap_phrases(line, w - 1):  # at 80 columns: whole phrases
                    self.put(y, 0, part, curses.A_BOLD if k == 0 else 0)
                    y += 1
        x = 0
        for i, p in enumerate(panes):
            label = f" {i + 1} {p} "
            self.put(y, x, label, curses.A_REVERSE if i == self.pane else 0)
            x += len(label) + 1
        self.put(y, x, "s sort  r rev  q quit")
        y += 1
        if self.view is None:
            self.scr.refresh()
            return
        for line in alert_rows(self.view.alerts, w - 1):
            self.put(y, 0, line, self.red)
            y += 1
        table = self.view.tables[name]
        col = self.sort.get(name, table.sort)
        lines = render_table(table, w, col, self.reverse.get(name, False))
        body = lines[1:]
        room = h - y - 1  # the status line is the last
        # A tall terminal (>= TALL rows) keeps a second pane under the chosen one: the
        # latency (or, when latency is chosen, the rings), at most half the room.
        below = None
        if h >= TALL:
            below = self.view.tables["rings" if name == "latency" else "latency"]
            below_lines = render_table(below, w)
            below_h = min(len(below_lines) + 1 + len(below.notes), room // 2)
            room -= below_h + 1
        y, shown = self._table(y, table, lines, room)
        self.scroll = max(0, min(self.scroll, len(body) - shown))
        if below is not None:
            self._table(h - 1 - below_h, below, below_lines, below_h)
        more = f"  rows {self.scroll + 1}-{self.scroll + shown} of {len(body)}"
        status = (
            f"sorted by {table.columns[col].name}"
            f"{' (reversed)' if self.reverse.get(name) else ''}; "
            f"refreshed {time.strftime('%H:%M:%S', time.localtime(self.refreshed))}, "
            f"every {self.interval:g} s" + (more if len(body) > shown else "")
        )
        self.put(h - 1, 0, status, curses.A_DIM)
        self.scr.refresh()

    def _table(self, y: int, table: Any, lines: list[tuple[str, bool]], room: int) -> tuple:
        """Draw ``table`` (title, heading, rows from the scroll offset, then its notes
        if they fit) in ``room`` rows from ``y``; returns the next row and the rows shown."""
        w = self.scr.getmaxyx()[1]
        if room < 3:
            return y, 0
        self.put(y, 0, table.title, curses.A_BOLD)
        self.put(y + 1, 0, lines[0][0].ljust(w), curses.A_REVERSE)
        y, room = y + 2, room - 2
        body = lines[1:]
        notes = table.notes if room >= len(body) + len(table.notes) else []
        rows_room = room - len(notes)
        first = self.scroll if table.pane == self.panes()[self.pane] else 0
        first = max(0, min(first, len(body) - rows_room))
        shown = body[first : first + rows_room]
        for text, attention in shown:
            self.put(y, 0, text, self.red if attention else 0)
            y += 1
        for n in notes:
            self.put(y, 0, n, curses.A_DIM)
            y += 1
        return y, len(shown)

    def key(self, ch: int) -> bool:
        """Answer one key; False to quit."""
        panes = self.panes()
        self.pane = min(self.pane, len(panes) - 1)
        name = panes[self.pane]
        if ch in (ord("q"), ord("Q")):
            return False
        if ord("1") <= ch <= ord(str(len(panes))):
            self.pane, self.scroll = ch - ord("1"), 0
        elif ch == ord("\t"):
            self.pane, self.scroll = (self.pane + 1) % len(panes), 0
        elif ch == curses.KEY_BTAB:
            self.pane, self.scroll = (self.pane - 1) % len(panes), 0
        elif ch == ord("s") and self.view is not None:
            table = self.view.tables[name]
            keep = fit_columns(table.columns, self.scr.getmaxyx()[1])
            cur = self.sort.get(name, table.sort)
            after = [i for i in keep if i > cur]
            self.sort[name] = after[0] if after else keep[0]
        elif ch == ord("r"):
            self.reverse[name] = not self.reverse.get(name, False)
        elif ch == curses.KEY_DOWN:
            self.scroll += 1
        elif ch == curses.KEY_UP:
            self.scroll = max(0, self.scroll - 1)
        elif ch == curses.KEY_NPAGE:
            self.scroll += max(1, self.scr.getmaxyx()[0] - 8)
        elif ch == curses.KEY_PPAGE:
            self.scroll = max(0, self.scroll - max(1, self.scr.getmaxyx()[0] - 8))
        elif ch == curses.KEY_RESIZE:
            curses.update_lines_cols()
        return True

    def run(self) -> int:
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        self.scr.keypad(True)
        self.scr.timeout(100)
        next_read = 0.0
        while True:
            now = time.monotonic()
            if now >= next_read:
                self.poll()
                next_read = now + self.interval
            self.draw()
            ch = self.scr.getch()
            while ch != -1:
                if not self.key(ch):
                    return 0
                self.draw()
                ch = self.scr.getch() if ch != curses.KEY_RESIZE else -1


def _live(args: argparse.Namespace) -> int:
    _reader(args)  # fail here, before curses, if duckpipe.observe.stats_reader is missing
    # ncurses takes exported LINES/COLUMNS over the terminal's own size, at start and at
    # every resize: with them set (as some shells and tmux panes do) a resize goes unseen
    for var in ("LINES", "COLUMNS"):
        os.environ.pop(var, None)
    return curses.wrapper(lambda scr: Screen(scr, args).run())


# ---------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="duckpipe-top",
        description="Live view of a duckpipe dataplane's rings, NIC workers, ducks, latency, "
        "processes and MoE experts, read from its stats segment (no lock, no message).",
        epilog="keys: 1-6 (6: MoE experts, once a MoE layer ran) or Tab/Shift-Tab switch "
        "panes, s cycles the sort column, r reverses "
        "it, arrows and PgUp/PgDn scroll, q quits. Exit status: 0, or 1 with no dataplane.",
    )
    p.add_argument(
        "-u",
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="refresh interval (default 1; --once and --json: the two reads' gap, 0.5)",
    )
    p.add_argument("--stats", metavar="PATH", help="the dataplane's stats segment")
    p.add_argument(
        "--control",
        metavar="ENDPOINT",
        help="the dataplane's control endpoint (its stats segment lies beside the socket)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print every pane once as plain text (rates over two reads 0.5 s apart) and exit",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the snapshot, the derived rates and the processes as one JSON document",
    )
    p.add_argument(
        "--width", type=int, default=0, help="--once: line width (default: the terminal's, or 160)"
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"duckpipe-top (duckpipe {__version__})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.interval is not None and args.interval <= 0:
        print("duckpipe-top: --interval must be > 0", file=sys.stderr)
        return 2
    if args.once or args.json:
        return _once(args)
    if not sys.stdout.isatty():
        print("duckpipe-top: stdout is not a terminal; use --once or --json", file=sys.stderr)
        return 2
    try:
        return _live(args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
