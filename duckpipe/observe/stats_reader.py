"""Read a dataplane's stats segment: no lock, no message, read-only mappings.

The segment (``duckpipe/schema/stats.py``) sits next to the control socket
(``ipc://<dir>/control`` -> ``<dir>/stats``). :func:`read_snapshot` maps it read-only
and copies every counter out into a :class:`Snapshot`. It reads nothing else: a client's
ring is seen as the dataplane publishes it (``pending``, bounded by the dataplane), never
by mapping the client's own segment, whose memory the client may swap or shrink under a
reader (issue 17). ``msgspec.json.encode(snapshot)`` is the ``--json`` document of
``duckpipe stats`` and ``duckpipe-top``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pwd
import stat
import time
from pathlib import Path

import msgspec
import numpy as np

from .. import host
from ..errors import DuckpipeError
from ..schema import abi
from ..schema import stats as S
from ..schema.layout import Layout, layout_of
from ..schema.routing import MAX_EXPERTS, MAX_REPLICAS

__all__ = [
    "MOE_COUNTERS",
    "ClientStats",
    "DataplaneInfo",
    "DuckStats",
    "ExpertLoad",
    "Histogram",
    "MoeLayerStats",
    "MoeUntracked",
    "NicStats",
    "NoDataplane",
    "Snapshot",
    "StaleDataplane",
    "StatsNotReadable",
    "duck_why",
    "find_stats",
    "heartbeat_age_ns",
    "moe_active",
    "numpy_dtype",
    "read_snapshot",
    "ring_pending",
    "stats_path_for",
]

#: a heartbeat older than this, or a pid that is gone, makes the segment stale
STALE_NS = 2_000_000_000
#: The mixture-of-experts counters (issue 16). A dense model never moves them, so the
#: human views (``duckpipe stats``, duckpipe-top) show them only once one is nonzero
#: (:func:`moe_active`); ``--json`` and the exporter carry them always.
MOE_COUNTERS = (
    "moe_forwards",
    "moe_broadcasts",
    "moe_unicasts",
    "moe_bytes",
    "rx_unrouted",
    "moe_no_duck_forwards",
    "moe_copied_bytes",
    "moe_no_live_replica",
    "moe_rows_rerouted",
    "moe_failovers",
    "moe_failover_late",
)


class NoDataplane(DuckpipeError):
    """No stats segment where the dataplane would publish one."""


class StatsNotReadable(NoDataplane):
    """A stats segment (or its directory) is there but not open to this user: the
    dataplane runs; saying "start one" would mislead."""


def _not_readable(path: Path, control: str | None) -> StatsNotReadable:
    """Why ``path`` is closed to us, and what we may read instead: the segment lists
    every client's pid, name and segment, which the dataplane shows its admin only
    (docs/security.md); a control_group member asks over the control socket."""
    owner = "the dataplane's user"
    with contextlib.suppress(OSError):
        uid = path.stat().st_uid
        with contextlib.suppress(KeyError):
            owner = f"{pwd.getpwuid(uid).pw_name} (uid {uid}), the dataplane's user"
        if owner == "the dataplane's user":
            owner = f"uid {uid}, the dataplane's user"
    where = f" --control {control}" if control else ""
    return StatsNotReadable(
        f"a dataplane's stats segment is at {path}, but it is readable only by {owner} (you are "
        f"uid {os.geteuid()}): it lists every client's pid, name and segment, which the "
        "dataplane shows its admin only. A member of its control_group sees the counters and "
        f"its own clients with `duckpipe stats --control-query{where}`"
    )


class StaleDataplane(NoDataplane):
    """A stats segment whose dataplane is gone (not raised by read_snapshot; see ``alive``)."""


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    """Cumulative since the dataplane started; difference two snapshots with ``minus``."""

    bounds_ns: list[int]
    counts: list[int]
    sum_ns: int = 0  # exact sum of the recorded values (0 where the writer has none)

    def minus(self, older: Histogram) -> Histogram:
        return Histogram(
            bounds_ns=self.bounds_ns,
            counts=[max(0, a - b) for a, b in zip(self.counts, older.counts, strict=True)],
            sum_ns=max(0, self.sum_ns - older.sum_ns),
        )

    def total(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> int | None:
        """The upper bound of the bucket holding quantile ``q`` (ns); None when empty.
        The last bucket reports its lower bound (there is no finite upper one)."""
        n = self.total()
        if n == 0:
            return None
        rank = max(1, int(np.ceil(q * n)))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                if i == len(self.bounds_ns) - 1:
                    return self.bounds_ns[i - 1] if i else 0
                return self.bounds_ns[i]
        return self.bounds_ns[-2]


class DataplaneInfo(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "c" or "mock"
    pid: int
    start_time_ns: int  # CLOCK_REALTIME
    heartbeat_ns: int  # CLOCK_MONOTONIC
    control: str
    threads: str  # "shared" | "dedicated"
    stats_path: str
    alive: bool = True  # False: pid gone or heartbeat older than 2 s (a stale segment)
    epoch: int = 0


class ClientStats(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    pid: int
    name: str
    segment: str
    page_size: int
    capacity: int
    slot_count: int
    head: int  # the client's ring head as the dataplane last read it (client-written)
    tail: int  # the dataplane's consumer index
    pending: int  # descriptors waiting, as the dataplane counts them: in [0, capacity]
    inflight: int
    submits: int
    completions: int
    bytes_in: int
    bytes_out: int
    ring_full: int
    errors: int


class NicStats(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    backend: str
    interface: str
    core: int  # the CPU it runs on, -1 when unpinned
    counters: dict[str, int]
    xstats: dict[str, int]
    #: "up", "down", or "" where the backend does not tell (socket, null: taken as up)
    link: str = ""
    link_speed_mbps: int = 0  # 0: unknown or down
    lcore: int = -1  # the EAL lcore it runs on (dpdk, dedicated threads), -1: none


class DuckStats(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    address: str
    nic: str
    state: str  # "up" | "late" | "lost": schema.stats.DuckState
    layers: int
    last_reply_ns: int
    reply: Histogram
    timeouts: int
    missing_chunks: int
    nacks: int
    replies: int = 0
    moe_tokens: int = 0  # MoE: tokens (reply rows) it computed, every routed forward
    moe_expert_rows: int = 0  # MoE: (token, expert) pairs it computed
    #: MoE: forwards whose rows for it were resent to another replica (0 before failover)
    moe_failovers: int = 0
    #: why it is not up: "never_answered" | "silent" | "missed_forward" (schema.stats.
    #: DuckReason), "" when up
    reason: str = ""
    #: the same in words, with what to check: what top, stats and the log show
    why: str = ""


class ExpertLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One expert of a MoE layer: its tokens and the ducks that hold it."""

    expert: int
    tokens: int  # since the layer's slot was taken
    recent: int  # in the last recent window
    ducks: list[int]  # its replicas' ducks


class MoeLayerStats(msgspec.Struct, frozen=True, kw_only=True):
    """One MoE layer's load (the stats segment's MoE region, duckpipe/schema/stats.py): a
    token counts once per expert it chose, every replica's together; a duck's rows are
    the (token, expert) pairs sent to it. ``expert_*`` are indexed by expert, ``duck_*``
    by duck id over the layer's ducks (its placement's). The recent window is the last
    complete one: about 1 s, ``window_ns`` exactly, 0 before the first ended."""

    layer: int
    loaded: bool  # False: unloaded since; its counts stay until the slot is needed
    n_experts: int
    forwards: int
    tokens: int
    entries: int  # (token, expert) choices counted: sum(expert_tokens)
    no_expert: int  # -1 choices: no expert, no duck
    window_ns: int
    window_end_ns: int  # CLOCK_MONOTONIC, 0: no window ended yet
    recent_forwards: int
    recent_tokens: int
    expert_tokens: list[int]
    expert_recent: list[int]
    expert_ducks: list[list[int]]  # the placement: each expert's ducks
    duck_rows: dict[int, int]
    duck_recent: dict[int, int]

    def hottest(self, n: int = 5, *, recent: bool = False) -> list[ExpertLoad]:
        """The ``n`` experts with the most tokens (in the recent window with ``recent``),
        most first, ties by expert id; experts with none left out."""
        key = self.expert_recent if recent else self.expert_tokens
        order = sorted(range(self.n_experts), key=lambda e: (-key[e], e))
        return [
            ExpertLoad(
                expert=e,
                tokens=self.expert_tokens[e],
                recent=self.expert_recent[e],
                ducks=self.expert_ducks[e],
            )
            for e in order[:n]
            if key[e]
        ]

    def imbalance(self, *, recent: bool = False) -> float | None:
        """max / mean of the routed rows of the layer's ducks (1.0: even); None when
        none has any (in the recent window with ``recent``)."""
        rows = list((self.duck_recent if recent else self.duck_rows).values())
        mean = sum(rows) / len(rows) if rows else 0
        return max(rows) / mean if mean else None


class MoeUntracked(msgspec.Struct, frozen=True, kw_only=True):
    """Routed forwards of layers that found every MoE layer slot taken (STATS_MOE_LAYERS)."""

    forwards: int = 0
    tokens: int = 0
    entries: int = 0


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    taken_ns: int  # CLOCK_MONOTONIC
    dataplane: DataplaneInfo
    counters: dict[str, int]
    clients: list[ClientStats]
    nics: list[NicStats]
    ducks: list[DuckStats]
    latency: dict[str, Histogram]
    #: each MoE layer's expert and duck load, by slot (issue 30 point 4)
    moe_layers: list[MoeLayerStats] = []
    moe_untracked: MoeUntracked = MoeUntracked()


# --- layout --------------------------------------------------------------------------


def numpy_dtype(lay: Layout) -> np.dtype:
    """A structured dtype with every non-pad field of ``lay`` at its offset."""
    names, formats, offsets = [], [], []
    for f in lay.fields:
        if f.pad:
            continue
        if f.ctype == "char":
            fmt: object = f"S{f.count}"
        else:
            base = {"uint8_t": "<u1", "uint16_t": "<u2", "uint32_t": "<u4", "uint64_t": "<u8"}[
                f.ctype
            ]
            fmt = (base, (f.count,)) if f.count else base
        names.append(f.name)
        formats.append(fmt)
        offsets.append(f.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": lay.size})


DTYPES = {c.__name__: numpy_dtype(layout_of(c)) for c in S.LAYOUTS}
PLAN = S.segment_plan()


def views(buf) -> dict[str, np.ndarray]:
    """Structured numpy views of every region of a stats segment buffer (no copy)."""
    d = DTYPES
    return {
        "header": np.ndarray((), d["StatsHeader"], buf, 0),
        "names": np.ndarray((S.STATS_MAX_COUNTERS,), d["StatsName"], buf, PLAN["names_offset"]),
        "agents": np.ndarray((S.STATS_MAX_AGENTS,), d["StatsAgent"], buf, PLAN["agents_offset"]),
        "clients": np.ndarray((abi.MAX_CLIENTS,), d["StatsClient"], buf, PLAN["clients_offset"]),
        "nics": np.ndarray((S.STATS_MAX_NICS,), d["StatsNic"], buf, PLAN["nics_offset"]),
        "ducks": np.ndarray((abi.MAX_DUCKS,), d["StatsDuck"], buf, PLAN["ducks_offset"]),
        "bounds": np.ndarray((), d["StatsBounds"], buf, PLAN["bounds_offset"]),
        "hists": np.ndarray((S.STATS_NHISTS,), d["StatsHist"], buf, PLAN["hists_offset"]),
        "moe": np.ndarray((), d["StatsMoe"], buf, PLAN["moe_offset"]),
        "moe_layers": np.ndarray(
            (S.STATS_MOE_LAYERS,),
            d["StatsMoeLayer"],
            buf,
            PLAN["moe_offset"] + S.StatsMoe.__c_size__,
        ),
    }


# --- finding it ----------------------------------------------------------------------


def stats_path_for(control: str) -> Path:
    """Where the dataplane at ``control`` publishes its stats segment.

    ``ipc://<dir>/control`` -> ``<dir>/stats``; ``ipc://<dir>/<name>`` -> ``<dir>/<name>.stats``;
    any other endpoint -> ``<run dir>/stats-<endpoint with / and : as _>``.
    """
    if control.startswith("ipc://"):
        sock = Path(control[len("ipc://") :])
        if sock.name == "control":
            return sock.with_name("stats")
        return sock.with_name(sock.name + ".stats")
    safe = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in control)
    return host.run_dir() / f"stats-{safe}"


def find_stats(control: str | None = None) -> Path:
    """The stats segment of the dataplane at ``control`` (default endpoint); raises
    NoDataplane when there is none."""
    control = control or host.default_control()
    path = stats_path_for(control)
    try:
        path.stat()
    except PermissionError:  # a directory not open to us: it is there, not readable
        raise _not_readable(path, control) from None
    except OSError:
        pass
    if not path.exists():
        raise NoDataplane(
            f"no dataplane running (looked for {path}, the stats segment of {control}); "
            "start one with `duckpipe dataplane` (or `duckpipe mock-dataplane`), "
            "or pass --stats PATH"
        )
    return path


def heartbeat_age_ns(s: Snapshot) -> int:
    return max(0, s.taken_ns - s.dataplane.heartbeat_ns)


def moe_active(counters: dict[str, int], ducks: list[DuckStats] | tuple = ()) -> bool:
    """True once this dataplane ran a mixture-of-experts forward: a MoE counter or a
    duck's MoE rows are nonzero. The views show the MoE figures only then."""
    return any(counters.get(k, 0) for k in MOE_COUNTERS) or any(
        d.moe_tokens or d.moe_expert_rows or d.moe_failovers for d in ducks
    )


#: reads of a slot's seq before a reader takes the copy it has (the writer rewrites a
#: slot about once a second, for microseconds: a retry is rare, a second one rarer)
_SEQ_TRIES = 16


def _moe_slot(slots: np.ndarray, i: int) -> np.ndarray:
    """A whole copy of MoE layer slot ``i``: taken between two reads of the same even seq
    (the writer's seqlock, duckpipe/schema/stats.py); the last copy if the writer kept
    rewriting it."""
    copy = slots[i].copy()
    for _ in range(_SEQ_TRIES):
        before = int(slots["seq"][i])
        if before & 1:
            time.sleep(0)
            continue
        copy = slots[i].copy()
        if int(slots["seq"][i]) == before:
            break
    return copy


def _moe_layer(s: np.ndarray) -> MoeLayerStats:
    n = min(int(s["n_experts"]), MAX_EXPERTS)
    replicas = s["replicas"][:n]
    ducks = s["ducks"].reshape(MAX_EXPERTS, MAX_REPLICAS)
    expert_ducks = [  # bounded as the writer's checks bound them: a garbled slot reads too
        [int(d) for d in ducks[e, : min(int(replicas[e]), MAX_REPLICAS)] if d < abi.MAX_DUCKS]
        for e in range(n)
    ]
    held = sorted({d for ds in expert_ducks for d in ds} | set(np.flatnonzero(s["duck_rows"])))
    return MoeLayerStats(
        layer=int(s["layer"]),
        loaded=int(s["state"]) == S.MoeLayerState.LOADED,
        n_experts=n,
        forwards=int(s["forwards"]),
        tokens=int(s["tokens"]),
        entries=int(s["entries"]),
        no_expert=int(s["no_expert"]),
        window_ns=int(s["window_ns"]),
        window_end_ns=int(s["window_end_ns"]),
        recent_forwards=int(s["recent_forwards"]),
        recent_tokens=int(s["recent_tokens"]),
        expert_tokens=[int(x) for x in s["expert_tokens"][:n]],
        expert_recent=[int(x) for x in s["expert_recent"][:n]],
        expert_ducks=expert_ducks,
        duck_rows={int(d): int(s["duck_rows"][d]) for d in held},
        duck_recent={int(d): int(s["duck_recent"][d]) for d in held},
    )


def _moe(v: dict[str, np.ndarray]) -> tuple[list[MoeLayerStats], MoeUntracked]:
    """The MoE region: the slots in use (a slot's state read first, so a dense run copies
    none of their 2 MB), and the untracked layers' load."""
    slots = v["moe_layers"]
    used = np.flatnonzero(slots["state"] != S.MoeLayerState.FREE)
    layers = [_moe_layer(_moe_slot(slots, int(i))) for i in used]
    head = v["moe"]
    untracked = MoeUntracked(
        forwards=int(head["untracked_forwards"]),
        tokens=int(head["untracked_tokens"]),
        entries=int(head["untracked_entries"]),
    )
    return layers, untracked


def ring_pending(head: int, tail: int, capacity: int) -> int:
    """Descriptors waiting in a ring, ``head - tail`` bounded to [0, capacity] as the C
    dataplane publishes it (``ring_pending`` in dp_stats.c): the client writes head."""
    return 0 if head < tail else min(head - tail, capacity)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _str(b: bytes) -> str:
    return bytes(b).split(b"\0", 1)[0].decode("utf-8", "replace")


def _hist(bounds: list[int], counts, sum_ns: int) -> Histogram:
    return Histogram(bounds_ns=bounds, counts=[int(x) for x in counts], sum_ns=int(sum_ns))


_KIND = {S.WriterKind.C: "c", S.WriterKind.MOCK: "mock"}
_THREADS = {S.Threads.SHARED: "shared", S.Threads.DEDICATED: "dedicated"}
_LINK = {S.LinkState.UP: "up", S.LinkState.DOWN: "down"}
_DUCK_STATE = {S.DuckState.UP: "up", S.DuckState.LATE: "late", S.DuckState.LOST: "lost"}
_DUCK_REASON = {
    S.DuckReason.NEVER_ANSWERED: "never_answered",
    S.DuckReason.SILENT: "silent",
    S.DuckReason.MISSED_FORWARD: "missed_forward",
}


def duck_why(reason: int, address: str, seen_ns: int, now_ns: int) -> str:
    """A duck's DuckReason in words, with what to check. A duck that never answered is
    most often a topology that names more ducks than run, or another port or address."""
    if reason == S.DuckReason.NEVER_ANSWERED:
        return (
            f"never answered a PING or a LAYER: check the duck count, and that a duck "
            f"listens on {address or 'its address'} (port and address as the topology says)"
        )
    if reason == S.DuckReason.SILENT:
        silent = f" for {(now_ns - seen_ns) / 1e9:.0f} s" if 0 < seen_ns < now_ns else ""
        return f"silent{silent} after answering: stopped or restarted?"
    if reason == S.DuckReason.MISSED_FORWARD:
        return "missed its latest forward (timed out, chunks missing)"
    return ""


def read_snapshot(path: Path | None = None, control: str | None = None) -> Snapshot:
    """One snapshot of the segment at ``path`` (else the one of ``control``): maps it
    read-only, copies every counter out, unmaps. No lock, no message. A segment whose
    dataplane is gone still reads; ``dataplane.alive`` is then False."""
    path = Path(path) if path is not None else find_stats(control)
    try:
        # never blocking (a FIFO planted there waits for a writer), never a symlink
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise NoDataplane(f"no dataplane running (looked for {path})") from None
    except PermissionError:
        raise _not_readable(path, control) from None
    except OSError as e:
        raise NoDataplane(f"cannot read {path}: {e.strerror} (not a stats segment)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NoDataplane(f"{path} is not a regular file, so not a stats segment")
        size = os.fstat(fd).st_size
        if size < PLAN["segment_size"]:
            raise NoDataplane(
                f"{path} is {size} bytes, not a stats segment of this version "
                f"({PLAN['segment_size']}); the dataplane may still be starting"
            )
        m = mmap.mmap(fd, PLAN["segment_size"], mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        return _snapshot(m, path)
    finally:
        m.close()


def _snapshot(m: mmap.mmap, path: Path) -> Snapshot:
    v = views(m)
    try:
        hdr = v["header"].copy()  # magic is published last: check it before the rest
        if int(hdr["magic"]) != S.STATS_MAGIC:
            raise NoDataplane(f"{path} is not a stats segment (or the dataplane is starting)")
        if int(hdr["version_major"]) != S.STATS_VERSION_MAJOR:
            raise DuckpipeError(
                f"{path}: stats segment version {int(hdr['version_major'])}, this duckpipe "
                f"reads {S.STATS_VERSION_MAJOR}; use the duckpipe that matches the dataplane"
            )
        minor = int(hdr["version_minor"])
        ncounters = min(int(hdr["ncounters"]), S.STATS_MAX_COUNTERS)
        nagents = min(int(hdr["nagents"]), S.STATS_MAX_AGENTS)
        nnics = min(int(hdr["nnics"]), S.STATS_MAX_NICS)
        names = [_str(n) for n in v["names"]["name"][:ncounters]]
        agents = v["agents"][:nagents].copy()
        clients = v["clients"].copy()
        nics = v["nics"][:nnics].copy()
        ducks = v["ducks"].copy()
        bounds = [int(x) for x in v["bounds"]["bounds_ns"]]
        hists = v["hists"].copy()
        moe_layers, moe_untracked = _moe(v)
    finally:
        del v
    taken = time.monotonic_ns()
    pid = int(hdr["pid"])
    heartbeat = int(hdr["heartbeat_ns"])
    alive = _pid_alive(pid) and taken - heartbeat <= STALE_NS
    info = DataplaneInfo(
        kind=_KIND.get(int(hdr["writer_kind"]), "unknown"),
        pid=pid,
        start_time_ns=int(hdr["start_ns"]),
        heartbeat_ns=heartbeat,
        control=_str(hdr["control"]),
        threads=_THREADS.get(int(hdr["threads"]), "shared"),
        stats_path=str(path),
        alive=alive,
        epoch=int(hdr["epoch"]),
    )
    totals = agents["v"][:, :ncounters].sum(axis=0, dtype=np.uint64) if nagents else []
    counters = {n: int(x) for n, x in zip(names, totals, strict=False)}
    nic_list = []
    for n in nics:
        a = int(n["agent"])
        row = agents["v"][a] if a < nagents else np.zeros(S.STATS_MAX_COUNTERS, np.uint64)
        core = int(n["core"])
        lcore = int(n["lcore"])
        nic_list.append(
            NicStats(
                name=_str(n["name"]),
                backend=_str(n["backend"]),
                interface=_str(n["interface"]),
                core=-1 if core == 0xFFFFFFFF else core,
                counters={name: int(x) for name, x in zip(names, row[:ncounters], strict=False)},
                xstats={},
                link=_LINK.get(int(n["link"]), ""),
                link_speed_mbps=int(n["link_speed_mbps"]),
                lcore=-1 if lcore == 0xFFFFFFFF else lcore,
            )
        )
    client_list = []
    for c in clients:
        if int(c["state"]) != S.StatsClientState.ATTACHED:
            continue
        capacity = int(c["capacity"])
        client_list.append(
            ClientStats(
                id=int(c["id"]),
                pid=int(c["pid"]),
                name=_str(c["name"]),
                segment=_str(c["segment"]),
                page_size=int(c["page_size"]),
                capacity=capacity,
                slot_count=int(c["slot_count"]),
                head=int(c["head"]),
                tail=int(c["tail"]),
                pending=(
                    min(int(c["pending"]), capacity)
                    if minor >= 2  # before 1.2 the writer published no pending
                    else ring_pending(int(c["head"]), int(c["tail"]), capacity)
                ),
                inflight=int(c["inflight"]),
                submits=int(c["submits"]),
                completions=int(c["completions"]),
                bytes_in=int(c["bytes_in"]),
                bytes_out=int(c["bytes_out"]),
                ring_full=int(c["ring_full"]),
                errors=int(c["errors"]),
            )
        )
    nic_names = [n.name for n in nic_list]
    duck_list = []
    for d in ducks:
        state = int(d["state"])
        if state == S.DuckState.NONE:
            continue
        k = int(d["nic"])
        duck_list.append(
            DuckStats(
                id=int(d["id"]),
                address=_str(d["address"]),
                nic=nic_names[k] if k < len(nic_names) else "",
                state=_DUCK_STATE.get(state, "up"),
                layers=int(d["layers"]),
                last_reply_ns=int(d["last_reply_ns"]),
                reply=_hist(bounds, d["reply"], int(d["reply_sum_ns"])),
                timeouts=int(d["timeouts"]),
                missing_chunks=int(d["missing_chunks"]),
                nacks=int(d["nacks"]),
                replies=int(d["replies"]),
                moe_tokens=int(d["moe_tokens"]),
                moe_expert_rows=int(d["moe_expert_rows"]),
                moe_failovers=int(d["moe_failovers"]),
                reason=_DUCK_REASON.get(int(d["reason"]), ""),
                why=duck_why(int(d["reason"]), _str(d["address"]), int(d["seen_ns"]), heartbeat),
            )
        )
    latency = {
        name: _hist(bounds, hists[i]["counts"], int(hists[i]["sum_ns"]))
        for i, name in enumerate(S.HIST_NAMES)
    }
    return Snapshot(
        taken_ns=taken,
        dataplane=info,
        counters=counters,
        clients=client_list,
        nics=nic_list,
        ducks=duck_list,
        latency=latency,
        moe_layers=moe_layers,
        moe_untracked=moe_untracked,
    )
