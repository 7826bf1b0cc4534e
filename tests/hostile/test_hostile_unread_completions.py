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

MLP = GeluMlp.random(16, 32, seed=26)
X = np.ones((1, 16), np.float32)
# more completions than ROUTER_SNDHWM, the kernel's socket buffers and the client's
# RCVHWM (1000) hold: the old dataplane let about 2,000 of 3,000 through
FLOOD = 6000


@pytest.fixture(params=["mock", "real"])
def fresh_dataplane(request):
    """A dataplane of one duck of its own: its counters are this test's alone."""
    if request.param == "mock":
        return request.getfixturevalue("duckpipe_mock_factory")(ducks=1)
    return request.getfixturevalue("duckpipe_null_factory")(1)


def _held(watch: duckpipe.Client) -> int:
    return watch.stats().counters.get("completions_held", 0)


def test_completions_a_client_leaves_unread_are_held_and_all_arrive(fresh_dataplane, monkeypatch):
    dp = fresh_dataplane
    with (
        duckpipe.connect(dp.control, slots=8, slot_size=4096, name="unread") as c,
        duckpipe.connect(dp.control, name="watch") as watch,
    ):
        c.load_weights(1, MLP, progress=False)
        session = c._session
        reading = False
        real_pump = Channel.pump

        def pump(channel, *args, **kw):  # the client's socket is not read
            if reading or channel is not session.channel:
                return real_pump(channel, *args, **kw)
            return 0

        monkeypatch.setattr(Channel, "pump", pump)
        expected = c.forward(1, X, timeout=10)
        submitted, waiting = 0, None
        deadline = time.monotonic() + 60
        while submitted < FLOOD and waiting is None:
            with c.claim(X.shape) as slot:
                slot.array[:] = X
                fwd = c.submit(slot, 1)
            submitted += 1
            while True:
                try:
                    y = fwd.result(timeout=0.5)
                    break
                except WaitTimeout:
                    # a forward slower than that: at its quota of held completions, the
                    # client's forwards wait in its ring until it reads; else just slow
                    if _held(watch):
                        waiting = fwd
                        break
                    assert time.monotonic() < deadline, "a forward did not complete"
            if waiting is None:
                np.testing.assert_array_equal(y, expected)
                fwd.release()
        held = _held(watch)
        reading = True  # the client reads again: what was held comes, and the forward waiting
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
