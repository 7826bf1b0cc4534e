"""UDP GRO on the socket backend's receive: a duck's GSO reply arrives as one receive, the
backend cuts it back into datagrams (dataplane/include/dp_gro.h), and results stay exact,
with loss too. ``gro = false`` on a NIC keeps the datagram-by-datagram receive."""

from __future__ import annotations

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp

pytestmark = pytest.mark.dataplane

DUCKS = 8
HIDDEN = 1024
ROWS = 4  # 16 KiB partials: a dozen 1,472-byte datagrams, one GSO send per duck


@pytest.fixture
def cluster_factory(duckpipe_cluster_factory):
    return duckpipe_cluster_factory


def _exact_input(seed: int) -> np.ndarray:
    """Multiples of 1/64 in [-4, 4): every echo sum 1 x .. 36 x is a float32, in any order."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-256, 256, (ROWS, HIDDEN)) / 64).astype(np.float32)


def _run(control: str, forwards: int) -> dict[str, int]:
    """forwards echo forwards, each checked bit for bit; the dataplane's counters after."""
    mlp = GeluMlp.random(HIDDEN, 8, seed=7, b_down=False)
    scale = np.float32(sum(range(1, DUCKS + 1)))  # duck k echoes (k + 1) x
    with duckpipe.connect(control) as c:
        c.load_weights(1, mlp)
        for k in range(forwards):
            x = _exact_input(k)
            np.testing.assert_array_equal(c.forward(1, x, timeout=10), x * scale)
        return c.stats().counters


def test_replies_arrive_as_gro_receives_and_forwards_stay_exact(cluster_factory):
    cl = cluster_factory(DUCKS, duck_args=["--compute", "echo"])
    n = _run(cl.control, 20)
    assert "GRO on" in cl.output(), cl.output()
    assert n["forwards_ok"] == 20 and n["timeouts"] == 0
    # the ducks' GSO replies came in coalesced: fewer receives than datagrams
    assert n["rx_gro_buffers"] > 0, n
    assert n["rx_gro_segments"] >= 2 * n["rx_gro_buffers"], n
    assert n["rx_gro_segments"] <= n["rx_packets"], n
    assert n["rx_malformed"] == 0 and n["rxq_overflows"] == 0, n


def test_with_gro_off_every_receive_is_one_datagram(cluster_factory):
    cl = cluster_factory(DUCKS, duck_args=["--compute", "echo"], nic_settings={"gro": False})
    n = _run(cl.control, 5)
    assert "GRO off" in cl.output(), cl.output()
    assert n["forwards_ok"] == 5
    assert n["rx_gro_buffers"] == 0 and n["rx_gro_segments"] == 0, n


def test_gro_forwards_stay_exact_with_5_percent_loss(cluster_factory):
    # the emulator drops datagrams out of its GSO runs: the receives hold what is left,
    # and NACKs bring the rest back one by one
    cl = cluster_factory(
        DUCKS, duck_args=["--compute", "echo", "--drop", "0.05", "--seed", "11"], nack_us=1000
    )
    n = _run(cl.control, 30)
    assert n["forwards_ok"] == 30 and n["timeouts"] == 0
    assert n["rx_gro_buffers"] > 0 and n["nacks_sent"] > 0, n
