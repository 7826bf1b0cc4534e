#!/usr/bin/env python3
"""Measure forward latency through the C dataplane with emulated ducks on loopback.

    python tools/forward_latency.py --ducks 24 --hidden 1024 --compute echo

Prints end-to-end p50/p99 from Python and the dataplane's per-phase medians. The
benchmark suite with baselines in the same run is `duckpipe bench`; this is the
quick look the numbers in docs/benchmark-history.md ("Other measurements") come from.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import duckpipe
from duckpipe.launch.cluster import Cluster


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ducks", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--forwards", type=int, default=500)
    p.add_argument("--compute", choices=("real", "echo"), default="echo")
    p.add_argument("--wait", choices=("spin", "block", "hybrid"), default="hybrid")
    p.add_argument("--emulators", type=int, default=1, help="duck emulator processes")
    args = p.parse_args()
    mlp = duckpipe.SwiGluMlp.random(args.hidden, args.ffn, seed=1)
    x = np.random.default_rng(0).standard_normal((args.rows, args.hidden)).astype(np.float32)
    with Cluster(args.ducks, duck_args=["--compute", args.compute], emulators=args.emulators) as cl:
        with duckpipe.connect(cl.control, wait=args.wait) as c:
            c.load_weights(1, mlp)
            e2e, phases = [], []
            for i in range(args.forwards + 20):
                t0 = time.perf_counter_ns()
                with c.claim(x.shape, x.dtype) as slot:
                    slot.array[:] = x
                    fwd = c.submit(slot, 1)
                with fwd:
                    fwd.result(timeout=10)
                    t1 = time.perf_counter_ns()
                    if i >= 20:  # warm-up
                        e2e.append(t1 - t0)
                        phases.append(fwd.phases)  # the slot header's: no ZeroMQ
            n = c.stats().counters
    us = np.array(e2e) / 1e3
    med = {
        k: np.median([getattr(t, k) for t in phases]) / 1e3
        for k in ("prepare_ns", "send_ns", "wait_ns", "fetch_ns", "reduce_ns", "spread_ns")
    }
    compute = np.median([t.duck_compute_max_ns for t in phases]) / 1e3
    print(
        f"{args.ducks} ducks, hidden {args.hidden}, {args.rows} row(s), float32, "
        f"compute {args.compute}, wait {args.wait}: {args.forwards} forwards"
    )
    print(f"  end to end: p50 {np.percentile(us, 50):.0f} us, p99 {np.percentile(us, 99):.0f} us")
    print(
        "  dataplane medians (us): "
        + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in med.items())
        + f", slowest duck's compute {compute:.0f}"
    )
    print(
        f"  datagrams: {n['tx_packets']} out ({n['gso_sends']} GSO sends), {n['rx_packets']} in, "
        f"{n['nacks_sent']} NACKs, {n['timeouts']} timeouts"
    )
    per = max(n["forwards"], 1)
    print(
        f"  per forward: {n['nacks_sent'] / per:.3f} NACKs, "
        f"{n['rx_duplicates'] / per:.3f} duplicate and {n['rx_late'] / per:.3f} late datagrams"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
