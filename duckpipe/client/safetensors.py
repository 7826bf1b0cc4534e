"""Read safetensors files as numpy views of a memory map, bf16 and float8 included.

The ``safetensors`` package's numpy side refuses bfloat16 and float8, which is what a
DeepSeek-V3 checkpoint holds. The format is small enough to read directly
(https://github.com/huggingface/safetensors#format): 8 bytes little-endian N, N bytes of
JSON header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets from
the end of the header, and an optional ``"__metadata__"``), then the raw bytes. Tensors
are mapped, never read whole: a view costs page cache, not process memory, until it is
touched.

    with SafetensorsFile(path) as f:
        w = f.tensor("model.layers.3.mlp.experts.0.up_proj.weight")   # a read-only view

Every malformed file is a :class:`CheckpointError` that names the file (and the tensor).
"""

from __future__ import annotations

import json
import math
import mmap
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import BadInput

__all__ = ["DTYPES", "CheckpointError", "SafetensorsFile", "TensorInfo", "write"]

#: safetensors' dtype names, as numpy dtypes (ml_dtypes for the ones numpy lacks)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# A header is JSON of a few hundred bytes per tensor; the format's own readers cap it at
# 100 MB, so does this one (a corrupt length must not allocate gigabytes)
MAX_HEADER = 100_000_000
# numpy's most dimensions (NPY_MAXDIMS in numpy 2)
MAX_DIMS = 64


class CheckpointError(BadInput):
    """A checkpoint this loader cannot read as it is: the message names the file and,
    where one is at fault, the tensor."""


class TensorInfo:
    __slots__ = ("dtype", "name", "offset", "shape")

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> None:
        self.name, self.dtype, self.shape, self.offset = name, dtype, shape, offset

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class SafetensorsFile:
    """One ``.safetensors`` file, mapped read-only; its header checked as it is opened."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot open it: {e.strerror}") from None
        except ValueError as e:  # a NUL in the path (an index's file name can hold one)
            raise CheckpointError(f"{self.path!r}: cannot open it: {e}") from None
        try:
            self.metadata, self.tensors = self._parse(size)
        except CheckpointError:
            self.close()
            raise

    def _fail(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {why}")

    def _parse(self, size: int) -> tuple[dict[str, str], dict[str, TensorInfo]]:
        if size < 8 or self._map is None:
            raise self._fail(f"{size} bytes: not a safetensors file (no header length)")
        n = int.from_bytes(self._map[:8], "little")
        if n > MAX_HEADER or 8 + n > size:
            raise self._fail(f"header length {n} does not fit the file's {size} bytes")
        try:
            header = json.loads(self._map[8 : 8 + n])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._fail(f"the header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise self._fail("the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        data_start, data_size = 8 + n, size - 8 - n
        tensors = {}
        for name, entry in header.items():
            tensors[name] = self._entry(name, entry, data_start, data_size)
        self._no_overlap(tensors)
        return metadata, tensors

    def _no_overlap(self, tensors: dict[str, TensorInfo]) -> None:
        # two tensors on the same bytes are a damaged header (the format's writers never
        # make one, its reader refuses it): each would silently read the other's weights
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
        end, last = 0, ""
        for begin, stop, name in spans:
            if begin == stop:
                continue  # no bytes: nothing to share
            if begin < end:
                raise self._fail(f"tensors {last!r} and {name!r} overlap in the file")
            end, last = stop, name

    def _entry(self, name: str, entry: Any, data_start: int, data_size: int) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._fail(f"tensor {name!r}: its header entry is not an object")
        dtype = DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
        if dtype is None:
            raise self._fail(
                f"tensor {name!r}: dtype {entry.get('dtype')!r} is not one of {sorted(DTYPES)}"
            )
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise self._fail(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        # an empty tensor's other sizes pass the byte count below (0 bytes) whatever they
        # are: held to what a numpy array can have, or tensor() fails outside this rule
        if len(shape) > MAX_DIMS or math.prod(d for d in shape if d) * dtype.itemsize >= 2**63:
            raise self._fail(
                f"tensor {name!r}: shape of {len(shape)} sizes, {math.prod(shape)} items: "
                f"beyond an array's {MAX_DIMS} dimensions or 2**63 bytes"
            )
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise self._fail(
                f"tensor {name!r}: data_offsets {offsets!r} are outside the file's "
                f"{data_size} bytes of data"
            )
        info = TensorInfo(name, dtype, tuple(shape), data_start + offsets[0])
        if offsets[1] - offsets[0] != info.nbytes:
            raise self._fail(
                f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {tuple(shape)} of "
                f"{entry['dtype']}, which needs {info.nbytes}"
            )
        return info

    def tensor(self, name: str) -> np.ndarray:
        """A read-only view of one tensor's bytes, in its own dtype and shape."""
        info = self.tensors.get(name)
        if info is None:
            raise self._fail(f"no tensor {name!r}")
        if self._map is None:
            raise self._fail("the file is closed")
        count = math.prod(info.shape)
        if count == 0:
            return np.empty(info.shape, info.dtype)
        flat = np.frombuffer(self._map, dtype=info.dtype, count=count, offset=info.offset)
        return flat.reshape(info.shape)

    def close(self) -> None:
        """Unmap the file; views already taken keep their mapping alive (numpy holds it)."""
        self._map = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SafetensorsFile {self.path} ({len(self.tensors)} tensors)>"


def write(path: str | os.PathLike[str], tensors: dict[str, np.ndarray]) -> None:
    """Write ``tensors`` as one safetensors file (the format above, offsets in insertion
    order, the header padded to 8 bytes with spaces as the reference writer does): what
    tests and the demo use to make a checkpoint in exactly the published format."""
    names = {dt: code for code, dt in DTYPES.items()}
    header: dict[str, Any] = {}
    at = 0
    for name, a in tensors.items():
        code = names.get(a.dtype)
        if code is None:
            raise BadInput(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())
