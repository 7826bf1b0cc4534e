"""When every slot is in use, claim waits for its timeout and then raises RingFull."""

from __future__ import annotations

import time

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import RingFull


def test_claim_raises_ring_full_after_its_timeout_and_recovers_on_release(dataplane):
    with duckpipe.connect(dataplane.control, slots=4, slot_size=4096) as c:
        held = [c.claim((1, 8)) for _ in range(4)]
        t0 = time.monotonic()
        with pytest.raises(RingFull, match="all 4 slots"):
            c.claim((1, 8), timeout=0.3)
        assert time.monotonic() - t0 >= 0.3
        held.pop().release()
        c.claim((1, 8), timeout=0.3).release()


def test_unreleased_results_hold_their_slots(dataplane):
    with duckpipe.connect(dataplane.control, slots=2, slot_size=4096) as c:
        c.load_weights(10, GeluMlp.random(8, 8, seed=1), ducks=[0])
        fwds = []
        for _ in range(2):
            slot = c.claim((1, 8))
            slot.array[:] = 1
            fwds.append(c.submit(slot, 10))
        for f in fwds:
            f.result(timeout=10)
        with pytest.raises(RingFull):
            c.claim((1, 8), timeout=0.2)
        fwds[0].release()
        c.claim((1, 8), timeout=1).release()


def test_weights_larger_than_all_slots_together_still_load(dataplane):
    mlp = GeluMlp.random(64, 256, seed=2)  # 64 KiB per matrix; 2 slots of 4 KiB
    with duckpipe.connect(dataplane.control, slots=2, slot_size=4096) as c:
        c.load_weights(11, mlp, ducks=[0, 1, 2])
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        np.testing.assert_allclose(
            c.forward(11, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5
        )
