"""bfloat16 activations and weights (``ml_dtypes.bfloat16``, as JAX holds them), dense and
routed, through the mock and the C dataplane with emulated ducks.

What the ducks and the dataplane do with them (docs/architecture.md): a duck widens its
bfloat16 inputs and weights to float32 (exact), computes in float32 and sends its partial
in bfloat16, rounded to nearest even; the dataplane widens each partial again, sums them
in float32 and rounds the sum to bfloat16 once. ``_wire_reference`` does exactly that in
numpy; the ducks' float32 kernels differ from numpy's only in the order of their sums
(about 1e-6 relative), which can move a partial by one bfloat16 ulp where it sits near a
rounding boundary: hence a tolerance of a few ulps of the largest partial, not zero.
Against the float32 reference (MoeMlp.reference, rounded to bfloat16 once) the error is
bounded by one half-ulp (2**-9 relative) of each partial's magnitude plus one of the sum.
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import duckpipe
from duckpipe import DType, GeluMlp, SwiGluMlp
from duckpipe.client.models import BFLOAT16, duck_partial, shard_bounds
from duckpipe.errors import BadInput
from duckpipe.moe import Gate, MoeMlp

BF16 = ml_dtypes.bfloat16
HALF_ULP = 2.0**-9  # bfloat16 keeps 8 bits of significand (7 stored)
REPO = Path(__file__).resolve().parents[2]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def test_the_c_rounding_table_is_what_ml_dtypes_does():
    # dataplane/tests/test_reduce.c checks dp_f32_to_bf16 and every store (scalar, AVX2)
    # against this table; here the table is checked against the installed ml_dtypes
    text = (REPO / "dataplane/tests/test_reduce.c").read_text()
    body = text[text.index("bf16_table[] = {") :]
    body = body[: body.index("};")]
    pairs = [
        (int(f, 16), int(b, 16)) for f, b in re.findall(r"0x([0-9a-f]{8})u, 0x([0-9a-f]{4})", body)
    ]
    assert len(pairs) >= 25  # ties, subnormals, overflow to inf, infinities, NaNs
    f32 = np.array([f for f, _ in pairs], np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        got = _bits(f32.astype(BF16))
    want = np.array([b for _, b in pairs], np.uint16)
    bad = [
        (hex(f), hex(g), hex(w)) for (f, _), g, w in zip(pairs, got, want, strict=True) if g != w
    ]
    assert not bad, f"ml_dtypes rounds these otherwise than the C table: {bad}"


def test_bfloat16_is_a_dtype_of_the_abi():
    assert DType.BF16 == 3
    mlp = SwiGluMlp.random(16, 8, dtype=BF16, seed=1)
    assert mlp.dtype == BFLOAT16
    with pytest.raises(BadInput, match="bfloat16"):
        SwiGluMlp.random(16, 8, dtype=np.float64, seed=1)


def _wire_reference(mlp, x: np.ndarray, shard_sizes: list[int]) -> tuple[np.ndarray, float]:
    """The dense forward as the ducks and the dataplane compute it (module docstring), and
    the largest partial's magnitude."""
    acc = np.zeros(x.shape, np.float32)
    big = 0.0
    for lo, hi in shard_bounds(shard_sizes):
        p = duck_partial(mlp.kind, x, list(mlp.shard(lo, hi)))
        big = max(big, float(np.abs(p).max()))
        acc += p.astype(BF16).astype(np.float32)
    if mlp.b_down is not None:
        acc += mlp.b_down.astype(np.float32)
    return acc.astype(BF16), big


@pytest.mark.parametrize("degree", [1, 4, 24])
@pytest.mark.parametrize("kind", [GeluMlp, SwiGluMlp], ids=["gelu", "swiglu"])
def test_a_dense_forward_in_bfloat16_is_the_float32_sum_of_bfloat16_partials(client, kind, degree):
    mlp = kind.random(64, 96, dtype=BF16, seed=degree)
    layer = 700 + degree * 2 + (kind is SwiGluMlp)
    info = client.load_weights(layer, mlp, ducks=list(range(degree)))
    assert info.ready and DType(info.dtype) == DType.BF16
    rng = np.random.default_rng(degree)
    for rows in (1, 3, 16):
        x = rng.standard_normal((rows, mlp.hidden)).astype(BF16)
        y = client.forward(layer, x, timeout=30)
        assert y.dtype == BFLOAT16 and y.shape == x.shape
        wire, big = _wire_reference(mlp, x, info.shard_sizes)
        yf = y.astype(np.float32)
        np.testing.assert_allclose(yf, wire.astype(np.float32), rtol=2**-8, atol=4 * HALF_ULP * big)
        want = mlp.reference(x).astype(np.float32)  # float32, rounded to bfloat16 once
        np.testing.assert_allclose(yf, want, rtol=2**-8, atol=(degree + 2) * HALF_ULP * big)


def test_bfloat16_keeps_float32s_range_where_float16_would_overflow(client):
    # DeepSeek-V3's activations exceed 65,504 (float16's largest): bfloat16 carries them
    mlp = GeluMlp.random(32, 16, dtype=BF16, seed=9)  # SwiGLU's silu would overflow exp
    client.load_weights(760, mlp, ducks=[0, 1])
    x = (np.random.default_rng(9).standard_normal((4, 32)) * 3e5).astype(BF16)
    y = client.forward(760, x, timeout=30).astype(np.float32)
    want = mlp.reference(x).astype(np.float32)
    assert np.isfinite(y).all() and np.abs(want).max() > 65504
    np.testing.assert_allclose(y, want, rtol=2**-6, atol=4 * HALF_ULP * np.abs(want).max())


HIDDEN, N_EXPERTS, EFFN, TOPK = 64, 16, 32, 4


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "routed-only"])
def test_a_routed_forward_in_bfloat16_matches_the_float32_reference(client, shared):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=shared, dtype=BF16, seed=40 + shared)
    assert moe.dtype == BFLOAT16
    layer = 770 + shared
    client.load_weights(layer, moe, ducks=None if shared else list(range(8)))
    # the gate in bfloat16 too, as DeepSeek-V3's checkpoint holds it
    gate = Gate.random(N_EXPERTS, HIDDEN, topk=TOPK, score="sigmoid", dtype=BF16, seed=4)
    rng = np.random.default_rng(4)
    for tokens in (1, 8, 32):
        x = rng.standard_normal((tokens, HIDDEN)).astype(BF16)
        i, w = gate(x)
        y = client.forward(layer, x, routing=(i, w), timeout=30)
        want = moe.reference(x, i, w)
        assert y.dtype == want.dtype == BFLOAT16 and y.shape == x.shape
        # up to TOPK routed partials and the shared expert's, each rounded once, then the
        # sum rounded once: (TOPK + 2) half-ulps of the largest output
        big = float(np.abs(want.astype(np.float32)).max())
        np.testing.assert_allclose(
            y.astype(np.float32), want.astype(np.float32), rtol=0, atol=(TOPK + 2) * HALF_ULP * big
        )


def test_a_deepseek_v3_shaped_routed_forward_at_the_default_bounds_goes_as_the_unicast(client):
    # DeepSeek-V3's routed layer: 7168 wide, 256 experts, its grouped sigmoid gate (8
    # groups, 4 kept, top-8, a bias, route_scale 2.5), bfloat16; the experts 1 column wide
    # to keep the ducks' compute cheap, no shared expert (with one, auto broadcasts). 72
    # tokens are the most one forward takes with the default 1 MiB slots (docs/api.md).
    # The unicast, each routed duck its own rows, is a fraction of the broadcast; it once
    # went as the broadcast for want of a staging area. Now it goes as itself, from the
    # slot, nothing copied, and matches the reference.
    moe = MoeMlp.random(256, 7168, 1, shared=False, dtype=BF16, seed=28)
    client.load_weights(790, moe)
    gate = Gate.random(
        256, 7168, topk=8, score="sigmoid", groups=8, topk_groups=4, route_scale=2.5,
        bias=True, dtype=BF16, seed=28,
    )  # fmt: skip
    x = np.random.default_rng(28).standard_normal((72, 7168)).astype(BF16)
    i, w = gate(x)
    before = client.stats().counters
    y = client.forward(790, x, routing=(i, w), timeout=30)
    after = client.stats().counters
    want = moe.reference(x, i, w)
    assert y.dtype == want.dtype == BFLOAT16 and y.shape == x.shape
    big = float(np.abs(want.astype(np.float32)).max())
    np.testing.assert_allclose(
        y.astype(np.float32), want.astype(np.float32), rtol=0, atol=(8 + 2) * HALF_ULP * big
    )
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1
    assert after["moe_broadcasts"] == before["moe_broadcasts"]
    assert after["moe_copied_bytes"] == before["moe_copied_bytes"]


def test_a_bfloat16_activation_on_a_float16_layer_is_refused_naming_both(client):
    mlp = GeluMlp.random(16, 8, dtype=np.float16, seed=2)
    client.load_weights(780, mlp, ducks=[0])
    with pytest.raises(BadInput, match=r"holds float16 weights.*the activation is bfloat16"):
        client.forward(780, np.ones((1, 16), BF16))


def test_the_mock_rounds_each_partial_to_bfloat16_as_the_ducks_do(duckpipe_mock_factory):
    # the mock's ducks compute each partial exactly as _wire_reference does, so its result
    # is that, bit for bit; summing float32 partials (as the mock once did) is not
    mlp = SwiGluMlp.random(64, 96, dtype=BF16, seed=11)
    x = np.random.default_rng(11).standard_normal((16, 64)).astype(BF16)
    with duckpipe.connect(duckpipe_mock_factory(ducks=24).control) as c:
        info = c.load_weights(1, mlp, ducks=list(range(24)))
        y = c.forward(1, x)
    wire, _ = _wire_reference(mlp, x, info.shard_sizes)
    np.testing.assert_array_equal(_bits(y), _bits(wire))
