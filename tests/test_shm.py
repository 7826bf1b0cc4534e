"""Shared-memory segments: creation checks, backing, header, mapping, reclamation."""

from __future__ import annotations

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
from duckpipe._native import ffi

import duckpipe.shm as shm
from duckpipe import runtime
from duckpipe.errors import AbiMismatch, BadInput, SegmentError
from duckpipe.schema.abi import ABI_MAJOR, ABI_MINOR, SEG_MAGIC, Backing
from duckpipe.shm import Segment, clean_segments, list_segments

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096
HUGE = runtime.HUGEPAGE_SIZE


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
        seg.unlink()


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


# --- /dev/shm backing -----------------------------------------------------------


def test_devshm_segment_is_a_private_file_with_the_user_prefix(segments) -> None:
    seg = segments()
    st = os.stat(seg.path)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert seg.path.parent == Path("/dev/shm")
    assert seg.name.startswith(runtime.segment_prefix())
    assert seg.backing is Backing.DEVSHM


def test_devshm_segment_is_whole_pages_with_page_aligned_slots(segments) -> None:
    seg = segments(slot_count=4, act_slot_size=5000, res_slot_size=100)
    h = seg.header
    assert seg.size % PAGE == 0
    assert os.stat(seg.path).st_size == seg.size
    assert h.act_offset % PAGE == 0 and h.res_offset % PAGE == 0
    assert (seg.act_slot_size, seg.res_slot_size) == (8192, 4096)
    for i in range(seg.slot_count):
        assert seg.act_bytes(i).ctypes.data % PAGE == 0, f"activation slot {i}"
        assert seg.res_bytes(i).ctypes.data % PAGE == 0, f"result slot {i}"
    # regions follow one another without overlap and fit in the file
    ring_end = h.ring_offset + 128 + seg.ring_capacity * h.desc_size
    assert h.header_size <= h.ring_offset and ring_end <= h.res_hdr_offset
    assert h.res_hdr_offset + 64 * seg.slot_count <= h.act_offset
    assert h.act_offset + seg.slot_count * seg.act_slot_size <= h.res_offset
    assert h.res_offset + seg.slot_count * seg.res_slot_size <= seg.size


def test_header_fields_read_back_through_open(segments) -> None:
    before = time.time_ns()
    seg = segments(slot_count=8, ring_capacity=32, act_slot_size=4096)
    peer = Segment.open(seg.path)
    try:
        h = peer.header
        assert h.magic == SEG_MAGIC
        assert (h.abi_major, h.abi_minor) == (ABI_MAJOR, ABI_MINOR)
        assert h.backing == Backing.DEVSHM and peer.backing is Backing.DEVSHM
        assert h.creator_pid == os.getpid()
        assert (h.slot_count, h.ring_capacity) == (8, 32)
        assert (peer.slot_count, peer.ring_capacity) == (8, 32)
        assert (h.header_size, h.desc_size, h.page_size) == (384, 128, PAGE)
        assert h.segment_size == seg.size == os.stat(seg.path).st_size
        assert before <= h.start_ns <= time.time_ns()
        assert ffi.string(h.name).decode() == seg.name
        assert peer.owner is False and seg.owner is True
    finally:
        peer.close()


def test_writes_through_one_mapping_are_visible_in_the_other(segments) -> None:
    seg = segments(slot_count=2, act_slot_size=4096)
    peer = Segment.open(seg.path)
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


# --- hugetlbfs backing ----------------------------------------------------------


def _require_hugepages(pages: int) -> Path:
    mount = runtime.find_hugetlbfs()
    if mount is None:
        pytest.skip("no writable hugetlbfs mount with 2 MiB pages (runtime.find_hugetlbfs())")
    free = runtime.free_hugepages()
    if free < pages:
        pytest.skip(f"{pages} free 2 MiB hugepages needed, {free} free (free_hugepages)")
    return mount


def test_hugetlbfs_segment_uses_2mib_pages_under_the_mount(segments) -> None:
    mount = _require_hugepages(3)
    seg = segments(slot_count=2, act_slot_size=1 << 20, backing="hugetlbfs")
    assert seg.backing is Backing.HUGETLBFS
    assert seg.path.parent == mount
    assert seg.name.startswith(runtime.segment_prefix())
    assert seg.header.page_size == HUGE
    assert seg.size % HUGE == 0 and seg.size > HUGE  # 4 MiB of slots plus the header
    st = os.stat(seg.path)
    assert st.st_size == seg.size and stat.S_IMODE(st.st_mode) == 0o600
    peer = Segment.open(seg.path)
    try:
        assert peer.backing is Backing.HUGETLBFS
        seg.act_bytes(1)[-1] = 0xAB
        assert peer.act_bytes(1)[-1] == 0xAB
    finally:
        peer.close()


def test_hugetlbfs_backing_without_a_mount_fails_saying_why(monkeypatch) -> None:
    monkeypatch.setenv("DUCKPIPE_HUGETLBFS", "")
    with pytest.raises(SegmentError, match="no writable hugetlbfs mount"):
        Segment.create(slot_count=1, act_slot_size=4096, backing="hugetlbfs")


def test_auto_backing_falls_back_to_devshm_and_warns_once(segments, monkeypatch, caplog) -> None:
    monkeypatch.setenv("DUCKPIPE_HUGETLBFS", "")
    monkeypatch.setattr(shm, "_fallback_logged", False)
    caplog.set_level(logging.WARNING, logger="duckpipe.shm")
    first = segments(backing="auto")
    second = segments(backing="auto")
    assert first.backing is second.backing is Backing.DEVSHM
    assert first.path.parent == Path("/dev/shm")
    assert first.header.page_size == PAGE
    warnings = [r for r in caplog.records if r.name == "duckpipe.shm"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].levelno == logging.WARNING
    assert "/dev/shm" in warnings[0].getMessage()
    assert "no writable hugetlbfs mount" in warnings[0].getMessage()


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


def test_a_tag_too_long_for_the_header_is_refused_before_any_file_exists() -> None:
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(BadInput, match="too long"):
        Segment.create(slot_count=1, act_slot_size=4096, backing="devshm", tag="x" * 150)
    assert set(os.listdir("/dev/shm")) == before


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


# --- listing and reclaiming -----------------------------------------------------

_CREATE_AND_SLEEP = """
import sys, time
from duckpipe.shm import Segment
seg = Segment.create(slot_count=1, act_slot_size=4096, backing="devshm", tag="orphan")
print(seg.path, flush=True)
time.sleep(60)
"""


@pytest.fixture
def dead_segment() -> Iterator[Path]:
    """A segment whose creating process was SIGKILLed (and reaped) without unlinking it."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CREATE_AND_SLEEP], stdout=subprocess.PIPE, text=True
    )
    path = None
    try:
        ready, _, _ = select.select([child.stdout], [], [], 30.0)
        assert ready, "the child printed no segment path within 30 s"
        line = child.stdout.readline().strip()  # type: ignore[union-attr]
        assert line, f"the child exited ({child.poll()}) without printing a segment path"
        path = Path(line)
        assert path.exists()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()  # type: ignore[union-attr]
    try:
        yield path
    finally:
        shm._unlink(path)


def _info(path: Path):
    return next((s for s in list_segments() if s.path == path), None)


def test_segment_of_a_killed_creator_is_listed_dead_and_cleaned(dead_segment, segments) -> None:
    live = segments()
    dead = _info(dead_segment)
    assert dead is not None, f"{dead_segment} not listed"
    assert dead.readable and dead.backing == "devshm"
    assert dead.creator_alive is False
    alive = _info(live.path)
    assert alive is not None and alive.creator_alive is True
    assert alive.creator_pid == os.getpid()

    would = clean_segments(dry_run=True)
    assert dead_segment in {s.path for s in would} and dead_segment.exists()
    removed = {s.path for s in clean_segments()}
    assert dead_segment in removed
    assert not dead_segment.exists()
    assert live.path not in removed and live.path.exists()
    assert _info(dead_segment) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_shm_ls_and_clean_name_the_dead_segment(dead_segment, segments) -> None:
    live = segments()
    ls = _cli("shm", "ls")
    assert ls.returncode == 0, ls.stderr
    row = next((line for line in ls.stdout.splitlines() if str(dead_segment) in line), None)
    assert row is not None, ls.stdout
    assert "DEAD" in row.split() and "devshm" in row.split()

    as_json = _cli("shm", "ls", "--json")
    assert as_json.returncode == 0, as_json.stderr
    listed = {s["path"]: s for s in json.loads(as_json.stdout)}
    assert listed[str(dead_segment)]["creator_alive"] is False
    assert listed[str(live.path)]["creator_alive"] is True

    clean = _cli("shm", "clean")
    assert clean.returncode == 0, clean.stderr
    assert f"removed {dead_segment} " in clean.stdout
    assert str(live.path) not in clean.stdout
    assert not dead_segment.exists() and live.path.exists()
    assert str(dead_segment) not in _cli("shm", "ls").stdout
