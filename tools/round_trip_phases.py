#!/usr/bin/env python3
"""Per-phase times of a 64 B round trip through the null backend: warm ones, and the
first one after the client and the dataplane sat idle (issue 19, goals 4 and 5).

    python tools/round_trip_phases.py --idle 10 --rounds 3 --control

Each round: ``--warm`` round trips back to back, then ``--idle`` seconds of nothing,
then one round trip (the "cold" one). Per round trip it prints

- the client's phases (``perf_counter_ns``): claim, copy-in, submit (the ring write and
  the doorbell, when the dataplane parks), result (the wait on the done word);
- the dataplane's own (``fwd.phases``, its slot header): prepare = submit to pickup, so the
  doorbell's wake-up of a parked dataplane, then send, wait, reduce;
- whether the client rang the doorbell (the dataplane was parked), the page faults of
  both processes, and from ``/proc/<pid>/task/*/schedstat`` the dataplane's time on a
  CPU and its time runnable but waiting for one (run queue), and the client thread's.

``--control`` runs a small workload that is not duckpipe's (a 64 B numpy copy and a few
dict stores) right after the idle stretch, warm and cold: how much slower the machine
itself is after idling (caches, TLBs, the vCPU), beside duckpipe's round trip. The
schedstat and fault reads sit outside the timed phases but inside each round trip's
loop, so the warm numbers are a little slower than ``duckpipe bench ipc``'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

import duckpipe
from duckpipe.bench.common import schedstat_ns
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.testing import null_topology

HIDDEN = 16  # 64 B of float32
PHASES = (
    "claim", "copy", "submit", "result", "total", "prepare", "send", "wait", "reduce",
    "rang", "faults", "dp_on_cpu", "dp_run_queue", "client_on_cpu", "client_run_queue",
)  # fmt: skip


def _faults(pids: tuple[int, ...]) -> int:
    n = 0
    for pid in pids:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        n += int(f[7]) + int(f[9])  # minflt, majflt
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--idle", type=float, default=10.0, help="seconds idle before the cold one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warm", type=int, default=100, help="warm round trips per round")
    p.add_argument("--wait", choices=("spin", "block", "hybrid"), default="block")
    p.add_argument("--idle-kind", choices=("spin", "yield", "backoff"), default="backoff")
    p.add_argument("--spin-us", type=int, default=0, help="the dataplane's idle_spin_us")
    p.add_argument("--dp-cpu", type=int, default=None, help="pin the dataplane's thread")
    p.add_argument("--control", action="store_true", help="time a non-duckpipe workload too")
    a = p.parse_args()

    x = np.ones((1, HIDDEN), np.float32)
    scratch = np.empty_like(x)

    def control() -> float:
        t0 = time.perf_counter_ns()
        scratch[:] = x
        d: dict[int, int] = {}
        for i in range(20):
            d[i] = i
        return (time.perf_counter_ns() - t0) / 1e3

    cores = [a.dp_cpu] if a.dp_cpu is not None else []
    topo = null_topology(1, mtu=65535, idle=a.idle_kind, idle_spin_us=a.spin_us, cores=cores)
    warm: list[dict[str, float]] = []
    cold: list[dict[str, float]] = []
    control_warm: list[float] = []
    control_cold: list[float] = []
    with (
        DataplaneProcess(topo) as dp,
        duckpipe.connect(dp.control, wait=a.wait, slots=8, slot_size=4096) as c,
    ):
        c.load_weights(1, duckpipe.SwiGluMlp.random(HIDDEN, 8, seed=1), progress=False)
        ring = c._session.ring  # its doorbell count: was the dataplane parked?
        pids = (dp.proc.pid, os.getpid())
        dp_pid, me = dp.proc.pid, threading.get_native_id()

        def one() -> dict[str, float]:
            f0, d0, m0, rang0 = (
                _faults(pids),
                schedstat_ns(dp_pid),
                schedstat_ns(os.getpid(), me),
                ring.doorbells,
            )
            t0 = time.perf_counter_ns()
            slot = c.claim(x.shape, x.dtype)
            t1 = time.perf_counter_ns()
            slot.array[:] = x
            t2 = time.perf_counter_ns()
            fwd = c.submit(slot, 1)
            t3 = time.perf_counter_ns()
            fwd.result(timeout=5)
            t4 = time.perf_counter_ns()
            d1, m1, f1 = schedstat_ns(dp_pid), schedstat_ns(os.getpid(), me), _faults(pids)
            tm = fwd.phases  # the slot header: no ZeroMQ, no second doorbell
            fwd.release()
            return {
                "claim": (t1 - t0) / 1e3, "copy": (t2 - t1) / 1e3, "submit": (t3 - t2) / 1e3,
                "result": (t4 - t3) / 1e3, "total": (t4 - t0) / 1e3,
                "prepare": tm.prepare_ns / 1e3, "send": tm.send_ns / 1e3,
                "wait": tm.wait_ns / 1e3, "reduce": tm.reduce_ns / 1e3,
                "rang": ring.doorbells - rang0, "faults": f1 - f0,
                "dp_on_cpu": (d1[0] - d0[0]) / 1e3, "dp_run_queue": (d1[1] - d0[1]) / 1e3,
                "client_on_cpu": (m1[0] - m0[0]) / 1e3,
                "client_run_queue": (m1[1] - m0[1]) / 1e3,
            }  # fmt: skip

        for _ in range(50):
            one()
        for r in range(a.rounds):
            for _ in range(a.warm):
                warm.append(one())
                if a.control:
                    control_warm.append(control())
            time.sleep(a.idle)
            if a.control:
                control_cold.append(control())
            cold.append(one())
            print(f"round {r}: first after idle {cold[-1]['total']:.0f} µs", flush=True)

    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; idle {a.idle:g} s; "
          f"wait={a.wait}, idle={a.idle_kind}, idle_spin_us={a.spin_us}, dataplane cpu "
          f"{a.dp_cpu if a.dp_cpu is not None else 'any'}")  # fmt: skip
    print(f"| phase (µs) | warm p50 | first after idle, median of {len(cold)} | ratio | each |")
    print("|---|---:|---:|---:|---|")
    for k in PHASES:
        w, f = statistics.median(r[k] for r in warm), statistics.median(r[k] for r in cold)
        ratio = f"{f / w:.2f}" if w else "—"
        each = ", ".join(f"{r[k]:.0f}" for r in cold)
        print(f"| {k} | {w:.1f} | {f:.1f} | {ratio} | {each} |")
    if a.control:
        w, f = statistics.median(control_warm), statistics.median(control_cold)
        each = ", ".join(f"{v:.0f}" for v in control_cold)
        print(f"| control (not duckpipe) | {w:.1f} | {f:.1f} | {f / w:.2f} | {each} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
