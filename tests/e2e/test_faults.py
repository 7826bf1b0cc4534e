"""Failures are detected and reported: lost ducks, dead dataplanes, dead clients, stale epochs."""

from __future__ import annotations

import time

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, Status
from duckpipe.errors import DataplaneLost, ForwardTimeout, StaleEpoch, WaitTimeout
from duckpipe.testing import killed_client_segment, mapped_by, set_faults, wait_until_gone

HIDDEN = 16


def _submit(client, layer, x, ducks=None):
    slot = client.claim(x.shape, x.dtype)
    slot.array[:] = x
    return client.submit(slot, layer, ducks=ducks)


def test_a_duck_that_never_answers_times_out_naming_it_and_others_continue(duckpipe_mock_factory):
    dp = duckpipe_mock_factory(ducks=4)
    mlp = GeluMlp.random(HIDDEN, 8, seed=1)
    with duckpipe.connect(dp.control, forward_timeout=0.3) as c:
        c.load_weights(1, mlp, ducks=[0, 1, 2, 3])
        c.load_weights(2, mlp, ducks=[0, 1])
        set_faults(dp.control, dead_ducks=[2])  # once loaded: a load onto it is refused
        x = np.ones((1, HIDDEN), np.float32)
        t0 = time.monotonic()
        stuck = _submit(c, 1, x)
        healthy = _submit(c, 2, x)
        np.testing.assert_allclose(
            healthy.result(timeout=5), mlp.reference(x), rtol=1e-5, atol=1e-6
        )
        with pytest.raises(ForwardTimeout, match=r"ducks \[2\] did not answer") as e:
            stuck.result(timeout=5)
        elapsed = time.monotonic() - t0
        assert 0.25 <= elapsed < 3.0
        assert e.value.missing == (2,) and stuck.status == Status.TIMEOUT
        assert stuck.answered == (0, 1, 3)
        assert c.stats().counters["timeouts"] == 1


def test_wait_timeout_leaves_the_forward_pending(duckpipe_mock_factory):
    dp = duckpipe_mock_factory(ducks=1)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, GeluMlp.random(HIDDEN, 8, seed=2))
        set_faults(dp.control, delay_ms=400)
        fwd = _submit(c, 1, np.ones((1, HIDDEN), np.float32))
        with pytest.raises(WaitTimeout, match="still pending"):
            fwd.result(timeout=0.05)
        assert fwd.status == Status.PENDING
        assert fwd.result(timeout=5).shape == (1, HIDDEN)


@pytest.mark.parametrize("wait", ["spin", "block", "hybrid"])
def test_a_killed_dataplane_makes_pending_results_raise_not_hang(duckpipe_mock_factory, wait):
    dp = duckpipe_mock_factory(ducks=2)
    c = duckpipe.connect(dp.control, wait=wait)
    try:
        c.load_weights(1, GeluMlp.random(HIDDEN, 8, seed=3))
        set_faults(dp.control, delay_ms=60_000)
        fwd = _submit(c, 1, np.ones((1, HIDDEN), np.float32))
        dp.kill()
        t0 = time.monotonic()
        with pytest.raises(DataplaneLost, match="exited"):
            fwd.result(timeout=10)
        assert time.monotonic() - t0 < 5
        with pytest.raises(DataplaneLost):
            c.claim((1, HIDDEN))
    finally:
        c.close()
    assert not mapped_by(c.segment_name)


def test_a_dataplane_that_crashes_mid_forward_is_reported(duckpipe_mock_factory):
    dp = duckpipe_mock_factory(ducks=2, args=["--crash-after", "1"])
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, GeluMlp.random(HIDDEN, 8, seed=4))
        x = np.ones((1, HIDDEN), np.float32)
        c.forward(1, x, timeout=5)
        with pytest.raises(DataplaneLost):
            c.forward(1, x, timeout=10)


def test_a_killed_client_has_its_segment_reclaimed(duckpipe_mock_factory):
    dp = duckpipe_mock_factory(ducks=1)
    name = killed_client_segment(dp.control)
    assert wait_until_gone(name), f"{name} is still mapped by {mapped_by(name)}"
    with duckpipe.connect(dp.control) as c:
        stats = c.stats()
        assert stats.counters["clients_reclaimed"] == 1
        assert [s.client_id for s in stats.clients] == [c.client_id]


def test_a_forward_from_a_stale_epoch_is_refused_and_the_client_catches_up(dataplane):
    mlp = GeluMlp.random(HIDDEN, 8, seed=5)
    with duckpipe.connect(dataplane.control) as a, duckpipe.connect(dataplane.control) as b:
        a.load_weights(30, mlp, ducks=[0], shared=True)  # b forwards on it too
        x = np.ones((1, HIDDEN), np.float32)
        old = b.epoch
        new = a.set_epoch()
        assert new == old + 1
        with pytest.raises(StaleEpoch, match=f"epoch {old} is stale"):
            b.forward(30, x, timeout=5)
        assert b.epoch == new
        np.testing.assert_allclose(
            b.forward(30, x, timeout=5), mlp.reference(x), rtol=1e-5, atol=1e-6
        )
