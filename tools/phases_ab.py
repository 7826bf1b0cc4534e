#!/usr/bin/env python3
"""CPU per forward, A/B: reading a forward's phases from its slot header vs. its timings.

    tools/phases_ab.py --base-python /work/wt-base/.venv/bin/python [--rounds 3] [--iters 1000]

The loop of ``duckpipe bench forward`` (``run_duckpipe``): one ``duckpipe-ducks --compute
echo`` duck on CPU 1, client and C dataplane on CPU 0, the bench's topology, 1 x 1024
float32, ``wait=block``; claim, fill, submit, ``result()``, then the forward's phase
times, release. Each variant runs in a child process of its own interpreter (a build's
``.venv``: its client, its cffi module, its dataplane), in an order that turns round by
round:

- ``base/timings``: ``--base-python``'s build reading ``fwd.timings`` (as the bench did);
- ``new/timings``: this build reading ``fwd.timings`` (the ZeroMQ completion);
- ``new/phases``: this build reading ``fwd.phases`` (the slot header; as the bench now does);
- ``floor``: ``duckpipe-floor``, the bench's C sendmmsg/recvmmsg floor row, on the same duck.

Per variant and round: p50 end to end (claim to result), wall time of the timed loop per
forward, and host CPU per forward as the bench counts it (this client's getrusage, all
its threads, plus psutil's cpu_times of the dataplane process, all its threads), with the
dataplane's counters per forward. Printed per round, then the medians of the per-round
ratios against base/timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HIDDEN = 1024


def child(read: str, iters: int, warmup: int) -> dict:
    """One variant, in this interpreter's build: the numbers as a dict."""
    import numpy as np
    import psutil

    import duckpipe
    from duckpipe.bench.common import DUCKS_CPU, cpu_seconds, pin
    from duckpipe.bench.forward import _topology
    from duckpipe.launch.cluster import free_udp_ports
    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.launch.ducks import DucksProcess

    pin(0, 0)  # client and (inherited) dataplane on CPU 0
    x = np.random.default_rng(0).standard_normal((1, HIDDEN)).astype(np.float32)
    counters = ("completion_flushes_wanted", "completion_flushes", "parks", "futex_wakes",
                "doorbells", "forwards", "nacks_sent")  # fmt: skip
    with DucksProcess(ducks=1, base_port=free_udp_ports(1), args=["--compute", "echo"]) as dk:
        pin(dk.pid, DUCKS_CPU)
        ducks = [(i, p) for i, _, p in dk.addresses]
        if read == "floor":  # the C sendmmsg loop, as the bench's floor row
            from duckpipe.bench.baselines import run_floor

            r = run_floor(ducks, x.nbytes, 1, iters=iters, warmup=warmup)
            e2e = [s.e2e for s in r.samples]
            return {
                "binary": "duckpipe-floor",
                "p50_us": statistics.median(e2e) / 1e3,
                "mean_us": statistics.fmean(e2e) / 1e3,
                "p99_us": float(np.percentile(e2e, 99)) / 1e3,
                "loop_us": statistics.fmean(e2e) / 1e3,  # its loop is the round trip alone
                "cpu_us": r.cpu_s / iters * 1e6,
                **{f"{k}_per_fwd": 0.0 for k in counters},
            }
        with DataplaneProcess(_topology(ducks, x.nbytes)) as dp:
            dproc = psutil.Process(dp.pid)

            def dcpu() -> float:
                t = dproc.cpu_times()
                return t.user + t.system

            with duckpipe.connect(dp.control, wait="block", slots=4, slot_size=1 << 16) as c:
                c.load_weights(1, duckpipe.SwiGluMlp.random(HIDDEN, 4, seed=1), progress=False)
                e2e = []
                for k in range(warmup + iters):
                    if k == warmup:
                        n0 = c.stats().counters
                        cpu0, dcpu0, wall0 = cpu_seconds(), dcpu(), time.perf_counter_ns()
                    t0 = time.perf_counter_ns()
                    with c.claim(x.shape, x.dtype) as s:
                        s.array[:] = x
                        fwd = c.submit(s, 1)
                    with fwd:
                        fwd.result(timeout=2.0)
                        t2 = time.perf_counter_ns()
                        if read == "phases":
                            _ = fwd.phases.duck_compute_max_ns
                        else:
                            _ = max(fwd.timings.duck_compute_ns)
                    if k >= warmup:
                        e2e.append(t2 - t0)
                wall = time.perf_counter_ns() - wall0
                cpu = cpu_seconds() - cpu0 + dcpu() - dcpu0
                n1 = c.stats().counters
    return {
        "binary": str(dp.binary),
        "p50_us": statistics.median(e2e) / 1e3,
        "mean_us": statistics.fmean(e2e) / 1e3,
        "p99_us": float(np.percentile(e2e, 99)) / 1e3,
        "loop_us": wall / iters / 1e3,
        "cpu_us": cpu / iters * 1e6,
        **{f"{k}_per_fwd": (n1.get(k, 0) - n0.get(k, 0)) / iters for k in counters},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-python", required=True, help="the base build's .venv/bin/python")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--child", choices=("timings", "phases", "floor"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.iters, args.warmup)))
        return 0
    variants = [
        ("base/timings", args.base_python, "timings"),
        ("new/timings", sys.executable, "timings"),
        ("new/phases", sys.executable, "phases"),
        ("floor", sys.executable, "floor"),
    ]
    rows: dict[str, list[dict]] = {v[0]: [] for v in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for name, py, read in order:
            cmd = [py, __file__, "--child", read, "--iters", str(args.iters)]
            out = subprocess.run(
                [*cmd, "--warmup", str(args.warmup), "--base-python", args.base_python],
                check=True,
                capture_output=True,
                text=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows[name].append(row)
            print(
                f"round {r + 1} {name:13s} {row['binary']}\n  p50 {row['p50_us']:6.1f} us  mean "
                f"{row['mean_us']:6.1f}  p99 {row['p99_us']:6.1f}  loop "
                f"{row['loop_us']:6.1f} us  CPU {row['cpu_us']:6.1f} us/fwd  wanted "
                f"{row['completion_flushes_wanted_per_fwd']:.2f} flushes "
                f"{row['completion_flushes_per_fwd']:.2f} parks {row['parks_per_fwd']:.2f} NACKs "
                f"{row['nacks_sent_per_fwd']:.3f} "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    base = rows["base/timings"]
    for name, _, _ in variants[1:3]:
        for key in ("p50_us", "loop_us", "cpu_us"):
            ratios = [b[key] and n[key] / b[key] for b, n in zip(base, rows[name], strict=True)]
            med = statistics.median(ratios)
            print(f"{name:13s} {key:7s} median ratio to base/timings {med:.2f}")
    for name, _, _ in variants[:3]:
        ratios = [n["cpu_us"] / f["cpu_us"] for f, n in zip(rows["floor"], rows[name], strict=True)]
        print(f"{name:13s} cpu_us  median ratio to the floor's {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
