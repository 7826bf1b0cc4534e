"""Control messages between clients and the dataplane, carried as msgpack over ZeroMQ.

A client's DEALER talks to the dataplane's ROUTER. Every request carries a
``req_id`` the reply echoes; completions arrive unasked on the same socket.
Tensors never ride here: only commands and completions. Evolution is
append-only with defaults, so an older peer still decodes a newer message.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "HOST_TENSOR_DUCK",
    "PROTOCOL_VERSION",
    "Ack",
    "AnyReply",
    "AnyRequest",
    "Attach",
    "Attached",
    "ClientStats",
    "Completion",
    "Detach",
    "DuckInfo",
    "EpochChanged",
    "Error",
    "GetLayers",
    "GetStats",
    "GetTopology",
    "Heartbeat",
    "LayerInfo",
    "Layers",
    "LoadWeights",
    "NicInfo",
    "Request",
    "SetEpoch",
    "SetFaults",
    "Shutdown",
    "Stats",
    "Timings",
    "Topology",
    "encoder",
    "reply_decoder",
    "request_decoder",
]

PROTOCOL_VERSION = 1
#: ``duck`` of a WEIGHT_CHUNK the dataplane keeps itself (b_down: added once, after the reduce).
HOST_TENSOR_DUCK = 0xFFFF

NonNeg = Annotated[int, Meta(ge=0)]
U32 = Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)]
DuckId = Annotated[int, Meta(ge=0, lt=256)]


class Message(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    pass


class Request(Message, kw_only=True):
    req_id: NonNeg


# --- requests (client -> dataplane) -------------------------------------------


class Attach(Request, kw_only=True):
    """Map my segment and start polling its ring.

    ``segment_fd`` is the number of the segment's sealed memfd in the client
    process; the dataplane opens it as /proc/<pid>/fd/<segment_fd>. ``segment``
    is only its name, for people."""

    protocol: int = PROTOCOL_VERSION
    abi_major: int
    pid: int
    segment: str
    name: str = ""
    segment_fd: int = -1


class Detach(Request, kw_only=True):
    """Stop polling my ring and unmap my segment."""


class Heartbeat(Request, kw_only=True):
    pass


class GetTopology(Request, kw_only=True):
    pass


class GetLayers(Request, kw_only=True):
    pass


class LoadWeights(Request, kw_only=True):
    """Announce a layer's shard plan; chunks follow through the ring, then a WEIGHT_COMMIT.

    ``shard_sizes[i]`` is how many FFN columns duck ``ducks[i]`` holds.
    Tensor indices: GELU 0 w_up [hidden, f], 1 b_up [f], 2 w_down [f, hidden],
    3 b_down [hidden] (duck HOST_TENSOR_DUCK); SWIGLU 0 w_gate, 1 w_up, 2 w_down.
    """

    layer: U32
    kind: Annotated[int, Meta(ge=1, le=2)]
    dtype: Annotated[int, Meta(ge=1, le=2)]
    hidden: Annotated[int, Meta(ge=1)]
    ffn: Annotated[int, Meta(ge=1)]
    ducks: list[DuckId]
    shard_sizes: list[Annotated[int, Meta(ge=1)]]
    has_b_down: bool = False


class SetEpoch(Request, kw_only=True):
    """Move to a new epoch (``epoch`` None: the next one). In-flight forwards of
    older epochs complete STALE_EPOCH."""

    epoch: NonNeg | None = None


class GetStats(Request, kw_only=True):
    pass


class SetFaults(Request, kw_only=True):
    """Fault injection for tests; a dataplane that has none answers Error."""

    delay_ms: Annotated[float, Meta(ge=0)] = 0.0
    dead_ducks: list[DuckId] = []
    crash_after: NonNeg | None = None


class Shutdown(Request, kw_only=True):
    pass


# --- replies (dataplane -> client) --------------------------------------------


class Attached(Message, kw_only=True):
    req_id: NonNeg
    client_id: int
    epoch: int
    session: int
    dataplane_pid: int
    mode: str
    ducks: int
    default_timeout_us: int
    max_forward_bytes: int = 0  # largest activation or weight chunk; 0: no limit


class Ack(Message, kw_only=True):
    req_id: NonNeg


class Error(Message, kw_only=True):
    req_id: NonNeg
    code: str
    message: str


class NicInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    backend: str
    address: str = ""
    broadcast: str = ""


class DuckInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: DuckId
    nic: str
    address: str = ""
    port: int = 0
    alive: bool = True


class Topology(Message, kw_only=True):
    req_id: NonNeg
    nics: list[NicInfo]
    ducks: list[DuckInfo]


class LayerInfo(msgspec.Struct, frozen=True, kw_only=True):
    layer: int
    kind: int
    dtype: int
    hidden: int
    ffn: int
    ducks: list[int]
    shard_sizes: list[int]
    has_b_down: bool
    ready: bool


class Layers(Message, kw_only=True):
    req_id: NonNeg
    layers: list[LayerInfo]


class EpochChanged(Message, kw_only=True):
    req_id: NonNeg
    epoch: int


class ClientStats(msgspec.Struct, frozen=True, kw_only=True):
    client_id: int
    pid: int
    name: str
    segment: str
    submitted: int
    completed: int


class Stats(Message, kw_only=True):
    req_id: NonNeg
    mode: str
    epoch: int
    counters: dict[str, int]
    clients: list[ClientStats]


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Per-phase nanoseconds of one forward, as the dataplane measured them."""

    prepare_ns: int = 0  # submit -> picked up by the dataplane
    send_ns: int = 0  # activation out to the ducks
    wait_ns: int = 0  # first send -> last partial in
    fetch_ns: int = 0  # partials reassembled
    reduce_ns: int = 0  # partials summed into the result slot
    spread_ns: int = 0  # first duck reply -> last duck reply
    duck_compute_ns: list[int] = []  # each answering duck's own compute time, as ``answered``


class Completion(Message, kw_only=True):
    """Exactly one per submitted descriptor."""

    forward_id: int
    slot: int
    generation: int
    epoch: int
    status: int
    answered: list[int] = []
    missing: list[int] = []
    timings: Timings = Timings()
    message: str = ""
    current_epoch: int = 0  # the dataplane's epoch now; tells a STALE_EPOCH client where to go


AnyRequest = (
    Attach
    | Detach
    | Heartbeat
    | GetTopology
    | GetLayers
    | LoadWeights
    | SetEpoch
    | GetStats
    | SetFaults
    | Shutdown
)
AnyReply = Attached | Ack | Error | Topology | Layers | EpochChanged | Stats | Completion

encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(AnyRequest)
reply_decoder = msgspec.msgpack.Decoder(AnyReply)
