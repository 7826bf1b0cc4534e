"""The shared expert on a chosen set of ducks (``MoeMlp(shared_ducks=...)``): forwards
match DeepSeek-V3's MoE (per token, its routed experts' weighted sum plus shared(x)) with
the set on one, two and three ducks, in every send mode, tokens routed outside the set and
tokens of only -1 included; a token reaches its routed ducks and the set, no other; a bad
set is BadInput. Against the mock and the C dataplane with emulated ducks (``client``)."""

from __future__ import annotations

import deepseek_reference
import numpy as np
import pytest

from duckpipe.errors import BadInput
from duckpipe.moe import MoeMlp

HIDDEN, N_EXPERTS, EFFN, TOPK = 64, 16, 32, 4
DUCKS = list(range(8))  # default placement: experts 2d, 2d + 1 on duck d
TOL = dict(rtol=1e-5, atol=1e-5)


def _moe(shared_ducks, seed: int) -> MoeMlp:
    m = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=seed)
    return MoeMlp(experts=m.experts, shared=m.shared, shared_ducks=shared_ducks)


def _routing(tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token 0 routed only to experts of ducks 6 and 7 (outside every set tested), token 1
    all -1, the rest random with a few -1."""
    rng = np.random.default_rng(seed)
    i = np.stack([rng.permutation(N_EXPERTS)[:TOPK] for _ in range(tokens)]).astype(np.int32)
    w = rng.random((tokens, TOPK)).astype(np.float32)
    i[0] = [12, 13, 14, 15]
    i[1] = -1
    i[2:][rng.random((tokens - 2, TOPK)) < 0.2] = -1
    return i, w


@pytest.mark.parametrize(
    "shared_ducks", [[3], [0, 5], [1, 2, 4]], ids=["one-duck", "two-ducks", "three-ducks"]
)
def test_the_shared_expert_on_a_set_of_ducks_matches_deepseek_v3(client, shared_ducks):
    moe = _moe(shared_ducks, seed=60 + len(shared_ducks))
    layer = 560 + len(shared_ducks)
    client.load_weights(layer, moe, ducks=DUCKS)
    assert client._session.moe[layer].shared_ducks == tuple(shared_ducks)
    x = np.random.default_rng(61).standard_normal((10, HIDDEN)).astype(np.float32)
    i, w = _routing(10, seed=62)
    want = deepseek_reference.moe(moe, x, i, w)
    for mode in ("auto", "broadcast", "unicast"):
        y = client.forward(layer, x, routing=(i, w), moe_send=mode, timeout=30)
        np.testing.assert_allclose(y, want, **TOL, err_msg=mode)
    np.testing.assert_allclose(
        y[1], deepseek_reference.swiglu(moe.shared, x[1]), **TOL
    )  # only -1: shared(x)
    np.testing.assert_allclose(moe.reference(x, i, w), want, **TOL)
    # every token of only -1: the shared expert alone, from its set
    none = np.full((3, TOPK), -1, np.int32)
    y = client.forward(layer, x[:3], routing=(none, w[:3]), timeout=30)
    np.testing.assert_allclose(y, moe.shared.reference(x[:3]), **TOL)


def test_a_token_reaches_its_routed_ducks_and_the_shared_set_only(client):
    moe = _moe([0], seed=70)
    client.load_weights(570, moe, ducks=DUCKS)
    x = np.random.default_rng(71).standard_normal((4, HIDDEN)).astype(np.float32)
    i = np.array([[4, 5], [5, -1], [4, -1], [-1, -1]], np.int32)  # experts of duck 2 only
    w = np.ones(i.shape, np.float32)
    row = HIDDEN * 4
    for mode in ("broadcast", "unicast"):
        c0 = dict(client.stats().counters)
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, 570, routing=(i, w), moe_send=mode)
        with fwd:
            y = fwd.result(timeout=30).copy()
            answered = len(fwd.timings.duck_compute_ns)
        c1 = dict(client.stats().counters)
        np.testing.assert_allclose(y, moe.reference(x, i, w), **TOL, err_msg=mode)
        assert answered == 2, mode  # duck 2 (routed) and duck 0 (the set): not all 8
        sent = c1["moe_bytes"] - c0["moe_bytes"]
        if mode == "unicast":
            # duck 0: a bare table header and every row; duck 2: its section and 3 rows
            assert sent == (16 + 4 * row) + (16 + 8 * (1 + 4) + 3 * row)
        else:  # without a broadcast address: the table and every row to each of the two
            assert sent <= 2 * (16 + 8 * (1 + 4) + 4 * row)


@pytest.mark.parametrize(
    "shared_ducks, match",
    [
        ([], "shared_ducks is empty"),
        ([1, 3, 1], r"names ducks \[1\] more than once"),
        ([2, 99], r"names ducks \[99\], which the dataplane does not have"),
        ("01", "must be a sequence of duck ids"),
    ],
    ids=["empty", "duplicate", "unknown-duck", "not-a-list"],
)
def test_a_bad_shared_set_is_bad_input_before_anything_is_sent(client, shared_ducks, match):
    before = client.stats().counters["control_messages"]
    with pytest.raises(BadInput, match=match):
        client.load_weights(580, _moe(shared_ducks, seed=80), ducks=DUCKS)
    # at most the first stats request and GetTopology: no LoadWeights
    assert client.stats().counters["control_messages"] - before <= 2
    assert 580 not in [la.layer for la in client.layers()]


def test_a_shared_set_off_the_layers_ducks_is_bad_input(client):
    with pytest.raises(BadInput, match=r"ducks \[5\], which are not among the layer's ducks"):
        client.load_weights(581, _moe([0, 5], seed=81), ducks=[0, 1, 2, 3])
