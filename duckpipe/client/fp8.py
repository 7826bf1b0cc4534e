"""FP8 weights as DeepSeek-V3 ships them: float8 e4m3 with a scale per 128x128 block.

The official rule (DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``, ``model.py``):
a Linear weight is ``[out_features, in_features]`` float8_e4m3fn with ``scale``
(checkpoint name ``weight_scale_inv``) of shape ``[ceil(out/128), ceil(in/128)]``
float32, and

    y[i, j] = float32(w[i, j]) * s[i // 128, j // 128]

one float32 multiplication per weight. A dimension that is not a multiple of 128 ends
in a partial block with its own scale entry (that is what the ceil gives). V3.2's ue8m0
scales are powers of two, stored as float8_e8m0fnu (value 2^(e-127)); they widen to
float32 exactly, so both kinds reach the ducks as float32 scales.

Layout here. duckpipe's MLPs compute ``x @ w``: a weight is ``[in, out]``, the
transpose of torch's Linear. An FP8 weight is held the same way, ``[in, out]``, and its
scales as ``[ceil(in/128), ceil(out/128)]``: the transpose of the checkpoint's scale
grid. Transposing both commutes with the rule above, so nothing is rounded twice.
``SwiGluMlp.from_fp8`` takes the checkpoint's own ``[out, in]`` tensors and transposes.

Sharding. A dense layer (and the shared expert) is cut over ducks by FFN columns; an FP8
layer is cut only at multiples of 128 (``block_shard_sizes``), so every duck holds whole
128-blocks and the scale rows/columns of exactly those blocks; only the last duck's
slice may end in the layer's own partial block. A routed expert is whole on a duck; a
duck's bank is its blocks one after the other (its experts, then its shared columns),
each with its own scale grid, so a bank's scale tensor is the blocks' grids side by side
(``bank_scales``) and an expert_ffn that is not a multiple of 128 still dequantizes
exactly as that expert's checkpoint says.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import BadInput

__all__ = [
    "BLOCK",
    "FLOAT8_E4M3",
    "UE8M0",
    "bank_scales",
    "block_shard_sizes",
    "check_fp8",
    "scale_shape",
    "scales_f32",
    "shard_fp8",
    "weight_dequant",
]

#: Rows and columns of weights one scale covers.
BLOCK = 128
#: The weights' dtype (torch.float8_e4m3fn): no infinities, 0x7f/0xff are NaN.
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
#: V3.2's power-of-two scales (torch.float8_e8m0fnu): 2^(e-127), 0xff is NaN.
UE8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """The scale grid of a ``[rows, cols]`` weight: one entry per 128x128 block, ceil."""
    return (_blocks(rows), _blocks(cols))


def scales_f32(s: np.ndarray, name: str = "scale") -> np.ndarray:
    """A scale grid as float32: float32 as given, ue8m0 widened (exact: powers of two)."""
    if not isinstance(s, np.ndarray):
        raise BadInput(f"{name} must be a numpy array")
    if s.dtype == UE8M0:
        return s.astype(np.float32)
    if s.dtype != np.float32:
        raise BadInput(
            f"{name} is {s.dtype}; FP8 scales are float32 (V3's weight_scale_inv) or "
            "float8_e8m0fnu (V3.2's ue8m0, ml_dtypes.float8_e8m0fnu)"
        )
    return s


def check_fp8(w: np.ndarray, s: np.ndarray, name: str) -> np.ndarray:
    """w float8_e4m3fn 2-D with a scale grid of its ceil-block shape; the scales as float32."""
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise BadInput(f"{name} must be a 2-D numpy array")
    if w.dtype != FLOAT8_E4M3:
        raise BadInput(
            f"{name} is {w.dtype}; FP8 weights are float8_e4m3fn (ml_dtypes.float8_e4m3fn)"
        )
    sf = scales_f32(s, f"{name}'s scale")
    if sf.shape != scale_shape(*w.shape):
        raise BadInput(
            f"{name} is {w.shape[0]}x{w.shape[1]}, so its scale grid must be "
            f"{scale_shape(*w.shape)} (one per {BLOCK}x{BLOCK} block, ceil), got {sf.shape}"
        )
    if not np.isfinite(sf).all():
        raise BadInput(f"{name}'s scales hold a NaN or an infinity")
    return sf


def weight_dequant(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """float32(w[i, j]) * s[i // 128, j // 128] for every element: the official
    weight_dequant, either layout (the grid follows the weight's)."""
    sf = scales_f32(s)
    rows, cols = w.shape
    full = np.repeat(np.repeat(sf, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]
    return w.astype(np.float32) * full


def block_shard_sizes(ffn: int, n: int) -> list[int]:
    """FFN columns per duck for ``n`` ducks, cut only between 128-blocks: the blocks
    spread as evenly as they go, the last duck taking the partial one. Refused when there
    are fewer blocks than ducks (a duck would hold nothing)."""
    blocks = _blocks(ffn)
    if n < 1 or blocks < n:
        raise BadInput(
            f"an FP8 layer of ffn {ffn} has {blocks} blocks of {BLOCK} columns and is cut "
            f"only between blocks: it cannot be spread over {n} ducks"
        )
    per = [blocks // n + (i < blocks % n) for i in range(n)]
    sizes = [p * BLOCK for p in per]
    sizes[-1] -= blocks * BLOCK - ffn
    return sizes


def shard_fp8(
    w_in: np.ndarray,
    s_in: np.ndarray,
    w_out: np.ndarray,
    s_out: np.ndarray,
    lo: int,
    hi: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Columns [lo, hi) of ``w_in`` ([hidden, ffn], grid [HB, FB]) and the same rows of
    ``w_out`` ([ffn, hidden], grid [FB, HB]), with exactly their blocks' scales. lo must
    start a block, hi end one or the layer."""
    ffn = w_in.shape[1]
    if lo % BLOCK or (hi % BLOCK and hi != ffn) or not 0 <= lo < hi <= ffn:
        raise BadInput(
            f"an FP8 layer is cut only between {BLOCK}-column blocks: [{lo}, {hi}) of "
            f"{ffn} columns is not (use duckpipe.client.fp8.block_shard_sizes)"
        )
    b0, b1 = lo // BLOCK, _blocks(hi)
    return (
        np.ascontiguousarray(w_in[:, lo:hi]),
        np.ascontiguousarray(s_in[:, b0:b1]),
        np.ascontiguousarray(w_out[lo:hi, :]),
        np.ascontiguousarray(s_out[b0:b1, :]),
    )


def bank_scales(
    grids_in: list[np.ndarray], grids_out: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """A duck's bank of blocks (its experts, then its shared columns): the gate/up scale
    tensor is the blocks' [HB, blocks_b] grids side by side, the down one their
    [blocks_b, HB] grids stacked. A column c of block b finds its scale at column
    (sum of the earlier blocks' grid widths) + (c - block start) // 128."""
    return (
        np.ascontiguousarray(np.concatenate(grids_in, axis=1), dtype=np.float32),
        np.ascontiguousarray(np.concatenate(grids_out, axis=0), dtype=np.float32),
    )
