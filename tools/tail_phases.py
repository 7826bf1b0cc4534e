#!/usr/bin/env python3
"""Where the slowest forwards lose their time: per-phase means of the p99 tail beside the
median band, in one run of the bench's loop (issue 19 goal 2).

    python tools/tail_phases.py [--ducks 1] [--hidden 1024] [--forwards 5000] [--rounds 1]

``duckpipe bench forward``'s shape: echo ducks (``duckpipe-ducks --compute echo``) on CPU 1,
this client and a C dataplane (socket backend on loopback, the bench's topology) on CPU 0,
``wait=block``, one forward at a time. Each forward is split into the client's phases
(claim + copy in, submit, the wait in ``result()``) and the dataplane's (``fwd.phases``,
from the slot header: prepare = submit to pickup, send, wait for the last reply, fetch,
reduce), plus the gap
since the previous forward ended. Printed: for the forwards at or above the p99 of end to
end, and for those between p45 and p55, the mean of each phase, and the C sendmmsg floor's
p50/p99 measured in the same run (``duckpipe-floor``, the bench's floor row).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np

import duckpipe
from duckpipe.bench import baselines
from duckpipe.bench.common import DUCKS_CPU, percentiles_us, pin, pin_self
from duckpipe.bench.forward import _topology
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.ducks import DucksProcess

PHASES = ("gap", "claim", "submit", "result", "prepare", "send", "wait", "fetch", "reduce")


def _loop(control: str, hidden: int, nducks: int, forwards: int, gc_off: bool) -> np.ndarray:
    """One row per forward: e2e then PHASES, nanoseconds."""
    mlp = duckpipe.SwiGluMlp.random(hidden, 4 * nducks, seed=1)
    x = np.random.default_rng(0).standard_normal((1, hidden)).astype(np.float32)
    rows = np.zeros((forwards, 1 + len(PHASES)), np.int64)
    with duckpipe.connect(control, wait="block", slots=4) as c:
        c.load_weights(1, mlp, progress=False)
        warm = max(20, forwards // 10)
        if gc_off:
            gc.disable()
        end = time.perf_counter_ns()
        try:
            for k in range(warm + forwards):
                t0 = time.perf_counter_ns()
                with c.claim(x.shape, x.dtype) as s:
                    s.array[:] = x
                    t1 = time.perf_counter_ns()
                    fwd = c.submit(s, 1)
                t2 = time.perf_counter_ns()
                with fwd:
                    fwd.result(timeout=2.0)
                    t3 = time.perf_counter_ns()
                    tm = fwd.phases
                if k >= warm:
                    rows[k - warm] = (t3 - t0, t0 - end, t1 - t0, t2 - t1, t3 - t2,
                                      tm.prepare_ns, tm.send_ns, tm.wait_ns, tm.fetch_ns,
                                      tm.reduce_ns)  # fmt: skip
                end = time.perf_counter_ns()
        finally:
            gc.enable()
    return rows


def _report(label: str, rows: np.ndarray) -> None:
    e2e = rows[:, 0]
    p45, p50, p55, p99 = np.percentile(e2e, (45, 50, 55, 99))
    tail = rows[e2e >= p99]
    mid = rows[(e2e >= p45) & (e2e <= p55)]
    print(f"\n{label}: {len(rows)} forwards, p50 {p50 / 1e3:.1f} us, p99 {p99 / 1e3:.1f} us "
          f"({len(tail)} at or above p99)")  # fmt: skip
    print("| phase (mean, us) | p45-p55 | >= p99 | difference |\n|---|---:|---:|---:|")
    for i, name in enumerate(("end to end", *PHASES)):
        a, b = mid[:, i].mean() / 1e3, tail[:, i].mean() / 1e3
        print(f"| {name} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ducks", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--forwards", type=int, default=5000)
    ap.add_argument("--gc-off", action="store_true", help="the client's gc disabled in the loop")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="topology settings for the dataplane (completion_flush_us=100, idle=spin)",
    )
    a = ap.parse_args(argv)
    _, pinning = pin_self()
    print(f"# tail phases: {pinning}; load average {os.getloadavg()}", file=sys.stderr)
    settings = {k: int(v) if v.isdigit() else v for k, v in (s.split("=", 1) for s in a.set)}
    nbytes = a.hidden * 4
    with DucksProcess(ducks=a.ducks, base_port=free_udp_ports(a.ducks),
                      args=["--compute", "echo"]) as dk:  # fmt: skip
        pin(dk.pid, DUCKS_CPU)
        ducks = [(i, p) for i, _, p in dk.addresses]
        floor = baselines.run_floor(ducks, nbytes, 1, iters=a.forwards, warmup=a.forwards // 10)
        fp50, fp99 = percentiles_us([s.e2e for s in floor.samples])
        print(f"C floor: p50 {fp50:.1f} us, p99 {fp99:.1f} us (p99/p50 {fp99 / fp50:.2f})")
        with DataplaneProcess(_topology(ducks, nbytes, **settings)) as dp:
            rows = _loop(dp.control, a.hidden, a.ducks, a.forwards, a.gc_off)
            p50, p99 = np.percentile(rows[:, 0], (50, 99)) / 1e3
            print(f"duckpipe: p99/floor p99 {p99 / fp99:.2f}, p50/floor p50 {p50 / fp50:.2f}")
            _report(f"duckpipe {a.ducks} duck(s) x {a.hidden}, wait=block {settings or ''}", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
