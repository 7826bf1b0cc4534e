"""The session: one client's connection to its dataplane, the seam its parts meet at.

A ``Session`` owns what a client is made of: the shared-memory segment, its
submission ring, the slot table, the table of forwards in flight and the control
channel (with the doorbell and the heartbeat that go with them). It says in named
methods what the others may do with them: take and release a slot, publish a
descriptor, wait for a slot's done word, send a control request, take completions.
``Client`` (the public API), ``Forward``, ``Slot`` and the weight loader all go
through it, never through each other's private members.

Package-internal: nothing here is public API, and a ``Client``'s docstrings are the
contract. Like a ``Client``, a session is not thread-safe.

A session holds no reference to its ``Client``, ``Slot`` or ``Forward`` objects: they
hold it. The segment and the channel are closed when ``close()`` is called or when
the last of them is dropped (``weakref.finalize``, which also runs at interpreter exit).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import numpy as np

from .. import host
from .._abi import ffi, lib
from .._abi.ring import SubmissionRing, new_desc
from .._abi.shm import BackingChoice, Segment
from ..errors import (
    BadInput,
    ClientClosed,
    ClientDetached,
    DataplaneLost,
    LayerFailed,
    NotPermitted,
    RingFull,
    UnknownLayer,
    WaitTimeout,
)
from ..schema import control as ctl
from ..schema.abi import DetachReason, Op, Status
from ..schema.control import ErrorCode
from .channel import BLOCK_SLICE_S, Channel
from .routing import refused as routing_refused
from .slots import ClaimBase, Slot, SlotGuard, SlotState, SlotTable

if TYPE_CHECKING:
    from .weights import Loaded, MoeLayer

__all__ = ["Inflight", "ResultBase", "Session", "WaitStrategy"]

log = logging.getLogger("duckpipe.client")

WaitStrategy = Literal["spin", "block", "hybrid"]

_HEARTBEAT_S = 0.2
_LIVENESS_CHECK_S = 0.05
# a sleeping waiter looks at ZeroMQ and the dataplane's heartbeat this often
_SLEEP_SLICE_NS = 50_000_000
_SPIN_SLICE_NS = 10_000_000
# ZeroMQ completions (timings, duck lists) are read in batches: result() does not need them.
# A batch is read when a forward is released (Forward.release, the end of its `with`), after
# its result, so that ~4 us a completion of receive and decode never lands between a submit
# and its result (32 at once set the p99: docs/benchmark-history.md, issue 19 goal 2); a client
# that never releases explicitly has them read at a submit once twice as many wait.
_PUMP_EVERY = 32
_PUMP_AT_SUBMIT = 2 * _PUMP_EVERY
# A forward whose done word came but whose ZeroMQ completion did not keeps its record until
# the completion comes. The dataplane never drops one without counting it
# (completions_dropped: the client's connection was gone, or it had detached), but should
# one not come, its record must not stay for ever: at most every _SWEEP_S a pump looks
# (Session._sweep), notes such a record late, and gives its completion up once it stayed
# late through _ZMQ_LOST_S of reading (a client that did not read for a while first gets
# what the dataplane held for it: the clock starts again). Past _MAX_LATE late records,
# more than the dataplane can hold for a client and its sockets carry, the oldest go at once.
_SWEEP_S = 1.0
_ZMQ_LOST_S = 5.0
_MAX_LATE = 8192
_SUBMITTED = SlotState.SUBMITTED
_FORWARD = int(Op.FORWARD)
_COMPLETED = SlotState.COMPLETED


class Inflight:
    """The session's record of one submitted descriptor, until its completions are in.

    A plain class with ``__slots__``, not a dataclass: one is made per forward."""

    __slots__ = (
        "answered",
        "dtype",
        "epoch",
        "forward_id",
        "generation",
        "internal",
        "late",
        "message",
        "missing",
        "moe",
        "op",
        "phases",
        "released",
        "shape",
        "slot",
        "status",
        "timings",
        "zmq_done",
    )

    def __init__(
        self,
        forward_id: int,
        slot: int,
        generation: int,
        epoch: int,
        op: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        internal: bool = False,  # weight chunks: the slot frees itself on completion
    ) -> None:
        self.forward_id = forward_id
        self.slot = slot
        self.generation = generation
        self.epoch = epoch
        self.op = op
        self.shape = shape
        self.dtype = dtype
        self.internal = internal
        self.status: int | None = None
        self.answered: tuple[int, ...] = ()
        self.missing: tuple[int, ...] = ()
        self.timings: ctl.Timings | None = None
        self.phases: ctl.Phases | None = None  # read once from the slot header, then kept
        self.message = ""
        self.zmq_done = False
        self.released = False
        self.late = 0.0  # when a sweep first saw it done without its ZeroMQ completion
        # a routed forward: its layer's MoE facts, to name a lost duck's experts
        self.moe: MoeLayer | None = None

    def __repr__(self) -> str:
        return (
            f"Inflight(forward_id={self.forward_id}, slot={self.slot}, "
            f"generation={self.generation}, status={self.status}, released={self.released})"
        )


class ResultBase(np.ndarray):
    """A byte view of one result slot that holds whoever owns the slot's current use.

    ``Forward.result`` builds the array it returns on a fresh one of these holding the
    Forward: the slot is then freed only once the Forward and every view of its result
    are gone. A subclass, because numpy, when it sets a new array's base, walks down
    past each view whose own base has the new array's type: a view of the plain slot
    array would be passed over and dropped at once. A view of a ResultBase is kept, so
    the session keeps one per slot (``result_bases``, holding nothing) to view from.
    """

    __slots__ = ("owner",)


class Session:
    """One client's segment, submission ring, slot table, forwards in flight and control
    channel, and what may be done with them. Built and attached by ``Client``."""

    __slots__ = (
        "__weakref__",
        "_dataplane_timeout_ns",
        "_last_check",
        "_last_sweep",
        "_next_sweep",
        "_phases_buf",
        "act_bases",
        "channel",
        "claim_specs",
        "client_id",
        "closed",
        "counters",
        "doorbell",
        "dp_pid",
        "epoch",
        "finalizer",
        "inflight",
        "layers",
        "loaded",
        "lost",
        "max_bytes",
        "max_forward_bytes",
        "moe",
        "next_forward",
        "result_bases",
        "result_last",
        "ring",
        "segment",
        "slot_hdrs",
        "slots",
        "spin_ns",
        "submitter",
        "timeout_us",
        "unpumped",
        "wait",
    )

    def __init__(
        self,
        control: str,
        *,
        slots: int,
        slot_size: int,
        result_slot_size: int | None,
        backing: BackingChoice,
        wait: WaitStrategy,
        spin_us: float,
        forward_timeout: float | None,
        dataplane_timeout: float,
        tag: str,
        debug_slots: bool,
    ) -> None:
        self.wait: WaitStrategy = wait  # Forward.result's default; Client.wait sets it
        self.spin_ns = int(spin_us * 1000)
        self.timeout_us = 0 if forward_timeout is None else max(1, int(forward_timeout * 1e6))
        self._dataplane_timeout_ns = int(dataplane_timeout * 1e9)
        self.closed = False
        self.lost: str | None = None  # why the dataplane is lost, once it is
        self.next_forward = 1
        self.unpumped = 0  # pushes since ZeroMQ was last read
        self.epoch = 0
        self.dp_pid = 0
        self.client_id = 0  # the dataplane's id for this client, from Attached
        self._last_check = 0.0
        self.inflight: dict[int, Inflight] = {}
        # what the dataplane said it holds, by layer: refresh_layers() fills it
        self.layers: dict[int, ctl.LayerInfo] = {}
        # the mixture-of-experts layers this session loaded: their placement and sizes
        # (the dataplane's LayerInfo does not carry them); weights.load_weights fills it
        self.moe: dict[int, MoeLayer] = {}
        # the layers this session loaded, each with a reference to its model, so that a
        # repair can cut any duck's bank again (weights.Loaded; weights.repair)
        self.loaded: dict[int, Loaded] = {}
        self.counters = {
            "stale_completions": 0,
            "completion_mismatch": 0,
            "bad_messages": 0,
            # reads (timings, answered, missing, a failure's reason) that had to wait for a
            # ZeroMQ completion not in yet: each asks the dataplane to send at once
            "zmq_waits": 0,
            # forwards whose ZeroMQ completion never came (a wait for it timed out, or the
            # sweep gave it up): status from the done word, timings from the slot header's
            # phases where it still held them, no duck lists
            "zmq_lost": 0,
        }
        self._last_sweep = time.monotonic()
        self._next_sweep = self._last_sweep + _SWEEP_S
        # Forward.phases' copy of a slot header's line 1 (dp_slot_phases fills it)
        self._phases_buf = ffi.new("uint64_t[8]")

        if debug_slots:
            if backing == "hugetlbfs":
                raise BadInput(
                    "debug_slots write-protects single slots, which 2 MiB hugepages cannot "
                    "be cut into: use backing='auto' or 'devshm' with it"
                )
            backing = "devshm"
        self.channel = Channel(control, self.counters)
        try:
            self.segment = seg = Segment.create(
                slot_count=slots,
                act_slot_size=slot_size,
                res_slot_size=result_slot_size,
                backing=backing,
                tag=tag,
            )
        except Exception:
            self.channel.close()
            raise
        self.max_bytes = seg.act_slot_size  # until attach() hears the dataplane's cap
        self.max_forward_bytes = 0  # the dataplane's cap as it said it (0: none said)
        self.ring = SubmissionRing(seg)
        self.submitter = self.ring.submitter  # push's first argument to dp_submit_template
        # each slot's header, for wait_done: pointer arithmetic in cffi makes an object
        self.slot_hdrs = [seg.slot_headers + i for i in range(seg.slot_count)]
        guard = None
        if debug_slots:
            addrs = [seg.act_bytes(i).ctypes.data for i in range(seg.slot_count)]
            guard = SlotGuard(addrs, seg.act_slot_size)
        self.slots = SlotTable(seg.slot_count, guard)
        self.result_bases = [seg.res_bytes(i).view(ResultBase) for i in range(seg.slot_count)]
        # per slot, (shape, dtype, ResultBase template) of its last result: what
        # Forward.result views each result's base and array from (result_template)
        self.result_last: list[tuple | None] = [None] * seg.slot_count
        # each activation slot's bytes, to make claim templates from (slots.claim_template)
        self.act_bases = [seg.act_bytes(i).view(ClaimBase) for i in range(seg.slot_count)]
        # Client.claim's checks of a (shape, dtype) as given: (normalised shape, np.dtype,
        # the slots' ClaimBase templates of that shape, made as slots are first claimed
        # with it). Depends only on the slot sizes, fixed for the session's life.
        self.claim_specs: dict[tuple, tuple[tuple[int, ...], np.dtype, list]] = {}
        self.doorbell = Doorbell()
        stop = threading.Event()
        beat = threading.Thread(
            target=_heartbeat_loop, args=(seg, stop), name="duckpipe-heartbeat", daemon=True
        )
        beat.start()
        self.finalizer = weakref.finalize(
            self,
            _cleanup,
            self.channel,
            seg,
            stop,
            beat,
            self.doorbell,
            self.result_bases,
            self.result_last,
            self.act_bases,
            self.claim_specs,
            self.slot_hdrs,
        )

    def attach(self, name: str, timeout: float) -> ctl.Attached:
        """Hand the segment to the dataplane; closes the session if that fails."""
        try:
            att = self.channel.attach(
                self.segment, self.doorbell.read_fd, name, timeout, self.take_completion
            )
        except BaseException:
            self.closed = True
            self.finalizer()
            raise
        self.epoch = att.epoch
        self.client_id = att.client_id
        self.dp_pid = att.dataplane_pid
        seg = self.segment
        self.max_bytes = min(seg.act_slot_size, att.max_forward_bytes or seg.act_slot_size)
        self.max_forward_bytes = att.max_forward_bytes
        # rung only when the segment says the dataplane parks (the mock never does)
        self.ring.use_doorbell(self.doorbell.write_fd)
        return att

    def close(self) -> None:
        """Detach from the dataplane (when it is still there) and close everything."""
        if self.closed:
            return
        if self.lost is None:
            try:
                self.request(lambda rid: ctl.Detach(req_id=rid), 1.0)
            except Exception as e:  # closing must not fail because the peer is gone
                log.debug("detach failed: %s", e)
        self.closed = True
        self.finalizer()

    # --- slots ------------------------------------------------------------------

    def take_slot(self, timeout: float) -> int:
        """Claim a free slot, waiting up to ``timeout`` s for completions to free one."""
        return self.slots.take(timeout, self.wait_for_slot)

    def wait_for_slot(self, left: float) -> None:
        """What ``SlotTable.take`` does while no slot is free: take completions in."""
        self.pump(min(left, BLOCK_SLICE_S))  # completions free slots
        self.check_alive()

    def holds(self, slot: Slot) -> bool:
        """Whether ``slot`` is a live claim on this session (the same use of the slot)."""
        return not self.closed and self.slots.claimed_array(slot) is not None

    def release_claim(self, slot: Slot) -> None:
        """Give back a claimed slot that was not submitted."""
        if not self.holds(slot):
            raise BadInput(f"{slot!r} is not claimed by this client")
        self.slots.release(slot.index)

    def release_forward(self, rec: Inflight, explicit: bool = False) -> None:
        """The forward's owner is done with its slot: free it now, or once it completes.
        ``explicit``: Forward.release or the end of its ``with`` (not its finalizer, which
        runs wherever the collector does): read the ZeroMQ completions if a batch waits."""
        if rec.released or self.closed:
            return
        rec.released = True
        if rec.status is not None:
            self.slots.release(rec.slot)
        # else: freed by _completed, once the dataplane is done with the slot
        if explicit and self.unpumped >= _PUMP_EVERY:
            self.pump(0)

    def result_template(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> tuple:
        """Result slot ``slot`` as ``shape`` and ``dtype``, a ResultBase holding no owner,
        kept as the slot's last (``result_last``): each result's base is a view of it and
        its array a view of that, cheaper than an array made on a buffer; the base, a view
        of a ResultBase, has a ResultBase for its own base, so numpy keeps it as the
        array's base."""
        t = self.result_last[slot] = (
            shape,
            dtype,
            np.ndarray(shape, dtype, self.result_bases[slot]).view(ResultBase),
        )
        return t

    # --- submission ------------------------------------------------------------

    def push(
        self,
        tpl,
        op: int,
        slot: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        internal: bool = False,
    ) -> Inflight:
        """Publish a copy of the descriptor ``tpl`` (every field set but the forward id,
        slot, generation, epoch and submit time, which this fills in) for ``slot``."""
        fid = self.next_forward
        self.next_forward = fid + 1
        slots = self.slots
        gen = slots.generation[slot]
        epoch = self.epoch
        # a copy of tpl with these fields and submit_ns filled in, pushed, and the
        # doorbell rung if the dataplane parks: one call into C (rc 1: it rang)
        rc = lib.dp_submit_template(self.submitter, tpl, fid, slot, gen, epoch)
        if rc:
            if rc < 0:
                raise RingFull("the submission ring is full")  # cannot: capacity >= slots
            self.ring.doorbells += 1
        slots.state[slot] = _SUBMITTED
        rec = Inflight(fid, slot, gen, epoch, op, shape, dtype, internal)
        self.inflight[fid] = rec
        self.unpumped += 1
        if self.unpumped >= _PUMP_AT_SUBMIT:
            self.pump(0)  # nobody released forwards: the completions of earlier ones, here
        return rec

    def push_routed(
        self,
        r,
        moe: MoeLayer,
        slot: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        indices,
        weights,
        table,
    ) -> Inflight:
        """``push`` of a routed forward: one call into C (dp_submit_routed) packs the
        routing (cffi pointers to its ``indices`` and ``weights``) into the slot's
        ``table`` by the C rule and, only if it accepts every entry, publishes a copy of
        the plan ``r``'s template (a ``struct dp_routed_submit *``). A refusal raises
        ``RoutingRefused`` with nothing published and the slot still claimed. Keep the
        bookkeeping alike with ``push``'s."""
        fid = self.next_forward
        slots = self.slots
        gen = slots.generation[slot]
        epoch = self.epoch
        rc = lib.dp_submit_routed(self.submitter, r, fid, slot, gen, epoch, indices, weights,
                                  table)  # fmt: skip
        if rc:
            if rc < 0:
                raise routing_refused(rc, r.why, "routing")
            if rc == 2:
                raise RingFull("the submission ring is full")  # cannot: capacity >= slots
            self.ring.doorbells += 1
        self.next_forward = fid + 1
        slots.state[slot] = _SUBMITTED
        rec = Inflight(fid, slot, gen, epoch, _FORWARD, shape, dtype)
        rec.moe = moe
        self.inflight[fid] = rec
        self.unpumped += 1
        if self.unpumped >= _PUMP_AT_SUBMIT:
            self.pump(0)
        return rec

    def push_weight(
        self, slot: int, op: Op, layer: int, duck: int, tensor: int, offset: int, n: int
    ) -> Inflight:
        """Publish a weight chunk (or commit) whose bytes are in activation slot ``slot``;
        its slot frees itself on completion."""
        d = new_desc()  # zeroed; push copies it
        d.op, d.layer, d.duck, d.tensor, d.offset, d.nbytes = op, layer, duck, tensor, offset, n
        d.timeout_us = self.timeout_us
        rec = self.push(d, int(op), slot, (n,), np.dtype(np.uint8), internal=True)
        rec.released = True  # nobody reads a weight chunk's result
        return rec

    # --- layers ----------------------------------------------------------------

    def refresh_layers(self) -> list[ctl.LayerInfo]:
        """Ask the dataplane which layers it holds; remember the answer in ``layers``."""
        reply = self.request(lambda rid: ctl.GetLayers(req_id=rid))
        assert isinstance(reply, ctl.Layers)
        self.layers = {li.layer: li for li in reply.layers}
        return list(reply.layers)

    def layer_info(self, layer: int) -> ctl.LayerInfo:
        """``layer``'s LayerInfo, asking the dataplane unless a ready one is remembered;
        raises when the layer is unknown, failed or still loading."""
        info = self.layers.get(layer)
        # a committed layer some ducks lost (restarted) is usable on the others: no
        # round trip per forward for it
        if info is None or not (info.ready or info.lost):
            self.refresh_layers()
            info = self.layers.get(layer)
        if info is None:
            raise UnknownLayer(
                f"layer {layer} is not loaded in the dataplane (loaded: {sorted(self.layers)}); "
                "load it with Client.load_weights()"
            )
        if info.owner and info.owner != self.client_id and not info.shared:
            # the admin sees every client's layers, but uses only its own and shared
            # ones: the words LoadWeights refuses it with, before a descriptor is sent
            raise NotPermitted(ErrorCode.NOT_PERMITTED, f"layer {layer} belongs to another client")
        if info.failed:
            why = (
                f"ducks {list(info.missing)} did not acknowledge their weights"
                if info.missing
                else "its weights arrived incomplete"
            )
            raise LayerFailed(
                f"layer {layer} failed to load: {why}; load it again with "
                f"load_weights({layer}, ...) once the ducks answer (Client.topology() shows "
                "which are alive)",
                status=Status.BAD_REQUEST,
                missing=tuple(info.missing),
            )
        if not info.ready and not info.lost:
            raise BadInput(
                f"layer {layer} is still loading (load_weights has not committed it yet)"
            )
        return info

    # --- completions -------------------------------------------------------------

    def poll_once(self, rec: Inflight) -> None:
        """Look once, without waiting, whether ``rec`` completed."""
        word = lib.dp_load_acquire_u64(ffi.addressof(self.segment.slot_headers[rec.slot], "done"))
        if (word >> 32) == rec.generation and word & 0xFFFF_FFFF:
            self._completed(rec, word & 0xFFFF_FFFF)
        else:
            self.pump(0)

    def wait_done(self, rec: Inflight, timeout: float | None, wait: WaitStrategy) -> None:
        """Wait on the slot's done word: ``spin`` polls it, ``block`` sleeps on its futex
        at once, ``hybrid`` spins ``spin_us`` first. Each slice ends with a look at
        ZeroMQ (a descriptor refused for a bad slot completes there only) and at the
        dataplane's heartbeat, so a dead dataplane is an error, never a hang."""
        if self.closed:
            raise ClientClosed("the client is closed; connect again")
        # the clock is read once before the first slice, then after each that ends undone
        deadline = left = None
        if timeout is not None:
            deadline = time.monotonic() + timeout
            left = int(timeout * 1e9)
        hdr = self.slot_hdrs[rec.slot]
        gen = rec.generation
        spin = self.spin_ns if wait == "hybrid" else 0
        while rec.status is None:
            if wait == "spin":
                spin_ns, sleep_ns = _SPIN_SLICE_NS, 0
            else:
                spin_ns, sleep_ns, spin = spin, _SLEEP_SLICE_NS, 0
            if left is not None and left < spin_ns + sleep_ns:
                spin_ns, sleep_ns = max(0, min(spin_ns, left)), max(0, min(sleep_ns, left))
            word = lib.dp_wait_done(hdr, gen, spin_ns, sleep_ns)
            if (word >> 32) == gen and word & 0xFFFF_FFFF:
                # _completed, inlined for a forward not completed yet (the loop's condition)
                rec.status = word & 0xFFFF_FFFF
                self.slots.state[rec.slot] = _COMPLETED
                if rec.released:
                    self.slots.release(rec.slot)
                if rec.zmq_done:
                    self.inflight.pop(rec.forward_id, None)
                return
            self.pump(0)
            if rec.status is None:
                self.check_alive()
                if deadline is not None:
                    now = time.monotonic()
                    if now >= deadline:
                        raise WaitTimeout(
                            f"forward {rec.forward_id} did not complete within {timeout:g} s; "
                            "it is still pending: call result() again, or raise the timeout"
                        )
                    left = int((deadline - now) * 1e9)

    def await_zmq(self, rec: Inflight, timeout: float = 5.0) -> None:
        """Wait for ``rec``'s ZeroMQ completion, which carries timings and duck ids; it
        follows the shared-memory one."""
        if rec.zmq_done or self.closed:
            return
        if rec.status is None:
            self.wait_done(rec, timeout, "block")
        self.counters["zmq_waits"] += 1
        deadline = time.monotonic() + timeout
        # the dataplane holds completions up to completion_flush_us to send them in one
        # burst; one we wait for leaves at once (dp_completions_want, dp_wake.h)
        hdr, pipe = self.segment.header, self.doorbell.write_fd
        # parked, the dataplane may have sent it already (a burst a ring of ours let go):
        # take what came before ringing, which would wake it for nothing (and a doorbell
        # that keeps ringing for nothing is not listened to for a while: dp_dispatch.c)
        if hdr.need_wakeup and self.channel.pump(0, self.take_completion) and rec.zmq_done:
            return
        if lib.dp_completions_want(hdr, 1, pipe) == 1:
            self.ring.doorbells += 1
        try:
            while not rec.zmq_done and time.monotonic() < deadline:
                # one message at a time: no receive left to find the socket empty (pyzmq
                # raises Again, ~25,000 instructions) once rec's completion is in
                self.channel.pump(BLOCK_SLICE_S, self.take_completion, 1)
                if not rec.zmq_done:
                    self.check_alive()
        finally:
            lib.dp_completions_want(hdr, 0, -1)
        if not rec.zmq_done and rec.status is not None:
            self._zmq_lost(rec)  # read with the dataplane asked to send: it did not come

    def phases(self, rec: Inflight) -> ctl.Phases:
        """``rec``'s phase times from its slot header's second line, once it is done (as
        result() waits, without raising for a failed forward): no ZeroMQ. Kept after the
        first read. A forward released before that (its slot may be the next forward's
        already), or one whose completion never reached its slot header (a descriptor
        refused for its slot), takes the same numbers from its ZeroMQ completion."""
        p = rec.phases
        if p is not None:
            return p
        if rec.status is None:
            self.wait_done(rec, None, self.wait)
        buf = self._phases_buf
        if (
            not rec.released
            and not self.closed
            and lib.dp_slot_phases(self.slot_hdrs[rec.slot], rec.generation, buf)
        ):
            p = ctl.Phases(*buf)
        else:
            self.await_zmq(rec)
            p = ctl.Phases.of(rec.timings or ctl.Timings())
        rec.phases = p
        return p

    def _completed(self, rec: Inflight, status: int) -> None:
        """Either completion path lands here; the second one must agree with the first."""
        if rec.status is None:
            rec.status = status
            self.slots.state[rec.slot] = _COMPLETED
            if rec.released:
                self.slots.release(rec.slot)
        elif rec.status != status:
            self.counters["completion_mismatch"] += 1
            log.error("forward %d: shm says %s, ZeroMQ says %s", rec.forward_id, rec.status, status)
        if rec.zmq_done:
            self.inflight.pop(rec.forward_id, None)

    def take_completion(self, msg: ctl.Completion) -> None:
        """Apply one ZeroMQ completion; one that names no forward in flight (by forward
        id, slot, generation and epoch) is counted and dropped."""
        fid = msg.forward_id
        rec = self.inflight.get(fid)
        if (
            rec is None
            or rec.slot != msg.slot
            or rec.generation != msg.generation
            or rec.epoch != msg.epoch
        ):
            self.counters["stale_completions"] += 1
            return
        rec.zmq_done = True
        rec.answered, rec.missing = tuple(msg.answered), tuple(msg.missing)
        rec.timings, rec.message = msg.timings, msg.message
        if msg.current_epoch:
            self.epoch = msg.current_epoch
        if rec.status == msg.status:
            del self.inflight[fid]  # the done word came first and agrees: what _completed does
        else:
            self._completed(rec, msg.status)

    # --- control channel --------------------------------------------------------

    def pump(self, timeout_s: float) -> int:
        """Take whatever the dataplane sent, waiting up to ``timeout_s`` for the first;
        now and then, give up the ZeroMQ completions that did not come (``_sweep``)."""
        self.unpumped = 0
        n = self.channel.pump(timeout_s, self.take_completion, 0)
        if self.inflight:
            now = time.monotonic()
            if now >= self._next_sweep:
                self._sweep(now)
        return n

    def _sweep(self, now: float) -> None:
        """Note the records of done forwards whose ZeroMQ completion has not come (a forward
        nobody waited for has its done word looked at here), and give up those late since
        ``_ZMQ_LOST_S`` of reading, or the oldest past ``_MAX_LATE``: the session's records
        stay bounded whatever the dataplane sends."""
        # not read for a while (no pump): what is late may be queued for us yet
        paused = now - self._last_sweep > 2 * _SWEEP_S
        self._last_sweep = now
        self._next_sweep = now + _SWEEP_S
        headers = self.segment.slot_headers
        late: list[Inflight] = []
        for rec in list(self.inflight.values()):  # oldest first
            if rec.status is None:
                word = lib.dp_load_acquire_u64(ffi.addressof(headers[rec.slot], "done"))
                if (word >> 32) != rec.generation or not word & 0xFFFF_FFFF:
                    continue  # in flight
                self._completed(rec, word & 0xFFFF_FFFF)
            if paused or not rec.late:
                rec.late = now
            elif now - rec.late >= _ZMQ_LOST_S:
                self._zmq_lost(rec)
                continue
            late.append(rec)
        for rec in late[: max(0, len(late) - _MAX_LATE)]:
            self._zmq_lost(rec)

    def _zmq_lost(self, rec: Inflight) -> None:
        """Give up ``rec``'s ZeroMQ completion. Its done word gave the status; its slot
        header's phase times, while the slot is still this forward's, stand in for the
        timings (no duck lists). Its record goes: should the completion come after all, it
        names no forward in flight and is counted stale."""
        self.inflight.pop(rec.forward_id, None)
        rec.zmq_done = True  # nothing more to wait for
        self.counters["zmq_lost"] += 1
        buf = self._phases_buf
        if (
            rec.phases is None
            and not rec.released
            and not self.closed
            and lib.dp_slot_phases(self.slot_hdrs[rec.slot], rec.generation, buf)
        ):
            rec.phases = ctl.Phases(*buf)
        p = rec.phases
        if p is not None and rec.timings is None:
            rec.timings = ctl.Timings(
                prepare_ns=p.prepare_ns,
                send_ns=p.send_ns,
                wait_ns=p.wait_ns,
                fetch_ns=p.fetch_ns,
                reduce_ns=p.reduce_ns,
                spread_ns=p.spread_ns,
            )
        log.debug("forward %d: its ZeroMQ completion did not come", rec.forward_id)

    def request(self, make: Callable[[int], ctl.AnyRequest], timeout: float = 5.0) -> ctl.AnyReply:
        """Send the request ``make(req_id)`` builds and return its reply (an Error raises)."""
        self.check_usable()
        return self.channel.request(make, timeout, self.take_completion, self.check_alive)

    # --- liveness --------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise unless new work may be submitted: open, dataplane alive, not detached."""
        # every claim and submit runs this: the closed check and check_detached's, inlined
        if self.closed:
            raise ClientClosed("the client is closed; connect again")
        if self.lost is not None:
            raise DataplaneLost(self.lost)
        hdr = self.segment.header  # None once the segment is closed
        if hdr is not None and hdr.detach_reason:
            self.check_detached()

    def check_detached(self) -> None:
        """Raise ClientDetached once the dataplane has dropped this client on its own."""
        reason = self.segment.detach_reason if not self.segment.closed else 0
        if reason:
            try:
                why = DetachReason(reason).name
            except ValueError:
                why = f"reason {reason}"
            raise ClientDetached(
                f"the dataplane detached this client ({why}): its submission ring was "
                "written out of order, so nothing more is taken from it and pending forwards "
                "will not complete; close this client and connect again"
            )

    def check_alive(self) -> None:
        """Raise DataplaneLost when the dataplane process is gone or stopped heartbeating."""
        if self.lost is not None:
            raise DataplaneLost(self.lost)
        if self.closed:
            raise ClientClosed("the client is closed; connect again")
        self.check_detached()
        now = time.monotonic()
        if now - self._last_check < _LIVENESS_CHECK_S or not self.dp_pid:
            return
        self._last_check = now
        why = None
        if not host.process_alive(self.dp_pid):
            why = "exited"
        else:
            hb = int(self.segment.header.dataplane_heartbeat_ns)
            age = host.monotonic_ns() - hb
            if hb and age > self._dataplane_timeout_ns:
                why = f"stopped heartbeating {age / 1e9:.1f} s ago"
        if why:
            pending = sum(1 for r in self.inflight.values() if r.status is None)
            self.lost = (
                f"the dataplane (pid {self.dp_pid}) {why}; {pending} pending forwards are lost. "
                "Restart the dataplane and connect again"
            )
            raise DataplaneLost(self.lost)

    def __repr__(self) -> str:
        return f"<Session {self.segment!r} {len(self.inflight)} in flight>"


class Doorbell:
    """This client's doorbell: an anonymous pipe whose read end the dataplane opens at
    attach (Attach.doorbell_fd, through /proc as the segment), so that only this
    process (and whoever it hands the write end to) can wake the dataplane. The read
    end stays open here too: a write after the dataplane let go never raises EPIPE."""

    __slots__ = ("read_fd", "write_fd")

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1


def _heartbeat_loop(seg: Segment, stop: threading.Event) -> None:
    while not stop.wait(_HEARTBEAT_S):
        if seg.closed:
            return
        seg.heartbeat_client()


def _cleanup(
    channel: Channel,
    seg: Segment,
    stop: threading.Event,
    beat: threading.Thread,
    doorbell: Doorbell,
    result_bases: list[ResultBase],
    result_last: list,
    act_bases: list[ClaimBase],
    claim_specs: dict,
    slot_hdrs: list,
) -> None:
    stop.set()
    beat.join(timeout=2.0)
    channel.close()
    doorbell.close()
    result_bases.clear()  # they view the mapping: seg.close() can unmap it once they go
    result_last.clear()
    act_bases.clear()
    claim_specs.clear()  # their templates view the mapping too
    slot_hdrs.clear()  # pointers into the mapping, which is about to go
    seg.close()  # closes the memfd: its memory goes once the dataplane unmaps it too
