"""Mixture of experts on the host: DeepSeek-V3's gate, the layer's numpy reference, and
the routing check that forward(routing=...) will reuse."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, MoeMlp, SwiGluMlp
from duckpipe.errors import BadInput
from duckpipe.moe import Gate, check_routing

# ---------------------------------------------------------------------------------------
# The gate against DeepSeek-V3's rules, written out again one token at a time


def _rules_for_one_token(
    logits: list[float],
    bias: list[float] | None,
    *,
    score: str,
    groups: int,
    topk_groups: int,
    topk: int,
    route_scale: float,
) -> tuple[list[int], list[float]]:
    """DeepSeek-V3 inference/model.py Gate.forward, read as rules and written as a plain
    loop over one token's logits (Python floats, no numpy, no code shared with Gate)."""
    n = len(logits)
    if score == "softmax":
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps)
        scores = [e / total for e in exps]
    else:
        scores = [
            1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v)) for v in logits
        ]
    chooser = [s + b for s, b in zip(scores, bias, strict=True)] if bias else list(scores)
    allowed = list(range(n))
    if groups > 1:
        per = n // groups
        group_score = []
        for g in range(groups):
            members = chooser[g * per : (g + 1) * per]
            best_two = sorted(members)[-2:]
            group_score.append(best_two[0] + best_two[1] if bias else max(members))
        kept = sorted(range(groups), key=lambda g: (-group_score[g], g))[:topk_groups]
        allowed = [e for e in range(n) if e // per in kept]
    chosen = sorted(allowed, key=lambda e: (-chooser[e], e))[:topk]
    weights = [scores[e] for e in chosen]
    if score == "sigmoid":
        total = sum(weights)
        weights = [w / total for w in weights]
    return chosen, [w * route_scale for w in weights]


def _check_against_rules(gate: Gate, x: np.ndarray) -> np.ndarray:
    # The logits are the gate's matmul done the same way: the rules under test start after it.
    logits = (x.astype(np.float32) @ gate.weight.astype(np.float32).T).astype(np.float64)
    indices, weights = gate(x)
    assert weights.dtype == np.float32 and indices.dtype == np.int32
    assert weights.shape == indices.shape == (x.shape[0], gate.topk)
    bias = None if gate.bias is None else [float(b) for b in gate.bias]
    for t in range(x.shape[0]):
        want_idx, want_w = _rules_for_one_token(
            [float(v) for v in logits[t]],
            bias,
            score=gate.score,
            groups=gate.groups,
            topk_groups=gate.topk_groups,
            topk=gate.topk,
            route_scale=gate.route_scale,
        )
        assert indices[t].tolist() == want_idx, f"token {t}"
        np.testing.assert_allclose(weights[t], want_w, rtol=1e-6, err_msg=f"token {t}")
    return indices


def _tokens(n: int, hidden: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float32)


def test_softmax_gate_without_groups_follows_deepseek_rules():
    gate = Gate.random(64, 32, topk=6, seed=1)
    _check_against_rules(gate, _tokens(40, 32, seed=2))


def test_softmax_gate_with_groups_and_no_bias_keeps_groups_by_their_best_expert():
    gate = Gate.random(64, 32, topk=6, groups=8, topk_groups=3, route_scale=16.0, seed=3)
    _check_against_rules(gate, _tokens(40, 32, seed=4))


def test_deepseek_v3_gate_follows_deepseek_rules_at_full_size():
    gate = Gate.deepseek_v3(seed=5)
    assert (gate.n_experts, gate.hidden, gate.groups, gate.topk_groups, gate.topk) == (
        256,
        7168,
        8,
        4,
        8,
    )
    x = _tokens(24, 7168, seed=6)
    indices = _check_against_rules(gate, x)
    # the tokens draw on at most 4 of the 8 groups of 32 experts each
    assert all(len(set((row // 32).tolist())) <= 4 for row in indices)
    # and the limit bites: without it some token would have chosen other experts
    free = Gate(gate.weight, gate.bias, score="sigmoid", topk=8, route_scale=2.5)
    assert (np.sort(free(x)[1], axis=1) != np.sort(indices, axis=1)).any()
    np.testing.assert_allclose(gate(x).weights.sum(axis=1), 2.5, rtol=1e-6)


def _sigmoid_logits(probs: list[float]) -> np.ndarray:
    """One token whose sigmoid scores are ``probs``, for a gate whose weight is the identity."""
    return np.array([[math.log(p / (1 - p)) for p in probs]], dtype=np.float32)


# 4 groups of 4: group 0 holds the single best expert (0.95) but the worst best two
# (0.95 + 0.05) of the three leading groups; groups 1 and 2 win on their best two.
_GROUPED = [0.95, 0.05, 0.05, 0.05, 0.80, 0.70, 0.05, 0.05, 0.75, 0.60, 0.05, 0.05] + [0.1] * 4


def test_with_a_bias_groups_are_ranked_by_their_best_two_experts():
    x = _sigmoid_logits(_GROUPED)
    eye = np.eye(16, dtype=np.float32)
    gate = Gate(eye, np.zeros(16, np.float32), score="sigmoid", groups=4, topk_groups=2, topk=2)
    indices, weights = gate(x)
    assert indices.tolist() == [[4, 8]]  # expert 0, the best, sits in a dropped group
    np.testing.assert_allclose(weights, [[0.80 / 1.55, 0.75 / 1.55]], rtol=1e-6)
    _check_against_rules(gate, x)


def test_without_a_bias_groups_are_ranked_by_their_best_expert():
    x = _sigmoid_logits(_GROUPED)
    eye = np.eye(16, dtype=np.float32)
    gate = Gate(eye, score="sigmoid", groups=4, topk_groups=2, topk=2)
    indices, weights = gate(x)
    assert indices.tolist() == [[0, 4]]
    np.testing.assert_allclose(weights, [[0.95 / 1.75, 0.80 / 1.75]], rtol=1e-6)
    _check_against_rules(gate, x)


def test_the_bias_changes_which_experts_win_but_not_their_weights():
    x = _sigmoid_logits([0.9, 0.8, 0.3, 0.1, 0.05, 0.05, 0.05, 0.05])
    eye = np.eye(8, dtype=np.float32)
    bias = np.array([0, 0, 0, 1.0, 0, 0, 0, 0], dtype=np.float32)
    unbiased = Gate(eye, score="sigmoid", topk=2, route_scale=2.5)
    biased = Gate(eye, bias, score="sigmoid", topk=2, route_scale=2.5)
    i, w = unbiased(x)
    assert i.tolist() == [[0, 1]]
    np.testing.assert_allclose(w, [[0.9 / 1.7 * 2.5, 0.8 / 1.7 * 2.5]], rtol=1e-6)
    i, w = biased(x)
    assert i.tolist() == [[3, 0]]  # 0.1 + 1.0 now outranks 0.9
    np.testing.assert_allclose(w, [[0.1 * 2.5, 0.9 * 2.5]], rtol=1e-6)  # unbiased 0.1, 0.9
    _check_against_rules(biased, x)


def test_softmax_weights_are_the_chosen_probabilities_not_renormalised():
    gate = Gate(np.eye(4, dtype=np.float32), topk=2, route_scale=2.0)
    indices, weights = gate(np.array([[2.0, 1.0, 0.0, 0.0]], dtype=np.float32))
    z = math.e**2 + math.e + 2
    assert indices.tolist() == [[0, 1]]
    np.testing.assert_allclose(weights, [[2 * math.e**2 / z, 2 * math.e / z]], rtol=1e-6)


def test_equal_scores_choose_the_lowest_expert_ids_first():
    gate = Gate(np.eye(6, dtype=np.float32), score="sigmoid", topk=3)
    indices, weights = gate(np.zeros((2, 6), dtype=np.float32))
    assert indices.tolist() == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_allclose(weights, 1 / 3, rtol=1e-6)


def test_a_float16_gate_takes_float16_tokens():
    gate = Gate.random(32, 16, topk=4, score="sigmoid", groups=4, topk_groups=2, bias=True, seed=7)
    gate16 = dataclasses.replace(gate, weight=gate.weight.astype(np.float16))
    _check_against_rules(gate16, _tokens(12, 16, seed=8).astype(np.float16))


class _CountsConversions(np.ndarray):
    """A weight that counts the conversions asked of it (``astype``)."""

    conversions = 0

    def astype(self, *args, **kwargs):
        type(self).conversions += 1
        return super().astype(*args, **kwargs)


def test_a_float16_gate_converts_its_weight_once_at_construction_not_per_call():
    # a float16 or bf16 weight converted on every call cost 3.3-4.3 ms at DeepSeek-V3's
    # shape, 10-15x the float32 gate (issue 29): the call reads a float32 copy made once
    gate = Gate.random(32, 16, topk=4, score="sigmoid", groups=4, topk_groups=2, bias=True, seed=7)
    weight = gate.weight.astype(np.float16).view(_CountsConversions)
    gate16 = dataclasses.replace(gate, weight=weight)
    x = _tokens(12, 16, seed=8)
    expected = Gate(weight.view(np.ndarray).astype(np.float32), gate.bias, score="sigmoid",
                    groups=4, topk_groups=2, topk=4)(x)  # fmt: skip
    _CountsConversions.conversions = 0
    for _ in range(3):
        got = gate16(x)
    assert _CountsConversions.conversions == 0
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.weights, expected.weights)


# ---------------------------------------------------------------------------------------
# The layer's reference


def _explicit_sum(moe: MoeMlp, x: np.ndarray, indices: np.ndarray, weights: np.ndarray):
    """Token by token, slot by slot: sum_k w[t,k] * expert[i[t,k]](x[t]) + shared(x[t])."""
    out = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[0]):
        row = x[t : t + 1].astype(np.float32)
        for k in range(indices.shape[1]):
            expert = moe.experts[int(indices[t, k])]
            out[t] += float(weights[t, k]) * expert.reference(row)[0]
        if moe.shared is not None:
            out[t] += moe.shared.reference(row)[0]
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_reference_is_the_weighted_sum_of_the_chosen_experts_plus_the_shared_one(shared):
    moe = MoeMlp.random(16, 24, 40, shared=shared, seed=9)
    gate = Gate.random(
        16,
        24,
        topk=4,
        score="sigmoid",
        groups=4,
        topk_groups=2,
        bias=True,
        route_scale=2.5,
        seed=10,
    )
    x = _tokens(10, 24, seed=11)
    indices, weights = gate(x)
    y = moe.reference(x, indices, weights)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, _explicit_sum(moe, x, indices, weights), rtol=1e-5, atol=1e-6)
    if shared:  # the shared expert is really in it
        without = MoeMlp(moe.experts).reference(x, indices, weights)
        np.testing.assert_allclose(y - without, moe.shared.reference(x), rtol=1e-4, atol=1e-5)


def test_experts_no_token_chose_take_no_part():
    moe = MoeMlp.random(8, 16, 24, seed=12)
    five = moe.experts[5]
    poisoned = SwiGluMlp(*(np.full_like(w, np.nan) for w in (five.w_gate, five.w_up, five.w_down)))
    experts = list(moe.experts)
    experts[5] = poisoned
    moe = MoeMlp(experts, moe.shared)
    x = _tokens(6, 16, seed=13)
    indices = np.array([[0, 1], [1, 0], [2, 7], [7, 2], [0, 7], [1, 2]], dtype=np.int64)
    weights = np.random.default_rng(14).uniform(0.1, 1.0, indices.shape).astype(np.float32)
    y = moe.reference(x, indices, weights)
    assert np.isfinite(y).all()  # expert 5 (all NaN) was never computed
    np.testing.assert_allclose(y, _explicit_sum(moe, x, indices, weights), rtol=1e-5, atol=1e-6)


def test_a_token_routed_to_one_expert_with_weight_one_gets_that_expert_alone():
    moe = MoeMlp.random(4, 16, 24, shared=False, seed=15)
    x = _tokens(4, 16, seed=16)
    indices = np.array([[3], [0], [3], [2]], dtype=np.int32)
    y = moe.reference(x, indices, np.ones((4, 1), dtype=np.float32))
    for t, e in enumerate(indices[:, 0]):
        np.testing.assert_array_equal(y[t], moe.experts[e].reference(x[t : t + 1])[0])


def test_float16_experts_accumulate_in_float32():
    moe = MoeMlp.random(8, 32, 48, dtype=np.float16, seed=17)
    assert moe.dtype == np.float16 and moe.n_experts == 8 and (moe.hidden, moe.ffn) == (32, 48)
    x = _tokens(12, 32, seed=18).astype(np.float16)
    indices, weights = Gate.random(8, 32, topk=3, seed=19)(x)
    y = moe.reference(x, indices, weights)
    assert y.dtype == np.float16
    want = _explicit_sum(moe, x, indices, weights)  # float16 weights read as float32
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-3, atol=2e-3)
    # float32 tokens through float16 experts come back float32, unrounded
    y32 = moe.reference(x.astype(np.float32), indices, weights)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, want, rtol=1e-5, atol=1e-6)


def test_moe_is_importable_where_models_import_it():
    assert duckpipe.MoeMlp is duckpipe.moe.MoeMlp is MoeMlp
    assert "MoeMlp" in duckpipe.__all__
    assert set(duckpipe.moe.__all__) >= {"Gate", "MoeMlp", "check_routing"}


# ---------------------------------------------------------------------------------------
# Errors: the routing check, the layer, the gate


def _routing(tokens: int = 3, topk: int = 2):
    x = np.zeros((tokens, 8), dtype=np.float32)
    indices = np.tile(np.arange(topk, dtype=np.int32), (tokens, 1))
    return x, indices, np.full((tokens, topk), 0.5, dtype=np.float32)


def test_a_valid_routing_passes():
    check_routing(*_routing(), n_experts=4)


@pytest.mark.parametrize("bad", [4, 300, -2])  # -1 is "no expert"
def test_an_expert_index_out_of_range_is_refused(bad):
    x, indices, weights = _routing()
    indices[1, 1] = bad
    with pytest.raises(
        BadInput, match=rf"token 1, choice 1 names expert {bad}; the layer has 4 \(0\.\.3\)"
    ):
        check_routing(x, indices, weights, 4)


def test_a_token_routed_twice_to_one_expert_is_refused():
    x, indices, weights = _routing()
    indices[2] = [1, 1]
    with pytest.raises(BadInput, match="token 2 names expert 1 twice"):
        check_routing(x, indices, weights, 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_weight_that_is_not_finite_is_refused(bad):
    x, indices, weights = _routing()
    weights[2, 0] = bad
    with pytest.raises(
        BadInput,
        match=r"token 2, choice 0 \(expert 0\) has weight bits 0x[0-9a-f]{8}: NaN or infinite",
    ):
        check_routing(x, indices, weights, 4)


def test_routing_that_does_not_match_the_tokens_is_refused():
    x, indices, weights = _routing(tokens=3)
    with pytest.raises(BadInput, match=r"indices have shape \(2, 2\) but x has 3 tokens"):
        check_routing(x, indices[:2], weights[:2], 4)
    with pytest.raises(BadInput, match=r"indices have shape \(6,\) but x has 3 tokens"):
        check_routing(x, indices.ravel(), weights.ravel(), 4)
    with pytest.raises(BadInput, match=r"weights have shape \(3, 1\) but indices have \(3, 2\)"):
        check_routing(x, indices, weights[:, :1], 4)
    with pytest.raises(BadInput, match=r"x must be a \[tokens, hidden\]"):
        check_routing(x[0], indices, weights, 4)


def test_routing_of_the_wrong_types_is_refused():
    x, indices, weights = _routing()
    with pytest.raises(BadInput, match="indices must be a numpy array of integers"):
        check_routing(x, indices.astype(np.float32), weights, 4)
    with pytest.raises(BadInput, match="indices must be a numpy array of integers"):
        check_routing(x, indices.tolist(), weights, 4)
    with pytest.raises(BadInput, match="weights must be a numpy array of floats"):
        check_routing(x, indices, weights.astype(np.int32), 4)
    with pytest.raises(BadInput, match="n_experts must be a positive integer"):
        check_routing(x, indices, weights, 0)


def test_the_reference_checks_its_routing_and_its_tokens():
    moe = MoeMlp.random(4, 8, 8, seed=20)
    x, indices, weights = _routing()
    moe.reference(x, indices, weights)
    weights[0, 1] = np.nan
    with pytest.raises(BadInput, match="must be finite"):
        moe.reference(x, indices, weights)
    with pytest.raises(BadInput, match="expert 4"):
        moe.reference(x, indices + 3, np.ones_like(weights))
    with pytest.raises(BadInput, match="x has hidden 6 but the layer's experts have 8"):
        moe.reference(x[:, :6], indices, np.ones_like(weights))


def test_experts_of_different_kinds_shapes_or_dtypes_are_refused():
    a = SwiGluMlp.random(8, 12, seed=1)
    with pytest.raises(BadInput, match="at least one expert"):
        MoeMlp([])
    with pytest.raises(BadInput, match="sequence of SwiGluMlp, got SwiGluMlp; wrap"):
        MoeMlp(a)
    with pytest.raises(BadInput, match="expert 1 is a GeluMlp; every expert must be a SwiGluMlp"):
        MoeMlp([a, GeluMlp.random(8, 12)])
    with pytest.raises(BadInput, match="expert 2 has hidden 8, ffn 16 but expert 0 has hidden 8"):
        MoeMlp([a, a, SwiGluMlp.random(8, 16)])
    with pytest.raises(BadInput, match="expert 1 holds float16 but expert 0 holds float32"):
        MoeMlp([a, SwiGluMlp.random(8, 12, dtype=np.float16)])
    with pytest.raises(BadInput, match="shared has hidden 10 but the experts have 8"):
        MoeMlp([a], SwiGluMlp.random(10, 12))
    with pytest.raises(BadInput, match="shared holds float16 but the experts hold float32"):
        MoeMlp([a], SwiGluMlp.random(8, 12, dtype=np.float16))
    with pytest.raises(BadInput, match="shared is a GeluMlp"):
        MoeMlp([a], GeluMlp.random(8, 12))
    # a shared expert wider than the routed ones is DeepSeek-V3's n_shared_experts > 1
    assert MoeMlp([a], SwiGluMlp.random(8, 24)).shared.ffn == 24


def test_gate_arguments_are_checked():
    w = np.zeros((16, 4), dtype=np.float32)
    ok = {"topk": 2}
    with pytest.raises(BadInput, match=r"score must be one of \('softmax', 'sigmoid'\)"):
        Gate(w, score="relu", **ok)
    with pytest.raises(BadInput, match="groups=3 does not divide the 16 experts"):
        Gate(w, groups=3, **ok)
    with pytest.raises(BadInput, match=r"topk_groups=5 exceeds Gate\.groups=4"):
        Gate(w, groups=4, topk_groups=5, **ok)
    with pytest.raises(BadInput, match="topk=9 exceeds the 8 experts of the 2 kept group"):
        Gate(w, groups=4, topk_groups=2, topk=9)
    with pytest.raises(BadInput, match="topk must be a positive integer"):
        Gate(w, topk=0)
    with pytest.raises(BadInput, match=r"bias must have shape \(16,\), one per expert"):
        Gate(w, np.zeros(8, np.float32), **ok)
    with pytest.raises(BadInput, match=r"two best experts.*1 expert per group"):
        Gate(w, np.zeros(16, np.float32), groups=16, topk_groups=2, **ok)
    with pytest.raises(BadInput, match=r"weight must be a \[n_experts, hidden\]"):
        Gate(np.zeros(16, np.float32), **ok)
    with pytest.raises(BadInput, match="route_scale must be a positive finite number"):
        Gate(w, route_scale=0.0, **ok)
    with pytest.raises(BadInput, match="route_scale must be a positive finite number"):
        Gate(w, route_scale=float("nan"), **ok)
    with pytest.raises(BadInput, match=r"takes x of shape \(tokens, 4\), got \(3, 5\)"):
        Gate(w, **ok)(np.zeros((3, 5), np.float32))
    with pytest.raises(TypeError):  # topk has no default: the caller says how many
        Gate(w)  # type: ignore[call-arg]
