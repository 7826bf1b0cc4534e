"""A DeepSeek-V3 prefill: 4,096 tokens of 7168 bfloat16 (58.7 MB) routed top-8 over 256
experts in one call, with the default settings, on the mock and through the C dataplane
and emulated ducks (issue 28.6). The experts are 1 column wide so the ducks compute fast;
what is tested is the size: the defaults' max_forward_bytes (64 MiB), the reassembly past
4,096 datagrams (a duck's rows are ~27,000 at MTU 1500), the float32 sums of a bf16
forward that big, and ``forward`` of more rows than the client's slot takes."""

from __future__ import annotations

import numpy as np
import pytest

import duckpipe
from duckpipe import SwiGluMlp
from duckpipe.client.models import BFLOAT16
from duckpipe.errors import BadInput
from duckpipe.moe import Gate, MoeMlp

TOKENS, HIDDEN, EXPERTS, TOPK = 4096, 7168, 256, 8
DUCKS = 8
BF16 = BFLOAT16
# bf16 has 8 significant bits: half an ulp is 2**-8 of a value
HALF_ULP = 2.0**-8


@pytest.fixture(params=["mock", "real"])
def control(request, duckpipe_mock_factory) -> str:
    """A dataplane with every setting at its default: the mock, or the C dataplane with
    emulated ducks (the real one by name, so the conftest marks it ``dataplane``)."""
    if request.param == "mock":
        return duckpipe_mock_factory(ducks=DUCKS).control
    cluster = request.getfixturevalue("duckpipe_cluster_factory")(DUCKS)
    return cluster.control


@pytest.fixture(scope="module")
def prefill() -> tuple[MoeMlp, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The layer, the activation, its routing by DeepSeek-V3's gate, and the numpy MoE."""
    moe = MoeMlp.random(EXPERTS, HIDDEN, 1, shared=False, dtype=BF16, seed=286)
    gate = Gate.random(
        EXPERTS, HIDDEN, topk=TOPK, score="sigmoid", groups=8, topk_groups=4, route_scale=2.5,
        bias=True, dtype=BF16, seed=286,
    )  # fmt: skip
    x = np.random.default_rng(286).standard_normal((TOKENS, HIDDEN), np.float32).astype(BF16)
    i, w = gate(x)
    return moe, x, i, w, _deepseek_moe(moe, x, i, w)


def _deepseek_moe(moe: MoeMlp, x: np.ndarray, i: np.ndarray, w: np.ndarray) -> np.ndarray:
    """DeepSeek-V3 inference/model.py MoE.forward in numpy, float32 from bf16: each token's
    ``sum_k w[t, k] * w2(silu(w1(x_t)) * w3(x_t))`` over its experts ``i[t, k]``, written
    from the model, not from MoeMlp.reference. Every expert's hidden units are computed for
    every token at once (the experts' w1, w3 side by side), the units of the experts a token
    was not routed to weighted 0: one matmul each instead of a loop over 256 experts."""
    xf = x.astype(np.float32)
    e, f = len(moe.experts), moe.experts[0].w_gate.shape[1]
    w1 = np.concatenate([ex.w_gate for ex in moe.experts], axis=1).astype(np.float32)
    w3 = np.concatenate([ex.w_up for ex in moe.experts], axis=1).astype(np.float32)
    w2 = np.concatenate([ex.w_down for ex in moe.experts], axis=0).astype(np.float32)
    h = xf @ w1
    h = h / (1 + np.exp(-h)) * (xf @ w3)  # [tokens, experts * f]
    gate = np.zeros((x.shape[0], e), np.float32)
    rows = np.arange(x.shape[0])[:, None]
    routed = i >= 0
    np.add.at(gate, (np.broadcast_to(rows, i.shape)[routed], i[routed]), w[routed])
    return (h * np.repeat(gate, f, axis=1)) @ w2


def _check(y: np.ndarray, want: np.ndarray) -> None:
    assert y.dtype == BF16 and y.shape == want.shape
    # up to TOPK partials each rounded to bf16 once, then the sum rounded once
    big = float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=0, atol=(TOPK + 2) * HALF_ULP * big)


# the mock's 57 forwards in Python take ~5 s: slow, the C dataplane's run in CI
@pytest.mark.parametrize(
    "control", ["real", pytest.param("mock", marks=pytest.mark.slow)], indirect=True
)
def test_a_4096_token_bf16_prefill_goes_in_one_call_with_the_defaults(control, prefill):
    moe, x, i, w, want = prefill
    with duckpipe.connect(control) as c:
        c.load_weights(1, moe)
        before = c.stats().counters
        y = c.forward(1, x, routing=(i, w), timeout=60)
        after = c.stats().counters
    _check(y, want)
    # the default slot (1 MiB) holds 72 of these tokens: forward sent it as consecutive
    # forwards of the rows that fit, each a unicast, nothing broadcast
    sent = after["forwards_ok"] - before["forwards_ok"]
    assert TOKENS // 72 <= sent <= TOKENS // 64
    assert after["moe_broadcasts"] == before["moe_broadcasts"]


@pytest.mark.slow  # ~10 s through the C dataplane on a loaded CI machine
def test_a_4096_token_bf16_prefill_is_one_forward_in_a_slot_that_holds_it(control, prefill):
    moe, x, i, w, want = prefill
    # the dataplane at its defaults; the client with two slots of 60 MiB (activation and
    # routing table: 58,720,256 + 262,160 bytes) and a deadline for ~0.6 GB through 8
    # emulated ducks on loopback on a shared machine (the default, 1 s, is a layer's)
    with duckpipe.connect(control, slots=2, slot_size=60 << 20, forward_timeout=10) as c:
        c.load_weights(1, moe)
        before = c.stats().counters
        y = c.forward(1, x, routing=(i, w), timeout=60)
        after = c.stats().counters
    _check(y, want)
    assert after["forwards_ok"] - before["forwards_ok"] == 1
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1


@pytest.mark.parametrize("control", ["real"], indirect=True)  # the mock reassembles nothing
def test_a_bf16_forward_of_8_mib_is_reassembled_from_more_than_4096_datagrams(control):
    # 8 MiB of bf16 at MTU 1500: ~5,960 datagrams each way, past the old reassembly limit
    # (4,096), and 16 MiB of float32 sums, past what a context keeps (DP_SCRATCH_KEEP);
    # twice on one context's scratch: the second sums onto pages given back, read as zeros

    mlp = SwiGluMlp.random(4096, 2, dtype=BF16, seed=5)
    x = np.random.default_rng(5).standard_normal((1024, 4096), np.float32).astype(BF16)
    want = mlp.reference(x)
    with duckpipe.connect(control, slots=2, slot_size=8 << 20, forward_timeout=10) as c:
        c.load_weights(2, mlp, ducks=[0])
        before = c.stats().counters["forwards_ok"]
        for _ in range(2):
            y = c.forward(2, x, timeout=60)
            np.testing.assert_allclose(
                y.astype(np.float32), want.astype(np.float32), rtol=0,
                atol=3 * HALF_ULP * float(np.abs(want.astype(np.float32)).max()),
            )  # fmt: skip
        assert c.stats().counters["forwards_ok"] - before == 2  # each one forward


def test_more_tokens_than_one_routed_forward_takes_go_as_several(duckpipe_mock_factory):
    # MAX_TOKENS (4,096) bounds one routed forward (a wire row is a u16): submit refuses
    # 5,000 tokens that the slot holds; forward sends them as 4,096 and 904
    moe = MoeMlp.random(16, 64, 4, shared=False, dtype=np.float32, seed=7)
    gate = Gate.random(16, 64, topk=2, score="softmax", seed=7)
    x = np.random.default_rng(7).standard_normal((5000, 64), np.float32)
    i, w = gate(x)
    with duckpipe.connect(duckpipe_mock_factory(ducks=4).control, slot_size=4 << 20) as c:
        c.load_weights(3, moe)
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x
            with pytest.raises(BadInput, match=r"1\.\.4096 tokens, got 5000"):
                c.submit(slot, 3, routing=(i, w))
        before = c.stats().counters["forwards_ok"]
        y = c.forward(3, x, routing=(i, w), timeout=30)
        assert c.stats().counters["forwards_ok"] - before == 2
    np.testing.assert_allclose(y, _deepseek_moe(moe, x, i, w), rtol=2e-4, atol=2e-5)


def test_a_max_forward_bytes_past_65536_datagrams_is_refused_at_startup(
    duckpipe_cluster_factory,
):
    # what the ducks' reassembly bitmaps hold (DP_REASM_MAX_CHUNKS): 65,536 datagrams of
    # 1,392 bytes at MTU 1500, 91,226,112 bytes
    from duckpipe.errors import DuckpipeError

    with pytest.raises(DuckpipeError, match=r"needs 65537 chunks at mtu 1500 \(max 65536\)"):
        duckpipe_cluster_factory(1, max_forward_bytes=65536 * 1392 + 1)
    duckpipe_cluster_factory(1, max_forward_bytes=65536 * 1392).stop()


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS"))


def test_the_sums_of_a_big_bf16_forward_are_given_back_when_it_completes(
    duckpipe_cluster_factory,
):
    # a forward of 16 MiB of bf16 sums 32 MiB of float32 in its context's scratch; past
    # DP_SCRATCH_KEEP (2 MiB) that goes back as it completes: the dataplane's RSS is not
    # left 32 MiB higher by each context a big forward once used
    cl = duckpipe_cluster_factory(1)
    mlp = SwiGluMlp.random(4096, 1, dtype=BF16, seed=6)
    x = np.random.default_rng(6).standard_normal((2048, 4096), np.float32).astype(BF16)
    with duckpipe.connect(cl.control, slots=2, slot_size=16 << 20, forward_timeout=10) as c:
        c.load_weights(4, mlp)
        c.forward(4, x[:1], timeout=30)  # the pages a small forward touches, first
        before = _rss_mib(cl.dataplane.proc.pid)
        y = c.forward(4, x, timeout=60)
        grown = _rss_mib(cl.dataplane.proc.pid) - before
    assert y.shape == x.shape
    assert grown < 16, f"the dataplane kept {grown} MiB after a forward that summed 32 MiB"
