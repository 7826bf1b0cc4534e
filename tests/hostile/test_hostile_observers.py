"""A client that attacks the people watching: the monitoring tools and their terminals.

``duckpipe stats``, ``duckpipe-top`` (and the snapshot reader behind it) and the
Prometheus exporter read the dataplane's stats segment. What a client controls (the
memory behind its segment's file descriptor, its name) must not kill them or reach the
admin's terminal raw. Runs against the mock and the C dataplane (``dataplane`` fixture),
and under the sanitizer build with the other hostile tests.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from duckpipe.observe import stats_reader as stats

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
