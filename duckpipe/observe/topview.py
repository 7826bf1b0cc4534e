"""What duckpipe-top shows, as pure functions: a pair of snapshots in, rows per pane out.

Nothing here touches a terminal, shared memory or /proc: ``duckpipe.observe.top`` reads
the stats segment (``duckpipe.observe.stats_reader.Snapshot``) and samples processes, then
hands both to :func:`build_view`, and draws what comes back with curses (or prints it, for
``--once``). The snapshots are used by attribute only (the contract in
``duckpipe.observe.stats_reader``), so tests build them by hand.

Rates are the difference of two snapshots' counters over the difference of their
``taken_ns``; latency quantiles come from differencing their cumulative histograms.
A counter that went down (a restarted dataplane, a re-attached client) counts as a fresh
start: no rate for that interval rather than a negative one.
"""

from __future__ import annotations

import math
import re
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..schema.stats import DROP_COUNTERS, HIST_NAMES
from .printable import printable
from .stats_reader import moe_active

__all__ = [
    "ATTENTION_OCCUPANCY",
    "DROP_COUNTERS",
    "HEARTBEAT_STALE_NS",
    "LATENCY_KEYS",
    "PANES",
    "ClientRates",
    "Column",
    "DuckRates",
    "NicRates",
    "PhaseLatency",
    "ProcSample",
    "Rates",
    "Row",
    "Table",
    "ThreadSample",
    "View",
    "alert_rows",
    "build_view",
    "derive_rates",
    "fit_columns",
    "hist_delta",
    "hist_quantile",
    "id_ranges",
    "render_table",
    "render_text",
    "same_dataplane",
    "wrap_phrases",
]

#: every pane, in key order; "moe" only once a MoE layer ran a routed forward (View.panes)
PANES = ("rings", "nics", "ducks", "latency", "processes", "moe")
PANE_TITLES = {
    "rings": "rings",
    "nics": "NIC workers",
    "ducks": "ducks",
    "latency": "latency",
    "processes": "processes",
    "moe": "MoE experts",
}
MOE_HOTTEST = 8  # experts shown per MoE layer, hottest first
LATENCY_KEYS = HIST_NAMES  # the stats segment's histograms, in its order
ATTENTION_OCCUPANCY = 0.90  # a ring fuller than this is marked
HEARTBEAT_STALE_NS = 2_000_000_000  # the dataplane writes it every ~10 ms
# A NIC's "drops" (datagrams that arrived and were thrown away, or could not be sent):
# DROP_COUNTERS, the counters the schema marks so (duckpipe/schema/stats.py).
_LAST_BUCKET = 2**63 - 1


# ---------------------------------------------------------------- histograms and rates


def hist_delta(new: Any, old: Any | None) -> list[int]:
    """Bucket counts of ``new`` minus ``old`` (cumulative histograms); ``new``'s own counts
    when there is no comparable ``old`` (none, other buckets, or a count went down)."""
    counts = list(new.counts)
    if old is None or list(old.bounds_ns) != list(new.bounds_ns):
        return counts
    diff = [a - b for a, b in zip(counts, old.counts, strict=True)]
    return counts if any(d < 0 for d in diff) else diff


def hist_quantile(bounds_ns: Sequence[int], counts: Sequence[int], q: float) -> int | None:
    """The upper bound (ns) of the bucket holding quantile ``q``; None when empty. The
    open last bucket answers with the bound below it (the most that can be said)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            b = bounds_ns[i]
            if b >= _LAST_BUCKET and i > 0:
                return bounds_ns[i - 1]
            return b
    return bounds_ns[-1]


def same_dataplane(new: Any, old: Any | None) -> bool:
    """True when both snapshots come from the same dataplane run (pid and start time)."""
    return (
        old is not None
        and old.dataplane.pid == new.dataplane.pid
        and old.dataplane.start_time_ns == new.dataplane.start_time_ns
    )


def _rate(new: int, old: int | None, dt: float) -> float | None:
    if old is None or dt <= 0 or new < old:
        return None
    return (new - old) / dt


class ClientRates(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    occupancy: float  # (head - tail) / capacity
    submits_per_s: float | None
    completions_per_s: float | None
    gbytes_per_s: float | None  # activation bytes read + result bytes written
    ring_full_new: int  # ring-full events in the interval


class NicRates(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    tx_packets_per_s: float | None
    rx_packets_per_s: float | None
    tx_gbits_per_s: float | None
    rx_gbits_per_s: float | None
    drops: int
    drops_new: int


class DuckRates(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    replies: int  # replies in the interval
    p99_ns: int | None  # over the interval
    timeouts_new: int
    missing_chunks_new: int
    moe_tokens_per_s: float | None = None  # MoE: tokens (reply rows) it computed
    moe_expert_rows_per_s: float | None = None  # MoE: (token, expert) pairs it computed


class PhaseLatency(msgspec.Struct, frozen=True, kw_only=True):
    phase: str
    count: int  # samples in the interval
    p50_ns: int | None
    p99_ns: int | None
    p999_ns: int | None
    p99_all_ns: int | None  # since the dataplane started


class Rates(msgspec.Struct, frozen=True, kw_only=True):
    """What duckpipe-top derives from two snapshots (``--json``'s ``rates``)."""

    interval_s: float  # 0 when there was one snapshot only
    heartbeat_age_s: float
    forwards_per_s: float | None
    counters_per_s: dict[str, float]
    clients: list[ClientRates]
    nics: list[NicRates]
    ducks: list[DuckRates]
    latency: list[PhaseLatency]
    moe: bool = False  # a mixture-of-experts forward ran: the views add the MoE figures


def derive_rates(new: Any, old: Any | None) -> Rates:
    """Every derived number of one interval; ``old`` None (or another dataplane run):
    occupancies and cumulative figures only, rates None."""
    if not same_dataplane(new, old):
        old = None
    dt = (new.taken_ns - old.taken_ns) / 1e9 if old is not None else 0.0
    oc = old.counters if old is not None else {}
    counters_per_s = {}
    for k, v in new.counters.items():
        r = _rate(v, oc.get(k), dt)
        if r is not None:
            counters_per_s[k] = r

    old_clients = {c.id: c for c in old.clients} if old is not None else {}
    clients = []
    for c in new.clients:
        o = old_clients.get(c.id)
        if o is not None and o.pid != c.pid:
            o = None
        gb = None
        if o is not None:
            r_in = _rate(c.bytes_in, o.bytes_in, dt)
            r_out = _rate(c.bytes_out, o.bytes_out, dt)
            if r_in is not None and r_out is not None:
                gb = (r_in + r_out) / 1e9
        clients.append(
            ClientRates(
                id=c.id,
                occupancy=c.pending / c.capacity if c.capacity else 0.0,
                submits_per_s=_rate(c.submits, o.submits if o else None, dt),
                completions_per_s=_rate(c.completions, o.completions if o else None, dt),
                gbytes_per_s=gb,
                ring_full_new=max(0, c.ring_full - o.ring_full) if o else 0,
            )
        )

    old_nics = {n.name: n for n in old.nics} if old is not None else {}
    nics = []
    for n in new.nics:
        o = old_nics.get(n.name)
        oc_n = o.counters if o is not None else {}
        cn = n.counters

        def r(key: str, cn=cn, oc_n=oc_n) -> float | None:
            return _rate(cn.get(key, 0), oc_n.get(key) if oc_n else None, dt)

        drops = sum(cn.get(k, 0) for k in DROP_COUNTERS)
        old_drops = sum(oc_n.get(k, 0) for k in DROP_COUNTERS) if oc_n else drops
        txb, rxb = r("tx_bytes"), r("rx_bytes")
        nics.append(
            NicRates(
                name=n.name,
                tx_packets_per_s=r("tx_packets"),
                rx_packets_per_s=r("rx_packets"),
                tx_gbits_per_s=txb * 8 / 1e9 if txb is not None else None,
                rx_gbits_per_s=rxb * 8 / 1e9 if rxb is not None else None,
                drops=drops,
                drops_new=max(0, drops - old_drops),
            )
        )

    old_ducks = {d.id: d for d in old.ducks} if old is not None else {}
    ducks = []
    for d in new.ducks:
        o = old_ducks.get(d.id)
        counts = hist_delta(d.reply, o.reply if o else None)
        if o is None:  # one snapshot: no interval to speak of
            counts = [0] * len(counts)
        ducks.append(
            DuckRates(
                id=d.id,
                replies=sum(counts),
                p99_ns=hist_quantile(d.reply.bounds_ns, counts, 0.99),
                timeouts_new=max(0, d.timeouts - o.timeouts) if o else 0,
                missing_chunks_new=max(0, d.missing_chunks - o.missing_chunks) if o else 0,
                moe_tokens_per_s=_rate(d.moe_tokens, o.moe_tokens if o else None, dt),
                moe_expert_rows_per_s=_rate(
                    d.moe_expert_rows, o.moe_expert_rows if o else None, dt
                ),
            )
        )

    latency = []
    for key in (*LATENCY_KEYS, *sorted(set(new.latency) - set(LATENCY_KEYS))):
        h = new.latency.get(key)
        if h is None:
            continue
        counts = hist_delta(h, old.latency.get(key) if old is not None else None)
        if old is None:
            counts = [0] * len(counts)
        latency.append(
            PhaseLatency(
                phase=key,
                count=sum(counts),
                p50_ns=hist_quantile(h.bounds_ns, counts, 0.50),
                p99_ns=hist_quantile(h.bounds_ns, counts, 0.99),
                p999_ns=hist_quantile(h.bounds_ns, counts, 0.999),
                p99_all_ns=hist_quantile(h.bounds_ns, h.counts, 0.99),
            )
        )

    return Rates(
        interval_s=dt,
        heartbeat_age_s=max(0, new.taken_ns - new.dataplane.heartbeat_ns) / 1e9,
        forwards_per_s=counters_per_s.get("forwards"),
        counters_per_s=counters_per_s,
        clients=clients,
        nics=nics,
        ducks=ducks,
        latency=latency,
        moe=moe_active(new.counters, new.ducks),
    )


# ---------------------------------------------------------------- processes (sampled by top)


class ThreadSample(msgspec.Struct, frozen=True, kw_only=True):
    tid: int
    name: str
    core: int | None  # the CPU it last ran on (/proc/<pid>/task/<tid>/stat field 39)
    cpu_percent: float | None


class ProcSample(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    role: str  # "dataplane" | "client" | "ducks"
    name: str
    cpu_percent: float | None  # of one core, since the previous sample
    rss: int
    threads: list[ThreadSample]


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    name: str
    width: int
    align: str = ">"  # ">" right, "<" left
    priority: int = 0  # dropped first when the terminal is narrow: highest priority number
    ascending: bool = False  # numbers sort largest first unless this (ids, pids)

    def __post_init__(self) -> None:  # room for the name and the sort mark
        object.__setattr__(self, "width", max(self.width, len(self.name) + 1))


@dataclass
class Row:
    cells: list[str]
    keys: list[Any]  # what each column sorts by
    attention: bool = False
    child: bool = False  # a thread under its process: moves with its parent when sorting


@dataclass
class Table:
    pane: str
    title: str
    columns: list[Column]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)  # said under the table
    sort: int = 0  # column index sorted by (descending for numbers)

    def sorted_rows(self, col: int | None = None, reverse: bool = False) -> list[Row]:
        """Rows sorted by column ``col``: numbers largest first, text A→Z (``reverse``
        flips); a child row stays under its parent."""
        col = self.sort if col is None else col
        groups: list[list[Row]] = []
        for row in self.rows:
            if row.child and groups:
                groups[-1].append(row)
            else:
                groups.append([row])

        up = self.columns[col].ascending if col < len(self.columns) else False

        def key(g: list[Row]) -> tuple:
            k = g[0].keys[col] if col < len(g[0].keys) else None
            if k is None:
                return (1, 0)
            if isinstance(k, int | float):
                return (0, k if up else -k)
            return (0, str(k))

        groups.sort(key=key, reverse=reverse)
        return [r for g in groups for r in g]


@dataclass
class View:
    """Everything one screen shows."""

    header: list[str]
    alerts: list[str]
    tables: dict[str, Table]

    @property
    def panes(self) -> list[str]:
        """The panes this screen has, in key order (the MoE pane only with a MoE layer)."""
        return [p for p in PANES if p in self.tables]


def fit_columns(columns: Sequence[Column], width: int) -> list[int]:
    """Indexes of the columns that fit ``width`` (one space between columns and one for
    the attention mark), dropping the highest ``priority`` numbers first."""
    keep = list(range(len(columns)))

    def need(idx: list[int]) -> int:
        return 1 + sum(columns[i].width + 1 for i in idx)

    while need(keep) > width and len(keep) > 1:
        worst = max(keep, key=lambda i: (columns[i].priority, i))
        if columns[worst].priority == 0:
            break
        keep.remove(worst)
    return keep


def _cell(text: str, col: Column) -> str:
    text = printable(text)  # a client's, a process's or a thread's name: shown, not obeyed
    if len(text) > col.width:
        text = text[: col.width - 1] + "~"
    return f"{text:{col.align}{col.width}}"


def render_table(
    table: Table, width: int = 200, sort: int | None = None, reverse: bool = False
) -> list[tuple[str, bool]]:
    """The table's lines (heading first) at ``width`` with the attention flag of each; a
    marked row starts with "!". The sorted column's name is underlined with "*"."""
    keep = fit_columns(table.columns, width)
    s = table.sort if sort is None else sort
    heads = []
    for i in keep:
        c = table.columns[i]
        name = c.name + ("*" if i == s else "")
        heads.append(_cell(name, c))
    lines = [(" " + " ".join(heads), False)]
    for row in table.sorted_rows(s, reverse):
        cells = [_cell(row.cells[i], table.columns[i]) for i in keep]
        mark = "!" if row.attention else " "
        lines.append(((mark + " ".join(cells)).rstrip()[:width], row.attention))
    if not table.rows:
        lines.append(("  (none)", False))
    return lines


# ---------------------------------------------------------------- formatting


def fmt_ns(ns: int | None) -> str:
    """At most 7 characters: "256 ns", "4.1 us", "524 us", "1.05 ms", "16.8 ms", "268 ms"."""
    if ns is None:
        return "-"
    if ns < 1000:
        return f"{ns} ns"
    for div, unit in ((1e3, "us"), (1e6, "ms"), (1e9, "s")):
        v = ns / div
        if v < 1000 or unit == "s":
            if unit == "us" and v < 10:
                return f"{v:.1f} us"
            if unit == "us":
                return f"{v:.0f} us"
            return (
                f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
            )
    return "-"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}" if x >= 10 or x == 0 else f"{x:.1f}"


def fmt_float(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_bytes(n: int) -> str:
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) or v >= 100 else f"{v:.1f} {unit}"
    return f"{n} B"


def fmt_page(page_size: int) -> str:
    """Said plainly: "2 MiB" for hugepages, "4 KiB (fallback)" for ordinary pages."""
    if page_size >= 2 << 20:
        return fmt_bytes(page_size)
    return f"{fmt_bytes(page_size)} (fallback)"


def fmt_count(n: int) -> str:
    return fmt_rate(float(n)) if n >= 100_000 else str(n)


def _clock(wall_ns: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall_ns / 1e9))


# ---------------------------------------------------------------- panes


def _rings(new: Any, rates: Rates) -> Table:
    cols = [
        Column("pid", 7, ascending=True),
        Column("client", 12, "<"),
        Column("cap", 5, priority=1),
        Column("head", 9, priority=3),
        Column("tail", 9, priority=3),
        Column("infl", 5),
        Column("occ%", 5),
        Column("sub/s", 6),
        Column("cmp/s", 6),
        Column("GB/s", 6),
        Column("full", 5),
        Column("page", 16, "<"),
        Column("id", 4, priority=4, ascending=True),
        Column("segment", 40, "<", priority=5),
    ]
    rows = []
    for c, r in zip(new.clients, rates.clients, strict=True):
        occ = r.occupancy * 100
        rows.append(
            Row(
                cells=[
                    str(c.pid),
                    c.name,
                    str(c.capacity),
                    str(c.head),
                    str(c.tail),
                    str(c.inflight),
                    f"{occ:.0f}",
                    fmt_rate(r.submits_per_s),
                    fmt_rate(r.completions_per_s),
                    fmt_float(r.gbytes_per_s, 3),
                    str(c.ring_full),
                    fmt_page(c.page_size),
                    str(c.id),
                    c.segment,
                ],
                keys=[
                    c.pid,
                    c.name,
                    c.capacity,
                    c.head,
                    c.tail,
                    c.inflight,
                    occ,
                    r.submits_per_s,
                    r.completions_per_s,
                    r.gbytes_per_s,
                    c.ring_full,
                    c.page_size,
                    c.id,
                    c.segment,
                ],
                attention=r.occupancy > ATTENTION_OCCUPANCY or r.ring_full_new > 0,
            )
        )
    return Table("rings", "rings (one per attached client)", cols, rows, sort=7)


def _nics(new: Any, rates: Rates) -> Table:
    cols = [
        Column("nic", 10, "<"),
        Column("backend", 7, "<"),
        Column("interface", 14, "<", priority=2),
        Column("core", 4),
        Column("link", 4, "<", priority=1),
        Column("tx pkt/s", 8),
        Column("tx Gb/s", 7),
        Column("rx pkt/s", 8),
        Column("rx Gb/s", 7),
        Column("drops", 6),
        Column("nacks", 6, priority=1),
        Column("retx", 6, priority=1),
        Column("gso", 8, priority=3),
    ]
    if rates.moe:
        cols += [Column("moe bcast", 9, priority=2), Column("moe ucast", 9, priority=2)]
    rows = []
    for n, r in zip(new.nics, rates.nics, strict=True):
        cn = n.counters
        nacks = cn.get("nacks_sent", 0)
        vals: list[tuple[str, Any]] = [
            (n.name, n.name),
            (n.backend, n.backend),
            (n.interface or "-", n.interface),
            ("-" if n.core < 0 else str(n.core), n.core),
            (n.link or "-", n.link),
            (fmt_rate(r.tx_packets_per_s), r.tx_packets_per_s),
            (fmt_float(r.tx_gbits_per_s, 3), r.tx_gbits_per_s),
            (fmt_rate(r.rx_packets_per_s), r.rx_packets_per_s),
            (fmt_float(r.rx_gbits_per_s, 3), r.rx_gbits_per_s),
            (fmt_count(r.drops), r.drops),
            (fmt_count(nacks), nacks),
            (fmt_count(cn.get("retransmits", 0)), cn.get("retransmits", 0)),
            (fmt_count(cn.get("gso_sends", 0)), cn.get("gso_sends", 0)),
        ]
        if rates.moe:
            vals += [
                (fmt_count(cn.get("moe_broadcasts", 0)), cn.get("moe_broadcasts", 0)),
                (fmt_count(cn.get("moe_unicasts", 0)), cn.get("moe_unicasts", 0)),
            ]
        rows.append(
            Row(
                [v[0] for v in vals],
                [v[1] for v in vals],
                attention=r.drops_new > 0 or n.link == "down",
            )
        )
    notes = [
        "core -: not pinned; link -: the backend does not tell (socket, null); "
        "drops, nacks (sent), retx, gso: since start"
    ]
    if rates.moe:
        notes.append(
            "moe bcast, moe ucast: MoE forwards' parts sent once with the whole routing "
            "table, or as each routed duck's rows alone; since start"
        )
    return Table("nics", "NIC workers", cols, rows, notes, sort=5)


def _ducks(new: Any, rates: Rates) -> Table:
    cols = [
        Column("id", 4, ascending=True),
        Column("address", 21, "<"),
        Column("nic", 8, "<", priority=2),
        Column("state", 5, "<"),
        Column("layers", 6, priority=3),
        Column("last", 8),
        Column("p99", 8),
        Column("replies", 7, priority=4),
        Column("timeouts", 8),
        Column("missing", 7),
        Column("nacks", 6, priority=1),
    ]
    if rates.moe:  # a dense run has no use for these: they come with the first MoE forward
        cols += [
            Column("moe tok/s", 9, priority=2),
            Column("moe exp/s", 9, priority=2),
            Column("failovers", 9, priority=3),
        ]
    rows = []
    for d, r in zip(new.ducks, rates.ducks, strict=True):
        last = d.last_reply_ns or None
        vals: list[tuple[str, Any]] = [
            (str(d.id), d.id),
            (d.address, d.address),
            (d.nic, d.nic),
            (d.state, d.state),
            (str(d.layers), d.layers),
            (fmt_ns(last), last),
            (fmt_ns(r.p99_ns), r.p99_ns),
            (str(r.replies), r.replies),
            (str(d.timeouts) + (f" +{r.timeouts_new}" if r.timeouts_new else ""), d.timeouts),
            (str(d.missing_chunks), d.missing_chunks),
            (str(d.nacks), d.nacks),
        ]
        if rates.moe:
            vals += [
                (fmt_rate(r.moe_tokens_per_s), r.moe_tokens_per_s),
                (fmt_rate(r.moe_expert_rows_per_s), r.moe_expert_rows_per_s),
                (str(getattr(d, "moe_failovers", 0)), getattr(d, "moe_failovers", 0)),
            ]
        rows.append(
            Row(
                [v[0] for v in vals],
                [v[1] for v in vals],
                attention=r.timeouts_new > 0 or d.state != "up",
            )
        )
    notes = ["last: the latest reply's time after send; p99, replies: this interval"]
    if rates.moe:
        notes.append(
            "moe tok/s: tokens the duck computed (its reply rows); moe exp/s: (token, "
            "expert) pairs; both per second, this interval; failovers: forwards whose rows "
            "for it went to another replica, since start"
        )
    return Table("ducks", "ducks", cols, rows, notes, sort=0)


def _latency(new: Any, rates: Rates) -> Table:
    cols = [
        Column("phase", 12, "<", ascending=True),  # sorts as listed: end to end first
        Column("count", 8),
        Column("p50", 9),
        Column("p99", 9),
        Column("p99.9", 9),
        Column("p99 all", 9, priority=1),
    ]
    rows = []
    names = {"end_to_end": "end to end", "reply_spread": "duck spread"}
    for i, p in enumerate(rates.latency):
        vals: list[tuple[str, Any]] = [
            (names.get(p.phase, p.phase), i),
            (str(p.count), p.count),
            (fmt_ns(p.p50_ns), p.p50_ns),
            (fmt_ns(p.p99_ns), p.p99_ns),
            (fmt_ns(p.p999_ns), p.p999_ns),
            (fmt_ns(p.p99_all_ns), p.p99_all_ns),
        ]
        rows.append(Row([v[0] for v in vals], [v[1] for v in vals]))
    interval = f"{rates.interval_s:.1f} s" if rates.interval_s else "- (one read)"
    notes = [
        f"count, p50, p99, p99.9: forwards done in the last {interval}; p99 all: since start",
        "duck spread: first duck reply to last, per forward (bucket upper bounds)",
    ]
    t = Table("latency", "latency per forward", cols, rows, notes, sort=0)
    return t


def _per_s(n: int, window_ns: int) -> float | None:
    return n / (window_ns / 1e9) if window_ns else None


def _moe(new: Any) -> Table:
    """Each MoE layer (a row: its tokens, ducks and imbalance), its hottest experts under
    it (their tokens, share of the layer's choices, ducks). Rates are the segment's last
    recent window (~1 s), so one read shows them."""
    cols = [
        Column("layer", 6, ascending=True),
        Column("expert", 7, "<"),
        Column("tokens", 9),
        Column("tok/s", 8),
        Column("share", 6),
        Column("imbalance", 9),
        Column("ducks", 24, "<", priority=1),
    ]
    rows = []
    for la in new.moe_layers:
        imb, imb_all = la.imbalance(recent=True), la.imbalance()
        per_s = _per_s(la.recent_tokens, la.window_ns)
        rows.append(
            Row(
                [
                    str(la.layer),
                    f"{la.n_experts} exp",
                    fmt_count(la.tokens),
                    fmt_rate(per_s),
                    "",
                    f"{fmt_float(imb)} ({fmt_float(imb_all)})",
                    f"{len(la.duck_rows)} ducks" + ("" if la.loaded else ", unloaded"),
                ],
                [la.layer, la.n_experts, la.tokens, per_s, None, imb, len(la.duck_rows)],
                attention=imb is not None and imb >= 2.0,
            )
        )
        for x in la.hottest(MOE_HOTTEST):
            share = x.tokens / la.entries if la.entries else None
            x_per_s = _per_s(x.recent, la.window_ns)
            rows.append(
                Row(
                    [
                        "",
                        f"  {x.expert}",
                        fmt_count(x.tokens),
                        fmt_rate(x_per_s),
                        "-" if share is None else f"{share * 100:.0f}%",
                        "",
                        id_ranges(x.ducks),
                    ],
                    [la.layer, x.expert, x.tokens, x_per_s, share, None, len(x.ducks)],
                    child=True,
                )
            )
    notes = [
        f"a layer, then its {MOE_HOTTEST} hottest experts; tokens: since its first forward "
        "(a token counts once per expert it chose); tok/s: the last ~1 s window",
        "imbalance: max/mean routed rows of the layer's ducks, last window (since start); "
        "marked from 2; share: of the layer's (token, expert) choices",
    ]
    u = getattr(new, "moe_untracked", None)
    if u is not None and u.forwards:
        notes.append(
            f"untracked: {u.forwards} forwards ({u.tokens} tokens) of layers past the "
            f"{len(new.moe_layers)} MoE layer slots"
        )
    return Table("moe", "MoE experts (hottest per layer)", cols, rows, notes, sort=0)


def _processes(procs: Sequence[ProcSample]) -> Table:
    cols = [
        Column("pid", 8, ascending=True),
        Column("role", 9, "<"),
        Column("name", 20, "<"),
        Column("cpu%", 6),
        Column("rss", 9),
        Column("thr", 4),
        Column("cores", 12, "<"),
    ]
    rows = []
    for p in procs:
        cores = sorted({t.core for t in p.threads if t.core is not None})
        rows.append(
            Row(
                [
                    str(p.pid),
                    p.role,
                    p.name,
                    fmt_float(p.cpu_percent, 1),
                    fmt_bytes(p.rss),
                    str(len(p.threads)),
                    ",".join(map(str, cores)) or "-",
                ],
                [p.pid, p.role, p.name, p.cpu_percent, p.rss, len(p.threads), len(cores)],
            )
        )
        for t in p.threads:
            rows.append(
                Row(
                    [
                        str(t.tid),
                        "  thread",
                        t.name,
                        fmt_float(t.cpu_percent, 1),
                        "",
                        "",
                        "-" if t.core is None else str(t.core),
                    ],
                    [t.tid, "", t.name, t.cpu_percent, 0, 0, t.core],
                    child=True,
                )
            )
    notes = ["cpu%: of one core, this interval; cores: where each thread last ran"]
    return Table("processes", "processes", cols, rows, notes, sort=3)


def build_view(
    new: Any,
    old: Any | None,
    procs: Sequence[ProcSample] = (),
    *,
    wall_ns: float | None = None,
    source: str = "",
) -> View:
    """The screen for snapshot ``new`` against the ``old`` one a refresh earlier.

    ``wall_ns`` is the wall clock (ns) when ``new`` was taken: it names the time the
    heartbeat stopped.
    """
    rates = derive_rates(new, old)
    wall_ns = time.time_ns() if wall_ns is None else wall_ns
    dp = new.dataplane
    up_s = max(0.0, (wall_ns - dp.start_time_ns) / 1e9)
    ok = new.counters.get("forwards_ok", 0)
    fwd = new.counters.get("forwards", 0)
    e2e = next((p for p in rates.latency if p.phase == "end_to_end"), None)
    header = [
        f"dataplane {dp.kind} pid {dp.pid}, up {_duration(up_s)}, threads {dp.threads}, "
        f"control {dp.control}" + (f"  [{source}]" if source else ""),
        f"forwards {fwd} ({ok} ok) {fmt_rate(rates.forwards_per_s)}/s, "
        f"end to end p50 {fmt_ns(e2e.p50_ns if e2e else None)} "
        f"p99 {fmt_ns(e2e.p99_ns if e2e else None)}; "
        f"clients {len(new.clients)}, NICs {len(new.nics)}, ducks {len(new.ducks)}",
    ]
    if rates.moe:
        header.append(_moe_line(new, rates))
    alerts = []
    age_ns = max(0, new.taken_ns - dp.heartbeat_ns)
    if age_ns > HEARTBEAT_STALE_NS:
        alerts.append(
            f"dataplane not responding since {_clock(wall_ns - age_ns)} "
            f"(heartbeat {age_ns / 1e9:.1f} s old)"
        )
    for c, r in zip(new.clients, rates.clients, strict=True):
        if r.occupancy > ATTENTION_OCCUPANCY:
            alerts.append(f"ring of {c.name} (pid {c.pid}) {r.occupancy * 100:.0f}% full")
        elif r.ring_full_new:
            alerts.append(f"ring of {c.name} (pid {c.pid}) was full {r.ring_full_new} time(s)")
    alerts += _duck_alerts(new.ducks, rates.ducks)
    for n, r in zip(new.nics, rates.nics, strict=True):
        if r.drops_new:
            alerts.append(f"NIC {n.name}: {r.drops_new} new drop(s)")
    tables = {
        "rings": _rings(new, rates),
        "nics": _nics(new, rates),
        "ducks": _ducks(new, rates),
        "latency": _latency(new, rates),
        "processes": _processes(procs),
    }
    if getattr(new, "moe_layers", None):  # hand-built snapshots may not have the field
        tables["moe"] = _moe(new)
    return View(header, alerts, tables)


def id_ranges(ids: Sequence[int]) -> str:
    """Duck ids as runs: ``[4, 5, 6, 7, 9]`` is ``4-7, 9``."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _duck_alerts(ducks: Sequence[Any], rates: Sequence[DuckRates]) -> list[str]:
    """One alert per kind of trouble naming every duck it hit ("ducks 4-7 are lost"): one
    line per duck would push all but the first few out of the live screen's alert rows."""
    timed_out = [(d, r.timeouts_new) for d, r in zip(ducks, rates, strict=True) if r.timeouts_new]
    by_state: dict[tuple[str, str], list[Any]] = {}  # (state, why): one line each
    for d, r in zip(ducks, rates, strict=True):
        if not r.timeouts_new and d.state != "up":
            by_state.setdefault((d.state, getattr(d, "why", "") or ""), []).append(d)
    alerts = []
    if len(timed_out) == 1:
        ((d, n),) = timed_out
        alerts.append(f"duck {d.id} ({d.address}): {n} new timeout(s)")
    elif timed_out:
        total = sum(n for _, n in timed_out)
        ids = id_ranges([d.id for d, _ in timed_out])
        alerts.append(f"ducks {ids}: {total} new timeout(s)")
    for (state, why), hit in by_state.items():
        because = f": {why}" if why else ""
        if len(hit) == 1:
            alerts.append(f"duck {hit[0].id} ({hit[0].address}) is {state}{because}")
        else:
            alerts.append(f"ducks {id_ranges([d.id for d in hit])} are {state}{because}")
    return alerts


def wrap_phrases(line: str, width: int, indent: str = "  ") -> list[str]:
    """``line`` in lines of at most ``width``, broken only after a comma or semicolon (a
    phrase: "end to end p50 86 us p99 249 us;" stays whole), the later ones indented. A
    phrase longer than a line gets one of its own and is broken between words."""
    phrases = re.split(r"(?<=[,;]) ", line)
    lines: list[str] = []
    for phrase in phrases:
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        elif len((indent if lines else "") + phrase) <= width:
            lines.append((indent if lines else "") + phrase)
        else:
            lines += textwrap.wrap(
                phrase,
                width,
                initial_indent=indent if lines else "",
                subsequent_indent=indent,
                break_on_hyphens=False,
            ) or [""]
    return lines


def alert_rows(alerts: Sequence[str], width: int, rows: int = 3) -> list[str]:
    """The live screen's alert lines: each alert whole (wrapped, never cut) while ``rows``
    hold them; if they do not, the last row says how many more there are."""
    wrapped = [wrap_phrases(f"! {printable(a)}", width) for a in alerts]
    if sum(len(parts) for parts in wrapped) <= rows:
        return [line for parts in wrapped for line in parts]
    out: list[str] = []
    shown = 0
    for parts in wrapped:
        if len(out) + len(parts) > rows - 1:  # the last row counts the rest
            break
        out += parts
        shown += 1
    return [*out, f"! +{len(alerts) - shown} more (duckpipe-top --once lists all)"]


def _moe_line(new: Any, rates: Rates) -> str:
    """The MoE counters, totals and rates: "MoE forwards 120 (40/s), NIC parts 100
    broadcast 20 unicast, wire 1.2 MiB (410k B/s), unrouted partials 0"."""
    c, per_s = new.counters, rates.counters_per_s
    return (
        f"MoE forwards {c.get('moe_forwards', 0)} ({fmt_rate(per_s.get('moe_forwards'))}/s), "
        f"NIC parts {c.get('moe_broadcasts', 0)} broadcast {c.get('moe_unicasts', 0)} unicast, "
        f"wire {fmt_bytes(c.get('moe_bytes', 0))} ({fmt_rate(per_s.get('moe_bytes'))} B/s), "
        f"unrouted partials {c.get('rx_unrouted', 0)}"
    )


def _duration(s: float) -> str:
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render_text(view: View, width: int = 120) -> str:
    """Every pane as plain text (``--once``), no line wider than ``width``; nothing in it
    a terminal would act on."""
    out = [part for line in view.header for part in wrap_phrases(printable(line), width)]
    out += [part for a in view.alerts for part in wrap_phrases(f"! {printable(a)}", width)]
    for i, pane in enumerate(view.panes, 1):
        t = view.tables[pane]
        out += ["", f"[{i}] {printable(t.title)}"]
        out += [line for line, _ in render_table(t, width)]  # cells escaped in _cell
        out += [f"  {printable(n)}" for n in t.notes]
    return "\n".join(out) + "\n"
