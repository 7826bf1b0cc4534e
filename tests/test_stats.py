"""The stats segment: what readers see agrees with what clients observed, reading it
disturbs nobody, and a missing or dead dataplane is reported plainly."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, stats
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.schema import stats as S

HIDDEN, FFN, ROWS = 32, 48, 2
N_FORWARDS = 40
TIMER_DRIVEN = {
    "pings",
    "pongs",
    "tx_packets",
    "tx_bytes",
    "rx_packets",
    "rx_bytes",
    "parks",
    "kicks",
}


def _settled(control: str, want: dict[str, int], timeout: float = 5.0) -> stats.Snapshot:
    """A snapshot once the counters in ``want`` reached their values (the writer
    publishes every ~10 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        s = stats.read_snapshot(control=control)
        if all(s.counters.get(k, 0) >= v for k, v in want.items()) or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def _run_forwards(control: str, n: int = N_FORWARDS, layer: int = 7, ducks=(0, 1, 2, 3)):
    mlp = GeluMlp.random(HIDDEN, FFN, seed=1)
    x = np.ones((ROWS, HIDDEN), np.float32)
    c = duckpipe.connect(control, name="stats-test")
    c.load_weights(layer, mlp, ducks=list(ducks))
    for _ in range(n):
        c.forward(layer, x, timeout=10)
    return c, x.nbytes


@pytest.fixture(scope="module")
def loaded(dataplane):
    """The module's dataplane after N_FORWARDS forwards of one client, still attached."""
    before = stats.read_snapshot(control=dataplane.control)
    c, nbytes = _run_forwards(dataplane.control)
    yield dataplane, c, nbytes, before
    c.close()


# --- the segment itself ------------------------------------------------------------------


def test_segment_sits_next_to_the_control_socket_with_mode_0600(dataplane):
    path = stats.find_stats(dataplane.control)
    assert path == stats.stats_path_for(dataplane.control)
    if dataplane.control.startswith("ipc://") and dataplane.control.endswith("/control"):
        assert path == Path(dataplane.control[len("ipc://") :]).with_name("stats")
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert st.st_size == S.segment_plan()["segment_size"]


def _pid(dataplane) -> int:
    return dataplane.pid if hasattr(dataplane, "pid") else dataplane.dataplane.pid


def test_header_names_the_running_dataplane_and_its_heartbeat_moves(dataplane):
    a = stats.read_snapshot(control=dataplane.control)
    assert a.dataplane.alive and a.dataplane.pid == _pid(dataplane)
    assert a.dataplane.control == dataplane.control
    assert a.dataplane.kind in ("c", "mock")
    assert abs(a.dataplane.start_time_ns - time.time_ns()) < 3600 * 10**9
    assert stats.heartbeat_age_ns(a) < stats.STALE_NS
    time.sleep(0.1)
    b = stats.read_snapshot(control=dataplane.control)
    assert b.dataplane.heartbeat_ns > a.dataplane.heartbeat_ns


def test_every_histogram_has_the_same_log_spaced_bounds(dataplane):
    s = stats.read_snapshot(control=dataplane.control)
    assert set(s.latency) == set(S.HIST_NAMES)
    for h in s.latency.values():
        assert h.bounds_ns == S.bucket_bounds()
        assert len(h.counts) == len(h.bounds_ns)
    b = S.bucket_bounds()
    assert b[-1] == 2**63 - 1 and all(x < y for x, y in itertools.pairwise(b))


# --- agreement with what the client saw -------------------------------------------------


def test_snapshot_agrees_with_the_forwards_the_client_completed(loaded):
    dp, c, nbytes, before = loaded
    want = before.counters.get("forwards_ok", 0) + N_FORWARDS
    s = _settled(dp.control, {"forwards_ok": want})
    assert s.counters["forwards_ok"] == want
    mine = [cl for cl in s.clients if cl.id == c.client_id]
    assert len(mine) == 1, s.clients
    cl = mine[0]
    assert cl.pid == os.getpid() and cl.name == "stats-test"
    assert cl.segment == c.segment_name
    assert cl.capacity == c._segment.ring_capacity and cl.slot_count == c.slot_count
    assert cl.page_size in (4096, 2 * 1024 * 1024)
    deadline = time.monotonic() + 5
    while cl.completions < cl.submits or cl.completions == 0:  # completions lag a tick
        assert time.monotonic() < deadline, cl
        time.sleep(0.02)
        cl = next(x for x in stats.read_snapshot(control=dp.control).clients if x.id == cl.id)
    # every descriptor the client submitted (weight chunks, the commit, forwards) completed
    assert cl.submits == cl.completions and cl.inflight == 0 and cl.errors == 0
    assert cl.bytes_out == N_FORWARDS * nbytes  # one result of nbytes per forward
    assert cl.bytes_in >= N_FORWARDS * nbytes
    assert cl.head == cl.tail and cl.ring_source == "client"
    e2e = s.latency["end_to_end"].minus(before.latency["end_to_end"])
    assert e2e.total() == N_FORWARDS and e2e.sum_ns > 0
    assert e2e.quantile(0.5) is not None and e2e.quantile(0.5) < 10 * 10**9
    for phase in ("prepare", "send", "wait", "fetch", "reduce"):
        assert s.latency[phase].minus(before.latency[phase]).total() == N_FORWARDS, phase
    ducks = {d.id: d for d in s.ducks}
    for d in range(4):
        assert ducks[d].state == "up" and ducks[d].layers >= 1
        assert (
            ducks[d].reply.minus(next(x.reply for x in before.ducks if x.id == d)).total()
            == N_FORWARDS
        )
        assert ducks[d].last_reply_ns > 0 and ducks[d].timeouts == 0


def test_json_document_round_trips(loaded):
    dp = loaded[0]
    s = stats.read_snapshot(control=dp.control)
    back = msgspec.json.decode(msgspec.json.encode(s), type=stats.Snapshot)
    assert back == s


def test_reading_never_changes_a_counter(loaded):
    dp = loaded[0]
    time.sleep(0.1)  # let the last completions' counters land
    a = stats.read_snapshot(control=dp.control)
    for _ in range(20):
        stats.read_snapshot(control=dp.control)
    time.sleep(0.05)
    b = stats.read_snapshot(control=dp.control)

    def strip(s: stats.Snapshot) -> stats.Snapshot:
        # the C dataplane PINGs its ducks on a timer (ping_ms) and its runners park
        # between timers: those counters move with no traffic and no reader
        def quiet(c: dict[str, int]) -> dict[str, int]:
            return {k: v for k, v in c.items() if k not in TIMER_DRIVEN}

        return msgspec.structs.replace(
            s,
            taken_ns=0,
            dataplane=msgspec.structs.replace(s.dataplane, heartbeat_ns=0),
            counters=quiet(s.counters),
            nics=[msgspec.structs.replace(n, counters=quiet(n.counters)) for n in s.nics],
        )

    assert strip(a) == strip(b)
    # and no reader sent the dataplane a message
    assert a.counters.get("control_messages") == b.counters.get("control_messages")


# --- no dataplane, a dead one -------------------------------------------------------------


def test_no_dataplane_is_reported_clearly(tmp_path):
    control = f"ipc://{tmp_path}/control"
    with pytest.raises(stats.NoDataplane, match=r"no dataplane running \(looked for .*stats"):
        stats.read_snapshot(control=control)
    with pytest.raises(stats.NoDataplane, match="no dataplane running"):
        stats.find_stats(control)


def test_a_killed_mock_leaves_a_stale_segment_that_is_reported_and_replaced(tmp_path):
    control = f"ipc://{tmp_path}/control"
    dp = MockDataplaneProcess(ducks=2, control=control).start()
    dp.kill()
    dp.close()
    path = tmp_path / "stats"
    assert path.exists()
    s = stats.read_snapshot(path)
    assert not s.dataplane.alive
    out = subprocess.run(
        [sys.executable, "-m", "duckpipe", "stats", "--control", control],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "not responding" in out.stdout + out.stderr
    with MockDataplaneProcess(ducks=2, control=control) as dp2:
        s2 = stats.read_snapshot(path)
        assert s2.dataplane.alive and s2.dataplane.pid == dp2.pid


def test_clean_exit_removes_the_segment(tmp_path):
    control = f"ipc://{tmp_path}/control"
    with MockDataplaneProcess(ducks=2, control=control):
        assert (tmp_path / "stats").exists()
    assert not (tmp_path / "stats").exists()


# --- the exporter ---------------------------------------------------------------------------


def _metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name} {labels} not in the exposition")


def test_exporter_agrees_with_what_the_client_observed(loaded):
    from duckpipe import exporter

    dp, c, nbytes, before = loaded
    s = _settled(dp.control, {"forwards_ok": before.counters.get("forwards_ok", 0) + N_FORWARDS})
    text = exporter.render(control=dp.control)
    assert _metric(text, "duckpipe_up") == 1
    assert _metric(text, "duckpipe_forwards_ok_total") == s.counters["forwards_ok"]
    cid = str(c.client_id)
    assert _metric(text, "duckpipe_client_bytes_out_total", client=cid) == N_FORWARDS * nbytes
    assert _metric(text, "duckpipe_client_errors_total", client=cid) == 0
    e2e = s.latency["end_to_end"]
    assert _metric(text, "duckpipe_latency_seconds_count", phase="end_to_end") == e2e.total()
    assert _metric(text, "duckpipe_latency_seconds_bucket", phase="end_to_end", le="+Inf") == (
        e2e.total()
    )
    assert _metric(text, "duckpipe_latency_seconds_sum", phase="end_to_end") == pytest.approx(
        e2e.sum_ns / 1e9
    )
    # cumulative buckets, non-decreasing
    from prometheus_client.parser import text_string_to_metric_families

    fam = next(
        f for f in text_string_to_metric_families(text) if f.name == "duckpipe_latency_seconds"
    )
    counts = [
        x.value for x in fam.samples if x.name.endswith("_bucket") and x.labels["phase"] == "wait"
    ]
    assert counts == sorted(counts) and counts[-1] == s.latency["wait"].total()
    assert _metric(text, "duckpipe_duck_replies_total", duck="0") >= N_FORWARDS
    if s.nics:
        assert (
            _metric(text, "duckpipe_nic_tx_packets_total", nic=s.nics[0].name)
            == (s.nics[0].counters["tx_packets"])
        )


def test_exporter_serves_http_and_survives_no_dataplane(tmp_path):
    import socket
    import urllib.request

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    control = f"ipc://{tmp_path}/control"
    proc = subprocess.Popen(
        [sys.executable, "-m", "duckpipe", "exporter", "--port", str(port), "--control", control],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert "duckpipe exporter: http://127.0.0.1" in proc.stdout.readline()

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()

        assert _metric(scrape(), "duckpipe_up") == 0  # no dataplane yet: still answers
        with MockDataplaneProcess(ducks=2, control=control):
            text = scrape()
            assert _metric(text, "duckpipe_up") == 1
            assert _metric(text, "duckpipe_forwards_total") == 0
        assert _metric(scrape(), "duckpipe_up") == 0  # gone again
    finally:
        proc.terminate()
        proc.wait(10)
