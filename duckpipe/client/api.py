"""The client: attach to a dataplane, claim slots, submit forwards, take completions.

A ``Client`` owns one shared-memory segment (its submission ring and slot
arenas) and one control channel to the dataplane. The model writes activations
straight into slot memory through ``Slot.array``; results come back in the
paired result slot. A Client is not thread-safe: use one per thread.

The pieces it is built from live next door: ``channel`` (the control socket),
``slots`` (the slot table and ``Slot``), ``weights`` (loading a layer).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from .. import runtime
from .._native import ffi, lib
from ..errors import (
    BadInput,
    Cancelled,
    ClientClosed,
    ClientDetached,
    DataplaneFault,
    DataplaneLost,
    DataplaneUnavailable,
    DuckLost,
    ForwardFailed,
    ForwardTimeout,
    LayerFailed,
    RingFull,
    StaleEpoch,
    UnknownLayer,
    WaitTimeout,
)
from ..schema import control as ctl
from ..schema.abi import MAX_DIMS, DetachReason, Op, Status
from . import weights
from .channel import BLOCK_SLICE_S as _BLOCK_SLICE_S
from .channel import Channel
from .models import Mlp, dtype_code, numpy_dtype
from .ring import SubmissionRing, new_desc
from .shm import BackingChoice, Segment
from .slots import DEBUG_SLOTS_ENV, Slot, SlotGuard, SlotState, SlotTable

if TYPE_CHECKING:
    import zmq

__all__ = ["Client", "Forward", "Slot", "SlotState", "WaitStrategy", "connect"]

log = logging.getLogger("duckpipe.client")

WaitStrategy = Literal["spin", "block", "hybrid"]

_HEARTBEAT_S = 0.2
_LIVENESS_CHECK_S = 0.05
# a sleeping waiter looks at ZeroMQ and the dataplane's heartbeat this often
_SLEEP_SLICE_NS = 50_000_000
_SPIN_SLICE_NS = 10_000_000
# ZeroMQ completions (timings, duck lists) are read in batches: result() does not need them
_PUMP_EVERY = 32
# Bound on each per-client cache below (claim specs, descriptor templates): a model
# uses a handful of shapes; one feeding ever new shapes just starts them over.
_CACHE_MAX = 256
_OK = int(Status.OK)
_FORWARD = int(Op.FORWARD)
_SUBMITTED = SlotState.SUBMITTED
_COMPLETED = SlotState.COMPLETED


def connect(
    control: str | object | None = None,
    *,
    timeout: float = 5.0,
    slots: int = 64,
    slot_size: int = 1 << 20,
    result_slot_size: int | None = None,
    backing: BackingChoice = "auto",
    wait: WaitStrategy = "block",
    spin_us: float = 50.0,
    claim_timeout: float = 10.0,
    forward_timeout: float | None = None,
    dataplane_timeout: float = 5.0,
    name: str = "",
    debug_slots: bool | None = None,
) -> Client:
    """Attach to a running dataplane and return a ready ``Client``.

    ``control`` is the dataplane's control address, or an object with a ``.control``
    address (the pytest plugin's ``duckpipe_mock``, a ``Cluster``); it defaults to
    ``$DUCKPIPE_CONTROL`` or the per-user run directory's ``ipc://.../control``.
    ``slots`` (a power of two) slots of ``slot_size`` activation bytes (and
    ``result_slot_size`` result bytes, default the same) are created in one segment.
    ``wait`` picks how ``Forward.result`` waits for the result slot's done word:
    ``spin`` polls it (a core of your own), ``block`` sleeps on it at once (a futex the
    dataplane wakes), ``hybrid`` spins ``spin_us`` first, then sleeps (the README says
    which fits which machine). None of them needs ZeroMQ: the completion's timings and
    duck lists arrive there, read in batches and on demand (``Forward.timings``).
    ``forward_timeout`` is each forward's deadline in the dataplane (None: the
    dataplane's default). The dataplane is declared lost when its process exits or its
    heartbeat is older than ``dataplane_timeout`` seconds.

    ``debug_slots`` (default: ``$DUCKPIPE_DEBUG_SLOTS`` is 1) write-protects every
    activation slot this client holds free, so that a write through a stale handle
    faults (SIGSEGV) on the line that made it; it needs small pages (``backing``
    "auto" picks them) and costs two mprotect calls per forward.
    """
    if debug_slots is None:
        debug_slots = os.environ.get(DEBUG_SLOTS_ENV, "") not in ("", "0")
    return Client(
        _control_address(control),
        timeout=timeout,
        slots=slots,
        slot_size=slot_size,
        result_slot_size=result_slot_size,
        backing=backing,
        wait=wait,
        spin_us=spin_us,
        claim_timeout=claim_timeout,
        forward_timeout=forward_timeout,
        dataplane_timeout=dataplane_timeout,
        name=name,
        debug_slots=debug_slots,
    )


def _control_address(control: object) -> str:
    """``control`` as an address: a string, or anything with a ``.control`` string (the
    pytest plugin's ``duckpipe_mock``, a ``MockDataplaneProcess``, ``Cluster``,
    ``DataplaneProcess``); None: the default."""
    if control is None:
        return runtime.default_control()
    if isinstance(control, str):
        return control
    address = getattr(control, "control", None)
    if isinstance(address, str) and address:
        return address
    raise TypeError(
        f"connect() takes a control address such as 'ipc:///run/user/1000/duckpipe/control', "
        f"or an object with a .control address (duckpipe_mock, a Cluster), not "
        f"{type(control).__name__}"
    )


class _Inflight:
    """Client-side record of one submitted descriptor, until its completions are in.

    A plain class with ``__slots__``, not a dataclass: one is made per forward."""

    __slots__ = (
        "answered",
        "dtype",
        "epoch",
        "forward_id",
        "generation",
        "internal",
        "message",
        "missing",
        "n_answered",
        "n_missing",
        "op",
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
        self.n_answered = 0
        self.n_missing = 0
        self.timings: ctl.Timings | None = None
        self.message = ""
        self.zmq_done = False
        self.released = False

    def __repr__(self) -> str:
        return (
            f"_Inflight(forward_id={self.forward_id}, slot={self.slot}, "
            f"generation={self.generation}, status={self.status}, released={self.released})"
        )


class Forward:
    """A submitted forward. ``result()`` waits for it; ``release()`` frees its slot.

    The slot is also freed when the Forward is garbage collected; the array
    ``result()`` returns is valid until then.
    """

    __slots__ = ("__weakref__", "_client", "_rec")

    def __init__(self, client: Client, rec: _Inflight) -> None:
        self._client = client
        self._rec = rec

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: one is made per forward, and a finalizer
        # costs microseconds to register; both run when the Forward is collected
        self._client._release_forward(self._rec)

    @property
    def id(self) -> int:
        return self._rec.forward_id

    @property
    def status(self) -> Status:
        """PENDING until a completion arrives (looks without waiting)."""
        rec = self._rec
        if rec.status is None:
            self._client._poll_once(rec)
        return Status(rec.status) if rec.status is not None else Status.PENDING

    def done(self) -> bool:
        return self.status != Status.PENDING

    @property
    def answered(self) -> tuple[int, ...]:
        """Ducks that answered (after the ZeroMQ completion is in)."""
        self._client._await_zmq(self._rec)
        return self._rec.answered

    @property
    def missing(self) -> tuple[int, ...]:
        """Ducks that did not answer."""
        self._client._await_zmq(self._rec)
        return self._rec.missing

    @property
    def timings(self) -> ctl.Timings:
        """Per-phase nanoseconds from the dataplane; waits for the ZeroMQ completion."""
        self._client._await_zmq(self._rec)
        return self._rec.timings or ctl.Timings()

    def result(
        self, timeout: float | None = None, *, wait: WaitStrategy | None = None
    ) -> np.ndarray:
        """Wait for the completion and return the result, a view into the result slot.

        The view is valid until this Forward is released or dropped. Raises
        ``WaitTimeout`` when ``timeout`` seconds pass first (the forward stays
        pending), ``DataplaneLost`` if the dataplane dies, and a
        ``ForwardFailed`` subclass when the forward completed with an error.
        """
        client, rec = self._client, self._rec
        client._check_open()
        if rec.status is None:
            client._wait(rec, timeout, wait or client.wait)
        if rec.status != _OK:
            client._await_zmq(rec, 1.0)  # it carries the reason and the missing ducks
            raise _failure(rec)
        if rec.released:
            raise BadInput(f"forward {rec.forward_id} was released; its result slot is reused")
        # what Segment.res_view makes, in one call: claim checked that it fits the slot
        return np.ndarray(rec.shape, rec.dtype, client._segment.res_bytes(rec.slot))

    def release(self) -> None:
        """Free the slot now (or as soon as the forward completes)."""
        self._client._release_forward(self._rec)

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        s = self._rec.status
        return f"<Forward {self.id} {Status(s).name if s is not None else 'PENDING'}>"


def _failure(rec: _Inflight) -> ForwardFailed:
    missing = rec.missing
    detail = f": {rec.message}" if rec.message else ""
    st = Status(rec.status)
    if st == Status.TIMEOUT:
        return ForwardTimeout(
            f"forward {rec.forward_id} timed out in the dataplane; ducks {list(missing)} "
            f"did not answer{detail}",
            status=st,
            missing=missing,
        )
    kinds: dict[Status, type[ForwardFailed]] = {
        Status.DUCK_LOST: DuckLost,
        Status.STALE_EPOCH: StaleEpoch,
        Status.CANCELLED: Cancelled,
    }
    cls = kinds.get(st, DataplaneFault)
    return cls(f"forward {rec.forward_id} completed {st.name}{detail}", status=st, missing=missing)


class Client:
    """A connection to a dataplane. Build one with :func:`connect`."""

    def __init__(
        self,
        control: str,
        *,
        timeout: float,
        slots: int,
        slot_size: int,
        result_slot_size: int | None,
        backing: BackingChoice,
        wait: WaitStrategy,
        spin_us: float,
        claim_timeout: float,
        forward_timeout: float | None,
        dataplane_timeout: float,
        name: str,
        debug_slots: bool = False,
    ) -> None:
        # Keep a Client under 30 instance attributes (29 now): CPython (3.11 here) stops
        # sharing an instance dict's keys at 30, and every self.x on the forward path
        # gets slower: 10-15% per forward, measured.
        if wait not in ("spin", "block", "hybrid"):
            raise BadInput(f"wait must be 'spin', 'block' or 'hybrid', not {wait!r}")
        self.control = control
        self.wait: WaitStrategy = wait
        self._spin_ns = int(spin_us * 1000)
        self._claim_timeout = claim_timeout
        self._timeout_us = 0 if forward_timeout is None else max(1, int(forward_timeout * 1e6))
        self._dataplane_timeout_ns = int(dataplane_timeout * 1e9)
        self._closed = False
        self._lost: str | None = None
        self._next_forward = 1
        self._inflight: dict[int, _Inflight] = {}
        self._layers: dict[int, ctl.LayerInfo] = {}
        # claim: (shape, dtype) as given -> (normalised shape, np.dtype), once checked.
        # Depends only on the slot sizes, fixed for the client's life.
        self._claim_specs: dict[tuple, tuple[tuple[int, ...], np.dtype]] = {}
        # submit: (layer, shape, dtype) -> (the LayerInfo it was checked against, a
        # prepared FORWARD descriptor). Used only while that very LayerInfo is the one in
        # _layers: layers(), load_weights and unload_layer replace or drop it, which
        # invalidates the entry without anyone having to remember to.
        self._templates: dict[tuple, tuple[ctl.LayerInfo, object]] = {}
        self._last_check = 0.0
        self.counters = {"stale_completions": 0, "completion_mismatch": 0, "bad_messages": 0}

        if debug_slots:
            if backing == "hugetlbfs":
                raise BadInput(
                    "debug_slots write-protects single slots, which 2 MiB hugepages cannot "
                    "be cut into: use backing='auto' or 'devshm' with it"
                )
            backing = "devshm"
        self._channel = Channel(control, self.counters)
        try:
            self._segment = Segment.create(
                slot_count=slots,
                act_slot_size=slot_size,
                res_slot_size=result_slot_size,
                backing=backing,
                tag=name or "client",
            )
        except Exception:
            self._channel.close()
            raise
        seg = self._segment
        self._ring = SubmissionRing(seg)
        guard = None
        if debug_slots:
            addrs = [seg.act_bytes(i).ctypes.data for i in range(seg.slot_count)]
            guard = SlotGuard(addrs, seg.act_slot_size)
        self._slots = SlotTable(seg.slot_count, guard)
        self._pushes = 0
        self._doorbell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(
            target=_heartbeat_loop, args=(seg, self._stop), name="duckpipe-heartbeat", daemon=True
        )
        self._heartbeat.start()
        self._finalizer = weakref.finalize(
            self, _cleanup, self._channel, seg, self._stop, self._heartbeat, self._doorbell
        )
        self._dp_pid = 0
        try:
            att = self._channel.attach(seg, name, timeout, self._on_completion)
        except BaseException:
            self._finalizer()
            raise
        self.client_id = att.client_id
        self.epoch = att.epoch
        self.mode = att.mode
        self._dp_pid = att.dataplane_pid
        self._max_bytes = min(seg.act_slot_size, att.max_forward_bytes or seg.act_slot_size)
        if att.doorbell:
            self._use_doorbell(att.doorbell)

    # --- public API -----------------------------------------------------------

    @property
    def segment(self) -> Path:
        """This client's shared-memory segment as /proc/<pid>/fd/<fd> (a sealed memfd)."""
        return self._segment.path

    @property
    def segment_name(self) -> str:
        """The memfd's name, as ``duckpipe shm ls`` and the dataplane's stats show it."""
        return self._segment.name

    @property
    def backing(self) -> str:
        return self._segment.backing.name.lower()

    @property
    def slot_count(self) -> int:
        return self._segment.slot_count

    @property
    def slot_size(self) -> int:
        return self._segment.act_slot_size

    def topology(self) -> ctl.Topology:
        """The NICs and ducks the dataplane drives."""
        return self._request(lambda rid: ctl.GetTopology(req_id=rid))  # type: ignore[return-value]

    def layers(self) -> list[ctl.LayerInfo]:
        """Layers the dataplane holds weights for."""
        reply = self._request(lambda rid: ctl.GetLayers(req_id=rid))
        assert isinstance(reply, ctl.Layers)
        self._layers = {li.layer: li for li in reply.layers}
        return list(reply.layers)

    def stats(self) -> ctl.Stats:
        """The dataplane's counters."""
        return self._request(lambda rid: ctl.GetStats(req_id=rid))  # type: ignore[return-value]

    def set_epoch(self, epoch: int | None = None) -> int:
        """Move the dataplane to ``epoch`` (default: the next); returns the new epoch."""
        reply = self._request(lambda rid: ctl.SetEpoch(req_id=rid, epoch=epoch))
        assert isinstance(reply, ctl.EpochChanged)
        self.epoch = reply.epoch
        return reply.epoch

    def claim(
        self, shape: int | Sequence[int], dtype=np.float32, *, timeout: float | None = None
    ) -> Slot:
        """Claim a free slot for an activation of ``shape`` and ``dtype``.

        Waits up to ``timeout`` (default: the client's ``claim_timeout``) for a
        slot to free up, then raises ``RingFull``.
        """
        self._check_usable()
        try:
            shape_t, dt = self._claim_specs[shape, dtype]
        except (KeyError, TypeError):  # a new shape or dtype, or an unhashable shape
            shape_t, dt = self._claim_spec(shape, dtype)
        slots = self._slots
        i = slots.take(self._claim_timeout if timeout is None else timeout, self._wait_for_slot)
        # a new array each claim (what Segment.act_view makes, in one call): the caller
        # owns it and may reshape it in place
        arr = np.ndarray(shape_t, dt, self._segment.act_bytes(i))
        return Slot(self, i, slots.generation[i], arr)

    def _claim_spec(self, shape: int | Sequence[int], dtype) -> tuple[tuple[int, ...], np.dtype]:
        """Check a claim's shape and dtype; remember the result when they are hashable."""
        shape_t = _normalise_shape(shape)
        dt = np.dtype(dtype)
        dtype_code(dt)
        # math.prod: exact, where np.prod of a tuple is slow and wraps past 2**63
        nbytes = math.prod(shape_t) * dt.itemsize
        seg = self._segment
        if nbytes > self._max_bytes or nbytes > seg.res_slot_size:
            raise BadInput(
                f"an activation of {nbytes} bytes does not fit a slot of {self._max_bytes} bytes "
                f"(result slots {seg.res_slot_size}); connect with a larger slot_size "
                "(the dataplane's max_forward_bytes caps it too)"
            )
        specs = self._claim_specs
        if len(specs) >= _CACHE_MAX:
            specs.clear()
        try:
            specs[shape, dtype] = (shape_t, dt)
        except TypeError:
            pass  # an unhashable shape (a list, an array): checked again next time
        return shape_t, dt

    def submit(self, slot: Slot, layer: int, *, ducks: Iterable[int] | None = None) -> Forward:
        """Hand a filled slot to the dataplane to run ``layer`` on it.

        ``ducks`` restricts the forward to a subset of the ducks holding the
        layer (their partials are summed); default: all of them.
        """
        self._check_usable()
        # _slot_is_claimed without its closed check: _check_usable made it
        if not (slot._client is self and self._slots.is_claimed(slot.index, slot.generation)):
            raise BadInput(
                f"{slot!r} is not claimed by this client (already submitted or released)"
            )
        arr = slot._array  # claimed: checked above
        shape = arr.shape
        tpl = None
        if ducks is None:
            # A descriptor prepared by an earlier submit of this layer, shape and dtype,
            # while the LayerInfo it was checked against is still the current one.
            try:
                info, tpl = self._templates[layer, shape, arr.dtype]
            except (KeyError, TypeError):
                pass
            else:
                if self._layers.get(layer) is not info:
                    tpl = None
        if tpl is None:
            tpl = self._forward_template(layer, arr, ducks)
        return Forward(self, self._push(tpl, _FORWARD, slot.index, shape, arr.dtype))

    def _forward_template(self, layer: int, arr: np.ndarray, ducks: Iterable[int] | None):
        """Check ``arr`` against ``layer`` and prepare the FORWARD descriptor submitting
        it; every field but the per-forward ones (``_push``). Kept in ``_templates``
        when the forward goes to every duck of the layer."""
        info = self._layer_info(layer)
        if arr.dtype != numpy_dtype(info.dtype):
            raise BadInput(
                f"layer {layer} holds {numpy_dtype(info.dtype)} weights; "
                f"the activation is {arr.dtype}"
            )
        if arr.shape[-1] != info.hidden:
            raise BadInput(
                f"layer {layer} has hidden size {info.hidden}; "
                f"the activation's shape is {arr.shape}"
            )
        d = new_desc()
        if ducks is not None:
            chosen = sorted(set(ducks))
            stray = sorted(set(chosen) - set(info.ducks))
            if not chosen or stray:
                raise BadInput(
                    f"ducks {stray or chosen} hold no shard of layer {layer}; "
                    f"it lives on ducks {info.ducks}"
                )
            for duck in chosen:
                d.ducks[duck >> 6] |= 1 << (duck & 63)
        d.op = Op.FORWARD
        d.layer = layer
        d.dtype = dtype_code(arr.dtype)
        d.ndim = arr.ndim
        for k, n in enumerate(arr.shape):
            d.shape[k] = n
        d.nbytes = arr.nbytes
        d.timeout_us = self._timeout_us
        if ducks is None:
            templates = self._templates
            if len(templates) >= _CACHE_MAX:
                templates.clear()
            templates[layer, arr.shape, arr.dtype] = (info, d)
        return d

    def forward(
        self,
        layer: int,
        x: np.ndarray,
        *,
        ducks: Iterable[int] | None = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Claim, copy ``x`` in once, submit, wait; returns a copy of the result."""
        x = np.asarray(x)
        with self.claim(x.shape, x.dtype) as slot:
            np.copyto(slot.array, x)
            fwd = self.submit(slot, layer, ducks=ducks)
        with fwd:
            return fwd.result(timeout).copy()

    def unload_layer(self, layer: int) -> None:
        """Free a layer this client loaded; forwards already submitted on it finish first."""
        self._check_usable()
        self._request(lambda rid: ctl.UnloadLayer(req_id=rid, layer=layer))
        self._layers.pop(layer, None)

    def load_weights(
        self,
        layer: int,
        mlp: Mlp,
        *,
        ducks: Sequence[int] | None = None,
        progress: bool | None = None,
        timeout: float = 60.0,
        shared: bool = False,
    ) -> ctl.LayerInfo:
        """Shard ``mlp`` over ``ducks`` (default: every duck) and load it as ``layer``.

        The layer is this client's: other clients cannot use or replace it, and it is
        freed when this client closes or dies. ``shared=True`` lets every client use it;
        only the dataplane's own user (the admin) may load shared layers.

        The shards travel through this client's shared-memory slots, never over
        ZeroMQ. A progress bar is drawn on stderr when it is a terminal
        (``progress`` forces it on or off).
        """
        return weights.load_weights(
            self, layer, mlp, ducks=ducks, progress=progress, timeout=timeout, shared=shared
        )

    def close(self) -> None:
        """Detach from the dataplane and close this client's segment."""
        if self._closed:
            return
        if self._lost is None:
            try:
                self._request(lambda rid: ctl.Detach(req_id=rid), 1.0)
            except Exception as e:  # closing must not fail because the peer is gone
                log.debug("detach failed: %s", e)
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.client_id} {self.control} {self._segment!r}>"

    # --- slots ------------------------------------------------------------------

    def _take_slot(self, timeout: float) -> int:
        return self._slots.take(timeout, self._wait_for_slot)

    def _wait_for_slot(self, left: float) -> None:
        self._pump(min(left, _BLOCK_SLICE_S))  # completions free slots
        self._check_alive()

    def _slot_is_claimed(self, slot: Slot) -> bool:
        return (
            slot._client is self
            and not self._closed
            and self._slots.is_claimed(slot.index, slot.generation)
        )

    def _release_claim(self, slot: Slot) -> None:
        if not self._slot_is_claimed(slot):
            raise BadInput(f"{slot!r} is not claimed by this client")
        self._slots.release(slot.index)

    def _release_forward(self, rec: _Inflight) -> None:
        if rec.released or self._closed:
            return
        rec.released = True
        if rec.status is not None:
            self._slots.release(rec.slot)
        # else: freed by _completed, once the dataplane is done with the slot

    @property
    def _free(self) -> list[int]:
        """The free slots' indices (tests look at how many there are)."""
        return self._slots.free

    # --- submission ------------------------------------------------------------

    def _push(
        self,
        tpl,
        op: int,
        slot: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        internal: bool = False,
    ) -> _Inflight:
        """Submit a copy of the descriptor ``tpl`` (every field set but the forward id,
        slot, generation, epoch and submit time, which this fills in) for ``slot``."""
        fid = self._next_forward
        self._next_forward = fid + 1
        slots = self._slots
        gen = slots.generation[slot]
        epoch = self.epoch
        if not self._ring.submit_template(tpl, fid, slot, gen, epoch):
            raise RingFull("the submission ring is full")  # cannot happen: capacity >= slots
        slots.state[slot] = _SUBMITTED
        rec = _Inflight(fid, slot, gen, epoch, op, shape, dtype, internal)
        self._inflight[fid] = rec
        self._pushes += 1
        if self._pushes % _PUMP_EVERY == 0:
            self._pump(0)  # the ZeroMQ completions of earlier forwards, in one batch
        return rec

    def _use_doorbell(self, address: str) -> None:
        """Connect to the dataplane's doorbell (an abstract AF_UNIX name, '@...')."""
        name = "\0" + address[1:] if address.startswith("@") else address
        try:
            self._doorbell.connect(name)
        except OSError as e:
            self.close()
            raise DataplaneUnavailable(
                f"cannot reach the dataplane's doorbell {address}: {e.strerror}; is the "
                "dataplane in another network namespace?"
            ) from None
        self._doorbell.setblocking(False)
        self._ring.use_doorbell(self._doorbell.fileno())

    def _push_weight(
        self, slot: int, op: Op, layer: int, duck: int, tensor: int, offset: int, n: int
    ) -> _Inflight:
        d = new_desc()  # zeroed; _push copies it
        d.op, d.layer, d.duck, d.tensor, d.offset, d.nbytes = op, layer, duck, tensor, offset, n
        d.timeout_us = self._timeout_us
        rec = self._push(d, int(op), slot, (n,), np.dtype(np.uint8), internal=True)
        rec.released = True  # nobody reads a weight chunk's result
        return rec

    def _layer_info(self, layer: int) -> ctl.LayerInfo:
        info = self._layers.get(layer)
        if info is None or not info.ready:
            self.layers()
            info = self._layers.get(layer)
        if info is None:
            raise UnknownLayer(
                f"layer {layer} is not loaded in the dataplane (loaded: {sorted(self._layers)}); "
                "load it with Client.load_weights()"
            )
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
        if not info.ready:
            raise BadInput(
                f"layer {layer} is still loading (load_weights has not committed it yet)"
            )
        return info

    # --- completions -------------------------------------------------------------

    def _done_word(self, rec: _Inflight):
        return ffi.addressof(self._segment.slot_headers[rec.slot], "done")

    def _poll_once(self, rec: _Inflight) -> None:
        word = lib.dp_load_acquire_u64(self._done_word(rec))
        if (word >> 32) == rec.generation and word & 0xFFFF_FFFF:
            self._completed_shm(rec, word)
        else:
            self._pump(0)

    def _wait(self, rec: _Inflight, timeout: float | None, wait: WaitStrategy) -> None:
        """Wait on the slot's done word: ``spin`` polls it, ``block`` sleeps on its futex
        at once, ``hybrid`` spins ``spin_us`` first. Each slice ends with a look at
        ZeroMQ (a descriptor refused for a bad slot completes there only) and at the
        dataplane's heartbeat, so a dead dataplane is an error, never a hang."""
        if self._closed:
            raise ClientClosed("the client is closed; connect again")
        deadline = None if timeout is None else time.monotonic() + timeout
        hdr = self._segment.slot_headers + rec.slot
        gen = rec.generation
        spin = self._spin_ns if wait == "hybrid" else 0
        while rec.status is None:
            if wait == "spin":
                spin_ns, sleep_ns = _SPIN_SLICE_NS, 0
            else:
                spin_ns, sleep_ns, spin = spin, _SLEEP_SLICE_NS, 0
            if deadline is not None:
                left = int((deadline - time.monotonic()) * 1e9)
                spin_ns, sleep_ns = max(0, min(spin_ns, left)), max(0, min(sleep_ns, left))
            word = lib.dp_wait_done(hdr, gen, spin_ns, sleep_ns)
            if (word >> 32) == gen and word & 0xFFFF_FFFF:
                self._completed_shm(rec, word)
                return
            self._pump(0)
            if rec.status is None:
                self._check_alive()
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._wait_timeout(rec, timeout)

    def _wait_timeout(self, rec: _Inflight, timeout: float | None) -> WaitTimeout:
        return WaitTimeout(
            f"forward {rec.forward_id} did not complete within {timeout:g} s; it is still "
            "pending: call result() again, or raise the timeout"
        )

    def _await_zmq(self, rec: _Inflight, timeout: float = 5.0) -> None:
        """The ZeroMQ completion carries timings and duck ids; it follows the shm one."""
        if rec.zmq_done or self._closed:
            return
        if rec.status is None:
            self._wait(rec, timeout, "block")
        deadline = time.monotonic() + timeout
        while not rec.zmq_done and time.monotonic() < deadline:
            self._pump(_BLOCK_SLICE_S)
            if not rec.zmq_done:
                self._check_alive()

    def _completed_shm(self, rec: _Inflight, word: int) -> None:
        hdr = self._segment.slot_headers[rec.slot]
        rec.n_answered, rec.n_missing = hdr.answered, hdr.missing  # ints already (cffi)
        self._completed(rec, word & 0xFFFF_FFFF)

    def _completed(self, rec: _Inflight, status: int) -> None:
        """Either completion path lands here; the second one must agree with the first."""
        if rec.status is None:
            rec.status = status
            self._slots.state[rec.slot] = _COMPLETED
            if rec.released:
                self._slots.release(rec.slot)
        elif rec.status != status:
            self.counters["completion_mismatch"] += 1
            log.error("forward %d: shm says %s, ZeroMQ says %s", rec.forward_id, rec.status, status)
        if rec.zmq_done:
            self._inflight.pop(rec.forward_id, None)

    def _on_completion(self, msg: ctl.Completion) -> None:
        rec = self._inflight.get(msg.forward_id)
        if rec is None or (rec.slot, rec.generation, rec.epoch) != (
            msg.slot,
            msg.generation,
            msg.epoch,
        ):
            self.counters["stale_completions"] += 1
            return
        rec.zmq_done = True
        rec.answered, rec.missing = tuple(msg.answered), tuple(msg.missing)
        rec.timings, rec.message = msg.timings, msg.message
        if msg.current_epoch:
            self.epoch = msg.current_epoch
        self._completed(rec, msg.status)

    # --- control channel --------------------------------------------------------

    def _pump(self, timeout_s: float) -> int:
        """Receive whatever the dataplane sent, waiting up to ``timeout_s`` for the first."""
        return self._channel.pump(timeout_s, self._on_completion)

    def _request(self, make, timeout: float = 5.0) -> ctl.AnyReply:
        """Send the request ``make(req_id)`` builds and return its reply (an Error raises)."""
        self._check_usable()
        return self._channel.request(make, timeout, self._on_completion, self._check_alive)

    # Tests reach past _pump to the socket and the replies it sorts.
    @property
    def _sock(self) -> zmq.Socket:
        return self._channel.sock

    @property
    def _replies(self) -> dict[int, ctl.AnyReply]:
        return self._channel.replies

    # --- liveness --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed; connect again")

    def _check_usable(self) -> None:
        # every claim and submit runs this: _check_open and _check_detached, inlined
        if self._closed:
            raise ClientClosed("the client is closed; connect again")
        if self._lost is not None:
            raise DataplaneLost(self._lost)
        hdr = self._segment.header  # None once the segment is closed
        if hdr is not None and hdr.detach_reason:
            self._check_detached()

    def _check_detached(self) -> None:
        """Raise ClientDetached once the dataplane has dropped this client on its own."""
        reason = self._segment.detach_reason if not self._segment.closed else 0
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

    def _check_alive(self) -> None:
        """Raise DataplaneLost when the dataplane process is gone or stopped heartbeating."""
        if self._lost is not None:
            raise DataplaneLost(self._lost)
        if self._closed:
            raise ClientClosed("the client is closed; connect again")
        self._check_detached()
        now = time.monotonic()
        if now - self._last_check < _LIVENESS_CHECK_S or not self._dp_pid:
            return
        self._last_check = now
        why = None
        if not runtime.process_alive(self._dp_pid):
            why = "exited"
        else:
            hb = int(self._segment.header.dataplane_heartbeat_ns)
            age = runtime.monotonic_ns() - hb
            if hb and age > self._dataplane_timeout_ns:
                why = f"stopped heartbeating {age / 1e9:.1f} s ago"
        if why:
            pending = sum(1 for r in self._inflight.values() if r.status is None)
            self._lost = (
                f"the dataplane (pid {self._dp_pid}) {why}; {pending} pending forwards are lost. "
                "Restart the dataplane and connect again"
            )
            raise DataplaneLost(self._lost)


def _normalise_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    try:
        t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise BadInput(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if not 1 <= len(t) <= MAX_DIMS or any(n <= 0 for n in t):
        raise BadInput(f"shape {t} must have 1 to {MAX_DIMS} positive dimensions")
    return t


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
    doorbell: socket.socket,
) -> None:
    stop.set()
    beat.join(timeout=2.0)
    channel.close()
    doorbell.close()
    seg.close()  # closes the memfd: its memory goes once the dataplane unmaps it too
