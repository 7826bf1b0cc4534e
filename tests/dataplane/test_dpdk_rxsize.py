"""The dpdk backend's receive sizing and drop counters, and its one reader of the port's
statistics (issue 18, points 2, 3 and 5), on net_af_packet over veth pairs.

The networks come from test_dpdk.py's veth_ducks (one namespace per port, emulated ducks
in it); same skips: root, iproute2, a DPDK build, free hugepages.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

# tests/dataplane is on sys.path (pytest's "prepend" import mode)
from test_dpdk import _dataplane, _topology, veth_ducks

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import DuckpipeError, ForwardTimeout
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.process import control_request
from duckpipe.schema import control as ctl

pytestmark = [pytest.mark.dataplane, pytest.mark.dpdk, pytest.mark.root]

HIDDEN = 7168  # the 8 x 7168 forward: 229 KiB replies, 157 frames per duck


def _with_framecnt(eal: list[str], framecnt: int) -> list[str]:
    return [f"{a},framecnt={framecnt}" if a.startswith("--vdev=net_af_packet") else a for a in eal]


def _nic_line(out: str, nic: str) -> dict[str, int]:
    """A NIC's non-zero counters from `duckpipe stats`' "  nic NAME (...): k=v, ..." line."""
    m = re.search(rf"^  nic {nic} \(.*?\): (.*)$", out, re.M)
    assert m, out
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def test_an_af_packet_ring_too_small_for_the_replies_shows_its_drops_in_duckpipe_stats():
    # 4 ducks answer 8 x 7168 at once (628 frames) into a 64-frame af_packet ring: the
    # kernel drops most of them, where the worker never sees them. Those drops must be
    # counted (rx_kernel_drops, in rxq_overflows) and `duckpipe stats` must show them
    with veth_ducks([4]) as net:
        net.eal = _with_framecnt(net.eal, 64)
        with _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
            mlp = GeluMlp.random(HIDDEN, 32, seed=3)
            c.load_weights(1, mlp)
            x = np.random.default_rng(0).standard_normal((8, HIDDEN)).astype(np.float32)
            for _ in range(3):
                try:  # NACKs recover what the kernel dropped; a timeout is not the point
                    c.forward(1, x, timeout=10)
                except ForwardTimeout:
                    pass
            time.sleep(0.3)  # the worker reads the port's counters every 100 ms
            shown = subprocess.run(
                [sys.executable, "-m", "duckpipe", "stats", "--control", dp.control],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            n = c.stats().counters
            out = dp.output()  # open's lines
    nic = _nic_line(shown, "p0")
    assert nic.get("rx_kernel_drops", 0) > 0, shown
    assert n["rx_kernel_drops"] > 0 and n["nacks_sent"] > 0, n
    assert n["rxq_overflows"] == n["rx_kernel_drops"] + n["rx_missed"] + n["rx_nombuf"], n
    assert re.search(r"af_packet ring holds 64 frames \(framecnt\).*4 duck\(s\) x \d+ frames", out)
    assert re.search(r"nic p0: port \d+ sizes: RX the kernel's ring: framecnt=64 frames", out), out


def test_the_docs_framecnt_holds_the_replies_without_a_drop():
    # the same forwards with the ring docs/dpdk.md's af_packet command gives: no drops
    docs = (Path(__file__).parents[2] / "docs" / "dpdk.md").read_text()
    framecnt = int(re.search(r"--vdev=net_af_packet0,iface=dpk0,framecnt=(\d+)", docs).group(1))
    with veth_ducks([4]) as net:
        net.eal = _with_framecnt(net.eal, framecnt)
        with _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
            mlp = GeluMlp.random(HIDDEN, 32, seed=3)
            c.load_weights(1, mlp)
            x = np.random.default_rng(0).standard_normal((8, HIDDEN)).astype(np.float32)
            for _ in range(3):
                np.testing.assert_allclose(c.forward(1, x, timeout=10), mlp.reference(x),
                                           rtol=1e-4, atol=1e-4)  # fmt: skip
            time.sleep(0.3)
            n = c.stats().counters
            out = dp.output()
    assert n["rxq_overflows"] == 0 and n["rx_kernel_drops"] == 0, n
    assert "af_packet ring holds" not in out, out


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        ("rx_desc", 40000, r"rx_desc 40000 / tx_desc 0: at most 32768 descriptors"),
        ("mbufs", 100, r"mbufs = 100: the port's rings hold \d+ .*at least that many"),
    ],
)
def test_a_bad_ring_or_pool_size_is_refused_naming_the_setting(setting, value, error):
    with veth_ducks([1]) as net:
        net.nics = [msgspec.structs.replace(n, **{setting: value}) for n in net.nics]
        dp = DataplaneProcess(_topology(net), backend_args=net.eal)
        try:
            with pytest.raises(DuckpipeError, match=error):
                dp.start()
        finally:
            dp.stop()
            dp.close()


def test_a_topology_file_with_rx_desc_past_a_uint16_ring_is_refused(tmp_path):
    from duckpipe.errors import BadInput
    from duckpipe.launch import topology

    f = tmp_path / "t.toml"
    f.write_text(
        '[[nics]]\nname = "p0"\nbackend = "dpdk"\ninterface = "net_af_packet0"\n'
        'host_ip = "10.0.0.1"\nrx_desc = 65536\n[[nics.ducks]]\nid = 0\nip = "10.0.0.2"\n'
        "port = 47100\n"
    )
    with pytest.raises((BadInput, ValueError), match=r"<= 32768.*rx_desc"):
        topology.load(f)


def test_open_logs_the_sizes_it_chose_from_the_topology():
    # 3 ducks x 189 frames (256 KiB replies at mtu 1500) want 1024 descriptors; the pool
    # holds the rings, the caches and the zero-copy chunks; the cache is l2fwd's 256
    numa = r"nic p0: port \d+ on NUMA socket -?\d+, its worker on CPU"
    with veth_ducks([3]) as net, _dataplane(net) as dp:
        # the NUMA line comes from the worker's first reading of the port (STATS_MS)
        deadline = time.monotonic() + 5
        while not re.search(numa, dp.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = dp.output()
    m = re.search(
        r"nic p0: port \d+ sizes: RX the kernel's ring: framecnt=512 frames \(one forward's "
        r"replies: 3 duck\(s\) x (\d+) frames\), TX (\d+) descriptors, mbuf pool (\d+) x \d+ "
        r"bytes \(\d+ MiB; wanted (\d+), hugepage budget \d+ MiB\) on socket -?\d+, cache (\d+)",
        out,
    )
    assert m, out
    frames, ntx, mbufs, wanted, cache = map(int, m.groups())
    chunk = int(re.search(r"(\d+)-byte chunks", out).group(1))
    assert frames == -(-(256 << 10) // chunk) and ntx == 1024, out
    assert mbufs == wanted and cache == 256, out
    assert re.search(numa, out), out


def test_one_thread_reads_the_ports_statistics_while_stats_are_asked(
    tmp_path, monkeypatch, c_test_program
):
    # the worker reads the port's stats and xstats; the control agent answers GetStats
    # from its snapshot and never calls into the port (ethdev does not make two readers
    # safe; ice's reads are register reads). A shim (dataplane/tests/trace_port_stats.c)
    # logs which thread calls rte_eth_stats_get / rte_eth_xstats_get, and when
    lib, trace = c_test_program("trace_port_stats.so"), tmp_path / "trace.txt"
    with veth_ducks([2], lcores=("--lcores=0@0,1@1",)) as net:
        dp = DataplaneProcess(_topology(net, threads="dedicated"), backend_args=net.eal)
        monkeypatch.setenv("LD_PRELOAD", str(lib))
        monkeypatch.setenv("DP_TRACE", str(trace))
        asan = os.environ.get("ASAN_OPTIONS", "")
        monkeypatch.setenv("ASAN_OPTIONS", f"{asan}:verify_asan_link_order=0".lstrip(":"))
        try:
            dp.start()
            monkeypatch.delenv("LD_PRELOAD")
            with duckpipe.connect(dp.control) as c:
                mlp = GeluMlp.random(256, 32, seed=1)
                c.load_weights(1, mlp)
                c.forward(1, np.ones((2, 256), np.float32), timeout=5)
                start = time.monotonic()
                replies: list[ctl.Stats] = []
                stop = threading.Event()

                def ask() -> None:
                    while not stop.is_set():
                        r = control_request(dp.control, ctl.GetStats(req_id=1), 0.5)
                        if isinstance(r, ctl.Stats):
                            replies.append(r)

                askers = [threading.Thread(target=ask) for _ in range(2)]
                for t in askers:
                    t.start()
                time.sleep(1.0)
                stop.set()
                for t in askers:
                    t.join()
                end = time.monotonic()
        finally:
            assert dp.stop() == 0, dp.output()
            dp.close()
    calls = [line.split() for line in trace.read_text().splitlines()]
    during = [(tid, name) for tid, t, name in calls if start <= float(t) <= end]
    readers = {tid for tid, _ in during}
    assert len(during) >= 5 and {n for _, n in during} == {
        "rte_eth_stats_get",
        "rte_eth_xstats_get",
    }, during
    assert len(readers) == 1, f"threads that read the port's statistics: {sorted(readers)}"
    # and Stats still shows the port's counters: the worker's snapshot, fresh
    assert len(replies) > 10, len(replies)
    assert all(r.nics[0].xstats.get("tx_good_packets", 0) > 0 for r in replies)
