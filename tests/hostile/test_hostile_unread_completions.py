"""A client that does not read its control socket (issue 26.5).

The control socket keeps at most ROUTER_SNDHWM (256) messages unread per peer. Past that
(and past what the sockets' buffers hold) ZeroMQ dropped completions without a word while
the dataplane counted them sent, and each one lost left a record in the client's session
for ever: a 60 s soak on a loaded machine, whose I/O threads fell behind, lost 60 of 128.
Now the socket is ROUTER_MANDATORY: a completion the client's full socket refuses is held
(``completions_held``), its forward counted in flight so that the client's quota bounds
them (its later forwards wait in its ring), and sent once the client reads again. Here the
client reads nothing while thousands of forwards complete, then reads: every completion
arrives, none is dropped, and the session's records return to 0.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.client.channel import Channel
from duckpipe.errors import WaitTimeout
from duckpipe.testing import mapped_by, wait_until_gone

MLP = GeluMlp.random(16, 32, seed=26)
X = np.ones((1, 16), np.float32)
# more completions than ROUTER_SNDHWM, the kernel's socket buffers and the client's
# RCVHWM (1000) hold: the old dataplane let about 2,000 of 3,000 through
FLOOD = 6000


def _start(request, kind: str):
    """A dataplane of one duck of its own: its counters are this test's alone."""
    if kind == "mock":
        return request.getfixturevalue("duckpipe_mock_factory")(ducks=1)
    threads = "dedicated" if kind == "dedicated" else "shared"
    return request.getfixturevalue("duckpipe_null_factory")(1, threads=threads)


@pytest.fixture(params=["mock", "real"])
def fresh_dataplane(request):
    return _start(request, request.param)


# with a thread per agent, a parked dispatcher must be woken for the forwards that waited
# in the ring while the client's completions were held
@pytest.fixture(params=["mock", "real", pytest.param("dedicated", marks=pytest.mark.dataplane)])
def any_dataplane(request):
    return _start(request, request.param)


def _held(watch: duckpipe.Client) -> int:
    return watch.stats().counters.get("completions_held", 0)


def _stop_reading(c: duckpipe.Client, monkeypatch) -> list[bool]:
    """The client's socket is not read until the returned flag is set."""
    session, reading = c._session, [False]
    real_pump = Channel.pump

    def pump(channel, *args, **kw):
        if reading[0] or channel is not session.channel:
            return real_pump(channel, *args, **kw)
        return 0

    monkeypatch.setattr(Channel, "pump", pump)
    return reading


def _flood(c: duckpipe.Client, watch: duckpipe.Client, expected: np.ndarray):
    """Forwards one at a time, their results read from the done word, until the dataplane
    holds completions (then the last forward waits in the ring: returned) or FLOOD."""
    deadline = time.monotonic() + 60
    for submitted in range(1, FLOOD + 1):
        with c.claim(X.shape) as slot:
            slot.array[:] = X
            fwd = c.submit(slot, 1)
        while True:
            try:
                y = fwd.result(timeout=0.5)
                break
            except WaitTimeout:
                # a forward slower than that: at its quota of held completions, the
                # client's forwards wait in its ring until it reads; else just slow
                if _held(watch):
                    return submitted, fwd
                assert time.monotonic() < deadline, "a forward did not complete"
        np.testing.assert_array_equal(y, expected)
        fwd.release()
    return FLOOD, None


def test_completions_a_client_leaves_unread_are_held_and_all_arrive(any_dataplane, monkeypatch):
    dp = any_dataplane
    with (
        duckpipe.connect(dp.control, slots=8, slot_size=4096, name="unread") as c,
        duckpipe.connect(dp.control, name="watch") as watch,
    ):
        c.load_weights(1, MLP, progress=False)
        session = c._session
        expected = c.forward(1, X, timeout=10)
        reading = _stop_reading(c, monkeypatch)
        submitted, waiting = _flood(c, watch, expected)
        held = _held(watch)
        reading[0] = True  # it reads again: what was held comes, and the forward waiting
        if waiting is not None:
            with waiting:
                np.testing.assert_array_equal(waiting.result(timeout=30), expected)
        deadline = time.monotonic() + 30
        while session.inflight and time.monotonic() < deadline:
            session.pump(0.1)
        counters = watch.stats().counters
        assert not session.inflight, f"records left {len(session.inflight)}/{submitted}"
        lost = c.counters["zmq_lost"]
        assert lost == 0, f"ZeroMQ completions never came: {lost} of {submitted}"
        assert c.counters["stale_completions"] == 0
        assert held > 0, f"{submitted} forwards never filled ROUTER_SNDHWM"
        assert counters["completions_dropped"] == 0
        # every completion sent, the weight chunks' too: none counted sent and lost
        assert counters["completions_sent"] == counters["descriptors"], counters
        assert counters["completions_held"] >= held
        # bounded: the client's quota (of 64 contexts among 2 clients and one to come)
        # and an outbox (32) packed before the socket refused
        assert held <= 64 // 3 + 32


def test_a_client_that_leaves_with_completions_held_is_let_go(fresh_dataplane, monkeypatch):
    # what was held for it is dropped and counted, and its forwards with it: else they
    # would count in flight for ever and its segment would never be unmapped
    dp = fresh_dataplane
    with duckpipe.connect(dp.control, name="watch") as watch:
        c = duckpipe.connect(dp.control, slots=8, slot_size=4096, name="leaves")
        c.load_weights(1, MLP, progress=False)
        expected = c.forward(1, X, timeout=10)
        name = c.segment_name
        _stop_reading(c, monkeypatch)
        _, waiting = _flood(c, watch, expected)
        assert waiting is not None, "the dataplane held nothing"
        del waiting
        c.close()  # detaches without reading the reply
        assert wait_until_gone(name), f"{name} is still mapped by {mapped_by(name)}"
        counters = watch.stats().counters
        assert counters["completions_dropped"] > 0
        sent, dropped = counters["completions_sent"], counters["completions_dropped"]
        assert sent + dropped == counters["descriptors"], counters  # the one waiting: never taken
        # the dataplane serves on
        watch.load_weights(2, MLP, progress=False)
        np.testing.assert_array_equal(watch.forward(2, X, timeout=10), expected)
