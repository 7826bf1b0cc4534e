"""DLPack, the tensor exchange protocol torch, JAX and numpy speak: a CPU tensor in as a
numpy array (a view of its memory, no copy), numpy arrays out as DLPack, bf16 and fp8
included.

numpy's own ``np.from_dlpack`` and ``ndarray.__dlpack__`` cover the dtypes numpy has.
DLPack's bfloat16 and float8 codes are not among them (numpy refuses both ways), so for
those this module reads and makes the capsule itself, with ctypes, after dlpack.h's
``DLManagedTensor``: the unversioned capsule named ``"dltensor"``, which every producer
and consumer accepts. The numpy side of those dtypes is ml_dtypes' (JAX's).

    x = as_array(tensor)            # any CPU tensor with __dlpack__: a view
    t = torch.from_dlpack(Exported(x))   # and back, bf16 too

Lifetimes follow the protocol: a consumed capsule is renamed ``"used_dltensor"`` and its
deleter runs once the last numpy view of it is gone; an exported array stays alive until
the consumer calls the deleter (or the capsule is dropped unconsumed).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

__all__ = ["CPU_DEVICE", "Exported", "as_array", "from_torch_dtype", "is_torch", "like"]

# dlpack.h: DLDeviceType and DLDataTypeCode
_CPU = 1
CPU_DEVICE = (_CPU, 0)  # what __dlpack_device__ says of host memory
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_FLOAT8_E4M3FN, _FLOAT8_E5M2, _FLOAT8_E8M0FNU = 10, 12, 14


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements; NULL: C order
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.c_void_p),  # void (*)(DLManagedTensor *), may be NULL
]

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# the same two, on a capsule being freed: given as a bare pointer (a py_object of an object
# whose count is 0 would free it again)
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

_NAME, _USED = b"dltensor", b"used_dltensor"


def _ml_dtypes() -> dict[tuple[int, int], np.dtype]:
    """DLPack's codes for the dtypes numpy has only through ml_dtypes."""
    import ml_dtypes

    return {
        (_BFLOAT, 16): np.dtype(ml_dtypes.bfloat16),
        (_FLOAT8_E4M3FN, 8): np.dtype(ml_dtypes.float8_e4m3fn),
        (_FLOAT8_E5M2, 8): np.dtype(ml_dtypes.float8_e5m2),
        (_FLOAT8_E8M0FNU, 8): np.dtype(ml_dtypes.float8_e8m0fnu),
    }


def _dtype_of(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes != 1:
        raise TypeError(f"a tensor of {lanes}-lane vectors: duckpipe takes scalars")
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _BOOL: "b"}.get(code)
    if kind is not None and bits % 8 == 0:
        return np.dtype(f"{kind}{bits // 8}")
    try:
        return _ml_dtypes()[code, bits]
    except KeyError:
        raise TypeError(f"DLPack dtype code {code} of {bits} bits has no numpy dtype") from None


class _Consumed:
    """Owns one consumed DLManagedTensor: calls its deleter when the last view is gone."""

    def __init__(self, managed: int) -> None:
        self.managed = managed

    def __del__(self) -> None:
        deleter = _Managed.from_address(self.managed).deleter
        if deleter:
            _Deleter(deleter)(self.managed)


def _read_capsule(x: Any) -> np.ndarray:
    """A numpy view of what x's unversioned DLPack capsule describes."""
    capsule = x.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise TypeError(f"{type(x).__name__}.__dlpack__() gave no 'dltensor' capsule")
    managed = _api.PyCapsule_GetPointer(capsule, _NAME)
    t = _Managed.from_address(managed).dl_tensor
    if t.device.device_type != _CPU:
        raise TypeError(
            f"the tensor is on DLPack device {t.device.device_type} (not the CPU's, 1): "
            "duckpipe reads host memory; move it there first (torch: .cpu())"
        )
    dtype = _dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None  # NULL strides: C order
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    if strides is not None and any(s < 0 for s in strides):
        raise TypeError("a tensor with negative strides: make it contiguous first")
    if 0 in shape:
        return np.empty(shape, dtype)  # no memory to view; the capsule frees itself
    if strides is None:
        extent = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    else:
        extent = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + dtype.itemsize
    memory = (ctypes.c_char * extent).from_address(t.data + t.byte_offset)
    memory.owner = _Consumed(managed)  # the deleter runs once memory is unreferenced
    _api.PyCapsule_SetName(capsule, _USED)  # ours now: the capsule's destructor skips it
    return np.ndarray(shape, dtype, buffer=memory, strides=strides)


def as_array(x: Any) -> Any:
    """A DLPack producer (a torch tensor, a JAX array, ...) as a numpy view of its CPU
    memory, bf16 and float8 included; anything else (a numpy array, a list) as it is, for
    the caller's own checks. A TypeError says why a tensor cannot be read (another device,
    gradients kept, an unknown dtype)."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return x
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as numpy_refused:
        try:
            return _read_capsule(x)
        except (BufferError, RuntimeError) as e:  # the producer's own refusal
            raise TypeError(str(e)) from numpy_refused


# --- out ------------------------------------------------------------------------------

_CODE_OF: dict[np.dtype, tuple[int, int]] = {}
_exported: dict[int, tuple[Any, ...]] = {}  # DLManagedTensor address -> what keeps it valid


@_Deleter
def _delete(managed: int) -> None:
    _exported.pop(managed, None)


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_DESTRUCTOR
def _drop_unconsumed(capsule: int) -> None:
    # a capsule nobody consumed still owns its tensor; a consumed one was renamed
    if _is_valid_raw(capsule, _NAME):
        _exported.pop(_get_pointer_raw(capsule, _NAME), None)


def _code_of(dtype: np.dtype) -> tuple[int, int]:
    if not _CODE_OF:
        _CODE_OF.update({dt: code for code, dt in _ml_dtypes().items()})
    return _CODE_OF[dtype]


class Exported:
    """A numpy array as a DLPack producer, for the dtypes ``ndarray.__dlpack__`` refuses
    (bf16, float8); the others are handed to numpy's own. ``torch.from_dlpack(Exported(a))``
    is a torch view of ``a``'s memory."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack_device__(self) -> tuple[int, int]:
        return CPU_DEVICE

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        a = self.array
        if a.dtype.kind in "biuf" and a.dtype.type.__module__ == "numpy":
            return a.__dlpack__(stream=stream)  # numpy's own, unversioned as below
        code, bits = _code_of(a.dtype)
        # as numpy's own refuses them: the unversioned capsule cannot say "read-only", and
        # a consumer writing through it would write a checkpoint's read-only map (SIGSEGV)
        if not a.flags.writeable:
            raise BufferError(
                "cannot export a read-only array: DLPack's unversioned capsule cannot say "
                "so; export a writable copy (array.copy())"
            )
        # DLPack counts strides in elements: a byte stride between them has no such count
        if any(s % a.itemsize for s in a.strides):
            raise BufferError(
                f"strides {a.strides} are not multiples of the {a.itemsize}-byte item: "
                "DLPack counts them in elements; export a contiguous copy"
            )
        managed = _Managed()
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        t = managed.dl_tensor
        t.data = a.ctypes.data
        t.device = _Device(_CPU, 0)
        t.ndim = a.ndim
        t.dtype = _DataType(code, bits, 1)
        t.shape, t.strides = shape, strides
        managed.deleter = ctypes.cast(_delete, ctypes.c_void_p)
        address = ctypes.addressof(managed)
        _exported[address] = (managed, shape, strides, a)
        return _api.PyCapsule_New(address, _NAME, ctypes.cast(_drop_unconsumed, ctypes.c_void_p))


# --- torch, without importing it --------------------------------------------------------


def is_torch(x: Any) -> bool:
    """Whether x is a torch.Tensor (torch is imported only by whoever made one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def like(result: np.ndarray, x: Any) -> Any:
    """``result`` in the kind ``x`` was given as: a torch tensor (a view of result's
    memory) when x was one, else the numpy array."""
    if not is_torch(x):
        return result
    return sys.modules["torch"].from_dlpack(Exported(result))


def from_torch_dtype(dtype: Any) -> Any:
    """A torch dtype's numpy dtype (torch.bfloat16 -> ml_dtypes.bfloat16), or dtype as it
    is when it is not a torch dtype."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(dtype, torch.dtype):
        return dtype
    return as_array(torch.empty(0, dtype=dtype)).dtype
