"""One MLP layer of a DeepSeek-V3 checkpoint, as published on Hugging Face: ``from_checkpoint``.

A checkpoint folder holds ``config.json``, ``model.safetensors.index.json`` (tensor name
-> shard file) and the shards. Layer ``L``'s MLP is, by the names DeepSeek's own
conversion and Hugging Face's modeling code use:

- a dense layer (``L < first_k_dense_replace``): ``model.layers.L.mlp.{gate,up,down}_proj``;
- a MoE layer: ``model.layers.L.mlp.gate.weight`` (``[n_routed_experts, hidden]``) and
  ``.e_score_correction_bias`` (``topk_method = "noaux_tc"``), routed experts
  ``mlp.experts.E.{gate,up,down}_proj`` and the shared experts fused in
  ``mlp.shared_experts.{gate,up,down}_proj`` (``n_shared_experts * moe_intermediate_size``
  wide).

Each projection is a ``weight`` ``[out, in]`` (torch's Linear; duckpipe's MLPs hold the
transpose, a view here), in bf16, or in float8 e4m3 with a ``weight_scale_inv`` per
128 x 128 block (``quantization_config``), which stay FP8 (``SwiGluMlp.from_fp8``).

Nothing is read whole: tensors are views of the shards' memory maps (safetensors.py).
bf16 weights stay views (page cache, not process memory); FP8 ones are transposed into the
layout the ducks take by ``SwiGluMlp.from_fp8``, a copy of one layer at one byte a
weight, which goes when the caller drops the layer. Every surprise is a
:class:`CheckpointError` naming the file, and the tensor or config key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..progress import Progress
from .models import SwiGluMlp
from .moe import SCORES, Gate, MoeMlp
from .safetensors import CheckpointError, SafetensorsFile

__all__ = ["CheckpointError", "DeepSeekConfig", "from_checkpoint"]

BLOCK = 128  # DeepSeek-V3's FP8 weight_block_size, the only one its kernels take


class DeepSeekConfig:
    """What ``from_checkpoint`` reads of ``config.json``, each value checked against what
    duckpipe computes exactly as DeepSeek-V3 does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no config.json: is this a checkpoint folder?") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read it as JSON: {e}") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: not a JSON object")
        self.raw = raw
        self.hidden = self._int("hidden_size")
        self.layers = self._int("num_hidden_layers")
        self.first_dense = self._int("first_k_dense_replace", 0, minimum=0)
        self.moe_every = self._int("moe_layer_freq", 1)
        if self.moe_every != 1:
            self._refuse("moe_layer_freq", "every layer past first_k_dense_replace is MoE (1)")
        self.act = self.raw.get("hidden_act", "silu")
        if self.act != "silu":
            self._refuse("hidden_act", "SwiGLU experts: 'silu'")
        self.quant = self._quantization()

    def moe(self) -> dict[str, Any]:
        """The MoE keys, read when a MoE layer is asked for."""
        score = self.raw.get("scoring_func", "softmax")
        if score not in SCORES:
            self._refuse("scoring_func", f"one of {SCORES}")
        norm = self.raw.get("norm_topk_prob", False)
        topk = self._int("num_experts_per_tok")
        # Gate normalises the chosen weights of sigmoid scores and never softmax ones, as
        # DeepSeek-V3's inference code does: the other pairings are other models
        if topk > 1 and norm != (score == "sigmoid"):
            self._refuse(
                "norm_topk_prob",
                f"{score == 'sigmoid'} with scoring_func {score!r} (DeepSeek-V3: sigmoid, "
                "normalised; V2: softmax, not)",
            )
        method = self.raw.get("topk_method", "noaux_tc" if score == "sigmoid" else "greedy")
        if method not in ("noaux_tc", "greedy", "group_limited_greedy"):
            self._refuse("topk_method", "'noaux_tc', 'group_limited_greedy' or 'greedy'")
        return {
            "n_experts": self._int("n_routed_experts"),
            "shared": self._int("n_shared_experts", 0, minimum=0),
            "ffn": self._int("moe_intermediate_size"),
            "topk": topk,
            "groups": self._int("n_group", 1),
            "topk_groups": self._int("topk_group", 1),
            "route_scale": self._scale("routed_scaling_factor"),
            "score": score,
            "bias": method == "noaux_tc",
        }

    def _quantization(self) -> str | None:
        q = self.raw.get("quantization_config")
        if q is None:
            return None
        if not isinstance(q, dict) or q.get("quant_method") != "fp8":
            self._refuse("quantization_config.quant_method", "'fp8' (or no quantization_config)")
        if q.get("fmt", "e4m3") != "e4m3":
            self._refuse("quantization_config.fmt", "'e4m3'")
        if q.get("weight_block_size", [BLOCK, BLOCK]) != [BLOCK, BLOCK]:
            self._refuse("quantization_config.weight_block_size", f"[{BLOCK}, {BLOCK}]")
        scale = q.get("scale_fmt") or "float32"
        if scale not in ("float32", "ue8m0"):
            self._refuse("quantization_config.scale_fmt", "'ue8m0' or none (float32 scales)")
        return scale

    def _scale(self, key: str) -> float:
        # a number, as Gate takes it: float() of a string, a list or null would pass a
        # string or fail outside this rule, without naming config.json
        v = self.raw.get(key, 1.0)
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v < float("inf"):
            self._refuse(key, "a positive finite number")
        return float(v)

    def _int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        v = self.raw.get(key, default)
        if v is None:
            raise CheckpointError(f"{self.path}: no {key!r}, which this layer needs")
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            self._refuse(key, f"an integer >= {minimum}")
        return v

    def _refuse(self, key: str, wanted: str) -> None:
        value = self.raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        raise CheckpointError(
            f"{self.path}: {key} = {value!r} is not understood here: duckpipe takes {wanted}"
        )


class _Shards:
    """The index's tensor -> file map, with each file opened once, on first use."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        single = folder / "model.safetensors"
        if index.exists():
            try:
                self.where = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: no readable weight_map: {e!r}") from None
            if not isinstance(self.where, dict):
                raise CheckpointError(f"{index}: weight_map is not an object")
            self.index = index
        elif single.exists():
            self.where, self.index = None, single
        else:
            raise CheckpointError(
                f"{folder}: neither model.safetensors.index.json nor model.safetensors"
            )
        self.folder = folder
        self.files: dict[str, SafetensorsFile] = {}

    def file_of(self, name: str) -> SafetensorsFile:
        if self.where is None:
            file = "model.safetensors"
        else:
            file = self.where.get(name)
            if not isinstance(file, str):
                raise CheckpointError(f"{self.index}: no tensor {name!r} in its weight_map")
            if os.sep in file or file.startswith("."):
                raise CheckpointError(f"{self.index}: {name!r} is in {file!r}, outside the folder")
        f = self.files.get(file)
        if f is None:
            f = self.files[file] = SafetensorsFile(self.folder / file)
        return f

    def get(self, name: str, shape: tuple[int, ...], kinds: tuple[str, ...]) -> np.ndarray:
        """Tensor ``name``, checked to be ``shape`` and of a dtype kind in ``kinds``."""
        f = self.file_of(name)
        if name not in f.tensors:
            raise CheckpointError(f"{f.path}: no tensor {name!r} (the index puts it there)")
        t = f.tensor(name)
        if t.shape != shape:
            raise CheckpointError(f"{f.path}: tensor {name!r} has shape {t.shape}, not {shape}")
        if t.dtype.name not in kinds:
            raise CheckpointError(
                f"{f.path}: tensor {name!r} holds {t.dtype.name}, not one of {list(kinds)}"
            )
        return t

    def close(self) -> None:
        for f in self.files.values():
            f.close()


_FLOATS = ("bfloat16", "float16", "float32")


def _projection(
    shards: _Shards, prefix: str, out: int, inp: int, quant: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``prefix.weight`` ``[out, in]`` and its block scales (None unless FP8)."""
    if quant is None:
        return shards.get(f"{prefix}.weight", (out, inp), _FLOATS), None
    w = shards.get(f"{prefix}.weight", (out, inp), ("float8_e4m3fn", *_FLOATS))
    if w.dtype.name != "float8_e4m3fn":
        return w, None  # a tensor the quantization left in bf16 (the gate, say)
    blocks = (-(-out // BLOCK), -(-inp // BLOCK))
    kinds = ("float32",) if quant == "float32" else ("float8_e8m0fnu", "float32")
    return w, shards.get(f"{prefix}.weight_scale_inv", blocks, kinds)


def _swiglu(shards: _Shards, prefix: str, hidden: int, ffn: int, quant: str | None) -> SwiGluMlp:
    """A SwiGLU MLP from ``prefix.{gate,up,down}_proj``: FP8 stays FP8 with its scales."""
    gate, sg = _projection(shards, f"{prefix}.gate_proj", ffn, hidden, quant)
    up, su = _projection(shards, f"{prefix}.up_proj", ffn, hidden, quant)
    down, sd = _projection(shards, f"{prefix}.down_proj", hidden, ffn, quant)
    if sg is None and su is None and sd is None:
        return SwiGluMlp(w_gate=gate.T, w_up=up.T, w_down=down.T)
    if sg is None or su is None or sd is None:
        raise CheckpointError(
            f"{shards.index}: {prefix} mixes FP8 and unquantized projections (gate, up, "
            "down): an MLP is held in one weight dtype"
        )
    return SwiGluMlp.from_fp8(gate, up, down, sg, su, sd)


def from_checkpoint(
    folder: str | os.PathLike[str], layer: int, *, progress: bool | None = None
) -> tuple[Gate, MoeMlp] | SwiGluMlp:
    """Layer ``layer``'s MLP from a Hugging Face DeepSeek-V3 checkpoint folder: ``(Gate,
    MoeMlp)`` for a MoE layer, a ``SwiGluMlp`` for a dense one (the first
    ``first_k_dense_replace``). FP8 weights stay FP8 with their block scales. Read from
    the shards' memory maps (bf16 as views, FP8 transposed once): load the layer, drop
    it, take the next. A
    progress bar on stderr (a terminal's, or ``progress=True``) counts experts."""
    root = Path(folder)
    cfg = DeepSeekConfig(root / "config.json")
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < cfg.layers:
        raise CheckpointError(
            f"{root}: layer {layer!r} is not one of its {cfg.layers} (num_hidden_layers)"
        )
    shards = _Shards(root)
    try:
        return _layer(cfg, shards, layer, progress)
    finally:
        shards.close()  # the views taken keep their maps; nothing else does


def _layer(
    cfg: DeepSeekConfig, shards: _Shards, layer: int, progress: bool | None
) -> tuple[Gate, MoeMlp] | SwiGluMlp:
    prefix = f"model.layers.{layer}.mlp"
    if layer < cfg.first_dense:
        return _swiglu(shards, prefix, cfg.hidden, cfg._int("intermediate_size"), cfg.quant)
    m = cfg.moe()
    n, hidden = m["n_experts"], cfg.hidden
    weight = shards.get(f"{prefix}.gate.weight", (n, hidden), _FLOATS)
    bias = None
    if m["bias"]:
        bias = shards.get(f"{prefix}.gate.e_score_correction_bias", (n,), _FLOATS)
    gate = Gate(
        weight,
        bias,
        score=m["score"],
        groups=m["groups"],
        topk_groups=m["topk_groups"],
        topk=m["topk"],
        route_scale=m["route_scale"],
    )
    experts = []
    with Progress(n, f"layer {layer}", enabled=progress, unit="experts") as bar:
        for e in range(n):
            experts.append(_swiglu(shards, f"{prefix}.experts.{e}", hidden, m["ffn"], cfg.quant))
            bar.advance(1)
    shared = None
    if m["shared"]:
        width = m["shared"] * m["ffn"]
        shared = _swiglu(shards, f"{prefix}.shared_experts", hidden, width, cfg.quant)
    return gate, MoeMlp(experts=experts, shared=shared)
