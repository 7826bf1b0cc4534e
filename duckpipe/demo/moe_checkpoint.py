"""The MoE demo's layer as DeepSeek-V3 ships it: a checkpoint folder written once, cached.

``write(folder, hidden, seed)`` writes one DeepSeek-V3-shaped MoE layer in the Hugging
Face format ``duckpipe.moe.from_checkpoint`` reads: ``config.json`` (DeepSeek-V3's
routing keys and its FP8 ``quantization_config``), an index and safetensors shards; the
gate in bf16 with its float32 ``e_score_correction_bias``, every expert's projections in
float8 e4m3 with a float32 ``weight_scale_inv`` per 128 x 128 block, quantized as
DeepSeek's conversion does (a block's scale is its largest |w| / 448). The experts are
narrowed (moe_shape.py says why); everything the dataplane moves keeps V3's width.

``cached(root, hidden, seed)`` is the folder for those arguments under ``root``, written
the first time: a ``complete`` marker is written last, so an interrupted write is redone.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from ..client.moe import Gate
from ..client.safetensors import write as write_safetensors
from ..progress import Progress

__all__ = ["FORMAT", "cached", "folder_bytes", "write"]

#: bump when what ``write`` produces changes: an old cache is then written anew
FORMAT = 1
BLOCK = 128
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = 448.0
EXPERTS_PER_SHARD = 64


def _config(hidden: int, n_experts: int, ffn: int, shared_ffn: int, gate: Gate) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": hidden,
        "intermediate_size": 18432,
        "moe_intermediate_size": ffn,
        "num_hidden_layers": 1,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "n_routed_experts": n_experts,
        "n_shared_experts": shared_ffn // ffn,
        "num_experts_per_tok": gate.topk,
        "n_group": gate.groups,
        "topk_group": gate.topk_groups,
        "topk_method": "noaux_tc",
        "scoring_func": gate.score,
        "norm_topk_prob": True,
        "routed_scaling_factor": gate.route_scale,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` ``[out, in]`` float32 as e4m3 with a float32 scale per 128 x 128 block (the
    last block of a dimension partial): scale = the block's largest |w| / 448, so the
    block's values fill e4m3's range; what ``weight_dequant`` undoes."""
    out, inp = w.shape
    bo, bi = -(-out // BLOCK), -(-inp // BLOCK)
    padded = np.zeros((bo * BLOCK, bi * BLOCK), np.float32)
    padded[:out, :inp] = w
    blocks = padded.reshape(bo, BLOCK, bi, BLOCK)
    scale = np.abs(blocks).max(axis=(1, 3)) / E4M3_MAX
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = (blocks / scale[:, None, :, None]).reshape(padded.shape)[:out, :inp]
    return q.astype(E4M3), scale


def _swiglu(rng: np.random.Generator, prefix: str, hidden: int, ffn: int) -> dict:
    s1, s2 = 1 / math.sqrt(hidden), 1 / math.sqrt(ffn)
    out = {}
    for proj, shape, s in (("gate", (ffn, hidden), s1), ("up", (ffn, hidden), s1),
                           ("down", (hidden, ffn), s2)):  # fmt: skip
        w, scale = quantize(rng.standard_normal(shape, np.float32) * s)
        out[f"{prefix}.{proj}_proj.weight"] = w
        out[f"{prefix}.{proj}_proj.weight_scale_inv"] = scale
    return out


def write(
    folder: Path,
    *,
    hidden: int,
    ffn: int,
    shared_ffn: int,
    gate: Gate,
    seed: int,
    progress: Callable[[int], None] = lambda n: None,
) -> None:
    """Write the layer's checkpoint into ``folder`` (created); ``progress(n)`` after each
    expert (the shared one included)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 1])
    p = "model.layers.0.mlp"
    n = gate.n_experts
    weight_map: dict[str, str] = {}
    shards = -(-(n + 1) // EXPERTS_PER_SHARD)
    tensors = {
        f"{p}.gate.weight": gate.weight.astype(ml_dtypes.bfloat16),
        f"{p}.gate.e_score_correction_bias": np.asarray(gate.bias, np.float32),
    }
    for e in range(n + 1):
        if e < n:
            tensors.update(_swiglu(rng, f"{p}.experts.{e}", hidden, ffn))
        else:
            tensors.update(_swiglu(rng, f"{p}.shared_experts", hidden, shared_ffn))
        progress(1)
        if (e + 1) % EXPERTS_PER_SHARD == 0 or e == n:
            name = f"model-{len(set(weight_map.values())) + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(folder / name, tensors)
            weight_map.update(dict.fromkeys(tensors, name))
            tensors = {}
    index = {"metadata": {"total_size": folder_bytes(folder)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = _config(hidden, n, ffn, shared_ffn, gate)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def cached(
    root: Path,
    *,
    hidden: int,
    ffn: int,
    shared_ffn: int,
    gate: Gate,
    seed: int,
    say: Callable[[str], None],
    progress: Callable[[], Progress] | None = None,
) -> Path:
    """The checkpoint folder for these arguments under ``root``, written when it is not
    there whole yet; ``say`` tells where it is, its size, and how long writing took;
    ``progress()`` makes the bar a write advances once per expert."""
    folder = root / f"deepseek-v3-moe-shape-h{hidden}-f{ffn}-s{seed}-v{FORMAT}"
    done = folder / "complete"
    if done.exists():
        say(f"checkpoint: {folder} ({folder_bytes(folder) / 1e9:.2f} GB, cached)")
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # an interrupted write: start it over
    t0 = time.monotonic()
    with progress() if progress else contextlib.nullcontext() as bar:
        write(folder, hidden=hidden, ffn=ffn, shared_ffn=shared_ffn, gate=gate, seed=seed,
              progress=bar.advance if bar else lambda n: None)  # fmt: skip
    done.write_text("")
    say(
        f"checkpoint: wrote {folder} ({folder_bytes(folder) / 1e9:.2f} GB, FP8 experts with "
        f"128x128 block scales) in {time.monotonic() - t0:.1f} s; later runs read it from there"
    )
    return folder
