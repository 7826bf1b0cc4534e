"""The submission ring: SPSC, FIFO, bounded, free-running indices, across processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckpipe._abi.ring import SubmissionRing, new_desc, new_descs
from duckpipe._abi.shm import Segment

U32 = 0xFFFF_FFFF
U64 = 0xFFFF_FFFF_FFFF_FFFF
SPIN_LIMIT_S = 30.0

RingPair = tuple[SubmissionRing, SubmissionRing]


def _stamp(d, fid: int) -> None:
    """Fill a descriptor with ``fid`` and fields derived from it, front to back."""
    d.forward_id = fid
    d.epoch = fid ^ 0x5A5A_5A5A_5A5A_5A5A
    d.layer = fid * 7 & U32
    d.ducks[3] = fid * 0x9E37_79B9_7F4A_7C15 & U64


def _check(d, fid: int) -> None:
    got = (int(d.forward_id), int(d.epoch), int(d.layer), int(d.ducks[3]))
    want = (fid, fid ^ 0x5A5A_5A5A_5A5A_5A5A, fid * 7 & U32, fid * 0x9E37_79B9_7F4A_7C15 & U64)
    assert got == want, f"descriptor for forward {fid}: got {got}, want {want}"


def _new_segment(capacity: int) -> Segment:
    return Segment.create(
        slot_count=1, ring_capacity=capacity, act_slot_size=4096, backing="devshm", tag="ring"
    )


def _dispose(*segs: Segment) -> None:
    for s in segs:
        s.close()


@pytest.fixture
def rings() -> Iterator[Callable[[int], RingPair]]:
    """``rings(capacity)`` -> (producer on the creating mapping, consumer on a second one)."""
    made: list[Segment] = []

    def make(capacity: int) -> RingPair:
        owner = _new_segment(capacity)
        made.append(owner)
        peer = Segment.open(owner.path)
        made.append(peer)
        return SubmissionRing(owner), SubmissionRing(peer)

    yield make
    for s in reversed(made):
        s.close()


def _push_ids(ring: SubmissionRing, ids: range) -> None:
    d = new_desc()
    for fid in ids:
        _stamp(d, fid)
        assert ring.push(d), f"push of forward {fid} refused with {len(ring)} queued"


def _pop_ids(ring: SubmissionRing, n: int) -> list[int]:
    out = new_desc()
    got = []
    for _ in range(n):
        assert ring.pop(out)
        got.append(int(out.forward_id))
        _check(out, int(out.forward_id))
    return got


def test_empty_ring_pops_nothing(rings) -> None:
    _, cons = rings(8)
    out = new_descs(4)
    out[0].forward_id = 12345
    assert len(cons) == 0
    assert cons.pop(out) is False
    assert cons.pop_burst(out, 4) == 0
    assert out[0].forward_id == 12345  # nothing was copied out
    assert (cons.head, cons.tail) == (0, 0)


def test_push_fails_when_ring_is_full(rings) -> None:
    prod, cons = rings(8)
    _push_ids(prod, range(1, 9))
    assert len(prod) == len(cons) == 8
    extra = new_descs(3)
    _stamp(extra[0], 99)
    assert prod.push(extra) is False
    assert prod.push_burst(extra, 3) == 0
    assert prod.head == 8
    assert _pop_ids(cons, 1) == [1]
    assert prod.push(extra) is True  # one slot freed, one push fits
    assert prod.push(extra) is False
    out = new_descs(8)
    assert cons.pop_burst(out, 8) == 8
    assert [int(out[i].forward_id) for i in range(8)] == [2, 3, 4, 5, 6, 7, 8, 99]


def test_fifo_order_holds_across_thousands_of_wraparounds(rings) -> None:
    prod, cons = rings(8)
    total = 20_000
    batch = new_descs(8)
    out = new_descs(8)
    next_push = next_pop = 1
    step = 0
    while next_pop <= total:
        step += 1
        want = min(1 + step * 5 % 8, total - next_push + 1)
        for i in range(want):
            _stamp(batch[i], next_push + i)
        next_push += prod.push_burst(batch, want)
        got = cons.pop_burst(out, 1 + step * 3 % 8)
        for i in range(got):
            _check(out[i], next_pop)
            next_pop += 1
    assert next_push == next_pop == total + 1
    assert total // 8 > 2000  # the indices wrapped the 8 entries thousands of times
    assert (prod.head, cons.tail, len(cons)) == (total, total, 0)


def test_push_burst_is_partial_when_space_is_short(rings) -> None:
    prod, cons = rings(8)
    _push_ids(prod, range(1, 6))
    batch = new_descs(10)
    for i in range(10):
        _stamp(batch[i], 6 + i)
    assert prod.push_burst(batch, 10) == 3  # only the first 3 fit
    assert len(cons) == 8
    assert _pop_ids(cons, 8) == list(range(1, 9))
    assert cons.pop(new_desc()) is False  # forwards 9.. never went in


def test_pop_burst_is_partial_when_fewer_are_available(rings) -> None:
    prod, cons = rings(8)
    _push_ids(prod, range(1, 4))
    out = new_descs(8)
    out[3].forward_id = 777
    assert cons.pop_burst(out, 8) == 3
    assert [int(out[i].forward_id) for i in range(3)] == [1, 2, 3]
    assert out[3].forward_id == 777  # untouched past what was available
    assert len(cons) == 0


def test_len_counts_pushed_minus_popped_on_both_sides(rings) -> None:
    prod, cons = rings(16)
    counts = []
    _push_ids(prod, range(1, 11))
    counts.append((len(prod), len(cons)))
    _pop_ids(cons, 4)
    counts.append((len(prod), len(cons)))
    _push_ids(prod, range(11, 21))
    counts.append((len(prod), len(cons)))
    _pop_ids(cons, 16)
    counts.append((len(prod), len(cons)))
    assert counts == [(10, 10), (6, 6), (16, 16), (0, 0)]


def test_head_and_tail_run_free_past_capacity(rings) -> None:
    prod, cons = rings(4)
    n = 4 * 5 + 3
    for fid in range(1, n + 1):
        _push_ids(prod, range(fid, fid + 1))
        assert _pop_ids(cons, 1) == [fid]
    assert (prod.head, prod.tail) == (n, n)  # not masked to the capacity
    _push_ids(prod, range(n + 1, n + 3))
    assert (cons.head, cons.tail, len(cons)) == (n + 2, n, 2)
    # entries live at index & (capacity - 1) of the shared descriptor array
    descs = prod._descs
    assert [int(descs[i & 3].forward_id) for i in (n, n + 1)] == [n + 1, n + 2]


def test_descriptor_is_copied_whole_and_push_does_not_keep_a_reference(rings) -> None:
    prod, cons = rings(4)
    d = new_desc()
    d.forward_id, d.submit_ns, d.epoch, d.nbytes, d.offset = 1, 2, 3, 4, 5
    d.slot, d.generation, d.layer, d.flags, d.timeout_us = 6, 7, 8, 9, 10
    d.op, d.dtype, d.ndim, d.duck, d.tensor, d.reserved = 11, 12, 13, 14, 15, 16
    d.shape = [17, 18, 19, 20]
    d.ducks = [U64, 1 << 63, 22, 23]
    assert prod.push(d)
    d.forward_id, d.ducks[3] = 100, 0  # reuse the same descriptor for the next push
    assert prod.push(d)
    first, second = new_desc(), new_desc()
    assert cons.pop(first) and cons.pop(second)
    fields = ("forward_id", "submit_ns", "epoch", "nbytes", "offset", "slot", "generation")
    fields += ("layer", "flags", "timeout_us", "op", "dtype", "ndim", "duck", "tensor")
    got = [int(getattr(first, f)) for f in (*fields, "reserved")]
    assert got == list(range(1, 17))
    assert list(first.shape) == [17, 18, 19, 20]
    assert list(first.ducks) == [U64, 1 << 63, 22, 23]
    assert (second.forward_id, list(second.ducks)) == (100, [U64, 1 << 63, 22, 0])


# --- two processes ---------------------------------------------------------------

_PRODUCER = """
import sys, time
from duckpipe._abi.ring import SubmissionRing, new_descs
from duckpipe._abi.shm import Segment

path, n, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
seg = Segment.open(path)
ring = SubmissionRing(seg)
batch = new_descs(64)
deadline = time.monotonic() + limit
next_id, burst = 1, 1
while next_id <= n:
    k = min(burst, n - next_id + 1)
    for i in range(k):
        fid = next_id + i
        d = batch[i]
        d.forward_id = fid
        d.epoch = fid ^ 0x5A5A5A5A5A5A5A5A
        d.layer = fid * 7 & 0xFFFFFFFF
        d.ducks[3] = fid * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    pushed = int(ring.push(batch)) if k == 1 else ring.push_burst(batch, k)
    next_id += pushed
    burst = burst % 64 + 1
    if time.monotonic() > deadline:
        sys.exit(f"producer gave up after {limit}s with {next_id - 1}/{n} pushed")
seg.close()
"""


@settings(max_examples=10, deadline=None)
@given(
    capacity=st.sampled_from([1 << k for k in range(9)]),
    count=st.integers(1, 3000),
    pop_n=st.sampled_from([1, 3, 32, 64]),
)
def test_two_processes_lose_duplicate_or_reorder_nothing(
    capacity: int, count: int, pop_n: int
) -> None:
    seg = _new_segment(capacity)
    child = None
    try:
        ring = SubmissionRing(seg)
        child = subprocess.Popen(
            [sys.executable, "-c", _PRODUCER, str(seg.path), str(count), str(SPIN_LIMIT_S)],
            stderr=subprocess.PIPE,
            text=True,
        )
        out = new_descs(64)
        expected = 1
        deadline = time.monotonic() + SPIN_LIMIT_S
        while expected <= count:
            got = ring.pop_burst(out, pop_n)
            for i in range(got):
                _check(out[i], expected)
                expected += 1
            if got == 0:
                if child.poll() is not None and len(ring) == 0:
                    pytest.fail(
                        f"producer exited {child.returncode} with {expected - 1}/{count} "
                        f"received: {child.stderr.read()}"  # type: ignore[union-attr]
                    )
                assert time.monotonic() < deadline, f"only {expected - 1}/{count} arrived"
        _, err = child.communicate(timeout=SPIN_LIMIT_S)
        assert child.returncode == 0, err
        assert ring.pop_burst(out, 64) == 0, "a descriptor arrived twice or from nowhere"
        assert (ring.head, ring.tail) == (count, count)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        _dispose(seg)
