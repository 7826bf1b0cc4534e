"""The MoE demo's and bench's glue against a stand-in client that follows the agreed API
(/tmp spec section 5: ``submit(slot, layer, routing=(indices, weights), moe_send=...)``)
and computes with ``MoeMlp.reference``: what they send, how they difference the counters,
and that a wrong result fails their checks. The real thing: tests/e2e/test_demo_moe.py
and tests/tools/test_bench_moe.py, once the MoE client and dataplane are in."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from duckpipe.bench import moe as bm
from duckpipe.demo import moe_shape as ms
from duckpipe.demo import run as demo_run

ROW_TABLE = 24  # made-up wire bytes per routed row, for the counter arithmetic


class FakeForward:
    def __init__(self, y: np.ndarray, timings) -> None:
        self.y, self.timings = y, timings

    def result(self, timeout: float | None = None) -> np.ndarray:
        return self.y

    def __enter__(self) -> FakeForward:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeClient:
    """Answers forwards with the host reference (``wrong`` adds 1 to every result) and
    counts moe_bytes / tx_bytes as a dataplane would count them."""

    def __init__(self, moe, dense=None, *, wrong: bool = False) -> None:
        self.moe, self.dense, self.wrong = moe, dense, wrong
        self.counters = {"moe_bytes": 0, "tx_bytes": 0, "moe_broadcasts": 0, "moe_unicasts": 0}
        self.sent: list[tuple[int, str | None]] = []

    def stats(self):
        return types.SimpleNamespace(counters=dict(self.counters))

    @contextlib.contextmanager
    def claim(self, shape, dtype):
        yield types.SimpleNamespace(array=np.empty(shape, dtype))

    def submit(self, slot, layer, *, routing=None, moe_send="auto"):
        x = slot.array.copy()
        if routing is None:
            y = self.dense.reference(x)
            self.sent.append((layer, None))
            duck_ns = [1000] * 4
        else:
            indices, weights = routing
            y = self.moe.reference(x, indices, weights)
            self.sent.append((layer, moe_send))
            self.counters["moe_bytes"] += x.nbytes + ROW_TABLE * x.shape[0]
            self.counters["moe_" + ("unicasts" if moe_send == "unicast" else "broadcasts")] += 1
            duck_ns = [500, 700]
        self.counters["tx_bytes"] += x.nbytes
        if self.wrong:
            y = y + np.ones_like(y)
        timings = types.SimpleNamespace(prepare_ns=1, send_ns=2, wait_ns=3000, fetch_ns=4,
                                        reduce_ns=5, duck_compute_ns=duck_ns)  # fmt: skip
        return FakeForward(y, timings)


@pytest.fixture(scope="module")
def shape(tmp_path_factory):
    """The demo's layer at hidden 32, its FP8 checkpoint written once for the module."""
    return ms.MoeShape(cache=tmp_path_factory.mktemp("moe-cache"), hidden=32, seed=1)


def test_the_demo_times_checks_and_counts_each_batch(monkeypatch, shape):
    placement = ms.default_placement(256, list(range(8)))
    client = FakeClient(shape.moe)
    monkeypatch.setattr(demo_run, "_duck_moe_rows", lambda control: None)
    r = demo_run._moe_batch(client, "ipc:///none", shape, placement, 8, 3)
    assert client.sent == [(demo_run.MOE_LAYER, "auto")] * (demo_run.MOE_WARMUP + 3)
    assert r.tokens == 8 and r.calls == 3 and r.max_rel_error < 1e-3
    # the counter over the timed calls only, per token
    assert r.wire_bytes_per_token == 32 * 2 + ROW_TABLE
    assert r.measured_ducks_per_token is None and r.expert_rows_per_token is None
    want = np.mean([ms.routed_ducks(shape.batch(8, k)[1], placement).mean() for k in range(3)])
    assert r.routed_ducks_per_token == pytest.approx(want)
    assert 1 <= r.routed_ducks_per_token <= 8 and r.ducks_per_call >= r.routed_ducks_per_token
    assert r.p50_us > 0 and r.duck_compute_p50_us == 0.7


def test_the_demo_reports_the_ducks_own_counts_when_the_stats_segment_has_them(monkeypatch, shape):
    placement = ms.default_placement(256, list(range(8)))
    reads = iter([(100, 400), (100 + 2 * 8 * 3, 400 + 8 * 8 * 3)])  # before, after the timed
    monkeypatch.setattr(demo_run, "_duck_moe_rows", lambda control: next(reads))
    r = demo_run._moe_batch(FakeClient(shape.moe), "ipc:///none", shape, placement, 8, 3)
    assert r.measured_ducks_per_token == 2.0 and r.expert_rows_per_token == 8.0


def test_a_wrong_result_fails_the_demos_check(monkeypatch, shape):
    placement = ms.default_placement(256, list(range(8)))
    monkeypatch.setattr(demo_run, "_duck_moe_rows", lambda control: None)
    r = demo_run._moe_batch(FakeClient(shape.moe, wrong=True), "", shape, placement, 1, 2)
    assert not ms.passed([r], ms.TOLERANCE)


@pytest.mark.parametrize("mode", bm.MODES)
def test_the_bench_sends_each_mode_as_asked_and_differences_the_counters(mode):
    from duckpipe.moe import Gate, MoeMlp

    moe = MoeMlp.random(256, 16, 2, shared=False, dtype=np.float16, seed=1)
    dense = bm._banks_as_dense(moe, ms.default_placement(256, [0, 1, 2, 3]), [0, 1, 2, 3])
    gate = Gate.deepseek_v3(16, seed=2)
    rng = np.random.default_rng(0)

    def batch():
        x = rng.standard_normal((4, 16), np.float32).astype(np.float16)
        i, w = gate(x)
        return x, i, w

    client = FakeClient(moe, dense)
    s = bm._measure(client, mode, ([batch()], [batch(), batch()]), moe, dense)
    want = (bm.LAYER_DENSE, None) if mode == "dense" else (bm.LAYER_MOE, mode)
    assert client.sent == [want] * 3
    assert len(s.e2e_ns) == 2 and s.max_rel_diff < 1e-3
    assert s.counters["tx_bytes"] == 2 * 4 * 16 * 2  # the timed calls only
    assert s.counters["moe_bytes"] == (0 if mode == "dense" else 2 * (4 * 16 * 2 + 4 * ROW_TABLE))
    assert s.compute_ns == ([[1000] * 4] * 2 if mode == "dense" else [[500, 700]] * 2)
    wrong = bm._measure(FakeClient(moe, dense, wrong=True), mode, ([], [batch()]), moe, dense)
    assert wrong.max_rel_diff > 1e-2


def test_the_demos_json_is_one_document_with_every_batch(monkeypatch, shape):
    import argparse
    import json

    placement = ms.default_placement(256, list(range(8)))
    monkeypatch.setattr(demo_run, "_duck_moe_rows", lambda control: None)
    reports = [
        demo_run._moe_batch(FakeClient(shape.moe), "", shape, placement, t, 2) for t in (1, 8)
    ]
    result = {"model": "deepseek-v3-moe-shape", "reports": reports, "shape": shape, "ducks": 8}
    args = argparse.Namespace(json=True, tolerance=ms.TOLERANCE, hidden=32)
    ok, text = demo_run._moe_output(result, args, "c")
    doc = json.loads(text)
    assert ok and doc["pass"] is True and doc["ducks"] == 8 and doc["dataplane"] == "c"
    assert [b["tokens"] for b in doc["batches"]] == [1, 8]
    assert doc["batches"][1]["tokens_per_s"] == pytest.approx(8 / (reports[1].p50_us / 1e6))
    assert doc["reference_cluster_decode_tokens_per_s"] == 16.17
    args.json = False
    ok, text = demo_run._moe_output(result, args, "c")
    assert ok and text.rstrip().splitlines()[-1].startswith("PASS")
