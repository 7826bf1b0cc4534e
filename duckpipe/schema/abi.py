"""Shared-memory ABI: the segment header, the submission ring and the slot headers.

This module is the one source of truth for everything the client, the mock
dataplane, the C dataplane and the duck emulator share through memory.
``tools/gen_abi.py`` writes ``dataplane/include/gen/dp_abi.h`` and
``schemas/abi.json`` from it.

A segment, created by one client and mapped by the dataplane::

    offset 0            +--------------------------------------+
                        | dp_seg_header      (6 cache lines)   |
    ring_offset         +--------------------------------------+
                        | dp_ring_header     head | tail lines |
                        | dp_desc[ring_capacity]  (128 B each) |
    res_hdr_offset      +--------------------------------------+
                        | dp_slot_header[slot_count] (128 B)   |
    act_offset (page)   +--------------------------------------+
                        | activation slot 0 .. slot_count-1    |
                        |   act_slot_size each, page-aligned   |
    res_offset (page)   +--------------------------------------+
                        | result slot 0 .. slot_count-1        |
                        |   res_slot_size each, page-aligned   |
    segment_size        +--------------------------------------+

Slot ``i`` pairs activation slot ``i`` with result slot ``i`` and slot header
``i``; one generation number covers all three.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import msgspec

from .layout import U8, U16, U32, U64, Array, Chars, Pad

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "B_DOWN_TENSOR",
    "CONSTANTS",
    "DTYPE_SIZES",
    "EMULATOR_MAX_DUCKS",
    "FP8_BLOCK",
    "LAYER_TABLE",
    "LAYOUTS",
    "MAX_CLIENTS",
    "MAX_DIMS",
    "MAX_DUCKS",
    "MAX_NICS",
    "MOE_LAYER_STATE_BYTES",
    "SEG_MAGIC",
    "SHARD_TENSORS",
    "TENSOR_NAMES",
    "TENSOR_SHAPES",
    "Backing",
    "DType",
    "Desc",
    "DescFlag",
    "DetachReason",
    "MlpKind",
    "Op",
    "RingHeader",
    "SegHeader",
    "SlotHeader",
    "Status",
    "TensorDim",
    "tensor_shape",
]

ABI_MAJOR = 2
ABI_MINOR = 2
# 1.1: sealed memfds; detach_reason. 1.2: need_wakeup, waiters. 1.3: MoE (DescFlag).
# 1.4: completions_wanted. 2.0: the slot header is two lines (128 B), the second the
# forward's phase times: every slot header after the first moved, so a 1.x reader would
# misplace them (a major bump; dp_seg_check and Attach compare majors only)
# 2.1: DType.BF16 (a 2.0 reader would not know dtype 3). 2.2: a host routing table
# lists each token's experts ascending (a 2.1 client's table, in score order, is refused
# per forward with ORDER and a message that names the rule)
SEG_MAGIC = int.from_bytes(b"DUCKSEG1", "little")
MAX_DUCKS = 256  # bits in a descriptor's target set
EMULATOR_MAX_DUCKS = 32  # ducks one duckpipe-ducks process emulates
MAX_DIMS = 4
MAX_CLIENTS = 64  # client slots of one dataplane
MAX_NICS = 8  # NICs (and NIC workers) of one dataplane
# Layer table entries (open addressing, a power of two): at least MAX_CLIENTS times the
# config's client_max_layers, which the dataplane checks at start, so that clients at
# their quota can never fill it for the others.
LAYER_TABLE = 8192
# What a mixture-of-experts layer holds in the dataplane besides its weights: its
# placement and bank slots (struct dp_layer_moe, ~34 KiB) and the layer's own state
# (struct dp_layer, ~16 KiB: 1 KiB of it a repair's per-duck stamps). Both dataplanes count
# it against the owner's client_max_weight_bytes (dp_load_plan_bytes; the C build asserts
# the structs fit in it).
MOE_LAYER_STATE_BYTES = 52 << 10


class _NamedIntEnum(enum.IntEnum):
    """An IntEnum a person reads: ``print`` and f-strings show ``Status.OK``, not ``1``
    (Python 3.11's IntEnum prints its number); a numeric format spec still gets the int."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        if spec and spec[-1] in "bcdoxXn":
            return int(self).__format__(spec)
        return str(self).__format__(spec)


class Backing(enum.IntEnum):
    """What memory backs a segment."""

    HUGETLBFS = 1  # 2 MiB hugepages (a MFD_HUGETLB memfd; a hugetlbfs file before 1.1)
    DEVSHM = 2  # 4 KiB pages (a plain memfd; a /dev/shm file before 1.1)


class DetachReason(enum.IntEnum):
    """Why the dataplane detached a client on its own, in the header's ``detach_reason``."""

    NONE = 0
    RING_BROKEN = 1  # head moved back, or ran more than ring_capacity ahead of tail


class Op(enum.IntEnum):
    """What a submission descriptor asks the dataplane to do."""

    FORWARD = 1  # run layer's MLP on the activation slot, reduce into the result slot
    WEIGHT_CHUNK = 2  # bytes [offset, offset+nbytes) of one tensor of one duck's shard
    WEIGHT_COMMIT = 3  # every chunk of a load was submitted; make the layer usable


class DType(_NamedIntEnum):
    F32 = 1
    F16 = 2
    BF16 = 3  # bfloat16 (ml_dtypes.bfloat16 in numpy): float32's range, 8 bits of mantissa
    #: float8 e4m3fn (DeepSeek-V3's), weights only (LoadWeights.weight_dtype): each shard
    #: tensor is its e4m3 bytes, then its float32 scale grid, one per FP8_BLOCK^2 block
    #: (duckpipe/client/fp8.py); activations stay in the layer's dtype
    F8E4M3 = 4


#: Bytes of one element of each dtype (dp_dtype_size in dp_abi.h).
DTYPE_SIZES: dict[DType, int] = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F8E4M3: 1}
#: Rows and columns of an FP8 weight one scale covers (DeepSeek-V3's block_size).
FP8_BLOCK = 128


class Status(_NamedIntEnum):
    """Completion status, in the slot header's done word and the ZeroMQ completion."""

    PENDING = 0  # never sent; the value of a slot header nobody completed yet
    OK = 1
    TIMEOUT = 2  # deadline passed; the completion names the ducks that did not answer
    DUCK_LOST = 3  # a targeted duck is known dead
    STALE_EPOCH = 4  # submitted under an epoch the dataplane has left
    CANCELLED = 5
    DATAPLANE_ERROR = 6
    BAD_REQUEST = 7  # descriptor refused (unknown layer, wrong shape, bad target set...)


class MlpKind(_NamedIntEnum):
    GELU = 1  # BERT: gelu(x @ w_up + b_up) @ w_down (+ b_down once, after the reduce)
    SWIGLU = 2  # Qwen: (silu(x @ w_gate) * (x @ w_up)) @ w_down
    #: a mixture-of-experts layer: each duck's shard is a SwiGLU "bank" whose FFN columns
    #: are its routed experts' (ascending by expert id, expert_ffn columns each), then its
    #: columns of the shared expert, if the layer has one (LoadWeights, docs/protocols.md)
    MOE = 3


class DescFlag(enum.IntFlag):
    """Bits of a descriptor's ``flags``."""

    #: FORWARD on a MOE layer: a host routing table (schema/routing.py) follows the
    #: activation in the activation slot, at align(nbytes, 64)
    ROUTED = 1
    #: ROUTED: send the activation once per NIC with the whole table (target set), or
    #: only each routed duck's rows to it; neither bit: the dataplane chooses per forward
    #: by the bytes each would put on the wire (both bits: refused)
    MOE_BROADCAST = 2
    MOE_UNICAST = 4


class TensorDim(enum.IntEnum):
    """One dimension of a shard tensor, in ``TENSOR_SHAPES``."""

    ONE = 0  # no such dimension
    HIDDEN = 1
    FFN = 2  # the FFN columns of this duck's shard


SHARD_TENSORS = 3  # tensors per duck's shard, indices 0..SHARD_TENSORS-1
#: The tensor index of b_down, which the host keeps (chunks name duck HOST_TENSOR_DUCK) and
#: adds once, after the reduce: the index after the shard's tensors.
B_DOWN_TENSOR = SHARD_TENSORS

#: The tensors of a duck's shard by kind and index (a WEIGHT_CHUNK's ``tensor``), as
#: [rows, columns]. The dataplane (dp_tensor_elems in dp_abi.h), the duck emulator,
#: the mock and duckpipe.client.models all size tensors from this one table.
TENSOR_SHAPES: dict[MlpKind, tuple[tuple[TensorDim, TensorDim], ...]] = {
    MlpKind.GELU: (
        (TensorDim.HIDDEN, TensorDim.FFN),  # w_up
        (TensorDim.FFN, TensorDim.ONE),  # b_up
        (TensorDim.FFN, TensorDim.HIDDEN),  # w_down
    ),
    MlpKind.SWIGLU: (
        (TensorDim.HIDDEN, TensorDim.FFN),  # w_gate
        (TensorDim.HIDDEN, TensorDim.FFN),  # w_up
        (TensorDim.FFN, TensorDim.HIDDEN),  # w_down
    ),
    MlpKind.MOE: (  # the duck's bank: SwiGLU tensors over all its columns
        (TensorDim.HIDDEN, TensorDim.FFN),  # w_gate
        (TensorDim.HIDDEN, TensorDim.FFN),  # w_up
        (TensorDim.FFN, TensorDim.HIDDEN),  # w_down
    ),
}
TENSOR_NAMES: dict[MlpKind, tuple[str, ...]] = {
    MlpKind.GELU: ("w_up", "b_up", "w_down"),
    MlpKind.SWIGLU: ("w_gate", "w_up", "w_down"),
    MlpKind.MOE: ("w_gate", "w_up", "w_down"),
}


def tensor_shape(kind: int, t: int, hidden: int, ffn: int) -> tuple[int, ...]:
    """The numpy shape of shard tensor ``t`` of ``kind`` (a vector for [n, ONE])."""
    size = {TensorDim.HIDDEN: hidden, TensorDim.FFN: ffn}
    return tuple(size[d] for d in TENSOR_SHAPES[MlpKind(kind)][t] if d != TensorDim.ONE)


class SegHeader(msgspec.Struct, frozen=True):
    """Segment header. Line 0-1 and the name: written once by the creating client
    before it publishes ``magic`` (release). Line 2: client only. Line 3: dataplane only."""

    __c_name__: ClassVar[str] = "dp_seg_header"
    __c_size__: ClassVar[int] = 384
    __field_docs__: ClassVar[dict[str, str]] = {
        "magic": "SEG_MAGIC, stored last with release: a reader that sees it sees the rest",
        "header_size": "sizeof(struct dp_seg_header)",
        "page_size": "page size of the backing (2 MiB hugetlbfs, 4 KiB /dev/shm)",
        "start_ns": "CLOCK_REALTIME at creation; with creator_pid, tells a reused pid apart",
        "ring_capacity": "descriptors in the ring, a power of two",
        "client_heartbeat_ns": "CLOCK_MONOTONIC, refreshed by the client while it lives",
        "dataplane_heartbeat_ns": "CLOCK_MONOTONIC, refreshed by the dataplane while attached",
        "client_id": "assigned by the dataplane at attach",
        "detach_reason": "enum dp_detach_reason: set once when the dataplane drops the client",
        "need_wakeup": "1 while the dataplane is parked (or about to be): ring the doorbell "
        "after advancing head (io_uring's IORING_SQ_NEED_WAKEUP)",
        "completions_wanted": "client: nonzero while a thread waits for a ZeroMQ completion "
        "(timings, duck lists): the dataplane sends its completion outbox at once rather "
        "than after completion_flush_us; set, then ring the doorbell if need_wakeup (the "
        "phase times in the slot header need neither)",
        "name": "the segment's own name, for inspectors",
    }

    # line 0: identity (creator, once)
    magic: U64
    abi_major: U16
    abi_minor: U16
    backing: U8
    pad0: Pad(3)
    header_size: U32
    page_size: U32
    segment_size: U64
    creator_pid: U32
    flags: U32
    start_ns: U64
    pad1: Pad(16)
    # line 1: region layout (creator, once)
    ring_offset: U64
    ring_capacity: U32
    desc_size: U32
    res_hdr_offset: U64
    act_offset: U64
    res_offset: U64
    act_slot_size: U64
    res_slot_size: U64
    slot_count: U32
    pad2: Pad(4)
    # line 2: client-written
    client_heartbeat_ns: U64
    completions_wanted: U32
    pad3: Pad(52)
    # line 3: dataplane-written
    dataplane_heartbeat_ns: U64
    dataplane_pid: U32
    client_id: U32
    detach_reason: U32
    need_wakeup: U32
    pad4: Pad(40)
    # lines 4-5: name (creator, once)
    name: Chars(128)


class RingHeader(msgspec.Struct, frozen=True):
    """SPSC ring indices, free-running 64-bit, masked only on access.
    ``head``: producer (client) writes, release. ``tail``: consumer (dataplane) writes, release."""

    __c_name__: ClassVar[str] = "dp_ring_header"
    __c_size__: ClassVar[int] = 128

    head: U64
    pad0: Pad(56)
    tail: U64
    pad1: Pad(56)


class Desc(msgspec.Struct, frozen=True):
    """Submission descriptor, written by the client into the ring before it
    advances ``head``; read by the dataplane after it loads ``head``."""

    __c_name__: ClassVar[str] = "dp_desc"
    __c_size__: ClassVar[int] = 128
    __field_docs__: ClassVar[dict[str, str]] = {
        "forward_id": "unique per client, never reused",
        "submit_ns": "CLOCK_MONOTONIC when the client submitted",
        "nbytes": "bytes of the activation (FORWARD) or of this chunk (WEIGHT_CHUNK)",
        "offset": "WEIGHT_CHUNK: byte offset of the chunk in its tensor",
        "timeout_us": "deadline after pickup; 0 means the dataplane's default",
        "op": "enum dp_op",
        "dtype": "enum dp_dtype",
        "shape": "FORWARD: activation shape, ndim entries used",
        "duck": "WEIGHT_CHUNK: the duck whose shard this is",
        "tensor": "WEIGHT_CHUNK: index of the tensor in the layer's kind",
        "flags": "enum dp_desc_flag bits (ROUTED: a MoE forward)",
        "ducks": "target set bitmap; all zero means every duck holding the layer "
        "(ROUTED: must be all zero; the routing says which ducks)",
    }

    forward_id: U64
    submit_ns: U64
    epoch: U64
    nbytes: U64
    offset: U64
    slot: U32
    generation: U32
    layer: U32
    flags: U32
    timeout_us: U32
    op: U16
    dtype: U8
    ndim: U8
    shape: Array("uint32_t", MAX_DIMS)
    duck: U16
    tensor: U16
    reserved: U32
    ducks: Array("uint64_t", MAX_DUCKS // 64)
    pad0: Pad(8)


class SlotHeader(msgspec.Struct, frozen=True):
    """Per-slot completion, written by the dataplane (``waiters`` by the client).
    It fills every other field first, line 1 (the forward's phase times) included, then
    stores ``done = generation << 32 | status`` (release), then wakes the futex on done's
    high half if ``waiters`` says one sleeps: a client that sees its generation in done
    sees the phases of that forward. Line 1 holds what the ZeroMQ Completion's Timings
    holds, the duck list folded into its max and sum (Phases in schema/control.py)."""

    __c_name__: ClassVar[str] = "dp_slot_header"
    __c_size__: ClassVar[int] = 128
    __field_docs__: ClassVar[dict[str, str]] = {
        "done": "generation << 32 | status; the high half (little-endian: bytes 4-7) is "
        "the futex a waiting client sleeps on",
        "waiters": "client: nonzero while a thread sleeps on done (a hint: the dataplane "
        "calls futex_wake only then)",
        "prepare_ns": "submit -> picked up by the dataplane (Timings.prepare_ns)",
        "send_ns": "the slowest NIC's sends (Timings.send_ns)",
        "wait_ns": "first send -> last partial in, the longest NIC's (Timings.wait_ns)",
        "fetch_ns": "handling the partials' datagrams, every NIC's (Timings.fetch_ns)",
        "reduce_ns": "the NICs' sums, bias and store into the result slot; 0 unless OK",
        "spread_ns": "first duck complete -> last duck complete (Timings.spread_ns)",
        "duck_compute_max_ns": "the largest compute_ns of the ducks that answered",
        "duck_compute_sum_ns": "the compute_ns of the ducks that answered, added up",
    }

    # line 0: the done word and what result() needs
    done: U64
    forward_id: U64
    epoch: U64
    nbytes: U64
    answered: U32
    missing: U32
    waiters: U32
    pad0: Pad(20)
    # line 1: the forward's phase times, nanoseconds (dataplane, before done)
    prepare_ns: U64
    send_ns: U64
    wait_ns: U64
    fetch_ns: U64
    reduce_ns: U64
    spread_ns: U64
    duck_compute_max_ns: U64
    duck_compute_sum_ns: U64


LAYOUTS = (SegHeader, RingHeader, Desc, SlotHeader)

CONSTANTS: dict[str, int] = {
    "ABI_MAJOR": ABI_MAJOR,
    "ABI_MINOR": ABI_MINOR,
    "SEG_MAGIC": SEG_MAGIC,
    "MAX_DUCKS": MAX_DUCKS,
    "EMULATOR_MAX_DUCKS": EMULATOR_MAX_DUCKS,
    "MAX_DIMS": MAX_DIMS,
    "MAX_CLIENTS": MAX_CLIENTS,
    "MAX_NICS": MAX_NICS,
    "LAYER_TABLE": LAYER_TABLE,
    "MOE_LAYER_STATE_BYTES": MOE_LAYER_STATE_BYTES,
    "SHARD_TENSORS": SHARD_TENSORS,
    "B_DOWN_TENSOR": B_DOWN_TENSOR,
    "FP8_BLOCK": FP8_BLOCK,
}
