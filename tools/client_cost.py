#!/usr/bin/env python3
"""The Python client's own cost per forward, in the loops users write (issue 19).

    python tools/client_cost.py [--loop one|forward|bench|timings] [--forwards 20000]
    python tools/client_cost.py --profile            # cProfile: calls per forward
    python tools/client_cost.py --instructions [/work/base/.venv/bin/python]
    python tools/client_cost.py --ab /work/base/.venv/bin/python --rounds 5

A null-backend dataplane (``null_topology``, mtu 65535: no ducks, no network) spins on
CPU 1 (``idle = "spin"``, ``cores = [1]``), the client waits with ``wait="spin"`` on
CPU 0: the 64 B spinning round trip of ``duckpipe bench ipc`` (goal 4's row). With
``--wait block`` the dataplane parks instead (``idle = "backoff"``, still on CPU 1) and
the client sleeps on the futex: CPU per forward is then the work, not the spinning.
Loops:

- ``one``: ``bench ipc``'s ``one()``: ``with c.claim(...) as slot: slot.array[:] = x;
  fwd = c.submit(slot, 1)`` then ``with fwd: fwd.result()``;
- ``forward``: ``c.forward(1, x)``;
- ``bench``: ``duckpipe bench forward``'s loop: ``one()`` and ``fwd.phases`` read inside
  the ``with fwd`` (the slot header's copy);
- ``timings``: the same reading ``fwd.timings`` instead (it waits for the forward's
  ZeroMQ completion), as the bench did before ``phases``.

Prints one JSON line: wall time per forward (the loop's total over its count), the
p50 of single forwards, this process's CPU per forward (every thread:
/proc/self/task/*/schedstat) and the dataplane's. Only the client code differs
between two builds run by ``--ab`` (the python of another worktree's .venv imports
that worktree's duckpipe): each round runs both, in an order that turns round by
round, and the medians of the per-round ratios new/old are printed. The machine is
shared: the ratios, not the microseconds, are the result.

``--instructions`` counts what the machine's noise cannot move (``perf stat -e
instructions`` is not supported on this VM): it runs the loop under callgrind twice,
``--forwards N`` and ``2N`` (same ``--warm``), counting only the main thread inside
the ``exec`` that runs the timed loop (``--toggle-collect=builtin_exec``), and the
difference of the two totals over N is one forward's instructions in the client's main
thread, interpreter, numpy, cffi, msgspec and libzmq calls included (not ZeroMQ's I/O
thread nor the heartbeat thread). The dataplane runs natively (valgrind does not follow it),
~50x faster than the client under valgrind, yet on a shared CPU it is sometimes off it
when the client looks: what ``dp_wait_done`` spins is left out (its inclusive count,
one look per forward is a few dozen instructions), the rest is the client's own work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CLIENT_CPU, DATAPLANE_CPU = 0, 1
LAYER = 1


def _task_cpu_ns(pid: int | str) -> int:
    """CPU ns of every thread of ``pid`` ("self": this process), by the bench's schedstat
    reader. task_cpu_seconds, not schedstat_ns: --ab and --instructions run this file
    under an older build's python, whose duckpipe has the former (since issue 17) only."""
    from duckpipe.bench.common import task_cpu_seconds

    return round(task_cpu_seconds(pid) * 1e9)


def measure(
    loop: str,
    n: int,
    warm: int,
    nbytes: int,
    profile: bool,
    counted: bool = False,
    wait: str = "spin",
) -> dict[str, object]:
    import duckpipe
    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.testing import null_topology

    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {CLIENT_CPU})
    hidden = min(nbytes // 4, 1024)
    x = np.ones((nbytes // 4 // hidden, hidden), np.float32)
    idle = "spin" if wait == "spin" else "backoff"
    topo = null_topology(1, cores=[DATAPLANE_CPU], idle=idle, mtu=65535)
    with DataplaneProcess(topo) as dp:
        with duckpipe.connect(dp.control, wait=wait, slots=8, slot_size=4096) as c:
            c.load_weights(LAYER, duckpipe.SwiGluMlp.random(hidden, 8, seed=1), progress=False)

            # each loop written out as its caller writes it, not built from a shared
            # helper: callgrind counts every call, and a helper's would be in all of them
            def one() -> None:
                with c.claim(x.shape, x.dtype) as slot:
                    slot.array[:] = x
                    fwd = c.submit(slot, LAYER)
                with fwd:
                    fwd.result(timeout=30)

            def bench() -> None:
                with c.claim(x.shape, x.dtype) as slot:
                    slot.array[:] = x
                    fwd = c.submit(slot, LAYER)
                with fwd:
                    fwd.result(timeout=30)
                    fwd.phases  # noqa: B018 (the bench reads it)

            def timings() -> None:
                with c.claim(x.shape, x.dtype) as slot:
                    slot.array[:] = x
                    fwd = c.submit(slot, LAYER)
                with fwd:
                    fwd.result(timeout=30)
                    fwd.timings  # noqa: B018 (a wait for the ZeroMQ completion)

            def forward() -> None:
                c.forward(LAYER, x, timeout=30)

            step = {"one": one, "bench": bench, "timings": timings, "forward": forward}[loop]
            clock = time.perf_counter_ns
            for _ in range(warm):
                step()
            if profile:
                return _profile(step, n)
            if counted:
                # under callgrind --toggle-collect=builtin_exec: only this exec is counted
                # (and, flipping it twice, each import's: the same in every run)
                exec("for _ in range(n): step()", {"n": n, "step": step})
                return {"loop": loop, "forwards": n}
            singles = np.empty(min(n, 2000), np.int64)
            for k in range(len(singles)):
                t0 = clock()
                step()
                singles[k] = clock() - t0
            cpu0, dcpu0, t0 = _task_cpu_ns("self"), _task_cpu_ns(dp.pid), clock()
            for _ in range(n):
                step()
            wall = clock() - t0
            cpu, dcpu = _task_cpu_ns("self") - cpu0, _task_cpu_ns(dp.pid) - dcpu0
    return {
        "loop": loop,
        "wait": wait,
        "forwards": n,
        "wall_us": wall / n / 1e3,
        "p50_us": float(np.median(singles)) / 1e3,
        "client_cpu_us": cpu / n / 1e3,
        "dataplane_cpu_us": dcpu / n / 1e3,
        "load": os.getloadavg()[0],
    }


def _profile(step, n: int) -> dict[str, object]:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((nc / n, tt / n * 1e6, ct / n * 1e6, f"{Path(file).name}:{line}({name})"))
    rows.sort(key=lambda r: -r[1])
    for calls, tt, ct, where in rows[:40]:
        print(f"{calls:6.2f} calls  {tt:6.2f} us self  {ct:6.2f} us cum  {where}")
    total = sum(r[0] for r in rows)
    print(f"{total:.1f} function calls per forward (Python and builtin, cProfile)")
    return {"calls_per_forward": total}


def ab(other: str, rounds: int, args: argparse.Namespace) -> int:
    """Alternate this python's duckpipe (new) with ``other``'s (old), several rounds."""
    me = [sys.executable, __file__, "--loop", args.loop, "--forwards", str(args.forwards)]
    me += ["--warm", str(args.warm), "--bytes", str(args.bytes), "--wait", args.wait]
    keys = ("wall_us", "p50_us", "client_cpu_us", "dataplane_cpu_us")
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        got = {}
        for build in ("old", "new") if r % 2 == 0 else ("new", "old"):
            cmd = [other, *me[1:]] if build == "old" else me
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            got[build] = json.loads(out.strip().splitlines()[-1])
        for k in keys:
            ratios[k].append(got["new"][k] / got["old"][k])
        print(
            f"round {r + 1}: "
            + "  ".join(f"{k} {got['old'][k]:.2f} -> {got['new'][k]:.2f}" for k in keys)
            + f"  load {got['new']['load']:.2f}",
            flush=True,
        )
    print(
        "median new/old: " + "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in ratios.items())
    )
    return 0


def _callgrind_ir(python: str, args: argparse.Namespace, n: int) -> tuple[int, int]:
    """(instructions in all, those inside dp_wait_done) of one run under callgrind."""
    out = Path(f"/tmp/client_cost.{os.getpid()}.{n}.callgrind")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    cmd += ["--collect-atstart=no", "--toggle-collect=builtin_exec", python, __file__]
    cmd += ["--loop", args.loop, "--forwards", str(n), "--warm", str(args.warm), "--counted"]
    cmd += ["--bytes", str(args.bytes), "--wait", args.wait]
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    try:
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        out.unlink()
    total = spin = 0
    for line in text.splitlines():
        count = line.split()[0].replace(",", "") if line.strip() else "0"
        if "PROGRAM TOTALS" in line:
            total = int(count)
        elif ":_cffi_f_dp_wait_done " in line:
            spin = int(count)
    return total, spin


def instructions(pythons: list[str], args: argparse.Namespace) -> int:
    n = args.forwards
    for python in pythons:
        (t1, s1), (t2, s2) = _callgrind_ir(python, args, n), _callgrind_ir(python, args, 2 * n)
        per = ((t2 - s2) - (t1 - s1)) / n
        print(
            json.dumps(
                {
                    "python": python,
                    "loop": args.loop,
                    "wait": args.wait,
                    "instructions_per_forward": round(per),
                    "with_the_spin": round((t2 - t1) / n),
                }
            ),
            flush=True,
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop", choices=("one", "forward", "bench", "timings"), default="one")
    p.add_argument("--wait", choices=("spin", "block"), default="spin")
    p.add_argument("--forwards", type=int, default=20000)
    p.add_argument("--warm", type=int, default=2000)
    p.add_argument("--bytes", type=int, default=64, help="float32 activation bytes")
    p.add_argument("--profile", action="store_true", help="cProfile the loop")
    p.add_argument("--ab", metavar="PYTHON", help="the other build's python (the old one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # callgrind's run
    p.add_argument(
        "--instructions",
        nargs="*",
        metavar="PYTHON",
        help="instructions per forward under callgrind, of this python and these",
    )
    args = p.parse_args()
    if args.instructions is not None:
        return instructions([sys.executable, *args.instructions], args)
    if args.ab:
        return ab(args.ab, args.rounds, args)
    m = measure(
        args.loop, args.forwards, args.warm, args.bytes, args.profile, args.counted, args.wait
    )
    print(json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
