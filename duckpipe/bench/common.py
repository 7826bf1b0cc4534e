"""What every section of ``duckpipe bench`` shares: sizes, pinning, machine facts, statistics."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "CLIENT_CPU",
    "DUCKS_CPU",
    "Progress",
    "Size",
    "Table",
    "cpu_seconds",
    "machine_facts",
    "percentiles_us",
    "pin",
    "pin_self",
    "schedstat_ns",
    "task_cpu_seconds",
]

#: The pinning every section uses (the issue's): client and dataplane on CPU 0,
#: emulated ducks (and the far end of an IPC pair) on CPU 1.
CLIENT_CPU = 0
DUCKS_CPU = 1

SIZES = ("full", "quick", "smoke")


@dataclasses.dataclass(frozen=True)
class Size:
    """How big a run is: ``full`` (the issue's sizes), ``quick`` (<= 5 min), ``smoke`` (CI)."""

    name: str

    def pick(self, full: object, quick: object, smoke: object) -> object:
        return {"full": full, "quick": quick, "smoke": smoke}[self.name]


@dataclasses.dataclass
class Table:
    """One markdown table: ``columns`` are (key, heading) pairs; rows are dicts by key."""

    key: str
    title: str
    columns: list[tuple[str, str]]
    rows: list[dict[str, object]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "title": self.title,
            "columns": [{"key": k, "heading": h} for k, h in self.columns],
            "rows": self.rows,
            "notes": self.notes,
        }


def pin(pid: int, cpu: int) -> bool:
    """Pin ``pid`` (0: this process) to ``cpu`` if the machine has it; False when it cannot.

    A child of a pinned process inherits its one CPU: this moves it to another."""
    if not hasattr(os, "sched_setaffinity") or cpu >= (os.cpu_count() or 1):
        return False
    try:
        os.sched_setaffinity(pid, {cpu})
        return True
    except OSError:
        return False


def pin_self() -> tuple[set[int] | None, str]:
    """Pin this process (and so the children it starts) to CLIENT_CPU.

    Returns the previous affinity (to restore) and a sentence describing the pinning.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None, "no pinning (no sched_setaffinity on this platform)"
    before = os.sched_getaffinity(0)
    if len(before) < 2 or CLIENT_CPU not in before or DUCKS_CPU not in before:
        return None, f"no pinning: this process may run on CPUs {sorted(before)} only"
    os.sched_setaffinity(0, {CLIENT_CPU})
    return before, (
        f"client and dataplane on CPU {CLIENT_CPU}, ducks (and the far end of IPC pairs) on "
        f"CPU {DUCKS_CPU}, by os.sched_setaffinity"
    )


def cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def schedstat_ns(pid: int | str, tid: int | None = None) -> tuple[int, int]:
    """Nanoseconds on a CPU and nanoseconds runnable but waiting for one (the run queue),
    from /proc/<pid>/task/<tid>/schedstat: thread ``tid``'s, or every thread of ``pid``
    summed (``pid`` may be ``"self"``). The one schedstat reader of the bench and the
    tools; a thread that ends between the listing and the read counts nothing.

    Not /proc/<pid>/stat (psutil's cpu_times): it counts 10 ms ticks, and a few hundred
    forwards of a quick run are tens of ms, so the dataplane's share came out anywhere
    within +-10 ms."""
    task = Path(f"/proc/{pid}/task")
    stats = [task / str(tid) / "schedstat"] if tid is not None else task.glob("*/schedstat")
    on = queued = 0
    for stat in stats:
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = stat.read_text().split()
            on, queued = on + int(f[0]), queued + int(f[1])
    return on, queued


def task_cpu_seconds(pid: int | str) -> float:
    """CPU time (user + system) of every thread of a process so far, in seconds
    (:func:`schedstat_ns`)."""
    return schedstat_ns(pid)[0] / 1e9


def percentiles_us(ns: Iterable[float], qs: Sequence[float] = (50, 99)) -> list[float]:
    a = np.asarray(list(ns), dtype=np.float64) / 1e3
    if a.size == 0:
        return [float("nan")] * len(qs)
    return [float(np.percentile(a, q)) for q in qs]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # duckpipe/


def _git_commit(package_dir: Path = PACKAGE_DIR) -> str:
    """The commit this duckpipe is: its checkout's HEAD, else the one its wheel was built
    from (meson.build writes duckpipe/_build_info.py), else says it cannot tell. A package
    installed in a venv inside some other git checkout is not that checkout's."""
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
            cwd=package_dir,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        lines = r.stdout.split()
        if r.returncode == 0 and len(lines) == 2 and Path(lines[0]) == package_dir.parent:
            return lines[1]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from .._build_info import GIT_COMMIT  # type: ignore[import-not-found]
    except ImportError:  # a tree that meson never built
        GIT_COMMIT = ""
    if GIT_COMMIT:
        return f"{GIT_COMMIT} (the commit the installed package was built from)"
    return "not a git checkout (and the installed package does not say which commit it is)"


def machine_facts(pinning: str) -> dict[str, object]:
    facts: dict[str, object] = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pinning": pinning,
        "git_commit": _git_commit(),
    }
    try:
        import zmq

        facts["pyzmq"] = zmq.__version__
        facts["libzmq"] = zmq.zmq_version()
    except ImportError:
        pass
    try:
        facts["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return facts


class Progress:
    """One line per step on stderr, with elapsed seconds: ``[forward 3/12 4.1s] ...``."""

    def __init__(self, section: str, total: int, *, quiet: bool = False) -> None:
        self.section, self.total, self.quiet = section, total, quiet
        self.done = 0
        self.t0 = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.quiet:
            took = time.monotonic() - self.t0
            print(
                f"[{self.section} {self.done}/{self.total} {took:.1f}s] {what}",
                file=sys.stderr,
                flush=True,
            )
