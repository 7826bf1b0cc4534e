"""The stats segment: a dataplane's counters and histograms, read without a lock or a message.

Modelled on Aeron's counters file (AeronStat reads it): a versioned header with the
writer's pid, start time and a heartbeat, then regions of single-writer counters,
each on its own cache lines. The dataplane (C or mock) creates the file next to its
control socket (``ipc://<dir>/control`` -> ``<dir>/stats``), mode 0600, and writes
it through a shared mapping with relaxed 64-bit stores; readers (``duckpipe stats``,
``duckpipe-top``, ``duckpipe exporter``) map it read-only. ``tools/gen_abi.py``
writes ``dataplane/include/gen/dp_stats_abi.h`` and ``schemas/stats.json`` from here.

The segment::

    offset 0            +--------------------------------------+
                        | dp_stats_header     (5 cache lines)  |
    names_offset        +--------------------------------------+
                        | dp_stats_name[STATS_MAX_COUNTERS]    |
    agents_offset       +--------------------------------------+
                        | dp_stats_agent[STATS_MAX_AGENTS]     |
                        |   one per agent: its own counters    |
    clients_offset      +--------------------------------------+
                        | dp_stats_client[MAX_CLIENTS]         |
    nics_offset         +--------------------------------------+
                        | dp_stats_nic[STATS_MAX_NICS]         |
    ducks_offset        +--------------------------------------+
                        | dp_stats_duck[MAX_DUCKS] (+ reply    |
                        |   time histogram each)               |
    bounds_offset       +--------------------------------------+
                        | dp_stats_bounds: histogram buckets   |
    hists_offset        +--------------------------------------+
                        | dp_stats_hist[STATS_NHISTS] latency  |
    moe_offset          +--------------------------------------+
                        | dp_stats_moe: untracked MoE load     |
                        | dp_stats_moe_layer[STATS_MOE_LAYERS] |
                        |   per MoE layer: each expert's and   |
                        |   each duck's load, its placement    |
    segment_size        +--------------------------------------+

Every histogram has STATS_BUCKETS log-spaced buckets (two per octave from 256 ns: 2**k
and 1.5 * 2**k; the upper bounds are in the segment, the last is 2**63-1); counts are
cumulative since the dataplane started, so a reader differences two snapshots.

The MoE region (issue 30 point 4) shows where a mixture-of-experts layer's tokens go: per
layer, each expert's tokens (a token counts once per expert it chose; a -1 choice counts
in ``no_expert``; an expert's replicas share its count) and each duck's (token, expert)
rows, as running totals since the dataplane started and as the last complete *recent
window* of about STATS_MOE_WINDOW_NS: ``expert_recent[e] / window_ns`` is a rate, and
``max / mean`` of ``duck_recent`` over the layer's ducks its recent imbalance. The writer
rewrites a window's numbers and a slot's identity and placement between two stores of
``seq`` (odd while it writes, the next even value after): a reader copies a slot between
two reads of the same even ``seq`` (a seqlock; the running totals only grow and need no
retry). STATS_MOE_LAYERS slots, taken by the first routed forward of a layer; a layer
unloaded keeps its slot (state GONE) until another layer needs one; the forwards of
layers past the table are counted in ``dp_stats_moe.untracked_*``, which the readers show.
"""

from __future__ import annotations

import enum
from typing import ClassVar, NamedTuple

import msgspec

from .abi import MAX_CLIENTS, MAX_DUCKS, MAX_NICS
from .layout import U16, U32, U64, Array, Chars, Pad
from .routing import MAX_EXPERTS, MAX_REPLICAS

__all__ = [
    "CONSTANTS",
    "COUNTERS",
    "COUNTER_NAMES",
    "DROP_COUNTERS",
    "HIST_NAMES",
    "LAYOUTS",
    "STATS_BUCKETS",
    "STATS_MAGIC",
    "STATS_MAX_AGENTS",
    "STATS_MAX_COUNTERS",
    "STATS_MAX_NICS",
    "STATS_MOE_LAYERS",
    "STATS_MOE_WINDOW_NS",
    "STATS_NHISTS",
    "STATS_VERSION_MAJOR",
    "STATS_VERSION_MINOR",
    "Counter",
    "DuckReason",
    "DuckState",
    "LinkState",
    "MoeLayerState",
    "StatsAgent",
    "StatsBounds",
    "StatsClient",
    "StatsClientState",
    "StatsDuck",
    "StatsHeader",
    "StatsHist",
    "StatsMoe",
    "StatsMoeLayer",
    "StatsName",
    "StatsNic",
    "Threads",
    "WriterKind",
    "bucket_bounds",
    "segment_plan",
]

STATS_MAGIC = int.from_bytes(b"DUCKSTAT", "little")
STATS_VERSION_MAJOR = 1
# 1.1: per-duck MoE rows, MoE counters; 1.2: clients' pending, why a duck is lost,
# doorbell_unwatched; 1.3: a NIC's link state and speed, its EAL lcore; the dpdk counters
# of issue 18 (link, the port's drops, flush frames, RX interrupts, bad checksums);
# 1.4: rx_gro_buffers, rx_gro_segments, completion_flushes_wanted; 1.5 (issue 26):
# client_clock_implausible, rx_duck_filters, doorbells_idle, doorbell_rate_limited,
# peers_gone, completions_held, completions_dropped, replies_dropped; 1.6 (issue 30.4): the
# MoE region (moe_offset, moe_layers: each MoE layer's expert and duck load), a duck's
# moe_failovers, and the counters added since 1.5 (moe_no_duck_forwards, moe_copied_bytes,
# parks_expecting)
STATS_VERSION_MINOR = 6
STATS_MAX_COUNTERS = 128  # counter slots per agent (COUNTERS has fewer)
STATS_COUNTER_NAME = 48
STATS_MAX_NICS = MAX_NICS
STATS_MAX_AGENTS = STATS_MAX_NICS + 2  # control, dispatcher, one worker per NIC
STATS_BUCKETS = 56
STATS_FIRST_BOUND_LOG2 = 8  # bucket 0 holds values <= 256 ns
#: The latency histograms, in segment order.
HIST_NAMES = ("end_to_end", "prepare", "send", "wait", "fetch", "reduce", "reply_spread")
STATS_NHISTS = len(HIST_NAMES)


class Counter(NamedTuple):
    """One counter every agent keeps (most stay 0 in most agents)."""

    name: str
    doc: str = ""
    #: a datagram that arrived and was thrown away, or one that could not be sent: what
    #: duckpipe-top sums into a NIC's "drops"
    drop: bool = False


#: Every event a person would ask about, in the order of each agent's counters (the C
#: dataplane's enum dp_counter: DP_COUNTER_LIST in dp_stats_abi.h is generated from this).
#: The mock counts the ones it has events for; readers find a counter by its name, which
#: the stats segment carries.
COUNTERS: tuple[Counter, ...] = (
    Counter("descriptors", "descriptors taken from client rings"),
    Counter("forwards", "forwards started"),
    Counter("forwards_ok"),
    Counter("timeouts", "forwards that hit their deadline"),
    Counter("duck_lost", "forwards failed by a duck without the layer"),
    Counter("stale_epoch", "descriptors from an old epoch"),
    Counter("bad_requests", "descriptors refused"),
    Counter("dataplane_errors"),
    Counter("weight_chunks", "WEIGHT_CHUNK descriptors completed"),
    Counter("weight_bytes"),
    Counter("layers_loaded"),
    Counter("tx_packets"),
    Counter("tx_bytes"),
    Counter("tx_errors", drop=True),
    Counter("gso_sends", "sends the kernel cut into datagrams (UDP_SEGMENT)"),
    Counter("tx_zero_copy", "dpdk: payloads sent from client memory (extbuf chain)"),
    Counter("tx_copied", "dpdk: payloads copied: the port can't chain (af_xdp)"),
    Counter("tx_release_deferred", "parts whose end waited for the port to free their slot"),
    Counter("extmem_registered", "dpdk: client segments registered (rte_extmem_register)"),
    Counter("extmem_registered_bytes"),
    Counter("extmem_unregistered", "dpdk: ... and unregistered at detach"),
    Counter("rx_packets"),
    Counter("rx_bytes"),
    Counter("rx_malformed", "bad magic, version, op or length", drop=True),
    Counter("rx_unknown_sender", "source address not a duck of this NIC", drop=True),
    Counter("rx_bad_session", drop=True),
    Counter("rx_stale_epoch", drop=True),
    Counter("rx_late", "for a forward no longer in flight"),
    Counter("rx_duplicates", "chunks already received"),
    Counter("rxq_overflows", "datagrams the kernel dropped: socket buffer full", drop=True),
    Counter("rx_not_ours", "dpdk: frames for another address, port or protocol"),
    Counter("rx_fragments", "dpdk: IPv4 fragments (never reassembled)"),
    Counter("tx_no_mac", "dpdk: datagrams dropped, the duck's MAC not known yet", drop=True),
    Counter("arp_requests", "dpdk: ARP requests sent for duck addresses"),
    Counter("arp_replies", "dpdk: ARP requests for the host address answered"),
    Counter("arp_learned", "dpdk: duck MACs learned or changed"),
    Counter("nacks_sent"),
    Counter("nacks_received"),
    Counter("retransmits", "activation chunks resent on a duck's NACK"),
    Counter("nack_resends_suppressed", "chunks a NACK asked for again within nack_us"),
    Counter("rto_samples", "duck reply times taken into its NACK timeout (RTO)"),
    Counter("nacks_avoided", "ducks that answered un-NACKed after more than nack_us"),
    Counter("rto_backoffs", "NACK timeouts that doubled a duck's RTO"),
    Counter("weight_datagrams"),
    Counter("weight_retransmits"),
    Counter("pings"),
    Counter("pongs"),
    Counter("no_layer_replies", "a duck said it holds no such layer"),
    Counter("control_messages"),
    Counter("bad_control_messages"),
    Counter("control_refused", "no credentials, or a role that may not ask that"),
    Counter("quota_refused", "LoadWeights or Attach past a client's, pid's or user's quota"),
    Counter("connections_refused", "control connections past max_connections, closed"),
    Counter("connections_shed", "accepted and closed at once: no descriptor left (EMFILE)"),
    Counter("layers_freed"),
    Counter("curve_refused", "tcp:// handshakes with a key not in curve_clients_file"),
    Counter("clients_attached"),
    Counter("clients_detached"),
    Counter("clients_reclaimed", "dead clients whose segments were unmapped"),
    Counter("clients_evicted", "clients detached for breaking their ring"),
    Counter("client_quota_waits", "passes a client at client_max_inflight was skipped"),
    Counter("parks", "times a runner thread slept (dp_waker.h)"),
    Counter("kicks", "of those, woken by another thread's push"),
    Counter("doorbells", "doorbell bytes from clients that found us parked (their own pipes)"),
    Counter("futex_wakes", "completions that woke a client sleeping on its slot"),
    Counter("completions_sent"),
    Counter("completion_flushes", "bursts the outbox sent them in (completion_flush_us)"),
    Counter("moe_forwards", "forwards on a mixture-of-experts layer (ROUTED)"),
    Counter("moe_broadcasts", "MoE NIC parts sent once to the NIC with the whole table"),
    Counter("moe_unicasts", "MoE NIC parts sent as each routed duck's rows alone"),
    Counter("moe_bytes", "MoE: activation and table bytes put on the wire (first sends)"),
    Counter("rx_unrouted", "MoE partials refused: rows the duck was not routed", drop=True),
    Counter("doorbell_unwatched", "a doorbell pipe not watched: epoll refused it, or closed"),
    Counter("tx_link_down", "dpdk: datagrams not sent: the NIC's link was down", drop=True),
    Counter("link_downs", "dpdk: times the NIC's link went down"),
    Counter("link_down_forwards", "forward parts failed at once: the NIC's link was down"),
    # rxq_overflows of a dpdk NIC is the sum of these three (not drops again: top sums drops)
    Counter("rx_missed", "dpdk: frames the port dropped, its RX ring full (imissed)"),
    Counter("rx_nombuf", "dpdk: frames the port dropped, no mbuf to put them in"),
    Counter("rx_kernel_drops", "dpdk: kernel drops: ring full (tp_drops, af_xdp's rx_ring_full)"),
    Counter("tx_flush_frames", "dpdk: filler frames sent so an idle port frees held slots"),
    Counter("rx_interrupt_wakeups", "dpdk: parks a port's RX interrupt ended (dp_dpdk_intr.c)"),
    Counter("rx_bad_checksum", "dpdk: UDP checksum wrong, checked in software", drop=True),
    Counter("rx_gro_buffers", "socket: receives that held several datagrams (UDP GRO)"),
    Counter("rx_gro_segments", "socket: the datagrams those receives held"),
    Counter(
        "completion_flushes_wanted",
        "of those, sent at once: a client waited for one (completions_wanted)",
    ),
    Counter(
        "client_clock_implausible",
        "submit stamps after pickup or before the client attached: its prepare_ns is 0",
    ),
    Counter(
        "rx_duck_filters",
        "socket: kernel filters admitting only the NIC's ducks (what they refuse: rxq_overflows)",
    ),
    Counter("doorbells_idle", "doorbell rings heard that brought no new descriptor"),
    Counter(
        "doorbell_rate_limited",
        "times a client's doorbell was muted for ringing with nothing new (dp_dispatch.c)",
    ),
    Counter("peers_gone", "Attach refused: the process that made the connection has exited"),
    Counter(
        "completions_held",
        "completions a client's full socket refused (ROUTER_SNDHWM), kept and sent later",
    ),
    Counter(
        "completions_dropped",
        "completions never sent: the client's connection was gone, or it left",
    ),
    Counter("replies_dropped", "replies to a peer gone, or with 256 unread (ROUTER_SNDHWM)"),
    Counter(
        "moe_no_duck_forwards",
        "MoE forwards no duck was asked for (every choice -1, no shared expert): zeros",
    ),
    Counter(
        "moe_copied_bytes",
        "MoE: activation bytes copied to be sent (rows sent from the slot in place: 0)",
    ),
    Counter(
        "parks_expecting",
        "of parks, those until forwards' replies were due, their NICs unheard (idle_expect)",
    ),
    Counter("layers_repaired", "repairs committed: lost ducks given their banks again"),
    Counter("repair_bytes", "of weight_bytes, those a repair restreamed to lost ducks"),
    Counter("moe_no_live_replica", "MoE forwards failed at once: a needed expert's ducks are lost"),
    Counter("moe_rows_rerouted", "MoE (token, expert) pairs sent around a duck known lost"),
    Counter("layers_moved", "moves committed: live MoE layers switched to a new placement"),
    Counter("move_bytes", "of weight_bytes, those a move sent (the changed ducks' new banks)"),
    Counter("moe_failovers", "MoE: silent ducks whose rows a forward resent to another replica"),
    Counter("moe_failover_late", "MoE partial datagrams of a duck after its rows were failed over"),
)
COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in COUNTERS)
DROP_COUNTERS: tuple[str, ...] = tuple(c.name for c in COUNTERS if c.drop)


def bucket_bounds() -> list[int]:
    """Upper bounds (ns) of the buckets, two per octave in integers: 256, 384, 512, 768,
    1024, ... (2**k, then 1.5 * 2**k), up to 2**35 (34 s); the last is 2**63-1."""
    out = [
        (1 << (STATS_FIRST_BOUND_LOG2 + i // 2))
        if i % 2 == 0
        else 3 << (STATS_FIRST_BOUND_LOG2 - 1 + i // 2)
        for i in range(STATS_BUCKETS - 1)
    ]
    return [*out, (1 << 63) - 1]


class LinkState(enum.IntEnum):
    """A NIC's link as its backend last saw it (``dp_stats_nic.link``).

    UNKNOWN: the backend does not tell (socket, null), and the worker takes it as up.
    """

    UNKNOWN = 0
    UP = 1
    DOWN = 2


class WriterKind(enum.IntEnum):
    """Which dataplane writes the segment."""

    C = 1
    MOCK = 2


class Threads(enum.IntEnum):
    """How the dataplane's agents run."""

    SHARED = 1  # one thread runs every agent
    DEDICATED = 2  # a thread (or lcore) per agent


class StatsClientState(enum.IntEnum):
    """A client slot in the stats segment."""

    FREE = 0
    ATTACHED = 1


class DuckState(enum.IntEnum):
    """A duck as the dataplane last saw it.

    UP: it answered every forward it was sent lately (or none was sent yet).
    LATE: it missed the latest forward it was targeted by (timed out, chunks missing).
    LOST: nothing heard from it (reply, PONG or ACK) for max(duck_lost_ms, 3 pings): since the
    dataplane started (it never answered a PING or a LAYER), or since it last answered;
    or, never heard from, a forward timed out on it. ``reason`` says which. Routed
    (MoE) forwards go around a LOST duck (docs/architecture.md).
    """

    NONE = 0  # no duck in this slot
    UP = 1
    LATE = 2
    LOST = 3


class DuckReason(enum.IntEnum):
    """Why a duck is not UP (``dp_stats_duck.reason``); readers turn it into words.

    NEVER_ANSWERED: no PONG, WEIGHT_ACK (to a PING or a LAYER) or partial from it since
    the dataplane started, for longer than the lost window or through a forward or a
    load that timed out on it: the topology's duck count, port or address is the usual
    cause, so the readers say to check those.
    SILENT: it answered once, then nothing for longer than the lost window.
    MISSED_FORWARD: it is heard from but missed the latest forward it was sent (LATE).
    """

    NONE = 0
    NEVER_ANSWERED = 1
    SILENT = 2
    MISSED_FORWARD = 3


class StatsHeader(msgspec.Struct, frozen=True):
    """Stats segment header. Lines 0-1 and 3-4: written once by the dataplane before
    it publishes ``magic`` (release). Line 2: the control agent (mock: its one thread)."""

    __c_name__: ClassVar[str] = "dp_stats_header"
    __c_size__: ClassVar[int] = 320
    __field_docs__: ClassVar[dict[str, str]] = {
        "magic": "STATS_MAGIC, stored last with release: a reader that sees it sees the rest",
        "pid": "the dataplane's pid; a reader that finds it gone reports a stale segment",
        "writer_kind": "enum dp_writer_kind: the C dataplane or the mock",
        "threads": "enum dp_threads",
        "start_ns": "CLOCK_REALTIME when the dataplane started",
        "start_mono_ns": "CLOCK_MONOTONIC when the dataplane started",
        "ncounters": "counter slots in use per agent (names region entries)",
        "nagents": "agents in use (control, dispatcher, one worker per NIC)",
        "nclients": "client slots (MAX_CLIENTS)",
        "nnics": "NICs in use",
        "nducks": "duck slots (MAX_DUCKS); unused ones have state NONE",
        "heartbeat_ns": "CLOCK_MONOTONIC, stored every ~10 ms by the control agent",
        "epoch": "the dataplane's current epoch",
        "control": "the control endpoint",
        "moe_offset": "the MoE region: dp_stats_moe, then dp_stats_moe_layer[moe_layers]",
        "moe_layers": "MoE layer slots (STATS_MOE_LAYERS)",
    }

    # line 0: identity (once)
    magic: U64
    version_major: U16
    version_minor: U16
    header_size: U32
    segment_size: U64
    pid: U32
    writer_kind: U32
    threads: U32
    pad0: Pad(4)
    start_ns: U64
    start_mono_ns: U64
    pad1: Pad(8)
    # line 1: regions (once)
    names_offset: U32
    agents_offset: U32
    clients_offset: U32
    nics_offset: U32
    ducks_offset: U32
    bounds_offset: U32
    hists_offset: U32
    ncounters: U32
    nagents: U32
    nclients: U32
    nnics: U32
    nducks: U32
    buckets: U32
    nhists: U32
    moe_offset: U32
    moe_layers: U32
    # line 2: the control agent, while it lives
    heartbeat_ns: U64
    epoch: U64
    pad3: Pad(48)
    # lines 3-4: the control endpoint (once)
    control: Chars(128)


class StatsName(msgspec.Struct, frozen=True):
    """One counter's name (COUNTERS), by index; the same for every agent."""

    __c_name__: ClassVar[str] = "dp_stats_name"
    __c_size__: ClassVar[int] = STATS_COUNTER_NAME

    name: Chars(STATS_COUNTER_NAME)


class StatsAgent(msgspec.Struct, frozen=True):
    """One agent's counters (its struct dp_counters), written by that agent's owner only."""

    __c_name__: ClassVar[str] = "dp_stats_agent"
    __c_size__: ClassVar[int] = 64 + 8 * STATS_MAX_COUNTERS
    __field_docs__: ClassVar[dict[str, str]] = {
        "name": "control, dispatcher, or the NIC's name",
        "v": "counter i is named by names[i]",
    }

    name: Chars(64)
    v: Array("uint64_t", STATS_MAX_COUNTERS)


class StatsHist(msgspec.Struct, frozen=True):
    """A cumulative histogram: counts[i] values fell in (bounds[i-1], bounds[i]]."""

    __c_name__: ClassVar[str] = "dp_stats_hist"
    __c_size__: ClassVar[int] = 512
    __field_docs__: ClassVar[dict[str, str]] = {
        "sum_ns": "exact sum of every recorded value",
    }

    counts: Array("uint64_t", STATS_BUCKETS)
    sum_ns: U64
    pad0: Pad(56)


class StatsBounds(msgspec.Struct, frozen=True):
    """Upper bound (ns) of each histogram bucket, the same for every histogram."""

    __c_name__: ClassVar[str] = "dp_stats_bounds"
    __c_size__: ClassVar[int] = 512

    bounds_ns: Array("uint64_t", STATS_BUCKETS)
    pad0: Pad(64)


class StatsClient(msgspec.Struct, frozen=True):
    """One client slot, written by the control agent (mock: its thread). ``generation``
    changes whenever the slot is taken by another client.

    This is the only view of a client's ring the tools have: they never map a client's
    segment (its memory is the client's to swap or shrink under a reader, issue 17). The
    client writes ``head``, so ``pending`` is bounded by the dataplane: a head behind the
    tail counts 0, one more than ``capacity`` ahead counts ``capacity`` (the dispatcher
    evicts such a client at its next pass)."""

    __c_name__: ClassVar[str] = "dp_stats_client"
    __c_size__: ClassVar[int] = 512
    __field_docs__: ClassVar[dict[str, str]] = {
        "state": "enum dp_stats_client_state: FREE or ATTACHED",
        "page_size": "2 MiB (hugetlbfs) or 4096 (the /dev/shm fallback)",
        "capacity": "ring capacity (descriptors)",
        "head": "the client's ring head as the dataplane last read it (the client writes it)",
        "tail": "the dataplane's consumer index",
        "pending": "descriptors waiting as the dataplane counts them: head - tail in [0, capacity]",
        "bytes_in": "activation bytes read",
        "bytes_out": "result bytes written",
        "ring_full": "times the client found its ring full (0: not measured)",
        "errors": "completions with a status other than OK",
        "segment": "the memfd's name, as `duckpipe shm ls` shows it",
    }

    # line 0: identity
    state: U32
    id: U32
    pid: U32
    page_size: U32
    capacity: U32
    slot_count: U32
    generation: U32
    pending: U32
    head: U64
    tail: U64
    inflight: U64
    pad1: Pad(8)
    # line 1: counters
    submits: U64
    completions: U64
    bytes_in: U64
    bytes_out: U64
    ring_full: U64
    errors: U64
    pad2: Pad(16)
    # lines 2-3: name
    name: Chars(128)
    # lines 4-7: segment
    segment: Chars(256)


class StatsNic(msgspec.Struct, frozen=True):
    """One NIC worker's identity; its counters are agent ``agent``."""

    __c_name__: ClassVar[str] = "dp_stats_nic"
    __c_size__: ClassVar[int] = 192
    __field_docs__: ClassVar[dict[str, str]] = {
        "agent": "index of its counters in the agents region",
        "core": "the CPU it runs on (pinned), 0xffffffff when unpinned",
        "link": "enum dp_link_state: UNKNOWN (socket, null: taken as up), UP or DOWN",
        "link_speed_mbps": "the link's speed as the port reports it (0: unknown or down)",
        "lcore": "the EAL lcore it runs on (dpdk, dedicated threads), 0xffffffff if none",
    }

    agent: U32
    core: U32
    link: U32
    link_speed_mbps: U32
    lcore: U32
    pad0: Pad(44)
    name: Chars(32)
    backend: Chars(32)
    interface: Chars(64)


class StatsDuck(msgspec.Struct, frozen=True):
    """One duck, by topology index; written by the control agent (mock: its thread)."""

    __c_name__: ClassVar[str] = "dp_stats_duck"
    __c_size__: ClassVar[int] = 640
    __field_docs__: ClassVar[dict[str, str]] = {
        "state": "enum dp_duck_state",
        "nic": "index of its NIC in the nics region",
        "layers": "layers loaded on it",
        "last_reply_ns": "its latest reply time: forward picked up -> its partial complete",
        "timeouts": "forwards that timed out without its partial",
        "missing_chunks": "partial chunks still missing at those timeouts",
        "nacks": "NACKs sent to it (0 where not counted per duck)",
        "replies": "partials received complete",
        "reply": "reply time histogram",
        "moe_tokens": "MoE: tokens (reply rows) it computed, over every routed forward",
        "moe_expert_rows": "MoE: (token, expert) pairs it computed",
        "reason": "enum dp_duck_reason: why it is not UP (NONE when it is)",
        "seen_ns": "CLOCK_MONOTONIC of the last datagram it sent us; 0: never",
        "moe_failovers": "MoE: forwards whose rows for it were resent to another replica",
    }

    id: U32
    state: U32
    nic: U32
    layers: U32
    last_reply_ns: U64
    timeouts: U64
    missing_chunks: U64
    nacks: U64
    replies: U64
    reason: U32
    pad0: Pad(4)
    address: Chars(64)
    reply: Array("uint64_t", STATS_BUCKETS)
    reply_sum_ns: U64
    moe_tokens: U64
    moe_expert_rows: U64
    seen_ns: U64
    moe_failovers: U64
    pad1: Pad(24)


# --- MoE expert load (issue 30 point 4) ----------------------------------------------

#: MoE layers whose load is kept, one slot each (DeepSeek-V3 has 58); the forwards of a
#: layer that finds no slot free are counted in StatsMoe.untracked_*
STATS_MOE_LAYERS = 64
#: the recent window's nominal length; a window ends at the first stats tick past it, so
#: readers divide by the slot's window_ns, its true length
STATS_MOE_WINDOW_NS = 1_000_000_000


class MoeLayerState(enum.IntEnum):
    """A MoE layer slot (``dp_stats_moe_layer.state``)."""

    FREE = 0
    LOADED = 1  # the layer is loaded (its placement is the slot's)
    GONE = 2  # unloaded: its counts stay until another layer needs the slot


class StatsMoe(msgspec.Struct, frozen=True):
    """The MoE region's head: the load no layer slot holds. Written by the control agent
    (mock: its thread)."""

    __c_name__: ClassVar[str] = "dp_stats_moe"
    __c_size__: ClassVar[int] = 64
    __field_docs__: ClassVar[dict[str, str]] = {
        "layers": "layer slots that follow (STATS_MOE_LAYERS)",
        "max_experts": "experts a slot holds (MAX_EXPERTS)",
        "window_ns": "the recent window's nominal length (STATS_MOE_WINDOW_NS)",
        "untracked_forwards": "routed forwards of layers that found every slot taken",
        "untracked_tokens": "their tokens",
        "untracked_entries": "their (token, expert) choices, -1 left out",
    }

    layers: U32
    max_experts: U32
    window_ns: U64
    untracked_forwards: U64
    untracked_tokens: U64
    untracked_entries: U64
    pad0: Pad(24)


class StatsMoeLayer(msgspec.Struct, frozen=True):
    """One MoE layer's load: running totals since the slot was taken, and the last
    complete recent window. Written by the control agent (mock: its thread) at each
    routed forward's completion (totals) and at the first tick past each window (the
    window's numbers, between two stores of seq); readers take no lock."""

    __c_name__: ClassVar[str] = "dp_stats_moe_layer"
    __c_size__: ClassVar[int] = (
        128 + 12 * MAX_EXPERTS + 12 * MAX_DUCKS + MAX_EXPERTS + 2 * MAX_EXPERTS * MAX_REPLICAS
    )
    __field_docs__: ClassVar[dict[str, str]] = {
        "seq": "odd while the writer rewrites the window, identity or placement; a copy "
        "between two reads of one even value is whole",
        "state": "enum dp_moe_layer_state",
        "layer": "the layer's id",
        "n_experts": "its routed experts: entries of expert_tokens and replicas in use",
        "forwards": "routed forwards completed (timed out too: their rows were sent)",
        "tokens": "their tokens (rows)",
        "entries": "their (token, expert) choices counted: the sum of expert_tokens",
        "no_expert": "their -1 choices (DeepEP's no expert): no expert, no duck",
        "window_end_ns": "CLOCK_MONOTONIC when the last recent window ended (0: none yet)",
        "window_ns": "its length: rates are recent counts / window_ns",
        "recent_forwards": "forwards in the last recent window",
        "recent_tokens": "their tokens",
        "expert_tokens": "tokens that chose expert e, every replica's together",
        "expert_recent": "the same in the last recent window",
        "duck_rows": "(token, expert) rows sent to duck d (by duck id): its routed load",
        "duck_recent": "the same in the last recent window",
        "replicas": "the placement: expert e's replica count",
        "ducks": "the placement: expert e's ducks, ducks[e * MAX_REPLICAS + r]",
    }

    # line 0: identity and totals
    seq: U32
    state: U32
    layer: U32
    n_experts: U32
    forwards: U64
    tokens: U64
    entries: U64
    no_expert: U64
    window_end_ns: U64
    window_ns: U64
    # line 1: the window's forwards
    recent_forwards: U64
    recent_tokens: U64
    pad0: Pad(48)
    expert_tokens: Array("uint64_t", MAX_EXPERTS)
    expert_recent: Array("uint32_t", MAX_EXPERTS)
    duck_rows: Array("uint64_t", MAX_DUCKS)
    duck_recent: Array("uint32_t", MAX_DUCKS)
    replicas: Array("uint8_t", MAX_EXPERTS)
    ducks: Array("uint16_t", MAX_EXPERTS * MAX_REPLICAS)


LAYOUTS = (
    StatsHeader,
    StatsName,
    StatsAgent,
    StatsHist,
    StatsBounds,
    StatsClient,
    StatsNic,
    StatsDuck,
    StatsMoe,
    StatsMoeLayer,
)

CONSTANTS: dict[str, int] = {
    "STATS_MAGIC": STATS_MAGIC,
    "STATS_VERSION_MAJOR": STATS_VERSION_MAJOR,
    "STATS_VERSION_MINOR": STATS_VERSION_MINOR,
    "STATS_MAX_COUNTERS": STATS_MAX_COUNTERS,
    "STATS_COUNTER_NAME": STATS_COUNTER_NAME,
    "STATS_MAX_NICS": STATS_MAX_NICS,
    "STATS_MAX_AGENTS": STATS_MAX_AGENTS,
    "STATS_BUCKETS": STATS_BUCKETS,
    "STATS_FIRST_BOUND_LOG2": STATS_FIRST_BOUND_LOG2,
    "STATS_NHISTS": STATS_NHISTS,
    "STATS_MOE_LAYERS": STATS_MOE_LAYERS,
    "STATS_MOE_WINDOW_NS": STATS_MOE_WINDOW_NS,
}


def _sizes() -> dict[str, int]:
    from .layout import layout_of

    return {c.__name__: layout_of(c).size for c in LAYOUTS}


def segment_plan() -> dict[str, int]:
    """Offsets of every region and the segment's size (the C side computes the same)."""
    s = _sizes()
    off = s["StatsHeader"]
    plan = {"names_offset": off}
    off += STATS_MAX_COUNTERS * s["StatsName"]
    plan["agents_offset"] = off
    off += STATS_MAX_AGENTS * s["StatsAgent"]
    plan["clients_offset"] = off
    off += MAX_CLIENTS * s["StatsClient"]
    plan["nics_offset"] = off
    off += STATS_MAX_NICS * s["StatsNic"]
    plan["ducks_offset"] = off
    off += MAX_DUCKS * s["StatsDuck"]
    plan["bounds_offset"] = off
    off += s["StatsBounds"]
    plan["hists_offset"] = off
    off += STATS_NHISTS * s["StatsHist"]
    plan["moe_offset"] = off
    off += s["StatsMoe"] + STATS_MOE_LAYERS * s["StatsMoeLayer"]
    plan["segment_size"] = (off + 4095) & ~4095
    return plan
