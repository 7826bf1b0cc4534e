"""The host <-> duck UDP wire protocol: one fixed header in front of every datagram.

Forward: the host sends the activation in ``chunks`` datagrams of op FORWARD
(``offset``/``length`` place each payload inside ``total`` bytes), broadcast per
NIC subnet or unicast to each duck in turn. Each duck answers with its partial
result, chunked the same way, op PARTIAL, ``compute_ns`` set. A receiver that
is missing chunks after a while sends NACK, whose payload is the list of missing
chunk indices as little-endian uint32; ducks keep recent outputs to resend.
Only the host runs timers: when a duck's partial is incomplete it NACKs the duck
(an empty list means "everything"); a duck still missing input chunks answers
with NACK flagged INPUT listing them, and the host resends those.
Weights: op LAYER (payload ``dp_wire_layer``) announces a layer's shard to one
duck, then op WEIGHT chunks fill its tensors; each datagram is acknowledged
with WEIGHT_ACK (``tensor`` 0xFFFF for LAYER) and resent until it is.
A layer moved to a new placement (MoveLayer) gives a duck whose experts changed a
new bank beside its old one, a generation on (``dp_wire_layer.bank``); WEIGHT fills
the newest bank, and a FORWARD's ``tensor`` is the generation it was planned for: the
duck answers it from the newest bank of its layer not newer than that.
Every datagram carries the session cookie and the epoch; a receiver drops and
counts datagrams with a bad magic, version, session or a stale epoch.
Activations, partials and weights travel in the layer's dtype (the header's
``dtype``): a duck computes in float32 and rounds its float16 or bfloat16 partial
to nearest even once; the host widens each partial again and sums in float32.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import msgspec

from .layout import U8, U16, U32, U64, Pad

__all__ = ["CONSTANTS", "LAYOUTS", "WIRE_MAGIC", "WIRE_VERSION", "WireHeader", "WireOp"]

WIRE_MAGIC = int.from_bytes(b"DUCK", "little")
WIRE_VERSION = 1


class WireOp(enum.IntEnum):
    FORWARD = 1  # host -> ducks: activation chunk
    PARTIAL = 2  # duck -> host: partial result chunk
    NACK = 3  # either way: payload lists missing chunk indices (uint32 LE)
    WEIGHT = 4  # host -> duck: weight shard chunk (reliable unicast)
    WEIGHT_ACK = 5  # duck -> host: chunk ``chunk`` of tensor ``tensor`` stored
    PING = 6  # host -> duck: liveness and epoch announcement
    PONG = 7  # duck -> host
    LAYER = 8  # host -> duck: a layer's shard shape (payload dp_wire_layer)


class WireFlag(enum.IntEnum):
    """Bits of the header's ``flags``."""

    INPUT = 1  # NACK from a duck: the missing chunks are of the host's activation
    NO_LAYER = 2  # NACK from a duck: it holds no such layer (it lost its weights)
    #: FORWARD of a MOE layer: the message is a wire routing table (schema/routing.py)
    #: then ``rows`` activation rows; PARTIAL of one: one row per row the duck computed
    ROUTED = 4


class WireHeader(msgspec.Struct, frozen=True):
    """Fixed header at byte 0 of every duckpipe datagram, little-endian."""

    __c_name__: ClassVar[str] = "dp_wire_header"
    __c_size__: ClassVar[int] = 80
    __field_docs__: ClassVar[dict[str, str]] = {
        "magic": "WIRE_MAGIC",
        "op": "enum dp_wire_op",
        "session": "cookie chosen by the dataplane at start; ducks echo it",
        "epoch": "dataplane epoch; stale ones are dropped",
        "duck": "sender (replies) or addressee (unicast requests)",
        "tensor": "WEIGHT*: tensor index in the layer's kind; FORWARD: the bank generation "
        "it was planned for (dp_wire_layer.bank)",
        "chunk": "index of this datagram's chunk",
        "chunks": "chunks in the whole message",
        "offset": "byte offset of this payload in the message",
        "total": "bytes in the whole message",
        "length": "payload bytes after this header",
        "rows": "FORWARD/PARTIAL: activation rows (tokens)",
        "compute_ns": "PARTIAL: the duck's own compute time for this forward",
    }

    magic: U32
    version: U8
    op: U8
    dtype: U8
    flags: U8
    session: U64
    epoch: U64
    forward_id: U64
    layer: U32
    duck: U16
    tensor: U16
    chunk: U32
    chunks: U32
    offset: U64
    total: U64
    length: U32
    rows: U32
    compute_ns: U64


class WireLayer(msgspec.Struct, frozen=True):
    """Payload of a LAYER datagram: the shard a duck is about to receive."""

    __c_name__: ClassVar[str] = "dp_wire_layer"
    __c_size__: ClassVar[int] = 24
    __field_docs__: ClassVar[dict[str, str]] = {
        "kind": "enum dp_mlp_kind",
        "weight_dtype": "0: the weights travel in dtype; DP_DTYPE_F8E4M3: each tensor's "
        "e4m3 bytes, then its float32 scale grid (dp_fp8.h)",
        "experts": "MOE: routed experts in this duck's bank (its wire entries' "
        "expert is 0..experts-1)",
        "ffn": "FFN columns in this duck's shard (MOE: its bank, experts * expert_ffn "
        "+ its shared-expert columns)",
        "expert_ffn": "MOE: columns of each routed expert (0 for other kinds)",
        "bank": "the bank's generation: 0 from a load; a move's new banks the layer's next "
        "(a duck keeps up to two banks of a layer and answers a FORWARD from the newest "
        "whose generation is not newer than the FORWARD's `tensor`)",
    }

    kind: U8
    dtype: U8
    experts: U16
    hidden: U32
    ffn: U32
    expert_ffn: U32
    weight_dtype: U8
    pad0: Pad(1)
    bank: U16
    pad1: Pad(4)


LAYOUTS = (WireHeader, WireLayer)
CONSTANTS: dict[str, int] = {
    "WIRE_MAGIC": WIRE_MAGIC,
    "WIRE_VERSION": WIRE_VERSION,
    "WIRE_ANY_DUCK": 0xFFFF,
    "WIRE_LAYER_TENSOR": 0xFFFF,
    # a FORWARD's forward_id (echoed in its PARTIALs and NACKs) carries a failover tag in
    # its top byte: forward_id | k << this, k = 1..8 the k-th failover message of a NIC's
    # part of the forward (0: the forward's own message); ids below it are the dataplane's
    "WIRE_FORWARD_TAG_SHIFT": 56,
}
