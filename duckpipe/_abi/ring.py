"""The submission ring as Python sees it: thin calls into dp_ring.h through cffi.

Ordering lives in C (release stores of head and tail, acquire loads); Python
only fills descriptors and calls in.
"""

from __future__ import annotations

from . import ffi, lib
from .shm import Segment

__all__ = ["SubmissionRing", "new_desc", "new_descs"]


def new_desc():  # -> struct dp_desc *
    """A zeroed descriptor to fill and push (reuse it; pushes copy it)."""
    return ffi.new("struct dp_desc *")


def new_descs(n: int):  # -> struct dp_desc[n]
    return ffi.new("struct dp_desc[]", n)


class SubmissionRing:
    """Single-producer single-consumer view of a segment's descriptor ring.

    A client is the one producer of its ring and the dataplane the one consumer;
    nothing here is safe to call from two threads on the same side at once.
    """

    __slots__ = ("_descs", "_doorbell", "_hdr", "_seg", "capacity", "doorbells", "submitter")

    def __init__(self, segment: Segment) -> None:
        self._seg = segment.header
        self._hdr = segment.ring
        self._descs = segment.descs
        self.capacity = segment.ring_capacity
        self._doorbell = -1
        self.doorbells = 0  # times the dataplane was parked and we rang
        # the same, gathered in C for dp_submit_template (one argument instead of five);
        # Session.push calls it, with a copy of a prepared descriptor, once a forward
        sub = self.submitter = ffi.new("struct dp_submitter *")
        sub.seg, sub.ring, sub.descs = self._seg, self._hdr, self._descs
        sub.capacity, sub.doorbell_fd = self.capacity, -1

    def use_doorbell(self, fd: int) -> None:
        """``submit`` rings ``fd`` (a connected datagram socket) when the dataplane parks."""
        self._doorbell = self.submitter.doorbell_fd = fd

    def push(self, desc) -> bool:
        """Copy one descriptor in; False when the ring is full."""
        return lib.dp_ring_push(self._hdr, self._descs, self.capacity, desc) == 0

    def submit(self, desc) -> bool:
        """``push``, then wake a parked dataplane (io_uring's NEED_WAKEUP handshake:
        no syscall while it is awake). False when the ring is full."""
        rc = lib.dp_client_submit(
            self._seg, self._hdr, self._descs, self.capacity, desc, self._doorbell
        )
        if rc > 0:
            self.doorbells += 1
        return rc >= 0

    def pop(self, out) -> bool:
        """Copy the oldest descriptor out; False when the ring is empty."""
        return lib.dp_ring_pop(self._hdr, self._descs, self.capacity, out) == 0

    def pop_burst(self, out, n: int) -> int:
        """Copy up to ``n`` descriptors into the array ``out``; returns how many."""
        n = min(n, len(out))  # never past the caller's array
        return lib.dp_ring_pop_burst(self._hdr, self._descs, self.capacity, out, n)

    def push_burst(self, descs, n: int) -> int:
        n = min(n, len(descs))
        return lib.dp_ring_push_burst(self._hdr, self._descs, self.capacity, descs, n)

    def __len__(self) -> int:
        return lib.dp_ring_count(self._hdr)

    @property
    def head(self) -> int:
        return lib.dp_load_acquire_u64(ffi.addressof(self._hdr, "head"))

    @property
    def tail(self) -> int:
        return lib.dp_load_acquire_u64(ffi.addressof(self._hdr, "tail"))
