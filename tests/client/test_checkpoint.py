"""from_checkpoint: a layer of a Hugging Face DeepSeek-V3 checkpoint, through the ducks.

The checkpoint is written here in exactly the published format (config.json, an index,
safetensors shards, torch's [out, in] weights, the names of DeepSeek's conversion), small.
The loaded layer's forward goes through the ducks (mock and C) and is compared with a
numpy rendering of DeepSeek-V3's MoE computed from the arrays as they were written, in
torch's layout: nothing of duckpipe's own layout or reference is trusted.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from duckpipe.client.safetensors import SafetensorsFile, write
from duckpipe.moe import CheckpointError, Gate, MoeMlp, from_checkpoint

BF16 = ml_dtypes.bfloat16
HIDDEN, MOE_FFN, DENSE_FFN, N_EXPERTS, TOPK = 64, 32, 96, 8, 2

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": HIDDEN,
    "intermediate_size": DENSE_FFN,
    "moe_intermediate_size": MOE_FFN,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": N_EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": TOPK,
    "n_group": 2,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
}


E4M3 = ml_dtypes.float8_e4m3fn
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _linear(rng, out: int, inp: int) -> np.ndarray:
    return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(BF16)


def _fp8_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w in e4m3 with a float32 scale per 128 x 128 block (the last ones partial), as
    DeepSeek's conversion quantizes: scale = the block's largest |w| / 448."""
    out, inp = w.shape
    s = np.ones((-(-out // 128), -(-inp // 128)), np.float32)
    q = np.empty(w.shape, E4M3)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            block = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].astype(np.float32)
            s[i, j] = max(float(np.abs(block).max()), 1e-12) / 448.0
            q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (block / s[i, j]).astype(E4M3)
    return q, s


def _mlp(rng, prefix: str, ffn: int, fp8: bool = False) -> dict[str, np.ndarray]:
    out = {}
    for proj, shape in (("gate", (ffn, HIDDEN)), ("up", (ffn, HIDDEN)), ("down", (HIDDEN, ffn))):
        w = _linear(rng, *shape)
        if fp8:
            out[f"{prefix}.{proj}_proj.weight"], out[f"{prefix}.{proj}_proj.weight_scale_inv"] = (
                _fp8_blocks(w)
            )
        else:
            out[f"{prefix}.{proj}_proj.weight"] = w
    return out


def _write_checkpoint(folder: Path, config: dict = CONFIG) -> dict[str, np.ndarray]:
    """Layer 0 dense, layers 1 and 2 MoE, two shards and their index; returns the tensors.
    With a quantization_config in config, every projection is FP8 with block scales (the
    gate stays bf16, as in DeepSeek-V3's checkpoint)."""
    rng = np.random.default_rng(11)
    fp8 = "quantization_config" in config
    tensors = _mlp(rng, "model.layers.0.mlp", DENSE_FFN, fp8)
    for layer in (1, 2):
        p = f"model.layers.{layer}.mlp"
        n = config.get("n_routed_experts") or N_EXPERTS
        tensors[f"{p}.gate.weight"] = _linear(rng, n, HIDDEN)
        tensors[f"{p}.gate.e_score_correction_bias"] = (rng.standard_normal(n) * 0.1).astype(
            np.float32
        )
        for e in range(n):
            tensors.update(_mlp(rng, f"{p}.experts.{e}", MOE_FFN, fp8))
        tensors.update(_mlp(rng, f"{p}.shared_experts", MOE_FFN, fp8))
    names = list(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, in_it in shards.items():
        write(folder / file, {n: tensors[n] for n in in_it})
    index = {"metadata": {}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("deepseek-v3-tiny")
    return folder, _write_checkpoint(folder)


# --- a numpy rendering of DeepSeek-V3's MoE, in torch's layout ------------------------------


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _weight_dequant(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """DeepSeek-V3's weight_dequant: each element times its 128 x 128 block's scale, in
    float32."""
    grid = np.repeat(np.repeat(s.astype(np.float32), 128, axis=0), 128, axis=1)
    return w.astype(np.float32) * grid[: w.shape[0], : w.shape[1]]


def _expert(t: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    def f(n: str) -> np.ndarray:
        w = t[f"{prefix}.{n}_proj.weight"]
        s = t.get(f"{prefix}.{n}_proj.weight_scale_inv")
        return w.astype(np.float32) if s is None else _weight_dequant(w, s)

    return (_silu(x @ f("gate").T) * (x @ f("up").T)) @ f("down").T


def _official_moe(t: dict, layer: int, x: np.ndarray, idx: np.ndarray, w: np.ndarray):
    p = f"model.layers.{layer}.mlp"
    xf = x.astype(np.float32)
    y = np.zeros_like(xf)
    for e in range(t[f"{p}.gate.weight"].shape[0]):
        rows, slots = np.nonzero(idx == e)
        if rows.size:
            y[rows] += _expert(t, f"{p}.experts.{e}", xf[rows]) * w[rows, slots, None]
    return y + _expert(t, f"{p}.shared_experts", xf)


# --- loading --------------------------------------------------------------------------------


def test_a_dense_layer_is_its_swiglu_in_duckpipes_layout(checkpoint):
    folder, t = checkpoint
    mlp = from_checkpoint(folder, 0)
    np.testing.assert_array_equal(mlp.w_gate, t["model.layers.0.mlp.gate_proj.weight"].T)
    np.testing.assert_array_equal(mlp.w_down, t["model.layers.0.mlp.down_proj.weight"].T)
    assert (mlp.hidden, mlp.ffn, mlp.dtype) == (HIDDEN, DENSE_FFN, np.dtype(BF16))


def test_a_moe_layer_gives_its_gate_as_configured_and_its_experts(checkpoint):
    folder, t = checkpoint
    gate, moe = from_checkpoint(folder, 2)
    assert isinstance(gate, Gate) and isinstance(moe, MoeMlp)
    assert (gate.score, gate.groups, gate.topk_groups, gate.topk) == ("sigmoid", 2, 1, TOPK)
    assert gate.route_scale == 2.5 and gate.n_experts == N_EXPERTS
    np.testing.assert_array_equal(gate.bias, t["model.layers.2.mlp.gate.e_score_correction_bias"])
    assert len(moe.experts) == N_EXPERTS and moe.shared is not None
    np.testing.assert_array_equal(
        moe.experts[5].w_up, t["model.layers.2.mlp.experts.5.up_proj.weight"].T
    )
    np.testing.assert_array_equal(
        moe.shared.w_down, t["model.layers.2.mlp.shared_experts.down_proj.weight"].T
    )


def test_the_tensors_are_views_of_the_files_not_copies(checkpoint):
    folder, _ = checkpoint
    _, moe = from_checkpoint(folder, 1)
    w = moe.experts[0].w_gate
    assert not w.flags.owndata and not w.flags.writeable  # the shard's read-only map


def test_the_loaded_layer_forwards_through_the_ducks_as_deepseek_v3_computes(checkpoint, client):
    folder, t = checkpoint
    gate, moe = from_checkpoint(folder, 1)
    client.load_weights(710, moe)
    x = np.random.default_rng(3).standard_normal((6, HIDDEN)).astype(BF16)
    idx, w = gate(x)
    y = client.forward(710, x, routing=(idx, w))
    want = _official_moe(t, 1, x, idx, w)
    # bf16 partials summed in float32, stored bf16: a few half-ulps of the largest value
    tol = 8 * 2.0**-8 * float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, atol=tol, rtol=0)
    client.unload_layer(710)


def _fp8_checkpoint(
    folder: Path, scale_fmt: str | None, n_experts: int = N_EXPERTS
) -> dict[str, np.ndarray]:
    """The tiny checkpoint with FP8 projections: V3's float32 scales, or V3.2's ue8m0
    (powers of two, stored as float8_e8m0fnu)."""
    quant = {**FP8, "scale_fmt": scale_fmt} if scale_fmt else FP8
    config = {**CONFIG, "quantization_config": quant, "n_routed_experts": n_experts}
    t = _write_checkpoint(folder, config)
    if scale_fmt == "ue8m0":
        for name in [n for n in t if n.endswith("weight_scale_inv")]:
            t[name] = np.exp2(np.ceil(np.log2(t[name]))).astype(ml_dtypes.float8_e8m0fnu)
        for shard in folder.glob("*.safetensors"):
            with SafetensorsFile(shard) as f:
                names = list(f.tensors)
            write(shard, {n: t[n] for n in names})
    return t


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"], ids=["v3-f32-scales", "v32-ue8m0"])
def test_an_fp8_moe_layer_stays_fp8_and_forwards_as_deepseek_v3_computes(
    tmp_path, client, scale_fmt
):
    t = _fp8_checkpoint(tmp_path, scale_fmt)
    gate, moe = from_checkpoint(tmp_path, 2)
    assert all(e.weight_dtype == np.dtype(E4M3) for e in moe.experts)
    layer = 711 + bool(scale_fmt)
    client.load_weights(layer, moe)  # the shared expert (one 128-block) on its default set
    x = np.random.default_rng(5).standard_normal((5, HIDDEN)).astype(BF16)
    idx, w = gate(x)
    y = client.forward(layer, x, routing=(idx, w))
    want = _official_moe(t, 2, x, idx, w)
    tol = 8 * 2.0**-8 * float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, atol=tol, rtol=0)
    client.unload_layer(layer)


@pytest.mark.parametrize("ducks", [8, 32])
@pytest.mark.parametrize("which", ["mock", "real"])
def test_bf16_through_fp8_experts_at_8_and_32_ducks(
    tmp_path, ducks, which, duckpipe_mock_factory, duckpipe_cluster_factory
):
    # issue 28's measure of done: a bf16 + FP8 forward through emulated ducks equals the
    # numpy rendering of DeepSeek-V3's code within bf16's tolerance, at 8 and 32 ducks
    import duckpipe

    t = _fp8_checkpoint(tmp_path, None, n_experts=64)  # two experts a duck at 32
    gate, moe = from_checkpoint(tmp_path, 1)
    dp = duckpipe_mock_factory(ducks=ducks) if which == "mock" else duckpipe_cluster_factory(ducks)
    with duckpipe.connect(dp.control, name="fp8-ducks") as c:
        c.load_weights(720, moe)
        x = np.random.default_rng(ducks).standard_normal((16, HIDDEN)).astype(BF16)
        idx, w = gate(x)
        y = c.forward(720, x, routing=(idx, w))
        placed = {d for info in c.layers() if info.layer == 720 for d in info.ducks}
    assert len(placed) == ducks  # the experts spread over every duck
    want = _official_moe(t, 1, x, idx, w)
    tol = 8 * 2.0**-8 * float(np.abs(want).max())
    np.testing.assert_allclose(y.astype(np.float32), want, atol=tol, rtol=0)


# --- what it refuses, and how it says it ----------------------------------------------------


def _variant(tmp_path: Path, **config) -> Path:
    _write_checkpoint(tmp_path, {**CONFIG, **config})
    return tmp_path


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("scoring_func", "tanh", r"scoring_func = 'tanh' is not understood"),
        ("hidden_act", "gelu", r"hidden_act = 'gelu' is not understood.*'silu'"),
        ("norm_topk_prob", False, r"norm_topk_prob = False is not understood"),
        ("topk_method", "dense", r"topk_method = 'dense'"),
        ("moe_layer_freq", 2, r"moe_layer_freq = 2"),
        (
            "quantization_config",
            {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]},
            r"weight_block_size = \[64, 64\] is not understood.*\[128, 128\]",
        ),
        ("quantization_config", {"quant_method": "awq"}, r"quant_method = 'awq'"),
        ("n_routed_experts", None, r"no 'n_routed_experts'"),
        ("routed_scaling_factor", "2.5", r"routed_scaling_factor = '2\.5'.*finite number"),
        ("routed_scaling_factor", [2.5], r"routed_scaling_factor = \[2\.5\]"),
        ("routed_scaling_factor", float("nan"), r"routed_scaling_factor = nan"),
        (
            "quantization_config",
            {"quant_method": "fp8", "weight_block_size": 128},
            r"weight_block_size = 128 is not understood",
        ),
    ],
)
def test_a_config_it_does_not_understand_is_named(tmp_path, key, value, words):
    folder = _variant(tmp_path, **{key: value})
    if value is None:
        cfg = json.loads((folder / "config.json").read_text())
        del cfg[key]
        (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config\.json: .*{words}"):
        from_checkpoint(folder, 1)


def _rewrite_shard(folder: Path, name: str, value: np.ndarray | None) -> str:
    """Replace (or, with None, drop) one tensor in the shard the index puts it in."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    file = index["weight_map"][name]
    with SafetensorsFile(folder / file) as f:
        tensors = {n: np.array(f.tensor(n)) for n in f.tensors}
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    write(folder / file, tensors)
    return file


def test_a_missing_tensor_names_its_file_and_name(tmp_path):
    folder = _variant(tmp_path)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    file = _rewrite_shard(folder, name, None)
    with pytest.raises(CheckpointError, match=rf"{file}: no tensor '{name}'"):
        from_checkpoint(folder, 1)


def test_a_tensor_of_the_wrong_shape_or_dtype_is_named(tmp_path):
    folder = _variant(tmp_path)
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    _rewrite_shard(folder, name, np.zeros((MOE_FFN, HIDDEN + 1), BF16))
    with pytest.raises(CheckpointError, match=rf"'{name}' has shape \(32, 65\), not \(32, 64\)"):
        from_checkpoint(folder, 1)
    _rewrite_shard(folder, name, np.zeros((MOE_FFN, HIDDEN), np.int32))
    with pytest.raises(CheckpointError, match=rf"'{name}' holds int32, not one of"):
        from_checkpoint(folder, 1)


def test_a_layer_past_the_model_and_a_folder_without_a_checkpoint(tmp_path, checkpoint):
    folder, _ = checkpoint
    with pytest.raises(CheckpointError, match="layer 3 is not one of its 3"):
        from_checkpoint(folder, 3)
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        from_checkpoint(tmp_path, 1)


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda raw: raw[:4], "4 bytes: not a safetensors file"),
        (lambda raw: (10**9).to_bytes(8, "little") + raw[8:], "header length 1000000000"),
        (lambda raw: raw[:8] + b"x" + raw[9:], "the header is not JSON"),
        (lambda raw: raw[:-1], "tensor '.*': data_offsets .* outside the file's"),
    ],
)
def test_a_damaged_shard_is_named(tmp_path, damage, words):
    folder = _variant(tmp_path)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(CheckpointError, match=rf"{shard.name}: {words}"):
        from_checkpoint(folder, 1)


def _raw_shard(path: Path, header: dict, data: bytes = b"") -> None:
    """A safetensors file with exactly this header (write() makes only sound ones)."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize(
    "shape, dtype",
    [([0, 2**62], "F32"), ([0, 2**63], "U8"), ([1] * 65, "U8")],
)
def test_a_shape_no_array_can_have_is_named(tmp_path, shape, dtype):
    # an empty tensor's other sizes pass the byte count (0 bytes), and one of 65 sizes
    # of 1 holds one byte: numpy cannot make either, which was a bare ValueError
    path = tmp_path / "x.safetensors"
    nbytes = 1 if 0 not in shape else 0
    _raw_shard(
        path, {"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}, b"\0" * nbytes
    )
    with pytest.raises(CheckpointError, match=r"x\.safetensors: tensor 't': shape of"):
        SafetensorsFile(path).tensor("t")


def test_an_index_naming_a_file_with_a_nul_is_named(tmp_path):
    folder = _variant(tmp_path)
    index = folder / "model.safetensors.index.json"
    raw = json.loads(index.read_text())
    name = "model.layers.1.mlp.gate.weight"
    raw["weight_map"][name] = "model\u0000.safetensors"
    index.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="cannot open it"):
        from_checkpoint(folder, 1)


def test_tensors_on_the_same_bytes_are_named(tmp_path):
    # a damaged header that puts two weights on one range would give both the same values
    path = tmp_path / "x.safetensors"
    header = {
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
        "e": {"dtype": "U8", "shape": [0], "data_offsets": [3, 3]},
    }
    _raw_shard(path, header, bytes(8))
    with pytest.raises(CheckpointError, match=r"x\.safetensors: tensors 'a' and 'b' overlap"):
        SafetensorsFile(path)
    header["b"]["data_offsets"] = [4, 8]
    _raw_shard(path, header, bytes(8))
    assert SafetensorsFile(path).tensor("b").shape == (4,)
