"""``duckpipe bench moe``'s ``moe_placement`` table: rows per duck on a Zipf-skewed token
stream (DeepSeek-V3's shape), the default placement against plan_placement's. Pure
numpy: its numbers are counts, the same on every machine, so the test checks them."""

from __future__ import annotations

import math

from duckpipe.bench import moe_placement as mp
from duckpipe.bench.report import table_markdown


def test_plan_placement_evens_out_the_rows_the_default_placement_piles_on_hot_ducks():
    (t,) = mp.run()
    assert t.key == "moe_placement"
    by = {(r["placement"], r["redundant"]): r for r in t.rows}
    assert len(by) == len(mp.PLANS)
    for r in t.rows:
        assert {k for k, _ in mp.COLUMNS} <= r.keys()
        assert r["mean_rows"] == mp.WINDOW * 8 / 32  # one row per token and expert
        numbers = [r[k] for k, _ in mp.COLUMNS if k not in ("placement", "policy")]
        assert all(isinstance(v, int | float) and math.isfinite(v) for v in numbers), r
    default = by[("default (contiguous)", 0)]
    assert default["imbalance"] > 4  # measured 5.81: the hottest expert's duck
    assert default["max_replicas"] == 1
    planned = by[("plan_placement", 32)]
    assert planned["imbalance"] < 1.25 and planned["expected"] < 1.05  # measured 1.08, 1.00
    assert planned["vs_default"] < 0.25 and planned["max_replicas"] == 8
    assert by[("plan_placement", 0)]["imbalance"] < default["imbalance"]  # packing alone
    grouped = by[("plan_placement, 8 groups on 4 nodes", 32)]
    assert grouped["policy"] == "hierarchical" and grouped["vs_default"] < 0.5
    text = table_markdown(t)
    assert t.title in text and "Zipf-like, p ~ 1 / rank**1.0" in text
