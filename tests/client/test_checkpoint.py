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


def _linear(rng, out: int, inp: int) -> np.ndarray:
    return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(BF16)


def _mlp(rng, prefix: str, ffn: int) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.gate_proj.weight": _linear(rng, ffn, HIDDEN),
        f"{prefix}.up_proj.weight": _linear(rng, ffn, HIDDEN),
        f"{prefix}.down_proj.weight": _linear(rng, HIDDEN, ffn),
    }


def _write_checkpoint(folder: Path, config: dict = CONFIG) -> dict[str, np.ndarray]:
    """Layer 0 dense, layers 1 and 2 MoE, two shards and their index; returns the tensors."""
    rng = np.random.default_rng(11)
    tensors = _mlp(rng, "model.layers.0.mlp", DENSE_FFN)
    for layer in (1, 2):
        p = f"model.layers.{layer}.mlp"
        tensors[f"{p}.gate.weight"] = _linear(rng, N_EXPERTS, HIDDEN)
        tensors[f"{p}.gate.e_score_correction_bias"] = (
            rng.standard_normal(N_EXPERTS) * 0.1
        ).astype(np.float32)
        for e in range(N_EXPERTS):
            tensors.update(_mlp(rng, f"{p}.experts.{e}", MOE_FFN))
        tensors.update(_mlp(rng, f"{p}.shared_experts", MOE_FFN))
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


def _expert(t: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    f = lambda n: t[f"{prefix}.{n}_proj.weight"].astype(np.float32)  # noqa: E731
    return (_silu(x @ f("gate").T) * (x @ f("up").T)) @ f("down").T


def _official_moe(t: dict, layer: int, x: np.ndarray, idx: np.ndarray, w: np.ndarray):
    p = f"model.layers.{layer}.mlp"
    xf = x.astype(np.float32)
    y = np.zeros_like(xf)
    for e in range(N_EXPERTS):
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
