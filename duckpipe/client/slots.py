"""The slot table: which of a client's slots are free, and each one's generation.

A slot goes free -> claimed (the client writes the activation) -> submitted (the
dataplane may read it and write the result) -> completed (the client reads the
result) -> free. Each claim bumps the slot's generation, so that a completion
meant for an earlier use of the slot is recognised and dropped.

``Slot`` is the public handle to a claimed slot; the table itself is the
session's bookkeeping (``session.Session.slots``).

A handle outlives its claim, and slots are reused last-in-first-out: a write through
an old handle would land in the next forward's activation. ``Slot.array`` therefore
raises once the slot was submitted or released, and ``submit`` checks the handle's
generation. An array taken from a handle earlier cannot be stopped that way; the debug
mode can: ``connect(debug_slots=True)`` or ``DUCKPIPE_DEBUG_SLOTS=1`` write-protects
(mprotect) the client's mapping of every activation slot it holds free, so a stale
write faults (SIGSEGV) on the line that made it (``python -X faulthandler`` prints
that line). Only activation slots, only in this process: the dataplane's own mapping,
and the result slots it writes, are untouched.
"""

from __future__ import annotations

import ctypes
import enum
import mmap
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .._abi import dlpack
from ..errors import BadInput, RingFull

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "DEBUG_SLOTS_ENV",
    "ClaimBase",
    "Slot",
    "SlotGuard",
    "SlotState",
    "SlotTable",
    "claim_template",
]

#: Set to 1 to write-protect released activation slots in every client (debug mode).
DEBUG_SLOTS_ENV = "DUCKPIPE_DEBUG_SLOTS"


class SlotState(enum.IntEnum):
    FREE = 0
    CLAIMED = 1  # the client writes the activation
    SUBMITTED = 2  # the dataplane may read the activation and write the result
    COMPLETED = 3  # the client reads the result


# States are these members: `is` compares them cheapest, and a module global is read
# in a few instructions where SlotState.CLAIMED goes through the enum's metaclass (~1,000
# instructions a lookup on Python 3.11, twice a forward).
_FREE = SlotState.FREE
_CLAIMED = SlotState.CLAIMED


class SlotTable:
    """The state and generation of every slot, and the free ones in reuse order."""

    __slots__ = ("free", "generation", "guard", "state")

    def __init__(self, count: int, guard: SlotGuard | None = None) -> None:
        self.generation = [0] * count
        self.state = [_FREE] * count
        self.free = list(range(count - 1, -1, -1))  # LIFO: slot 0 first, hottest reused
        self.guard = guard  # debug mode: free slots are write-protected
        if guard is not None:
            for i in self.free:
                guard.protect(i)

    def take(self, timeout: float, wait: Callable[[float], None]) -> int:
        """Claim a free slot and return its index.

        While none is free, ``wait(seconds_left)`` is called to take in the
        completions that free one; ``RingFull`` after ``timeout`` seconds.
        """
        if not self.free:
            deadline = time.monotonic() + timeout
            while not self.free:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RingFull(self._full_message(timeout))
                wait(left)
        # Client.claim does the same inline when a slot is free and there is no guard: a
        # call to this method costs ~700 instructions more a claim (callgrind), ~1.4 % of a
        # forward. Keep the two alike
        i = self.free.pop()
        if self.guard is not None:
            self.guard.unprotect(i)
        # 32 bits, the done word's high half; never 0, which a done word not yet written holds
        self.generation[i] = (self.generation[i] + 1) & 0xFFFF_FFFF or 1
        self.state[i] = _CLAIMED
        return i

    def _full_message(self, timeout: float) -> str:
        """Why no slot freed: which uses hold them, claims first (a claim never submitted
        nor released holds its slot until its handle and arrays are gone)."""
        held = {st: [i for i, s in enumerate(self.state) if s == st] for st in SlotState}
        claimed, done = held[SlotState.CLAIMED], held[SlotState.COMPLETED]
        inflight = len(held[SlotState.SUBMITTED])
        parts = []
        if claimed:
            shown = ", ".join(map(str, claimed[:8])) + (", ..." if len(claimed) > 8 else "")
            parts.append(
                f"{len(claimed)} claimed and neither submitted nor released (slots "
                f"[{shown}]: Slot.release(), `with client.claim(...)`, or drop every "
                "handle and array of them)"
            )
        if done:
            parts.append(
                f"{len(done)} completed forwards not released (Forward.release(), "
                "or drop them and their results)"
            )
        if inflight:
            parts.append(f"{inflight} forwards in flight")
        return (
            f"all {len(self.state)} slots stayed in use for {timeout:g} s: "
            + "; ".join(parts)
            + "; or connect with more slots"
        )

    def claimed_array(self, slot: Slot) -> np.ndarray | None:
        """``slot``'s activation array while the handle is a live claim in this table (the
        slot claimed, by the use the handle names); None for a stale or foreign handle."""
        i = slot.index
        if slot._table is not self or self.state[i] is not _CLAIMED:
            return None
        return slot._array if self.generation[i] == slot.generation else None

    def release(self, i: int) -> None:
        self.state[i] = _FREE
        self.free.append(i)
        if self.guard is not None:
            self.guard.protect(i)


class SlotGuard:
    """Write-protects activation slots in this process's mapping (the debug mode).

    Slots are whole 4 KiB pages (the segment plan aligns them), so each one can be made
    read-only on its own; a hugepage mapping cannot (2 MiB granules): the debug mode
    needs small pages."""

    __slots__ = ("_addrs", "_mprotect", "_size")

    def __init__(self, slot_addrs: list[int], slot_size: int) -> None:
        page = mmap.PAGESIZE
        if slot_size % page or any(a % page for a in slot_addrs):
            raise BadInput("debug_slots needs page-aligned activation slots (small pages)")
        self._addrs = slot_addrs
        self._size = slot_size
        libc = ctypes.CDLL(None, use_errno=True)
        self._mprotect = libc.mprotect
        self._mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        self._mprotect.restype = ctypes.c_int

    def _set(self, i: int, prot: int) -> None:
        if self._mprotect(self._addrs[i], self._size, prot) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mprotect of activation slot {i}: {os.strerror(err)}")

    def protect(self, i: int) -> None:
        self._set(i, mmap.PROT_READ)

    def unprotect(self, i: int) -> None:
        self._set(i, mmap.PROT_READ | mmap.PROT_WRITE)


class ClaimBase(np.ndarray):
    """A byte view of one activation slot holding the claim its arrays were made for.

    ``Client.claim`` builds ``Slot.array`` on a fresh one of these naming the claim
    (``claim``: session, slot, generation): once the Slot handle and every array and
    view of the claim are gone, so is this base, and it gives the slot back if that
    claim is still unsubmitted (never submitted nor released), as a dropped Forward frees
    its slot. The array's base holds the claim, not the Slot: the Slot holds the array,
    and a cycle would wait for the garbage collector. A subclass for the reason
    ``session.ResultBase`` is one: numpy keeps a view of it as the new array's base
    instead of walking past it.

    ``claim`` is a slot, not an instance dict (one fewer object a claim); it is never set
    on the per-slot byte views (``Session.act_bases``) nor on the templates claims are
    viewed from (``claim_template``)."""

    __slots__ = ("claim",)

    def __del__(self) -> None:
        try:
            session, i, generation = self.claim
        except AttributeError:
            return  # a template: no claim of its own
        # still this claim's (the slot claimed, by this use)? Inline: it runs once a forward
        slots = session.slots
        if slots.state[i] is _CLAIMED and slots.generation[i] == generation and not session.closed:
            slots.release(i)


def claim_template(session: Session, i: int, shape: tuple[int, ...], dtype: np.dtype) -> ClaimBase:
    """Slot ``i``'s activation as ``shape`` and ``dtype``, a ClaimBase holding no claim.
    ``Client.claim`` keeps one per slot and claim spec (``Session.claim_specs``) and
    views each claim's base from it, then the claim's array from that base: two views,
    cheaper than an array made on a buffer. The claim's base, a view of this ClaimBase,
    has a ClaimBase for its own base, so numpy keeps it as the array's base rather than
    walking past it."""
    return np.ndarray(shape, dtype, session.act_bases[i]).view(ClaimBase)


class Slot:
    """A claimed slot. Write the activation into ``array`` (a view of shared memory).

    ``array`` is there while the slot is claimed: once it was submitted or released,
    the memory is the dataplane's or the next claim's, and ``array`` raises
    ``BadInput``. As a context manager it is released when the block raises, or when
    it ends without the slot having been submitted. Dropped unsubmitted, with every
    array of it, it is released too (``ClaimBase``).
    """

    __slots__ = ("_array", "_session", "_table", "generation", "index")

    def __init__(self, session: Session, index: int, generation: int, array: np.ndarray) -> None:
        self._session = session
        self._table = session.slots
        self.index = index
        self.generation = generation
        self._array = array

    @property
    def array(self) -> np.ndarray:
        """The activation, a numpy view of the slot: write it before ``submit``."""
        t = self._table
        i = self.index
        if t.state[i] is not _CLAIMED or t.generation[i] != self.generation:
            raise BadInput(self._stale())
        return self._array

    def _stale(self) -> str:
        t = self._table
        i = self.index
        if t.generation[i] != self.generation:
            what = f"released, and claimed again (generation {t.generation[i]})"
        elif t.state[i] is _FREE:
            what = "released"
        else:
            what = "submitted: the dataplane reads it"
        return (
            f"slot {i} (generation {self.generation}) was {what}; this handle is stale: "
            "claim a new slot (Client.claim) for the next activation"
        )

    def release(self) -> None:
        """Give the slot back without submitting it."""
        self._session.release_claim(self)

    def __dlpack__(self, **kwargs: object) -> object:
        """DLPack of ``array``: ``torch.from_dlpack(slot)`` is a writable torch view of the
        slot (bf16 and float8 too), to fill before ``submit``."""
        return dlpack.Exported(self.array).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.CPU_DEVICE

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # session.holds, inlined (this runs once a forward): still this claim, unsubmitted
        t = self._table
        i = self.index
        if t.state[i] is _CLAIMED and t.generation[i] == self.generation:
            session = self._session
            if not session.closed:
                session.release_claim(self)

    def __repr__(self) -> str:
        a = self._array
        return f"<Slot {self.index} gen {self.generation} {a.dtype}{list(a.shape)}>"
