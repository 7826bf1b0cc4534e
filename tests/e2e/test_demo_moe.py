"""`duckpipe demo --model deepseek-v3-moe-shape`: one DeepSeek-V3-shaped MoE layer on 8
ducks (hidden 1024 instead of 7168: the layer's 257 FP8 experts are then 0.1 GB, not 0.7
GB, to write, read and load), bf16 activations, on the mock and the C dataplane, checked
against MoeMlp.reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from duckpipe.demo.moe_shape import BATCHES, TOLERANCE, TOPK
from duckpipe.testing import cluster_class_or_skip

pytestmark = pytest.mark.slow
DUCKS = 8
CALLS = 3


def _demo(cache: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = ["demo", "--model", "deepseek-v3-moe-shape", "--cache", str(cache), *args]
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module", params=["mock", "real"])
def which(request):
    if request.param == "real":
        cluster_class_or_skip()
    return ["--mock"] if request.param == "mock" else []


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One checkpoint for the module: the first run writes it, the others read it."""
    return tmp_path_factory.mktemp("duckpipe-cache")


@pytest.fixture(scope="module")
def moe_run(which, cache):
    args = ("--ducks", str(DUCKS), "--hidden", "1024", "--calls", str(CALLS), "--json")
    r = _demo(cache, *args, *which)
    assert r.returncode == 0, r.stdout + r.stderr
    return which, json.loads(r.stdout)  # stdout is exactly one JSON document


def test_every_batch_size_passes_against_the_host_reference(moe_run):
    _, doc = moe_run
    assert doc["pass"] is True and doc["ducks"] == DUCKS and doc["hidden"] == 1024
    assert [b["tokens"] for b in doc["batches"]] == list(BATCHES)
    for b in doc["batches"]:
        assert b["calls"] == CALLS
        assert b["max_rel_error"] <= doc["tolerance"] == TOLERANCE
        assert 0 < b["p50_us"] <= b["p99_us"]


def test_the_ducks_report_the_rows_the_gate_routed_to_them(moe_run):
    which, doc = moe_run
    for b in doc["batches"]:
        assert 1 <= b["routed_ducks_per_token"] <= DUCKS
        if b["measured_ducks_per_token"] is None:  # a dataplane without a stats segment
            assert which == ["--mock"]
            continue
        # the ducks' reply rows: a token's routed ducks and the shared expert's one duck
        # (the default set), not every duck
        routed = b["routed_ducks_per_token"]
        assert routed <= b["measured_ducks_per_token"] <= routed + 1 + 1e-9
        assert b["expert_rows_per_token"] == pytest.approx(TOPK)


def test_the_wire_bytes_per_token_are_the_activation_and_a_table_at_least(moe_run):
    which, doc = moe_run
    row = 1024 * 2  # one bf16 activation row
    for b in doc["batches"]:
        if b["wire_bytes_per_token"] is None:
            assert which == ["--mock"]
            continue
        assert b["wire_bytes_per_token"] >= row


def test_the_text_report_names_the_reference_cluster_and_says_pass(cache):
    r = _demo(cache, "--ducks", "4", "--hidden", "256", "--calls", "1", "--mock")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "16.17 tokens/s" in r.stdout and "other hardware" in r.stdout
    assert "the shared expert's ducks (its default set, shared_ducks) compute every" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("PASS: largest relative difference")
