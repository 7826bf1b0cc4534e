"""The dataplane's sum of a dense forward is made chunk by chunk on the activation's grid:
a chunk's first contribution is stored, later ones added, and nothing is zeroed ahead
(dp_gather.c). Ducks that cut their replies on another grid (the emulator's ``--mtu``), lose
datagrams, or answer in float16 must still give exact sums."""

from __future__ import annotations

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp

pytestmark = pytest.mark.dataplane

DUCKS = 4
HIDDEN = 1024
ROWS = 3  # 12 KiB float32: nine 1,392-byte chunks, the last one short


@pytest.fixture
def cluster_factory(duckpipe_cluster_factory):
    return duckpipe_cluster_factory


def _exact_input(seed: int, dtype: type) -> np.ndarray:
    """Multiples of 1/8 in [-4, 4): each echo sum (1 + .. + 4) x = 10 x is exact in
    float16 as in float32."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-32, 32, (ROWS, HIDDEN)) / 8).astype(dtype)


def _run(control: str, forwards: int, dtype: type = np.float32) -> dict[str, int]:
    mlp = GeluMlp.random(HIDDEN, 8, dtype=dtype, seed=7, b_down=False)
    scale = dtype(sum(range(1, DUCKS + 1)))  # duck k echoes (k + 1) x
    with duckpipe.connect(control) as c:
        c.load_weights(1, mlp)
        for k in range(forwards):
            x = _exact_input(k, dtype)
            y = c.forward(1, x, timeout=10)
            assert y.dtype == dtype
            np.testing.assert_array_equal(y, x * scale)
            # a different sum next time in the same result slots: nothing of the last
            # forward's stays behind in a chunk
            x0 = np.zeros_like(x)
            np.testing.assert_array_equal(c.forward(1, x0, timeout=10), x0)
        return c.stats().counters


@pytest.mark.parametrize("duck_mtu", [1500, 1000, 9000])
def test_sums_are_exact_whatever_grid_the_ducks_cut_their_replies_on(cluster_factory, duck_mtu):
    # 1500: the dataplane's own grid (each chunk stored once, then added); 1000 and 9000:
    # chunks off its grid, so it zeroes what is left and adds from then on
    cl = cluster_factory(DUCKS, duck_args=["--compute", "echo", "--mtu", str(duck_mtu)])
    n = _run(cl.control, 10)
    assert n["forwards_ok"] == 20 and n["rx_malformed"] == 0, n


def test_sums_are_exact_in_float16(cluster_factory):
    cl = cluster_factory(DUCKS, duck_args=["--compute", "echo"])
    n = _run(cl.control, 10, np.float16)
    assert n["forwards_ok"] == 20, n


def test_sums_are_exact_when_chunks_are_lost_and_resent(cluster_factory):
    # NACKed chunks come back later, some after the other ducks' copies of the same chunk:
    # whichever comes first is stored, and a duplicate is never added
    cl = cluster_factory(
        DUCKS, duck_args=["--compute", "echo", "--drop", "0.05", "--seed", "5"], nack_us=1000
    )
    n = _run(cl.control, 20)
    assert n["forwards_ok"] == 40 and n["nacks_sent"] > 0, n
