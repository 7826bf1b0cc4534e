"""A client that attacks the people watching: the monitoring tools and their terminals.

``duckpipe stats``, ``duckpipe-top`` (and the snapshot reader behind it) and the
Prometheus exporter read the dataplane's stats segment. What a client controls (the
memory behind its segment's file descriptor, its name) must not kill them or reach the
admin's terminal raw. Runs against the mock and the C dataplane (``dataplane`` fixture),
and under the sanitizer build with the other hostile tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

import duckpipe
from duckpipe._abi.shm import Segment
from duckpipe.errors import BadInput
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.mock.stats_writer import StatsWriter
from duckpipe.observe import exporter
from duckpipe.observe import stats_reader as stats
from duckpipe.schema import control as ctl
from duckpipe.schema import stats as S
from duckpipe.schema.abi import ABI_MAJOR
from duckpipe.schema.control import ErrorCode

BIN = Path(sys.executable).parent
OBSERVE_SECONDS = 4.0

# A client that attaches, then puts an unsealed memfd of its segment's name on its
# segment's descriptor and flips that memfd's size between 64 KiB and 0 as fast as it
# can: a tool that found the segment through /proc/<pid>/fd and mapped it takes SIGBUS
# when a page it maps is cut away under it (issue 17, point 1).
FLIPPER = textwrap.dedent(
    """
    import os, struct, sys
    import duckpipe
    from duckpipe.schema import abi
    from duckpipe.schema.layout import layout_of

    c = duckpipe.connect(sys.argv[1], name="flipper")
    fd = int(str(c.segment).rsplit("/", 1)[1])
    fake = os.memfd_create(c.segment_name, 0)  # no MFD_ALLOW_SEALING: it can shrink
    os.dup2(fake, fd)
    os.close(fake)
    header = bytearray(4096)  # a header that passes a magic check, ring at 64
    struct.pack_into("<Q", header, 0, abi.SEG_MAGIC)
    off = layout_of(abi.SegHeader).field("ring_offset").offset
    struct.pack_into("<Q", header, off, 64)
    print(c.client_id, flush=True)
    while True:
        os.ftruncate(fd, 64 * 1024)
        os.pwrite(fd, header, 0)
        os.ftruncate(fd, 0)
    """
)

# The three readers, in a loop for OBSERVE_SECONDS: read_snapshot (what duckpipe stats and
# duckpipe-top call), duckpipe-top's own reader, the exporter's collector. Prints how many
# snapshots named the flipper.
OBSERVER = textwrap.dedent(
    """
    import argparse, sys, time
    from duckpipe.observe import exporter, stats_reader, top

    control, client_id, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    args = argparse.Namespace(stats=None, control=control)
    read_top = top._reader(args)
    collector = exporter.SnapshotCollector(control=control)
    seen = reads = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for snap in (stats_reader.read_snapshot(control=control), read_top()):
            reads += 1
            seen += any(c.id == client_id for c in snap.clients)
        families = list(collector.collect())
        assert families[0].samples[0].value == 1, families[0]
    print(seen, reads, flush=True)
    """
)


@contextmanager
def _flipper(control: str) -> Iterator[int]:
    p = subprocess.Popen(
        [sys.executable, "-c", FLIPPER, control], stdout=subprocess.PIPE, text=True
    )
    try:
        line = p.stdout.readline() if p.stdout else ""
        assert line.strip().isdigit(), f"the flipper did not attach (exit {p.poll()})"
        yield int(line)
    finally:
        p.kill()
        p.wait(timeout=10)


def _died_of(rc: int) -> str:
    return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"


def test_a_client_flipping_its_segment_size_kills_no_monitoring_tool(dataplane):
    with _flipper(dataplane.control) as client_id:
        observer = subprocess.run(
            [
                sys.executable,
                "-c",
                OBSERVER,
                dataplane.control,
                str(client_id),
                str(OBSERVE_SECONDS),
            ],
            capture_output=True,
            text=True,
            timeout=60 + OBSERVE_SECONDS,
        )
        assert observer.returncode == 0, (
            f"the snapshot readers died ({_died_of(observer.returncode)}): {observer.stderr}"
        )
        seen, reads = map(int, observer.stdout.split())
        assert seen == reads > 0  # the flipper stays listed: read from the dataplane's view
        for cmd in (
            [str(BIN / "duckpipe"), "stats", "--control", dataplane.control],
            [str(BIN / "duckpipe-top"), "--once", "--control", dataplane.control],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{cmd[0]} {_died_of(done.returncode)}: {done.stderr}"
            assert "flipper" in done.stdout
    # the dataplane never read the flipped memfd either: it mapped the segment at attach
    assert stats.read_snapshot(control=dataplane.control).dataplane.alive


# --- names that would drive the admin's terminal (issue 17, point 4) -----------------------

# the name: retitles the terminal window, then clears the screen
EVIL = "\x1b]0;PWN\x07\x1b[2J"
TERMINAL_CONTROLS = ("\x1b", "\x07")


def _attach_raw(control: str, seg: Segment, name: str, segment: str) -> ctl.Error | None:
    """One Attach of ``seg`` as this process, naming it as told; the reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    try:
        msg = ctl.Attach(
            req_id=7, abi_major=ABI_MAJOR, pid=os.getpid(), segment=segment, name=name,
            segment_fd=seg.fd,
        )  # fmt: skip
        sock.send(ctl.encoder.encode(msg))
        assert sock.poll(5000), "no reply to Attach"
        return ctl.reply_decoder.decode(sock.recv())
    finally:
        sock.close()


def test_a_name_with_terminal_controls_is_refused_at_attach(dataplane):
    with pytest.raises(BadInput, match=r"printable ASCII \(0x20-0x7e\)"):
        duckpipe.connect(dataplane.control, name=EVIL)  # said before a segment is made
    # past the client library: each dataplane refuses it, naming the field and the byte
    seg = Segment.create(slot_count=4, act_slot_size=4096, tag="named")
    try:
        for name, segment, field in ((EVIL, seg.name, "name"), ("ok", EVIL, "segment")):
            reply = _attach_raw(dataplane.control, seg, name, segment)
            assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.BAD_REQUEST, reply
            assert reply.message == (
                f"Attach.{field} must be printable ASCII (0x20-0x7e): byte 0 is 0x1b"
            )
        # "$" in a pattern lets a final newline through: not this one
        reply = _attach_raw(dataplane.control, seg, "ok\n", seg.name)
        assert isinstance(reply, ctl.Error) and "byte 2 is 0x0a" in reply.message, reply
    finally:
        seg.close()
    # the memfd's own name, which the stats segment shows as the client's segment
    seg = Segment.create(slot_count=4, act_slot_size=4096, tag=EVIL)
    try:
        reply = _attach_raw(dataplane.control, seg, "ok", "ok")
        assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.BAD_SEGMENT, reply
        assert "memfd's name must be printable ASCII (0x20-0x7e)" in reply.message
        assert not any(ch in reply.message for ch in TERMINAL_CONTROLS)
    finally:
        seg.close()
    with duckpipe.connect(dataplane.control, name="after") as c:  # and it serves on
        assert c.client_id > 0


def _planted(tmp_path: Path) -> tuple[StatsWriter, Path]:
    """A live stats segment (this process writes it, as a mock would) that lists a client
    named EVIL with a segment named EVIL: what an older dataplane could publish."""
    writer = StatsWriter(f"ipc://{tmp_path}/control", nducks=2)
    writer.client_attached(
        1, os.getpid(), EVIL, f"duckpipe-{EVIL}", page_size=4096, capacity=8, slot_count=8
    )
    writer.tick(dict.fromkeys(S.COUNTER_NAMES, 0), epoch=1)
    return writer, writer.path


def test_every_human_readable_view_escapes_terminal_controls(tmp_path):
    writer, path = _planted(tmp_path)
    try:
        assert stats.read_snapshot(path).clients[0].name == EVIL  # the data keeps it whole
        views = {
            "duckpipe stats": [str(BIN / "duckpipe"), "stats", "--stats", str(path)],
            "duckpipe-top --once": [str(BIN / "duckpipe-top"), "--once", "--stats", str(path)],
        }
        for what, cmd in views.items():
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{what}: {done.stderr}"
            shown = done.stdout + done.stderr
            assert not any(ch in shown for ch in TERMINAL_CONTROLS), f"{what}: {shown!r}"
            assert "\\x1b]0;PWN\\x07\\x1b[2J" in done.stdout, f"{what}: {done.stdout}"
        metrics = exporter.render(stats=path)
        assert not any(ch in metrics for ch in TERMINAL_CONTROLS)
        assert 'name="\\\\x1b]0;PWN\\\\x07' in metrics  # the label, escaped (and \ doubled)
    finally:
        writer.close()


# the CLI's logging (the mock dataplane, `duckpipe ...`), one warning carrying EVIL and a
# forged second line
LOGGER = textwrap.dedent(
    """
    import logging, sys
    from duckpipe import cli

    cli.configure_logging(False)
    logging.getLogger("duckpipe.mock").warning("client %s attached", sys.argv[1])
    """
)


def test_python_log_lines_escape_terminal_controls_and_newlines():
    done = subprocess.run(
        [sys.executable, "-c", LOGGER, EVIL + "\nWARNING forged: line"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "WARNING duckpipe.mock: client \\x1b]0;PWN\\x07\\x1b[2J\\x0aWARNING forged: line attached\n"
    )


@pytest.mark.dataplane
def test_c_dataplane_log_lines_escape_terminal_controls(tmp_path, free_loopback):
    """Its stats path (which it logs) under a directory named EVIL: shown escaped."""
    run = tmp_path / EVIL
    run.mkdir(mode=0o700)
    with DataplaneProcess(free_loopback(), control=f"ipc://{run}/control") as dp:
        assert stats.read_snapshot(control=dp.control).dataplane.alive
        log = dp.output()
    assert "stats segment " in log and "\\x1b]0;PWN\\x07\\x1b[2J/stats" in log, log
    assert not any(ch in log for ch in TERMINAL_CONTROLS), repr(log)
