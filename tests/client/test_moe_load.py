"""Loading a mixture-of-experts layer: each duck's bank, the placement the client sends,
its checks (BadInput before anything is sent), and the dataplane's refusals of a
malformed MoE LoadWeights. Against the mock and the C dataplane (``dataplane`` fixture);
the pure plan tests need neither."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from duckpipe import MlpKind, SwiGluMlp
from duckpipe.client import weights
from duckpipe.errors import BadInput
from duckpipe.moe import MoeMlp
from duckpipe.schema import control as ctl

HIDDEN, EFFN = 64, 16


def _moe(n_experts: int = 8, shared: bool = True, dtype=np.float32, seed: int = 0) -> MoeMlp:
    return MoeMlp.random(n_experts, HIDDEN, EFFN, shared=shared, dtype=dtype, seed=seed)


# --- the plan (no dataplane) ---------------------------------------------------------


def test_default_placement_spreads_experts_in_contiguous_blocks():
    # DeepSeek-V3's shape: 256 experts on 32 ducks, 8 each, 0-7 on the first
    place = weights.default_placement(256, list(range(100, 132)))
    assert [held for held in place[:9]] == [[100]] * 8 + [[101]]
    assert place[255] == [131]
    assert all(sum(h == [d] for h in place) == 8 for d in range(100, 132))
    # fewer experts than ducks: e -> ducks[e * n // n_experts], every other duck
    assert weights.default_placement(4, [0, 1, 2, 3, 4, 5, 6, 7]) == [[0], [2], [4], [6]]


def test_banks_hold_each_ducks_experts_ascending_then_its_shared_columns():
    moe = dataclasses.replace(_moe(n_experts=6, shared=True), shared_ducks=[3, 0, 1, 2])
    plan = weights.moe_layer(
        3, moe, [0, 1, 2, 3], placement=[2, [0, 2], 1, 0, [3, 1], 2]
    )  # duck 0: experts 1 3; duck 1: 2 4; duck 2: 0 1 5; duck 3: 4
    assert plan.ducks == (0, 1, 2, 3)
    assert [plan.experts_on(d) for d in plan.ducks] == [[1, 3], [2, 4], [0, 1, 5], [4]]
    shared_cols = [4, 4, 4, 4]  # the shared expert's 16 columns over 4 ducks
    assert plan.bank_sizes == tuple(
        len(plan.experts_on(d)) * EFFN + s for d, s in zip(plan.ducks, shared_cols, strict=True)
    )
    banks: dict[int, list[np.ndarray]] = {}
    for duck, t, arr in weights._banks(moe, plan):
        assert t == len(banks.setdefault(duck, []))  # tensors 0..2 of each duck, in order
        banks[duck].append(arr)
    assert moe.shared is not None
    lo = 0
    for duck, width in zip(plan.ducks, plan.bank_sizes, strict=True):
        w_gate, w_up, w_down = banks[duck]
        assert w_gate.shape == w_up.shape == (HIDDEN, width) and w_down.shape == (width, HIDDEN)
        assert w_gate.flags.c_contiguous and w_down.flags.c_contiguous
        for s, e in enumerate(plan.experts_on(duck)):
            cols = slice(s * EFFN, (s + 1) * EFFN)
            np.testing.assert_array_equal(w_gate[:, cols], moe.experts[e].w_gate)
            np.testing.assert_array_equal(w_up[:, cols], moe.experts[e].w_up)
            np.testing.assert_array_equal(w_down[cols], moe.experts[e].w_down)
        n = width - len(plan.experts_on(duck)) * EFFN
        np.testing.assert_array_equal(w_gate[:, width - n :], moe.shared.w_gate[:, lo : lo + n])
        np.testing.assert_array_equal(w_down[width - n :], moe.shared.w_down[lo : lo + n])
        lo += n
    assert lo == moe.shared.ffn


def test_without_ducks_a_given_placement_puts_the_layer_on_the_ducks_it_names():
    plan = weights.moe_layer(0, _moe(4, shared=False), range(8), placement=[5, 3, [5, 7], 3])
    assert plan.ducks == (3, 5, 7) and plan.bank_sizes == (2 * EFFN, 2 * EFFN, EFFN)


def test_float16_banks_stay_float16():
    moe = _moe(4, dtype=np.float16)
    plan = weights.moe_layer(0, moe, [0, 1])
    assert {arr.dtype for _, _, arr in weights._banks(moe, plan)} == {np.dtype(np.float16)}


@pytest.mark.parametrize(
    "placement, ducks, match",
    [
        ([0, 1, 2], None, "places 3 experts but the layer has 4"),
        ([0, 1, 2, 99], None, r"expert 3 is placed on ducks \[99\], which the dataplane"),
        ([0, 1, [2, 2], 3], None, r"expert 2 is placed on ducks \[2, 2\]: .* distinct"),
        ([0, [], 2, 3], None, "expert 1 is placed on 0 ducks; give it 1..8"),
        ([0, 1, list(range(9)), 3], None, "expert 2 is placed on 9 ducks; give it 1..8"),
        ([0, 1, 2, "3"], None, "placement of expert 3 is '3'"),
        ([0, 1, 2, 3.0], None, "placement of expert 3 is 3.0"),
        ([0, 1, 2, 5], [0, 1, 2, 3], r"expert 3 is placed on ducks \[5\], which are not among"),
        (7, None, "placement must be a sequence of 4 items"),
    ],
)
def test_a_bad_placement_is_bad_input_naming_the_expert(placement, ducks, match):
    with pytest.raises(BadInput, match=match):
        weights.moe_layer(0, _moe(4, shared=False), range(8), ducks=ducks, placement=placement)


def test_a_shared_expert_narrower_than_the_ducks_is_bad_input_naming_both_numbers():
    moe = MoeMlp(
        experts=[SwiGluMlp.random(HIDDEN, EFFN, seed=i) for i in range(4)],
        shared=SwiGluMlp.random(HIDDEN, 3, seed=9),
        shared_ducks=[0, 1, 2, 3],
    )
    with pytest.raises(BadInput, match="shared expert has 3 columns but shared_ducks names 4"):
        weights.moe_layer(0, moe, range(8), ducks=[0, 1, 2, 3])


def test_a_duck_with_no_expert_and_no_shared_expert_is_bad_input():
    with pytest.raises(BadInput, match=r"ducks \[1, 3, 5, 7\] would hold no expert"):
        weights.moe_layer(0, _moe(4, shared=False), range(8))  # default: 4 experts, 8 ducks


# --- against a dataplane --------------------------------------------------------------


def test_load_sends_kind_moe_with_each_ducks_bank_width(client):
    moe = _moe(8, shared=True)
    info = client.load_weights(40, moe, ducks=[0, 1, 2, 3], placement=[0, 0, 1, [1, 2], 2, 3, 3, 3])
    assert info.ready and info.kind == MlpKind.MOE and info.ducks == [0, 1, 2, 3]
    # the default shared set: one duck (its 16 columns fit any bank), the layer's first
    assert info.shard_sizes == [2 * EFFN + 16, 2 * EFFN, 2 * EFFN, 3 * EFFN]
    assert info.ffn == sum(info.shard_sizes) and not info.has_b_down
    plan = client._session.moe[40]
    assert plan.shared_ducks == (0,)
    assert plan.placement == ((0,), (0,), (1,), (1, 2), (2,), (3,), (3,), (3,))
    client.unload_layer(40)
    assert 40 not in client._session.moe


def test_a_dense_layer_refuses_a_placement_and_forgets_an_earlier_moe_layer_of_its_id(client):
    client.load_weights(41, _moe(4, shared=True), ducks=[0, 1])
    dense = SwiGluMlp.random(HIDDEN, 32, seed=1)
    with pytest.raises(BadInput, match="placement= places the experts of a MoeMlp"):
        client.load_weights(41, dense, placement=[0])
    assert 41 in client._session.moe  # nothing was sent: the MoE layer is still there
    client.load_weights(41, dense, ducks=[0, 1])
    assert 41 not in client._session.moe
    assert [la.kind for la in client.layers() if la.layer == 41] == [MlpKind.SWIGLU]


def test_a_bad_placement_sends_nothing(client):
    before = client.stats().counters["control_messages"]
    with pytest.raises(BadInput, match="expert 1 is placed on ducks"):
        client.load_weights(42, _moe(4), placement=[0, 200, 1, 2])
    # GetTopology and GetStats went; no LoadWeights (the layer is unknown)
    assert client.stats().counters["control_messages"] - before == 2
    assert 42 not in [la.layer for la in client.layers()]


def _raw_load(client, **over) -> None:
    """A LoadWeights as the client would send it for 4 experts of EFFN on ducks 0, 1 (2
    each, 4 shared columns each), with ``over`` replacing fields: the dataplane's checks
    see exactly what a hostile or buggy client sends."""
    fields = dict(
        layer=43,
        kind=int(MlpKind.MOE),
        dtype=1,
        hidden=HIDDEN,
        ffn=2 * (2 * EFFN + 4),
        ducks=[0, 1],
        shard_sizes=[2 * EFFN + 4, 2 * EFFN + 4],
        expert_ffn=EFFN,
        expert_replicas=[1, 1, 1, 1],
        expert_ducks=[0, 0, 1, 1],
        shared_ducks=[0, 1],
    )
    fields.update(over)
    client._session.request(lambda rid: ctl.LoadWeights(req_id=rid, **fields))


def test_the_dataplane_takes_a_well_formed_moe_load(client):
    _raw_load(client)  # the baseline the refusals below each break one way
    client.unload_layer(43)


@pytest.mark.parametrize(
    "over, match",
    [
        (
            dict(expert_replicas=[1, 1, 1, 2]),
            "expert_replicas add up to 5 ducks, expert_ducks lists 4",
        ),
        (
            dict(expert_ducks=[0, 0, 1, 2]),
            "expert 3 is placed on duck 2, which is not one of the layer's ducks",
        ),
        (
            dict(expert_replicas=[1, 1, 1, 2], expert_ducks=[0, 0, 1, 1, 1]),
            "MOE layer 43: expert 3 is placed on duck 1 twice",
        ),
        (
            dict(shard_sizes=[2 * EFFN - 1, 2 * EFFN + 4], ffn=4 * EFFN + 3),
            r"duck 0's bank has 31 columns, fewer than its 2 experts x expert_ffn 16",
        ),
        (
            dict(shard_sizes=[2 * EFFN, 2 * EFFN + 4], ffn=4 * EFFN + 4),
            "duck 0 is in shared_ducks but its bank holds no shared-expert column",
        ),
        (
            dict(shared_ducks=[0]),
            "duck 1's bank holds 4 shared-expert columns but shared_ducks does not name it",
        ),
        (
            dict(shared_ducks=[]),
            "duck 0's bank holds 4 shared-expert columns but shared_ducks is empty",
        ),
        (
            dict(shared_ducks=[0, 1, 2]),
            "shared_ducks names duck 2, which is not one of the layer's ducks",
        ),
        (dict(shared_ducks=[0, 1, 1]), "shared_ducks names duck 1 twice"),
        (
            dict(
                ducks=[0, 1, 2],
                shard_sizes=[2 * EFFN, 2 * EFFN, 1],
                ffn=4 * EFFN + 1,
                shared_ducks=[],
            ),
            "duck 2's bank holds 1 shared-expert columns but shared_ducks is empty",
        ),
        (dict(has_b_down=True), "no b_down"),
        (dict(expert_ffn=0), r"MOE layer 43 needs expert_ffn >= 1"),
        (
            dict(kind=int(MlpKind.SWIGLU), ffn=64, shard_sizes=[32, 32], shared_ducks=[]),
            r"layer 43 is dense \(kind 2\): expert_ffn, expert_replicas, expert_ducks and "
            "shared_ducks",
        ),
    ],
    ids=[
        "replicas-vs-ducks",
        "duck-not-in-layer",
        "duplicate-replica",
        "bank-too-narrow",
        "shared-set-duck-without-columns",
        "shared-columns-outside-the-set",
        "shared-set-empty",
        "shared-set-unknown-duck",
        "shared-set-duplicate",
        "shared-columns-no-set",
        "b_down",
        "no-expert-ffn",
        "dense-with-moe-fields",
    ],
)
def test_the_dataplane_refuses_a_malformed_moe_load(client, over, match):
    with pytest.raises(BadInput, match=match):  # an Error reply BAD_REQUEST
        _raw_load(client, **over)
    assert 43 not in [la.layer for la in client.layers()]
