"""Forward.phases: a forward's phase times read from its slot header, without ZeroMQ.

The dataplane writes them into the slot header's second line before the done word
(dp_slot_publish); they are the numbers its ZeroMQ Completion's Timings carries, the
per-duck compute folded into its max and sum. Reading them must not ask the dataplane
for the ZeroMQ completion (SegHeader.completions_wanted), which ``Forward.timings`` does.
"""

from __future__ import annotations

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, Status
from duckpipe._abi import ffi, lib
from duckpipe.errors import ForwardTimeout
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.schema.abi import SlotHeader
from duckpipe.schema.control import Phases

HIDDEN, FFN = 32, 48


def _submit(c: duckpipe.Client, layer: int, x: np.ndarray) -> duckpipe.Forward:
    with c.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        return c.submit(slot, layer)


def test_phases_are_line_1_of_the_slot_header_field_for_field():
    names = list(SlotHeader.__struct_fields__)
    assert names[names.index("prepare_ns") :] == list(Phases.__struct_fields__)


def test_phases_are_the_zeromq_completions_timings(client):
    client.load_weights(41, GeluMlp.random(HIDDEN, FFN, seed=41), ducks=[0, 1, 2, 3])
    x = np.random.default_rng(41).standard_normal((2, HIDDEN)).astype(np.float32)
    for _ in range(10):
        fwd = _submit(client, 41, x)
        with fwd:
            fwd.result(timeout=10)
            waits = client.counters["zmq_waits"]
            p = fwd.phases  # from the slot header
            assert client.counters["zmq_waits"] == waits  # no ZeroMQ asked for
            assert fwd.phases is p  # read once, then kept
        t = fwd.timings  # from the ZeroMQ completion
        assert p == Phases.of(t)
        assert len(t.duck_compute_ns) == 4 and min(t.duck_compute_ns) > 0
        assert p.duck_compute_max_ns == max(t.duck_compute_ns)
        assert p.duck_compute_sum_ns == sum(t.duck_compute_ns)
        assert p.wait_ns > 0 and p.reduce_ns > 0
    assert client.counters["completion_mismatch"] == 0


def test_phases_read_after_release_come_from_the_zeromq_completion(client):
    # released, the slot may be the next forward's: the same numbers come from ZeroMQ
    client.load_weights(42, GeluMlp.random(HIDDEN, FFN, seed=42), ducks=[0, 1])
    x = np.ones((1, HIDDEN), np.float32)
    fwd = _submit(client, 42, x)
    with fwd:
        fwd.result(timeout=10)
    p = fwd.phases
    assert p == Phases.of(fwd.timings) and p.duck_compute_sum_ns > 0


@pytest.fixture(params=["mock", "real"])
def slow_flush(request):
    """A dataplane that holds ZeroMQ completions a whole second unless a client waits
    for one (the C dataplane's completion_flush_us; the mock sends each at once)."""
    if request.param == "mock":
        return request.getfixturevalue("duckpipe_mock_factory")(ducks=4)
    return request.getfixturevalue("duckpipe_cluster_factory")(4, completion_flush_us=1_000_000)


def test_reading_phases_does_not_ask_for_the_zeromq_completion(slow_flush):
    n = 20
    x = np.random.default_rng(43).standard_normal((1, HIDDEN)).astype(np.float32)
    with duckpipe.connect(slow_flush.control, wait="block", slots=4, slot_size=4096) as c:
        c.load_weights(43, GeluMlp.random(HIDDEN, FFN, seed=43), progress=False)
        waits, before = c.counters["zmq_waits"], c.stats().counters
        for _ in range(n):
            fwd = _submit(c, 43, x)
            with fwd:
                fwd.result(timeout=10)
                assert fwd.phases.reduce_ns > 0
        middle = c.stats().counters
        assert c.counters["zmq_waits"] == waits
        assert middle["completion_flushes_wanted"] == before["completion_flushes_wanted"]
        for _ in range(n):  # the same loop reading timings waits for each completion
            fwd = _submit(c, 43, x)
            with fwd:
                fwd.result(timeout=10)
                assert fwd.timings.reduce_ns > 0
        after = c.stats().counters
        assert c.counters["zmq_waits"] > waits
        wanted = after["completion_flushes_wanted"] - middle["completion_flushes_wanted"]
        if isinstance(slow_flush, MockDataplaneProcess):
            assert wanted == 0  # no outbox: nothing to send early
        else:
            assert wanted == n  # each timings read made its completion leave at once


def test_a_timed_out_forwards_phases_say_how_far_it_got(ducks4):
    # TIMEOUT: the phases cover the ducks that answered; nothing was reduced or stored
    x = np.random.default_rng(44).standard_normal((2, HIDDEN)).astype(np.float32)
    with duckpipe.connect(ducks4.control, forward_timeout=0.5) as c:
        c.load_weights(44, GeluMlp.random(HIDDEN, FFN, seed=44), progress=False)
        ducks4.kill()
        fwd = _submit(c, 44, x)
        with fwd:
            with pytest.raises(ForwardTimeout):
                fwd.result(timeout=30)
            p = fwd.phases
        assert fwd.status == Status.TIMEOUT and fwd.answered == (0, 1)
        t = fwd.timings
        assert p == Phases.of(t)
        assert p.reduce_ns == 0 and p.wait_ns > 0
        assert len(t.duck_compute_ns) == 2 and p.duck_compute_sum_ns == sum(t.duck_compute_ns)


def test_slot_phases_are_read_only_for_the_generation_in_done():
    h = ffi.new("struct dp_slot_header *")
    v = ffi.new("struct dp_slot_header *")
    for i, name in enumerate(Phases.__struct_fields__):
        setattr(v, name, 1000 + i)
    out = ffi.new("uint64_t[8]", [7] * 8)
    assert lib.dp_slot_phases(h, 5, out) == 0  # nothing published yet
    lib.dp_slot_publish(h, v, 5, int(Status.TIMEOUT))
    assert lib.dp_slot_phases(h, 6, out) == 0 and list(out) == [7] * 8  # another generation
    assert lib.dp_slot_phases(h, 5, out) == 1
    assert Phases(*out) == Phases(*range(1000, 1008))
