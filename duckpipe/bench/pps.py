"""``duckpipe bench pps``: one worker's DPDK transmit rate beside ``dpdk-testpmd`` (issue 9).

Both on ``net_null`` (no NIC, no copy by the PMD) and on the same core
(:data:`~duckpipe.bench.common.CLIENT_CPU`), one after the other in the same run, in
rounds (duckpipe, then testpmd at each frame size), reported as medians:

- **duckpipe**: ``duckpipe-pps`` (dataplane/bench/dp_pps.c) opens the dpdk backend
  through its ops table and sends broadcast datagrams with the worker's own transmit
  calls (``dp_tx_activation`` / ``dp_tx_flush`` of dp_tx.c, the backend's ``tx_burst``):
  the chunks of one activation, each behind its own wire header, copied into mbufs behind a
  per-destination Ethernet/IPv4/UDP template, checksums in software (net_null offers no
  offload), bursts of 32.
- **testpmd**: ``dpdk-testpmd`` io-forward between ``net_null0`` and ``net_null1``, its
  forwarding lcore on the same CPU (the main lcore, which only waits, on the other);
  its frames per second are the TX packets of both ports over the forwarding time.

The smallest frame duckpipe sends is 122 bytes (Ethernet 14 + IPv4 20 + UDP 8 + the
80-byte wire header, no payload): a 64-byte frame cannot carry the wire header, so the
"small" row is that one. The other is a full 1500-byte MTU datagram (a 1514-byte frame).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from ..errors import DuckpipeError
from ..launch.binaries import find_binary
from .common import CLIENT_CPU, DUCKS_CPU, Progress, Size, Table

__all__ = ["COLUMNS", "TARGET", "run", "unavailable"]

TARGET = 0.5
TESTPMD = "dpdk-testpmd"
MTU = 1500
#: (row name, UDP payload after the wire header: a number or "mtu")
FRAMES = (("smallest (wire header only)", "0"), ("MTU 1500", "mtu"))
#: hugepage memory the two runs need at most (testpmd's pool of 8192 mbufs, duckpipe's ~5 MB)
NEED_HUGEPAGE_BYTES = 64 << 20

COLUMNS = [
    ("name", "frame"),
    ("frame_bytes", "frame bytes"),
    ("duckpipe_mpps", "duckpipe worker Mpps"),
    ("testpmd_mpps", "testpmd io-fwd Mpps"),
    ("ratio", "ratio"),
    ("ratio_min", "ratio min"),
    ("ratio_max", "ratio max"),
    ("runs", "runs"),
    ("target", "target"),
    ("duckpipe_gbps", "duckpipe Gbit/s"),
]


def _free_hugepage_bytes() -> int:
    free = size_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("HugePages_Free:"):
                free = int(line.split()[1])
            elif line.startswith("Hugepagesize:"):
                size_kb = int(line.split()[1])
    except OSError:
        return 0
    return free * size_kb * 1024


def unavailable() -> str:
    """Why this section cannot run here, or "" when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "DPDK needs root (hugepages, /dev/vfio); run as root"
    if (os.cpu_count() or 1) <= max(CLIENT_CPU, DUCKS_CPU):
        return f"testpmd needs CPUs {CLIENT_CPU} and {DUCKS_CPU} (its main lcore waits on one)"
    try:
        find_binary("duckpipe-pps")
    except DuckpipeError as e:
        return f"duckpipe-pps is not built (the dataplane was built without DPDK?): {e}"
    if not shutil.which(TESTPMD):
        return f"{TESTPMD} is not installed (Debian package dpdk-dev)"
    free = _free_hugepage_bytes()
    if free < NEED_HUGEPAGE_BYTES:
        return (
            f"{free >> 20} MiB of hugepages free, {NEED_HUGEPAGE_BYTES >> 20} MiB needed "
            "(echo 512 > /proc/sys/vm/nr_hugepages)"
        )
    return ""


#: where the EAL keeps a --file-prefix's runtime files (removed after each run)
DPDK_RUN_DIR = Path("/var/run/dpdk")
PREFIXES = ("dp-pps", "dp-testpmd")


def _eal(prefix: str) -> list[str]:
    pid = os.getpid()
    return ["--no-pci", "--in-memory", "--file-prefix", f"{prefix}-{pid}", "--log-level", "5"]


def _cleanup() -> None:
    for prefix in PREFIXES:
        shutil.rmtree(DPDK_RUN_DIR / f"{prefix}-{os.getpid()}", ignore_errors=True)


def run_duckpipe(seconds: float) -> dict[str, tuple[int, int, float]]:
    """payload arg -> (payload bytes, frame bytes, Mpps) from one duckpipe-pps run."""
    args = [
        str(find_binary("duckpipe-pps")), "--cpu", str(CLIENT_CPU), "--seconds", f"{seconds:g}",
        "--mtu", str(MTU), *(p for _, p in FRAMES), "--",
        *_eal("dp-pps"), "--vdev=net_null0", "-l", str(CLIENT_CPU),
    ]  # fmt: skip
    p = subprocess.run(args, capture_output=True, text=True, timeout=60 + 4 * seconds, check=False)
    if p.returncode != 0:
        err = p.stderr.strip()[-2000:]
        raise DuckpipeError(f"duckpipe-pps failed (exit {p.returncode}): {err}")
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("pps ")]
    if len(lines) != len(FRAMES):
        raise DuckpipeError(f"duckpipe-pps printed {p.stdout!r}")
    out = {}
    for (_, arg), f in zip(FRAMES, lines, strict=True):
        payload, frame, packets, ns = int(f[1]), int(f[2]), int(f[3]), int(f[4])
        out[arg] = (payload, frame, packets / ns * 1e3)
    return out


def run_testpmd(frame_bytes: int, seconds: float) -> float:
    """testpmd io-forward Mpps (TX of both net_null ports), forwarding lcore on CLIENT_CPU."""
    args = [
        "stdbuf", "-oL", TESTPMD, *_eal("dp-testpmd"),
        f"--vdev=net_null0,size={frame_bytes}", f"--vdev=net_null1,size={frame_bytes}",
        "-l", f"{CLIENT_CPU},{DUCKS_CPU}", "--main-lcore", str(DUCKS_CPU),
        "--", "--forward-mode=io", "--total-num-mbufs=8192",
    ]  # fmt: skip
    p = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert p.stdin is not None and p.stdout is not None
    head: list[str] = []
    try:
        t0 = None
        for line in p.stdout:  # non-interactive: it forwards until a line on stdin
            head.append(line)
            if "Press enter to exit" in line:
                t0 = time.monotonic()
                break
        if t0 is None:
            raise DuckpipeError(f"{TESTPMD} did not start forwarding: {''.join(head)[-2000:]}")
        time.sleep(seconds)
        t1 = time.monotonic()
        p.stdin.write("\n")
        p.stdin.flush()
        rest = p.stdout.read()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    m = re.search(r"Accumulated forward statistics.*?TX-packets:\s*(\d+)", rest, re.S)
    if not m:
        raise DuckpipeError(f"{TESTPMD} printed no forward statistics: {rest[-2000:]}")
    return int(m.group(1)) / (t1 - t0) / 1e6


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    seconds = float(size.pick(2.0, 1.0, 0.3))  # type: ignore[arg-type]
    runs = int(size.pick(5, 3, 1))  # type: ignore[call-overload]
    table = Table(
        key="pps",
        title="pps: one worker's DPDK transmit rate on net_null, beside dpdk-testpmd io-forward",
        columns=COLUMNS,
    )
    why = unavailable()
    if why:
        table.notes.append(f"skipped: {why}")
        return [table]
    prog = Progress("pps", runs * (1 + len(FRAMES)), quiet=quiet)
    # runs rounds, each duckpipe then testpmd at every frame size: a ratio compares two
    # measurements taken seconds apart, under the same load
    dps: list[dict[str, tuple[int, int, float]]] = []
    tps: list[list[float]] = []
    try:
        for r in range(runs):
            dp = run_duckpipe(seconds)
            dps.append(dp)
            prog.step(f"run {r + 1}/{runs}: duckpipe-pps, {len(FRAMES)} frame sizes")
            tps.append([])
            for _, arg in FRAMES:
                tps[-1].append(run_testpmd(dp[arg][1], seconds))
                prog.step(f"run {r + 1}/{runs}: testpmd io-forward, {dp[arg][1]}-byte frames")
    finally:
        _cleanup()
    for i, (name, arg) in enumerate(FRAMES):
        payload, frame, _ = dps[0][arg]
        mpps = [d[arg][2] for d in dps]
        tp = [t[i] for t in tps]
        ratios = [a / b for a, b in zip(mpps, tp, strict=True)]
        table.rows.append({
            "name": name,
            "frame_bytes": frame,
            "udp_payload_bytes": 80 + payload,
            "duckpipe_mpps": statistics.median(mpps),
            "testpmd_mpps": statistics.median(tp),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "runs": runs,
            "target": TARGET,
            "duckpipe_gbps": statistics.median(mpps) * 1e6 * frame * 8 / 1e9,
        })  # fmt: skip
    table.notes += [
        f"both on CPU {CLIENT_CPU}, one after the other, {seconds:g} s each (duckpipe after a "
        f"0.1 s warm-up), {runs} round(s) of duckpipe then testpmd at each size; Mpps columns "
        "are medians over the rounds, ratio the median of each round's ratio (min and max "
        "beside it); net_null frees what it is given and makes up what is received without "
        "touching packet data",
        "duckpipe: duckpipe-pps, the dpdk backend opened through its ops table and fed as the "
        "worker sends a forward (dp_tx_activation: all chunks queued in GSO groups of 64, then "
        "dp_tx_flush): per frame an mbuf (allocated 32 at a time), the "
        "destination's Ethernet/IPv4/UDP header template with lengths, id and checksums patched, "
        "the 80-byte wire header and payload copied and summed in one pass, IPv4 and UDP "
        "checksums in software (net_null offers no offload), broadcast to ff:ff:ff:ff:ff:ff, "
        "bursts of 32. The datagrams are the 2048 chunks of one activation (2.8 MB at MTU), each "
        "with its own wire header, sent round and round: no frame reuses bytes the previous one "
        "brought into L1. Not included: the dispatcher, client rings, replies",
        "testpmd: io-forward net_null0 <-> net_null1 (TX packets of both ports per second), "
        "forwarding lcore on the same CPU; it moves mbufs without writing a byte",
        "the smallest duckpipe frame is 122 bytes (a 64-byte frame cannot hold the 80-byte wire "
        "header); MTU: 1500-byte IP datagram, 1514-byte frame",
        "other work may share this machine: see the load average above",
    ]
    return [table]
