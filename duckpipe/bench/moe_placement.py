"""``duckpipe bench moe``'s ``moe_placement`` table: how evenly a skewed token stream
loads the ducks, on the default placement and on ``duckpipe.moe.plan_placement``'s (issue
30.5). Pure numpy, no cluster: about 0.1 s.

DeepSeek-V3's shape: 256 experts, top-8 per token, 32 ducks. Expert popularity is
Zipf-like, ``p(rank r) ~ 1 / r**ZIPF_S`` over a seeded shuffle of the experts; each token
draws its 8 distinct experts by that popularity (Gumbel top-k). The plan is made from
one window's histogram of expert choices (``WINDOW`` tokens), the rows are counted on the
next window of as many tokens, by the dataplane's rule (token ``t`` reaches expert ``e``
through replica ``t % replicas``; one row per token and expert): the plan meets tokens it
has not seen. Imbalance is max / mean rows per duck (1.0: even).
"""

from __future__ import annotations

import time

import numpy as np

from ..client.eplb import plan_placement, rows_per_duck
from ..client.weights import default_placement
from .common import Table

__all__ = ["COLUMNS", "WINDOW", "ZIPF_S", "imbalance_rows", "run"]

N_EXPERTS, TOPK, DUCKS = 256, 8, 32
ZIPF_S = 1.0  # the popularity's exponent
WINDOW = 4096  # tokens per window: a prefill batch
SEED = 30

COLUMNS = [
    ("placement", "placement"),
    ("redundant", "redundant"),
    ("policy", "policy"),
    ("max_replicas", "most replicas"),
    ("max_rows", "max rows / duck"),
    ("mean_rows", "mean rows / duck"),
    ("imbalance", "imbalance (max / mean)"),
    ("expected", "plan's expected imbalance"),
    ("vs_default", "imbalance / default's"),
    ("plan_ms", "plan ms"),
]

# (label, redundant, groups, nodes); None: the default contiguous placement
PLANS: list[tuple[str, int, int, int] | None] = [
    None,
    ("plan_placement", 0, 1, 1),
    ("plan_placement", 32, 1, 1),
    ("plan_placement", 64, 1, 1),
    ("plan_placement, 8 groups on 4 nodes", 32, 8, 4),
]


def _stream(rng: np.random.Generator, p: np.ndarray, tokens: int) -> np.ndarray:
    """[tokens, TOPK] distinct experts per token drawn by popularity ``p`` (Gumbel top-k)."""
    keys = np.log(p / p.sum()) + rng.gumbel(size=(tokens, len(p)))
    return np.argpartition(-keys, TOPK, axis=1)[:, :TOPK]


def imbalance_rows() -> list[dict[str, object]]:
    """The table's rows (see the module's doc)."""
    rng = np.random.default_rng(SEED)
    p = (1.0 / np.arange(1, N_EXPERTS + 1) ** ZIPF_S)[rng.permutation(N_EXPERTS)]
    load = np.bincount(_stream(rng, p, WINDOW).ravel(), minlength=N_EXPERTS)
    later = _stream(rng, p, WINDOW)
    ducks = list(range(DUCKS))
    rows: list[dict[str, object]] = []
    for plan in PLANS:
        if plan is None:
            placement, ms = default_placement(N_EXPERTS, ducks), 0.0
            per_duck = np.bincount([h[0] for h in placement], weights=load, minlength=DUCKS)
            expected = float(per_duck.max() / per_duck.mean())
            row = {"placement": "default (contiguous)", "redundant": 0, "policy": "-"}
        else:
            label, redundant, groups, nodes = plan
            t0 = time.perf_counter()
            made = plan_placement(load, ducks, redundant=redundant, groups=groups, nodes=nodes)
            ms = (time.perf_counter() - t0) * 1e3
            placement, expected = list(made.placement), made.imbalance
            row = {"placement": label, "redundant": redundant, "policy": made.policy}
        counted = rows_per_duck(later, placement, ducks)
        row |= {
            "max_replicas": max(len(h) for h in placement),
            "max_rows": int(counted.max()),
            "mean_rows": float(counted.mean()),
            "imbalance": float(counted.max() / counted.mean()),
            "expected": expected,
            "plan_ms": ms,
        }
        rows.append(row)
    for row in rows:
        row["vs_default"] = row["imbalance"] / rows[0]["imbalance"]  # type: ignore[operator]
    return rows


def run() -> list[Table]:
    t = Table(
        key="moe_placement",
        title="moe_placement: rows per duck on a skewed token stream, default placement "
        "and plan_placement (EPLB)",
        columns=COLUMNS,
        rows=imbalance_rows(),
    )
    t.notes += [
        f"DeepSeek-V3's shape: {N_EXPERTS} experts, top-{TOPK}, {DUCKS} ducks. Expert "
        f"popularity Zipf-like, p ~ 1 / rank**{ZIPF_S} over shuffled experts; each token "
        f"draws {TOPK} distinct experts by it. Plans from one window's histogram "
        f"({WINDOW} tokens), rows counted on the next {WINDOW} tokens by the dataplane's "
        "rule (token t -> replica t % replicas), one row per token and expert.",
        "plan_placement is DeepSeek's EPLB (duckpipe/client/eplb.py), at most 8 replicas "
        "per expert on distinct ducks; expected: the imbalance the first window's histogram "
        "predicts for the placement. The "
        "grouped row keeps 8 expert groups whole on 4 nodes of 8 ducks: coarser here, "
        "where the popularity ignores the groups. Pure numpy, no cluster.",
    ]
    return [t]
