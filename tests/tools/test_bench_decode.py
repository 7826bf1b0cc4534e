"""``duckpipe bench decode``: its sizes and options, its rows from made-up step times (the
per-layer split, the ratio to one micro-batch), and the smoke run itself against the C
dataplane and echo ducks (every column there, both ways through a step, every number
finite; timings never asserted)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

# tests/tools is on sys.path (pytest's default "prepend" import mode): its helpers
from test_bench import assert_complete, assert_markdown, needs_c, run_bench, table

from duckpipe.bench import SECTIONS
from duckpipe.bench import decode as bd
from duckpipe.bench.common import Size


def test_decode_is_a_section_whose_smallest_size_is_two_layers_of_one_batch():
    assert "decode" in SECTIONS
    full, quick, smoke = (bd.config(Size(n)) for n in ("full", "quick", "smoke"))
    assert full.batches == (1, 8, 32, 64) and full.hidden == 7168
    assert quick.hidden == 7168 and max(quick.batches) <= 8
    assert smoke.layers == 2 and smoke.batches == (2,)
    deep = bd.config(Size("quick"), layers=61, duck_us=0, attn_us=7)
    assert (deep.layers, deep.duck_us, deep.attn_us) == (61, 0, 7)


def test_rows_split_a_layer_into_host_work_blocked_time_and_overhead():
    cfg = bd.config(Size("smoke"), layers=4)
    one = bd.StepTimes(step_ns=[4_000_000] * 5, model_ns=[2_000_000] * 5,
                       blocked_ns=[1_600_000] * 5, wait_ns=[300_000] * 20,
                       echo_ns=[50_000] * 20)  # fmt: skip
    two = bd.StepTimes(step_ns=[2_000_000] * 5, model_ns=[2_400_000] * 5,
                       blocked_ns=[400_000] * 5, wait_ns=[350_000] * 40)  # fmt: skip
    rows = [bd.summarise(cfg, 8, 1, one), bd.summarise(cfg, 8, 2, two)]
    bd.ratios(rows)
    a, b = rows
    assert a["tokens_per_s"] == pytest.approx(8 / 4e-3)
    assert (a["layer_us"], a["model_host_us"], a["blocked_us"]) == (1000, 500, 400)
    assert a["overhead_us"] == pytest.approx(100) and a["wait_us"] == 300
    assert a["echo_us"] == 50 and b["echo_us"] == 0.0  # none reported
    assert a["vs_one"] == 1.0 and b["vs_one"] == pytest.approx(2.0)
    lone = [bd.summarise(cfg, 2, 2, two)]
    bd.ratios(lone)
    assert math.isnan(lone[0]["vs_one"])  # no one-micro-batch row of its batch


def test_the_decode_options_refuse_what_makes_no_model(tmp_path: Path, capsys) -> None:
    from duckpipe.cli import main

    for opt, value in (("--layers", "0"), ("--duck-us", "-1"), ("--attn-us", "-5")):
        assert main(["bench", "decode", opt, value, "--smoke", "--out", str(tmp_path / "out")]) == 2
        assert f"argument {opt}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@needs_c
def test_bench_decode_smoke_runs_both_ways_through_three_layers(tmp_path: Path) -> None:
    # about 2 s: a dense and a MoE layer loaded on 4 echo ducks, 3 layers, batch 2
    stdout, doc = run_bench(tmp_path, "decode", "--layers", "3", "--duck-us", "20")
    assert doc["sections"] == ["decode"]
    t = table(doc, "decode")
    assert_complete(t)
    assert [(r["batch"], r["micro_batches"]) for r in t["rows"]] == [(2, 1), (2, 2)]
    assert all(r["config"].startswith("3 layers (1 dense)") for r in t["rows"])
    assert all("+20 µs" in r["config"] and r["steps"] == 3 for r in t["rows"])
    assert_markdown(stdout, t["title"], t["columns"])
    assert "546 µs" in stdout and "109-112 µs" in stdout  # the reference, for scale
