"""Failover inside a forward (issue 30.2), on the mock and the C dataplane: a routed duck
that goes silent without being known lost yet (duck_lost_ms is a minute here) has its
rows resent, within the same forward, to the next live replica of each of its experts at
its failover deadline (max(8 x its smoothed reply time, failover_ms)); the forward
completes exact long before its timeout, counted in moe_failovers (the counter, and the
duck's in the stats segment). Its late reply, after its rows were handed over, is
discarded (the generation rule): results stay exact. Rows whose expert has no other
replica wait for the forward's own deadline, as without failover, and time out naming
the duck and its experts (a duck only slow must not be declared lost sooner).

Duck 3 is silenced: the C dataplane's, by stopping its emulator (SIGSTOP; ducks 0-2 run in
another); the mock's by its silent_ducks fault.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import numpy as np
import pytest

import duckpipe
from duckpipe.errors import ForwardTimeout
from duckpipe.moe import MoeMlp
from duckpipe.observe import stats_reader as stats
from duckpipe.testing import set_faults

HIDDEN, EFFN = 64, 32
LOST_MS = 60_000  # never known lost during a test: the failover is what saves the forward
FAILOVER_MS = 100  # the C dataplane's failover_ms here (the mock: the default, 500)
DEADLINE = 10.0  # each forward's timeout: failing over means completing long before it
SOON = DEADLINE / 2  # "long before", generously for a loaded 2-core machine
STUCK_DEADLINE = 2.0  # a forward that waits for its deadline: above both failover_ms
# experts 0..5 on duck 3 and one of ducks 0-2 (token t: replica t % 2, so even tokens go
# to duck 3); expert 6 on duck 3 alone, expert 7 on duck 0 alone
PLACEMENT = [[3, e % 3] for e in range(6)] + [[3], [0]]
SILENT = 3


class _Mock:
    def __init__(self, factory, delay_us: int = 0, failover_ms: int = 0) -> None:
        self.control = factory(ducks=4).control
        self.real = False

    def silence(self) -> None:
        set_faults(self.control, silent_ducks=[SILENT])

    def revive(self) -> None:
        set_faults(self.control)


class _Real:
    """Ducks 0-2 in one emulator (their replies delayed by delay_us), duck 3 alone in
    another, stopped to silence it (SIGSTOP) and continued to revive it (SIGCONT)."""

    def __init__(self, factory, delay_us: int = 0, failover_ms: int = FAILOVER_MS) -> None:
        args = ["--delay-us", str(delay_us)] if delay_us else []
        self.cluster = factory(
            4, groups=[(3, args), (1, [])], ping_ms=100, duck_lost_ms=LOST_MS,
            failover_ms=failover_ms,
        )  # fmt: skip
        self.control = self.cluster.control
        self.real = True

    def silence(self) -> None:
        os.kill(self.cluster.emulators[1].pid, signal.SIGSTOP)

    def revive(self) -> None:
        os.kill(self.cluster.emulators[1].pid, signal.SIGCONT)


def _ducks(request, delay_us: int = 0, failover_ms: int = FAILOVER_MS):
    if request.param == "mock":
        return _Mock(request.getfixturevalue("duckpipe_mock_factory"))
    return _Real(request.getfixturevalue("duckpipe_cluster_factory"), delay_us, failover_ms)


@pytest.fixture(params=["mock", pytest.param("real", marks=pytest.mark.dataplane)])
def silent4(request):
    """Four ducks; .silence() stops duck 3 answering, not known lost."""
    ducks = _ducks(request)
    yield ducks
    ducks.revive()  # a stopped emulator would not hear the teardown's SIGTERM


@pytest.fixture(params=["mock", pytest.param("real", marks=pytest.mark.dataplane)])
def slow_replicas4(request):
    """As silent4, ducks 0-2 replying 0.6 s late (C): a failover's replacement answers
    long after duck 3, continued right after the failover, sends its own late reply.
    failover_ms 1000: a floor over the slow ducks' reply time, or they too would be taken
    for silent (NACKed while they wait, they give no RTT sample: Karn)."""
    ducks = _ducks(request, delay_us=600_000, failover_ms=1000)
    yield ducks
    ducks.revive()


def _tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, HIDDEN)).astype(np.float32)


def _routing(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(n)
    i = np.sort(np.stack([t % 6, (t + 3) % 6], axis=1), axis=1).astype(np.int32)  # 0..5
    w = np.random.default_rng(seed).random((n, 2)).astype(np.float32)
    return i, w


def _check(y: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _counters(c) -> dict[str, int]:
    return dict(c.stats().counters)


def _duck_failovers(control: str, duck: int) -> int:
    return {d.id: d.moe_failovers for d in stats.read_snapshot(control=control).ducks}[duck]


def test_a_silent_ducks_rows_fail_over_to_a_live_replica_within_the_forward(silent4):
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=80)
    x = _tokens(8, 80)
    i, w = _routing(8, 81)
    want = moe.reference(x, i, w)
    with duckpipe.connect(silent4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(80, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        with c.claim(x.shape, x.dtype) as slot:  # all answer: duck 3's reply time measured
            slot.array[:] = x
            fwd = c.submit(slot, 80, routing=(i, w))
        with fwd:
            _check(fwd.result(timeout=30), want)
            assert fwd.answered == (0, 1, 2, 3)
        silent4.silence()
        before, duck_before = _counters(c), _duck_failovers(silent4.control, SILENT)
        t0 = time.monotonic()
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = c.submit(slot, 80, routing=(i, w))
        with fwd:
            _check(fwd.result(timeout=30), want)
            took = time.monotonic() - t0
            assert fwd.answered == (0, 1, 2) and fwd.missing == (SILENT,)
        assert took < SOON, f"{took:.3f} s: waited for the deadline ({DEADLINE} s)?"
        after = _counters(c)
        assert after["moe_failovers"] - before["moe_failovers"] == 1
        assert after["timeouts"] == before["timeouts"]
        assert _duck_failovers(silent4.control, SILENT) == duck_before + 1
        # the next forward fails over too (duck 3 is still silent, not known lost)
        _check(c.forward(80, x, routing=(i, w)), want)
        assert _counters(c)["moe_failovers"] - before["moe_failovers"] == 2


def test_a_forward_whose_expert_is_only_on_the_silent_duck_waits_for_its_own_deadline(
    silent4,
):
    # no replica can take its rows: the forward's deadline (the client's timeout) decides,
    # as without failover; a duck that is only slow (a prefill bigger than any it was
    # measured on) is not declared lost sooner. The failover of the others still happens.
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=82)
    x = _tokens(4, 82)
    i = np.array([[0, 1], [2, 6], [3, 4], [1, 7]], np.int32)  # expert 6: duck 3 alone
    w = np.full((4, 2), 0.5, np.float32)
    with duckpipe.connect(silent4.control, forward_timeout=STUCK_DEADLINE) as c:
        c.load_weights(82, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _check(c.forward(82, x, routing=(i, w)), moe.reference(x, i, w))
        silent4.silence()
        with pytest.raises(
            ForwardTimeout, match=r"duck 3 \(experts 0 1 2 3 4 5 6\) did not answer"
        ):
            c.forward(82, x, routing=(i, w))
        i[1, 1] = 5  # expert 5 has a replica on duck 2: fails over, exact
        _check(c.forward(82, x, routing=(i, w)), moe.reference(x, i, w))


def test_a_late_reply_of_the_silent_duck_after_its_rows_failed_over_is_not_counted_twice(
    slow_replicas4,
):
    ducks = slow_replicas4
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=84)
    x = _tokens(8, 84)
    i, w = _routing(8, 85)
    want = moe.reference(x, i, w)
    with duckpipe.connect(ducks.control, forward_timeout=DEADLINE) as c:
        c.load_weights(84, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _check(c.forward(84, x, routing=(i, w)), want)
        ducks.silence()
        before = _counters(c)
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = c.submit(slot, 84, routing=(i, w))
        # its rows went to ducks 0-2 (which answer 0.6 s later): duck 3 now answers
        # this forward late, while it still waits for them
        give_up = time.monotonic() + SOON
        while _counters(c)["moe_failovers"] == before["moe_failovers"]:
            assert time.monotonic() < give_up, "no failover"
            time.sleep(0.01)
        ducks.revive()
        with fwd:
            _check(fwd.result(timeout=30), want)
        after = _counters(c)
        if ducks.real:  # the mock has no wire: its silent duck sends nothing late
            assert after["moe_failover_late"] > before["moe_failover_late"]
        # duck 3 answers again: later forwards ask it and are exact
        for _ in range(2):
            _check(c.forward(84, x, routing=(i, w)), want)


@pytest.mark.parametrize("send", ["broadcast", "unicast"])
def test_a_silent_duck_fails_over_whichever_way_the_forward_was_sent(silent4, send):
    """A broadcast's silent duck has its rows (the wire table's, not renumbered) resent
    by unicast to the replacements, as a unicast's (renumbered through its row map)."""
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=False, seed=86)
    x = _tokens(16, 86)
    i, w = _routing(16, 87)
    want = moe.reference(x, i, w)
    with duckpipe.connect(silent4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(86, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        _check(c.forward(86, x, routing=(i, w), moe_send=send), want)
        silent4.silence()
        before = _counters(c)
        _check(c.forward(86, x, routing=(i, w), moe_send=send), want)
        after = _counters(c)
        assert after["moe_failovers"] - before["moe_failovers"] == 1
        assert after[f"moe_{send}s"] - before[f"moe_{send}s"] == 1


def test_a_silent_duck_of_the_shared_set_has_its_shared_columns_computed_by_its_twin(silent4):
    """The shared expert in two sets cut alike ([1, 3] and [0, 2]: duck 3 holds the
    second half of its columns, and so does duck 2): a forward that uses duck 3's set
    while it is silent has those columns computed by duck 2, and duck 3's routed rows
    go to their replicas, within the forward. Forwards take the sets in turns: each of
    four is exact long before its deadline."""
    moe = MoeMlp.random(8, HIDDEN, EFFN, shared=True, seed=88)
    moe = dataclasses.replace(moe, shared_ducks=[[1, 3], [0, 2]])
    x = _tokens(8, 88)
    i, w = _routing(8, 89)
    want = moe.reference(x, i, w)
    with duckpipe.connect(silent4.control, forward_timeout=DEADLINE) as c:
        c.load_weights(88, moe, ducks=[0, 1, 2, 3], placement=PLACEMENT)
        for _ in range(2):  # both sets answer: duck 3's reply time measured
            _check(c.forward(88, x, routing=(i, w)), want)
        silent4.silence()
        before = _counters(c)
        for n in range(4):
            t0 = time.monotonic()
            _check(c.forward(88, x, routing=(i, w)), want)
            took = time.monotonic() - t0
            assert took < SOON, f"forward {n}: {took:.3f} s, waited for the deadline?"
        after = _counters(c)
        assert after["moe_failovers"] - before["moe_failovers"] == 4
        assert after["timeouts"] == before["timeouts"]
