"""The mixture-of-experts figures in the views (issue 16): each duck's tokens and (token,
expert) rows and the MoE counters, read from a real stats segment (the mock's writer, with
the MoE fields stored as the C dataplane stores them), shown by ``duckpipe stats`` (text
and --json), duckpipe-top (--once, --json, and its panes) and the exporter; and not shown
by the human views while every MoE figure is zero (a dense model's run)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import duckpipe
from duckpipe.cli import main
from duckpipe.mock.stats_writer import StatsWriter
from duckpipe.observe import exporter
from duckpipe.observe import topview as tv
from duckpipe.observe.stats_reader import MOE_COUNTERS, moe_active, read_snapshot
from duckpipe.schema.stats import COUNTER_NAMES, STATS_MOE_LAYERS

REPO = Path(duckpipe.__file__).resolve().parent.parent
NDUCKS = 4
#: duck -> (tokens, (token, expert) rows): duck 2 took no routed token
MOE_ROWS = {0: (12, 20), 1: (7, 9), 3: (30, 35)}
MOE_TOTALS = {
    "moe_forwards": 6,
    "moe_broadcasts": 4,
    "moe_unicasts": 2,
    "moe_bytes": 3 << 20,
    "rx_unrouted": 1,
    "moe_no_duck_forwards": 1,
    "moe_copied_bytes": 64,
    "moe_no_live_replica": 1,
    "moe_rows_rerouted": 8,
    "moe_failovers": 3,
    "moe_failover_late": 7,
}


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[StatsWriter]:
    """A stats segment of a live dataplane (this process) with 4 ducks, every counter 0."""
    w = StatsWriter(f"ipc://{tmp_path}/control", NDUCKS)
    w.counters = dict.fromkeys(COUNTER_NAMES, 0)
    w.counters["forwards"] = w.counters["forwards_ok"] = 10
    w.tick(w.counters, 1)
    try:
        yield w
    finally:
        w.close()


def write_moe(w: StatsWriter, scale: int = 1) -> None:
    """The MoE figures of a run, ``scale`` times over (a later snapshot of the same run)."""
    ducks = w.v["ducks"]
    for d, (tokens, rows) in MOE_ROWS.items():
        ducks["moe_tokens"][d] = tokens * scale
        ducks["moe_expert_rows"][d] = rows * scale
    w.counters.update({k: v * scale for k, v in MOE_TOTALS.items()})
    w.tick(w.counters, 1)


def test_the_moe_counters_are_the_schemas():
    assert set(MOE_COUNTERS) <= set(COUNTER_NAMES)
    assert {n for n in COUNTER_NAMES if n.startswith("moe_")} <= set(MOE_COUNTERS)


def test_the_reader_gives_each_ducks_moe_rows(segment):
    dense = read_snapshot(segment.path)
    assert all(d.moe_tokens == 0 and d.moe_expert_rows == 0 for d in dense.ducks)
    assert not moe_active(dense.counters, dense.ducks)
    write_moe(segment)
    s = read_snapshot(segment.path)
    got = {d.id: (d.moe_tokens, d.moe_expert_rows) for d in s.ducks}
    assert got == {d: MOE_ROWS.get(d, (0, 0)) for d in range(NDUCKS)}
    assert {k: s.counters[k] for k in MOE_COUNTERS} == MOE_TOTALS
    assert moe_active(s.counters, s.ducks)


def test_one_nonzero_duck_row_or_counter_is_a_moe_run(segment):
    s = read_snapshot(segment.path)
    assert moe_active({**s.counters, "moe_unicasts": 1}, [])
    segment.v["ducks"]["moe_expert_rows"][2] = 1
    s = read_snapshot(segment.path)
    assert moe_active(s.counters, s.ducks) and not moe_active(s.counters, [])


def _stats_text(path: Path, capsys, *extra: str) -> str:
    assert main(["stats", "--stats", str(path), *extra]) == 0
    return capsys.readouterr().out


def test_stats_text_shows_moe_totals_only_for_a_moe_run(segment, capsys):
    dense = _stats_text(segment.path, capsys)
    lines = dense.splitlines()  # not the whole text: its paths hold the test's name
    assert "  forwards                 10" in lines
    assert not [ln for ln in lines if ln.startswith(("  moe_", "  rx_unrouted"))]
    assert "MoE" not in dense
    write_moe(segment)
    text = _stats_text(segment.path, capsys)
    for k, v in MOE_TOTALS.items():
        assert f"  {k:<24} {v}\n" in text
    assert "duck 0 mock:0 nic mock: up" in text
    for d in range(NDUCKS):
        tokens, rows = MOE_ROWS.get(d, (0, 0))
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  duck {d} "))
        want = f", MoE {tokens} tokens, {rows} (token, expert) rows, 0 failovers"
        assert line.endswith(want), line


def test_stats_json_carries_the_moe_totals_always(segment, capsys):
    doc = json.loads(_stats_text(segment.path, capsys, "--json"))
    assert [(d["moe_tokens"], d["moe_expert_rows"]) for d in doc["ducks"]] == [(0, 0)] * NDUCKS
    write_moe(segment)
    doc = json.loads(_stats_text(segment.path, capsys, "--json"))
    got = {d["id"]: (d["moe_tokens"], d["moe_expert_rows"]) for d in doc["ducks"]}
    assert got == {d: MOE_ROWS.get(d, (0, 0)) for d in range(NDUCKS)}
    assert {k: doc["counters"][k] for k in MOE_COUNTERS} == MOE_TOTALS


def test_the_exporter_has_each_ducks_moe_rows(segment):
    write_moe(segment)
    text = exporter.render(stats=segment.path)
    for d in range(NDUCKS):
        tokens, rows = MOE_ROWS.get(d, (0, 0))
        labels = f'{{address="mock:{d}",duck="{d}",nic="mock"}}'
        assert f"duckpipe_duck_moe_tokens_total{labels} {float(tokens)}" in text
        assert f"duckpipe_duck_moe_expert_rows_total{labels} {float(rows)}" in text
    assert "duckpipe_moe_bytes_total 3.145728e+06" in text  # the Prometheus client's format
    assert "duckpipe_rx_unrouted_total 1.0" in text


def test_top_panes_show_moe_rates_only_for_a_moe_run(segment):
    first = read_snapshot(segment.path)
    second = read_snapshot(segment.path)
    dense = tv.build_view(second, first)
    assert len(dense.header) == 2
    below_control = tv.render_text(dense, 200).split("\n", 1)[1]  # the path holds "moe"
    assert "moe" not in below_control.lower()

    write_moe(segment)
    old = read_snapshot(segment.path)
    write_moe(segment, scale=3)
    new = read_snapshot(segment.path)
    # the rates over a known interval: the snapshots' own clocks, 2 s apart
    new = type(new)(**{**{f: getattr(new, f) for f in new.__struct_fields__},
                       "taken_ns": old.taken_ns + 2_000_000_000})  # fmt: skip
    rates = tv.derive_rates(new, old)
    assert rates.moe
    per_duck = {d.id: (d.moe_tokens_per_s, d.moe_expert_rows_per_s) for d in rates.ducks}
    assert per_duck == {d: tuple(float(x) for x in MOE_ROWS.get(d, (0, 0))) for d in range(4)}

    view = tv.build_view(new, old)
    assert view.header[2] == (
        "MoE forwards 18 (6.0/s), NIC parts 12 broadcast 6 unicast, wire 9 MiB "
        "(3.1M B/s), unrouted partials 3"
    )
    ducks = view.tables["ducks"]
    names = [c.name for c in ducks.columns]
    tok, exp = names.index("moe tok/s"), names.index("moe exp/s")
    rows = {r.cells[0]: r.cells for r in ducks.rows}
    assert (rows["3"][tok], rows["3"][exp]) == ("30", "35")
    assert (rows["2"][tok], rows["2"][exp]) == ("0", "0")
    nics = view.tables["nics"]
    names = [c.name for c in nics.columns]
    (nic,) = nics.rows
    assert nic.cells[names.index("moe bcast")] == "12"
    assert nic.cells[names.index("moe ucast")] == "6"
    # at 80 columns the MoE columns give way before the ones a dense run has
    narrow = tv.render_table(ducks, 80)[0][0]
    assert "moe" not in narrow and "timeouts" in narrow


def _top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe.observe.top", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_top_once_and_json_show_the_moe_figures(segment):
    r = _top("--once", "--stats", str(segment.path), "--width", "200", "-u", "0.2")
    assert r.returncode == 0, r.stderr
    assert "MoE" not in r.stdout and "moe " not in r.stdout  # the paths hold "moe_"
    write_moe(segment)
    r = _top("--once", "--stats", str(segment.path), "--width", "200", "-u", "0.2")
    assert r.returncode == 0, r.stderr
    assert "MoE forwards 6 (0/s), NIC parts 4 broadcast 2 unicast, wire 3 MiB" in r.stdout
    assert "moe tok/s" in r.stdout and "moe bcast" in r.stdout
    r = _top("--json", "--stats", str(segment.path), "-u", "0.2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rates"]["moe"] is True
    got = {d["id"]: d["moe_tokens"] for d in doc["snapshot"]["ducks"]}
    assert got == {d: MOE_ROWS.get(d, (0, 0))[0] for d in range(NDUCKS)}
    assert all(d["moe_tokens_per_s"] == 0 for d in doc["rates"]["ducks"])


# --- each MoE layer's expert load (issue 30 point 4), from the writer's own hooks -------


class _Plan:
    """What the writer reads of a MoE layer's plan: its experts and their ducks."""

    def __init__(self, n_experts: int) -> None:
        self.n_experts = n_experts
        self.ducks_of = tuple((e % NDUCKS, (e + 1) % NDUCKS)[: 1 + e % 2] for e in range(n_experts))


def _routed(w: StatsWriter, layer: int, plan: _Plan, indices: list[list[int]]) -> None:
    i = np.array(indices, np.int32)
    entries = {d: int(n) for d, n in enumerate(np.bincount(i[i >= 0] % NDUCKS)) if n}
    w.moe_forward(layer, plan, i, entries)


def test_the_exporter_has_each_layers_hottest_experts_and_imbalance(segment):
    plan = _Plan(40)
    # expert 7: 5 tokens, expert 2: 3, expert 30: 1; one -1 choice
    _routed(segment, 9, plan, [[7, 2], [7, 2], [7, 30], [7, -1], [7, 2]])
    text = exporter.render(stats=segment.path)
    assert 'duckpipe_moe_expert_tokens_total{expert="7",layer="9"} 5.0' in text
    assert 'duckpipe_moe_expert_tokens_total{expert="2",layer="9"} 3.0' in text
    assert 'duckpipe_moe_layer_no_expert_total{layer="9"} 1.0' in text
    assert 'duckpipe_moe_layer_tokens_total{layer="9"} 5.0' in text
    assert 'duckpipe_moe_layer_imbalance{layer="9",window="total"}' in text
    assert 'window="recent"' not in text  # no window has ended yet: no number, not 0
    assert "duckpipe_moe_untracked_forwards_total 0.0" in text
    # bounded: a layer's 16 hottest experts, however many it has
    _routed(segment, 9, plan, [list(range(40))])
    text = exporter.render(stats=segment.path)
    assert text.count("duckpipe_moe_expert_tokens_total{") == exporter.EXPORT_EXPERTS


def test_layers_past_the_slots_are_counted_untracked_and_shown(segment, capsys):
    plan = _Plan(4)
    for layer in range(STATS_MOE_LAYERS + 2):
        _routed(segment, layer, plan, [[0, 1], [2, -1]])
    s = read_snapshot(segment.path)
    assert len(s.moe_layers) == STATS_MOE_LAYERS
    assert (s.moe_untracked.forwards, s.moe_untracked.tokens) == (2, 4)
    assert s.moe_untracked.entries == 6
    text = _stats_text(segment.path, capsys, "--experts")
    assert f"untracked (every one of the {STATS_MOE_LAYERS} MoE layer slots taken): " in text
    assert "2 forwards, 4 tokens, 6 (token, expert) rows" in text
    assert "duckpipe_moe_untracked_forwards_total 2.0" in exporter.render(stats=segment.path)
