"""Shared-memory segments: creation checks, sealed memfds, header, mapping, listing."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import duckpipe._abi.shm as shm
from duckpipe import host
from duckpipe._abi import ffi, lib
from duckpipe._abi.shm import Segment, clean_segments, list_segments
from duckpipe.errors import AbiMismatch, BadInput, SegmentError
from duckpipe.schema.abi import ABI_MAJOR, ABI_MINOR, SEG_MAGIC, Backing
from duckpipe.testing import mapped_by

ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096
HUGE = host.HUGEPAGE_SIZE


@pytest.fixture
def segments() -> Iterator[Callable[..., Segment]]:
    """``segments(**create_kwargs)``: segments that are closed and unlinked afterwards."""
    made: list[Segment] = []

    def make(**kwargs: object) -> Segment:
        kwargs.setdefault("slot_count", 4)
        kwargs.setdefault("act_slot_size", 4096)
        kwargs.setdefault("backing", "devshm")
        seg = Segment.create(**kwargs)  # type: ignore[arg-type]
        made.append(seg)
        return seg

    yield make
    for seg in made:
        seg.close()


# --- argument checks ------------------------------------------------------------


@pytest.mark.parametrize("slot_count", [0, 3, 6, 100])
def test_rejects_slot_count_that_is_not_a_power_of_two(slot_count: int) -> None:
    with pytest.raises(BadInput, match="slot_count must be a power of two"):
        Segment.create(slot_count=slot_count, act_slot_size=4096, backing="devshm")


@pytest.mark.parametrize("capacity", [0, 12, 33])
def test_rejects_ring_capacity_that_is_not_a_power_of_two(capacity: int) -> None:
    with pytest.raises(BadInput, match="ring_capacity must be a power of two"):
        Segment.create(slot_count=4, ring_capacity=capacity, act_slot_size=4096, backing="devshm")


def test_rejects_ring_capacity_smaller_than_slot_count() -> None:
    with pytest.raises(BadInput, match=r"ring_capacity must be at least slot_count, \(4 < 8\)"):
        Segment.create(slot_count=8, ring_capacity=4, act_slot_size=4096, backing="devshm")


# --- sealed memfds ---------------------------------------------------------------


def test_segment_is_a_duckpipe_memfd_of_this_user(segments) -> None:
    seg = segments()
    assert os.readlink(seg.path).startswith(f"/memfd:{host.segment_prefix()}{os.getpid()}-")
    st = os.fstat(seg.fd)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
    assert seg.name.startswith(host.segment_prefix())
    assert seg.backing is Backing.DEVSHM
    assert not any(p.name == seg.name for p in Path("/dev/shm").iterdir())  # no file anywhere


def test_segment_can_neither_shrink_nor_grow(segments) -> None:
    seg = segments()
    seals = fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    for size in (0, seg.size - PAGE, seg.size + PAGE):
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, size)
    # also through a descriptor reopened the way a dataplane opens it
    fd = os.open(f"/proc/{os.getpid()}/fd/{seg.fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    assert os.fstat(seg.fd).st_size == seg.size


def _punch(fd: int, offset: int, length: int) -> int:
    """fallocate(PUNCH_HOLE | KEEP_SIZE): 0, or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.fallocate(fd, 3, ctypes.c_long(offset), ctypes.c_long(length))
    return 0 if rc == 0 else ctypes.get_errno()


def test_once_opened_by_a_dataplane_no_hole_can_be_punched_and_no_seal_added(segments) -> None:
    seg = segments()
    act = int(seg.header.act_offset)
    seg.act_bytes(0)[:4] = 5
    assert _punch(seg.fd, act, PAGE) == 0  # before: allowed, and the page reads back as zeros
    assert not seg.act_bytes(0)[:4].any()
    peer = Segment.open_fd(os.getpid(), seg.fd)
    try:
        seals = fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS)
        assert seals & shm.F_SEAL_FUTURE_WRITE and seals & fcntl.F_SEAL_SEAL
        assert _punch(seg.fd, act, PAGE) == errno.EPERM
        with pytest.raises(PermissionError):
            fcntl.fcntl(seg.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        # both existing mappings stay writable
        seg.act_bytes(0)[:4] = 7
        peer.res_bytes(0)[:4] = 9
        assert list(peer.act_bytes(0)[:4]) == [7] * 4 and list(seg.res_bytes(0)[:4]) == [9] * 4
        # and a second dataplane cannot map it
        with pytest.raises(SegmentError, match="sealed against writes or further seals"):
            Segment.open_fd(os.getpid(), seg.fd)
    finally:
        peer.close()


def test_closing_a_segment_closes_its_memfd(segments) -> None:
    seg = segments()
    fd, name = seg.fd, seg.name
    seg.close()
    assert seg.fd is None
    assert not mapped_by(name)
    with pytest.raises(OSError):  # EBADF: the descriptor is closed
        os.fstat(fd)


def test_devshm_segment_is_whole_pages_with_page_aligned_slots(segments) -> None:
    seg = segments(slot_count=4, act_slot_size=5000, res_slot_size=100)
    h = seg.header
    assert seg.size % PAGE == 0
    assert os.fstat(seg.fd).st_size == seg.size
    assert h.act_offset % PAGE == 0 and h.res_offset % PAGE == 0
    assert (seg.act_slot_size, seg.res_slot_size) == (8192, 4096)
    for i in range(seg.slot_count):
        assert seg.act_bytes(i).ctypes.data % PAGE == 0, f"activation slot {i}"
        assert seg.res_bytes(i).ctypes.data % PAGE == 0, f"result slot {i}"
    # regions follow one another without overlap and fit in the file
    ring_end = h.ring_offset + 128 + seg.ring_capacity * h.desc_size
    assert h.header_size <= h.ring_offset and ring_end <= h.res_hdr_offset
    assert h.res_hdr_offset + ffi.sizeof("struct dp_slot_header") * seg.slot_count <= h.act_offset
    assert h.act_offset + seg.slot_count * seg.act_slot_size <= h.res_offset
    assert h.res_offset + seg.slot_count * seg.res_slot_size <= seg.size


def test_header_fields_read_back_through_open(segments) -> None:
    before = time.time_ns()
    seg = segments(slot_count=8, ring_capacity=32, act_slot_size=4096)
    peer = Segment.open_fd(os.getpid(), seg.fd)
    try:
        h = peer.header
        assert h.magic == SEG_MAGIC
        assert (h.abi_major, h.abi_minor) == (ABI_MAJOR, ABI_MINOR)
        assert h.backing == Backing.DEVSHM and peer.backing is Backing.DEVSHM
        assert h.creator_pid == os.getpid()
        assert (h.slot_count, h.ring_capacity) == (8, 32)
        assert (peer.slot_count, peer.ring_capacity) == (8, 32)
        assert (h.header_size, h.desc_size, h.page_size) == (384, 128, PAGE)
        assert h.segment_size == seg.size == os.fstat(seg.fd).st_size
        assert before <= h.start_ns <= time.time_ns()
        assert ffi.string(h.name).decode() == seg.name
        assert peer.owner is False and seg.owner is True
    finally:
        peer.close()


def test_writes_through_one_mapping_are_visible_in_the_other(segments) -> None:
    seg = segments(slot_count=2, act_slot_size=4096)
    peer = Segment.open_fd(os.getpid(), seg.fd)
    try:
        x = np.arange(256, dtype=np.float32).reshape(2, 128) * 0.5
        seg.act_view(1, (2, 128), np.dtype(np.float32))[:] = x
        seen = peer.act_view(1, (2, 128), np.dtype(np.float32))
        np.testing.assert_array_equal(seen, x)
        assert not peer.act_bytes(0).any()  # slot 0 is a different slot
        peer.res_view(0, (16,), np.dtype(np.uint64))[:] = np.arange(16, dtype=np.uint64) + 7
        np.testing.assert_array_equal(
            seg.res_view(0, (16,), np.dtype(np.uint64)), np.arange(16) + 7
        )
        del seen
    finally:
        peer.close()


# --- hugepage backing ------------------------------------------------------------


def _require_hugepages(pages: int) -> None:
    free = host.free_hugepages()
    if free < pages:
        pytest.skip(f"{pages} free 2 MiB hugepages needed, {free} free (free_hugepages)")


def test_hugepage_segment_is_a_sealed_hugetlb_memfd(segments) -> None:
    _require_hugepages(3)
    seg = segments(slot_count=2, act_slot_size=1 << 20, backing="hugetlbfs")
    assert seg.backing is Backing.HUGETLBFS
    assert seg.header.page_size == HUGE
    assert seg.size % HUGE == 0 and seg.size > HUGE  # 4 MiB of slots plus the header
    assert os.fstat(seg.fd).st_blksize == HUGE
    assert os.readlink(seg.path).startswith("/memfd:" + host.segment_prefix())
    with pytest.raises(PermissionError):
        os.ftruncate(seg.fd, 0)
    peer = Segment.open_fd(os.getpid(), seg.fd)
    try:
        assert peer.backing is Backing.HUGETLBFS
        seg.act_bytes(1)[-1] = 0xAB
        assert peer.act_bytes(1)[-1] == 0xAB
    finally:
        peer.close()


def test_hugepage_backing_when_disabled_fails_saying_why(monkeypatch) -> None:
    monkeypatch.setenv("DUCKPIPE_HUGETLBFS", "")
    with pytest.raises(SegmentError, match="hugepages are disabled"):
        Segment.create(slot_count=1, act_slot_size=4096, backing="hugetlbfs")


def test_auto_backing_falls_back_to_small_pages_and_warns_once(
    segments, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("DUCKPIPE_HUGETLBFS", "")
    monkeypatch.setattr(shm, "_fallback_logged", False)
    caplog.set_level(logging.WARNING, logger="duckpipe.client.shm")
    first = segments(backing="auto")
    second = segments(backing="auto")
    assert first.backing is second.backing is Backing.DEVSHM
    assert first.header.page_size == PAGE
    warnings = [r for r in caplog.records if r.name == "duckpipe.client.shm"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].levelno == logging.WARNING
    assert "4 KiB pages" in warnings[0].getMessage()
    assert "hugepages are disabled" in warnings[0].getMessage()


# --- open refuses what is not ours ----------------------------------------------


def test_open_refuses_another_abi_major_version(segments) -> None:
    seg = segments()
    seg.header.abi_major = 99
    with pytest.raises(
        AbiMismatch, match=rf"ABI 99\.{ABI_MINOR}, this duckpipe speaks {ABI_MAJOR}"
    ):
        Segment.open(seg.path)


@pytest.mark.parametrize(
    "field,value",
    [("ring_offset", 1 << 30), ("ring_capacity", 1 << 20), ("act_offset", 64), ("desc_size", 64)],
)
def test_open_refuses_a_header_whose_layout_this_version_would_not_write(
    segments, field: str, value: int
) -> None:
    seg = segments()
    setattr(seg.header, field, value)
    with pytest.raises(SegmentError, match=r"layout|ring capacity"):
        Segment.open(seg.path)


@pytest.mark.parametrize(
    "field,value,code",
    [
        ("magic", 0, "NO_MAGIC"),
        ("abi_major", ABI_MAJOR + 1, "ABI_MAJOR"),
        ("header_size", 64, "STRUCT_SIZES"),
        ("backing", 7, "BACKING"),
        ("slot_count", 3, "BAD_SLOT_COUNT"),
        ("res_offset", 4096, "LAYOUT"),
        ("act_slot_size", (1 << 64) - 1, "OVERFLOW"),
    ],
)
def test_open_fd_refuses_what_the_dataplanes_header_check_refuses(
    segments, field: str, value: int, code: str
) -> None:
    """One check for a header another process wrote: Segment.open_fd (the mock dataplane's
    attach) asks dp_seg_check() of dp_seg_plan.h, the function the C dataplane calls."""
    seg = segments()
    setattr(seg.header, field, value)
    raw = os.pread(seg.fd, ffi.sizeof("struct dp_seg_header"), 0)
    h = ffi.cast("struct dp_seg_header *", ffi.from_buffer(raw))
    want = getattr(lib, f"DP_SEG_CHECK_{code}", None) or getattr(lib, f"DP_SEG_PLAN_{code}")
    out = ffi.new("struct dp_seg_plan *")
    assert lib.dp_seg_check(h, seg.size, 1 << 20, 1 << 40, out) == want
    with pytest.raises(AbiMismatch if code == "ABI_MAJOR" else SegmentError):
        Segment.open_fd(os.getpid(), seg.fd)


def test_a_tag_too_long_for_the_header_is_refused_before_any_memfd_exists() -> None:
    before = {s.name for s in list_segments()}
    with pytest.raises(BadInput, match="too long"):
        Segment.create(slot_count=1, act_slot_size=4096, backing="devshm", tag="x" * 150)
    assert {s.name for s in list_segments()} == before


def test_open_fd_refuses_a_descriptor_that_is_not_a_memfd(tmp_path: Path) -> None:
    path = tmp_path / "duckpipe-lookalike"
    path.write_bytes(bytes(2 * PAGE))
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(SegmentError, match="not a duckpipe memfd"):
            Segment.open_fd(os.getpid(), fd)
    finally:
        os.close(fd)


def test_open_fd_refuses_an_unsealed_memfd() -> None:
    fd = os.memfd_create(host.segment_prefix() + "unsealed", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 2 * PAGE)
        with pytest.raises(SegmentError, match="not sealed"):
            Segment.open_fd(os.getpid(), fd)
    finally:
        os.close(fd)


def test_open_fd_refuses_a_segment_with_holes(segments) -> None:
    seg = segments(slot_count=2)
    assert _punch(seg.fd, int(seg.header.res_offset), PAGE) == 0
    with pytest.raises(SegmentError, match="must pre-fault it"):
        Segment.open_fd(os.getpid(), seg.fd)


def test_open_fd_refuses_a_segment_another_pid_made(segments) -> None:
    seg = segments()
    seg.header.creator_pid = os.getpid() + 1
    with pytest.raises(SegmentError, match=f"made by pid {os.getpid() + 1}"):
        Segment.open_fd(os.getpid(), seg.fd)


def test_open_fd_refuses_segments_over_the_limits(segments) -> None:
    seg = segments(slot_count=8)
    with pytest.raises(SegmentError, match="over this dataplane's client_max_slots 4;"):
        Segment.open_fd(os.getpid(), seg.fd, max_slots=4)
    with pytest.raises(SegmentError, match="over this dataplane's client_max_segment_bytes"):
        Segment.open_fd(os.getpid(), seg.fd, max_bytes=seg.size - 1)


def test_an_opened_segment_keeps_its_layout_when_the_header_is_rewritten(segments) -> None:
    seg = segments(slot_count=4)
    peer = Segment.open_fd(os.getpid(), seg.fd)
    try:
        seg.header.slot_count = 1 << 20
        seg.header.act_slot_size = 1 << 40
        seg.header.ring_capacity = 1 << 30
        assert (peer.slot_count, peer.ring_capacity, peer.act_slot_size) == (4, 4, 4096)
        assert len([peer.act_bytes(i) for i in range(peer.slot_count)]) == 4
    finally:
        peer.close()


def test_open_refuses_a_file_without_magic(tmp_path: Path) -> None:
    path = tmp_path / "not-a-segment"
    path.write_bytes(bytes(2 * PAGE))
    with pytest.raises(SegmentError, match="no duckpipe segment header"):
        Segment.open(path)


def test_open_refuses_a_file_too_small_to_be_a_segment(tmp_path: Path) -> None:
    path = tmp_path / "tiny"
    path.write_bytes(b"DUCKSEG1")
    with pytest.raises(SegmentError, match="too small"):
        Segment.open(path)


def test_open_of_a_missing_segment_asks_whether_the_client_lives(tmp_path: Path) -> None:
    with pytest.raises(SegmentError, match="is the client alive"):
        Segment.open(tmp_path / "gone")


# --- listing and cleaning -------------------------------------------------------

_CREATE_AND_SLEEP = """
import sys, time
from duckpipe._abi.shm import Segment
seg = Segment.create(slot_count=1, act_slot_size=4096, backing="devshm", tag="orphan")
print(seg.name, flush=True)
time.sleep(60)
"""


def _info(name: str):
    return next((s for s in list_segments() if s.name == name), None)


def test_a_killed_creators_memfd_is_gone_with_it(segments) -> None:
    live = segments()
    child = subprocess.Popen(
        [sys.executable, "-c", _CREATE_AND_SLEEP], stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([child.stdout], [], [], 30.0)
        assert ready, "the child printed no segment name within 30 s"
        name = child.stdout.readline().strip()  # type: ignore[union-attr]
        listed = _info(name)
        assert listed is not None and listed.kind == "memfd" and listed.creator_alive
        assert listed.creator_pid == child.pid and listed.readable
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()  # type: ignore[union-attr]
    assert _info(name) is None and not mapped_by(name)  # nothing left to clean
    alive = _info(live.name)
    assert alive is not None and alive.creator_alive and alive.creator_pid == os.getpid()
    assert alive.path == live.path


@pytest.fixture
def old_style_file(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A segment file as clients of segment ABI 1.0 left them on a hugetlbfs mount: unreadable and
    old. The "mount" is a private directory: a dataplane cleaning /dev/shm at its start in
    another test must not take it first."""
    monkeypatch.setenv("DUCKPIPE_HUGETLBFS", str(tmp_path))
    path = tmp_path / f"{host.segment_prefix()}1-old-{os.getpid()}"
    path.write_bytes(b"")
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    yield path


def test_clean_removes_old_segment_files_and_leaves_memfds(old_style_file, segments) -> None:
    live = segments()
    old = _info(old_style_file.name)
    assert old is not None and old.kind == "file" and not old.readable
    # (other duckpipe checkouts on this host may leave files of their own to clean)
    would = clean_segments(dry_run=True)
    assert old_style_file in {s.path for s in would} and old_style_file.exists()
    assert all(s.kind == "file" for s in would)
    assert old_style_file in {s.path for s in clean_segments()}
    assert not old_style_file.exists()
    assert _info(live.name) is not None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_shm_ls_lists_live_memfds_and_clean_says_they_need_none(
    old_style_file, segments
) -> None:
    live = segments()
    ls = _cli("shm", "ls")
    assert ls.returncode == 0, ls.stderr
    row = next((line for line in ls.stdout.splitlines() if live.name in line), None)
    assert row is not None, ls.stdout
    assert "memfd" in row.split() and "devshm" in row.split() and "yes" in row.split()
    assert str(live.path) in row

    as_json = _cli("shm", "ls", "--json")
    assert as_json.returncode == 0, as_json.stderr
    listed = {s["name"]: s for s in json.loads(as_json.stdout)}
    assert listed[live.name]["creator_alive"] is True
    assert listed[live.name]["kind"] == "memfd"

    dry = _cli("shm", "clean", "--dry-run")
    assert dry.returncode == 0 and f"would remove {old_style_file} " in dry.stdout, dry.stderr
    # the package is 0.1.0: "1.1" is the segment ABI's version, and says so
    assert "duckpipe before" not in dry.stdout and "segment ABI 1.0" in dry.stdout, dry.stdout
    assert old_style_file.exists()
    clean = _cli("shm", "clean")
    assert clean.returncode == 0, clean.stderr
    assert f"removed {old_style_file} " in clean.stdout
    assert "memfd segments need no cleaning" in clean.stdout
    assert live.name not in clean.stdout and not old_style_file.exists()
