#!/usr/bin/env python3
"""The extra latency of a routed forward that failed over (issue 30.2), against its deadline.

    python tools/failover_latency.py --failover-ms 20 --forwards 50

Four emulated ducks on loopback (0-2 in one emulator, 3 alone in another), a MoE layer
of 8 experts with two replicas each (duck 3 holds one of every expert's); forwards of
--tokens tokens, top-2. Times --forwards forwards with every duck answering, then stops
duck 3 (SIGSTOP; duck_lost_ms a minute, so it is never known lost) and times as many
that fail its rows over. Prints each's p50/p99, the extra latency, and the failover
deadline it is set by: max(8 x duck 3's smoothed reply time, failover_ms), next to duck
3's reply times (the stats segment) and the dataplane's RTO bounds.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

import duckpipe
from duckpipe.launch.cluster import Cluster
from duckpipe.moe import MoeMlp
from duckpipe.observe import stats_reader as stats


def _times(c, layer: int, x, i, w, n: int) -> np.ndarray:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.forward(layer, x, routing=(i, w))
        out.append(time.perf_counter() - t0)
    return np.array(out) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--failover-ms", type=int, default=20)
    p.add_argument("--forwards", type=int, default=50)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    a = p.parse_args()
    moe = MoeMlp.random(8, a.hidden, 256, shared=False, seed=1)
    placement = [[3, e % 3] for e in range(8)]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((a.tokens, a.hidden)).astype(np.float32)
    t = np.arange(a.tokens)
    i = np.sort(np.stack([t % 8, (t + 3) % 8], axis=1), axis=1).astype(np.int32)
    w = rng.random((a.tokens, 2)).astype(np.float32)
    with Cluster(
        4, groups=[(3, []), (1, [])], duck_lost_ms=60_000, failover_ms=a.failover_ms
    ) as cl:
        with duckpipe.connect(cl.control, forward_timeout=10) as c:
            c.load_weights(1, moe, ducks=[0, 1, 2, 3], placement=placement)
            _times(c, 1, x, i, w, 20)  # warm up: the ducks' reply times measured
            healthy = _times(c, 1, x, i, w, a.forwards)
            d3 = {d.id: d for d in stats.read_snapshot(control=cl.control).ducks}[3]
            os.kill(cl.emulators[1].pid, signal.SIGSTOP)
            try:
                before = dict(c.stats().counters)["moe_failovers"]
                failed = _times(c, 1, x, i, w, a.forwards)
                fo = dict(c.stats().counters)["moe_failovers"] - before
            finally:
                os.kill(cl.emulators[1].pid, signal.SIGCONT)
    p50h, p99h = np.percentile(healthy, [50, 99])
    p50f, p99f = np.percentile(failed, [50, 99])
    mean_reply = d3.reply.sum_ns / max(d3.reply.total(), 1) / 1e6
    print(f"forwards: {a.forwards} each, {a.tokens} tokens x top-2, hidden {a.hidden}")
    print(f"duck 3: last reply {d3.last_reply_ns / 1e6:.3f} ms, mean {mean_reply:.3f} ms")
    print(f"failover deadline: max(8 x srtt = ~{8 * mean_reply:.3f} ms, failover_ms "
          f"{a.failover_ms}); the RTO's floor and ceiling are nack_min_us/nack_max_us "
          f"(200 us, 50 ms)")  # fmt: skip
    print(f"all answer : p50 {p50h:8.3f} ms  p99 {p99h:8.3f} ms")
    print(f"failed over: p50 {p50f:8.3f} ms  p99 {p99f:8.3f} ms  ({fo} failovers)")
    print(f"extra      : p50 {p50f - p50h:8.3f} ms  (deadline + the replacement's reply)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
