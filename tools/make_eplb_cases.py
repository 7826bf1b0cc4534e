#!/usr/bin/env python3
"""Write tests/client/data/eplb_cases.json: inputs and outputs of DeepSeek's published
expert-parallelism load balancer (https://github.com/deepseek-ai/EPLB, eplb.py), which
tests/client/test_eplb.py compares duckpipe.moe's numpy port against.

Needs torch (the CPU wheel tools/setup installs in .venv) and the published eplb.py,
from a clone or the commit named below:

    git clone https://github.com/deepseek-ai/EPLB /tmp/EPLB
    git -C /tmp/EPLB checkout d52c72d5b2f2fb4c41afbf8eb21366820239913d
    .venv/bin/python tools/make_eplb_cases.py --eplb /tmp/EPLB/eplb.py

The loads are integer token counts with fixed seeds: uniform random (0..2000, and a
wide range 0..500,000 where equal loads are rare), Zipf-like (expert
of popularity rank r drawn with probability proportional to 1 / r**s, over a seeded
permutation of the experts) and one with idle experts (zeros). For each case the file
records where torch's sort met equal weights, since its order among them is its own
(not stable above 16 items): ``group_ties`` (two expert groups of equal load, step 1),
``cross_ties`` (replicas of two different experts of equal load per replica, step 3);
the test checks exact maps only where the order cannot matter.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

EPLB_COMMIT = "d52c72d5b2f2fb4c41afbf8eb21366820239913d"
OUT = Path(__file__).resolve().parent.parent / "tests" / "client" / "data" / "eplb_cases.json"

# name, layers, experts, replicas, groups, nodes, gpus, loads, seed
CASES = [
    ("readme", 2, 12, 16, 4, 2, 8, "readme", 0),
    ("v3-zipf1.0-hier-32red", 1, 256, 288, 8, 4, 32, "zipf1.0", 1),
    ("v3-zipf0.8-hier-32red", 2, 256, 288, 8, 4, 32, "zipf0.8", 2),
    ("v3-uniform-hier-32red", 1, 256, 288, 8, 4, 32, "uniform", 3),
    ("v3-zipf1.0-hier-0red", 1, 256, 256, 8, 4, 32, "zipf1.0", 4),
    ("v3-zipf1.0-hier-1node", 1, 256, 288, 8, 1, 32, "zipf1.0", 5),
    ("v3-zipf1.0-global-32red", 1, 256, 288, 1, 1, 32, "zipf1.0", 6),
    ("v3-zipf1.0-global-fallback", 1, 256, 320, 8, 3, 32, "zipf1.0", 7),  # 3 does not divide 8
    ("v3-zipf1.2-global-256red", 1, 256, 512, 1, 1, 32, "zipf1.2", 8),
    ("v3-idle-hier-32red", 1, 256, 288, 8, 4, 32, "idle", 9),
    ("v3-wide-hier-32red", 1, 256, 288, 8, 4, 32, "wide", 12),
    ("v3-wide-global-64red", 1, 256, 320, 1, 1, 32, "wide", 13),
    ("small-uniform-hier", 3, 64, 80, 4, 2, 8, "uniform", 10),
    ("small-zipf-global", 2, 16, 24, 1, 1, 4, "zipf1.0", 11),
]

README_WEIGHT = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]
TOKENS = 4096 * 8  # top-8 choices of a 4,096-token window


def loads(kind: str, layers: int, experts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "readme":
        return np.array(README_WEIGHT, dtype=np.int64)
    if kind == "uniform":
        return rng.integers(0, 2000, size=(layers, experts))
    if kind == "wide":  # rarely two equal: the case where the exact maps are checked
        return rng.integers(0, 500_000, size=(layers, experts))  # group sums < 2**24
    if kind.startswith("zipf"):
        s = float(kind[4:])
        out = []
        for _ in range(layers):
            p = 1.0 / np.arange(1, experts + 1) ** s
            p = p[rng.permutation(experts)]
            out.append(rng.multinomial(TOKENS, p / p.sum()))
        return np.array(out)
    if kind == "idle":  # a quarter of the experts saw no token in the window
        w = rng.integers(0, 2000, size=(layers, experts))
        w[:, rng.permutation(experts)[: experts // 4]] = 0
        return w
    raise ValueError(kind)


def load_eplb(path: Path):
    spec = importlib.util.spec_from_file_location("eplb", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_case(eplb, weight: np.ndarray, replicas: int, groups: int, nodes: int, gpus: int):
    """The published rebalance_experts, with its two helpers watched for ties."""
    seen = {"packs": [], "phy2mlog": None}
    pack, replicate = eplb.balanced_packing, eplb.replicate_experts

    def watched_pack(w, num_packs):
        seen["packs"].append((w.clone(), num_packs))
        return pack(w, num_packs)

    def watched_replicate(w, num_phy):
        out = replicate(w, num_phy)
        seen["phy2mlog"] = out[0].clone()
        return out

    eplb.balanced_packing, eplb.replicate_experts = watched_pack, watched_replicate
    try:
        phy2log, log2phy, logcnt = eplb.rebalance_experts(
            torch.tensor(weight), replicas, groups, nodes, gpus
        )
    finally:
        eplb.balanced_packing, eplb.replicate_experts = pack, replicate
    (groups_w, group_packs), (phy_w, phy_packs) = seen["packs"]
    group_ties = group_packs < groups_w.shape[1] and any(
        len(set(row.tolist())) < len(row) for row in groups_w
    )
    cross_ties = False
    if phy_packs < phy_w.shape[1]:
        for row, experts in zip(phy_w.tolist(), seen["phy2mlog"].tolist(), strict=True):
            by_value: dict[float, set[int]] = {}
            for v, e in zip(row, experts, strict=True):
                by_value.setdefault(v, set()).add(e)
            cross_ties |= any(len(s) > 1 for s in by_value.values())
    return phy2log, log2phy, logcnt, bool(group_ties), bool(cross_ties)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eplb", type=Path, required=True, help="the published eplb.py")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    eplb = load_eplb(args.eplb)
    cases = []
    for name, layers, experts, replicas, groups, nodes, gpus, kind, seed in CASES:
        w = loads(kind, layers, experts, seed)
        phy2log, log2phy, logcnt, group_ties, cross_ties = run_case(
            eplb, w, replicas, groups, nodes, gpus
        )
        if name == "readme" and phy2log.tolist() != README_PHY2LOG:
            sys.exit("the published eplb.py no longer prints its README's example output")
        cases.append({
            "name": name, "loads": kind, "seed": seed, "weight": w.tolist(),
            "num_replicas": replicas, "num_groups": groups, "num_nodes": nodes,
            "num_gpus": gpus, "group_ties": group_ties, "cross_ties": cross_ties,
            "phy2log": phy2log.tolist(), "log2phy": log2phy.tolist(), "logcnt": logcnt.tolist(),
        })  # fmt: skip
        print(f"{name}: group_ties={group_ties} cross_ties={cross_ties}")
    doc = {
        "what": "inputs and outputs of DeepSeek's EPLB rebalance_experts (eplb.py), for "
        "tests/client/test_eplb.py",
        "made_by": "tools/make_eplb_cases.py --eplb <EPLB clone>/eplb.py",
        "eplb": f"https://github.com/deepseek-ai/EPLB eplb.py at {EPLB_COMMIT}",
        "eplb_sha256": hashlib.sha256(args.eplb.read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "zipf": "expert of popularity rank r drawn with probability ~ 1 / r**s (s in the "
        f"loads name) over a seeded permutation; {TOKENS} draws",
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
