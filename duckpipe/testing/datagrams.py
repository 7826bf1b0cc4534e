"""Building and reading duckpipe datagrams from Python (tests, tools, fake ducks).

The layout is the generated ``struct dp_wire_header`` (duckpipe/schema/wire.py);
this only packs and unpacks it through cffi.
"""

from __future__ import annotations

from .._abi import ffi, lib
from ..errors import BadInput

__all__ = ["HEADER_SIZE", "decode", "encode", "layer_payload", "payload_max"]

HEADER_SIZE = ffi.sizeof("struct dp_wire_header")


def payload_max(mtu: int = 1500) -> int:
    """Payload bytes per datagram for an MTU: dp_wire_payload_max() of dataplane/include/
    dp_wire.h, the rule the dataplane and the duck emulator chunk by (not a copy of it)."""
    return int(lib.dp_wire_payload_max(mtu))


def encode(op: int, payload: bytes = b"", **fields: int) -> bytes:
    """A datagram: a header with magic, version, op, length and ``fields`` set, then payload."""
    h = ffi.new("struct dp_wire_header *")
    h.magic = lib.DP_WIRE_MAGIC
    h.version = lib.DP_WIRE_VERSION
    h.op = op
    h.length = len(payload)
    for name, value in fields.items():
        setattr(h, name, value)
    return bytes(ffi.buffer(h)) + payload


def decode(data: bytes):
    """(header, payload) of a datagram; BadInput when it is not one."""
    if len(data) < HEADER_SIZE:
        raise BadInput(f"a {len(data)}-byte datagram is shorter than a header")
    h = ffi.new("struct dp_wire_header *")
    ffi.memmove(h, data, HEADER_SIZE)
    if h.magic != lib.DP_WIRE_MAGIC or h.version != lib.DP_WIRE_VERSION:
        raise BadInput("not a duckpipe datagram (magic or version)")
    if h.length != len(data) - HEADER_SIZE:
        raise BadInput(
            f"header says {h.length} payload bytes, datagram has {len(data) - HEADER_SIZE}"
        )
    return h, data[HEADER_SIZE:]


def layer_payload(
    kind: int,
    dtype: int,
    hidden: int,
    ffn: int,
    *,
    experts: int = 0,
    expert_ffn: int = 0,
    weight_dtype: int = 0,
) -> bytes:
    """The payload of a LAYER datagram: a struct dp_wire_layer (MOE: with the duck's
    bank, ``experts`` routed experts of ``expert_ffn`` columns each; ``weight_dtype``
    DType.F8E4M3: FP8 weights with block scales)."""
    w = ffi.new(
        "struct dp_wire_layer *",
        {
            "kind": kind,
            "dtype": dtype,
            "hidden": hidden,
            "ffn": ffn,
            "experts": experts,
            "expert_ffn": expert_ffn,
            "weight_dtype": weight_dtype,
        },
    )
    return bytes(ffi.buffer(w))
