"""Shared-memory segments: create, open, list and reclaim.

A segment is backed by 2 MiB hugepages from a hugetlbfs mount when the host has
free ones, else by /dev/shm (through posix-ipc); the header records which, and
the fallback is logged once per process. Files are mode 0600, named with a
per-user prefix, sized to whole pages and pre-faulted at creation so that no
forward ever pays a page fault.
"""

from __future__ import annotations

import dataclasses
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

from . import runtime
from ._native import ffi, lib
from .errors import AbiMismatch, BadInput, SegmentError
from .schema.abi import ABI_MAJOR, ABI_MINOR, SEG_MAGIC, Backing

__all__ = [
    "BackingChoice",
    "Segment",
    "SegmentInfo",
    "clean_segments",
    "list_segments",
    "segment_dirs",
]

log = logging.getLogger("duckpipe.shm")

BackingChoice = Literal["auto", "hugetlbfs", "devshm"]
DEVSHM = Path("/dev/shm")
SMALL_PAGE = 4096
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


def _plan(slot_count: int, ring_capacity: int, act_slot: int, res_slot: int, page: int) -> _Plan:
    """The segment layout, from dp_seg_plan() in dataplane/include/dp_seg_plan.h: the same
    function the dataplane checks a header with, so the two can never disagree."""
    out = ffi.new("struct dp_seg_plan *")
    try:
        rc = lib.dp_seg_plan(slot_count, ring_capacity, act_slot, res_slot, page, out)
    except OverflowError:  # does not even fit the C argument types
        rc = lib.DP_SEG_PLAN_OVERFLOW
    if rc != lib.DP_SEG_PLAN_OK:
        why = ffi.string(lib.dp_seg_plan_strerror(rc)).decode()
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
    return _Plan(
        out.ring_offset,
        out.res_hdr_offset,
        out.act_offset,
        out.res_offset,
        out.act_slot_size,
        out.res_slot_size,
        out.size,
    )


def segment_dirs() -> list[Path]:
    """Directories that may hold this user's segments."""
    dirs = [DEVSHM]
    huge = runtime.find_hugetlbfs()
    if huge is not None:
        dirs.insert(0, huge)
    return dirs


class Segment:
    """One mapped segment: header, submission ring, slot headers and slot arenas.

    The creating client writes the header and produces into the ring; the
    dataplane opens it, consumes the ring and writes the slot headers.
    """

    def __init__(self, path: Path, mm: mmap.mmap, backing: Backing, owner: bool) -> None:
        self.path = path
        self.name = path.name
        self.backing = backing
        self.owner = owner
        self._mm = mm
        self._base = ffi.from_buffer(mm)
        base = self._base
        self.header = ffi.cast("struct dp_seg_header *", base)
        h = self.header
        self.size = int(h.segment_size)
        self.slot_count = int(h.slot_count)
        self.ring_capacity = int(h.ring_capacity)
        self.act_slot_size = int(h.act_slot_size)
        self.res_slot_size = int(h.res_slot_size)
        self.ring = ffi.cast("struct dp_ring_header *", base + h.ring_offset)
        self.descs = ffi.cast(
            "struct dp_desc *", base + h.ring_offset + ffi.sizeof("struct dp_ring_header")
        )
        self.slot_headers = ffi.cast("struct dp_slot_header *", base + h.res_hdr_offset)
        self._act_offset = int(h.act_offset)
        self._res_offset = int(h.res_offset)
        self._act = [
            self._bytes(self._act_offset, i, self.act_slot_size) for i in range(self.slot_count)
        ]
        self._res = [
            self._bytes(self._res_offset, i, self.res_slot_size) for i in range(self.slot_count)
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
        hugetlbfs_dir: Path | str | None = None,
        tag: str = "",
    ) -> Segment:
        """Create, size, pre-fault and publish a new segment owned by this process."""
        ring_capacity = slot_count if ring_capacity is None else ring_capacity
        if act_slot_size <= 0 or (res_slot_size is not None and res_slot_size <= 0):
            raise BadInput("slot sizes must be positive")
        res_slot_size = act_slot_size if res_slot_size is None else res_slot_size
        _plan(slot_count, ring_capacity, act_slot_size, res_slot_size, SMALL_PAGE)  # checks
        name = f"{runtime.segment_prefix()}{os.getpid()}-{tag or 'seg'}-{secrets.token_hex(4)}"
        if len(name.encode()) > 127:  # it must fit the header's name field
            raise BadInput(f"segment tag {tag!r} is too long; keep it under 64 characters")

        huge_dir = Path(hugetlbfs_dir) if hugetlbfs_dir else runtime.find_hugetlbfs()
        if backing in ("auto", "hugetlbfs"):
            plan = _plan(
                slot_count, ring_capacity, act_slot_size, res_slot_size, runtime.HUGEPAGE_SIZE
            )
            why = _hugepages_unavailable(huge_dir, plan.size)
            if why is None:
                try:
                    path, mm = _create_hugetlbfs(huge_dir / name, plan.size)  # type: ignore[operator]
                    return cls._publish(
                        path, mm, Backing.HUGETLBFS, plan, slot_count, ring_capacity
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
        path, mm = _create_devshm(name, plan.size)
        return cls._publish(path, mm, Backing.DEVSHM, plan, slot_count, ring_capacity)

    @classmethod
    def _publish(
        cls, path: Path, mm: mmap.mmap, backing: Backing, plan: _Plan, slots: int, capacity: int
    ) -> Segment:
        try:
            cls._write_header(path, mm, backing, plan, slots, capacity)
        except BaseException:
            mm.close()
            _unlink(path)
            raise
        return cls(path, mm, backing, owner=True)

    @staticmethod
    def _write_header(
        path: Path, mm: mmap.mmap, backing: Backing, plan: _Plan, slots: int, capacity: int
    ) -> None:
        base = ffi.from_buffer(mm)
        h = ffi.cast("struct dp_seg_header *", base)
        h.abi_major = ABI_MAJOR
        h.abi_minor = ABI_MINOR
        h.backing = int(backing)
        h.header_size = ffi.sizeof("struct dp_seg_header")
        h.page_size = runtime.HUGEPAGE_SIZE if backing == Backing.HUGETLBFS else SMALL_PAGE
        h.segment_size = plan.size
        h.creator_pid = os.getpid()
        h.start_ns = time.time_ns()
        h.ring_offset = plan.ring_offset
        h.ring_capacity = capacity
        h.desc_size = ffi.sizeof("struct dp_desc")
        h.res_hdr_offset = plan.res_hdr_offset
        h.act_offset = plan.act_offset
        h.res_offset = plan.res_offset
        h.act_slot_size = plan.act_slot_size
        h.res_slot_size = plan.res_slot_size
        h.slot_count = slots
        h.client_heartbeat_ns = runtime.monotonic_ns()
        h.name = path.name.encode()
        # release: whoever sees the magic sees a complete header
        lib.dp_store_release_u64(ffi.addressof(h, "magic"), SEG_MAGIC)
        ffi.release(base)

    @classmethod
    def open(cls, path: str | Path) -> Segment:
        """Map an existing segment (the dataplane side), checking magic, version and size."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise SegmentError(
                f"cannot open segment {path}: {e.strerror}; is the client alive?"
            ) from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_uid != os.geteuid() and os.geteuid() != 0):
                raise SegmentError(f"{path} is not a segment file of uid {os.geteuid()}")
            if st.st_size < 4096:
                raise SegmentError(f"{path} is {st.st_size} bytes, too small to be a segment")
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        base = ffi.from_buffer(mm)
        try:
            backing = _validate_header(path, ffi.cast("struct dp_seg_header *", base), len(mm))
        except BaseException:
            ffi.release(base)
            mm.close()
            raise
        ffi.release(base)
        return cls(path, mm, backing, owner=False)

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
        self.header.client_heartbeat_ns = runtime.monotonic_ns()

    # --- teardown ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap. Numpy views a caller still holds keep the mapping alive until dropped."""
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

    def unlink(self) -> None:
        """Remove the file; the memory is freed once every process has unmapped it."""
        _unlink(self.path)

    def __repr__(self) -> str:
        return f"<Segment {self.name} {self.backing.name.lower()} {self.size} bytes>"


def _validate_header(path: Path, h, file_size: int) -> Backing:
    """Refuse any header this version would not have written: it must not aim our pointers."""
    magic = lib.dp_load_acquire_u64(ffi.addressof(h, "magic"))
    if magic != SEG_MAGIC:
        raise SegmentError(f"{path} has no duckpipe segment header (magic {magic:#x})")
    major, minor = int(h.abi_major), int(h.abi_minor)
    if major != ABI_MAJOR:
        raise AbiMismatch(
            f"{path} uses segment ABI {major}.{minor}, this duckpipe speaks {ABI_MAJOR}.x; "
            "run client and dataplane from the same duckpipe version"
        )
    backing, size = int(h.backing), int(h.segment_size)
    if backing not in (Backing.HUGETLBFS, Backing.DEVSHM) or size != file_size:
        raise SegmentError(f"{path}: header says {size} bytes, file has {file_size}")
    slots, cap = int(h.slot_count), int(h.ring_capacity)
    page = runtime.HUGEPAGE_SIZE if backing == Backing.HUGETLBFS else SMALL_PAGE
    try:
        want = _plan(slots, cap, int(h.act_slot_size), int(h.res_slot_size), page)
    except BadInput as e:
        raise SegmentError(f"{path}: bad slot count {slots} or ring capacity {cap}: {e}") from None
    got = _Plan(
        int(h.ring_offset),
        int(h.res_hdr_offset),
        int(h.act_offset),
        int(h.res_offset),
        int(h.act_slot_size),
        int(h.res_slot_size),
        size,
    )
    sizes = (int(h.header_size), int(h.desc_size))
    if got != want or sizes != (ffi.sizeof("struct dp_seg_header"), ffi.sizeof("struct dp_desc")):
        raise SegmentError(f"{path}: the header's layout is not one this version writes")
    return Backing(backing)


def _hugepages_unavailable(huge_dir: Path | None, size: int) -> str | None:
    if huge_dir is None:
        return "no writable hugetlbfs mount with 2 MiB pages was found"
    need = size // runtime.HUGEPAGE_SIZE
    free = runtime.free_hugepages()
    if free < need:
        return f"{need} hugepages are needed and {free} are free"
    return None


def _log_fallback(why: str) -> None:
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.warning("duckpipe: using /dev/shm (4 KiB pages) because %s", why)


def _create_hugetlbfs(path: Path, size: int) -> tuple[Path, mmap.mmap]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask must not widen or narrow it
        os.ftruncate(fd, size)
        # MAP_POPULATE reserves and faults every hugepage now, or fails with ENOMEM now.
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
    except OSError:
        os.close(fd)
        _unlink(path)
        raise
    os.close(fd)
    return path, mm


def _create_devshm(name: str, size: int) -> tuple[Path, mmap.mmap]:
    try:
        shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=size)
    except (posix_ipc.Error, OSError) as e:
        raise SegmentError(f"cannot create /dev/shm/{name} ({size} bytes): {e}") from e
    try:
        mm = mmap.mmap(shm.fd, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
    except OSError as e:
        shm.close_fd()
        shm.unlink()
        raise SegmentError(
            f"cannot map /dev/shm/{name} ({size} bytes): {e}; is /dev/shm full?"
        ) from e
    shm.close_fd()
    return DEVSHM / name, mm


def _unlink(path: Path) -> None:
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
    path: Path
    size: int
    backing: str
    creator_pid: int
    creator_alive: bool
    dataplane_pid: int
    client_id: int
    age_s: float
    readable: bool
    reason: str = ""


def _read_info(path: Path) -> SegmentInfo:
    st = path.stat()
    age = time.time() - st.st_mtime
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            raw = os.pread(fd, ffi.sizeof("struct dp_seg_header"), 0)
        finally:
            os.close(fd)
    except OSError as e:
        return SegmentInfo(path, st.st_size, "?", 0, False, 0, 0, age, False, str(e))
    if len(raw) < ffi.sizeof("struct dp_seg_header"):
        return SegmentInfo(path, st.st_size, "?", 0, False, 0, 0, age, False, "truncated")
    h = ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw))
    if h.magic != SEG_MAGIC:
        return SegmentInfo(path, st.st_size, "?", 0, False, 0, 0, age, False, "no header")
    start_ns = int(h.start_ns)
    age = time.time() - start_ns / 1e9
    backing = {1: "hugetlbfs", 2: "devshm"}.get(int(h.backing), "?")
    pid = int(h.creator_pid)
    return SegmentInfo(
        path,
        int(h.segment_size),
        backing,
        pid,
        runtime.process_alive(pid, start_ns),
        int(h.dataplane_pid),
        int(h.client_id),
        age,
        True,
    )


def list_segments() -> list[SegmentInfo]:
    """This user's segments, in every place they may live."""
    prefix = runtime.segment_prefix()
    out = []
    for d in segment_dirs():
        try:
            entries = sorted(p for p in d.iterdir() if p.name.startswith(prefix))
        except OSError:
            continue
        for p in entries:
            try:
                out.append(_read_info(p))
            except FileNotFoundError:
                continue  # removed while we looked
    return out


def clean_segments(*, dry_run: bool = False, min_age_s: float = 5.0) -> list[SegmentInfo]:
    """Remove segments whose creator is dead (or whose header never got written and
    which are older than ``min_age_s``). Returns what was (or would be) removed."""
    removed = []
    for info in list_segments():
        dead = (info.readable and not info.creator_alive) or (
            not info.readable and info.age_s > min_age_s
        )
        if dead:
            if not dry_run:
                _unlink(info.path)
            removed.append(info)
    return removed
