"""The client's per-forward path (issue 19): what it caches, that the caches go when
they must, and how much Python it runs a forward. docs/benchmark-history.md ("the client's
per-forward work") has the instructions and times these stand for."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq

import duckpipe
from duckpipe.client.channel import Channel
from duckpipe.client.session import ResultBase
from duckpipe.client.slots import ClaimBase
from duckpipe.errors import BadInput
from duckpipe.schema import control as ctl

HIDDEN = 16
PACKAGE = str(Path(duckpipe.__file__).parent)


@pytest.fixture
def client(duckpipe_mock):
    with duckpipe.connect(duckpipe_mock, name="hot", slots=8, slot_size=4096) as c:
        yield c


def _one(c: duckpipe.Client, x: np.ndarray) -> None:
    """The loop users write (``duckpipe bench ipc``'s): claim, fill, submit, result."""
    with c.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        fwd = c.submit(slot, 1)
    with fwd:
        fwd.result(timeout=10)


@pytest.mark.parametrize("wait", ["spin", "block"])
def test_a_forward_runs_few_python_calls_of_duckpipe(duckpipe_mock, wait):
    """Counted, not timed: every Python function of the package entered in a forward.
    19 now (claim, the Slot's, submit, push, the records' __init__, result, wait_done,
    the releases, the ZeroMQ completion); 32 before the per-forward path was cut (the
    checks of check_usable, holds and is_claimed as calls of their own, the shm
    completion's own method, the ring's submit_template, the claim's array made in a
    function). The bound leaves room for a few more, not for those back."""
    with duckpipe.connect(duckpipe_mock, wait=wait, slots=8, slot_size=4096) as c:
        c.load_weights(1, duckpipe.GeluMlp.random(HIDDEN, 32, seed=1))
        x = np.ones((1, HIDDEN), np.float32)
        for _ in range(64):  # claim specs and descriptor templates made, slots warm
            _one(c, x)
        calls = 0

        def count(frame, event, arg):
            nonlocal calls
            if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
                calls += 1

        n = 256
        sys.setprofile(count)
        try:
            for _ in range(n):
                _one(c, x)
        finally:
            sys.setprofile(None)
    assert calls / n <= 22, f"{calls / n:.2f} Python calls of duckpipe per forward"


def test_each_claim_of_a_slot_gets_its_own_array_and_base(client):
    """Claims of one shape are views of a template kept per slot: each claim still gets
    a new array on a base of its own that names it, and a stale handle stays stale."""
    first = client.claim((2, 8), np.float32)
    a = first.array
    a[:] = 3
    i, base = first.index, a.base
    assert type(base) is ClaimBase and base.claim[1:] == (i, first.generation)
    first.release()
    second = client.claim((2, 8), np.float32)
    assert second.index == i  # last in, first out: the same slot, from the same template
    b = second.array
    assert b is not a and b.base is not base and b.base.claim[2] == second.generation
    assert type(b) is np.ndarray and b.shape == (2, 8) and b.dtype == np.float32
    assert (b == 3).all()  # the same memory
    with pytest.raises(BadInput, match="stale"):
        first.array  # noqa: B018
    second.release()
    other = client.claim((4, 4), np.float32)  # another shape on that slot: its own template
    assert other.index == i and other.array.shape == (4, 4)
    other.release()


def test_each_result_gets_its_own_base_holding_its_forward(client):
    """Results are views of a template of their slot's last result shape: each still gets
    a base of its own holding its Forward, and another shape on the slot gets its own."""
    mlp = duckpipe.GeluMlp.random(HIDDEN, 32, seed=3)
    client.load_weights(1, mlp)
    got = []
    for rows in (1, 1, 3):  # the same slot each time (last in, first out)
        x = np.full((rows, HIDDEN), float(rows), np.float32)
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, 1)
        y = fwd.result(timeout=10)
        assert type(y) is np.ndarray and y.shape == (rows, HIDDEN)
        assert type(y.base) is ResultBase and y.base.owner is fwd
        np.testing.assert_allclose(y, mlp.reference(x), rtol=1e-5, atol=1e-6)
        got.append((slot.index, y.base, y.copy()))
        del y
        fwd.release()
    assert got[0][0] == got[1][0] == got[2][0] and got[0][1] is not got[1][1]
    last = client._session.result_last[got[2][0]]
    assert last[0] == (3, HIDDEN) and last[1] == np.float32


def test_a_full_claim_cache_starts_over_and_arrays_kept_stay_valid(client):
    kept = client.claim((1, 8), np.float32)
    kept.array[:] = 7
    for n in range(1, 300):  # more shapes than the cache keeps (it is cleared past 256)
        client.claim((n,), np.float16).release()
    assert len(client._session.claim_specs) <= 256
    assert (kept.array == 7).all()
    kept.release()
    again = client.claim((1, 8), np.float32)
    assert again.array.shape == (1, 8) and again.array.base.claim[2] == again.generation
    again.release()


def test_closing_a_client_drops_its_templates_and_unmaps_its_segment(duckpipe_mock):
    """The claim and result templates and the slot header pointers view the mapping:
    close() drops them with the slots' own views, so the segment is unmapped at once, not
    when the Client object is collected (mmap.close refuses while a view is exported)."""
    c = duckpipe.connect(duckpipe_mock, slots=4, slot_size=4096)
    c.load_weights(1, duckpipe.GeluMlp.random(HIDDEN, 32, seed=2))
    x = np.ones((1, HIDDEN), np.float32)
    for shape in ((1, HIDDEN), (2, 8), (16,)):
        c.claim(shape, np.float32).release()
    _one(c, x)
    session = c._session
    assert session.claim_specs and session.slot_hdrs and any(session.result_last)
    mm = session.segment._mm
    c.close()
    assert not session.claim_specs and not session.slot_hdrs and not session.result_last
    assert mm.closed


def test_pump_takes_at_most_limit_messages(tmp_path):
    """Forward.timings waits for one completion at a time (limit=1): no receive is left
    to find the socket empty, which costs pyzmq more than a whole forward."""
    endpoint = f"ipc://{tmp_path}/control"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    counters = {"bad_messages": 0}
    ch = Channel(endpoint, counters)
    try:
        ch.sock.send(b"hello")  # the router learns the dealer's identity
        assert router.poll(5000)
        ident, _ = router.recv_multipart()
        for fid in (1, 2, 3):
            done = ctl.Completion(forward_id=fid, slot=0, generation=1, epoch=0, status=0)
            router.send_multipart([ident, msgspec.msgpack.encode(done)])
        time.sleep(0.2)  # let all three arrive (the limit holds either way)
        got: list[int] = []
        assert ch.pump(5.0, lambda m: got.append(m.forward_id), 1) == 1
        assert got == [1]
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            ch.pump(1.0, lambda m: got.append(m.forward_id), 0)  # the rest, in order
        assert got == [1, 2, 3] and counters["bad_messages"] == 0
    finally:
        ch.close()
        router.close(linger=0)
