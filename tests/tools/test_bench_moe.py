"""``duckpipe bench moe``: its table from made-up samples (the ratios, the columns, the
markdown), the dense baseline's banks, the sizes, and the quick run itself against the C
dataplane (every row and column there, every number finite; timings never asserted)."""

from __future__ import annotations

import math
import random
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

# tests/tools is on sys.path (pytest's default "prepend" import mode): its helpers
from test_bench import assert_complete, assert_markdown, needs_c, run_bench, table

from duckpipe.bench import SECTIONS
from duckpipe.bench import moe as bm
from duckpipe.bench import moe_floor as mf
from duckpipe.bench.common import Size
from duckpipe.bench.report import table_markdown
from duckpipe.client.models import shard_bounds, shard_sizes
from duckpipe.demo.moe_shape import default_placement
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.ducks import DucksProcess
from duckpipe.moe import MoeMlp


def test_moe_is_a_section_and_quick_measures_one_batch_size():
    assert "moe" in SECTIONS
    full, quick, smoke = (bm.config(Size(n)) for n in ("full", "quick", "smoke"))
    assert full.tokens == (1, 8, 32) and full.ducks == 32
    assert len(quick.tokens) == 1 and len(smoke.tokens) == 1
    for c in (full, quick, smoke):
        assert bm.N_EXPERTS % c.ducks == 0  # equal banks: the dense shards are the banks


def _samples(e2e_us: float, compute_us: list[float], tx: int, moe: int) -> bm.Samples:
    return bm.Samples(
        e2e_ns=[int(e2e_us * 1e3)] * 10,
        compute_ns=[[int(c * 1e3) for c in compute_us]] * 10,
        counters={"tx_bytes": tx * 10, "moe_bytes": moe * 10, "moe_unicasts": 20},
        max_rel_diff=1e-4,
    )


def test_rows_and_ratios_to_the_dense_baseline_from_made_up_samples():
    cfg = bm.config(Size("smoke"))
    rows = [
        bm.summarise(cfg, 8, "broadcast", _samples(400, [50, 70], tx=5000, moe=4500)),
        bm.summarise(cfg, 8, "unicast", _samples(300, [50, 70], tx=2500, moe=2000)),
        bm.summarise(cfg, 8, "dense", _samples(800, [100, 100, 100, 100], tx=10000, moe=0)),
    ]
    bm.ratios(rows)
    by = {r["mode"]: r for r in rows}
    assert by["unicast"]["p50_us"] == 300 and by["unicast"]["tx_bytes_per_call"] == 2500
    assert by["unicast"]["moe_bytes_per_call"] == 2000
    assert by["unicast"]["moe_unicasts_per_call"] == 2
    assert by["broadcast"]["duck_compute_sum_p50_us"] == 120
    assert by["broadcast"]["duck_compute_max_p50_us"] == 70
    assert by["broadcast"]["ducks_per_call"] == 2 and by["dense"]["ducks_per_call"] == 4
    assert by["broadcast"]["p50_vs_dense"] == 0.5 and by["unicast"]["bytes_vs_dense"] == 0.25
    assert by["unicast"]["compute_vs_dense"] == 0.3 and by["dense"]["p50_vs_dense"] == 1.0
    text = table_markdown(bm.Table(key="moe", title="moe t", columns=bm.COLUMNS, rows=rows))
    assert_markdown(text, "moe t", [{"heading": h} for _, h in bm.COLUMNS])
    line = next(ln for ln in text.splitlines() if "| unicast |" in ln)
    cells = "| 300 | 300 | 2,500 | 2,000 | 120 | 70.0 | 2.00 | 0.38 | 0.25 | 0.30 | 1.00e-04 |"
    assert line.endswith(cells)


def test_a_batch_without_its_dense_row_gets_no_ratio():
    cfg = bm.config(Size("smoke"))
    rows = [bm.summarise(cfg, 1, "unicast", _samples(300, [5], tx=1, moe=1))]
    bm.ratios(rows)
    assert math.isnan(rows[0]["p50_vs_dense"])  # type: ignore[arg-type]


def test_the_dense_baseline_holds_each_ducks_bank_in_the_moe_loads_order():
    ducks = [0, 1, 2, 3]
    moe = MoeMlp.random(16, 8, 2, shared=False, seed=5)
    placement = default_placement(16, ducks)
    dense = bm._banks_as_dense(moe, placement, ducks)
    bounds = shard_bounds(shard_sizes(dense.ffn, len(ducks)))
    for d, (lo, hi) in zip(ducks, bounds, strict=True):
        mine = [moe.experts[e] for e in range(16) if placement[e] == d]  # ascending ids
        np.testing.assert_array_equal(dense.w_gate[:, lo:hi], np.hstack([m.w_gate for m in mine]))
        np.testing.assert_array_equal(dense.w_down[lo:hi], np.vstack([m.w_down for m in mine]))
    # every duck computes every token: the sum of all experts at weight 1
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    every = sum(e.reference(x) for e in moe.experts)
    np.testing.assert_allclose(dense.reference(x), every, rtol=1e-4, atol=1e-5)


@needs_c
@pytest.mark.slow  # the quick size: one batch of 8 tokens, three modes, under ~20 s
def test_bench_moe_quick_has_every_mode_column_and_a_checked_result(tmp_path: Path) -> None:
    t0 = time.monotonic()
    stdout, doc = run_bench(tmp_path, "moe", size="--quick")
    took = time.monotonic() - t0
    assert doc["sections"] == ["moe"]
    t = table(doc, "moe")
    assert_complete(t)
    assert_markdown(stdout, t["title"], t["columns"])
    assert [r["mode"] for r in t["rows"]] == list(bm.MODES)
    by = {r["mode"]: r for r in t["rows"]}
    cfg = bm.config(Size("quick"))
    assert {r["tokens"] for r in t["rows"]} == set(cfg.tokens)
    for r in t["rows"]:
        assert r["calls"] == cfg.iters and r["max_rel_diff"] <= 5e-3, r
        assert r["tx_bytes_per_call"] > 0
    assert by["dense"]["moe_bytes_per_call"] == 0 and by["dense"]["ducks_per_call"] == cfg.ducks
    assert by["broadcast"]["moe_bytes_per_call"] > 0 and by["unicast"]["moe_bytes_per_call"] > 0
    assert by["broadcast"]["moe_broadcasts_per_call"] >= 1
    assert by["unicast"]["moe_unicasts_per_call"] >= 1
    # the routed modes compute each token on its experts' ducks only
    assert by["broadcast"]["ducks_per_call"] <= cfg.ducks
    assert by["dense"]["p50_vs_dense"] == 1.0
    # the shared expert on its default set: within 1.05x of the minimum at every batch
    shared = table(doc, "moe_shared")
    assert_complete(shared)
    assert {r["tokens"] for r in shared["rows"]} == set(cfg.shared_tokens)
    for r in shared["rows"]:
        assert r["max_rel_diff"] <= 5e-3, r
        if r["shared_set"].startswith("default"):
            assert 0.95 <= r["bytes_vs_min"] <= 1.05, r
    # against the C floor: per duck count and batch size the floor's row and each mode's,
    # every ratio a number (the floor's own 1.0), the sums right, nothing lost
    fl, ph = table(doc, "moe_floor"), table(doc, "moe_floor_phases")
    assert_markdown(stdout, fl["title"], fl["columns"])
    assert_markdown(stdout, ph["title"], ph["columns"])
    assert_complete(fl)
    fcfg = mf.floor_config(Size("quick"))
    want = [(d, t, n) for d in fcfg.ducks for t in fcfg.tokens for n in (mf.FLOOR, *mf.MODES)]
    assert [(r["ducks"], r["tokens"], r["name"]) for r in fl["rows"]] == want
    for r in fl["rows"]:
        assert r["calls"] == fcfg.per_round(r["tokens"]) * fcfg.rounds, r
        assert r["max_rel_diff"] <= 5e-3 and r["lost"] == 0, r
        assert 1.0 <= r["wire_vs_min"] < 3, r  # the minimum is a minimum
        if r["name"] == mf.FLOOR:
            assert r["p50_vs_floor"] == r["p99_vs_floor"] == r["cpu_vs_floor"] == 1.0
        else:
            assert r["moe_bytes_per_call"] > 0 and r["timeouts_per_call"] == 0, r
    # and what the ducks' compute is worth on this machine: the emulator beside numpy
    em = table(doc, "emulator")
    assert_markdown(stdout, em["title"], em["columns"])
    assert {r["rows"] for r in em["rows"]} == {1, 8, 32}
    for r in em["rows"]:
        assert r["gflops"] > 0 and r["numpy_gflops"] > 0 and r["vs_numpy"] > 0, r
    print(f"bench moe --quick took {took:.1f} s")


def test_the_minimum_counts_each_needed_duck_once_per_token():
    placement = [0, 0, 1, 1, 2, 2, 3, 3]  # expert e on duck e // 2
    idx = np.array([[0, 1], [2, 4], [-1, -1], [6, 0]])
    # token 0: ducks {0} + set {3}; token 1: {1, 2, 3}; token 2: {3}; token 3: {3, 0}
    assert bm.minimum_bytes(idx, placement, [3], row_bytes=10) == (2 + 3 + 1 + 2) * 10
    # a set duck that a token routes to anyway costs that token nothing more
    assert bm.minimum_bytes(idx, placement, [0], row_bytes=10) == (1 + 3 + 1 + 2) * 10
    cfg = bm.config(Size("smoke"))
    s = _samples(100, [10, 10], tx=0, moe=0)
    s.counters["moe_bytes"] = 10 * 8 * 105  # 10 calls of 8 tokens, 105 bytes a token
    row = bm.summarise_shared(cfg, 8, "default [0]", s, min_bytes=10 * 8 * 100)
    assert row["moe_bytes_per_token"] == 105 and row["min_bytes_per_token"] == 100
    assert row["bytes_vs_min"] == pytest.approx(1.05)


# --------------------------------------------------------------- duckpipe-floor --moe


def _gate(rng: np.random.Generator, tables: int, tokens: int, experts: int, topk: int):
    """Distinct experts per token (a top-k's), weights of either sign."""
    idx = np.stack([
        np.stack([rng.choice(experts, topk, replace=False) for _ in range(tokens)])
        for _ in range(tables)
    ]).astype(np.int32)  # fmt: skip
    w = rng.uniform(-1.5, 2.0, idx.shape).astype(np.float32)
    return idx, w


def _run_floor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [str(find_binary("duckpipe-floor")), "--moe", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _floor_lines(stdout: str) -> tuple[list[list[int]], dict[str, list[str]]]:
    fwd, rest = [], {}
    for line in stdout.splitlines():
        f = line.split()
        if f[0] == "fwd":
            fwd.append([int(v) for v in f[1:]])
        else:
            rest[f[0]] = f[1:]
    return fwd, rest


@needs_c
def test_floor_moe_adds_up_what_echo_ducks_answer_for_each_token(tmp_path: Path) -> None:
    ducks, hidden, tokens, experts, topk, iters, warmup = 4, 96, 6, 16, 3, 3, 1
    idx, w = _gate(np.random.default_rng(7), 2, tokens, experts, topk)
    routing = tmp_path / "routing.bin"
    routing.write_bytes(idx.tobytes() + w.tobytes())
    out = tmp_path / "out.bin"
    with DucksProcess(ducks=ducks, base_port=free_udp_ports(ducks),
                      args=["--compute", "echo"]) as dk:  # fmt: skip
        p = _run_floor(
            "--ducks", str(ducks), "--base-port", str(dk.base_port), "--hidden", str(hidden),
            "--tokens", str(tokens), "--experts", str(experts), "--topk", str(topk),
            "--dtype", "f32", "--routing", str(routing), "--iters", str(iters),
            "--warmup", str(warmup), "--session", str(random.getrandbits(62) | 1),
            "--out", str(out),
        )  # fmt: skip
    assert p.returncode == 0, p.stderr
    fwd, rest = _floor_lines(p.stdout)
    assert len(fwd) == iters and all(len(f) == 7 for f in fwd)
    assert all(f[5] == 0 for f in fwd)  # none lost
    assert float(rest["check"][0]) <= 1e-5 and int(rest["cpu"][1]) == iters
    # the sums, checked here on their own: the last forward used table (warmup+iters-1) % 2
    placement = default_placement(experts, list(range(ducks)))
    x = (((np.arange(tokens * hidden) % 97) - 48) * np.float32(0.01)).reshape(tokens, hidden)
    last = (warmup + iters - 1) % 2
    scale = (w[last] * (np.asarray(placement)[idx[last]] + 1)).sum(axis=1)
    got = np.fromfile(out, np.float32).reshape(tokens, hidden)
    np.testing.assert_allclose(got, scale[:, None] * x, rtol=1e-5, atol=1e-6)

    # on the wire: each routed duck its one-section table and its distinct rows, no more
    def wire(t: int) -> int:
        where = np.asarray(placement)[idx[t]]
        mine = [where == d for d in range(ducks) if (where == d).any()]
        return sum(16 + 8 + 8 * int(m.sum()) + hidden * 4 * int(m.any(1).sum()) for m in mine)

    assert int(rest["bytes"][0]) == sum(wire(k % 2) for k in range(warmup, warmup + iters))


@needs_c
def test_floor_moe_fails_on_sums_that_are_not_the_echo(tmp_path: Path) -> None:
    # ducks computing the (never loaded, all zero) experts: every output row is 0
    with DucksProcess(ducks=2, base_port=free_udp_ports(2)) as dk:
        p = _run_floor("--ducks", "2", "--base-port", str(dk.base_port), "--hidden", "64",
                       "--tokens", "3", "--experts", "8", "--topk", "2", "--iters", "1",
                       "--warmup", "0", "--session", str(random.getrandbits(62) | 1))  # fmt: skip
    assert p.returncode == 3, p.stdout + p.stderr
    assert "--compute echo" in p.stderr


@needs_c
def test_floor_moe_refuses_a_routing_file_of_the_wrong_size(tmp_path: Path) -> None:
    bad = tmp_path / "routing.bin"
    bad.write_bytes(b"\0" * 20)
    p = _run_floor("--base-port", "1", "--tokens", "2", "--topk", "2", "--routing", str(bad))
    assert p.returncode == 1
    assert "are not 1..4096 tables of 2 tokens x 2" in p.stderr


# ----------------------------------------------------------- bench moe's floor table


def _calls(e2e_us: list[float], cpu_us: float, wire: int, **phases: float) -> mf.Calls:
    c = mf.Calls(e2e=[int(v * 1e3) for v in e2e_us], cpu_s=cpu_us * len(e2e_us) / 1e6,
                 wire_bytes=wire * len(e2e_us), max_rel_diff=1e-4)  # fmt: skip
    for _ in e2e_us:
        c.add(**{k: int(v * 1e3) for k, v in phases.items()})
    return c


def test_floor_rows_carry_ratios_to_the_floor_of_their_own_size():
    rows = []
    for tokens in (1, 8):
        least = 100 * 10 * tokens  # 100 bytes a token, 10 calls
        floor = _calls([100] * 10, 50, 105 * tokens, submit=2, send=20, duck_compute_sum=30)
        uni = _calls([110] * 10, 75, 105 * tokens, submit=20, prepare=5, send=25)
        bro = _calls([150 * tokens] * 10, 100, 200 * tokens)
        for name, c in (("floor", floor), ("unicast", uni), ("broadcast", bro)):
            rows.append(mf.summarise("c", 8, tokens, name, c, least))
    rows.append(mf.summarise("c", 32, 1, "auto", _calls([1] * 10, 1, 1), 10))  # no floor row
    mf.ratios(rows)
    by = {(r["tokens"], r["name"]): r for r in rows if r["ducks"] == 8}
    assert by[1, "floor"]["p50_vs_floor"] == 1.0 and by[1, "floor"]["cpu_vs_floor"] == 1.0
    assert by[1, "unicast"]["p50_vs_floor"] == pytest.approx(1.1)
    assert by[1, "unicast"]["cpu_vs_floor"] == pytest.approx(1.5)
    assert by[8, "broadcast"]["p50_vs_floor"] == pytest.approx(12.0)  # 8 tokens' floor
    assert by[8, "broadcast"]["wire_vs_min"] == pytest.approx(2.0)
    assert by[8, "unicast"]["wire_bytes_per_token"] == 105
    assert by[8, "unicast"]["wire_vs_min"] == pytest.approx(1.05)
    assert by[1, "unicast"]["submit_p50_us"] == 20 and by[1, "unicast"]["prepare_p50_us"] == 5
    assert math.isnan(by[1, "floor"]["prepare_p50_us"])  # the floor has no such phase
    assert math.isnan(rows[-1]["p50_vs_floor"])
    text = table_markdown(bm.Table(key="f", title="f t", columns=mf.COLUMNS, rows=rows))
    assert_markdown(text, "f t", [{"heading": h} for _, h in mf.COLUMNS])


def test_floor_rounds_add_up_as_one_row():
    a, b = _calls([100, 200], 10, 50, send=1), _calls([300], 40, 80, send=2)
    a.counters, b.counters = {"moe_bytes": 5}, {"moe_bytes": 7}
    b.max_rel_diff = 3e-4
    a.merge(b)
    assert a.e2e == [100_000, 200_000, 300_000] and a.phases["send"] == [1000, 1000, 2000]
    assert a.cpu_s == pytest.approx(60e-6) and a.wire_bytes == 180
    assert a.counters == {"moe_bytes": 12} and a.max_rel_diff == 3e-4
    empty = mf.Calls()
    empty.merge(a)
    assert empty.max_rel_diff == 3e-4


def test_floor_minimum_and_echo_reference_count_each_duck_of_a_token_once():
    placement = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    idx = np.array([[0, 1], [2, 4], [6, 0]])
    assert mf.minimum_bytes(idx, placement, row_bytes=10) == (1 + 2 + 2) * 10
    w = np.array([[1.0, 2.0], [0.5, -1.0], [1.0, 1.0]], np.float32)
    x = np.ones((3, 4), np.float16)
    want = mf.echo_reference(x, idx, w, placement)
    np.testing.assert_allclose(want[:, 0], [3 * 1, 0.5 * 2 - 3, 4 + 1])


def test_floor_sizes_keep_ci_short_and_cover_the_issues_grid_in_full():
    full, quick = mf.floor_config(Size("full")), mf.floor_config(Size("quick"))
    assert full.ducks == (8, 32) and full.tokens == (1, 8, 64, 256) and full.hidden == 7168
    assert quick.ducks == (8,) and len(quick.tokens) == 2 and quick.hidden == 7168
    assert sum(quick.iters.values()) <= 100
