"""Shared-memory segments: create, open, list.

A segment is a sealed memfd: 2 MiB hugepages (MFD_HUGETLB) when the host has
enough free ones, else 4 KiB pages; the header records which, and the fallback
is logged once per process. It is sized to whole pages, sealed so that nobody
can shrink or grow it (a segment that cannot shrink cannot SIGBUS the
dataplane), and pre-faulted at creation so that no forward pays a page fault.
The creating client keeps the descriptor open for the segment's life; the
dataplane opens it as /proc/<pid>/fd/<fd>. Nothing has a name in a file
system, so nothing is ever left behind: the memory goes when the last process
that maps it does.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import mmap
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Literal

import numpy as np
import posix_ipc

from .. import host
from ..errors import AbiMismatch, BadInput, DuckpipeError, SegmentError
from ..schema.abi import ABI_MAJOR, ABI_MINOR, SEG_MAGIC, Backing
from . import ffi, lib, text

__all__ = [
    "BackingChoice",
    "Segment",
    "SegmentInfo",
    "clean_segments",
    "list_segments",
    "segment_dirs",
]

log = logging.getLogger("duckpipe.client.shm")  # the name users know: a client's segments

BackingChoice = Literal["auto", "hugetlbfs", "devshm"]
DEVSHM = Path("/dev/shm")
SMALL_PAGE = 4096
MEMFD_LINK = "/memfd:"  # how /proc/*/fd shows a memfd: "/memfd:<name> (deleted)"
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW  # the creator's
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)  # Linux 5.1; Python 3.13
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
# the dataplane's, once it has mapped a segment: no hole punching, no new writable
# mapping, no more seals
ATTACH_SEALS = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
_HDR = ffi.sizeof("struct dp_seg_header")
_fallback_logged = False


@dataclasses.dataclass(frozen=True)
class _Plan:
    ring_offset: int
    res_hdr_offset: int
    act_offset: int
    res_offset: int
    act_slot_size: int
    res_slot_size: int
    size: int


def _plan_of(out) -> _Plan:
    """A filled ``struct dp_seg_plan`` as a _Plan."""
    return _Plan(
        out.ring_offset,
        out.res_hdr_offset,
        out.act_offset,
        out.res_offset,
        out.act_slot_size,
        out.res_slot_size,
        out.size,
    )


def _plan(slot_count: int, ring_capacity: int, act_slot: int, res_slot: int, page: int) -> _Plan:
    """The segment layout, from dp_seg_plan() in dataplane/include/dp_seg_plan.h: the same
    function the dataplane checks a header with, so the two can never disagree."""
    out = ffi.new("struct dp_seg_plan *")
    try:
        rc = lib.dp_seg_plan(slot_count, ring_capacity, act_slot, res_slot, page, out)
    except OverflowError:  # does not even fit the C argument types
        rc = lib.DP_SEG_PLAN_OVERFLOW
    if rc != lib.DP_SEG_PLAN_OK:
        why = text(lib.dp_seg_plan_strerror(rc))
        detail = {
            lib.DP_SEG_PLAN_BAD_SLOT_COUNT: f"got {slot_count}",
            lib.DP_SEG_PLAN_BAD_CAPACITY: f"got {ring_capacity}",
            lib.DP_SEG_PLAN_CAPACITY_BELOW_SLOTS: f"({ring_capacity} < {slot_count}) so that "
            "a claimed slot can always be submitted",
        }.get(
            rc,
            f"{slot_count} slots of {act_slot} + {res_slot} bytes, ring capacity "
            f"{ring_capacity}, {page}-byte pages",
        )
        raise BadInput(f"{why}, {detail}")
    return _plan_of(out)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A segment's layout as checked once; nothing is read from its header again."""

    slot_count: int
    ring_capacity: int
    plan: _Plan


def segment_dirs() -> list[Path]:
    """Directories that may hold segment files of segment ABI 1.0 (memfds have none)."""
    dirs = [DEVSHM]
    huge = host.find_hugetlbfs()
    if huge is not None:
        dirs.insert(0, huge)
    return dirs


class Segment:
    """One mapped segment: header, submission ring, slot headers and slot arenas.

    The creating client writes the header and produces into the ring; the
    dataplane opens it, consumes the ring and writes the slot headers. The
    layout comes from the checked plan, never from the mapped header, so a
    peer rewriting its header cannot move what this object points at.
    """

    def __init__(
        self,
        name: str,
        mm: mmap.mmap,
        backing: Backing,
        owner: bool,
        layout: _Layout,
        *,
        fd: int | None = None,
        path: Path | None = None,
        st_dev: int = 0,
        st_ino: int = 0,
    ) -> None:
        self.name = name
        self.fd = fd  # the creator's memfd, open while the segment lives
        self.path = path if path is not None else Path(f"/proc/{os.getpid()}/fd/{fd}")
        self.backing = backing
        self.owner = owner
        self.st_dev, self.st_ino = st_dev, st_ino
        self._mm = mm
        self._base = ffi.from_buffer(mm)
        base = self._base
        plan = layout.plan
        self.header = ffi.cast("struct dp_seg_header *", base)
        self.size = plan.size
        self.slot_count = layout.slot_count
        self.ring_capacity = layout.ring_capacity
        self.act_slot_size = plan.act_slot_size
        self.res_slot_size = plan.res_slot_size
        self.ring = ffi.cast("struct dp_ring_header *", base + plan.ring_offset)
        self.descs = ffi.cast(
            "struct dp_desc *", base + plan.ring_offset + ffi.sizeof("struct dp_ring_header")
        )
        self.slot_headers = ffi.cast("struct dp_slot_header *", base + plan.res_hdr_offset)
        self._act = [
            self._bytes(plan.act_offset, i, self.act_slot_size) for i in range(self.slot_count)
        ]
        self._res = [
            self._bytes(plan.res_offset, i, self.res_slot_size) for i in range(self.slot_count)
        ]
        self._closed = False

    def _bytes(self, start: int, i: int, size: int) -> np.ndarray:
        return np.frombuffer(self._mm, np.uint8, size, start + i * size)

    # --- creation and opening ------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        slot_count: int,
        act_slot_size: int,
        res_slot_size: int | None = None,
        ring_capacity: int | None = None,
        backing: BackingChoice = "auto",
        tag: str = "",
    ) -> Segment:
        """Create, size, seal, pre-fault and publish a new segment owned by this process."""
        ring_capacity = slot_count if ring_capacity is None else ring_capacity
        if act_slot_size <= 0 or (res_slot_size is not None and res_slot_size <= 0):
            raise BadInput("slot sizes must be positive")
        res_slot_size = act_slot_size if res_slot_size is None else res_slot_size
        _plan(slot_count, ring_capacity, act_slot_size, res_slot_size, SMALL_PAGE)  # checks
        name = f"{host.segment_prefix()}{os.getpid()}-{tag or 'seg'}-{secrets.token_hex(4)}"
        if len(name.encode()) > 127:  # it must fit the header's name field
            raise BadInput(f"segment tag {tag!r} is too long; keep it under 64 characters")

        if backing in ("auto", "hugetlbfs"):
            plan = _plan(
                slot_count, ring_capacity, act_slot_size, res_slot_size, host.HUGEPAGE_SIZE
            )
            why = _hugepages_unavailable(plan.size)
            if why is None:
                try:
                    fd, mm = _create_memfd(name, plan.size, huge=True)
                    return cls._publish(
                        name, fd, mm, Backing.HUGETLBFS, _Layout(slot_count, ring_capacity, plan)
                    )
                except OSError as e:
                    why = f"mapping {plan.size} bytes of hugepages failed: {e}"
            if backing == "hugetlbfs":
                raise SegmentError(
                    f"hugepage backing requested but {why}; run `tools/setup env` as root "
                    "or use backing='auto'"
                )
            _log_fallback(why)
        plan = _plan(slot_count, ring_capacity, act_slot_size, res_slot_size, SMALL_PAGE)
        try:
            fd, mm = _create_memfd(name, plan.size, huge=False)
        except OSError as e:
            raise SegmentError(f"cannot create a {plan.size}-byte memfd segment: {e}") from e
        return cls._publish(name, fd, mm, Backing.DEVSHM, _Layout(slot_count, ring_capacity, plan))

    @classmethod
    def _publish(
        cls, name: str, fd: int, mm: mmap.mmap, backing: Backing, layout: _Layout
    ) -> Segment:
        try:
            cls._write_header(name, mm, backing, layout)
        except BaseException:
            mm.close()
            os.close(fd)
            raise
        st = os.fstat(fd)
        return cls(
            name, mm, backing, owner=True, layout=layout, fd=fd, st_dev=st.st_dev, st_ino=st.st_ino
        )

    @staticmethod
    def _write_header(name: str, mm: mmap.mmap, backing: Backing, layout: _Layout) -> None:
        plan = layout.plan
        base = ffi.from_buffer(mm)
        h = ffi.cast("struct dp_seg_header *", base)
        h.abi_major = ABI_MAJOR
        h.abi_minor = ABI_MINOR
        h.backing = int(backing)
        h.header_size = _HDR
        h.page_size = host.HUGEPAGE_SIZE if backing == Backing.HUGETLBFS else SMALL_PAGE
        h.segment_size = plan.size
        h.creator_pid = os.getpid()
        h.start_ns = time.time_ns()
        h.ring_offset = plan.ring_offset
        h.ring_capacity = layout.ring_capacity
        h.desc_size = ffi.sizeof("struct dp_desc")
        h.res_hdr_offset = plan.res_hdr_offset
        h.act_offset = plan.act_offset
        h.res_offset = plan.res_offset
        h.act_slot_size = plan.act_slot_size
        h.res_slot_size = plan.res_slot_size
        h.slot_count = layout.slot_count
        h.client_heartbeat_ns = host.monotonic_ns()
        h.name = name.encode()
        # release: whoever sees the magic sees a complete header
        lib.dp_store_release_u64(ffi.addressof(h, "magic"), SEG_MAGIC)
        ffi.release(base)

    @classmethod
    def open_fd(
        cls,
        pid: int,
        fd: int,
        *,
        uid: int | None = None,
        max_slots: int | None = None,
        max_bytes: int | None = None,
        pidfd: int | None = None,
    ) -> Segment:
        """Map the segment memfd ``fd`` of process ``pid`` (the dataplane side): taken
        from the process behind ``pidfd`` when given (the one that connected), else
        through /proc/<pid>/fd.

        Refuses anything but a duckpipe memfd owned by ``uid`` (default: ours),
        sealed against shrinking and growing, whose header, read before mapping,
        says ``pid`` made it and passes dp_seg_plan() within the limits; then
        maps it, seals it against hole punching and new writable mappings
        (so a segment is opened this way once) and faults it in: what
        dp_client_map() in the C dataplane does.
        """
        uid = os.geteuid() if uid is None else uid
        path = Path(f"/proc/{pid}/fd/{fd}")
        if pid <= 0 or fd < 0:
            raise SegmentError(
                f"no segment descriptor (pid {pid}, fd {fd}): this client predates memfd "
                "segments; upgrade it"
            )
        try:
            if pidfd is not None:  # from the process that connected, whatever holds pid now
                handle = host.pidfd_getfd(pidfd, pid, fd, "segment")
            else:
                # O_PATH: opens nothing (a device or FIFO the peer named could have side
                # effects); only a regular file of uid is opened for real, through our handle
                handle = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            raise SegmentError(f"cannot open {path}: {e.strerror}; is the client alive?") from e
        except DuckpipeError as e:
            raise SegmentError(str(e)) from e
        try:
            st = os.fstat(handle)
            # owner first: of another user's file neither owner nor type is said (dp_client.c)
            mine, regular = st.st_uid == uid, stat.S_ISREG(st.st_mode)
            if mine and regular:
                ours = os.open(f"/proc/self/fd/{handle}", os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            raise SegmentError(f"cannot open {path}: {e.strerror}") from e
        finally:
            os.close(handle)
        if not mine:
            raise SegmentError(f"segment fd {fd} is not a duckpipe segment of yours (uid {uid})")
        if not regular:
            raise SegmentError(f"{path} is not a regular file")
        try:
            st = os.fstat(ours)
            if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
                raise SegmentError(
                    f"segment fd {fd} is not a duckpipe segment of yours (uid {uid})"
                )
            link = os.readlink(f"/proc/self/fd/{ours}")
            if not link.startswith(MEMFD_LINK + "duckpipe"):
                raise SegmentError(f"{path} is not a duckpipe memfd ({link})")
            name = link[len(MEMFD_LINK) :].removesuffix(" (deleted)")
            # the client chose it, and the stats segment and the tools show it (dp_client.c)
            raw_name = os.fsencode(name)
            bad = next((i for i, b in enumerate(raw_name) if not 0x20 <= b <= 0x7E), None)
            if bad is not None:
                raise SegmentError(
                    f"the memfd's name must be printable ASCII (0x20-0x7e): byte {bad} is "
                    f"0x{raw_name[bad]:02x}"
                )
            seals = fcntl.fcntl(ours, fcntl.F_GET_SEALS)
            if seals & SEALS != SEALS:
                raise SegmentError(f"memfd {name} is not sealed against shrinking and growing")
            if seals & (ATTACH_SEALS | fcntl.F_SEAL_WRITE):
                raise SegmentError(
                    f"memfd {name} is sealed against writes or further seals ({seals:#x}): it "
                    "is attached elsewhere, or its maker sealed it too far"
                )
            raw = os.pread(ours, _HDR, 0)
            backing, layout = _validate_header(name, raw, st.st_size, max_slots, max_bytes)
            creator = int(ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw)).creator_pid)
            if creator != pid:
                raise SegmentError(f"memfd {name} was made by pid {creator}, not {pid}")
            mm = mmap.mmap(ours, st.st_size, mmap.MAP_SHARED)
            try:
                fcntl.fcntl(ours, fcntl.F_ADD_SEALS, ATTACH_SEALS)
                held = os.fstat(ours).st_blocks * 512
                if held < st.st_size:  # a sparse segment would be allocated by its reader
                    raise SegmentError(
                        f"memfd {name} holds {held} of its {st.st_size} bytes: its maker must "
                        "pre-fault it"
                    )
                # a page punched before the seal that cannot come back fails here, not later
                mm.madvise(MADV_POPULATE_WRITE)
            except OSError as e:
                mm.close()
                if isinstance(e, SegmentError):
                    raise
                raise SegmentError(f"cannot seal and fault in memfd {name}: {e}") from e
        finally:
            os.close(ours)
        return cls(name, mm, backing, False, layout, path=path, st_dev=st.st_dev, st_ino=st.st_ino)

    @classmethod
    def open(cls, path: str | Path) -> Segment:
        """Map a segment by path: /proc/<pid>/fd/<fd> of a live one, or a file written by
        segment ABI 1.0. Checks the header (read before mapping) like open_fd."""
        path = Path(path)
        flags = os.O_RDWR | os.O_CLOEXEC
        if not str(path).startswith("/proc/"):
            flags |= os.O_NOFOLLOW  # a file name could be swapped for a link
        try:
            fd = os.open(path, flags)
        except OSError as e:
            raise SegmentError(
                f"cannot open segment {path}: {e.strerror}; is the client alive?"
            ) from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise SegmentError(f"{path} is not a segment file of uid {os.geteuid()}")
            if st.st_size < SMALL_PAGE:
                raise SegmentError(f"{path} is {st.st_size} bytes, too small to be a segment")
            raw = os.pread(fd, _HDR, 0)
            backing, layout = _validate_header(str(path), raw, st.st_size)
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        name = ffi.string(ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw)).name).decode()
        return cls(
            name or path.name,
            mm,
            backing,
            False,
            layout,
            path=path,
            st_dev=st.st_dev,
            st_ino=st.st_ino,
        )

    # --- slot access ---------------------------------------------------------

    def act_view(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A numpy view of activation slot ``slot`` (no copy)."""
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self._act[slot][:n].view(dtype).reshape(shape)

    def res_view(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A numpy view of result slot ``slot`` (no copy)."""
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self._res[slot][:n].view(dtype).reshape(shape)

    def act_bytes(self, slot: int) -> np.ndarray:
        return self._act[slot]

    def res_bytes(self, slot: int) -> np.ndarray:
        return self._res[slot]

    def heartbeat_client(self) -> None:
        self.header.client_heartbeat_ns = host.monotonic_ns()

    @property
    def detach_reason(self) -> int:
        """Set by a dataplane that detached this client on its own (DetachReason)."""
        return int(self.header.detach_reason)

    # --- teardown ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap (and close the memfd). Numpy views a caller still holds keep the mapping
        alive until dropped; a dataplane's mapping keeps the memory until it unmaps."""
        if self._closed:
            return
        self._closed = True
        ffi.release(self._base)
        self._act = self._res = []
        self.header = self.ring = self.descs = self.slot_headers = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            log.debug("segment %s still has views; the mapping goes when they do", self.name)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __repr__(self) -> str:
        return f"<Segment {self.name} {self.backing.name.lower()} {self.size} bytes>"


def _validate_header(
    where: str,
    raw: bytes,
    file_size: int,
    max_slots: int | None = None,
    max_bytes: int | None = None,
) -> tuple[Backing, _Layout]:
    """Refuse any header this version would not have written: it must not aim our pointers.
    ``raw`` is a private copy (pread), so the peer cannot change it while we look. The
    check is dp_seg_check() of dataplane/include/dp_seg_plan.h, the dataplane's own."""
    if len(raw) < _HDR:
        raise SegmentError(f"{where} is {file_size} bytes, too small to be a segment")
    h = ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw))
    slots, cap = int(h.slot_count), int(h.ring_capacity)
    out = ffi.new("struct dp_seg_plan *")
    rc = lib.dp_seg_check(
        h,
        file_size,
        (1 << 32) - 1 if max_slots is None else max_slots,
        (1 << 64) - 1 if max_bytes is None else max_bytes,
        out,
    )
    if rc == lib.DP_SEG_CHECK_NO_MAGIC:
        raise SegmentError(f"{where} has no duckpipe segment header (magic {int(h.magic):#x})")
    if rc == lib.DP_SEG_CHECK_ABI_MAJOR:
        raise AbiMismatch(
            f"{where} uses segment ABI {h.abi_major}.{h.abi_minor}, this duckpipe speaks "
            f"{ABI_MAJOR}.x; run client and dataplane from the same duckpipe version"
        )
    if rc == lib.DP_SEG_CHECK_OVER_LIMITS:  # which limit, and both ways past it (dp_client.c)
        if max_slots is not None and slots > max_slots:
            raise SegmentError(
                f"{where}: {slots} slots: over this dataplane's client_max_slots {max_slots}; "
                "connect with fewer (slots=), or raise client_max_slots in its topology"
            )
        raise SegmentError(
            f"{where}: {slots} slots take {file_size / 2**20:.1f} MiB: over this dataplane's "
            f"client_max_segment_bytes {max_bytes} ({(max_bytes or 0) / 2**20:.1f} MiB); "
            "connect with fewer or smaller slots (slots=, slot_size=), or raise "
            "client_max_segment_bytes in its topology"
        )
    if rc in (lib.DP_SEG_CHECK_STRUCT_SIZES, lib.DP_SEG_CHECK_LAYOUT, lib.DP_SEG_CHECK_BACKING):
        why = text(lib.dp_seg_plan_strerror(rc))
        raise SegmentError(
            f"{where}: the header's layout is not one this version writes ({why}; "
            f"backing {h.backing}, header says {h.segment_size} bytes, file has {file_size})"
        )
    if rc != 0:  # the plan's own refusal
        why = text(lib.dp_seg_plan_strerror(rc))
        raise SegmentError(f"{where}: {why} (slot count {slots}, ring capacity {cap})")
    plan = _plan_of(out)
    return Backing(int(h.backing)), _Layout(slots, cap, plan)


def _hugepages_unavailable(size: int) -> str | None:
    if os.environ.get("DUCKPIPE_HUGETLBFS") == "":
        return "hugepages are disabled (DUCKPIPE_HUGETLBFS is empty)"
    need = size // host.HUGEPAGE_SIZE
    free = host.free_hugepages()
    if free < need:
        return f"{need} hugepages are needed and {free} are free"
    return None


def _log_fallback(why: str) -> None:
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.warning("duckpipe: using 4 KiB pages (a plain memfd) because %s", why)


def _create_memfd(name: str, size: int, *, huge: bool) -> tuple[int, mmap.mmap]:
    """A sealed memfd of ``size`` bytes, mapped and pre-faulted: (fd, mapping)."""
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | (os.MFD_HUGETLB if huge else 0)
    fd = os.memfd_create(name, flags)
    try:
        os.ftruncate(fd, size)
        # nobody (the client included) can resize it now: a reader never SIGBUSes. The
        # dataplane adds F_SEAL_FUTURE_WRITE and F_SEAL_SEAL once it has mapped it.
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        # MAP_POPULATE reserves and faults every page now, or fails with ENOMEM now.
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
    except OSError:
        os.close(fd)
        raise
    return fd, mm


def _unlink(path: Path) -> None:
    """Remove a segment file of segment ABI 1.0."""
    try:
        if path.parent == DEVSHM:
            posix_ipc.unlink_shared_memory("/" + path.name)
        else:
            path.unlink()
    except (FileNotFoundError, posix_ipc.ExistentialError):
        pass


# --- inspection and reclamation ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    path: Path  # /proc/<pid>/fd/<fd> of a memfd, or the file of a segment before 1.1
    size: int
    backing: str
    creator_pid: int
    creator_alive: bool
    dataplane_pid: int
    client_id: int
    age_s: float
    readable: bool
    reason: str = ""
    kind: str = "memfd"  # or "file" (segment ABI 1.0: removable by clean_segments)
    name: str = ""


def _read_info(path: Path, kind: str, name: str = "") -> SegmentInfo:
    st = path.stat()
    age = time.time() - st.st_mtime
    name = name or path.name
    try:
        flags = os.O_RDONLY | os.O_CLOEXEC | (0 if kind == "memfd" else os.O_NOFOLLOW)
        fd = os.open(path, flags)
        try:
            raw = os.pread(fd, _HDR, 0)
        finally:
            os.close(fd)
    except OSError as e:
        return SegmentInfo(path, st.st_size, "?", 0, False, 0, 0, age, False, str(e), kind, name)
    if len(raw) < _HDR:
        return SegmentInfo(
            path, st.st_size, "?", 0, False, 0, 0, age, False, "truncated", kind, name
        )
    h = ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw))
    if h.magic != SEG_MAGIC:
        return SegmentInfo(
            path, st.st_size, "?", 0, False, 0, 0, age, False, "no header", kind, name
        )
    start_ns = int(h.start_ns)
    age = time.time() - start_ns / 1e9
    backing = {1: "hugetlbfs", 2: "devshm"}.get(int(h.backing), "?")
    pid = int(h.creator_pid)
    return SegmentInfo(
        path,
        int(h.segment_size),
        backing,
        pid,
        host.process_alive(pid, start_ns),
        int(h.dataplane_pid),
        int(h.client_id),
        age,
        True,
        "",
        kind,
        name,
    )


def _memfds() -> list[tuple[Path, str]]:
    """(/proc/<pid>/fd/<fd>, name) of every duckpipe memfd this user's processes hold open,
    one per file."""
    prefix = MEMFD_LINK + host.segment_prefix()
    seen: set[tuple[int, int]] = set()
    out = []
    for proc in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours
        for fd in fds:
            try:
                link = os.readlink(fd)
                if not link.startswith(prefix):
                    continue
                st = fd.stat()
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append((fd, link[len(MEMFD_LINK) :].removesuffix(" (deleted)")))
    return out


def list_segments() -> list[SegmentInfo]:
    """This user's segments: live memfds (through /proc), and files of segment ABI 1.0."""
    out = []
    for path, name in _memfds():
        try:
            out.append(_read_info(path, "memfd", name))
        except FileNotFoundError:
            continue  # closed while we looked
    prefix = host.segment_prefix()
    for d in segment_dirs():
        try:
            entries = sorted(p for p in d.iterdir() if p.name.startswith(prefix))
        except OSError:
            continue
        for p in entries:
            try:
                out.append(_read_info(p, "file"))
            except FileNotFoundError:
                continue  # removed while we looked
    return out


def clean_segments(*, dry_run: bool = False, min_age_s: float = 5.0) -> list[SegmentInfo]:
    """Remove segment files of segment ABI 1.0 whose creator is dead (or whose header
    never got written and which are older than ``min_age_s``). Memfd segments need no
    cleaning: their memory goes with the last process that holds them. Returns what was
    (or would be) removed."""
    removed = []
    for info in list_segments():
        if info.kind != "file":
            continue
        dead = (info.readable and not info.creator_alive) or (
            not info.readable and info.age_s > min_age_s
        )
        if dead:
            if not dry_run:
                _unlink(info.path)
            removed.append(info)
    return removed
