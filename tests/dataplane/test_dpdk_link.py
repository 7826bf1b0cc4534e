"""The dpdk backend's link state: a veth taken down mid-run and brought back.

net_af_packet in DPDK 22.11 says its link is up from rte_eth_dev_start on, whatever its
interface does; the backend reads the interface's own flags (dp_dpdk_link.c), so these
tests take a veth down from either end and watch the dataplane notice, fail that NIC's
forwards at once naming it, keep the other NIC's forwards going, and recover.
Same network helpers, skips and cleanup as test_dpdk.py.
"""

from __future__ import annotations

import io
import time
from contextlib import redirect_stdout

import msgspec
import numpy as np
import pytest
from test_dpdk import TWO_WORKER_LCORES, _check_forwards, _dataplane, _ip, veth_ducks

import duckpipe
from duckpipe import GeluMlp
from duckpipe.cli import main as duckpipe_main
from duckpipe.errors import DataplaneFault
from duckpipe.launch.topology import Nic
from duckpipe.observe import stats_reader

pytestmark = [pytest.mark.dataplane, pytest.mark.dpdk, pytest.mark.root]

FORWARD_DEADLINE_S = 5.0  # the topology's default_timeout_ms: what "fast" is measured against


def _duckpipe_stats(control: str) -> str:
    """What `duckpipe stats --control CONTROL` prints."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert duckpipe_main(["stats", "--control", control]) == 0
    return out.getvalue()


def _wait_link(control: str, nic: int, state: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while True:
        link = stats_reader.read_snapshot(control=control).nics[nic].link
        if link == state:
            return
        assert time.monotonic() < end, f"nic {nic}: link {link!r}, waited for {state!r}"
        time.sleep(0.02)


@pytest.mark.parametrize("end", ["near", "far"])
def test_a_link_that_goes_down_fails_its_nics_forwards_fast_and_recovers_when_up(end):
    with (
        veth_ducks([2, 2]) as net,
        _dataplane(net, default_timeout_ms=FORWARD_DEADLINE_S * 1000) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        both = GeluMlp.random(256, 64, seed=1)  # ducks 0-3: both NICs
        c.load_weights(1, both)
        p0_only = GeluMlp.random(256, 32, seed=2)  # ducks 0-1: NIC p0's
        c.load_weights(2, p0_only, ducks=[0, 1])
        _check_forwards(c, both, 3)
        _wait_link(dp.control, 1, "up")

        # the near end (the port's own interface) or the far end (in the ducks'
        # namespace: the near end loses its carrier)
        ns, dev = (
            ([], net.near_ends[1]) if end == "near" else (["-n", net.spaces[1]], net.far_ends[1])
        )
        down, up = ([*ns, "link", "set", dev, state] for state in ("down", "up"))
        _ip(*down)
        _wait_link(dp.control, 1, "down")
        x = np.random.default_rng(7).standard_normal((3, 256)).astype(np.float32)
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(DataplaneFault, match=r"nic p1: link down") as e:
                c.forward(1, x, timeout=2 * FORWARD_DEADLINE_S)
            took = time.monotonic() - t0
            assert took < FORWARD_DEADLINE_S / 2, (took, str(e.value))
            assert sorted(e.value.missing) == [2, 3], e.value.missing  # p1's ducks
        # the forwards whose ducks are all on p0 go on as before
        for k in range(5):
            x = np.random.default_rng(k).standard_normal((3, 256)).astype(np.float32)
            np.testing.assert_allclose(
                c.forward(2, x, timeout=5), p0_only.reference(x), rtol=1e-4, atol=1e-5
            )
        snap = stats_reader.read_snapshot(control=dp.control)
        assert snap.nics[0].link == "up" and snap.nics[1].link == "down", snap.nics
        shown = _duckpipe_stats(dp.control)
        assert "link down" in shown, shown

        _ip(*up)
        _wait_link(dp.control, 1, "up")
        _check_forwards(c, both, 5, seed=3)  # p1 is back: every duck answers again
        p1 = stats_reader.read_snapshot(control=dp.control).nics[1]
        out = dp.output()
    assert p1.counters["link_downs"] == 1, p1.counters
    assert p1.counters["link_down_forwards"] == 3, p1.counters
    assert p1.counters["tx_link_down"] >= 3, p1.counters  # the failed forwards' activations
    assert "nic p0: link up after" in out and "nic p1: link up after" in out, out
    assert "nic p1: link down (port 1, kernel interface " in out, out
    assert "nic p1: link up: " in out and "gratuitous ARP for the host" in out, out
    assert "nic p0: link down" not in out, out


def test_stats_show_a_dedicated_dpdk_worker_on_its_eal_lcore_and_cpu_and_its_link():
    # main lcore 0 on CPU 0; p0's worker on lcore 1 (CPU 1), p1's on lcore 2 (CPU 0)
    with (
        veth_ducks([1, 1], lcores=TWO_WORKER_LCORES) as net,
        _dataplane(net, threads="dedicated") as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(128, 16, seed=4)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 2)
        time.sleep(0.2)  # a stats tick after the workers were placed
        nics = stats_reader.read_snapshot(control=dp.control).nics
        shown = _duckpipe_stats(dp.control)
    assert [(n.lcore, n.core, n.link) for n in nics] == [(1, 1, "up"), (2, 0, "up")], nics
    assert nics[0].link_speed_mbps > 0, nics  # a veth says 10000
    assert "(dpdk net_af_packet0, EAL lcore 1, core 1, link up " in shown, shown
    assert "(dpdk net_af_packet1, EAL lcore 2, core 0, link up " in shown, shown
    assert "unpinned" not in shown, shown


def test_a_link_down_at_startup_is_waited_for_then_warned_about_and_recovers_when_up():
    with veth_ducks([1, 1]) as net:
        _ip("link", "set", net.near_ends[1], "down")
        net.nics = [msgspec.structs.replace(n, link_wait_ms=300) for n in net.nics]
        with (
            _dataplane(net, default_timeout_ms=FORWARD_DEADLINE_S * 1000) as dp,
            duckpipe.connect(dp.control) as c,
        ):
            out = dp.output()
            mlp = GeluMlp.random(128, 16, seed=5)
            c.load_weights(1, mlp, ducks=[0])  # p0's duck: p1's link is down
            _check_forwards(c, mlp, 2)
            assert stats_reader.read_snapshot(control=dp.control).nics[1].link == "down"
            _ip("link", "set", net.near_ends[1], "up")
            _wait_link(dp.control, 1, "up")
            both = GeluMlp.random(128, 16, seed=6)
            c.load_weights(2, both)
            _check_forwards_on(c, 2, both, 3)
    assert "nic p1: link down after waiting 300 ms (link_wait_ms): starting anyway" in out, out
    assert "nic p0: link up after" in out, out


def _check_forwards_on(c: duckpipe.Client, layer: int, mlp: GeluMlp, count: int) -> None:
    rng = np.random.default_rng(layer)
    for _ in range(count):
        x = rng.standard_normal((3, mlp.hidden)).astype(np.float32)
        np.testing.assert_allclose(
            c.forward(layer, x, timeout=5), mlp.reference(x), rtol=1e-4, atol=1e-5
        )


def test_link_wait_ms_past_a_minute_is_refused_naming_the_setting():
    with pytest.raises(msgspec.ValidationError, match=r"link_wait_ms"):
        msgspec.convert(
            {"name": "p0", "host_ip": "10.0.0.1", "ducks": [], "link_wait_ms": 60_001}, Nic
        )
