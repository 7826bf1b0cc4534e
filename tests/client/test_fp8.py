"""FP8 weights as DeepSeek-V3 ships them (issue 28.3), through the mock and the C dataplane
with emulated ducks: float8 e4m3 weights, a scale per 128x128 block (float32, V3's
``weight_scale_inv``; or ue8m0 powers of two, V3.2's), the checkpoint's [out, in] layout.

The reference here is written from the official code, not from duckpipe's:
DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant`` gives y[i, j] = float32(w[i, j]) *
s[i // 128, j // 128] with s of shape [ceil(M/128), ceil(N/128)] (a partial last block has
its own scale); ``model.py``'s MLP is w2(silu(w1(x)) * w3(x)), a Linear being x @ W.T.
Every block gets its own scale, a factor of 2 to 2^10 apart, so a weight dequantized with
a neighbour's scale (a cut that splits a block, a partial block read as a full one) is
off by at least 2x: far outside the tolerance, which only absorbs float32 summation
order (the ducks' kernels and the host's reduce sum in another order than numpy).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import duckpipe
from duckpipe import SwiGluMlp
from duckpipe._abi import rules
from duckpipe.errors import BadInput, DuckpipeError
from duckpipe.moe import MoeMlp
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import DType, MlpKind

E4M3 = ml_dtypes.float8_e4m3fn
UE8M0 = ml_dtypes.float8_e8m0fnu
BLOCK = 128


# --- the official rules, in numpy ---------------------------------------------------


def official_weight_dequant(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """kernel.py weight_dequant: each BLOCK x BLOCK tile of w (float32) times its scale."""
    m, n = w.shape
    assert s.shape == (-(-m // BLOCK), -(-n // BLOCK))
    s = s.astype(np.float32)  # ue8m0: 2^(e-127), exact
    y = np.empty((m, n), np.float32)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            rows, cols = slice(bi * BLOCK, (bi + 1) * BLOCK), slice(bj * BLOCK, (bj + 1) * BLOCK)
            y[rows, cols] = w[rows, cols].astype(np.float32) * s[bi, bj]
    return y


def official_mlp(x: np.ndarray, ckpt: dict) -> np.ndarray:
    """model.py MLP: w2(silu(w1(x)) * w3(x)), F.linear(x, W) = x @ W.T, in float32."""
    w1 = official_weight_dequant(ckpt["w1"], ckpt["s1"])
    w2 = official_weight_dequant(ckpt["w2"], ckpt["s2"])
    w3 = official_weight_dequant(ckpt["w3"], ckpt["s3"])
    xf = x.astype(np.float32)
    g = xf @ w1.T
    return ((g / (1 + np.exp(-g))) * (xf @ w3.T)) @ w2.T


def checkpoint(dim: int, inter: int, seed: int, ue8m0: bool = False) -> dict:
    """One expert as the checkpoint holds it: w1, w3 [inter, dim], w2 [dim, inter] e4m3,
    each with its scale grid [ceil(out/128), ceil(in/128)], every block's scale its own."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in (("1", (inter, dim)), ("3", (inter, dim)), ("2", (dim, inter))):
        w = np.clip(rng.standard_normal(shape) * 64, -448, 448).astype(E4M3)
        grid = (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))
        exps = rng.permutation(np.arange(-20, -10))[: grid[0] * grid[1]]
        exps = np.resize(exps, grid[0] * grid[1]).reshape(grid)  # 2 to 2^10 apart
        if ue8m0:
            s = np.exp2(exps).astype(UE8M0)
        else:  # V3's float32 scales are not powers of two
            s = (np.exp2(exps) * rng.uniform(1, 1.9, grid)).astype(np.float32)
        out["w" + name], out["s" + name] = w, s
    return out


def mlp_of(ckpt: dict, act_dtype=np.float32) -> SwiGluMlp:
    c = ckpt
    return SwiGluMlp.from_fp8(
        c["w1"], c["w3"], c["w2"], c["s1"], c["s3"], c["s2"], act_dtype=act_dtype
    )


def _close(y: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> None:
    big = float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=rtol, atol=rtol * big)


# --- the model on the host ----------------------------------------------------------


@pytest.mark.parametrize("ue8m0", [False, True], ids=["v3-f32", "v32-ue8m0"])
@pytest.mark.parametrize("dim,inter", [(256, 384), (200, 136)], ids=["x128", "partial"])
def test_from_fp8_reference_is_the_official_dequant_and_mlp(dim, inter, ue8m0):
    ckpt = checkpoint(dim, inter, seed=dim + inter, ue8m0=ue8m0)
    mlp = mlp_of(ckpt)
    assert mlp.is_fp8 and mlp.weight_dtype == np.dtype(E4M3) and mlp.dtype == np.float32
    # held as x @ w wants: the checkpoint's [out, in] transposed, scales with them
    assert mlp.w_gate.shape == (dim, inter) and mlp.s_gate.shape == (
        -(-dim // 128),
        -(-inter // 128),
    )
    assert mlp.w_down.shape == (inter, dim) and mlp.s_down.dtype == np.float32
    x = np.random.default_rng(1).standard_normal((5, dim)).astype(np.float32)
    _close(mlp.reference(x), official_mlp(x, ckpt), rtol=1e-5)


def test_from_fp8_refuses_a_scale_grid_of_the_wrong_shape_and_non_fp8_weights():
    c = checkpoint(200, 136, seed=3)
    with pytest.raises(BadInput, match=r"scale grid must be \(2, 2\).*got \(1, 1\)"):
        SwiGluMlp.from_fp8(c["w1"], c["w3"], c["w2"], c["s1"][:1, :1], c["s3"], c["s2"])
    with pytest.raises(BadInput, match="float8_e4m3fn"):
        SwiGluMlp.from_fp8(c["w1"].astype(np.float32), c["w3"], c["w2"], c["s1"], c["s3"], c["s2"])
    with pytest.raises(BadInput, match=r"float32.*float8_e8m0fnu"):
        SwiGluMlp.from_fp8(c["w1"], c["w3"], c["w2"], c["s1"].astype(np.float16), c["s3"], c["s2"])


# --- the plan: bytes on the wire and in the banks ------------------------------------


def _plan_bytes(weight_dtype: int, dtype: DType, hidden: int, effn: int) -> int:
    """What a one-expert MOE layer on one duck weighs (dp_load_plan_bytes), its MoE state
    taken out: the expert's bank bytes."""
    msg = ctl.LoadWeights(
        req_id=1,
        layer=1,
        kind=int(MlpKind.MOE),
        dtype=int(dtype),
        hidden=hidden,
        ffn=effn,
        ducks=[0],
        shard_sizes=[effn],
        expert_ffn=effn,
        expert_replicas=[1],
        expert_ducks=[0],
        weight_dtype=weight_dtype,
    )
    req = rules.load_request(msg)
    return rules.plan_bytes(req) - rules.state_bytes(req)


@pytest.mark.parametrize("hidden,effn", [(7168, 2048), (200, 136)], ids=["v3", "partial"])
def test_an_fp8_expert_bank_is_half_the_bytes_of_float16(hidden, effn):
    f16 = _plan_bytes(0, DType.F16, hidden, effn)
    fp8 = _plan_bytes(int(DType.F8E4M3), DType.BF16, hidden, effn)
    assert f16 == 3 * hidden * effn * 2
    hb, cb = -(-hidden // 128), -(-effn // 128)
    assert fp8 == 3 * (hidden * effn + 4 * hb * cb)  # e4m3 bytes, then float32 scales
    if hidden == 7168:  # DeepSeek-V3's expert: the scales add 0.02%
        assert 0.5 < fp8 / f16 < 0.5003


_FIELDS = dict(
    req_id=1,
    layer=1,
    dtype=int(DType.BF16),
    hidden=200,
    ducks=[0, 1],
    weight_dtype=int(DType.F8E4M3),
)


def test_the_dataplane_rules_refuse_an_fp8_cut_inside_a_block_and_fp8_gelu():
    def refusal(**kw):
        fields = dict(
            req_id=1,
            layer=1,
            kind=int(MlpKind.SWIGLU),
            dtype=int(DType.BF16),
            hidden=200,
            ffn=300,
            ducks=[0, 1],
            shard_sizes=[150, 150],
            weight_dtype=int(DType.F8E4M3),
        )
        fields.update(kw)
        req = rules.load_request(ctl.LoadWeights(**fields))
        return rules.load_refusal(
            req, max_hidden=1 << 20, max_ffn=1 << 20, topology=rules.topology(4)
        )

    assert "cut between 128-column blocks" in str(refusal())
    assert refusal(shard_sizes=[256, 44]) is None  # whole blocks, the last one partial
    assert "SWIGLU and MOE only" in str(refusal(kind=int(MlpKind.GELU), shard_sizes=[256, 44]))
    assert "weight_dtype 2" in str(refusal(weight_dtype=2, shard_sizes=[256, 44]))
    # MOE: each duck one expert of 136 columns, and shared-expert columns: duck 0's 100
    # are not a whole block; 128 on duck 0 and the last 100 on duck 1 are
    moe = {
        "kind": int(MlpKind.MOE),
        "ffn": 136 + 100 + 136 + 128,
        "expert_ffn": 136,
        "expert_replicas": [1, 1],
        "expert_ducks": [0, 1],
        "shared_ducks": [0, 1],
    }
    req = rules.load_request(ctl.LoadWeights(**{**_FIELDS, **moe, "shard_sizes": [236, 264]}))
    _, why = rules.moe_plan(req)
    assert "shared expert is cut between 128-column blocks" in str(why)
    req = rules.load_request(ctl.LoadWeights(**{**_FIELDS, **moe, "shard_sizes": [264, 236]}))
    assert rules.moe_plan(req)[1] is None
    # the shared expert on duck 0 alone: the last duck of its set holds the partial block
    one = {**moe, "ffn": 136 + 100 + 136, "shared_ducks": [0], "shard_sizes": [236, 136]}
    assert rules.moe_plan(rules.load_request(ctl.LoadWeights(**{**_FIELDS, **one})))[1] is None


def test_a_nan_scale_is_refused():
    c = checkpoint(200, 136, seed=4, ue8m0=True)
    s1 = c["s1"].copy()
    s1.view(np.uint8)[0, 0] = 0xFF  # ue8m0's NaN
    with pytest.raises(BadInput, match="NaN"):
        SwiGluMlp.from_fp8(c["w1"], c["w3"], c["w2"], s1, c["s3"], c["s2"])


# --- forwards through the mock and the C dataplane -----------------------------------


@pytest.mark.parametrize("ue8m0", [False, True], ids=["v3-f32", "v32-ue8m0"])
@pytest.mark.parametrize(
    "dim,inter,ducks", [(256, 384, 3), (200, 136, 2), (200, 300, 3)], ids=["x128", "partial", "cut"]
)
def test_a_dense_fp8_swiglu_forward_matches_the_official_mlp(client, dim, inter, ducks, ue8m0):
    ckpt = checkpoint(dim, inter, seed=inter + ducks, ue8m0=ue8m0)
    layer = 800 + inter + ducks + ue8m0
    info = client.load_weights(layer, mlp_of(ckpt), ducks=list(range(ducks)))
    # cut between whole 128-blocks, the last duck's ending in the partial one
    sizes = info.shard_sizes
    assert info.ready and sum(sizes) == inter and all(f % 128 == 0 for f in sizes[:-1])
    x = np.random.default_rng(ducks).standard_normal((7, dim)).astype(np.float32)
    _close(client.forward(layer, x, timeout=30), official_mlp(x, ckpt))


@pytest.mark.parametrize("ue8m0", [False, True], ids=["v3-f32", "v32-ue8m0"])
@pytest.mark.parametrize("dim,effn", [(256, 128), (200, 136)], ids=["x128", "partial"])
def test_a_routed_fp8_forward_matches_the_official_moe(client, dim, effn, ue8m0):
    n_experts, topk, shared_ffn = 8, 3, 3 * effn
    ckpts = [checkpoint(dim, effn, seed=10 + e, ue8m0=ue8m0) for e in range(n_experts)]
    shared_ckpt = checkpoint(dim, shared_ffn, seed=99, ue8m0=ue8m0)
    moe = MoeMlp(experts=[mlp_of(c) for c in ckpts], shared=mlp_of(shared_ckpt))
    layer = 900 + effn + ue8m0
    client.load_weights(layer, moe, ducks=[0, 1, 2])  # 3 ducks: the shared expert cut 3 ways
    rng = np.random.default_rng(effn)
    tokens = 9
    x = rng.standard_normal((tokens, dim)).astype(np.float32)
    idx = np.stack([rng.permutation(n_experts)[:topk] for _ in range(tokens)]).astype(np.int32)
    wts = rng.uniform(0.1, 1, (tokens, topk)).astype(np.float32)
    # DeepSeek-V3's MoE: sum of weight * expert(x) over the routed experts, plus shared(x)
    want = official_mlp(x, shared_ckpt)
    for t in range(tokens):
        for k in range(topk):
            want[t] += wts[t, k] * official_mlp(x[t : t + 1], ckpts[idx[t, k]])[0]
    _close(client.forward(layer, x, routing=(idx, wts), timeout=30), want)


def test_a_routed_fp8_forward_on_two_shared_expert_sets_matches_the_official_moe(client):
    # the shared expert whole on duck 0, and again cut over ducks 1 and 2 (a partial
    # 128-block on the last of each set); forwards take turns on the sets
    dim, effn, n_experts, topk = 200, 136, 8, 3
    ckpts = [checkpoint(dim, effn, seed=30 + e) for e in range(n_experts)]
    shared_ckpt = checkpoint(dim, 3 * effn, seed=98)
    moe = MoeMlp(
        experts=[mlp_of(c) for c in ckpts], shared=mlp_of(shared_ckpt), shared_ducks=[[0], [1, 2]]
    )
    client.load_weights(930, moe, ducks=[0, 1, 2])
    rng = np.random.default_rng(930)
    x = rng.standard_normal((5, dim)).astype(np.float32)
    idx = np.stack([rng.permutation(n_experts)[:topk] for _ in range(5)]).astype(np.int32)
    wts = rng.uniform(0.1, 1, (5, topk)).astype(np.float32)
    want = official_mlp(x, shared_ckpt)
    for t in range(5):
        for k in range(topk):
            want[t] += wts[t, k] * official_mlp(x[t : t + 1], ckpts[idx[t, k]])[0]
    for _ in range(2):
        _close(client.forward(930, x, routing=(idx, wts), timeout=30), want)


def test_bfloat16_activations_on_fp8_weights(client):
    ckpt = checkpoint(200, 136, seed=5)
    mlp = mlp_of(ckpt, act_dtype=ml_dtypes.bfloat16)
    client.load_weights(990, mlp, ducks=[0, 1])
    x = np.random.default_rng(5).standard_normal((4, 200)).astype(ml_dtypes.bfloat16)
    y = client.forward(990, x, timeout=30)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16)
    # two partials and their sum each rounded to bfloat16 once: 3 half-ulps of the largest
    want = official_mlp(x, ckpt)
    big = float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=0, atol=3 * 2.0**-9 * big)


def test_an_fp8_tensor_longer_than_its_bytes_and_scales_is_refused(
    duckpipe_mock_factory, monkeypatch
):
    # the chunk check holds an FP8 tensor to its e4m3 bytes plus its scales: a chunk past
    # them (a client that sized the tensor otherwise) is refused, naming it
    from duckpipe.client import weights

    mlp = mlp_of(checkpoint(200, 136, seed=6))
    real = weights._fp8_bytes
    with duckpipe.connect(duckpipe_mock_factory(ducks=2).control) as c:
        c.load_weights(1, mlp, ducks=[0])
        monkeypatch.setattr(
            weights, "_fp8_bytes", lambda w, s: np.concatenate([real(w, s), np.zeros(8, np.uint8)])
        )
        with pytest.raises(DuckpipeError, match=r"tensor 0 .* is not in layer 2"):
            c.load_weights(2, mlp, ducks=[0])


@pytest.mark.parametrize("ue8m0", [False, True], ids=["v3-f32", "v32-ue8m0"])
def test_an_fp8_checkpoint_layer_loads_through_from_checkpoint_and_stays_fp8(
    client, tmp_path, ue8m0
):
    # the published format: torch's [out, in] e4m3 weights with their weight_scale_inv, a
    # quantization_config saying so; from_checkpoint hands them to SwiGluMlp.from_fp8
    from duckpipe.client.safetensors import write
    from duckpipe.moe import from_checkpoint

    dim, inter = 200, 300
    ckpt = checkpoint(dim, inter, seed=21, ue8m0=ue8m0)
    p = "model.layers.0.mlp"
    tensors = {}
    for proj, k in (("gate", "1"), ("up", "3"), ("down", "2")):
        tensors[f"{p}.{proj}_proj.weight"] = ckpt["w" + k]
        tensors[f"{p}.{proj}_proj.weight_scale_inv"] = ckpt["s" + k]
    write(tmp_path / "model.safetensors", tensors)
    index = {"metadata": {}, "weight_map": dict.fromkeys(tensors, "model.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    if ue8m0:
        quant["scale_fmt"] = "ue8m0"
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": dim,
        "intermediate_size": inter,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "hidden_act": "silu",
        "quantization_config": quant,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    mlp = from_checkpoint(tmp_path, 0)
    assert isinstance(mlp, SwiGluMlp) and mlp.weight_dtype == np.dtype(E4M3)
    layer = 995 + ue8m0
    client.load_weights(layer, mlp, ducks=[0, 1, 2])
    x = np.random.default_rng(21).standard_normal((3, dim)).astype(ml_dtypes.bfloat16)
    y = client.forward(layer, x, timeout=30)
    want = official_mlp(x, ckpt)  # three bfloat16 partials and the sum, each rounded once
    big = float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=0, atol=4 * 2.0**-9 * big)
