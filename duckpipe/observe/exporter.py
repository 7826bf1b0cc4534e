"""``duckpipe exporter``: the stats segment in the Prometheus text format.

A custom collector reads one :class:`duckpipe.observe.stats_reader.Snapshot` per scrape (no lock, no
message to the dataplane) and turns it into metric families:

- ``duckpipe_up`` (1 while the dataplane's heartbeat is fresh and its pid lives),
  ``duckpipe_dataplane_info``, ``duckpipe_heartbeat_age_seconds``, ``duckpipe_epoch``;
- every dataplane counter (COUNTERS in schema/stats.py) as ``duckpipe_<name>_total``
  summed over the agents, and per NIC worker as ``duckpipe_nic_<name>_total{nic}``;
- per client ``duckpipe_client_*{client,name,pid}``, per duck ``duckpipe_duck_*{duck,
  address,nic}`` (``duckpipe_duck_moe_tokens_total`` and ``_moe_expert_rows_total``: the
  tokens and (token, expert) pairs it computed for mixture-of-experts layers; exported
  always, 0 for a dense model, so that a dashboard's series do not come and go;
  ``duckpipe_duck_moe_failovers_total``: forwards whose rows for it went to another replica);
- per MoE layer (issue 30 point 4), one series per layer the segment tracks (at most
  STATS_MOE_LAYERS, 64): ``duckpipe_moe_layer_{forwards,tokens,entries,no_expert}_total
  {layer}``, ``duckpipe_moe_layer_imbalance{layer,window}`` (max / mean routed rows of the
  layer's ducks, ``window`` "recent" (the segment's last ~1 s) or "total"; absent while
  no duck has any), and ``duckpipe_moe_expert_tokens_total{layer,expert}`` for each
  layer's EXPORT_EXPERTS (16) hottest experts since start: at most 64 x 16 = 1,024 series
  however many experts a layer has (256 in DeepSeek-V3, up to 1,024), a set that changes
  only as the totals overtake each other; the layer's tokens cover the rest.
  ``duckpipe_moe_untracked_{forwards,tokens}_total``: layers past the 64 slots;
- histograms ``duckpipe_latency_seconds{phase}`` (end_to_end, prepare, send, wait, fetch,
  reduce), ``duckpipe_reply_spread_seconds`` and ``duckpipe_duck_reply_seconds{duck}``:
  the segment's cumulative buckets as they are (``le`` = each bucket's upper bound in
  seconds, the last +Inf). ``_sum`` is exact: the segment keeps each histogram's sum.

The dataplane may come and go: a scrape with no segment (or a stale one) still answers,
with ``duckpipe_up 0``.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest, start_http_server

from ..errors import DuckpipeError
from . import stats_reader as st
from .printable import printable

__all__ = ["EXPORT_EXPERTS", "SnapshotCollector", "registry", "render", "serve"]

#: experts exported per MoE layer (its hottest since start): bounds the series to
#: STATS_MOE_LAYERS x this, whatever the layers' expert counts
EXPORT_EXPERTS = 16
_DUCK_STATES = ("up", "late", "lost")
_DUCK_REASONS = ("never_answered", "silent", "missed_forward")
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _name(counter: str) -> str:
    """A counter's name as a metric name (names come from the segment: never trusted)."""
    return _NOT_NAME.sub("_", counter) or "_"


def _buckets(h: st.Histogram) -> list[tuple[str, float]]:
    out, acc = [], 0
    for i, (bound, n) in enumerate(zip(h.bounds_ns, h.counts, strict=True)):
        acc += n
        le = "+Inf" if i == len(h.bounds_ns) - 1 else repr(bound / 1e9)
        out.append((le, float(acc)))
    return out


class SnapshotCollector:
    """Reads the stats segment at every ``collect`` (a scrape)."""

    def __init__(self, stats: str | Path | None = None, control: str | None = None) -> None:
        self._path = Path(stats) if stats else None
        self._control = control

    def path(self) -> Path:
        if self._path is not None:
            return self._path
        try:
            return st.find_stats(self._control)
        except st.NoDataplane:
            from ..host import default_control

            return st.stats_path_for(self._control or default_control())

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "duckpipe_up", "1 while the dataplane's heartbeat is fresh and its process lives"
        )
        try:
            snap = st.read_snapshot(self.path())
        except (st.NoDataplane, DuckpipeError, OSError):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1 if snap.dataplane.alive else 0)
        yield up
        yield from self._families(snap)

    def _families(self, s: st.Snapshot) -> Iterator[Metric]:
        d = s.dataplane
        info = InfoMetricFamily("duckpipe_dataplane", "the dataplane writing the stats segment")
        info.add_metric(
            [],
            {
                "kind": d.kind,
                "pid": str(d.pid),
                "threads": d.threads,
                "control": printable(d.control),
                "stats_path": printable(d.stats_path),
            },
        )
        yield info
        g = GaugeMetricFamily(
            "duckpipe_heartbeat_age_seconds", "time since the dataplane's last heartbeat"
        )
        g.add_metric([], st.heartbeat_age_ns(s) / 1e9)
        yield g
        g = GaugeMetricFamily("duckpipe_start_time_seconds", "dataplane start, Unix time")
        g.add_metric([], d.start_time_ns / 1e9)
        yield g
        g = GaugeMetricFamily("duckpipe_epoch", "the dataplane's current epoch")
        g.add_metric([], d.epoch)
        yield g

        for name, v in s.counters.items():
            c = CounterMetricFamily(
                f"duckpipe_{_name(name)}", f"dataplane counter {name} (all agents)"
            )
            c.add_metric([], v)
            yield c
        if s.nics:
            for name in s.nics[0].counters:
                c = CounterMetricFamily(
                    f"duckpipe_nic_{_name(name)}", f"NIC worker counter {name}", labels=["nic"]
                )
                for n in s.nics:
                    c.add_metric([n.name], n.counters.get(name, 0))
                yield c
            g = GaugeMetricFamily(
                "duckpipe_nic_info",
                "a NIC worker (value: its core, -1 unpinned)",
                labels=["nic", "backend", "interface"],
            )
            for n in s.nics:
                g.add_metric([n.name, n.backend, n.interface], n.core)
            yield g

        labels = ["client", "name", "pid"]
        for field, help_ in (
            ("submits", "descriptors taken from the client's ring"),
            ("completions", "completions sent to the client"),
            ("bytes_in", "activation and weight bytes read from its slots"),
            ("bytes_out", "result bytes written to its slots"),
            ("ring_full", "times the client found its ring full"),
            ("errors", "completions with a status other than OK"),
        ):
            c = CounterMetricFamily(f"duckpipe_client_{field}", help_, labels=labels)
            for cl in s.clients:
                c.add_metric([str(cl.id), printable(cl.name), str(cl.pid)], getattr(cl, field))
            yield c
        for field, help_ in (
            ("inflight", "descriptors taken and not completed"),
            ("capacity", "ring capacity"),
            ("ring_used", "descriptors waiting in the ring, as the dataplane counts them"),
            ("page_size_bytes", "page size of the client's segment"),
        ):
            g = GaugeMetricFamily(f"duckpipe_client_{field}", help_, labels=labels)
            for cl in s.clients:
                v = {"ring_used": cl.pending, "page_size_bytes": cl.page_size}.get(
                    field, getattr(cl, field, 0)
                )
                g.add_metric([str(cl.id), printable(cl.name), str(cl.pid)], v)
            yield g

        dl = ["duck", "address", "nic"]
        for field, help_ in (
            ("timeouts", "forwards that timed out without its partial"),
            ("missing_chunks", "partial chunks missing at those timeouts"),
            ("nacks", "NACKs sent to it"),
            ("replies", "partials received complete"),
            ("moe_tokens", "MoE: tokens (reply rows) it computed, over every routed forward"),
            ("moe_expert_rows", "MoE: (token, expert) pairs it computed"),
            ("moe_failovers", "MoE: forwards whose rows for it were resent to another replica"),
        ):
            c = CounterMetricFamily(f"duckpipe_duck_{field}", help_, labels=dl)
            for du in s.ducks:
                c.add_metric([str(du.id), du.address, du.nic], getattr(du, field))
            yield c
        g = GaugeMetricFamily("duckpipe_duck_layers", "layers loaded on the duck", labels=dl)
        for du in s.ducks:
            g.add_metric([str(du.id), du.address, du.nic], du.layers)
        yield g
        g = GaugeMetricFamily(
            "duckpipe_duck_last_reply_seconds", "the duck's latest reply time", labels=dl
        )
        for du in s.ducks:
            g.add_metric([str(du.id), du.address, du.nic], du.last_reply_ns / 1e9)
        yield g
        g = GaugeMetricFamily(
            "duckpipe_duck_state", "1 for the duck's state (up, late, lost)", labels=[*dl, "state"]
        )
        for du in s.ducks:
            for state in _DUCK_STATES:
                g.add_metric([str(du.id), du.address, du.nic, state], int(du.state == state))
        yield g
        g = GaugeMetricFamily(
            "duckpipe_duck_reason",
            "1 for why the duck is not up (never_answered, silent, missed_forward)",
            labels=[*dl, "reason"],
        )
        for du in s.ducks:
            for reason in _DUCK_REASONS:
                g.add_metric([str(du.id), du.address, du.nic, reason], int(du.reason == reason))
        yield g
        h = HistogramMetricFamily(
            "duckpipe_duck_reply_seconds",
            "per duck: forward picked up -> its partial complete",
            labels=["duck"],
        )
        for du in s.ducks:
            h.add_metric([str(du.id)], _buckets(du.reply), du.reply.sum_ns / 1e9)
        yield h

        yield from self._moe(s)

        h = HistogramMetricFamily(
            "duckpipe_latency_seconds",
            "forwards: end to end (client submit -> completion sent) and each phase",
            labels=["phase"],
        )
        for phase, hist in s.latency.items():
            if phase != "reply_spread":
                h.add_metric([phase], _buckets(hist), hist.sum_ns / 1e9)
        yield h
        spread = s.latency.get("reply_spread")
        if spread is not None:
            h = HistogramMetricFamily(
                "duckpipe_reply_spread_seconds", "first duck's partial complete -> last duck's"
            )
            h.add_metric([], _buckets(spread), spread.sum_ns / 1e9)
            yield h

    def _moe(self, s: st.Snapshot) -> Iterator[Metric]:
        """Each MoE layer's load: its totals, imbalance and hottest experts (bounded)."""
        for field, help_ in (
            ("forwards", "MoE layer: routed forwards completed"),
            ("tokens", "MoE layer: tokens of those forwards"),
            ("entries", "MoE layer: (token, expert) choices (-1 left out)"),
            ("no_expert", "MoE layer: -1 choices (no expert, no duck)"),
        ):
            c = CounterMetricFamily(f"duckpipe_moe_layer_{field}", help_, labels=["layer"])
            for la in s.moe_layers:
                c.add_metric([str(la.layer)], getattr(la, field))
            yield c
        g = GaugeMetricFamily(
            "duckpipe_moe_layer_imbalance",
            "MoE layer: max / mean routed rows of its ducks (1: even), in the last ~1 s "
            "window or since start",
            labels=["layer", "window"],
        )
        for la in s.moe_layers:
            for window, x in (("recent", la.imbalance(recent=True)), ("total", la.imbalance())):
                if x is not None:
                    g.add_metric([str(la.layer), window], x)
        yield g
        c = CounterMetricFamily(
            "duckpipe_moe_expert_tokens",
            f"MoE: tokens that chose the expert (its replicas together); each layer's "
            f"{EXPORT_EXPERTS} hottest experts since start",
            labels=["layer", "expert"],
        )
        for la in s.moe_layers:
            for x in la.hottest(EXPORT_EXPERTS):
                c.add_metric([str(la.layer), str(x.expert)], x.tokens)
        yield c
        u = s.moe_untracked
        for field, help_ in (
            ("forwards", "MoE: routed forwards of layers past the stats segment's layer slots"),
            ("tokens", "MoE: their tokens"),
        ):
            c = CounterMetricFamily(f"duckpipe_moe_untracked_{field}", help_)
            c.add_metric([], getattr(u, field))
            yield c


def registry(stats: str | Path | None = None, control: str | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(stats, control))  # type: ignore[arg-type]
    return reg


def render(stats: str | Path | None = None, control: str | None = None) -> str:
    """One scrape's text (what /metrics answers)."""
    return generate_latest(registry(stats, control)).decode()


def serve(
    port: int, address: str = "127.0.0.1", *, stats: str | None = None, control: str | None = None
) -> int:
    """Serve /metrics until SIGINT or SIGTERM."""
    collector = SnapshotCollector(stats, control)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)  # type: ignore[arg-type]
    try:
        server, _thread = start_http_server(port, address, registry=reg)
    except OSError as e:
        raise DuckpipeError(f"cannot listen on {address}:{port}: {e}; choose --port") from None
    print(
        f"duckpipe exporter: http://{address}:{server.server_port}/metrics "
        f"(stats segment {collector.path()})",
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.shutdown()
    return 0
