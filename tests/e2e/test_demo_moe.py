"""`duckpipe demo --model deepseek-v3-moe-shape`: one DeepSeek-V3-shaped MoE layer on 8
ducks (hidden 1024 instead of 7168: the layer's 257 experts are then 0.2 GB, not 1.4 GB,
to make and load), on the mock and the C dataplane, checked against MoeMlp.reference."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from duckpipe.demo.moe_shape import BATCHES, TOPK
from duckpipe.testing import cluster_class_or_skip

pytestmark = pytest.mark.slow
DUCKS = 8
CALLS = 3


def _demo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", "demo", "--model", "deepseek-v3-moe-shape", *args],
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
def moe_run(which):
    r = _demo("--ducks", str(DUCKS), "--hidden", "1024", "--calls", str(CALLS), "--json", *which)
    assert r.returncode == 0, r.stdout + r.stderr
    return which, json.loads(r.stdout)  # stdout is exactly one JSON document


def test_every_batch_size_passes_against_the_host_reference(moe_run):
    _, doc = moe_run
    assert doc["pass"] is True and doc["ducks"] == DUCKS and doc["hidden"] == 1024
    assert [b["tokens"] for b in doc["batches"]] == list(BATCHES)
    for b in doc["batches"]:
        assert b["calls"] == CALLS
        assert b["max_rel_error"] <= doc["tolerance"] == 5e-3
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
    row = 1024 * 2  # one float16 activation row
    for b in doc["batches"]:
        if b["wire_bytes_per_token"] is None:
            assert which == ["--mock"]
            continue
        assert b["wire_bytes_per_token"] >= row


def test_the_text_report_names_the_reference_cluster_and_says_pass():
    r = _demo("--ducks", "4", "--hidden", "256", "--calls", "1", "--mock")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "16.17 tokens/s" in r.stdout and "other hardware" in r.stdout
    assert "the shared expert's ducks (its default set, shared_ducks) compute every" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("PASS: largest relative difference")
