"""A/B of issue 29 point 4, as ratios measured in one run: a bf16 or float16 ``Gate``
against the float32 one per call, and a routed ``submit`` against a dense one.

    .venv/bin/python tools/routed_submit_ab.py [--rounds 5] [--iters 300] [--profile]

Gate: ``Gate.deepseek_v3`` (hidden 7168, 256 experts in 8 groups, 4 kept, top 8, sigmoid
+ bias, route scale 2.5) at 1 and 8 tokens, its weight float32, float16 and bf16, the
three interleaved in each round; the ratio is the median of the rounds' ratios of p50s.
Targets: bf16 and float16 <= 1.2x float32. Beside them, in the same rounds, what a bf16
gate's call cost before: its weight converted to float32 on every call, then the call.

Submit: one C dataplane (socket backend) and 8 echo ducks (``--compute echo``) on
loopback, a dense layer and a routed one (256 narrow experts, the default placement, no
shared expert) of one hidden size and float16. Only ``client.submit`` is timed (the slot
is claimed and filled before, the result waited for after): dense and routed alternate
call by call on the same shapes, routings made by the gate beforehand. At 1 token hidden
is 7168; at 4,096 tokens (MAX_TOKENS) hidden is 256 (a submit does not touch the
activation's bytes, only the routing's: 4,096 x 7168 would need 58 MB slots). Targets:
routed <= 1.5x dense at 1 token; routed <= 5 us + 0.05 us x tokens x topk at 4,096
(1,643 us). ``--profile`` runs cProfile over the routed submits of the last round and
prints where their time goes.

Pinning: this process on CPU 0, the dataplane on CPU 0, the ducks on CPU 1; numpy with one
BLAS thread (OPENBLAS_NUM_THREADS=1 unless set).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS threads spinning on 2 cores: noise

import numpy as np

import duckpipe
from duckpipe import SwiGluMlp
from duckpipe.bench.common import DUCKS_CPU, pin, pin_self
from duckpipe.client.models import BFLOAT16
from duckpipe.demo.moe_shape import default_placement
from duckpipe.launch.cluster import Cluster
from duckpipe.moe import Gate, MoeMlp

DENSE, ROUTED = 1, 2
N_EXPERTS, TOPK, DUCKS = 256, 8, 8


def _p50_us(ns: list[int]) -> float:
    return statistics.median(ns) / 1e3


def gate_ab(rounds: int, iters: int) -> None:
    base = Gate.deepseek_v3(7168, seed=2)
    w16 = base.weight.astype(BFLOAT16)
    gates = {
        "float32": base,
        "float16": dataclasses.replace(base, weight=base.weight.astype(np.float16)),
        "bf16": dataclasses.replace(base, weight=w16),
        # what a bf16 gate's call cost before issue 29, the weight converted on every call:
        # a gate made per call (its checks add a few µs), not base's cached weight
        "bf16, converted per call (before)": lambda x: dataclasses.replace(base, weight=w16)(x),
    }
    rng = np.random.default_rng(3)
    print("| gate | tokens | float32 p50 µs | this p50 µs | ratio (median of rounds) | target |")
    print("|---|---:|---:|---:|---:|---:|")
    for tokens in (1, 8):
        x = rng.standard_normal((tokens, 7168), np.float32)
        ratios: dict[str, list[float]] = {k: [] for k in gates if k != "float32"}
        p50s: dict[str, list[float]] = {k: [] for k in gates}
        for _ in range(rounds):
            times = {k: [] for k in gates}
            names = list(gates)
            for i in range(iters):
                turn = names[i % len(names) :] + names[: i % len(names)]
                for name in turn:  # interleaved call by call, the order turning
                    g = gates[name]
                    t0 = time.perf_counter_ns()
                    g(x)
                    times[name].append(time.perf_counter_ns() - t0)
            this = {k: _p50_us(v) for k, v in times.items()}
            for k in gates:
                p50s[k].append(this[k])
            for k in ratios:
                ratios[k].append(this[k] / this["float32"])
        for k, r in ratios.items():
            f32, this = statistics.median(p50s["float32"]), statistics.median(p50s[k])
            print(
                f"| {k} | {tokens} | {f32:.0f} | {this:.0f} | {statistics.median(r):.2f} | <= 1.2 |"
            )


def _layers(hidden: int) -> tuple[SwiGluMlp, MoeMlp]:
    moe = MoeMlp.random(N_EXPERTS, hidden, 1, shared=False, dtype=np.float16, seed=1)
    dense = SwiGluMlp.random(hidden, DUCKS, np.float16, 4)
    return dense, moe


def _submit_ns(client, x: np.ndarray, layer: int, routing=None) -> int:
    with client.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        t0 = time.perf_counter_ns()
        fwd = client.submit(slot, layer, routing=routing)
        t = time.perf_counter_ns() - t0
    with fwd:
        fwd.result(timeout=30)
    return t


def submit_ab(rounds: int, iters: int, profile: bool) -> None:
    print()
    print("| submit | tokens x topk | hidden | dense p50 µs | routed p50 µs | routed / dense "
          "| routed budget µs (5 + 0.05 x tokens x topk) | routed / budget | target |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for tokens, hidden in ((1, 7168), (4096, 256)):
        dense, moe = _layers(hidden)
        gate = Gate.deepseek_v3(hidden, seed=2)
        ducks = list(range(DUCKS))
        rng = np.random.default_rng(5)
        xs = [rng.standard_normal((tokens, hidden), np.float32).astype(np.float16)
              for _ in range(4)]  # fmt: skip
        routings = [gate(x) for x in xs]
        slot = max(1 << 20, 2 * tokens * hidden * 2 + 16 * tokens * TOPK + 4096)
        n = iters if tokens == 1 else max(10, iters // 10)
        with Cluster(DUCKS, duck_args=["--compute", "echo"], default_timeout_ms=10_000) as cl:
            for em in cl.emulators:
                pin(em.pid, DUCKS_CPU)
            with duckpipe.connect(cl.control, name="submit-ab", slots=8,
                                  slot_size=1 << (slot - 1).bit_length()) as client:  # fmt: skip
                client.load_weights(DENSE, dense, ducks=ducks, progress=False)
                client.load_weights(ROUTED, moe, placement=default_placement(N_EXPERTS, ducks),
                                    progress=False)  # fmt: skip
                d50, r50, ratio = [], [], []
                prof = cProfile.Profile() if profile else None
                for rnd in range(rounds):
                    dn, rn = [], []
                    for i in range(n + 5):
                        x, r = xs[i % 4], routings[i % 4]
                        a = _submit_ns(client, x, DENSE)
                        last = profile and rnd == rounds - 1
                        if last:
                            prof.enable()
                        b = _submit_ns(client, x, ROUTED, r)
                        if last:
                            prof.disable()
                        if i >= 5:  # warm-up calls are not counted
                            dn.append(a)
                            rn.append(b)
                    d50.append(_p50_us(dn))
                    r50.append(_p50_us(rn))
                    ratio.append(r50[-1] / d50[-1])
        budget = 5 + 0.05 * tokens * TOPK
        r = statistics.median(r50)
        target = "<= 1.5 x dense" if tokens == 1 else "<= budget"
        print(f"| routed vs dense | {tokens} x {TOPK} | {hidden} | {statistics.median(d50):.1f} "
              f"| {r:.1f} | {statistics.median(ratio):.2f} | {budget:,.1f} | {r / budget:.2f} "
              f"| {target} |")  # fmt: skip
        if prof is not None:
            print(f"\nwhere the routed submits of the last round went ({tokens} tokens):",
                  file=sys.stderr)  # fmt: skip
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300, help="calls per round (4,096: a tenth)")
    ap.add_argument("--profile", action="store_true", help="cProfile the routed submits")
    ap.add_argument("--only", choices=("gate", "submit"), help="one half of the A/B")
    a = ap.parse_args()
    pin_self()
    if a.only != "submit":
        gate_ab(a.rounds, max(20, a.iters // 5))
    if a.only != "gate":
        submit_ab(a.rounds, a.iters, a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
