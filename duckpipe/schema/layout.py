"""Fixed-layout field types for structs that live in shared memory or on the wire.

A layout struct is an ordinary msgspec ``Struct`` whose fields are annotated with
one of the types below. Each carries its C type in ``Meta.extra``; ``layout_of``
turns the class into offsets and sizes, refusing implicit padding so that the C
header, the cffi module and the JSON description can only ever agree.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any

import msgspec
from msgspec import Meta

__all__ = [
    "CACHE_LINE",
    "F32",
    "U8",
    "U16",
    "U32",
    "U64",
    "Array",
    "Chars",
    "Field",
    "Layout",
    "Pad",
    "layout_of",
]

CACHE_LINE = 64

_CTYPE_SIZES = {"uint8_t": 1, "uint16_t": 2, "uint32_t": 4, "uint64_t": 8, "char": 1, "float": 4}


def _uint(ctype: str, bits: int) -> Any:
    return Annotated[int, Meta(ge=0, le=(1 << bits) - 1, extra={"ctype": ctype})]


U8 = _uint("uint8_t", 8)
U16 = _uint("uint16_t", 16)
U32 = _uint("uint32_t", 32)
U64 = _uint("uint64_t", 64)
#: IEEE 754 binary32, little-endian (routing weights)
F32 = Annotated[float, Meta(extra={"ctype": "float"})]


def Array(ctype: str, count: int) -> Any:
    """A fixed-length array of unsigned integers."""
    return Annotated[
        list[int],
        Meta(min_length=count, max_length=count, extra={"ctype": ctype, "count": count}),
    ]


def Pad(count: int) -> Any:
    """Explicit padding bytes (never read); keeps every offset visible in the schema."""
    return Annotated[
        bytes, Meta(max_length=count, extra={"ctype": "uint8_t", "count": count, "pad": True})
    ]


def Chars(count: int) -> Any:
    """A NUL-terminated string in a fixed ``char[count]``."""
    return Annotated[str, Meta(max_length=count - 1, extra={"ctype": "char", "count": count})]


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    ctype: str
    count: int  # 0 for a scalar
    offset: int
    size: int
    pad: bool
    doc: str

    @property
    def c_decl(self) -> str:
        return f"{self.ctype} {self.name}" + (f"[{self.count}]" if self.count else "")


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str  # Python class name
    c_name: str  # C struct tag, e.g. dp_desc
    doc: str
    fields: tuple[Field, ...]
    size: int

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "c_name": self.c_name,
            "doc": self.doc,
            "size": self.size,
            "fields": [
                {
                    "name": f.name,
                    "ctype": f.ctype,
                    "count": f.count,
                    "offset": f.offset,
                    "size": f.size,
                    **({"pad": True} if f.pad else {}),
                    **({"doc": f.doc} if f.doc else {}),
                }
                for f in self.fields
            ],
        }


def _field_docs(cls: type) -> dict[str, str]:
    """Field comments come from a ``__field_docs__`` mapping on the class."""
    return dict(getattr(cls, "__field_docs__", {}))


def layout_of(cls: type[msgspec.Struct]) -> Layout:
    """Compute the C layout of a layout struct, failing on any implicit padding."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = _field_docs(cls)
    offset = 0
    max_align = 1
    fields = []
    for name in cls.__struct_fields__:
        hint = hints[name]
        metas = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Meta)]
        if not metas or not metas[0].extra or "ctype" not in metas[0].extra:
            raise TypeError(f"{cls.__name__}.{name}: not a layout field type")
        extra = metas[0].extra
        ctype = extra["ctype"]
        count = int(extra.get("count", 0))
        elem = _CTYPE_SIZES[ctype]
        if offset % elem:
            raise TypeError(
                f"{cls.__name__}.{name}: offset {offset} is not {elem}-byte aligned; add a Pad"
            )
        size = elem * (count or 1)
        fields.append(
            Field(name, ctype, count, offset, size, bool(extra.get("pad")), docs.get(name, ""))
        )
        offset += size
        max_align = max(max_align, elem)
    if offset % max_align:
        raise TypeError(f"{cls.__name__}: size {offset} leaves tail padding; add a Pad")
    expected = getattr(cls, "__c_size__", None)
    if expected is not None and expected != offset:
        raise TypeError(f"{cls.__name__}: size is {offset}, declared {expected}")
    return Layout(
        cls.__name__,
        cls.__c_name__,  # type: ignore[attr-defined]
        (cls.__doc__ or "").strip(),
        tuple(fields),
        offset,
    )
