"""``duckpipe.bench.emulator``: the duck emulator's compute rate (``duckpipe-ducks --bench``)
beside numpy's float32 matmul, at a small shape; rates are checked to be there and finite,
never compared (the machine is shared)."""

from __future__ import annotations

import math
import subprocess

import pytest

# tests/tools is on sys.path (pytest's default "prepend" import mode): its helpers
from test_bench import needs_c

from duckpipe.bench import emulator
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary


@needs_c
def test_compute_rates_gives_the_emulator_and_numpy_per_rows_isa_and_threads():
    rates = emulator.compute_rates(hidden=256, cols=64, rows=(1, 33), threads=(1, 2), ms=20)
    assert [(r["rows"], r["isa"], r["threads"]) for r in rates] == [
        (rows, isa, t) for rows in (1, 33) for isa in ("portable", "avx2") for t in (1, 2)
    ]
    for r in rates:
        assert r["numpy_gflops"] > 0 and math.isfinite(r["numpy_gflops"])
        if "skipped" in r:  # a CPU without AVX2 says so instead
            assert r["isa"] == "avx2" and "lacks" in r["skipped"], r
            continue
        assert r["gflops"] > 0 and r["weight_gbytes_per_s"] > 0 and r["vs_numpy"] > 0, r


@needs_c
def test_an_isa_the_emulator_does_not_know_is_skipped_with_its_message():
    (r,) = emulator.compute_rates(hidden=64, cols=16, rows=(1,), isas=("sse9",), threads=(1,), ms=5)
    assert "--isa must be auto, avx2 or portable" in r["skipped"] and "gflops" not in r


@needs_c
def test_the_bench_option_refuses_a_malformed_shape():
    for spec in ("7168", "7168,128", "0,128,1", "7168,128,1,5,9", "a,b,c"):
        p = subprocess.run(
            [str(find_binary("duckpipe-ducks")), "--bench", spec],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        assert p.returncode == 2 and "--bench must be" in p.stderr, (spec, p.stderr)


@pytest.mark.parametrize("isa", ["portable", "avx2"])
@needs_c
def test_emulator_rate_parses_the_bench_line(isa):
    try:
        r = emulator.emulator_rate(128, 32, 4, isa=isa, threads=1, ms=5)
    except DuckpipeError as e:  # only a CPU without AVX2 may refuse
        assert isa == "avx2" and "lacks" in str(e)
        return
    assert r["isa"] == isa and r["threads"] == 1 and r["hidden"] == 128 and r["rows"] == 4
    assert r["experts"] == emulator.EXPERTS and r["expert_calls"] >= emulator.EXPERTS
