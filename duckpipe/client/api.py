"""The client: attach to a dataplane, claim slots, submit forwards, take completions.

A ``Client`` owns one shared-memory segment (its submission ring and slot
arenas) and one control channel to the dataplane. The model writes activations
straight into slot memory through ``Slot.array``; results come back in the
paired result slot. A Client is not thread-safe: use one per thread.

What it is built from lives next door: ``session`` (the segment, ring, slot table,
forwards in flight and control channel, and what may be done with them), which
``Client``, ``Forward``, ``Slot`` and ``weights`` (loading a layer) all go through.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .. import host
from .._abi import dlpack, ffi
from .._abi.ring import new_desc
from .._abi.shm import BackingChoice
from ..errors import (
    BadInput,
    Cancelled,
    ClientClosed,
    DataplaneFault,
    DuckLost,
    ForwardFailed,
    ForwardTimeout,
    StaleEpoch,
)
from ..schema import control as ctl
from ..schema.abi import MAX_DIMS, MAX_DUCKS, DescFlag, MlpKind, Op, Status
from ..schema.routing import MAX_TOKENS, MAX_TOPK
from . import routing as routing_table
from . import weights
from .models import Mlp, dtype_code, numpy_dtype
from .moe import MoeMlp, Routing, check_routing_arguments
from .session import Inflight, Session, WaitStrategy
from .slots import DEBUG_SLOTS_ENV, Slot, SlotState, claim_template

__all__ = ["Client", "Forward", "Slot", "SlotState", "WaitStrategy", "connect"]

# Bound on each per-client cache below (claim specs, descriptor templates): a model
# uses a handful of shapes; one feeding ever new shapes just starts them over.
_CACHE_MAX = 256
_OK = int(Status.OK)
_FORWARD = int(Op.FORWARD)
_MOE = int(MlpKind.MOE)
_CLAIMED = SlotState.CLAIMED
_F32 = np.dtype(np.float32)
#: moe_send= -> the descriptor's flags of a routed forward
MOE_SEND_FLAGS: dict[str, int] = {
    "auto": int(DescFlag.ROUTED),
    "broadcast": int(DescFlag.ROUTED | DescFlag.MOE_BROADCAST),
    "unicast": int(DescFlag.ROUTED | DescFlag.MOE_UNICAST),
}
#: the host routing table sits in the activation slot at the activation's bytes
#: rounded up to this (schema/routing.py)
ROUTING_ALIGN = 64


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
    dataplane's default); one above the dataplane's ``max_timeout_us`` is refused here
    (``BadInput``), not in every forward. The dataplane is declared lost when its
    process exits or its heartbeat is older than ``dataplane_timeout`` seconds.

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
        return host.default_control()
    if isinstance(control, str):
        return _checked_address(control)
    address = getattr(control, "control", None)
    if isinstance(address, str) and address:
        return _checked_address(address)
    raise BadInput(  # a DuckpipeError like every other: one family to catch
        f"connect() takes a control address such as 'ipc:///run/user/1000/duckpipe/control', "
        f"or an object with a .control address (duckpipe_mock, a Cluster), not "
        f"{type(control).__name__}"
    )


#: what a control address looks like: ZeroMQ's own words for the two transports the
#: dataplane serves (anything else fails inside libzmq with a bare EINVAL)
_ADDRESS = re.compile(r"(ipc://.+|tcp://.+:\d+)")


def _checked_address(address: str) -> str:
    """``address`` if it is an ipc:// or tcp:// endpoint; BadInput saying what one is."""
    if _ADDRESS.fullmatch(address):
        return address
    raise BadInput(
        f"{address!r} is not a control address: give the dataplane's `control` setting, "
        f"e.g. 'ipc://{host.default_control().removeprefix('ipc://')}' (a socket path) "
        "or 'tcp://HOST:PORT' (with CURVE keys); omit it for $DUCKPIPE_CONTROL or this "
        "user's default"
    )


def _check_forward_timeout(
    session: Session, att: ctl.Attached, forward_timeout: float | None
) -> None:
    """Refuse, at connect, a forward_timeout the dataplane would refuse in every forward
    (BAD_REQUEST): its limit is known only once attached. Detaches on the way out."""
    limit = att.max_timeout_us  # 0: a dataplane that does not say
    if forward_timeout is None or not limit or session.timeout_us <= limit:
        return
    session.close()
    raise BadInput(
        f"forward_timeout={forward_timeout:g} s is above this dataplane's max_timeout_us "
        f"({limit} us = {limit / 1e6:g} s): every forward would be refused. Ask for at "
        f"most {limit / 1e6:g} s, or raise max_timeout_us in the dataplane's topology"
    )


class _RoutedPlan:
    """What a routed submit of one layer, shape, dtype and send mode needs beyond its
    arguments, found by a first one that checked everything: the LayerInfo and MoE plan
    it was checked against, the routing's shape and index dtype, the C half
    (``struct dp_routed_submit``: the FORWARD template, the routing's sizes, room for a
    refusal's reason) and each slot's pointer to its table bytes (made on first use)."""

    __slots__ = ("at", "c", "gate_shape", "index_dtype", "info", "moe", "shape", "size", "tables")

    def __init__(
        self,
        session: Session,
        info: ctl.LayerInfo | None,
        tpl: object,
        moe: weights.MoeLayer,
        indices: np.ndarray,
        at: int,
        size: int,
    ) -> None:
        self.info, self.moe, self.at, self.size = info, moe, at, size
        self.shape, self.index_dtype = indices.shape, indices.dtype
        # the shape a gate's routing (Routing.of_gate: int32 ids) must have to go on this
        # plan; None when the plan's ids are int64, which a gate's never are
        self.gate_shape = indices.shape if indices.dtype == np.int32 else None
        c = self.c = ffi.new("struct dp_routed_submit *")
        c.tpl = tpl[0]  # type: ignore[index]
        c.table_len = size
        c.tokens, c.topk = indices.shape
        c.n_experts = moe.n_experts
        c.index_size = indices.itemsize
        self.tables: list[object] = [None] * session.segment.slot_count

    def table(self, session: Session, slot: int) -> object:
        """A cffi pointer to slot ``slot``'s table bytes (the segment outlives the plan:
        both are the session's)."""
        ptr = self.tables[slot]
        if ptr is None:
            view = session.segment.act_bytes(slot)[self.at : self.at + self.size]
            ptr = self.tables[slot] = ffi.from_buffer(view, require_writable=True)
        return ptr


class Forward:
    """A submitted forward. ``result()`` waits for it; ``release()`` frees its slot.

    The slot is also freed once the Forward is garbage collected and no array that
    ``result()`` returned (nor a view of one) is left: the arrays keep it alive.
    """

    __slots__ = ("__weakref__", "_rec", "_session")

    def __init__(self, session: Session, rec: Inflight) -> None:
        self._session = session
        self._rec = rec

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: one is made per forward, and a finalizer
        # costs microseconds to register; both run when the Forward is collected
        if not self._rec.released:  # (a `with` block released it: no call then)
            self._session.release_forward(self._rec)

    @property
    def id(self) -> int:
        return self._rec.forward_id

    @property
    def status(self) -> Status:
        """PENDING until a completion arrives (looks without waiting)."""
        rec = self._rec
        if rec.status is None:
            self._session.poll_once(rec)
        return Status(rec.status) if rec.status is not None else Status.PENDING

    def done(self) -> bool:
        return self.status != Status.PENDING

    @property
    def answered(self) -> tuple[int, ...]:
        """Ducks that answered (after the ZeroMQ completion is in)."""
        self._session.await_zmq(self._rec)
        return self._rec.answered

    @property
    def missing(self) -> tuple[int, ...]:
        """Ducks that did not answer."""
        self._session.await_zmq(self._rec)
        return self._rec.missing

    @property
    def timings(self) -> ctl.Timings:
        """Per-phase nanoseconds from the dataplane, each answering duck's compute listed;
        waits for the ZeroMQ completion (and asks the dataplane to send it at once)."""
        self._session.await_zmq(self._rec)
        return self._rec.timings or ctl.Timings()

    @property
    def phases(self) -> ctl.Phases:
        """The same per-phase nanoseconds, the ducks' compute as its max and sum, read from
        the slot header once the forward is done: no ZeroMQ. Waits for the forward as
        ``result()`` does (a failed one does not raise: its phases say how far it got).
        Read it before ``release()``; after, it comes from the ZeroMQ completion."""
        return self._session.phases(self._rec)

    def result(
        self, timeout: float | None = None, *, wait: WaitStrategy | None = None
    ) -> np.ndarray:
        """Wait for the completion and return the result, a view into the result slot.

        The view is valid until ``release()`` (or the end of a ``with`` block) frees
        the slot; a Forward that is just dropped frees it only once the view, and every
        view of it, is gone too (they keep the Forward alive). Raises
        ``WaitTimeout`` when ``timeout`` seconds pass first (the forward stays
        pending), ``DataplaneLost`` if the dataplane dies, and a
        ``ForwardFailed`` subclass when the forward completed with an error.
        """
        session, rec = self._session, self._rec
        if session.closed:  # check_usable's first check alone: result() needs no more
            raise ClientClosed("the client is closed; connect again")
        if rec.status is None:
            session.wait_done(rec, timeout, wait or session.wait)
        if rec.status != _OK:
            session.await_zmq(rec, 1.0)  # it carries the reason and the missing ducks
            raise _failure(rec)
        if rec.released:
            raise BadInput(f"forward {rec.forward_id} was released; its result slot is reused")
        # what Segment.res_view makes (claim checked that it fits the slot), on a base that
        # holds this Forward: the slot is not reused under the array. Both are views of a
        # template of the slot's last result shape (Session.result_template).
        t = session.result_last[rec.slot]
        if t is None or t[0] != rec.shape or t[1] is not rec.dtype:
            t = session.result_template(rec.slot, rec.shape, rec.dtype)
        base = t[2].view()
        base.owner = self
        return base.view(np.ndarray)

    def __dlpack__(self, **kwargs: object) -> object:
        """DLPack of ``result()`` (waiting for it as ``result()`` does):
        ``torch.from_dlpack(fwd)`` is a torch view of the result slot, bf16 too, valid
        while the Forward is (the view keeps it alive)."""
        return dlpack.Exported(self.result()).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.CPU_DEVICE

    def release(self) -> None:
        """Free the slot now (or as soon as the forward completes). Every 32nd forward or so
        the client also reads the ZeroMQ completions waiting for it here, after the result
        rather than between a submit and its result."""
        self._session.release_forward(self._rec, True)

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self._session.release_forward(self._rec, True)  # release(), one call fewer

    def __repr__(self) -> str:
        s = self._rec.status
        return f"<Forward {self.id} {Status(s).name if s is not None else 'PENDING'}>"


def _failure(rec: Inflight) -> ForwardFailed:
    missing = rec.missing
    detail = f": {rec.message}" if rec.message else ""
    if rec.moe is not None and missing:
        # a routed forward: which experts went missing with them, from the placement
        detail += f" (layer {rec.moe.layer}: {rec.moe.describe(missing)})"
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
        # The public face and its caches; the segment, ring, slots, forwards in flight and
        # control channel are the session's, which Slot and Forward hold too.
        if wait not in ("spin", "block", "hybrid"):
            raise BadInput(f"wait must be 'spin', 'block' or 'hybrid', not {wait!r}")
        # the dataplane refuses it too (ctl.Name): said here first, before a segment is made
        if len(name.encode()) > 63 or not re.search(ctl.PRINTABLE_ASCII, name):
            raise BadInput(
                f"name {name!r}: a client's name is at most 63 characters of printable ASCII "
                "(0x20-0x7e), since duckpipe-top, `duckpipe stats` and the logs show it"
            )
        self.control = control
        self._claim_timeout = claim_timeout
        # claim's checked (shape, dtype) are the session's (claim_specs): their templates
        # view the segment, which closes with the session
        # submit: (layer, shape, dtype) -> (the LayerInfo it was checked against, a
        # prepared FORWARD descriptor). Used only while that very LayerInfo is the one in
        # the session's layers: layers(), load_weights and unload_layer replace or drop
        # it, which invalidates the entry without anyone having to remember to.
        self._templates: dict[tuple, tuple[ctl.LayerInfo, object]] = {}
        # routed submits: (layer, shape, dtype, moe_send) -> what _submit_routed found
        # the first time (_RoutedPlan: for one routing shape and index dtype), under the
        # same rule as _templates
        self._routed: dict[tuple, _RoutedPlan] = {}
        self._session = session = Session(
            control,
            slots=slots,
            slot_size=slot_size,
            result_slot_size=result_slot_size,
            backing=backing,
            wait=wait,
            spin_us=spin_us,
            forward_timeout=forward_timeout,
            dataplane_timeout=dataplane_timeout,
            tag=name or "client",
            debug_slots=debug_slots,
        )
        self.counters = session.counters
        att = session.attach(name, timeout)
        self.client_id = att.client_id
        self.mode = att.mode
        _check_forward_timeout(session, att, forward_timeout)

    # --- public API -----------------------------------------------------------

    @property
    def wait(self) -> WaitStrategy:
        """How ``Forward.result`` waits when not told: 'spin', 'block' or 'hybrid'."""
        return self._session.wait

    @wait.setter
    def wait(self, wait: WaitStrategy) -> None:
        self._session.wait = wait

    @property
    def epoch(self) -> int:
        """The dataplane's epoch as this client last heard it; new forwards carry it."""
        return self._session.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._session.epoch = epoch

    @property
    def segment(self) -> Path:
        """This client's shared-memory segment as /proc/<pid>/fd/<fd> (a sealed memfd)."""
        return self._session.segment.path

    @property
    def segment_name(self) -> str:
        """The memfd's name, as ``duckpipe shm ls`` and the dataplane's stats show it."""
        return self._session.segment.name

    @property
    def backing(self) -> str:
        return self._session.segment.backing.name.lower()

    @property
    def slot_count(self) -> int:
        return self._session.segment.slot_count

    @property
    def slot_size(self) -> int:
        return self._session.segment.act_slot_size

    def topology(self) -> ctl.Topology:
        """The NICs and ducks the dataplane drives."""
        return self._session.request(lambda rid: ctl.GetTopology(req_id=rid))  # type: ignore[return-value]

    def layers(self) -> list[ctl.LayerInfo]:
        """Layers the dataplane holds weights for."""
        return self._session.refresh_layers()

    def stats(self) -> ctl.Stats:
        """The dataplane's counters."""
        return self._session.request(lambda rid: ctl.GetStats(req_id=rid))  # type: ignore[return-value]

    def set_epoch(self, epoch: int | None = None) -> int:
        """Move the dataplane to ``epoch`` (default: the next); returns the new epoch."""
        session = self._session
        reply = session.request(lambda rid: ctl.SetEpoch(req_id=rid, epoch=epoch))
        assert isinstance(reply, ctl.EpochChanged)
        session.epoch = reply.epoch
        return reply.epoch

    def claim(
        self, shape: int | Sequence[int], dtype=np.float32, *, timeout: float | None = None
    ) -> Slot:
        """Claim a free slot for an activation of ``shape`` and ``dtype``.

        Waits up to ``timeout`` (default: the client's ``claim_timeout``) for a
        slot to free up, then raises ``RingFull``.
        """
        session = self._session
        # session.check_usable, inlined (it says why when one of these fails)
        hdr = session.segment.header
        if session.closed or session.lost is not None or (hdr is not None and hdr.detach_reason):
            session.check_usable()
        try:
            shape_t, dt, templates = session.claim_specs[shape, dtype]
        except (KeyError, TypeError):  # a new shape or dtype, or an unhashable shape
            shape_t, dt, templates = self._claim_spec(shape, dtype)
        slots = session.slots
        free = slots.free
        if free and slots.guard is None:
            # SlotTable.take when a slot is free (and no debug guard), inlined (one method
            # call would cost ~700 instructions a claim; slots.py says so): keep alike
            i = free.pop()
            gen = slots.generation[i] = (slots.generation[i] + 1) & 0xFFFF_FFFF or 1
            slots.state[i] = _CLAIMED
        else:
            timeout = self._claim_timeout if timeout is None else timeout
            i = slots.take(timeout, session.wait_for_slot)
            gen = slots.generation[i]
        # A new array each claim: the caller owns it and may reshape it in place. Its base
        # gives the slot back once this claim's handle and arrays are all dropped
        # unsubmitted (slots.ClaimBase): a forgotten claim does not leak. Both are views of
        # the slot's template for this shape (slots.claim_template): no buffer parsed.
        base = templates[i]
        if base is None:
            base = templates[i] = claim_template(session, i, shape_t, dt)
        base = base.view()
        base.claim = (session, i, gen)
        return Slot(session, i, gen, base.view(np.ndarray))

    def _claim_spec(
        self, shape: int | Sequence[int], dtype
    ) -> tuple[tuple[int, ...], np.dtype, list]:
        """Check a claim's shape and dtype; remember the result when they are hashable,
        with a list for the slots' templates of it (``slots.claim_template``)."""
        shape_t = _normalise_shape(shape)
        dt = np.dtype(dlpack.from_torch_dtype(dtype))
        dtype_code(dt)
        # math.prod: exact, where np.prod of a tuple is slow and wraps past 2**63
        nbytes = math.prod(shape_t) * dt.itemsize
        session = self._session
        max_bytes, res_slot_size = session.max_bytes, session.segment.res_slot_size
        if nbytes > max_bytes or nbytes > res_slot_size:
            raise BadInput(
                f"an activation of {nbytes} bytes does not fit a slot of {max_bytes} bytes "
                f"(result slots {res_slot_size}); connect with a larger slot_size "
                "(the dataplane's max_forward_bytes caps it too)"
            )
        spec = (shape_t, dt, [None] * session.segment.slot_count)
        specs = session.claim_specs
        if len(specs) >= _CACHE_MAX:
            specs.clear()
        try:
            specs[shape, dtype] = spec
        except TypeError:
            pass  # an unhashable shape (a list, an array): checked again next time
        return spec

    def submit(
        self,
        slot: Slot,
        layer: int,
        *,
        ducks: Iterable[int] | None = None,
        routing: tuple[np.ndarray, np.ndarray] | None = None,
        moe_send: str = "auto",
    ) -> Forward:
        """Hand a filled slot to the dataplane to run ``layer`` on it.

        ``ducks`` restricts the forward to a subset of the ducks holding the
        layer (their partials are summed); default: all of them.

        A mixture-of-experts layer needs ``routing=(indices, weights)``, the gate's
        ``[tokens, topk]`` expert ids and weights for the slot's ``[tokens, hidden]``
        rows; they are checked by the dataplane's own rule as they are packed into the
        slot behind the activation (``duckpipe.moe.check_routing`` is that check alone),
        so the slot needs room for both. ``moe_send`` is how the dataplane sends the rows:
        ``"auto"`` (whichever puts fewer bytes on the wire), ``"broadcast"`` (all rows and
        the whole table once per NIC) or ``"unicast"`` (each routed duck only its rows). A
        dense layer refuses ``routing``.
        """
        session = self._session
        # session.check_usable, inlined (it says why when one of these fails)
        hdr = session.segment.header
        if session.closed or session.lost is not None or (hdr is not None and hdr.detach_reason):
            session.check_usable()
        # session.holds without its closed check: the line above made it
        arr = session.slots.claimed_array(slot)
        if arr is None:
            raise BadInput(
                f"{slot!r} is not claimed by this client (already submitted or released)"
            )
        shape, dtype = arr.shape, arr.dtype
        if routing is not None or moe_send != "auto":
            # A routing a plan was made for (_RoutedPlan) goes on it: a pair of numpy
            # arrays of the shape and dtypes an earlier submit of this layer, shape, dtype
            # and send mode checked (a gate's: int32 or int64 ids, float32 weights),
            # C-contiguous, the layer unchanged since. The checks of the arguments held
            # then and hold now; what is left is the C rule, which judges every entry in
            # the one call into C that publishes (Session.push_routed), as a dense
            # submit's push is one. Here rather than in _submit_routed: a call fewer.
            if ducks is None and isinstance(routing, tuple) and len(routing) == 2:
                try:
                    plan = self._routed.get((layer, shape, dtype, moe_send))
                except TypeError:  # an unhashable moe_send: _submit_routed refuses it
                    plan = None
                if (
                    plan is not None
                    and session.layers.get(layer) is plan.info
                    and session.moe.get(layer) is plan.moe
                ):
                    i = slot.index
                    gate = routing._c if type(routing) is Routing else None
                    if gate is not None and gate[0] == plan.gate_shape:
                        # a gate's routing (Routing.of_gate): its arrays' pointers, made
                        # with them, and their form the gate's (int32, float32, C order)
                        return Forward(session, session.push_routed(
                            plan.c, plan.moe, i, shape, dtype, gate[1], gate[2],
                            plan.tables[i] or plan.table(session, i)))  # fmt: skip
                    indices, weights_ = routing
                    if (
                        type(indices) is type(weights_) is np.ndarray
                        and indices.dtype is plan.index_dtype
                        and weights_.dtype is _F32
                        and indices.shape == weights_.shape == plan.shape
                    ):
                        try:
                            # a buffer without strides (PyBUF_SIMPLE): numpy gives one only
                            # of a C-contiguous array, so each holds tokens x topk items
                            idx, w = ffi.from_buffer(indices), ffi.from_buffer(weights_)
                        except ValueError:  # not C-contiguous: _submit_routed copies it
                            pass
                        else:
                            return Forward(session, session.push_routed(
                                plan.c, plan.moe, i, shape, dtype, idx, w,
                                plan.tables[i] or plan.table(session, i)))  # fmt: skip
            return self._submit_routed(slot, arr, layer, ducks, routing, moe_send)
        tpl = None
        if ducks is None:
            # A descriptor prepared by an earlier submit of this layer, shape and dtype,
            # while the LayerInfo it was checked against is still the current one.
            try:
                info, tpl = self._templates[layer, shape, dtype]
            except (KeyError, TypeError):
                pass
            else:
                if session.layers.get(layer) is not info:
                    tpl = None
        if tpl is None:
            tpl = self._forward_template(layer, arr, ducks)
        return Forward(session, session.push(tpl, _FORWARD, slot.index, shape, dtype))

    def _submit_routed(
        self,
        slot: Slot,
        arr: np.ndarray,
        layer: int,
        ducks: Iterable[int] | None,
        routing: tuple[np.ndarray, np.ndarray] | None,
        moe_send: str,
    ) -> Forward:
        """Check the routing, pack it into the slot behind the activation and submit a
        ROUTED forward; every refusal is a BadInput before anything is published. Leaves
        a plan (``_RoutedPlan``) that ``submit`` takes the next such routing on."""
        session = self._session
        flags, moe, indices, weights_ = self._routed_arguments(arr, layer, ducks, routing, moe_send)
        key = (layer, arr.shape, arr.dtype, flags)
        try:
            cached, tpl = self._templates[key]
        except (KeyError, TypeError):
            tpl = None
        else:
            if session.layers.get(layer) is not cached:
                tpl = None
        if tpl is None:
            tpl = self._forward_template(layer, arr, None, flags)
        check_routing_arguments(arr, indices, weights_, moe.n_experts)
        tokens, topk = indices.shape
        nbytes = arr.nbytes
        at = -(-nbytes // ROUTING_ALIGN) * ROUTING_ALIGN
        size = routing_table.table_size(tokens, topk)
        slot_size = session.segment.act_slot_size
        if at + size > slot_size:
            raise BadInput(
                f"a routed forward of {tokens} tokens by {topk} experts needs {at + size} bytes "
                f"of slot ({nbytes} of activation, then its routing table of {size} at byte "
                f"{at}), and this client's slots have {slot_size}: connect(slot_size=...) with "
                f"at least {at + size}"
            )
        # one duck's message (the largest wire table the dataplane could make, then the
        # rows) is what it reassembles: held to max_forward_bytes (dp_desc_routed_bytes);
        # the sum of a unicast's messages is not, they go out from the slot in place
        message = 16 + 8 * (MAX_DUCKS + tokens * topk) + nbytes
        cap = session.max_forward_bytes
        if cap and message > cap:
            raise BadInput(
                f"a routed forward of {tokens} tokens by {topk} experts sends a duck up to "
                f"{message} bytes in one message ({nbytes} of activation and the routing), "
                f"over the dataplane's max_forward_bytes {cap}: send fewer tokens per forward"
            )
        idx, w = routing_table.as_routing(indices, weights_)  # converted when not a gate's
        plan = _RoutedPlan(session, session.layers.get(layer), tpl, moe, idx, at, size)
        rec = session.push_routed(plan.c, moe, slot.index, arr.shape, arr.dtype,
                                  ffi.from_buffer(idx), ffi.from_buffer(w),
                                  plan.table(session, slot.index))  # fmt: skip
        # kept for the next submit when its fast path can take these very arguments: a
        # pair of numpy arrays, as a gate gives (a torch tensor's view is made per call)
        if isinstance(routing, tuple) and routing_table.packable(*routing):
            plans = self._routed
            if len(plans) >= _CACHE_MAX:
                plans.clear()
            plans[layer, arr.shape, arr.dtype, moe_send] = plan
        return Forward(session, rec)

    def _routed_arguments(
        self,
        arr: np.ndarray,
        layer: int,
        ducks: Iterable[int] | None,
        routing: tuple[np.ndarray, np.ndarray] | None,
        moe_send: str,
    ) -> tuple[int, weights.MoeLayer, np.ndarray, np.ndarray]:
        """A routed forward's arguments, the parts that do not depend on its rows:
        ``(flags, the layer's MoE plan, indices, weights)``, or BadInput."""
        session = self._session
        flags = MOE_SEND_FLAGS.get(moe_send) if isinstance(moe_send, str) else None
        if flags is None:
            raise BadInput(f"moe_send must be 'auto', 'broadcast' or 'unicast', not {moe_send!r}")
        if routing is None:
            raise BadInput(
                f"moe_send={moe_send!r} says how to send a routed forward; pass its "
                "routing=(indices, weights) too"
            )
        if ducks is not None:
            raise BadInput(
                "a routed forward goes to the ducks its routing names: pass routing= or "
                "ducks=, not both"
            )
        if not isinstance(routing, tuple | list) or len(routing) != 2:
            raise BadInput(
                "routing must be a pair (indices, weights), the gate's [tokens, topk] expert "
                f"ids and weights, not {type(routing).__name__}"
            )
        indices = _host(routing[0], "routing indices")
        weights_ = _host(routing[1], "routing weights")
        info = session.layer_info(layer)
        if info.kind != _MOE:
            raise BadInput(
                f"layer {layer} is dense: routing is only for mixture-of-experts layers; "
                "call submit without routing="
            )
        moe = session.moe.get(layer)
        if moe is None or (moe.info is not None and moe.info is not info):
            # a layer another client loaded (a shared one: layer_info refused the rest):
            # its LayerInfo carries the placement; rebuilt when a newer one arrives
            moe = weights.moe_view(info)
            if moe is not None:
                session.moe[layer] = moe
        if moe is None:
            raise BadInput(
                f"layer {layer} is a mixture of experts this client did not load, so it does "
                "not know its experts to check a routing against; forward on it from the "
                "client that loaded it"
            )
        return flags, moe, indices, weights_

    def _forward_template(
        self, layer: int, arr: np.ndarray, ducks: Iterable[int] | None, flags: int = 0
    ):
        """Check ``arr`` against ``layer`` and prepare the FORWARD descriptor submitting
        it; every field but the per-forward ones (``Session.push``). Kept in
        ``_templates`` when the forward goes to every duck of the layer. ``flags``: a
        routed forward's (DescFlag), whose routing ``_submit_routed`` checks."""
        session = self._session
        info = session.layer_info(layer)
        if info.kind == _MOE and not flags:
            raise BadInput(
                f"layer {layer} is a mixture of experts: the forward needs its routing, "
                "routing=(indices, weights) from the layer's gate"
            )
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
        d.flags = flags
        d.timeout_us = session.timeout_us
        if ducks is None:
            templates = self._templates
            if len(templates) >= _CACHE_MAX:
                templates.clear()
            key = (layer, arr.shape, arr.dtype, flags) if flags else (layer, arr.shape, arr.dtype)
            templates[key] = (info, d)
        return d

    def forward(
        self,
        layer: int,
        x: np.ndarray,
        *,
        ducks: Iterable[int] | None = None,
        timeout: float | None = None,
        routing: tuple[np.ndarray, np.ndarray] | None = None,
        moe_send: str = "auto",
    ) -> np.ndarray:
        """Claim, copy ``x`` in once, submit, wait; returns a copy of the result.

        ``routing`` and ``moe_send``: a mixture-of-experts layer's, as in ``submit``.
        An empty batch (``x`` of 0 rows, and routing of 0 rows) is checked as any forward
        and answered here with an empty result of ``x``'s shape and dtype: no slot, no
        descriptor, nothing sent (``claim`` refuses 0 rows, so ``submit`` never sees one)."""
        given, x = x, np.asarray(_host(x, "x"))
        if x.ndim and x.shape[0] == 0:
            return dlpack.like(self._forward_empty(layer, x, ducks, routing, moe_send), given)
        rows = self._rows_per_forward(x, routing) if x.ndim >= 2 else 1
        if x.ndim >= 2 and rows < x.shape[0]:
            return dlpack.like(self._forward_in_parts(layer, x, rows, ducks, timeout, routing,
                                                      moe_send), given)  # fmt: skip
        with self.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x  # the same shape and dtype: np.copyto's work, in fewer steps
            fwd = self.submit(slot, layer, ducks=ducks, routing=routing, moe_send=moe_send)
        with fwd:
            return dlpack.like(fwd.result(timeout).copy(), given)

    def _rows_per_forward(
        self, x: np.ndarray, routing: tuple[np.ndarray, np.ndarray] | None
    ) -> int:
        """The most rows of ``x`` (rows first) one forward of this client takes: its slots
        (the activation, and a routed forward's table behind it), the result slots, the
        dataplane's max_forward_bytes (a routed duck's whole message) and a routed forward's
        MAX_TOKENS. ``x.shape[0]`` when all of them fit, or when a row alone does not (the
        forward then says why) or the routing is not a pair of arrays (submit says so)."""
        n = x.shape[0]
        row = x.nbytes // n
        session = self._session
        seg = session.segment
        cap = min(session.max_bytes, seg.res_slot_size)
        if routing is None:
            fit = cap // row
        else:
            if not isinstance(routing, tuple | list) or len(routing) != 2:
                return n
            shape = getattr(routing[0], "shape", ())
            if len(shape) != 2 or shape[0] != n or shape[1] < 1:
                return n
            topk = int(shape[1])
            fit = min(cap // row, MAX_TOKENS)
            most = session.max_forward_bytes

            def fits(k: int) -> bool:
                at = -(-k * row // ROUTING_ALIGN) * ROUTING_ALIGN
                if at + routing_table.table_size(k, topk) > seg.act_slot_size:
                    return False
                return not most or 16 + 8 * (MAX_DUCKS + k * topk) + k * row <= most

            if n <= fit and fits(n):
                return n  # the common case, checked once
            while fit > 0 and not fits(fit):  # a few steps: the table is ~1/100 of the rows
                fit -= max(1, fit // 64)
        return n if fit < 1 or fit >= n else int(fit)

    def _forward_in_parts(
        self,
        layer: int,
        x: np.ndarray,
        rows: int,
        ducks: Iterable[int] | None,
        timeout: float | None,
        routing: tuple[np.ndarray, np.ndarray] | None,
        moe_send: str,
    ) -> np.ndarray:
        """``forward`` of more rows than one forward takes (``_rows_per_forward``): as
        forwards of ``rows`` consecutive rows each, several in flight over the client's
        slots, the results written into one array. A layer's rows are independent (an MLP
        row by row, a routed token by its own experts), so the result is the one forward's.
        The first failure is raised; the forwards still in flight are released."""
        out = np.empty(x.shape, x.dtype)
        # a few in flight keep the ducks busy while the next rows go out; more would only
        # queue (the duck emulator reassembles 8 messages per duck at once: past that it
        # evicts the oldest, which a NACK then sends again)
        depth = max(1, min(self._session.segment.slot_count // 2, 4))
        pending: list[tuple[int, int, Forward]] = []
        try:
            for start in range(0, x.shape[0], rows):
                stop = min(start + rows, x.shape[0])
                if len(pending) >= depth:
                    a, b, fwd = pending.pop(0)
                    with fwd:
                        out[a:b] = fwd.result(timeout)
                part = None if routing is None else (routing[0][start:stop], routing[1][start:stop])
                with self.claim(x[start:stop].shape, x.dtype) as slot:
                    slot.array[...] = x[start:stop]
                    fwd = self.submit(slot, layer, ducks=ducks, routing=part, moe_send=moe_send)
                pending.append((start, stop, fwd))
            while pending:
                a, b, fwd = pending.pop(0)
                with fwd:
                    out[a:b] = fwd.result(timeout)
        finally:
            for _, _, fwd in pending:
                fwd.release()
        return out

    def _forward_empty(
        self,
        layer: int,
        x: np.ndarray,
        ducks: Iterable[int] | None,
        routing: tuple[np.ndarray, np.ndarray] | None,
        moe_send: str,
    ) -> np.ndarray:
        """``forward`` of 0 rows: what a forward of them would be refused for (the layer,
        dtype, hidden size, ducks, the routing's shape and topk) is refused alike; then the
        empty result, with nothing sent. Rows multiply everything a forward moves, so 0
        rows is an empty answer, as torch and DeepEP give for an empty batch."""
        self._session.check_usable()
        if any(n <= 0 for n in x.shape[1:]) or x.ndim > MAX_DIMS:
            raise BadInput(
                f"shape {x.shape}: past its 0 rows it must have 1 to {MAX_DIMS} positive dimensions"
            )
        flags = 0
        if routing is not None or moe_send != "auto":
            flags, moe, indices, weights_ = self._routed_arguments(
                x, layer, ducks, routing, moe_send
            )
            check_routing_arguments(x, indices, weights_, moe.n_experts)
            topk = indices.shape[1]
            if topk > min(MAX_TOPK, moe.n_experts):
                raise BadInput(
                    f"a token is routed to 1..{min(MAX_TOPK, moe.n_experts)} experts of layer "
                    f"{layer}, got topk {topk}"
                )
        self._forward_template(layer, x, ducks, flags)  # the dense checks; sent never
        return np.empty(x.shape, x.dtype)

    def unload_layer(self, layer: int) -> None:
        """Free a layer this client loaded; forwards already submitted on it finish first."""
        session = self._session
        session.check_usable()
        session.request(lambda rid: ctl.UnloadLayer(req_id=rid, layer=layer))
        session.layers.pop(layer, None)
        session.moe.pop(layer, None)
        session.loaded.pop(layer, None)

    def load_weights(
        self,
        layer: int,
        mlp: Mlp | MoeMlp,
        *,
        ducks: Sequence[int] | None = None,
        placement: Sequence[int | Sequence[int]] | None = None,
        progress: bool | None = None,
        timeout: float = 60.0,
        shared: bool = False,
    ) -> ctl.LayerInfo:
        """Shard ``mlp`` over ``ducks`` (default: every duck) and load it as ``layer``.

        A ``MoeMlp`` (mixture of experts) is placed by ``placement``: one item per
        expert, a duck id or a sequence of duck ids (its replicas, 1..8 distinct ducks);
        default: contiguous blocks, expert ``e`` on ``ducks[e * len(ducks) // n_experts]``.
        Without ``ducks`` the layer lives on the ducks the placement names (every duck
        for the default one). Its shared expert, if any, is cut by columns, like a dense
        layer, over ``MoeMlp.shared_ducks`` (default: as few ducks as the bank limit
        needs, one per NIC); a token reaches its routed ducks and those. Forwards on it
        then need ``routing=``.

        The layer is this client's: other clients cannot use or replace it, and it is
        freed when this client closes or dies. ``shared=True`` lets every client use it;
        only the dataplane's own user (the admin) may load shared layers.

        The shards travel through this client's shared-memory slots, never over
        ZeroMQ. A progress bar is drawn on stderr when it is a terminal
        (``progress`` forces it on or off).

        The client keeps a reference to ``mlp`` (not a copy) until the layer is
        unloaded or replaced, so that :meth:`repair` can cut a lost duck's bank again:
        do not change its arrays in place while the layer is loaded.
        """
        return weights.load_weights(
            self._session,
            layer,
            mlp,
            ducks=ducks,
            progress=progress,
            timeout=timeout,
            shared=shared,
            placement=placement,
        )

    def repair(
        self, layer: int, *, progress: bool | None = None, timeout: float = 60.0
    ) -> ctl.LayerInfo:
        """Give the ducks that lost ``layer`` (they restarted: ``LayerInfo.lost``, and
        forwards that need them raise ``DuckLost``) their banks again, without
        reloading the layer: only those ducks' banks (a MoE duck's experts and its
        shard of the shared expert; a dense duck's shard) are cut from the model this
        client loaded and streamed through its slots, like a load's. Forwards that need
        only the other ducks go on meanwhile, from this client and others (this call
        returns when the repair is committed; the Client is not thread-safe, so this
        client's own forwards wait for it). The repaired ducks serve again only once
        every byte of their banks is acknowledged; the returned LayerInfo shows the
        layer ready. Nothing is sent when no duck lost it.

        Only the client that loaded the layer can repair it (it holds the model).
        ``DataplaneFault`` when a duck does not acknowledge its bank: it stays lost and
        the layer serves on the others; call again once it answers.
        """
        return weights.repair(self._session, layer, progress=progress, timeout=timeout)

    def close(self) -> None:
        """Detach from the dataplane and close this client's segment."""
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.client_id} {self.control} {self._session.segment!r}>"


def _normalise_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    try:
        t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise BadInput(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if 1 <= len(t) <= MAX_DIMS and t[0] == 0 and all(n > 0 for n in t[1:]):
        raise BadInput(
            f"shape {t} has 0 rows, and a slot holds 1 to {MAX_DIMS} positive dimensions: an "
            "empty batch needs no slot; Client.forward returns its empty result without "
            "sending anything"
        )
    if not 1 <= len(t) <= MAX_DIMS or any(n <= 0 for n in t):
        raise BadInput(f"shape {t} must have 1 to {MAX_DIMS} positive dimensions")
    return t


def _host(x: object, what: str) -> object:
    """A torch tensor or another DLPack producer as a numpy view of its memory (no copy);
    anything else as it is, for the caller's checks. BadInput when a tensor cannot be read
    from the host."""
    try:
        return dlpack.as_array(x)
    except TypeError as e:
        raise BadInput(f"{what}: {e}") from None
