"""duckpipe-top: rates and panes from hand-built snapshots, --once and --json against a
running mock and C dataplane under load, no dataplane -> exit 1, and the live screen driven
in a real terminal (tmux)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.observe import topview as tv
from duckpipe.observe.stats_reader import ClientStats as Client
from duckpipe.observe.stats_reader import DataplaneInfo as Info
from duckpipe.observe.stats_reader import DuckStats as Duck
from duckpipe.observe.stats_reader import Histogram as Hist
from duckpipe.observe.stats_reader import MoeLayerStats
from duckpipe.observe.stats_reader import NicStats as Nic
from duckpipe.observe.stats_reader import Snapshot as Snap
from duckpipe.testing import cluster_class_or_skip

REPO = Path(duckpipe.__file__).resolve().parent.parent
BOUNDS = [1_000 * 2**i for i in range(20)] + [2**63 - 1]

# ---------------------------------------------------------------- a snapshot factory


def hist(*values_ns: int) -> object:
    counts = [0] * len(BOUNDS)
    for v in values_ns:
        counts[next(i for i, b in enumerate(BOUNDS) if v <= b)] += 1
    return Hist(bounds_ns=BOUNDS, counts=counts)


def snap(
    t_s: float,
    *,
    forwards: int = 0,
    head: int = 0,
    tail: int = 0,
    submits: int = 0,
    bytes_in: int = 0,
    ring_full: int = 0,
    tx_packets: int = 0,
    tx_bytes: int = 0,
    drops: int = 0,
    timeouts: int = 0,
    e2e: tuple[int, ...] = (),
    reply: tuple[int, ...] = (),
    heartbeat_age_s: float = 0.01,
    pid: int = 4242,
    page_size: int = 2 << 20,
) -> object:
    taken = int(1_000e9 + t_s * 1e9)
    return Snap(
        taken_ns=taken,
        dataplane=Info(
            kind="mock",
            pid=pid,
            start_time_ns=1_700_000_000_000_000_000,
            heartbeat_ns=taken - int(heartbeat_age_s * 1e9),
            control="ipc:///tmp/x/control",
            threads="shared",
            stats_path="/tmp/x/stats",
        ),
        counters={"forwards": forwards, "forwards_ok": forwards, "timeouts": timeouts},
        clients=[
            Client(
                id=1,
                pid=1111,
                name="model",
                segment="duckpipe-0-1111-1",
                page_size=page_size,
                capacity=64,
                slot_count=64,
                head=head,
                tail=tail,
                pending=head - tail,
                inflight=head - tail,
                submits=submits,
                completions=submits,
                bytes_in=bytes_in,
                bytes_out=bytes_in,
                ring_full=ring_full,
                errors=0,
            )
        ],
        nics=[
            Nic(
                name="lo",
                backend="socket",
                interface="lo",
                core=-1,
                counters={
                    "tx_packets": tx_packets,
                    "tx_bytes": tx_bytes,
                    "rx_packets": tx_packets,
                    "rx_bytes": tx_bytes,
                    "rxq_overflows": drops,
                    "nacks_sent": 3,
                    "retransmits": 2,
                    "gso_sends": 7,
                },
                xstats={},
            )
        ],
        ducks=[
            Duck(
                id=i,
                address=f"127.0.0.1:{47100 + i}",
                nic="lo",
                state="up",
                layers=2,
                last_reply_ns=50_000,
                reply=hist(*reply),
                timeouts=timeouts if i == 1 else 0,
                missing_chunks=0,
                nacks=0,
            )
            for i in range(3)
        ],
        latency={k: hist(*e2e) for k in tv.LATENCY_KEYS},
    )


# ---------------------------------------------------------------- pure functions


def test_rates_are_counter_differences_over_the_snapshots_time_apart():
    a = snap(0, forwards=100, submits=100, bytes_in=0, tx_packets=10, tx_bytes=0)
    b = snap(2, forwards=300, submits=500, bytes_in=10**9, tx_packets=2010, tx_bytes=5 * 10**8)
    r = tv.derive_rates(b, a)
    assert r.interval_s == 2.0
    assert r.forwards_per_s == 100.0
    c = r.clients[0]
    assert c.submits_per_s == 200.0 and c.completions_per_s == 200.0
    assert c.gbytes_per_s == pytest.approx(1.0)  # 1 GB in + 1 GB out over 2 s
    n = r.nics[0]
    assert n.tx_packets_per_s == 1000.0 and n.tx_gbits_per_s == pytest.approx(2.0)


def test_one_snapshot_or_another_dataplane_gives_no_rates():
    b = snap(2, forwards=300, e2e=(5_000,))
    assert tv.derive_rates(b, None).forwards_per_s is None
    other = snap(0, forwards=100, pid=999)
    r = tv.derive_rates(b, other)
    assert r.forwards_per_s is None and r.interval_s == 0
    assert r.latency[0].count == 0 and r.latency[0].p99_all_ns == 8_000


def test_counters_that_went_down_count_as_a_fresh_start_not_a_negative_rate():
    r = tv.derive_rates(snap(1, forwards=5, submits=5), snap(0, forwards=50, submits=50))
    assert r.forwards_per_s is None and r.clients[0].submits_per_s is None


def test_latency_quantiles_come_from_the_interval_only():
    old = snap(0, e2e=(1_000_000,) * 100)  # a slow past
    new = snap(1, e2e=(1_000_000,) * 100 + (3_000,) * 99 + (100_000,))
    lat = {p.phase: p for p in tv.derive_rates(new, old).latency}
    e2e = lat["end_to_end"]
    assert e2e.count == 100
    assert e2e.p50_ns == 4_000 and e2e.p99_ns == 4_000 and e2e.p999_ns == 128_000
    assert e2e.p99_all_ns == 1_024_000
    assert list(lat) == list(tv.LATENCY_KEYS)


def test_histogram_quantile_of_the_open_last_bucket_is_the_bound_below():
    h = hist(2**62)
    assert tv.hist_quantile(h.bounds_ns, h.counts, 0.5) == BOUNDS[-2]
    assert tv.hist_quantile(BOUNDS, [0] * len(BOUNDS), 0.5) is None


def test_a_ring_over_90_percent_full_is_marked():
    v = tv.build_view(snap(1, head=60, tail=0), snap(0))
    (row,) = v.tables["rings"].rows
    assert row.attention and row.cells[6] == "94"
    assert any("ring of model (pid 1111) 94% full" in a for a in v.alerts)
    v = tv.build_view(snap(1, head=10, tail=0), snap(0))
    assert not v.tables["rings"].rows[0].attention and not v.alerts


def _with_ducks(snapshot: object, states: list[str], timeouts: list[int] | None = None):
    """``snapshot`` with one duck per state (ids 0.., ports 47100..)."""
    import msgspec

    ducks = [
        msgspec.structs.replace(
            snapshot.ducks[0],
            id=i,
            address=f"127.0.0.1:{47100 + i}",
            state=state,
            timeouts=(timeouts or [0] * len(states))[i],
        )
        for i, state in enumerate(states)
    ]
    return msgspec.structs.replace(snapshot, ducks=ducks)


def test_the_alerts_name_every_lost_duck_at_80_columns():
    states = ["up"] * 4 + ["lost"] * 4 + ["up", "lost"]
    v = tv.build_view(_with_ducks(snap(1), states), _with_ducks(snap(0), states))
    assert v.alerts == ["ducks 4-7, 9 are lost"]
    assert tv.alert_rows(v.alerts, 80) == ["! ducks 4-7, 9 are lost"]
    # one duck keeps its address; new timeouts are one alert for all the ducks they hit
    new, old = [0, 0, 5, 2], [0, 0, 1, 0]
    v = tv.build_view(
        _with_ducks(snap(1), ["up", "lost", "up", "up"], new),
        _with_ducks(snap(0), ["up", "lost", "up", "up"], old),
    )
    assert v.alerts == ["ducks 2-3: 6 new timeout(s)", "duck 1 (127.0.0.1:47101) is lost"]
    # more than the live screen's three rows: none cut, and the rest counted
    many = [f"duck {i} (127.0.0.1:{47100 + i}) is lost" for i in range(5)]
    rows = tv.alert_rows(many, 80)
    assert rows[:2] == [f"! {a}" for a in many[:2]]
    assert rows[2] == "! +3 more (duckpipe-top --once lists all)" and len(rows) == 3


def test_at_80_columns_the_summary_breaks_between_phrases_not_mid_word():
    import re

    import msgspec

    s = snap(1, forwards=123_456_789, e2e=(5_000,) * 10)
    s = msgspec.structs.replace(
        s,
        dataplane=msgspec.structs.replace(
            s.dataplane, control="ipc:///run/user/1000/duckpipe/control"
        ),
    )
    v = tv.build_view(s, snap(0))
    assert max(len(line) for line in v.header) > 80  # what there is to fit
    text = tv.render_text(v, 80)
    head = text.split("\n[1]")[0].splitlines()
    assert all(len(line) <= 80 for line in head), head
    for line in v.header:  # every phrase whole on one line, in order
        for phrase in re.split(r"(?<=[,;]) ", line):
            assert any(phrase in out for out in head), (phrase, head)
    assert (
        "".join(p.strip() + " " for p in head if p.strip()).split()
        == " ".join(v.header + [f"! {a}" for a in v.alerts]).split()
    )  # nothing lost, nothing cut


def test_a_duck_with_new_timeouts_is_marked_and_old_ones_are_not():
    v = tv.build_view(snap(1, timeouts=3), snap(0, timeouts=1))
    rows = {r.cells[0]: r for r in v.tables["ducks"].rows}
    assert rows["1"].attention and rows["1"].cells[8] == "3 +2"
    assert not rows["0"].attention
    assert "duck 1 (127.0.0.1:47101): 2 new timeout(s)" in v.alerts
    v = tv.build_view(snap(2, timeouts=3), snap(1, timeouts=3))
    assert not any(r.attention for r in v.tables["ducks"].rows) and not v.alerts


def test_a_stale_heartbeat_says_since_when_the_dataplane_stopped_responding():
    wall = time.mktime((2026, 12, 3, 7, 30, 10, 0, 0, -1)) * 1e9
    v = tv.build_view(snap(1, heartbeat_age_s=5), snap(0), wall_ns=wall)
    assert any("dataplane not responding since 07:30:05" in a for a in v.alerts)
    assert not tv.build_view(snap(1, heartbeat_age_s=1.5), snap(0)).alerts


def test_page_size_is_said_plainly():
    rings = tv.build_view(snap(1), snap(0)).tables["rings"]
    assert rings.rows[0].cells[11] == "2 MiB"
    rings = tv.build_view(snap(1, page_size=4096), snap(0)).tables["rings"]
    assert rings.rows[0].cells[11] == "4 KiB (fallback)"


def test_new_nic_drops_are_marked():
    v = tv.build_view(snap(1, drops=4), snap(0, drops=1))
    assert v.tables["nics"].rows[0].attention and "NIC lo: 3 new drop(s)" in v.alerts


def test_narrow_terminals_drop_the_least_needed_columns_first():
    rings = tv.build_view(snap(1), snap(0)).tables["rings"]
    wide = tv.render_table(rings, 200)[0][0]
    narrow = tv.render_table(rings, 80)[0][0]
    assert "segment" in wide and "segment" not in narrow
    for name in ("pid", "client", "infl", "occ%", "sub/s", "cmp/s", "GB/s", "full", "page"):
        assert name in narrow
    assert all(len(line) <= 80 for line, _ in tv.render_table(rings, 80))


def test_sorting_puts_the_largest_first_and_keeps_threads_under_their_process():
    procs = [
        tv.ProcSample(
            pid=pid,
            role="client",
            name=f"p{pid}",
            cpu_percent=cpu,
            rss=1 << 20,
            threads=[tv.ThreadSample(tid=pid + 1, name="t", core=1, cpu_percent=cpu)],
        )
        for pid, cpu in ((10, 5.0), (20, 50.0), (30, 20.0))
    ]
    table = tv.build_view(snap(1), snap(0), procs).tables["processes"]
    order = [r.cells[0] for r in table.sorted_rows(3)]
    assert order == ["20", "21", "30", "31", "10", "11"]
    assert [r.cells[0] for r in table.sorted_rows(3, reverse=True)][:2] == ["10", "11"]


def test_once_text_has_every_pane():
    text = tv.render_text(tv.build_view(snap(1, e2e=(5_000,)), snap(0)))
    for i, title in enumerate(("rings", "NIC workers", "ducks", "latency", "processes"), 1):
        assert f"[{i}] {title}" in text


def _moe_layer(layer: int, expert_tokens: list[int], duck_rows: dict[int, int]) -> MoeLayerStats:
    n = len(expert_tokens)
    return MoeLayerStats(
        layer=layer, loaded=True, n_experts=n, forwards=3, tokens=40,
        entries=sum(expert_tokens), no_expert=0, window_ns=10**9, window_end_ns=1,
        recent_forwards=3, recent_tokens=40, expert_tokens=expert_tokens,
        expert_recent=expert_tokens, expert_ducks=[[e % 4, 4 + e % 4] for e in range(n)],
        duck_rows=duck_rows, duck_recent=duck_rows,
    )  # fmt: skip


def test_the_moe_pane_shows_each_layers_hottest_experts_ducks_and_imbalance():
    dense = tv.build_view(snap(1), snap(0))
    assert "moe" not in dense.tables and dense.panes == list(tv.PANES[:5])
    assert "[6]" not in tv.render_text(dense)
    s = msgspec.structs.replace(
        snap(1),
        moe_layers=[_moe_layer(9, [2, 30, 0, 8], {0: 2, 1: 30, 4: 0, 5: 8, 2: 0, 3: 0})],
    )
    view = tv.build_view(s, snap(0))
    assert view.panes == list(tv.PANES)
    table = view.tables["moe"]
    layer, hot, second = table.rows[:3]
    assert (
        layer.cells[0] == "9" and layer.cells[5] == "4.50 (4.50)"
    )  # 30 / (40 / 6) and layer.attention
    assert hot.child and hot.cells[1].strip() == "1" and hot.cells[2] == "30"
    assert hot.cells[4] == "75%" and hot.cells[6] == "1, 5"
    assert second.cells[1].strip() == "3" and len(table.rows) == 4  # expert 2 had none
    assert "[6] MoE experts" in tv.render_text(view)


def test_thread_core_reads_field_39_of_the_thread_stat():
    from duckpipe.observe.top import _thread_core

    core = _thread_core(os.getpid(), threading.get_native_id())
    assert core is not None and 0 <= core < os.cpu_count()


# ---------------------------------------------------------------- against a running mock


def _top(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe.observe.top", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


class _Load:
    """A client doing forwards in a thread until stopped; counts what it saw complete."""

    def __init__(self, control: str) -> None:
        self.client = duckpipe.connect(control, name="top-load")
        self.client.load_weights(1, GeluMlp.random(64, 96, seed=1), ducks=[0, 1, 2, 3])
        self.done = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        x = np.ones((4, 64), np.float32)
        while not self.stop.is_set():
            self.client.forward(1, x, timeout=10)
            self.done += 1
            time.sleep(0.001)  # leave the shared cores some room

    def close(self) -> None:
        self.stop.set()
        self.thread.join(20)
        self.client.close()


class _Running:
    """What the tests need of a running dataplane, mock or C."""

    def __init__(self, kind: str, control: str, pid: int, duck3: str) -> None:
        self.kind, self.control, self.pid, self.duck3 = kind, control, pid, duck3


@pytest.fixture(scope="module", params=["mock", "real"])
def loaded(request):
    """A dataplane with 4 ducks and a client in this process doing forwards."""
    if request.param == "mock":
        owner = MockDataplaneProcess(ducks=4).start()
        dp = _Running("mock", owner.control, owner.pid, "mock:3")
    else:
        owner = cluster_class_or_skip()(4, default_timeout_ms=2000).start()
        dp = _Running("c", owner.control, owner.dataplane.pid, f"127.0.0.1:{owner.duck_base + 3}")
    try:
        load = _Load(dp.control)
        try:
            deadline = time.monotonic() + 20
            while load.done < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert load.done >= 20, "the load client made no progress"
            yield dp, load
        finally:
            load.close()
    finally:
        owner.__exit__(None, None, None)


def test_once_renders_every_pane_against_a_running_dataplane_under_load(loaded):
    dp, _ = loaded
    r = _top("--once", "--control", dp.control)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for i, title in enumerate(("rings", "NIC workers", "ducks", "latency", "processes"), 1):
        assert f"[{i}] {title}" in out
    assert f"dataplane {dp.kind} pid {dp.pid}" in out
    ring = next(line for line in out.splitlines() if " top-load " in line)
    assert ring.split()[0] == str(os.getpid())
    assert "2 MiB" in ring or "4 KiB (fallback)" in ring
    assert "end to end" in out and dp.duck3 in out
    words = " ".join(out.split())
    assert f"{dp.pid} dataplane" in words and f"{os.getpid()} client top-load" in words
    if dp.kind == "c":  # the emulator serving these ducks, found by its UDP port
        assert " ducks duckpipe-ducks " in words


def test_json_is_one_document_of_every_counter_and_the_derived_rates(loaded):
    dp, load = loaded
    done = [load.done]
    r = _top("--json", "--control", dp.control)
    done.append(load.done)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"snapshot", "rates", "processes"}
    snap_ = doc["snapshot"]
    assert snap_["dataplane"]["pid"] == dp.pid and snap_["dataplane"]["kind"] == dp.kind
    (mine,) = [c for c in snap_["clients"] if c["pid"] == os.getpid()]
    assert mine["name"] == "top-load"
    rates = doc["rates"]
    assert 0.4 < rates["interval_s"] < 5
    assert rates["forwards_per_s"] > 0 and rates["clients"][0]["completions_per_s"] > 0
    assert {p["phase"] for p in rates["latency"]} >= set(tv.LATENCY_KEYS)
    assert any(p["role"] == "dataplane" and p["pid"] == dp.pid for p in doc["processes"])

    # What the client saw, against two documents (the weights loaded at the start count
    # in the totals too): each forward is 4 x 64 float32 in and as much out. Slack: the C
    # dataplane adds bytes at each completion but publishes the ring's counts on its
    # ~10 ms stats tick, a few forwards at a few hundred a second.
    done.append(load.done)
    r = _top("--json", "--control", dp.control, "-u", "0.1")
    done.append(load.done)
    (later,) = [c for c in json.loads(r.stdout)["snapshot"]["clients"] if c["pid"] == os.getpid()]
    d_sub, d_cmp = later["submits"] - mine["submits"], later["completions"] - mine["completions"]
    slack = 2 + (done[3] - done[0]) // 20
    assert done[2] - done[1] - slack <= d_cmp <= done[3] - done[0] + slack
    assert abs(d_sub - d_cmp) <= slack
    assert abs(later["bytes_in"] - mine["bytes_in"] - 1024 * d_sub) <= 1024 * slack
    assert abs(later["bytes_out"] - mine["bytes_out"] - 1024 * d_cmp) <= 1024 * slack


def test_no_dataplane_says_so_on_stderr_and_exits_1(tmp_path):
    for flags in (["--once"], ["--json"], ["--stats", str(tmp_path / "stats"), "--json"]):
        r = _top(*flags, "--control", f"ipc://{tmp_path}/control")
        assert r.returncode == 1, (flags, r.stderr)
        assert r.stdout == "" and "no dataplane running" in r.stderr


# ---------------------------------------------------------------- the live screen in tmux


class Tmux:
    """One duckpipe-top in a detached tmux session on a private server."""

    def __init__(self, command: str, width: int = 120, height: int = 40) -> None:
        self.sock = f"duckpipe-top-test-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            str(width),
            "-y",
            str(height),
            "-c",
            str(REPO),
            command,
        )

    def tmux(self, *args: str) -> str:
        r = subprocess.run(
            ["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=10
        )
        assert r.returncode == 0, (args, r.stderr)
        return r.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, text: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline:
                size = self.tmux("display", "-p", "-t", "top", "#{window_width}x#{window_height}")
                raise AssertionError(
                    f"{text!r} not on screen after {timeout} s ({size.strip()}):\n{screen}"
                )
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux_top():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (tools/setup installs it)")
    sessions = []

    def start(*args: str, width: int = 120, height: int = 40) -> Tmux:
        cmd = " ".join([sys.executable, "-m", "duckpipe.observe.top", *args])
        t = Tmux(f"{cmd}; echo duckpipe-top exited $?; sleep 60", width, height)
        sessions.append(t)
        return t

    yield start
    for t in sessions:
        t.close()


def test_live_screen_switches_panes_survives_a_resize_and_quits(loaded, tmux_top):
    dp, _ = loaded
    t = tmux_top("--control", dp.control, "-u", "0.5", height=30)  # one pane at a time
    t.wait_for("rings (one per attached client)")
    assert "latency per forward" not in t.screen()
    t.wait_for("top-load")
    t.keys("2")
    t.wait_for("NIC workers")
    t.keys("3")
    screen = t.wait_for(dp.duck3)
    assert "timeouts" in screen
    t.keys("Tab")
    screen = t.wait_for("latency per forward")
    assert "end to end" in screen and "p99.9" in screen
    t.keys("BTab")
    t.wait_for("  id* address")  # back to the ducks
    t.keys("Tab")
    t.wait_for("latency per forward")
    t.keys("5")
    t.wait_for("cpu%")
    t.keys("s")  # cpu% (the default) -> rss
    t.wait_for("sorted by rss")
    t.keys("r")
    t.wait_for("sorted by rss (reversed)")
    t.keys("1")
    t.tmux("resize-window", "-t", "top", "-x", "80", "-y", "24")
    screen = t.wait_for("top-load")
    lines = screen.splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert "segment" not in screen  # the least needed column went first
    t.tmux("resize-window", "-t", "top", "-x", "200", "-y", "50")
    screen = t.wait_for("segment")
    # tall: the latency pane under the chosen one
    assert "rings (one per attached client)" in screen and "latency per forward" in screen
    assert len(screen.splitlines()) <= 50
    t.keys("q")
    t.wait_for("duckpipe-top exited 0")


def test_live_screen_shows_the_moe_pane_once_a_moe_layer_ran(loaded, tmux_top):
    from duckpipe.moe import MoeMlp

    dp, _ = loaded
    t = tmux_top("--control", dp.control, "-u", "0.3", height=30)
    t.wait_for("top-load")
    assert " 6 moe " not in t.screen()
    with duckpipe.connect(dp.control, name="top-moe") as c:  # the load's client is its thread's
        # 8 experts over the 4 ducks; expert 6 (ducks 2 and 3) chosen by every token
        moe = MoeMlp.random(8, 64, 16, shared=False, dtype=np.float32, seed=6)
        c.load_weights(60, moe, placement=[[e % 4, (e + 1) % 4] for e in range(8)])
        i = np.array([[6, 1]] * 5 + [[6, 4]] * 3, np.int32)
        w = np.full(i.shape, 0.5, np.float32)
        c.forward(60, np.ones((8, 64), np.float32), routing=(i, w), timeout=10)
        t.wait_for(" 6 moe ")
        t.keys("6")
        screen = t.wait_for("MoE experts (hottest per layer)")
        rows = [line.split() for line in screen.splitlines()]
        layer = next(r for r in rows if r[:3] == ["60", "8", "exp"])
        assert layer[3] == "8"  # tokens
        hot = next(r for r in rows if r[:2] == ["6", "8"])  # expert 6, 8 tokens
        assert hot[-1] == "2-3"  # its ducks
        assert "imbalance" in screen
    t.keys("q")
    t.wait_for("duckpipe-top exited 0")


def test_live_screen_shows_no_dataplane_and_picks_up_a_new_one(tmp_path, tmux_top):
    control = f"ipc://{tmp_path}/control"
    t = tmux_top("--control", control, "-u", "0.3")
    t.wait_for("no dataplane")
    with MockDataplaneProcess(ducks=2, control=control) as dp:
        t.wait_for(f"dataplane mock pid {dp.pid}")
        t.keys("3")
        t.wait_for("mock:1")
    t.wait_for("no dataplane")
    with MockDataplaneProcess(ducks=3, control=control) as dp:
        t.wait_for(f"dataplane mock pid {dp.pid}")
        t.wait_for("mock:2")  # still on the ducks pane
    t.keys("q")
    t.wait_for("duckpipe-top exited 0")


def test_a_stopped_dataplane_is_reported_as_not_responding_and_a_dead_one_as_gone():
    with MockDataplaneProcess(ducks=2) as dp:
        os.kill(dp.pid, signal.SIGSTOP)
        try:
            time.sleep(2.5)  # past the 2 s a heartbeat may age
            r = _top("--once", "--control", dp.control, "-u", "0.1")
        finally:
            os.kill(dp.pid, signal.SIGCONT)
        assert r.returncode == 0, r.stderr
        assert "! dataplane not responding since " in r.stdout
        dp.proc.kill()  # no clean exit: the stats segment stays behind
        dp.proc.wait(10)
        r = _top("--json", "--control", dp.control)
        assert r.returncode == 1 and r.stdout == ""
        assert f"no dataplane running: pid {dp.pid}" in r.stderr and "has exited" in r.stderr


def test_reading_never_changes_a_counter():
    with MockDataplaneProcess(ducks=2) as dp:
        docs = []
        for flags in (["--json"], ["--once"], ["--json"]):
            r = _top(*flags, "--control", dp.control, "-u", "0.1")
            assert r.returncode == 0, r.stderr
            if flags == ["--json"]:
                docs.append(json.loads(r.stdout)["snapshot"])
        first, last = docs
        assert first["counters"] == last["counters"]  # no control message, no attach
        assert first["clients"] == last["clients"] == []
        assert [d["replies"] for d in first["ducks"]] == [d["replies"] for d in last["ducks"]]
