"""Control messages between clients and the dataplane, carried as msgpack over ZeroMQ.

A client's DEALER talks to the dataplane's ROUTER. Every request carries a
``req_id`` the reply echoes; completions arrive unasked on the same socket.
Tensors never ride here: only commands and completions. Evolution is
append-only with defaults, so an older peer still decodes a newer message.
"""

from __future__ import annotations

import contextlib
import enum
from typing import Annotated

import msgspec
from msgspec import Meta

from .abi import MAX_DUCKS, MAX_NICS, DType, MlpKind
from .routing import MAX_EXPERTS, MAX_REPLICAS

__all__ = [
    "HOST_TENSOR_DUCK",
    "MAX_MESSAGE_BYTES",
    "MAX_NESTING",
    "MAX_XSTATS",
    "NO_DOORBELL",
    "PRINTABLE_ASCII",
    "PROTOCOL_VERSION",
    "XSTAT_NAME_MAX",
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
    "ErrorCode",
    "GetLayers",
    "GetStats",
    "GetTopology",
    "Heartbeat",
    "LayerInfo",
    "Layers",
    "LoadWeights",
    "MoveLayer",
    "NicInfo",
    "NicStats",
    "Phases",
    "RepairLayer",
    "Request",
    "SetEpoch",
    "SetFaults",
    "Shutdown",
    "Stats",
    "Timings",
    "Topology",
    "UnloadLayer",
    "encoder",
    "reply_decoder",
    "request_decoder",
]

#: 2: Error.code became an ErrorCode (an integer); LoadWeights.shared; UnloadLayer.
#: 3: the dataplane parks: a client rings Attached.doorbell when need_wakeup is set.
#: 4: the doorbell is the client's own pipe (Attach.doorbell_fd): no other user can ring it.
#: 5: RepairLayer: restream the banks of the ducks that lost a committed layer, not all of it.
#: 6: MoveLayer: a committed MOE layer moves to a new placement, only the changed banks sent.
PROTOCOL_VERSION = 6
#: Attach.doorbell_fd of a client without a doorbell pipe: never a descriptor (above any
#: RLIMIT_NOFILE the kernel allows), and control integers are unsigned.
NO_DOORBELL = 0x7FFF_FFFF
#: ``duck`` of a WEIGHT_CHUNK the dataplane keeps itself (b_down: added once, after the reduce).
HOST_TENSOR_DUCK = 0xFFFF

#: Longest control message either dataplane reads; longer ones are refused unread.
MAX_MESSAGE_BYTES = 1 << 16
#: Deepest nesting of maps and arrays a request may have (a request map holding a list is 2).
MAX_NESTING = 8
#: A port's extended statistics one Stats reply carries per NIC, at most (the non-zero ones,
#: in the driver's order; NicStats.xstats_left_out counts the rest). 8 NICs x 64 names of
#: 63 bytes and their values stay well inside MAX_MESSAGE_BYTES.
MAX_XSTATS = 64
#: Longest xstat name sent (DPDK's RTE_ETH_XSTATS_NAME_SIZE, 64, less the NUL).
XSTAT_NAME_MAX = 63

NonNeg = Annotated[int, Meta(ge=0)]  # a u64 on the C side
U32 = Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)]
DuckId = Annotated[int, Meta(ge=0, lt=MAX_DUCKS)]
#: What a client-chosen string may hold: printable ASCII, 0x20-0x7e. A client's name and
#: segment name reach the admin's terminal (duckpipe-top, ``duckpipe stats``, the logs):
#: no escape sequence, control character or Unicode trick gets in (issue 17). Both
#: dataplanes refuse anything else at decode with BAD_REQUEST (tools/codegen/ctlgen.py:
#: check_printable).
PRINTABLE_ASCII = r"\A[ -~]*\Z"  # \A, \Z: "$" would let a final newline through
Name = Annotated[str, Meta(max_length=63, pattern=PRINTABLE_ASCII)]
Path = Annotated[str, Meta(max_length=255, pattern=PRINTABLE_ASCII)]


class ErrorCode(enum.IntEnum):
    """Why the dataplane refused a control request (Error.code)."""

    BAD_MESSAGE = 1  # not a msgpack map with a known 'type' and a 'req_id'
    BAD_REQUEST = 2  # a field has the wrong type or is out of the schema's range
    ABI_MISMATCH = 3  # another protocol or ABI major version
    BAD_SEGMENT = 4  # the segment cannot be mapped, or is not the sender's
    ALREADY_ATTACHED = 5  # this socket is attached already
    TOO_MANY_CLIENTS = 6  # every client slot is taken
    TOO_MANY_LAYERS = 7  # the layer table is full
    UNKNOWN_LAYER = 8  # no such layer (or not one this client may use)
    UNSUPPORTED = 9  # this dataplane does not implement the request
    NOT_PERMITTED = 10  # the sender's role does not allow it (admin only, another's layer)
    QUOTA_EXCEEDED = 11  # the client's layers or weight bytes would pass its quota
    NOT_ATTACHED = 12  # the request needs an attached client
    DATAPLANE_ERROR = 13  # the dataplane failed (out of memory...)
    NO_CREDENTIALS = 14  # the peer's uid/gid/pid could not be read
    DUCKS_UNREACHABLE = 15  # LoadWeights names ducks silent for 3 pings: nothing was sent


class Message(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    pass


class Request(Message, kw_only=True):
    req_id: NonNeg


# --- requests (client -> dataplane) -------------------------------------------


class Attach(Request, kw_only=True):
    """Map my segment and start polling its ring.

    ``segment_fd`` is the number of the segment's sealed memfd in the client
    process; the dataplane takes it from the process that connected (pidfd_getfd),
    and refuses once that process has exited. ``segment``
    is only its name, for people. ``doorbell_fd`` is the read end of an anonymous
    pipe the client made, taken the same way: after advancing head, the client
    writes one byte to the write end if need_wakeup is set (dp_wake.h)."""

    protocol: U32 = PROTOCOL_VERSION
    abi_major: U32
    pid: U32  # must be the sender's own pid (the dataplane reads it from the socket)
    segment: Path
    name: Name = ""
    segment_fd: Annotated[int, Meta(ge=0, le=0x7FFF_FFFF)]
    # NO_DOORBELL: none (a client before protocol 4); the C dataplane refuses that (the mock
    # never parks)
    doorbell_fd: Annotated[int, Meta(ge=0, le=NO_DOORBELL)] = NO_DOORBELL


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
    3 b_down [hidden] (duck HOST_TENSOR_DUCK); SWIGLU and MOE 0 w_gate, 1 w_up, 2 w_down.

    MOE (a mixture of experts): routed expert ``e`` lives on the ducks
    ``expert_ducks[sum(expert_replicas[:e]) :][: expert_replicas[e]]``, each one of
    ``ducks``; a duck's shard is its bank: the ``expert_ffn`` columns of each of its
    experts, ascending by expert id, then its columns of the shared expert, so that
    ``shard_sizes[i] - experts_on(ducks[i]) * expert_ffn`` is its shared columns: at
    least 1 on each duck of ``shared_ducks`` (the shared expert's set: distinct ducks of
    ``ducks``) and 0 on every other; ``shared_ducks`` is empty exactly when the layer has
    no shared expert. A routed forward reaches its tokens' routed ducks and the shared
    set, no other duck. ``ffn`` is the sum of ``shard_sizes``, as for the dense kinds.
    """

    layer: U32
    kind: Annotated[int, Meta(ge=1, le=3)]
    dtype: Annotated[int, Meta(ge=1, le=3)]
    hidden: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)]  # and <= the config's max_hidden
    ffn: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)]  # and <= the config's max_ffn
    ducks: Annotated[list[DuckId], Meta(min_length=1, max_length=MAX_DUCKS)]
    shard_sizes: Annotated[
        list[Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)]], Meta(min_length=1, max_length=MAX_DUCKS)
    ]
    has_b_down: bool = False
    shared: bool = False  # usable by every client; admin only
    # MOE only (empty or 0 for the dense kinds)
    expert_ffn: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = 0
    expert_replicas: Annotated[
        list[Annotated[int, Meta(ge=1, le=MAX_REPLICAS)]], Meta(max_length=MAX_EXPERTS)
    ] = []
    expert_ducks: Annotated[list[DuckId], Meta(max_length=MAX_EXPERTS * MAX_REPLICAS)] = []
    #: 0: the weights are in ``dtype``. DType.F8E4M3 (SWIGLU, MOE): each shard tensor is
    #: its float8 e4m3 bytes then its float32 scale grid (duckpipe/client/fp8.py); the
    #: dense kinds' shards, and a MOE bank's shared-expert columns, are cut between
    #: 128-column blocks (only the last duck's may end in a partial block)
    weight_dtype: Annotated[int, Meta(ge=0, le=4)] = 0
    shared_ducks: Annotated[list[DuckId], Meta(max_length=MAX_DUCKS)] = []
    #: the shared expert's replicas: ``shared_ducks`` cut into consecutive sets of these
    #: sizes, each holding the whole shared expert (its columns sum to the same width on
    #: every set); a forward uses one set whose ducks are all live. Empty: one set
    shared_sets: Annotated[
        list[Annotated[int, Meta(ge=1, le=MAX_DUCKS)]], Meta(max_length=MAX_REPLICAS)
    ] = []


class RepairLayer(Request, kw_only=True):
    """Restream the banks of ``ducks``, which lost committed layer ``layer`` (they
    restarted: LayerInfo.lost), instead of reloading it whole. The layer's owner only; each
    duck must be one of the layer's and lost, no other repair of the layer open. Chunks for
    those ducks follow through the ring as a load's do (WEIGHT_CHUNK, each tensor once, in
    order from byte 0), then a WEIGHT_COMMIT: it completes once they are acknowledged, and
    only then do the ducks leave ``lost`` (a forward that needs one of them fails DUCK_LOST
    at dispatch meanwhile; forwards on the other ducks go on). A repair whose chunks fail
    leaves the ducks lost and the layer serving on the others."""

    layer: U32
    ducks: Annotated[list[DuckId], Meta(min_length=1, max_length=MAX_DUCKS)]


class MoveLayer(Request, kw_only=True):
    """Move committed MOE layer ``layer`` to a new placement while it serves. The layer's
    owner only; no repair or other move of it open, no duck of it lost. The layer keeps its
    ducks, its shared set and each duck's shared columns; ``expert_replicas`` and
    ``expert_ducks`` are the new placement (as in LoadWeights) and ``shard_sizes`` the new
    bank widths, in the layer's ducks order. Only the ducks whose set of experts changes
    get a new bank: chunks for them follow through the ring (WEIGHT_CHUNK, each tensor
    once, in order from byte 0, sized by the new bank), then a WEIGHT_COMMIT. Until that
    commit every forward uses the old placement on the old banks (a changed duck gets its
    new bank beside the old one: LAYER's bank generation); from it on, forwards
    dispatched use the new one; forwards in flight finish on the old banks
    (docs/architecture.md, "Moving a live layer"). A move whose chunks fail leaves the
    layer serving on the old placement. Refused while the layer the last move replaced
    still has forwards in flight ("still in flight": retry)."""

    layer: U32
    shard_sizes: Annotated[
        list[Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)]], Meta(min_length=1, max_length=MAX_DUCKS)
    ]
    expert_replicas: Annotated[
        list[Annotated[int, Meta(ge=1, le=MAX_REPLICAS)]],
        Meta(min_length=1, max_length=MAX_EXPERTS),
    ]
    expert_ducks: Annotated[list[DuckId], Meta(min_length=1, max_length=MAX_EXPERTS * MAX_REPLICAS)]
    # the ducks whose new banks follow: at least those whose experts change, and every duck
    # a failed move of the layer gave a bank (it holds a stale one of the generation this
    # move takes); empty: exactly the changed ones
    ducks: Annotated[list[DuckId], Meta(max_length=MAX_DUCKS)] = []


class UnloadLayer(Request, kw_only=True):
    """Free a layer: its owner or the admin. Forwards in flight on it finish first."""

    layer: U32


class SetEpoch(Request, kw_only=True):
    """Move to a new epoch (``epoch`` None: the next one). In-flight forwards of
    older epochs complete STALE_EPOCH."""

    epoch: NonNeg | None = None


class GetStats(Request, kw_only=True):
    pass


class SetFaults(Request, kw_only=True):
    """Fault injection for tests; a dataplane that has none answers Error."""

    delay_ms: Annotated[float, Meta(ge=0, le=3_600_000)] = 0.0
    dead_ducks: Annotated[list[DuckId], Meta(max_length=MAX_DUCKS)] = []
    crash_after: NonNeg | None = None
    # the mock's: these ducks restart now and forget every layer, as the duck emulator's
    # --restart-after does (their next forward says NO_LAYER: DUCK_LOST, LayerInfo.lost)
    restarted_ducks: Annotated[list[DuckId], Meta(max_length=MAX_DUCKS)] = []
    # the mock's: these ducks stop answering without being known lost (as a stopped duck
    # emulator within duck_lost_ms): a routed forward fails their rows over to another
    # replica at the failover deadline (docs/architecture.md), a dense one times out
    silent_ducks: Annotated[list[DuckId], Meta(max_length=MAX_DUCKS)] = []


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
    # unused since protocol 4, always "" (it was the dataplane's doorbell, an abstract
    # AF_UNIX address every local user could ring: the doorbell is now Attach.doorbell_fd)
    doorbell: str = ""
    # the longest deadline a forward may ask for (the topology's max_timeout_us): connect
    # refuses a forward_timeout above it. 0: a dataplane that does not say
    max_timeout_us: int = 0


class Ack(Message, kw_only=True):
    req_id: NonNeg


class Error(Message, kw_only=True):
    req_id: NonNeg
    code: ErrorCode
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


#: LayerInfo's fields shown by name in its repr
_LAYER_ENUMS: dict[str, type[enum.IntEnum]] = {"kind": MlpKind, "dtype": DType}


class LayerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A layer as GetLayers lists it, to its owner, the admin, and (a ``shared`` one)
    every client. A MOE layer also carries its routing view: ``expert_ffn``, the placement
    ``expert_replicas``/``expert_ducks`` as LoadWeights gave it (``len(expert_replicas)``
    routed experts) and ``shared_ducks``, the ducks whose bank holds columns of the shared
    expert (empty: none); so any permitted client, not only the loader, checks a routing
    and routes on it. A token takes 1..min(MAX_TOPK (16), experts) experts: no per-layer limit.
    These four are empty or 0 for the dense kinds and from a dataplane that predates them
    (a client then routes only on layers it loaded)."""

    layer: int
    kind: int
    dtype: int
    hidden: int
    ffn: int
    ducks: list[DuckId]
    shard_sizes: list[U32]
    has_b_down: bool
    # committed, and every duck of it still holds it (none is in ``lost``)
    ready: bool
    # the load failed (a chunk was not acknowledged, or the commit found it incomplete):
    # the layer stays unusable until a new LoadWeights of the same id replaces it
    failed: bool = False
    missing: list[DuckId] = []  # the ducks that did not acknowledge their weights
    # ducks that answered a forward that they hold no such layer since it was committed
    # (they restarted): not ready on them; forwards to them fail DuckLost until a repair
    # (RepairLayer, Client.repair) or a reload, forwards to the others (ducks=[...]) still work
    lost: list[DuckId] = []
    # who may forward on it: the loader (its client id; 0 from a dataplane that does not
    # say), and everyone when it is shared. The admin sees every client's layers, yet may
    # use only its own and shared ones: the client refuses the others up front
    owner: int = 0
    shared: bool = False
    # MOE only (empty or 0 for the dense kinds, and from a dataplane that does not say):
    # what a client that did not load the layer needs to route on it. The placement as
    # LoadWeights gave it (expert e on expert_ducks[sum(expert_replicas[:e]):][:replicas[e]],
    # len(expert_replicas) routed experts), and the ducks whose bank holds columns of the
    # shared expert (empty: the layer has none)
    expert_ffn: int = 0
    expert_replicas: list[Annotated[int, Meta(ge=1, le=MAX_REPLICAS)]] = []
    expert_ducks: list[DuckId] = []
    shared_ducks: list[DuckId] = []
    # the shared expert's sets (LoadWeights.shared_sets): shared_ducks in consecutive
    # runs of these sizes; empty: one set
    shared_sets: list[U32] = []

    def __repr__(self) -> str:
        # kind and dtype by name (MlpKind.MOE, DType.F32): the numbers are the wire's;
        # a value this client does not know stays a number
        fields = []
        for f in self.__struct_fields__:
            v = getattr(self, f)
            if f in _LAYER_ENUMS:
                with contextlib.suppress(ValueError):
                    v = _LAYER_ENUMS[f](v)
            fields.append(f"{f}={v!s}" if isinstance(v, enum.Enum) else f"{f}={v!r}")
        return f"LayerInfo({', '.join(fields)})"


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


XstatName = Annotated[str, Meta(max_length=XSTAT_NAME_MAX)]


class NicStats(msgspec.Struct, frozen=True, kw_only=True):
    """One NIC as Stats sees it. ``xstats``: the DPDK port's extended statistics (its
    driver's own counters: rx_good_packets, tx_good_bytes, rx_missed_errors...), the
    non-zero ones; empty for a backend without a port (socket, null, mock)."""

    name: str
    backend: str
    xstats: Annotated[dict[XstatName, NonNeg], Meta(max_length=MAX_XSTATS)] = {}
    xstats_left_out: NonNeg = 0  # non-zero xstats past MAX_XSTATS, not sent


class Stats(Message, kw_only=True):
    req_id: NonNeg
    mode: str
    epoch: int
    counters: dict[str, int]
    clients: list[ClientStats]
    nics: Annotated[list[NicStats], Meta(max_length=MAX_NICS)] = []  # in the topology's order


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Per-phase nanoseconds of one forward, as the dataplane measured them. The slot
    header's second line carries the same numbers (``Phases``), without ZeroMQ."""

    prepare_ns: int = 0  # submit -> picked up by the dataplane
    send_ns: int = 0  # activation out to the ducks
    wait_ns: int = 0  # first send -> last partial in (so it overlaps send_ns)
    fetch_ns: int = 0  # partials reassembled
    reduce_ns: int = 0  # partials summed into the result slot
    spread_ns: int = 0  # first duck reply -> last duck reply
    duck_compute_ns: list[int] = []  # each answering duck's own compute time, as ``answered``


class Phases(msgspec.Struct, frozen=True):
    """Per-phase nanoseconds of one forward, read from its slot header (line 1 of
    ``SlotHeader``, in this order) once the forward is done: no ZeroMQ. The same numbers
    as its Completion's Timings, the per-duck compute folded into its max and sum
    (``Phases.of(timings)``). Fields may be given by position, in the slot's order."""

    prepare_ns: int = 0  # submit -> picked up by the dataplane
    send_ns: int = 0  # activation out to the ducks (the slowest NIC's)
    wait_ns: int = 0  # first send -> last partial in (so it overlaps send_ns)
    fetch_ns: int = 0  # partials' datagrams handled
    reduce_ns: int = 0  # partials summed into the result slot (0 unless the forward is OK)
    spread_ns: int = 0  # first duck reply -> last duck reply
    duck_compute_max_ns: int = 0  # the slowest answering duck's own compute time
    duck_compute_sum_ns: int = 0  # every answering duck's compute time, added up

    @classmethod
    def of(cls, t: Timings) -> Phases:
        """What a slot header holds for the forward whose Completion carried ``t``."""
        return cls(
            t.prepare_ns,
            t.send_ns,
            t.wait_ns,
            t.fetch_ns,
            t.reduce_ns,
            t.spread_ns,
            max(t.duck_compute_ns, default=0),
            sum(t.duck_compute_ns),
        )


class Completion(Message, kw_only=True):
    """Exactly one per submitted descriptor."""

    forward_id: int
    slot: int
    generation: int
    epoch: int
    status: int
    answered: list[DuckId] = []
    missing: list[DuckId] = []
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
    | UnloadLayer
    | SetEpoch
    | GetStats
    | SetFaults
    | Shutdown
    | RepairLayer
    | MoveLayer
)
AnyReply = Attached | Ack | Error | Topology | Layers | EpochChanged | Stats | Completion

encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(AnyRequest)
reply_decoder = msgspec.msgpack.Decoder(AnyReply)
