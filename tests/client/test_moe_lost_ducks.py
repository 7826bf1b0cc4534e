"""Routed forwards go around the ducks known lost (issue 30.1), on the mock and the C
dataplane: once a duck is lost (its stats say so), a token whose expert has another
replica goes to one of the live ones (live[t % nlive]) and the result is exact; a forward
that needs an expert every duck of which is lost, or the shared expert on a lost duck,
fails at once with DuckLost naming them, not at its deadline; a duck that answers again
gets its rows again.

Ducks 2 and 3 are silenced (the C dataplane: their emulator stopped; the mock: its
dead_ducks fault, lost at once since it has no PING to wait on). The C dataplane here calls a duck
lost after max(duck_lost_ms, 3 pings) = 1 s of silence, so the tests wait about a second.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import duckpipe
from duckpipe.errors import DuckLost
from duckpipe.moe import MoeMlp
from duckpipe.observe import stats_reader as stats
from duckpipe.testing import set_faults

HIDDEN, EFFN = 64, 32
LOST_MS = 1000  # the C dataplane's duck_lost_ms here: far above a loaded machine's stalls
DEADLINE = 10.0  # each forward's timeout: failing fast means returning long before it
FAST = DEADLINE / 2  # "at once", not the deadline: generous on a loaded 2-core machine
# experts 0..5 on a live and a (to be) lost duck, replica t % 2; 6 on duck 2, 7 on duck 3
PLACEMENT = [[e % 2, 2 + e % 2] for e in range(6)] + [[2], [3]]


class _Mock:
    def __init__(self, factory) -> None:
        self.control = factory(ducks=4).control

    def kill(self) -> None:
        set_faults(self.control, dead_ducks=[2, 3])

    def revive(self) -> None:
        set_faults(self.control)


class _Real:
    """Four emulated ducks in two emulators (ducks 0-1, 2-3) and the C dataplane; ducks
    2 and 3 are silenced by stopping their emulator (SIGSTOP), so that they come back
    with their weights (SIGCONT)."""

    def __init__(self, factory) -> None:
        self.cluster = factory(4, groups=[(2, []), (2, [])], ping_ms=100, duck_lost_ms=LOST_MS)
        self.control = self.cluster.control

    def kill(self) -> None:
        os.kill(self.cluster.emulators[1].pid, signal.SIGSTOP)

    def revive(self) -> None:
        os.kill(self.cluster.emulators[1].pid, signal.SIGCONT)


@pytest.fixture(params=["mock", "real"])
def lossy4(request):
    """Four ducks on the mock or the C dataplane; .kill() silences ducks 2 and 3,
    .revive() gives them back."""
    if request.param == "mock":
        yield _Mock(request.getfixturevalue("duckpipe_mock_factory"))
        return
    ducks = _Real(request.getfixturevalue("duckpipe_cluster_factory"))
    yield ducks
    ducks.revive()  # a stopped emulator would not hear the teardown's SIGTERM


def _wait_state(ducks, state: str, which=(2, 3)) -> None:
    deadline = time.monotonic() + 10 + LOST_MS / 1000
    while time.monotonic() < deadline:
        by_id = {d.id: d.state for d in stats.read_snapshot(control=ducks.control).ducks}
        if all(by_id.get(d) == state for d in which):
            return
        time.sleep(0.05)
    raise AssertionError(f"ducks {which} never showed {state}: {by_id}")


def _kill_and_wait_lost(ducks) -> None:
    ducks.kill()
    _wait_state(ducks, "lost")


def _tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, HIDDEN)).astype(np.float32)


def _check(y: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _counters(c) -> dict[str, int]:
    return dict(c.stats().counters)


def _fails_fast(c, layer: int, x, i, w) -> DuckLost:
    before = _counters(c)
    t0 = time.monotonic()
    with pytest.raises(DuckLost) as e:
        c.forward(layer, x, routing=(i, w))
    took = time.monotonic() - t0
    assert took < FAST, f"{took:.3f} s: waited for the deadline ({DEADLINE} s)?"
    after = _counters(c)
    assert after["moe_no_live_replica"] - before["moe_no_live_replica"] == 1
    return e.value


def test_a_token_goes_to_a_live_replica_of_its_expert_and_the_result_is_exact(lossy4):
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=70)
    x = _tokens(8, 70)
    t = np.arange(8)
    i = np.sort(np.stack([t % 6, (t + 3) % 6], axis=1), axis=1).astype(np.int32)  # 0..5
    w = np.random.default_rng(71).random((8, 2)).astype(np.float32)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(70, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        # all live: replica t % 2, so odd tokens go to ducks 2 and 3, nothing rerouted
        before = _counters(c)
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = c.submit(slot, 70, routing=(i, w))
        with fwd:
            _check(fwd.result(timeout=30), moe.reference(x, i, w))
            assert fwd.answered == (0, 1, 2, 3)
        assert _counters(c)["moe_rows_rerouted"] == before["moe_rows_rerouted"]
        _kill_and_wait_lost(lossy4)
        before = _counters(c)
        t0 = time.monotonic()
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = c.submit(slot, 70, routing=(i, w))
        with fwd:
            _check(fwd.result(timeout=30), moe.reference(x, i, w))
            # the lost ducks were sent nothing, so nobody waited for them
            assert fwd.answered == (0, 1) and fwd.missing == ()
        assert time.monotonic() - t0 < FAST
        after = _counters(c)
        # the odd tokens' two pairs each went to their expert's live replica
        assert after["moe_rows_rerouted"] - before["moe_rows_rerouted"] == 8
        assert after["moe_no_live_replica"] == before["moe_no_live_replica"]


def test_a_forward_needing_an_expert_only_on_lost_ducks_fails_at_once_naming_them(lossy4):
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=72)
    x = _tokens(4, 72)
    w = np.full((4, 2), 0.5, np.float32)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(72, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _kill_and_wait_lost(lossy4)
        i = np.array([[0, 1], [2, 6], [3, 4], [1, 5]], np.int32)  # expert 6: duck 2 only
        e = _fails_fast(c, 72, x, i, w)
        assert "layer 72: expert 6 has no live replica; lost: duck 2 (experts 0 2 4 6)" in str(e)
        i[3] = [5, 7]  # and expert 7: duck 3 only
        e = _fails_fast(c, 72, x, i, w)
        assert (
            "layer 72: experts 6 7 have no live replica; lost: duck 2 (experts 0 2 4 6); "
            "duck 3 (experts 1 3 5 7)" in str(e)
        )
        i[1, 1], i[3, 1] = 4, 3  # routed away from them: exact, at once
        t0 = time.monotonic()
        _check(c.forward(72, x, routing=(i, w)), moe.reference(x, i, w))
        assert time.monotonic() - t0 < FAST


def test_every_forward_fails_at_once_when_a_duck_of_the_one_shared_expert_set_is_lost(lossy4):
    m = MoeMlp.random(4, HIDDEN, EFFN, shared=True, seed=74)
    moe = MoeMlp(experts=m.experts, shared=m.shared, shared_ducks=[1, 2])
    x = _tokens(2, 74)
    i = np.zeros((2, 1), np.int32)  # expert 0, on duck 0 alone: "routed elsewhere"
    w = np.ones((2, 1), np.float32)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(74, moe, ducks=[0, 1, 2], placement=[0, 1, 0, 1])
        _check(c.forward(74, x, routing=(i, w)), moe.reference(x, i, w))
        _kill_and_wait_lost(lossy4)
        e = _fails_fast(c, 74, x, i, w)
        assert (
            "layer 74: the shared expert's duck 2 is lost, and with one shared-expert set "
            "there is no replica" in str(e)
        )


def test_a_duck_that_answers_again_gets_its_rows_again(lossy4):
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=76)
    x = _tokens(4, 76)
    i = np.array([[0, 1], [2, 3], [4, 5], [0, 3]], np.int32)
    w = np.full((4, 2), 0.5, np.float32)
    want = moe.reference(x, i, w)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(76, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _kill_and_wait_lost(lossy4)
        _check(c.forward(76, x, routing=(i, w)), want)
        lossy4.revive()
        _wait_state(lossy4, "up")
        # known lost no longer (cleared by the tick that saw it): t % r as loaded again
        deadline = time.monotonic() + 5
        while True:
            before = _counters(c)
            with c.claim(x.shape, x.dtype) as slot:
                slot.array[:] = x
                fwd = c.submit(slot, 76, routing=(i, w))
            with fwd:
                _check(fwd.result(timeout=30), want)
                answered = fwd.answered
            if answered == (0, 1, 2, 3) or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # "up" in one view before the other: within a tick
        assert answered == (0, 1, 2, 3)
        assert _counters(c)["moe_rows_rerouted"] == before["moe_rows_rerouted"]


def test_ducks_that_restarted_without_the_layer_are_routed_around_until_repaired(
    duckpipe_cluster_factory,
):
    """The C dataplane only (its emulator restarts ducks): ducks 2 and 3 forget their
    weights after one forward and answer NO_LAYER; that forward's rows on them fail over
    to their replicas on ducks 0 and 1 within it (a restart costs no forward), and from
    then on the layer's forwards go around them; one that needs an expert they alone held
    fails at once, saying a repair brings them back."""
    cl = duckpipe_cluster_factory(4, groups=[(2, []), (2, ["--restart-after", "1"])])
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=78)
    x = _tokens(4, 78)
    i = np.array([[0, 1], [2, 3], [4, 5], [0, 3]], np.int32)  # odd tokens: ducks 2 and 3
    w = np.full((4, 2), 0.5, np.float32)
    want = moe.reference(x, i, w)
    with duckpipe.connect(cl.control, forward_timeout=DEADLINE) as c:
        c.load_weights(78, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _check(c.forward(78, x, routing=(i, w)), want)  # then ducks 2 and 3 forget it
        before = _counters(c)
        y, answered = _routed(c, 78, x, i, w)  # they say NO_LAYER: failed over, exact
        _check(y, want)
        assert answered == (0, 1)
        after = _counters(c)
        assert after["moe_failovers"] - before["moe_failovers"] == 2
        assert after["no_layer_replies"] - before["no_layer_replies"] == 2
        before = after
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = c.submit(slot, 78, routing=(i, w))
        with fwd:
            _check(fwd.result(timeout=30), want)
            assert fwd.answered == (0, 1)
        assert _counters(c)["moe_rows_rerouted"] - before["moe_rows_rerouted"] == 4
        i[1] = [2, 6]  # expert 6: duck 2 alone
        e = _fails_fast(c, 78, x, i, w)
        assert (
            "layer 78: expert 6 has no live replica; lost: duck 2 (experts 0 2 4 6) "
            "(restarted: repair it, client.repair(78))" in str(e)
        )
        c.repair(78, progress=False)  # their banks again: routed to as loaded, t % r
        i[1] = [2, 3]
        y, answered = _routed(c, 78, x, i, w)
        _check(y, want)
        assert answered == (0, 1, 2, 3)


# --- the shared expert's replicas (sets) ------------------------------------------------


def _shared_sets_layer(c, layer: int, sets, seed: int) -> MoeMlp:
    m = MoeMlp.random(4, HIDDEN, EFFN, shared=True, seed=seed)
    moe = MoeMlp(experts=m.experts, shared=m.shared, shared_ducks=sets)
    c.load_weights(layer, moe, ducks=[0, 1, 2, 3], placement=[0, 1, 0, 1])
    return moe


def _routed(c, layer: int, x, i, w) -> tuple[np.ndarray, tuple[int, ...]]:
    with c.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        fwd = c.submit(slot, layer, routing=(i, w))
    with fwd:
        return fwd.result(timeout=30), fwd.answered


def test_a_replicated_shared_expert_is_exact_on_each_set_and_serves_with_one_lost(lossy4):
    x = _tokens(3, 80)
    i = np.array([[0], [1], [0]], np.int32)  # experts on ducks 0 and 1 only
    w = np.ones((3, 1), np.float32)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        moe = _shared_sets_layer(c, 80, [[0, 1], [2, 3]], seed=80)
        (info,) = c.layers()
        assert (info.shared_ducks, info.shared_sets) == ([0, 1, 2, 3], [2, 2])
        want = moe.reference(x, i, w)
        seen = set()
        for _ in range(4):  # forwards take turns on the two sets
            y, answered = _routed(c, 80, x, i, w)
            _check(y, want)
            seen.add(answered)
        assert seen == {(0, 1), (0, 1, 2, 3)}, seen
        _kill_and_wait_lost(lossy4)  # set 1 has lost ducks: every forward uses set 0
        before = _counters(c)
        for _ in range(3):
            t0 = time.monotonic()
            y, answered = _routed(c, 80, x, i, w)
            assert time.monotonic() - t0 < FAST
            _check(y, want)
            assert answered == (0, 1)
        assert _counters(c)["moe_no_live_replica"] == before["moe_no_live_replica"]


def test_with_a_duck_of_every_shared_set_lost_every_forward_fails_at_once(lossy4):
    x = _tokens(2, 82)
    i = np.zeros((2, 1), np.int32)
    w = np.ones((2, 1), np.float32)
    with duckpipe.connect(lossy4.control, forward_timeout=DEADLINE) as c:
        moe = _shared_sets_layer(c, 82, [[0, 2], [1, 3]], seed=82)
        _check(c.forward(82, x, routing=(i, w)), moe.reference(x, i, w))
        _kill_and_wait_lost(lossy4)
        e = _fails_fast(c, 82, x, i, w)
        assert (
            "layer 82: the shared expert's ducks 2 3 are lost, a duck of each of its 2 sets"
            in str(e)
        )
