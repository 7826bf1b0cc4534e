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
        with pytest.raises(RingFull, match="2 completed forwards not released") as e:
            c.claim((1, 8), timeout=0.2)
        assert "claimed" not in str(e.value)  # no claim holds a slot: none is blamed
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


def test_ring_full_names_the_claims_never_submitted_nor_released(dataplane):
    with duckpipe.connect(dataplane.control, slots=4, slot_size=4096) as c:
        held = [c.claim((1, 8)) for _ in range(4)]
        with pytest.raises(RingFull) as e:
            c.claim((1, 8), timeout=0.1)
        msg = str(e.value)
        assert "4 claimed and neither submitted nor released (slots [0, 1, 2, 3]" in msg, msg
        assert "Slot.release()" in msg and "forwards" not in msg, msg  # forwards hold none
        for slot in held:
            slot.release()


def test_a_dropped_claim_gives_its_slot_back_as_a_dropped_forward_does(dataplane):
    with duckpipe.connect(dataplane.control, slots=4, slot_size=4096) as c:
        for _ in range(64):  # claimed, then forgotten: each handle dropped unsubmitted
            c.claim((1, 8), timeout=0.2).array[:] = 1
        # an array of the claim keeps its slot, as a result array keeps its Forward's:
        # the memory is not handed to the next claim under it
        arrays = [c.claim((1, 8), timeout=0.2).array for _ in range(4)]
        with pytest.raises(RingFull, match="4 claimed"):
            c.claim((1, 8), timeout=0.1)
        view = arrays[0][:, :4]
        del arrays  # three slots come back; a view of the first still holds that one
        others = [c.claim((1, 8), timeout=0.2) for _ in range(3)]
        with pytest.raises(RingFull, match="4 claimed"):
            c.claim((1, 8), timeout=0.1)
        del view
        c.claim((1, 8), timeout=0.2).release()  # back once its last view went
        for slot in others:
            slot.release()
