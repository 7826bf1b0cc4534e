"""DeepEP's "no expert" and the empty batch, through the mock and the C dataplane.

``-1`` in ``topk_idx`` is DeepEP's padded or dropped slot: it contributes nothing (its
weight is not read), a token of only ``-1`` gets the shared expert alone or zeros, and a
forward whose every slot is ``-1`` on a layer without a shared expert completes with
zeros without sending anything. ``T = 0`` returns an empty result without a descriptor.

Results are compared with ``deepseek_reference.moe`` (tests/deepseek_reference.py), a
per-token loop written from DeepSeek-V3's ``MoE.forward`` (``y[i] += expert(x[i]) *
weights[i, top]`` over the tokens each expert was given, plus ``shared_experts(x)``) with
DeepEP's rule that a ``-1`` slot is skipped, not with ``MoeMlp.reference`` alone.
Tolerances as in test_moe_forward.py (float32 sums in another order: 1e-5).
"""

from __future__ import annotations

import deepseek_reference
import numpy as np
import pytest

import duckpipe
from duckpipe.errors import BadInput
from duckpipe.moe import MoeMlp

HIDDEN, N_EXPERTS, EFFN, TOPK = 64, 16, 32, 4
TOL = dict(rtol=1e-5, atol=1e-5)


def _routing_with_holes(tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct experts per token with about a third of the slots -1 (weights there NaN,
    inf or junk: DeepEP leaves them unspecified), token 1 all -1, and int64 ids."""
    rng = np.random.default_rng(seed)
    i = np.stack([rng.permutation(N_EXPERTS)[:TOPK] for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, TOPK)).astype(np.float32)
    hole = rng.random((tokens, TOPK)) < 0.35
    hole[1] = True
    i[hole] = -1
    junk = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
    w[hole] = junk[rng.integers(0, junk.size, int(hole.sum()))]
    return i, w


def _counters(client) -> dict[str, int]:
    return dict(client.stats().counters)


def _delta(before: dict[str, int], after: dict[str, int], name: str) -> int:
    return after[name] - before[name]


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "routed-only"])
def test_minus_one_slots_contribute_nothing_in_every_send_mode(client, shared):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=shared, seed=40 + shared)
    layer = 540 + shared
    client.load_weights(layer, moe, ducks=None if shared else list(range(8)))
    x = np.random.default_rng(41).standard_normal((12, HIDDEN)).astype(np.float32)
    i, w = _routing_with_holes(12, seed=42)
    want = deepseek_reference.moe(moe, x, i, w)
    for mode in ("auto", "broadcast", "unicast"):
        y = client.forward(layer, x, routing=(i, w), moe_send=mode, timeout=30)
        np.testing.assert_allclose(y, want, **TOL, err_msg=mode)
    # duckpipe's own reference agrees (it skips -1 too)
    np.testing.assert_allclose(moe.reference(x, i, w), want, **TOL)
    # the token of only -1: the shared expert alone, or exact zeros
    if shared:
        np.testing.assert_allclose(y[1], deepseek_reference.swiglu(moe.shared, x[1]), **TOL)
    else:
        assert not y[1].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_every_slot_minus_one_without_a_shared_expert_gives_zeros_and_sends_nothing(client, dtype):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, dtype=dtype, seed=43)
    layer = 543 + (dtype == np.float16)
    client.load_weights(layer, moe, ducks=list(range(8)))
    x = np.random.default_rng(43).standard_normal((6, HIDDEN)).astype(dtype)
    i, w = _routing_with_holes(6, seed=44)
    # a routed forward first leaves its sums in the result slot the next one reuses
    assert client.forward(layer, x, routing=(i, w), timeout=30).any()
    none = np.full((6, TOPK), -1, np.int32)
    before = _counters(client)
    y = client.forward(layer, x, routing=(none, w), timeout=30)
    after = _counters(client)
    assert y.dtype == dtype and y.shape == x.shape
    assert not y.any()  # exact zeros, not what the slot held
    assert _delta(before, after, "moe_no_duck_forwards") == 1
    assert _delta(before, after, "forwards_ok") == 1
    for sent in ("moe_bytes", "moe_broadcasts", "moe_unicasts", "tx_packets"):
        assert _delta(before, after, sent) == 0, sent
    # and the next forward is served as usual (float16: each reply and the sum rounded,
    # (TOPK + 2) half-ulps of the largest value, as test_moe_forward.py bounds it)
    want = deepseek_reference.moe(moe, x, i, w)
    tol = (
        TOL
        if dtype == np.float32
        else dict(rtol=2**-10, atol=(TOPK + 2) * 2**-11 * np.abs(want).max())
    )
    y = client.forward(layer, x, routing=(i, w), timeout=30)
    np.testing.assert_allclose(y.astype(np.float32), want, **tol)


def test_every_slot_minus_one_with_a_shared_expert_gives_the_shared_expert(client):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=45)
    client.load_weights(545, moe)
    x = np.random.default_rng(45).standard_normal((5, HIDDEN)).astype(np.float32)
    none = np.full((5, 2), -1, np.int64)
    w = np.zeros((5, 2), np.float32)
    y = client.forward(545, x, routing=(none, w), timeout=30)
    np.testing.assert_allclose(y, deepseek_reference.moe(moe, x, none, w), **TOL)
    np.testing.assert_allclose(y, moe.shared.reference(x), **TOL)


def test_other_negative_ids_are_still_refused_before_anything_is_sent(client):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, seed=46)
    client.load_weights(546, moe, ducks=list(range(8)))
    x = np.ones((3, HIDDEN), np.float32)
    i = np.array([[0, 1], [-2, 3], [4, 5]], np.int32)
    w = np.ones((3, 2), np.float32)
    before = _counters(client)
    with pytest.raises(BadInput, match=r"token 1, choice 0 names expert -2.*-1 for no expert"):
        client.forward(546, x, routing=(i, w))
    i[1, 0] = -1
    w[1, 1] = np.nan  # a real expert's weight must still be finite
    with pytest.raises(BadInput, match=r"token 1, choice 1 \(expert 3\) has weight bits"):
        client.forward(546, x, routing=(i, w))
    assert _delta(before, _counters(client), "descriptors") == 0


# --- T = 0 ----------------------------------------------------------------------------


@pytest.fixture
def layers(client):
    """A MoE layer 547 (shared expert) and a dense layer 548."""
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=47)
    client.load_weights(547, moe, ducks=list(range(8)))
    client.load_weights(548, duckpipe.SwiGluMlp.random(HIDDEN, 32, seed=48), ducks=[0, 1])
    return moe


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_an_empty_batch_returns_an_empty_result_without_a_descriptor(client, dtype):
    client.load_weights(549, MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, dtype=dtype, seed=49))
    client.load_weights(550, duckpipe.SwiGluMlp.random(HIDDEN, 32, dtype, seed=50))
    x = np.empty((0, HIDDEN), dtype)
    i, w = np.empty((0, TOPK), np.int64), np.empty((0, TOPK), np.float32)
    before = _counters(client)
    for y in (
        client.forward(549, x, routing=(i, w)),
        client.forward(549, x, routing=(i.astype(np.int32), w), moe_send="unicast"),
        client.forward(550, x),
    ):
        assert y.shape == (0, HIDDEN) and y.dtype == dtype
    after = _counters(client)
    for name in ("descriptors", "forwards", "moe_forwards", "tx_packets"):
        assert _delta(before, after, name) == 0, name


@pytest.mark.parametrize(
    "layer, shape, dtype, routing, kw, match",
    [
        (548, (0, HIDDEN + 1), np.float32, None, {}, "hidden size 64"),
        (548, (0, HIDDEN), np.float16, None, {}, "the activation is float16"),
        (548, (0, HIDDEN), np.float32, "ok", {}, "layer 548 is dense"),
        (547, (0, HIDDEN), np.float32, None, {}, "needs its routing"),
        (547, (0, HIDDEN), np.float32, "rows", {}, r"routing indices have shape \(1, 4\)"),
        (547, (0, HIDDEN), np.float32, "topk", {}, "routed to 1..16 experts"),
        (547, (0, HIDDEN), np.float32, "ok", {"moe_send": "multicast"}, "moe_send must be"),
        (547, (0, HIDDEN), np.float32, "ok", {"ducks": [0]}, "not both"),
        (999, (0, HIDDEN), np.float32, None, {}, "layer 999 is not loaded"),
    ],
    ids=["hidden", "dtype", "dense-routing", "moe-no-routing", "routing-rows", "topk",
         "moe-send", "ducks", "no-layer"],
)  # fmt: skip
def test_an_empty_batch_is_refused_for_what_any_forward_is(
    client, layers, layer, shape, dtype, routing, kw, match
):
    topk = 17 if routing == "topk" else TOPK
    rows = 1 if routing == "rows" else 0
    pair = (np.zeros((rows, topk), np.int32), np.zeros((rows, topk), np.float32))
    x = np.empty(shape, dtype)
    with pytest.raises(duckpipe.errors.DuckpipeError, match=match):
        client.forward(layer, x, routing=None if routing is None else pair, **kw)


def test_a_slot_of_zero_rows_is_refused_naming_forward(client):
    words = r"0 rows, .*: an empty batch needs no slot; Client\.forward returns"
    with pytest.raises(BadInput, match=words):
        client.claim((0, HIDDEN), np.float32)
