"""A client that lies through shared memory: its header, its ring, its segment, its descriptors.

The hostile client is a real ``duckpipe.Client`` whose segment is then tampered
with through cffi. Each attack runs while a well-behaved bystander client in
another thread keeps checking forwards against numpy; before and after it, the
bystander checks again. The dataplane must live, the bystander must never see
a wrong or failed result, the hostile client must get a clear error (a refused
descriptor or a detach reason) and the counters must show what happened.

Runs against the mock and the C dataplane (``dataplane`` fixture, shared by the
module, so every attack also leaves the next one a dataplane to attack), and
under the sanitizer build through tools/setup's "hostile" selection.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zmq

import duckpipe
from duckpipe import GeluMlp
from duckpipe._abi import ffi, lib
from duckpipe._abi.ring import new_desc
from duckpipe._abi.shm import Segment
from duckpipe.client.session import Doorbell
from duckpipe.errors import BadInput, ClientDetached
from duckpipe.host import monotonic_ns, segment_prefix
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR, B_DOWN_TENSOR, DetachReason, DType, Op, Status
from duckpipe.schema.config import default as config_default
from duckpipe.schema.control import ErrorCode

HIDDEN = 32
LAYER = 70  # the bystander's layer
LOADING = 71  # announced with LoadWeights and never committed: weight chunks aim at it
MLP = GeluMlp.random(HIDDEN, 64, seed=70)
# generation of raw descriptors: far from the client's own, so that a refused descriptor's
# done word in slot 0 never passes for the completion of the client's next forward there
RAW_GENERATION = 0xFFFF_FFF0


def _counters(client: duckpipe.Client) -> dict[str, int]:
    return client.stats().counters


def _check_forward(client: duckpipe.Client, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(
        client.forward(LAYER, x, timeout=10), MLP.reference(x), rtol=2e-4, atol=2e-5
    )


class Bystander(threading.Thread):
    """A well-behaved client checking forwards against numpy until stopped."""

    def __init__(self, control: str) -> None:
        super().__init__(daemon=True)
        self.control = control
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(1)
        try:
            with duckpipe.connect(self.control, name="bystander") as c:
                while not self.stop.is_set():
                    _check_forward(c, rng)
                    self.done += 1
        except BaseException as e:  # reported by the test thread
            self.error = e


@pytest.fixture(scope="module")
def loaded(dataplane) -> Iterator[str]:
    """The module's dataplane with LAYER loaded, shared, by a loader that stays attached
    (a layer goes with its owner)."""
    with duckpipe.connect(dataplane.control, name="loader") as c:
        c.load_weights(LAYER, MLP, ducks=[0, 1, 2], shared=True)
        yield dataplane.control


@pytest.fixture
def watched(loaded) -> Iterator[str]:
    """The control address, with a bystander checked before, during and after the test."""
    with duckpipe.connect(loaded, name="before") as c:
        _check_forward(c, np.random.default_rng(2))
    by = Bystander(loaded)
    by.start()
    deadline = time.monotonic() + 10
    while by.done == 0 and by.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield loaded
    finally:
        time.sleep(0.2)  # let the bystander run on after the attack
        by.stop.set()
        by.join(30)
    assert by.error is None, f"the bystander failed: {by.error!r}"
    assert by.done > 1, "the bystander completed no forward during the attack"
    with duckpipe.connect(loaded, name="after") as c:
        _check_forward(c, np.random.default_rng(3))


@contextmanager
def hostile(control: str) -> Iterator[duckpipe.Client]:
    c = duckpipe.connect(control, name="hostile", slots=8)
    try:
        yield c
    finally:
        c.close()


def _push_raw(c: duckpipe.Client, fill: Callable[[object], None]) -> int:
    """Push a descriptor the client API would never write; returns its forward id. The
    client's own bookkeeping never hears of it (its slot may not even exist)."""
    d = new_desc()
    fid = c._session.next_forward
    c._session.next_forward += 1
    d.forward_id = fid
    d.epoch = c.epoch
    d.submit_ns = monotonic_ns()
    d.generation = RAW_GENERATION
    fill(d)
    assert c._session.ring.push(d), "the hostile client's ring is full"
    return fid


def _zmq_completion(c: duckpipe.Client, fid: int, timeout: float = 10.0) -> ctl.Completion:
    """The ZeroMQ completion of raw descriptor ``fid``; everything else goes to the client."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"descriptor {fid} never completed"
        if not c._session.channel.sock.poll(50):
            continue
        msg = ctl.reply_decoder.decode(c._session.channel.sock.recv())
        if isinstance(msg, ctl.Completion):
            if msg.forward_id == fid:
                return msg
            c._session.take_completion(msg)
        else:
            c._session.channel.replies[msg.req_id] = msg


def _wait_detached(c: duckpipe.Client, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while not c._session.segment.detach_reason:
        assert time.monotonic() < deadline, "the dataplane never detached the client"
        time.sleep(0.01)
    return c._session.segment.detach_reason


def _set_head(c: duckpipe.Client, head: int) -> None:
    lib.dp_store_release_u64(ffi.addressof(c._session.segment.ring, "head"), head)


# --- the header -----------------------------------------------------------------------


def test_rewriting_the_header_after_attach_moves_nothing_the_dataplane_writes(watched):
    with hostile(watched) as c:
        before = _counters(c)
        h = c._session.segment.header
        h.slot_count = 1 << 20
        h.act_slot_size = h.res_slot_size = 1 << 40
        h.ring_capacity = 1 << 30
        h.res_hdr_offset = h.act_offset = h.res_offset = 1 << 44
        h.ring_offset = 64
        # a forward still lands in its own slot, computed from the layout checked at attach
        _check_forward(c, np.random.default_rng(4))
        # a slot only the forged header has, with a stale epoch (the completion that once
        # landed in another client's slot header): refused, completed over ZeroMQ only
        for epoch in (c.epoch, c.epoch + 1000):
            done = _zmq_completion(
                c,
                _push_raw(
                    c,
                    lambda d, e=epoch: (
                        setattr(d, "op", Op.FORWARD),
                        setattr(d, "slot", 4000),
                        setattr(d, "epoch", e),
                    ),
                ),
            )
            # the slot is checked first: a stale epoch does not get a forged slot written
            assert done.status == Status.BAD_REQUEST and "slot 4000" in done.message, done
        _check_forward(c, np.random.default_rng(5))
        after = _counters(c)
    assert after["bad_requests"] - before["bad_requests"] >= 2


# --- the ring -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["jump_past_capacity", "rewind_by_one"])
def test_a_client_that_breaks_its_ring_is_detached_alone(watched, how):
    with duckpipe.connect(watched, name="observer") as obs:
        before = _counters(obs)
    with hostile(watched) as c:
        _check_forward(c, np.random.default_rng(6))  # the ring has moved: tail == head == 1
        ring = c._session.segment.ring
        head = int(ring.head)
        assert head == int(ring.tail) >= 1
        capacity = c._session.segment.ring_capacity
        _set_head(c, head + capacity + 1 if how == "jump_past_capacity" else head - 1)
        assert _wait_detached(c) == DetachReason.RING_BROKEN
        with pytest.raises(ClientDetached, match="RING_BROKEN"):
            c.claim((1, HIDDEN))
        tail = int(ring.tail)
    assert tail == head, "the dataplane consumed entries of a broken ring"
    with duckpipe.connect(watched, name="observer") as obs:
        after = _counters(obs)
        assert "hostile" not in [s.name for s in obs.stats().clients]
    assert after["clients_evicted"] == before["clients_evicted"] + 1


# --- the segment ----------------------------------------------------------------------------


def test_a_segment_can_be_neither_truncated_nor_punched_under_the_dataplane(watched):
    with hostile(watched) as c:
        seg = c._session.segment
        page = int(seg.header.page_size)  # hugetlb memfds refuse other sizes with EINVAL
        for size in (0, seg.size - page, seg.size + page):
            with pytest.raises(PermissionError):
                os.ftruncate(seg.fd, size)
        fd = os.open(seg.path, os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        # nor can it lose pages: a punched hugepage would fault on the dataplane's next touch
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.fallocate(seg.fd, 3, ctypes.c_long(0), ctypes.c_long(seg.size))  # PUNCH_HOLE
        assert rc == -1 and ctypes.get_errno() == errno.EPERM
        _check_forward(c, np.random.default_rng(7))  # and the dataplane still reads it


def _attach(control: str, **fields: object) -> ctl.AnyReply:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    try:
        msg = dict(req_id=1, abi_major=ABI_MAJOR, pid=os.getpid(), segment="hostile")
        msg.update(fields)
        sock.send(ctl.encoder.encode(ctl.Attach(**msg)))  # type: ignore[arg-type]
        assert sock.poll(10_000), "no reply to Attach"
        return ctl.reply_decoder.decode(sock.recv())
    finally:
        sock.close()


def test_the_same_segment_cannot_be_attached_twice(watched):
    with hostile(watched) as c:
        reply = _attach(watched, segment_fd=c._session.segment.fd)
        assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.BAD_SEGMENT
        assert "already attached" in reply.message
        _check_forward(c, np.random.default_rng(8))  # the first attach is untouched


def test_a_large_small_page_segment_is_faulted_in_while_others_are_served(dataplane, watched):
    """Faulting in a 512 MiB segment of 4 KiB pages takes the kernel about 0.15 s (a GiB
    0.3 s), unmapping it 0.1 s; in one call on the control agent's thread, every other
    client's forwards waited that long (issue 7, finding 11). Now the dataplane faults it
    in (and later unmaps it) 8 MiB per pass: a bystander's forwards go on completing
    between the Attach and its reply, and the segment attaches, detaches and its slot is
    taken again."""
    if not hasattr(dataplane, "dataplane"):
        pytest.skip("the C dataplane's scheduling: the mock faults a segment in at once")
    by = Bystander(watched)
    by.start()
    seg = Segment.create(slot_count=2, act_slot_size=128 << 20, backing="devshm", tag="large")
    doorbell = Doorbell()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(watched)
    try:
        deadline = time.monotonic() + 10
        while by.done < 2 and by.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        attach = ctl.Attach(
            req_id=1,
            abi_major=ABI_MAJOR,
            pid=os.getpid(),
            segment="large",
            segment_fd=seg.fd,
            doorbell_fd=doorbell.read_fd,
        )
        before = by.done
        sock.send(ctl.encoder.encode(attach))
        assert sock.poll(30_000), "no reply to Attach"
        during = by.done - before
        reply = ctl.reply_decoder.decode(sock.recv())
        assert isinstance(reply, ctl.Attached), reply
        # one forward may have been in flight at the start: more finished meanwhile
        assert during >= 3, f"only {during} bystander forwards completed during the attach"
        sock.send(ctl.encoder.encode(ctl.Detach(req_id=2)))
        assert sock.poll(10_000), "no reply to Detach"
        assert isinstance(ctl.reply_decoder.decode(sock.recv()), ctl.Ack)
    finally:
        sock.close()
        seg.close()
        doorbell.close()
        by.stop.set()
        by.join(30)
    assert by.error is None, f"the bystander failed: {by.error!r}"
    with duckpipe.connect(watched, name="next") as c:  # the slot and memory came back
        _check_forward(c, np.random.default_rng(9))


def test_attach_refuses_what_is_not_a_whole_sealed_duckpipe_memfd(watched, tmp_path: Path):
    plain = tmp_path / "segment"
    plain.write_bytes(bytes(1 << 16))
    unsealed = os.memfd_create(segment_prefix() + "unsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, 1 << 16)
    fd = os.open(plain, os.O_RDWR)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pipe = os.open(fifo, os.O_RDWR)  # the dataplane must not open it, only look at it
    # a real segment with a hole: the dataplane would have to allocate the client's memory
    holed = Segment.create(slot_count=2, act_slot_size=4096, backing="devshm", tag="holed")
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.fallocate(holed.fd, 3, ctypes.c_long(holed.size - 4096), ctypes.c_long(4096)) == 0
    try:
        for bad, why in (
            (fd, "not a duckpipe memfd"),
            (pipe, "not a regular file"),
            (unsealed, "not sealed"),
            (1_000_000, "cannot open"),  # no such descriptor in this process
            (holed.fd, "pre-fault"),
        ):
            reply = _attach(watched, segment_fd=bad)
            assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.BAD_SEGMENT, reply
            assert why in reply.message
    finally:
        os.close(fd)
        os.close(pipe)
        os.close(unsealed)
        holed.close()


# --- descriptors ---------------------------------------------------------------------------

U64 = (1 << 64) - 1

# (name, fields): each must complete BAD_REQUEST with the dataplane alive
MALFORMED: list[tuple[str, dict[str, object]]] = [
    # weight chunks (issue 7 item 3): a wrapping offset, and duck ids past every table
    (
        "b_down_offset_wraps",
        dict(
            op=Op.WEIGHT_CHUNK,
            layer=LOADING,
            duck=ctl.HOST_TENSOR_DUCK,
            tensor=B_DOWN_TENSOR,
            offset=U64 - 63,
            nbytes=128,
        ),
    ),
    (
        "shard_offset_wraps",
        dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=0, tensor=0, offset=U64 - 63, nbytes=128),
    ),
    ("duck_past_the_tables", dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=300, nbytes=128)),
    ("duck_65534", dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=0xFFFE, nbytes=128)),
    ("tensor_past_the_kind", dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=0, tensor=9, nbytes=4)),
    # forwards (item 5): a shape whose element product wraps to 64 elements (256 bytes)
    (
        "shape_product_wraps",
        dict(
            op=Op.FORWARD,
            layer=LAYER,
            dtype=DType.F32,
            shape=[1073807362, 536838145, HIDDEN],
            nbytes=256,
        ),
    ),
    (
        "shape_with_a_zero",
        dict(op=Op.FORWARD, layer=LAYER, dtype=DType.F32, shape=[0, HIDDEN], nbytes=0),
    ),
    ("ndim_0", dict(op=Op.FORWARD, layer=LAYER, dtype=DType.F32, shape=[], nbytes=0)),
    (
        "huge_timeout",
        dict(
            op=Op.FORWARD,
            layer=LAYER,
            dtype=DType.F32,
            shape=[1, HIDDEN],
            nbytes=4 * HIDDEN,
            timeout_us=0xFFFF_FFFF,
        ),
    ),
    (
        "ducks_outside_the_layer",
        dict(
            op=Op.FORWARD,
            layer=LAYER,
            dtype=DType.F32,
            shape=[1, HIDDEN],
            nbytes=4 * HIDDEN,
            ducks=[0, 0, 0, 1 << 63],
        ),
    ),
    ("slot_out_of_range", dict(op=Op.FORWARD, layer=LAYER, slot=1 << 31)),
    ("unknown_op", dict(op=99, layer=LAYER)),
]


def _fill(fields: dict[str, object]) -> Callable[[object], None]:
    def fill(d) -> None:
        for k, v in fields.items():
            if k == "shape":
                d.ndim = len(v)  # type: ignore[arg-type]
                for i, n in enumerate(v):  # type: ignore[arg-type]
                    d.shape[i] = n
            elif k == "ducks":
                for i, w in enumerate(v):  # type: ignore[arg-type]
                    d.ducks[i] = w
            else:
                setattr(d, k, v)

    return fill


def _announce_loading(c: duckpipe.Client) -> None:
    """LoadWeights of LOADING, never committed: weight chunks can aim at it."""
    c._session.request(
        lambda rid: ctl.LoadWeights(
            req_id=rid,
            layer=LOADING,
            kind=1,
            dtype=1,
            hidden=HIDDEN,
            ffn=64,
            ducks=[0],
            shard_sizes=[64],
            has_b_down=True,
        )
    )


def test_every_malformed_descriptor_is_refused_and_counted(watched):
    with hostile(watched) as c:
        _announce_loading(c)
        before = _counters(c)
        for name, fields in MALFORMED:
            done = _zmq_completion(c, _push_raw(c, _fill(fields)))
            assert done.status == Status.BAD_REQUEST, f"{name}: {Status(done.status).name}"
            assert done.message, f"{name}: refused without a reason"
        after = _counters(c)
        assert after["bad_requests"] - before["bad_requests"] >= len(MALFORMED)
        _check_forward(c, np.random.default_rng(9))  # the hostile client itself still works


def test_an_empty_weight_chunk_is_refused_in_the_dataplanes_words(watched):
    # the mock once completed it OK; both now ask dp_desc_check (dp_desc_check.h)
    with hostile(watched) as c:
        _announce_loading(c)
        empty = dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=0, tensor=0, offset=0, nbytes=0)
        done = _zmq_completion(c, _push_raw(c, _fill(empty)))
    assert (done.status, done.message) == (Status.BAD_REQUEST, "weight chunk of 0 bytes"), done


def test_max_forward_bytes_caps_forwards_and_weight_chunks_that_fit_the_slots(watched):
    # the mock once knew no max_forward_bytes: both dataplanes here run with its default
    limit = config_default("max_forward_bytes")
    rows = limit // (HIDDEN * 4)  # a forward of exactly the limit
    rng = np.random.default_rng(15)
    # slots a page over the limit: a forward of one row more fits them, not the limit
    with duckpipe.connect(watched, name="big-slots", slots=2, slot_size=limit + 4096) as c:
        # the client learned the limit at attach: it claims no more, whatever its slots
        with pytest.raises(BadInput, match=f"does not fit a slot of {limit} bytes"):
            c.claim((rows + 1, HIDDEN), np.float32)
        # (a forward of the whole limit, 64 MiB by default, is test_moe_prefill's)
        x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
        np.testing.assert_allclose(
            c.forward(LAYER, x, timeout=60), MLP.reference(x), rtol=2e-4, atol=2e-5
        )
        # what a client that ignores it writes: refused by the dataplane
        _announce_loading(c)
        over = (rows + 1) * HIDDEN * 4
        forward = dict(
            op=Op.FORWARD, layer=LAYER, dtype=DType.F32, shape=[rows + 1, HIDDEN], nbytes=over
        )
        fwd = _zmq_completion(c, _push_raw(c, _fill(forward)))
        chunk = dict(op=Op.WEIGHT_CHUNK, layer=LOADING, duck=0, tensor=0, nbytes=limit + 4)
        big = _zmq_completion(c, _push_raw(c, _fill(chunk)))
    assert fwd.status == Status.BAD_REQUEST, fwd
    assert fwd.message == f"{over} bytes exceed the slots or max_forward_bytes {limit}", fwd
    assert (big.status, big.message) == (Status.BAD_REQUEST, f"weight chunk of {limit + 4} bytes")


# --- quotas and fairness ---------------------------------------------------------------------


def test_a_clients_quota_is_its_fair_share_of_the_forward_contexts():
    # dp_client_quota (dp_fair_share.h): the C dispatcher's and the mock's one rule
    assert lib.dp_client_quota(64, 0, 64) == 64  # nobody polled yet
    assert lib.dp_client_quota(64, 1, 64) == 32  # one client, and a share kept for the next
    assert lib.dp_client_quota(64, 3, 64) == 16
    assert lib.dp_client_quota(64, 3, 8) == 8  # client_max_inflight caps the share
    assert lib.dp_client_quota(4, 63, 64) == 1  # never none
    assert lib.dp_client_quota(2**64 - 1, 2**32 - 1, 2**64 - 1) == (2**64 - 1) // 2**32


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_client_at_its_inflight_quota_waits_in_its_ring_while_others_are_served(request, kind):
    # every reply waits 30 ms: forwards stay in flight long enough to meet the quota
    if kind == "mock":
        cl = request.getfixturevalue("duckpipe_mock_factory")(
            ducks=2, args=["--delay-ms", "30", "--client-max-inflight", "2"]
        )
    else:
        cl = request.getfixturevalue("duckpipe_cluster_factory")(
            2, duck_args=["--delay-us", "30000"], client_max_inflight=2
        )
    mlp = GeluMlp.random(HIDDEN, 64, seed=71)
    rng = np.random.default_rng(10)
    with (
        duckpipe.connect(cl.control, name="greedy", slots=16) as greedy,
        duckpipe.connect(cl.control, name="modest") as modest,
    ):
        greedy.load_weights(LAYER, mlp, shared=True)  # the modest one forwards on it too
        xs = [rng.standard_normal((2, HIDDEN)).astype(np.float32) for _ in range(12)]
        fwds = []
        for x in xs:
            with greedy.claim(x.shape) as slot:
                slot.array[:] = x
                fwds.append(greedy.submit(slot, LAYER))
        # 12 forwards, 2 at a time, 30 ms each: the greedy client needs ~180 ms; the modest
        # one is served next to it, not after it
        y = rng.standard_normal((1, HIDDEN)).astype(np.float32)
        np.testing.assert_allclose(
            modest.forward(LAYER, y, timeout=10), mlp.reference(y), rtol=2e-4, atol=2e-5
        )
        pending = sum(not f.done() for f in fwds)
        assert pending >= 4, f"only {pending} greedy forwards were left: the quota held nothing"
        for x, f in zip(xs, fwds, strict=True):
            np.testing.assert_allclose(f.result(10), mlp.reference(x), rtol=2e-4, atol=2e-5)
            f.release()
        n = _counters(modest)
    assert n["client_quota_waits"] > 0 and n["forwards_ok"] == 13


# --- weights: every byte of a load is this load's ---------------------------------------------


def test_a_weight_chunk_sent_twice_does_not_stand_in_for_one_never_sent(watched):
    # Byte counts alone would let a chunk sent N times pass for a whole tensor, and a duck
    # would then compute with whatever an earlier owner of the layer id left in its memory.
    mlp = GeluMlp.random(32, 64, seed=123, b_down=False)
    layer, size = 501, 256
    with hostile(watched) as c:
        session = c._session
        session.request(
            lambda rid: ctl.LoadWeights(
                req_id=rid, layer=layer, kind=int(mlp.kind), dtype=int(DType.F32), hidden=32,
                ffn=64, ducks=[0], shard_sizes=[64], has_b_down=False,
            )
        )  # fmt: skip
        recs = []
        for tensor in range(len(mlp.shard(0, 64))):
            for _ in range(2):  # the first chunk of each tensor, twice
                i = session.take_slot(5)
                session.segment.act_bytes(i)[:size] = 0
                recs.append(session.push_weight(i, Op.WEIGHT_CHUNK, layer, 0, tensor, 0, size))
                session.pump(0)
        commit = session.push_weight(session.take_slot(5), Op.WEIGHT_COMMIT, layer, 0, 0, 0, 0)
        for r in [*recs, commit]:
            session.await_zmq(r, 20)  # status in the slot; the refusal's message rides ZeroMQ
        assert [r.status for r in recs[0::2]] == [Status.OK] * (len(recs) // 2)
        for r in recs[1::2]:
            assert r.status == Status.BAD_REQUEST and "next byte due is 256" in r.message, r
        assert commit.status == Status.BAD_REQUEST and "incomplete" in commit.message, commit
        assert not any(info.layer == layer and info.ready for info in c.layers())


def test_a_client_whose_contexts_wait_on_a_silent_duck_leaves_others_their_share(
    duckpipe_cluster_factory,
):
    # A duck never acknowledges a layer it has no room for, so each of the hostile
    # client's weight chunks holds a forward context for weight_timeout_ms. Had it all of
    # them, every other client's forward would wait that long.
    cl = duckpipe_cluster_factory(2, weight_timeout_ms=6000)
    mlp = GeluMlp.random(HIDDEN, 64, seed=72)
    rng = np.random.default_rng(11)
    with (
        duckpipe.connect(cl.control, name="modest") as modest,
        duckpipe.connect(cl.control, name="hostile", slots=128, slot_size=4096) as h,
    ):
        modest.load_weights(LAYER, mlp)
        big_hidden, big_ffn = 65536, 2100  # within every dataplane bound; over a duck's memory
        h._session.request(
            lambda rid: ctl.LoadWeights(
                req_id=rid, layer=902, kind=int(mlp.kind), dtype=int(DType.F32),
                hidden=big_hidden, ffn=big_ffn, ducks=[0], shard_sizes=[big_ffn],
                has_b_down=False,
            )
        )  # fmt: skip
        sent = 0
        while h._session.slots.free:  # 128 chunks, in order: more than the dataplane has contexts
            i = h._session.take_slot(1)
            h._session.push_weight(i, Op.WEIGHT_CHUNK, 902, 0, 0, sent * 4096, 4096)
            sent += 1
        h._session.pump(0.2)
        for _ in range(10):  # each well inside the 6 s a held context would cost it
            y = rng.standard_normal((2, HIDDEN)).astype(np.float32)
            out = modest.forward(LAYER, y, timeout=3)
            np.testing.assert_allclose(out, mlp.reference(y), rtol=2e-4, atol=2e-5)
        assert _counters(modest)["client_quota_waits"] > 0
