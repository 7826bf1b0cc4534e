"""MLP kinds the ducks compute, how their weights are sharded, and a numpy reference.

Tensor parallelism over the FFN dimension: duck ``d`` holds columns
``[lo_d, hi_d)`` of the first matrix (and of the first bias) and the same rows
of the second. Each duck's partial is a full ``[rows, hidden]`` tensor; the sum
of the partials is the layer's output, and a second bias is added once, after
the reduce.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import ml_dtypes
import numpy as np

from ..errors import BadInput
from ..schema.abi import TENSOR_NAMES, DType, MlpKind, tensor_shape
from . import fp8

__all__ = [
    "BFLOAT16",
    "DTYPES",
    "GeluMlp",
    "Mlp",
    "SwiGluMlp",
    "dtype_code",
    "duck_partial",
    "erf",
    "gelu",
    "is_float_dtype",
    "numpy_dtype",
    "shard_bounds",
    "shard_sizes",
    "silu",
]

#: bfloat16 as numpy holds it: ml_dtypes' (JAX's), a dtype numpy does not count among
#: its floating types (``np.issubdtype(BFLOAT16, np.floating)`` is False; its kind is
#: "V"): use is_float_dtype.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

DTYPES = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16, BFLOAT16: DType.BF16}
_NUMPY = {code: dt for dt, code in DTYPES.items()}
_NAMES = "float32, float16 or bfloat16 (ml_dtypes.bfloat16)"


def dtype_code(dtype: np.dtype | type | str) -> DType:
    dt = np.dtype(dtype)
    try:
        return DTYPES[dt]
    except KeyError:
        raise BadInput(f"dtype {dt} is not supported; use {_NAMES}") from None


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype of a DType code (a layer's, a descriptor's)."""
    try:
        return _NUMPY[DType(code)]
    except (ValueError, KeyError):  # F8E4M3 is a DType of weights only: no activation has it
        raise BadInput(f"dtype code {code} is not one of {[int(c) for c in _NUMPY]}") from None


def is_float_dtype(dtype: np.dtype) -> bool:
    """numpy's floating types and bfloat16, which numpy does not count among them."""
    dt = np.dtype(dtype)
    # kind "f" is np.issubdtype(dt, np.floating), at a tenth of its cost (a routed submit
    # asks twice)
    return dt.kind == "f" or dt == BFLOAT16


def erf(x: np.ndarray) -> np.ndarray:
    """erf to an absolute error below 1.2e-7, finer than float32 resolution near 1.

    numpy has no erf and scipy is not a dependency; BERT's exact GELU needs one.
    This is the Chebyshev fit of erfc from Numerical Recipes (6.2).
    """
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (
        -z * z
        - 1.26551223
        + t
        * (
            1.00002368
            + t
            * (
                0.37409196
                + t
                * (
                    0.09678418
                    + t
                    * (
                        -0.18628806
                        + t
                        * (
                            0.27886807
                            + t
                            * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                        )
                    )
                )
            )
        )
    )
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as BERT and sentence-transformers compute it, in x's dtype."""
    xf = x.astype(np.float64, copy=False)
    return (0.5 * xf * (1.0 + erf(xf / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def shard_sizes(ffn: int, n: int) -> list[int]:
    """FFN columns per duck, as even as possible; each duck gets at least one."""
    if n < 1 or n > ffn:
        raise BadInput(f"cannot shard an FFN of {ffn} columns over {n} ducks")
    base, extra = divmod(ffn, n)
    return [base + (i < extra) for i in range(n)]


def shard_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for s in sizes:
        out.append((lo, lo + s))
        lo += s
    return out


@dataclasses.dataclass(frozen=True)
class GeluMlp:
    """BERT-style: ``gelu(x @ w_up + b_up) @ w_down + b_down``."""

    kind: ClassVar[MlpKind] = MlpKind.GELU
    TENSORS: ClassVar[tuple[str, ...]] = TENSOR_NAMES[MlpKind.GELU]

    w_up: np.ndarray  # [hidden, ffn]
    b_up: np.ndarray  # [ffn]
    w_down: np.ndarray  # [ffn, hidden]
    b_down: np.ndarray | None = None  # [hidden], added once after the reduce

    def __post_init__(self) -> None:
        h, f = _infer_dims(self)
        _check_shapes(self, _shard_shapes(self.kind, h, f))
        if self.b_down is not None:
            _check_shapes(self, {"b_down": (h,)})

    @property
    def hidden(self) -> int:
        return int(self.w_up.shape[0])

    @property
    def ffn(self) -> int:
        return int(self.w_up.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self.w_up.dtype

    def shard(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        """One duck's tensors, in TENSORS order, contiguous."""
        return (
            np.ascontiguousarray(self.w_up[:, lo:hi]),
            np.ascontiguousarray(self.b_up[lo:hi]),
            np.ascontiguousarray(self.w_down[lo:hi, :]),
        )

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The whole layer on the host, float32 accumulation, in x's dtype."""
        xf = x.astype(np.float32)
        out = gelu(xf @ self.w_up.astype(np.float32) + self.b_up.astype(np.float32))
        out = out @ self.w_down.astype(np.float32)
        if self.b_down is not None:
            out += self.b_down.astype(np.float32)
        return out.astype(x.dtype)

    @classmethod
    def random(cls, hidden: int, ffn: int, dtype=np.float32, seed: int = 0, b_down: bool = True):
        rng = np.random.default_rng(seed)
        s1, s2 = 1 / math.sqrt(hidden), 1 / math.sqrt(ffn)
        return cls(
            w_up=(rng.standard_normal((hidden, ffn)) * s1).astype(dtype),
            b_up=(rng.standard_normal(ffn) * 0.1).astype(dtype),
            w_down=(rng.standard_normal((ffn, hidden)) * s2).astype(dtype),
            b_down=(rng.standard_normal(hidden) * 0.1).astype(dtype) if b_down else None,
        )


@dataclasses.dataclass(frozen=True)
class SwiGluMlp:
    """Qwen-style: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``."""

    kind: ClassVar[MlpKind] = MlpKind.SWIGLU
    TENSORS: ClassVar[tuple[str, ...]] = TENSOR_NAMES[MlpKind.SWIGLU]

    w_gate: np.ndarray  # [hidden, ffn]
    w_up: np.ndarray  # [hidden, ffn]
    w_down: np.ndarray  # [ffn, hidden]
    b_down: None = None  # SwiGLU MLPs here carry no bias
    #: FP8 (duckpipe.client.fp8): the weights float8_e4m3fn in this [in, out] layout and
    #: each one's scale grid, [ceil(rows/128), ceil(cols/128)] of its own rows and columns
    #: (float32 or ue8m0; held as float32). None: the weights are not FP8.
    s_gate: np.ndarray | None = None
    s_up: np.ndarray | None = None
    s_down: np.ndarray | None = None
    #: FP8: the activations' (and partials') dtype; the weights' own dtype otherwise
    act_dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        if self.is_fp8:
            self._check_fp8()
            return
        if self.act_dtype is not None:
            raise BadInput("SwiGluMlp.act_dtype is for FP8 weights (SwiGluMlp.from_fp8)")
        h, f = _infer_dims(self)
        _check_shapes(self, _shard_shapes(self.kind, h, f))

    @property
    def is_fp8(self) -> bool:
        return any(getattr(self, n) is not None for n in ("s_gate", "s_up", "s_down")) or (
            isinstance(self.w_gate, np.ndarray) and self.w_gate.dtype == fp8.FLOAT8_E4M3
        )

    def _check_fp8(self) -> None:
        if not isinstance(self.w_gate, np.ndarray) or self.w_gate.ndim != 2:
            raise BadInput("SwiGluMlp.w_gate must be a 2-D numpy array")
        want = _shard_shapes(self.kind, *self.w_gate.shape)
        for name in self.TENSORS:
            w, s = getattr(self, name), getattr(self, "s" + name[1:])
            if s is None:
                raise BadInput(f"SwiGluMlp.{name} is FP8 but s{name[1:]} (its scales) is None")
            sf = fp8.check_fp8(w, s, f"SwiGluMlp.{name}")
            if w.shape != want[name]:
                raise BadInput(
                    f"SwiGluMlp.{name} has shape {w.shape}, expected {want[name]} (x @ w "
                    "layout; SwiGluMlp.from_fp8 takes the checkpoint's [out, in])"
                )
            object.__setattr__(self, "s" + name[1:], np.ascontiguousarray(sf))
        act = np.dtype(ml_dtypes.bfloat16 if self.act_dtype is None else self.act_dtype)
        if act not in DTYPES:
            raise BadInput(f"SwiGluMlp.act_dtype {act} is not supported; use {_NAMES}")
        object.__setattr__(self, "act_dtype", act)

    @classmethod
    def from_fp8(
        cls,
        w_gate: np.ndarray,
        w_up: np.ndarray,
        w_down: np.ndarray,
        s_gate: np.ndarray,
        s_up: np.ndarray,
        s_down: np.ndarray,
        *,
        act_dtype=ml_dtypes.bfloat16,
    ) -> SwiGluMlp:
        """An FP8 SwiGLU from the checkpoint's own tensors, torch's Linear layout:
        w_gate, w_up [ffn, hidden] and w_down [hidden, ffn] float8_e4m3fn (DeepSeek-V3's
        w1, w3, w2), each with its ``weight_scale_inv`` [ceil(out/128), ceil(in/128)]
        (float32, or float8_e8m0fnu for V3.2's ue8m0). Held transposed, as x @ w wants;
        activations in ``act_dtype``."""
        given = (("w_gate", w_gate, s_gate), ("w_up", w_up, s_up), ("w_down", w_down, s_down))
        for n, w, s in given:
            fp8.check_fp8(w, s, f"SwiGluMlp.from_fp8 {n}")
        return cls(
            w_gate=np.ascontiguousarray(w_gate.T),
            w_up=np.ascontiguousarray(w_up.T),
            w_down=np.ascontiguousarray(w_down.T),
            s_gate=np.ascontiguousarray(fp8.scales_f32(s_gate).T),
            s_up=np.ascontiguousarray(fp8.scales_f32(s_up).T),
            s_down=np.ascontiguousarray(fp8.scales_f32(s_down).T),
            act_dtype=act_dtype,
        )

    def dequantized(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The three weights in float32: dequantized (fp8.weight_dequant) when FP8."""
        if not self.is_fp8:
            return tuple(getattr(self, n).astype(np.float32) for n in self.TENSORS)  # type: ignore[return-value]
        return tuple(  # type: ignore[return-value]
            fp8.weight_dequant(getattr(self, n), getattr(self, "s" + n[1:])) for n in self.TENSORS
        )

    @property
    def hidden(self) -> int:
        return int(self.w_gate.shape[0])

    @property
    def ffn(self) -> int:
        return int(self.w_gate.shape[1])

    @property
    def dtype(self) -> np.dtype:
        """The layer's dtype: activations and partials (and the weights unless FP8)."""
        return self.act_dtype if self.act_dtype is not None else self.w_gate.dtype

    @property
    def weight_dtype(self) -> np.dtype:
        return self.w_gate.dtype

    def shard(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        return (
            np.ascontiguousarray(self.w_gate[:, lo:hi]),
            np.ascontiguousarray(self.w_up[:, lo:hi]),
            np.ascontiguousarray(self.w_down[lo:hi, :]),
        )

    def shard_scales(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FP8: the scale grids of columns [lo, hi) (lo, hi between 128-blocks, or hi the
        layer's end): s_gate's and s_up's block columns, s_down's block rows."""
        _, sg, _, sd = fp8.shard_fp8(self.w_gate, self.s_gate, self.w_down, self.s_down, lo, hi)
        _, su, _, _ = fp8.shard_fp8(self.w_up, self.s_up, self.w_down, self.s_down, lo, hi)
        return sg, su, sd

    def reference(self, x: np.ndarray) -> np.ndarray:
        xf = x.astype(np.float32)
        w_gate, w_up, w_down = self.dequantized()
        g = xf @ w_gate
        u = xf @ w_up
        return ((silu(g) * u) @ w_down).astype(x.dtype)

    @classmethod
    def random(cls, hidden: int, ffn: int, dtype=np.float32, seed: int = 0):
        rng = np.random.default_rng(seed)
        s1, s2 = 1 / math.sqrt(hidden), 1 / math.sqrt(ffn)
        return cls(
            w_gate=(rng.standard_normal((hidden, ffn)) * s1).astype(dtype),
            w_up=(rng.standard_normal((hidden, ffn)) * s1).astype(dtype),
            w_down=(rng.standard_normal((ffn, hidden)) * s2).astype(dtype),
        )


Mlp = GeluMlp | SwiGluMlp


def _shard_shapes(kind: MlpKind, hidden: int, ffn: int) -> dict[str, tuple[int, ...]]:
    """The whole layer's tensors by name: the schema's shard shapes with every FFN column."""
    return {name: tensor_shape(kind, t, hidden, ffn) for t, name in enumerate(TENSOR_NAMES[kind])}


def _infer_dims(mlp: GeluMlp | SwiGluMlp) -> tuple[int, int]:
    """(hidden, ffn) as most of the layer's tensors say, so that the one tensor that
    disagrees (a transposed w_up, say) is the one blamed, not its neighbour."""
    names = TENSOR_NAMES[mlp.kind]
    arrays = {n: getattr(mlp, n) for n in (*names, "b_down")}
    first = arrays[names[0]]
    if not isinstance(first, np.ndarray) or first.ndim != 2:
        return (0, 0)  # _check_shapes names it
    candidates = []
    for n in names:
        a = arrays[n]
        if isinstance(a, np.ndarray) and a.ndim == 2:
            candidates += [a.shape, a.shape[::-1]]

    def agreeing(h: int, f: int) -> int:
        want = _shard_shapes(mlp.kind, h, f)
        if arrays["b_down"] is not None:
            want["b_down"] = (h,)
        return sum(
            isinstance(arrays[n], np.ndarray) and arrays[n].shape == s for n, s in want.items()
        )

    # ties go to the first tensor's own reading (the order it was always read in)
    return max(candidates, key=lambda hf: agreeing(*hf))


def _check_shapes(mlp: object, want: dict[str, tuple[int, ...]]) -> None:
    dtype = None
    for name, shape in want.items():
        arr = getattr(mlp, name)
        if not isinstance(arr, np.ndarray):
            raise BadInput(f"{type(mlp).__name__}.{name} must be a numpy array")
        if arr.shape != shape:
            hint = " (transposed?)" if arr.shape == shape[::-1] and len(shape) == 2 else ""
            raise BadInput(
                f"{type(mlp).__name__}.{name} has shape {arr.shape}, expected {shape}{hint}"
            )
        if arr.dtype not in DTYPES:  # name the tensor: the bare dtype message would not
            raise BadInput(
                f"{type(mlp).__name__}.{name} is {arr.dtype}; the ducks compute {_NAMES} "
                f"(e.g. {name}=array.astype(np.float32))"
            )
        if dtype is not None and arr.dtype != dtype:
            raise BadInput(f"{type(mlp).__name__}: all tensors must share one dtype")
        dtype = arr.dtype


def duck_partial(kind: int, x: np.ndarray, tensors: list[np.ndarray]) -> np.ndarray:
    """What one duck computes from its shard: a float32 ``[rows, hidden]`` partial."""
    xf = x.astype(np.float32, copy=False)
    if kind == MlpKind.GELU:
        w_up, b_up, w_down = tensors
        h = gelu(xf @ w_up.astype(np.float32, copy=False) + b_up.astype(np.float32, copy=False))
        return h @ w_down.astype(np.float32, copy=False)
    if kind == MlpKind.SWIGLU:
        w_gate, w_up, w_down = tensors
        g = xf @ w_gate.astype(np.float32, copy=False)
        u = xf @ w_up.astype(np.float32, copy=False)
        return (silu(g) * u) @ w_down.astype(np.float32, copy=False)
    raise BadInput(f"unknown MLP kind {kind}")
