"""`duckpipe demo`: the real model and the 0.6B-shaped one, on the mock and the C dataplane."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from duckpipe._abi.shm import list_segments
from duckpipe.testing import cluster_class_or_skip

minilm = pytest.importorskip("duckpipe.demo.minilm")
try:
    minilm.model_files()
except Exception as e:
    pytest.skip(str(e), allow_module_level=True)


def _demo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", "demo", *args],
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
def minilm_run(which):
    r = _demo("--json", "--repeat", "1", *which)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # stdout is exactly one JSON document


def test_embeddings_match_the_host_only_forward(minilm_run):
    model = minilm.MiniLM.load()
    emb = np.array(minilm_run["embeddings"], np.float32)
    host = model.encode(minilm_run["sentences"])
    assert np.abs(emb - host).max() < 1e-5
    assert minilm_run["max_abs_diff"] < 1e-5


def test_cosines_say_the_model_works(minilm_run):
    cos = np.array(minilm_run["cosine"])
    sents = minilm_run["sentences"]
    np.testing.assert_allclose(np.diag(cos), 1.0, atol=1e-5)
    guitar = [i for i, s in enumerate(sents) if "guitar" in s]
    onion = [i for i, s in enumerate(sents) if "onion" in s]
    assert len(guitar) == 2 and len(onion) == 2
    assert cos[guitar[0], guitar[1]] > cos[guitar[0], onion[0]] + 0.3
    assert cos[onion[0], onion[1]] > cos[onion[0], guitar[1]] + 0.3


def test_timing_table_has_every_phase(minilm_run):
    t = minilm_run["timings_us"]
    for phase in ("prepare", "send", "wait", "fetch", "reduce", "end to end", "host overhead"):
        assert t[phase]["p50_us"] >= 0 and t[phase]["p99_us"] >= t[phase]["p50_us"]
    assert minilm_run["mlp_calls"] == 6


def test_the_qwen_shape_decodes_like_its_numpy_reference(which):
    from duckpipe.demo.qwen_shape import QwenShape

    r = _demo(
        "--model",
        "qwen3-0.6b-shape",
        "--layers",
        "2",
        "--tokens",
        "3",
        "--ducks",
        "4",
        "--json",
        *which,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    want = QwenShape(layers=2, seed=0).decode(doc["tokens"])
    np.testing.assert_allclose(np.array(doc["outputs"]), want, rtol=1e-4, atol=1e-4)
    assert doc["mlp_calls"] == 2 * 3


def test_user_sentences_from_a_file(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("Ducks swim in the pond.\n\nGeese fly south in winter.\n")
    r = _demo("--mock", "--json", "--repeat", "1", "--sentences", str(path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sentences"] == ["Ducks swim in the pond.", "Geese fly south in winter."]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    r = _demo("--mock", "--sentences", str(empty))
    assert r.returncode == 1 and "no sentences" in r.stderr


def test_the_dpdk_backend_is_refused_clearly():
    r = _demo("--backend", "dpdk", "--json")
    assert r.returncode == 1 and "cannot start the dpdk backend" in r.stderr and r.stdout == ""
    assert "--control" in r.stderr  # how to use one started by hand


@pytest.mark.dataplane
def test_ctrl_c_stops_everything_it_started():
    cluster_class_or_skip()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duckpipe",
            "demo",
            "--model",
            "qwen3-0.6b-shape",
            "--layers",
            "28",
            "--tokens",
            "200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert "started" in proc.stdout.readline()
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, alive
        mine = [s.name for s in list_segments() if f"-{proc.pid}-" in s.name]
        assert not mine
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def text_run():
    return _demo("--mock", "--repeat", "2")


def test_the_ffns_are_named_as_the_models(text_run):
    r = text_run
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "ffn 0..5" in out
    assert "layer 100" not in out  # the dataplane's layer ids stay out of sight


def test_the_timing_header_lines_up_with_its_values_and_says_what_it_covers(text_run):
    lines = text_run.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("per MLP call"))
    assert "over 12 calls" in lines[title] and "2 encode(s)" in lines[title]
    header, first = lines[title + 1], lines[title + 2]
    for col in ("p50 (us)", "p99 (us)"):
        end = header.index(col) + len(col)
        # the value under the column ends where its heading ends
        assert first[end - 1] != " " and (len(first) == end or first[end] == " "), (header, first)


def test_a_pass_line_against_the_stated_tolerance(text_run):
    last = text_run.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS: ") and "tolerance 1e-04" in last


def test_fail_below_the_tolerance_exits_1():
    r = _demo("--mock", "--repeat", "1", "--tolerance", "0")
    assert r.returncode == 1
    assert r.stdout.strip().splitlines()[-1].startswith("FAIL: ")
    r = _demo("--mock", "--repeat", "1", "--tolerance", "0", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["pass"] is False and doc["tolerance"] == 0


def test_the_weights_bar_writes_no_frames_into_a_log(text_run):
    assert "\r" not in text_run.stderr and "\r" not in text_run.stdout


def test_a_missing_sentences_file_is_reported_before_anything_starts(tmp_path):
    t0 = time.monotonic()
    # with nothing at --control, anything started first would fail there instead
    r = _demo("--control", f"ipc://{tmp_path}/none", "--sentences", str(tmp_path / "no.txt"))
    assert r.returncode == 1 and "cannot read --sentences" in r.stderr, r.stderr
    assert "no dataplane" not in r.stderr and "started" not in r.stdout
    assert time.monotonic() - t0 < 30


def test_a_dataplane_given_with_control_is_reported_with_its_own_duck_count(
    duckpipe_mock_factory,
):
    # --ducks (default 8) is what the demo would start; a --control dataplane has its own
    dp = duckpipe_mock_factory(ducks=2)
    args = ("--model", "qwen3-0.6b-shape", "--layers", "1", "--tokens", "1", "--control")
    r = _demo(*args, dp.control)
    assert r.returncode == 0, r.stderr
    assert ", 2 ducks," in r.stdout and "8 ducks" not in r.stdout, r.stdout
    r = _demo(*args, dp.control, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ducks"] == 2
