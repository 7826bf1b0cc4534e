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
from duckpipe import GeluMlp
from duckpipe.errors import ForwardTimeout
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.observe import stats_reader as stats
from duckpipe.schema import stats as S
from duckpipe.testing import set_faults

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


def test_counter_names_are_c_identifiers_that_fit_the_segment():
    # each becomes an enum dp_counter member (DP_COUNTER_LIST) and a name slot
    names = S.COUNTER_NAMES
    assert len(set(names)) == len(names) <= S.STATS_MAX_COUNTERS
    assert all(n.isidentifier() and len(n) < S.STATS_COUNTER_NAME for n in names)
    assert S.DROP_COUNTERS and set(S.DROP_COUNTERS) <= set(names)


def test_every_counter_of_the_schema_is_kept_in_its_order(dataplane):
    # one list, COUNTERS in duckpipe/schema/stats.py: generated into the C dataplane
    # (DP_COUNTER_LIST), and the mock's, which once kept a shorter copy of its own
    names = list(S.COUNTER_NAMES)
    assert list(stats.read_snapshot(control=dataplane.control).counters) == names
    with duckpipe.connect(dataplane.control, name="counters") as c:
        assert list(c.stats().counters) == names


def test_generated_header_compiles_and_matches_the_plan_the_readers_use(c_test_program):
    import re

    from codegen import ROOT

    from duckpipe.schema.layout import layout_of

    header = ROOT / "dataplane" / "include" / "gen" / "dp_stats_abi.h"
    defines = dict(re.findall(r"#define DP_(STATS_\w+) (\w+)", header.read_text()))
    for key, value in S.segment_plan().items():
        assert int(defines[f"STATS_{key.upper()}"], 0) == value, key
    for cls in S.LAYOUTS:  # the numpy views readers use: the schema's offsets and sizes
        lay = layout_of(cls)
        dt = stats.DTYPES[cls.__name__]
        assert dt.itemsize == lay.size
        for f in lay.fields:
            if not f.pad:
                assert dt.fields[f.name][1] == f.offset, (cls.__name__, f.name)
    # dataplane/tests/stats_abi_c11.c: the header alone, as strict C11; its _Static_asserts
    # pin every offset, so the build (meson) refuses a header that drifted
    program = c_test_program("stats_abi_c11")
    r = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


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
    assert cl.capacity == c._session.segment.ring_capacity and cl.slot_count == c.slot_count
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
    assert cl.head == cl.tail and cl.pending == 0
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


def test_segment_counters_agree_with_getstats(loaded):
    """The segment and the control query sum the same agents' counters."""
    dp, c = loaded[0], loaded[1]
    time.sleep(0.1)
    over_zmq = c.stats().counters
    time.sleep(0.1)  # the segment trails by one tick
    seg = stats.read_snapshot(control=dp.control).counters
    moving = TIMER_DRIVEN | {"control_messages", "completions_sent", "completion_flushes"}
    assert set(over_zmq) == set(seg)
    assert {k: v for k, v in seg.items() if k not in moving} == {
        k: v for k, v in over_zmq.items() if k not in moving
    }


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


def test_under_load_counters_only_grow_and_end_at_what_the_clients_saw(dataplane):
    """Two clients forward concurrently while a reader snapshots in a loop: no counter
    ever goes back, and when they are done the totals are theirs."""
    import threading

    before = stats.read_snapshot(control=dataplane.control)
    per_client, results, errors = 60, [], []

    def work(k: int) -> None:
        try:
            c, nbytes = _run_forwards(dataplane.control, per_client, layer=20 + k)
            results.append((c.client_id, nbytes))
            c.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    seen: list[stats.Snapshot] = []
    while any(t.is_alive() for t in threads) or len(seen) < 4:  # a fast run: 4 reads anyway
        seen.append(stats.read_snapshot(control=dataplane.control))
        time.sleep(0.005)
    for t in threads:
        t.join()
    assert not errors, errors
    for a, b in itertools.pairwise(seen):
        for k, v in a.counters.items():
            assert b.counters[k] >= v, (k, v, b.counters[k])
        for name, h in a.latency.items():
            assert all(y >= x for x, y in zip(h.counts, b.latency[name].counts, strict=True))
    want = before.counters["forwards_ok"] + 2 * per_client
    end = _settled(dataplane.control, {"forwards_ok": want})
    assert end.counters["forwards_ok"] == want
    assert end.latency["end_to_end"].minus(before.latency["end_to_end"]).total() == 2 * per_client


# --- ducks that stop answering; NICs and threads ---------------------------------------------


def test_a_dead_duck_of_the_mock_is_lost_with_its_timeouts(duckpipe_mock_factory):
    dp = duckpipe_mock_factory(ducks=3, args=["--timeout-ms", "100"])
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=1), ducks=[0, 1, 2])
        set_faults(dp.control, dead_ducks=[2])  # once loaded: a load onto it is refused
        with pytest.raises(ForwardTimeout):
            c.forward(1, np.ones((1, HIDDEN), np.float32), timeout=5)
        time.sleep(0.05)
        ducks = {d.id: d for d in stats.read_snapshot(control=dp.control).ducks}
    assert ducks[2].state == "lost" and ducks[2].timeouts == 1 and ducks[2].missing_chunks == 1
    assert ducks[2].replies == 0 and ducks[2].reply.total() == 0
    assert ducks[0].state == "up" and ducks[0].replies == 1 and ducks[0].timeouts == 0


def test_a_c_duck_that_stops_answering_is_late_with_its_timeout_and_missing_chunks(
    duckpipe_cluster_factory,
):
    cl = duckpipe_cluster_factory(groups=[(3, []), (1, ["--stop-after", "2"])])
    x = np.ones((1, 64), np.float32)
    with duckpipe.connect(cl.control, forward_timeout=0.3) as c:
        c.load_weights(1, GeluMlp.random(64, 64, seed=2))
        for _ in range(2):
            c.forward(1, x)
        with pytest.raises(ForwardTimeout):
            c.forward(1, x, timeout=5)
        time.sleep(0.1)
        s = stats.read_snapshot(control=cl.control)
    ducks = {d.id: d for d in s.ducks}
    assert ducks[3].state in ("late", "lost") and ducks[3].timeouts == 1, ducks[3]
    assert ducks[3].missing_chunks >= 1 and ducks[3].replies == 2
    assert all(ducks[d].state == "up" and ducks[d].replies == 3 for d in range(3))
    assert all(d.layers == 1 and d.address.startswith("127.") for d in ducks.values())
    assert s.counters["timeouts"] == 1


def _every_view_says_never_answered(control: str, silent: list[int], running: list[int]) -> None:
    """The snapshot, ``duckpipe stats`` (text and --json), duckpipe-top --once and the
    exporter all call the silent ducks lost, say why and what to check."""
    from duckpipe.observe import exporter

    ducks = {d.id: d for d in stats.read_snapshot(control=control).ducks}
    for d in silent:
        assert (ducks[d].state, ducks[d].reason) == ("lost", "never_answered"), ducks[d]
        assert "check the duck count" in ducks[d].why and ducks[d].address in ducks[d].why
    for d in running:
        assert (ducks[d].state, ducks[d].reason, ducks[d].why) == ("up", "", ""), ducks[d]
    run = [sys.executable, "-m", "duckpipe"]
    text = subprocess.run(
        [*run, "stats", "--control", control], capture_output=True, text=True, check=True
    ).stdout
    for d in silent:
        assert f"duck {d} {ducks[d].address} nic" in text
        assert "lost (never answered a PING or a LAYER: check the duck count" in text
    doc = msgspec.json.decode(
        subprocess.run(
            [*run, "stats", "--control", control, "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    by_id = {d["id"]: d for d in doc["ducks"]}
    assert all(by_id[d]["state"] == "lost" for d in silent)
    assert all(by_id[d]["reason"] == "never_answered" for d in silent)
    top = subprocess.run(
        [sys.executable, "-m", "duckpipe.observe.top", "--once", "--control", control],
        capture_output=True,
        text=True,
    ).stdout
    for d in silent:
        assert f"duck {d} ({ducks[d].address}) is lost: never answered a PING" in top, top
    metrics = exporter.render(control=control)
    for d in silent:
        assert _metric(metrics, "duckpipe_duck_state", duck=str(d), state="lost") == 1
        assert _metric(metrics, "duckpipe_duck_reason", duck=str(d), reason="never_answered") == 1
    for d in running:
        assert _metric(metrics, "duckpipe_duck_state", duck=str(d), state="up") == 1


@pytest.mark.dataplane  # starts the C programs itself
def test_c_ducks_that_never_answered_are_lost_everywhere_and_the_log_names_them():
    """The topology names 8 ducks, 4 run: the user's likeliest first mistake (a count or
    a port). No forward is needed for them to show lost: unanswered PINGs are enough."""
    from duckpipe.testing import assert_clean_exit, cluster_class_or_skip

    cl = cluster_class_or_skip()(8, groups=[(4, []), (4, [])], weight_timeout_ms=400)
    cl.groups = cl.groups[:1]  # the topology names ducks 4-7; no emulator runs them
    cl.start()
    try:
        with duckpipe.connect(cl.control) as c:
            from duckpipe.errors import LayerFailed

            # at once, before the dataplane's PINGs could tell: the load is sent and fails
            with pytest.raises(LayerFailed):
                c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=1))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ducks = stats.read_snapshot(control=cl.control).ducks
            if all(d.state == "lost" for d in ducks if d.id >= 4):
                break
            time.sleep(0.2)
        _every_view_says_never_answered(cl.control, [4, 5, 6, 7], [0, 1, 2, 3])
        log = cl.output()
        addresses = ", ".join(f"{d} (127.0.0.1:{cl.duck_base + d})" for d in range(4, 8))
        assert f"ducks lost: 4 never answered a PING or a LAYER in 3.0 s: {addresses}" in log
        assert "check that that many ducks run (the topology names 8)" in log
        assert "layer 1 failed to load: ducks [4, 5, 6, 7] did not acknowledge" in log
    finally:
        assert_clean_exit(cl)


def test_mock_ducks_that_never_answer_are_lost_everywhere_and_the_log_names_them(
    duckpipe_mock_factory,
):
    dp = duckpipe_mock_factory(ducks=4, args=["--dead-duck", "2", "--dead-duck", "3"])
    _every_view_says_never_answered(dp.control, [2, 3], [0, 1])
    assert "ducks lost: 2 never answer (a fault): 2 (mock:2), 3 (mock:3)" in dp.output()


def test_dedicated_threads_and_two_nics_each_publish_their_own_counters(duckpipe_null_factory):
    dp = duckpipe_null_factory(4, nics=2, threads="dedicated")
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=1))
        for _ in range(10):
            c.forward(1, np.ones((1, HIDDEN), np.float32))
        s = _settled(dp.control, {"forwards_ok": 10})
    assert s.dataplane.threads == "dedicated" and s.dataplane.kind == "c"
    assert [(n.name, n.backend, n.core) for n in s.nics] == [
        ("null0", "null", -1),
        ("null1", "null", -1),
    ]
    for name in ("tx_packets", "rx_packets", "forwards_ok"):
        assert sum(n.counters[name] for n in s.nics) <= s.counters[name]
    assert sum(n.counters["tx_packets"] for n in s.nics) == s.counters["tx_packets"] > 0
    assert all(n.counters["tx_packets"] > 0 for n in s.nics)  # each worker sent its share
    assert {d.nic for d in s.ducks} == {"null0", "null1"}
    assert s.latency["end_to_end"].total() == 10


def test_a_killed_c_dataplane_leaves_a_stale_segment_the_next_one_replaces(
    duckpipe_null_factory, tmp_path
):
    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.testing import null_topology

    control = f"ipc://{tmp_path}/control"
    dp = DataplaneProcess(null_topology(2), control=control).start()
    first = stats.read_snapshot(control=control)
    assert first.dataplane.alive and first.dataplane.kind == "c"
    dp.kill()
    stale = stats.read_snapshot(control=control)
    assert not stale.dataplane.alive and stale.dataplane.pid == first.dataplane.pid
    out = subprocess.run(
        [sys.executable, "-m", "duckpipe", "stats", "--control", control],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1 and "not responding" in out.stderr and "gone" in out.stderr
    dp.close()
    dp2 = DataplaneProcess(null_topology(2), control=control)
    with dp2:
        s = stats.read_snapshot(control=control)
        assert s.dataplane.alive and s.dataplane.pid == dp2.pid != first.dataplane.pid
        assert stat.S_IMODE((tmp_path / "stats").stat().st_mode) == 0o600
        assert "replacing the stats segment" in dp2.output()
    assert not (tmp_path / "stats").exists()  # a clean exit removes it


@pytest.mark.dataplane  # from a path of its own: the mark check's wrappers do not see it
def test_the_sanitized_c_dataplane_publishes_the_segment_cleanly(tmp_path):
    from codegen import ROOT

    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.testing import null_topology

    binary = ROOT / "dataplane" / "build-san" / "duckpipe-dataplane"
    if not binary.exists():
        pytest.skip(
            f"no sanitizer build at {binary}: tools/setup test makes it "
            "(meson setup dataplane/build-san -Dpython_module=false -Db_sanitize=address,undefined)"
        )
    dp = DataplaneProcess(null_topology(3), control=f"ipc://{tmp_path}/control", binary=binary)
    dp.start()
    try:
        with duckpipe.connect(dp.control) as c:
            c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=1))
            for _ in range(20):
                c.forward(1, np.ones((1, HIDDEN), np.float32))
            s = _settled(dp.control, {"forwards_ok": 20})
            assert s.counters["forwards_ok"] == 20
            assert s.clients[0].bytes_out == 20 * HIDDEN * 4
        code = dp.stop()
        out = dp.output()
    finally:
        dp.stop()
        dp.close()
    assert code == 0 and "Sanitizer" not in out and "runtime error" not in out, out[-3000:]


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


def test_a_garbled_segment_reads_without_crashing_the_reader(tmp_path):
    """Whatever the regions hold, a reader clamps counts and indices and decodes names
    leniently: a broken writer cannot take duckpipe-top or the exporter down."""
    rng = np.random.default_rng(5)
    size = S.segment_plan()["segment_size"]
    for seed in range(5):
        raw = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        v = stats.views(raw)
        v["header"]["magic"] = S.STATS_MAGIC
        v["header"]["version_major"] = S.STATS_VERSION_MAJOR
        v["header"]["pid"] = 0
        del v
        path = tmp_path / f"stats{seed}"
        path.write_bytes(bytes(raw))
        snap = stats.read_snapshot(path)
        assert not snap.dataplane.alive
        msgspec.json.encode(snap)  # and it serializes
        from duckpipe.observe import exporter

        assert "duckpipe_up 0.0" in exporter.render(stats=path)  # the pid is gone: stale
    short = tmp_path / "short"
    short.write_bytes(b"\0" * 100)
    with pytest.raises(stats.NoDataplane, match="not a stats segment of this version"):
        stats.read_snapshot(short)


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
    from duckpipe.observe import exporter

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
    if s.nics and "tx_packets" in s.nics[0].counters:  # the mock has no network counters
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
