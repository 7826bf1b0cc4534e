"""duckpipe.moe.plan_placement and its numpy port of DeepSeek's EPLB: the same plans as
the published eplb.py on stored cases (tests/client/data/eplb_cases.json, made by
tools/make_eplb_cases.py: no torch or network here), placements duckpipe can load (8
replicas at most, never two on one duck), forwards through a planned placement equal to
MoeMlp.reference, and BadInput for bad input.

What "the same" means. torch's sort is not stable above 16 items, so where
``balanced_packing`` meets equal weights the published order among them is torch's own.
Equal weights are interchangeable for the greedy rule, so every GPU's load and every
expert's replica count are the same in every case (checked exactly); the physical map
``phy2log`` is checked exactly where no two different experts tie (``cross_ties``, found
by the generator); ``log2phy`` as each expert's set of slots there, because two replicas
of one expert always tie and their rank order is torch's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from duckpipe.client.eplb import _separate_replicas, rows_per_duck
from duckpipe.errors import BadInput
from duckpipe.moe import Gate, MoeMlp, plan_placement, rebalance_experts

DATA = json.loads((Path(__file__).parent / "data" / "eplb_cases.json").read_text())
CASES = {c["name"]: c for c in DATA["cases"]}


def _gpu_loads(weight: np.ndarray, phy2log: np.ndarray, logcnt: np.ndarray, gpus: int):
    """Each GPU's load: its slots' experts' load per replica, summed (float64)."""
    share = weight / logcnt
    return np.stack([s[p].reshape(gpus, -1).sum(-1) for s, p in zip(share, phy2log, strict=True)])


def _published(case):
    return tuple(np.array(case[k]) for k in ("phy2log", "log2phy", "logcnt"))


@pytest.mark.parametrize("name", list(CASES))
def test_rebalance_experts_gives_the_published_plan(name):
    c = CASES[name]
    w = np.array(c["weight"])
    assert not c["group_ties"]  # else even the nodes' groups would be torch's choice
    phy2log, log2phy, logcnt = rebalance_experts(
        w, c["num_replicas"], c["num_groups"], c["num_nodes"], c["num_gpus"]
    )
    want_phy2log, want_log2phy, want_logcnt = _published(c)
    np.testing.assert_array_equal(logcnt, want_logcnt)
    gpus = c["num_gpus"]
    np.testing.assert_allclose(
        _gpu_loads(w, phy2log, logcnt, gpus), _gpu_loads(w, want_phy2log, want_logcnt, gpus),
        rtol=1e-12, atol=0,
    )  # fmt: skip
    assert log2phy.shape == want_log2phy.shape
    # log2phy is phy2log's inverse, padded with -1
    for layer in range(len(w)):
        for e in range(w.shape[1]):
            slots = log2phy[layer, e][log2phy[layer, e] >= 0]
            assert len(slots) == logcnt[layer, e] and (phy2log[layer, slots] == e).all()
    if not c["cross_ties"]:
        np.testing.assert_array_equal(phy2log, want_phy2log)
        np.testing.assert_array_equal(np.sort(log2phy, -1), np.sort(want_log2phy, -1))


def test_the_readme_example_is_the_published_output_exactly():
    c = CASES["readme"]  # 16 slots: torch sorts <= 16 items stably, so ranks agree too
    got = rebalance_experts(np.array(c["weight"]), 16, 4, 2, 8)
    for mine, want in zip(got, _published(c), strict=True):
        np.testing.assert_array_equal(mine, want)


def test_the_cases_cover_both_policies_and_deepseek_v3s_shape():
    assert DATA["eplb"].endswith("d52c72d5b2f2fb4c41afbf8eb21366820239913d")
    v3 = [c for c in DATA["cases"] if len(c["weight"][0]) == 256 and c["num_gpus"] == 32]
    assert {(c["num_groups"] % c["num_nodes"] == 0) for c in v3} == {True, False}
    assert any(c["num_replicas"] == 288 and c["num_groups"] == 8 for c in v3)
    assert sum(not c["cross_ties"] for c in v3) >= 2  # the exact phy2log at full size


def _loadable(plan) -> None:
    """What load_weights takes; and each slot an (expert, duck) pair of its own, none
    dropped on the quiet (an emptied slot is -1 and counted in ``merged``)."""
    for held in plan.placement:
        assert 1 <= len(held) <= 8 and len(set(held)) == len(held)
        assert set(held) <= set(plan.ducks)
    assert plan.replicas.sum() == (plan.slots >= 0).sum()
    assert (plan.slots < 0).sum() == plan.merged


@pytest.mark.parametrize("name", [n for n in CASES if len(CASES[n]["weight"]) == 1])
def test_plan_placement_is_the_published_plan_on_ducks_where_duckpipe_needs_no_change(name):
    c = CASES[name]
    w = np.array(c["weight"][0])
    gpus, slots = c["num_gpus"], c["num_replicas"]
    ducks = [3 * g + 1 for g in range(gpus)]  # any ids: GPU g is ducks[g]
    plan = plan_placement(
        w, ducks, redundant=slots - len(w), groups=c["num_groups"], nodes=c["num_nodes"]
    )
    _loadable(plan)
    want_phy2log, _, want_logcnt = _published(c)
    table = want_phy2log[0].reshape(gpus, -1)
    per_node = gpus // c["num_nodes"] if c["num_groups"] % c["num_nodes"] == 0 else gpus
    as_published = (want_logcnt.max() <= min(8, per_node)) and all(
        len(set(row)) == len(row) for row in table.tolist()
    )
    if not as_published:  # capped, or two replicas on one GPU: duckpipe's own plan
        assert plan.replicas.max() <= 8 and plan.merged == 0
        return
    np.testing.assert_array_equal(plan.replicas, want_logcnt[0])
    want_load = _gpu_loads(w[None], want_phy2log, want_logcnt, gpus)[0]
    np.testing.assert_allclose(plan.duck_load, want_load, rtol=1e-12)
    if not c["cross_ties"]:
        for e, held in enumerate(plan.placement):
            assert sorted(held) == sorted(ducks[g] for g in np.flatnonzero((table == e).any(-1)))


def test_hot_experts_get_at_most_8_replicas_on_distinct_ducks():
    c = CASES["v3-zipf1.2-global-256red"]  # the published plan gives the hottest 34
    w = np.array(c["weight"][0])
    assert np.array(c["logcnt"]).max() > 8
    plan = plan_placement(w, list(range(32)), redundant=256)
    _loadable(plan)
    assert plan.replicas.max() == 8 and plan.replicas.sum() == 512
    assert plan.imbalance < 1.5


def test_two_replicas_the_packing_puts_on_one_duck_are_swapped_apart():
    # 9 slots of equal load on 3 ducks: the greedy packing's last slot can only go to a
    # duck that already holds its expert; a swap moves it without changing any load
    plan = plan_placement([4, 4, 4, 4], [0, 1, 2], redundant=5)
    _loadable(plan)
    assert plan.separated == 1 and plan.merged == 0
    assert plan.replicas.sum() == 9 and (plan.slots >= 0).all()
    np.testing.assert_allclose(plan.duck_load, [16 / 3] * 3)


def test_replicas_with_no_swap_left_become_one():
    table = np.array([[0, 0, 1], [1, 1, 1]])  # duck 1 holds nothing duck 0 lacks
    assert _separate_replicas(table, np.ones(2), per_node=2) == (0, 3)
    assert table.tolist() == [[0, -1, 1], [1, -1, -1]]


def test_the_plan_evens_out_a_skewed_load():
    # Zipf-like popularity, exponent 1, over shuffled experts; the plan from one window's
    # histogram, the rows counted on the next window
    rng = np.random.default_rng(7)
    p = (1 / np.arange(1, 257) ** 1.0)[rng.permutation(256)]
    load = np.bincount(_stream(rng, p).ravel(), minlength=256)
    ducks = list(range(32))
    later = _stream(rng, p)
    before = rows_per_duck(later, [[e // 8] for e in range(256)], ducks)
    imbalance = before.max() / before.mean()
    assert imbalance > 3  # measured 4.1
    plan = plan_placement(load, ducks, redundant=32)
    after = rows_per_duck(later, plan.placement, ducks)
    assert plan.policy == "global" and plan.imbalance < 1.05  # measured 1.01
    assert after.max() / after.mean() < 1.2  # measured 1.08: the next window is not the same
    # groups kept whole on 4 nodes: coarser (these experts' groups are no real groups)
    nodes = plan_placement(load, ducks, redundant=32, groups=8, nodes=4)
    assert nodes.policy == "hierarchical" and nodes.imbalance < 0.5 * imbalance


def _stream(rng, p: np.ndarray, tokens: int = 2048) -> np.ndarray:
    """Top-8 experts per token drawn by popularity ``p`` (Gumbel top-k: without repeats)."""
    keys = np.log(p / p.sum()) + rng.gumbel(size=(tokens, len(p)))
    return np.argpartition(-keys, 8, axis=1)[:, :8]


def test_rows_per_duck_follows_the_replica_rule():
    placement = [[5], [5, 7], [9, 7, 5]]
    indices = np.array([[0, 1], [1, 2], [2, -1], [2, 0]])
    # token 0: e0 -> 5, e1 -> (0 % 2) 5; token 1: e1 -> 7, e2 -> 7; token 2: e2 -> 5;
    # token 3: e2 -> (3 % 3) 9, e0 -> 5
    assert rows_per_duck(indices, placement, [5, 7, 9]).tolist() == [4, 2, 1]


def test_a_planned_placement_loads_and_forwards_match_the_reference(client):
    n, hidden, topk = 16, 64, 4
    load = np.array([900, 40, 30, 500, 20, 10, 10, 300, 5, 5, 60, 70, 80, 90, 100, 0])
    ducks = [2, 4, 6, 8, 10, 12, 14, 16]
    plan = plan_placement(load, ducks, redundant=8)
    assert plan.replicas.max() > 1  # the layer has replicas to route through
    moe = MoeMlp.random(n, hidden, 32, shared=False, seed=41)
    info = client.load_weights(541, moe, placement=plan.placement)
    assert sorted(info.ducks) == ducks
    gate = Gate.random(n, hidden, topk=topk, score="sigmoid", seed=41)
    x = np.random.default_rng(41).standard_normal((24, hidden)).astype(np.float32)
    routing = gate(x)
    y = client.forward(541, x, routing=routing, timeout=30)
    np.testing.assert_allclose(y, moe.reference(x, *routing), rtol=1e-5, atol=1e-5)


V3 = np.arange(256) + 1


@pytest.mark.parametrize(
    ("load", "ducks", "kw", "says"),
    [
        (np.r_[V3[:-1], -1], range(32), {}, "never negative: expert 255 has -1"),
        (np.r_[V3[:-1], np.nan], list(range(32)), {}, "finite: expert 255 has nan"),
        (np.r_[np.inf, V3[1:]], list(range(32)), {}, "finite: expert 0 has inf"),
        (V3.reshape(2, 128), list(range(32)), {}, "one number per expert"),
        ([], list(range(32)), {}, "one number per expert"),
        (["a"] * 4, [0, 1], {}, "loads are numbers"),
        (V3, list(range(32)), {"redundant": -1}, "0 or more"),
        (V3, list(range(32)), {"redundant": 30}, "use redundant=0 or 32"),
        (V3, list(range(32)), {"redundant": 2.0}, "redundant is an integer"),
        (V3, list(range(32)), {"groups": 3}, "groups=3 must divide the 256 experts"),
        (V3, list(range(32)), {"groups": 8, "nodes": 8, "redundant": 64}, None),
        (V3, list(range(30)), {"groups": 8, "nodes": 4, "redundant": 4}, "nodes=4 must divide"),
        (V3, list(range(32)), {"redundant": 2048}, "use redundant <= 1792"),
        (V3, list(range(32)), {"nodes": 4, "groups": 8, "redundant": 2048}, "per node"),
        (V3[:8], [0, 1, 2, 3], {"redundant": 40}, "use redundant <= 24"),
        (V3, [0, 1, 1, 2], {}, "names a duck twice"),
        (V3, [], {}, "ducks is empty"),
        (V3, [0, "1"], {}, "ducks are ids"),
        (V3, [0, 256], {}, "ducks are ids 0..255"),
        (V3, 32, {}, "ducks is a sequence"),
    ],
)
def test_bad_input_is_refused_saying_what_to_do(load, ducks, kw, says):
    if says is None:  # the control: a shape the rules allow (8 nodes of 4 ducks)
        _loadable(plan_placement(load, list(ducks), **kw))
        return
    with pytest.raises(BadInput, match=says.replace("(", r"\(").replace(".", r"\.")):
        plan_placement(load, ducks, **kw)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((np.ones((1, 8)), 4, 1, 1, 4), "every expert needs one"),
        ((np.ones((1, 8)), 12, 1, 1, 8), "do not split evenly over 8 ducks"),
        ((np.ones((1, 8)), 8, 3, 1, 4), "8 experts do not split into 3 equal groups"),
        ((np.ones((1, 8)), 8, 2, 2, 3), "3 ducks do not split into 2 equal nodes"),
        ((np.ones(8), 8, 1, 1, 4), r"\[layers, experts\]"),
    ],
)
def test_rebalance_experts_refuses_what_the_published_code_asserts(args, says):
    with pytest.raises(BadInput, match=says):
        rebalance_experts(*args)
