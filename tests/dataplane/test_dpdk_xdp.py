"""net_af_xdp's receive losses (issue 18, point 10), on veth pairs.

On a veth the kernel runs the PMD's XDP program natively and copies each frame into the
XSK's RX ring; when that ring is full it drops the frame and counts it in the socket's
XDP_STATISTICS ``rx_ring_full`` (and the veth in its rx drops), which DPDK's af_xdp
leaves out of ``imissed``: the backend reads it itself into ``rx_kernel_drops``. The
ring is the NIC's ``rx_desc``, by default the PMD's fill ring (2048 mbufs: no more frames
can ever wait). The networks come from test_dpdk.py's veth_ducks; same skips, and where
net_af_xdp cannot attach to a veth the tests skip saying so (test_dpdk's _dataplane).
"""

from __future__ import annotations

import re
import subprocess
import sys
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

pytestmark = [pytest.mark.dataplane, pytest.mark.dpdk, pytest.mark.root]

HIDDEN = 7168  # the 8 x 7168 forward: 229 KiB replies, 157 frames per duck
AF_XDP_FILL = 2048  # the PMD's fill ring (ETH_AF_XDP_DFLT_NUM_DESCS)


def _rx_dropped(dev: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_dropped").read_text())


def _nic_line(out: str, nic: str) -> dict[str, int]:
    """A NIC's non-zero counters from `duckpipe stats`' "  nic NAME (...): k=v, ..." line."""
    m = re.search(rf"^  nic {nic} \(.*?\): (.*)$", out, re.M)
    assert m, out
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def test_an_af_xdp_rx_ring_too_small_for_the_replies_shows_the_kernels_drops():
    # two ports of 4 ducks each answering 8 x 7168 at once (628 frames a port) into
    # 64-entry XSK RX rings: the kernel drops most of them (rx_ring_full), where the worker
    # never sees them and the PMD's imissed stays 0. They must be counted per NIC
    # (rx_kernel_drops, in rxq_overflows), as many as each NIC's veth says it dropped (the
    # second port must not read the first's XSK), and `duckpipe stats` must show them
    with veth_ducks([4, 4], pmd="af_xdp") as net:
        net.nics = [msgspec.structs.replace(n, rx_desc=64) for n in net.nics]
        with _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
            veth0 = [_rx_dropped(near) for near in net.near_ends]
            mlp = GeluMlp.random(HIDDEN, 32, seed=3)
            c.load_weights(1, mlp)
            x = np.random.default_rng(0).standard_normal((8, HIDDEN)).astype(np.float32)
            for _ in range(3):
                try:  # NACKs recover what the kernel dropped; a timeout is not the point
                    c.forward(1, x, timeout=10)
                except ForwardTimeout:
                    pass
            time.sleep(0.3)  # the worker reads the port's counters every 100 ms
            veth = [_rx_dropped(near) - v for near, v in zip(net.near_ends, veth0, strict=True)]
            shown = subprocess.run(
                [sys.executable, "-m", "duckpipe", "stats", "--control", dp.control],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            n = c.stats().counters
            out = dp.output()  # open's lines
    assert all(v > 0 for v in veth), (veth, n)  # both rings did overflow
    per_nic = [_nic_line(shown, f"p{k}").get("rx_kernel_drops", 0) for k in range(2)]
    assert per_nic == veth, (per_nic, veth, shown)
    assert n["rx_kernel_drops"] == sum(veth) and n["nacks_sent"] > 0, (veth, n)
    assert n["rxq_overflows"] == n["rx_kernel_drops"] + n["rx_missed"] + n["rx_nombuf"], n
    assert re.search(r"the af_xdp RX ring holds 64 frames \(rx_desc\).*4 duck\(s\)", out), out


def test_af_xdp_sizes_its_rx_ring_to_the_fill_ring_and_the_replies_fit():
    # rx_desc = 0 on af_xdp: the fill ring's 2048 (more could never wait), and the
    # issue's forwards come back exact without a frame dropped
    with veth_ducks([4], pmd="af_xdp") as net:
        near = net.near_ends[0]
        with _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
            veth0 = _rx_dropped(near)
            mlp = GeluMlp.random(HIDDEN, 32, seed=3)
            c.load_weights(1, mlp)
            x = np.random.default_rng(0).standard_normal((8, HIDDEN)).astype(np.float32)
            for _ in range(3):
                np.testing.assert_allclose(c.forward(1, x, timeout=10), mlp.reference(x),
                                           rtol=1e-4, atol=1e-4)  # fmt: skip
            time.sleep(0.3)
            n = c.stats().counters
            veth = _rx_dropped(near) - veth0
            out = dp.output()
    assert n["rxq_overflows"] == 0 and n["rx_kernel_drops"] == 0 and veth == 0, (veth, n)
    assert re.search(
        rf"nic p0: port \d+ sizes: RX {AF_XDP_FILL} descriptors \(the XSK's RX and TX rings; "
        rf"its fill ring {AF_XDP_FILL} mbufs\)",
        out,
    ), out
    assert "af_xdp RX ring holds" not in out, out


def test_an_af_xdp_rx_desc_not_a_power_of_two_is_refused_saying_so():
    with veth_ducks([1], pmd="af_xdp") as net:
        net.nics = [msgspec.structs.replace(n, rx_desc=1000) for n in net.nics]
        dp = DataplaneProcess(_topology(net), backend_args=net.eal)
        try:
            with pytest.raises(DuckpipeError, match=r"rx_desc = 1000: net_af_xdp's rings"):
                dp.start()
        finally:
            dp.stop()
            dp.close()


def test_an_af_xdp_pool_too_small_for_its_fill_ring_is_refused_naming_the_minimum():
    # the PMD takes 2048 mbufs for its fill ring at queue setup whatever rx_desc: a pool
    # of 1300 with a 64-entry ring would pass a check on the rings alone and then fail
    # inside rte_eth_rx_queue_setup (err=-22, "Failed to configure xdp socket")
    with veth_ducks([1], pmd="af_xdp") as net:
        net.nics = [msgspec.structs.replace(n, rx_desc=64, mbufs=1300) for n in net.nics]
        dp = DataplaneProcess(_topology(net), backend_args=net.eal)
        try:
            with pytest.raises(
                DuckpipeError, match=rf"mbufs = 1300: the port's rings hold \d+ \({AF_XDP_FILL} RX"
            ):
                dp.start()
        finally:
            dp.stop()
            dp.close()
