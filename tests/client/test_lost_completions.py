"""A forward whose ZeroMQ completion never comes (issue 26.5): the dataplane now holds a
completion its client's full socket refuses and counts one it must drop (see
tests/hostile/test_hostile_unread_completions.py), but should one still not come, the
client does not keep the forward's record for ever. Its done word gave the status, its slot
header the phase times; the record goes, and a completion that comes after all is stale."""

from __future__ import annotations

import time

import numpy as np

from duckpipe import GeluMlp
from duckpipe.client import session as session_mod
from duckpipe.schema import control as ctl

HIDDEN, FFN = 32, 48


def test_a_forward_whose_zmq_completion_never_comes_is_recovered_from_its_slot_header(
    client, monkeypatch
):
    client.load_weights(61, GeluMlp.random(HIDDEN, FFN, seed=61), ducks=[0, 1])
    x = np.ones((1, HIDDEN), np.float32)
    session = client._session
    monkeypatch.setattr(session_mod, "_SWEEP_S", 0.05, raising=False)
    monkeypatch.setattr(session_mod, "_ZMQ_LOST_S", 0.2, raising=False)
    lose: set[int] = set()
    lost: list[ctl.Completion] = []
    real_take = session_mod.Session.take_completion

    def take(s, msg):  # the ZeroMQ completions of the forwards in `lose` never arrive
        if s is session and msg.forward_id in lose:
            lost.append(msg)
            return
        real_take(s, msg)

    monkeypatch.setattr(session_mod.Session, "take_completion", take)
    expected = None
    kept = []  # forwards not released: their slot headers are still theirs
    for i in range(20):
        with client.claim(x.shape) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, 61)
        if i % 2:
            lose.add(fwd.id)
        y = fwd.result(timeout=10)
        expected = y.copy() if expected is None else expected
        # the same sum, but for its order: partials are added as they arrive
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        if i in (1, 3):
            kept.append(fwd)
        else:
            fwd.release()
    deadline = time.monotonic() + 10
    while (session.inflight or len(lost) < len(lose)) and time.monotonic() < deadline:
        session.pump(0.05)
    assert not session.inflight, f"records left: {list(session.inflight.values())}"
    assert len(lost) == len(lose) == 10
    assert client.counters["zmq_lost"] == 10
    assert client.counters["stale_completions"] == 0
    for fwd in kept:  # at once: nothing more is waited for
        t0 = time.monotonic()
        p, t = fwd.phases, fwd.timings
        assert time.monotonic() - t0 < 1
        assert t.prepare_ns == p.prepare_ns > 0 and t.reduce_ns == p.reduce_ns > 0
        assert t.duck_compute_ns == [] and fwd.answered == ()  # the lists were in the message
        fwd.release()
    real_take(session, lost[0])  # one comes after all: it names no forward in flight
    assert client.counters["stale_completions"] == 1
    assert not session.inflight
    assert client.counters["completion_mismatch"] == 0


def test_waiting_for_a_zmq_completion_that_does_not_come_gives_it_up(client, monkeypatch):
    client.load_weights(62, GeluMlp.random(HIDDEN, FFN, seed=62), ducks=[0])
    x = np.ones((1, HIDDEN), np.float32)
    session = client._session
    real_take = session_mod.Session.take_completion
    monkeypatch.setattr(
        session_mod.Session,
        "take_completion",
        lambda s, msg: None if s is session else real_take(s, msg),
    )
    with client.claim(x.shape) as slot:
        slot.array[:] = x
        fwd = client.submit(slot, 62)
    with fwd:
        fwd.result(timeout=10)
        session.await_zmq(fwd._rec, 0.3)  # what Forward.timings does, for 5 s
        assert fwd._rec.zmq_done and fwd.timings.prepare_ns == fwd.phases.prepare_ns > 0
    assert client.counters["zmq_lost"] == 1
    assert fwd.id not in session.inflight
