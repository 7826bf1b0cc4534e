"""The ``forward`` section's second table: duckpipe over a veth pair, socket backend beside DPDK.

One veth pair per configuration; its far end in a network namespace of its own where
``duckpipe-ducks --compute echo`` (pinned to CPU 1) listens on .10, .11, ... of
10.78.<k>.0/24 with kernel sockets (``--no-gso``: a veth hands a GSO send to af_packet
as one unsegmented super-frame; tx checksumming off on the far end, so that the ducks'
UDP checksums are filled in). The rows, one after the other against the same ducks,
``wait=block``:

- ``socket``: the near end gets the host address (.1) and the dataplane's socket
  backend sends through the kernel;
- ``dpdk af_packet`` and ``dpdk af_xdp``: the address is removed again and the dpdk
  backend drives the near end through net_af_packet / net_af_xdp (EAL ``-l 0``), the
  host address existing only in the dataplane, which answers ARP for it. af_xdp is
  left out, with the reason in the notes, where it cannot attach to the veth.

Skipped, with the reason, without root, iproute2, a DPDK build or free hugepages.
Everything made (namespace, veth, the EAL's runtime directory) is removed afterwards.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import host
from ..errors import DuckpipeError
from ..launch.binaries import find_binary
from ..launch.process import stop_process
from ..launch.topology import Duck, Nic, Topology
from . import baselines
from .common import DUCKS_CPU, Progress, Size, Table, pin
from .forward import Config, run_duckpipe, summarise

__all__ = ["COLUMNS", "ROWS", "configs", "run", "unavailable"]

DUCK_PORT = 47200
HOST_PORT = 47300
HUGEPAGES = 96  # the EAL's own memory, the port's mbuf pool, the client's segment
DPDK_RUN_DIR = Path("/var/run/dpdk")

#: docs/dpdk.md's af_packet command: a kernel ring that holds one forward's replies
#: (the PMD's default, 512 frames, is the row below it: the incast of issue 18)
AF_PACKET_FRAMECNT = 8192

#: af_xdp's RX ring before issue 18 sized it (1024 descriptors): the row beside the
#: default (the PMD's fill ring, 2048) shows what a ring smaller than one forward's replies
#: drops (rx_ring_full: rx_kernel_drops) when the worker falls behind
AF_XDP_OLD_RX_DESC = 1024

#: row name -> (label, pmd or None for the socket backend, the vdev's own arguments, the
#: NIC's rx_desc: 0 sized by the backend)
ROWS = {
    "socket": ("duckpipe, socket backend (kernel UDP on the veth)", None, "", 0),
    "dpdk_af_packet": (
        f"duckpipe, dpdk backend, net_af_packet (docs' command: framecnt={AF_PACKET_FRAMECNT})",
        "af_packet",
        f",framecnt={AF_PACKET_FRAMECNT}",
        0,
    ),
    "dpdk_af_packet_512": (
        "duckpipe, dpdk backend, net_af_packet (the PMD's default ring: 512 frames)",
        "af_packet",
        "",
        0,
    ),
    "dpdk_af_xdp": (
        "duckpipe, dpdk backend, net_af_xdp (RX ring: its fill ring's 2048)",
        "af_xdp",
        "",
        0,
    ),
    "dpdk_af_xdp_1024": (
        f"duckpipe, dpdk backend, net_af_xdp (rx_desc = {AF_XDP_OLD_RX_DESC})",
        "af_xdp",
        "",
        AF_XDP_OLD_RX_DESC,
    ),
}

COLUMNS = [
    ("config", "config"),
    ("row", "row"),
    ("p50_us", "p50 µs"),
    ("p99_us", "p99 µs"),
    ("host_overhead_p50_us", "host overhead p50 µs"),
    ("cpu_per_forward_us", "host CPU / fwd µs"),
    ("ratio_to_socket", "p50 / socket p50"),
    ("nacks_sent_per_forward", "NACKs / fwd"),
    ("rxq_overflows_per_forward", "RX drops / fwd"),
    ("lost", "lost"),
]


def unavailable() -> str:
    """Why the veth table cannot run here, or "" when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "veths, namespaces and DPDK need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("ethtool") is None:
        return "`ethtool` is not installed (apt-get install ethtool; tools/setup does)"
    try:
        dataplane = find_binary("duckpipe-dataplane")
        find_binary("duckpipe-ducks")
    except DuckpipeError as e:
        return str(e)
    have = subprocess.run([str(dataplane), "--backends"], capture_output=True, text=True)
    if "dpdk" not in have.stdout.split():
        return "the dataplane was built without DPDK (install libdpdk-dev and rebuild)"
    if host.free_hugepages() < HUGEPAGES:
        return f"{HUGEPAGES} free 2 MiB hugepages needed, {host.free_hugepages()} free"
    return ""


def configs(size: Size) -> list[tuple[int, int, int]]:
    """(ducks, rows, hidden) per configuration."""
    return size.pick([(4, 1, 1024), (8, 8, 7168)], [(4, 1, 1024)], [(2, 1, 256)])  # type: ignore[return-value]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def _veth(n: int) -> Iterator[tuple[str, str, list[str]]]:
    """A veth pair, its far end in a new namespace with n echo ducks: (near, subnet, ips)."""
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    subnet = f"10.78.{random.randrange(1, 250)}"
    ns, near, far = f"dpbench{tag}", f"dpb{tag}h"[:15], f"dpb{tag}d"[:15]
    ips = [f"{subnet}.{10 + i}" for i in range(n)]
    proc: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("link", "set", far, "netns", ns)
        v6 = Path(f"/proc/sys/net/ipv6/conf/{near}/disable_ipv6")
        if v6.exists():
            v6.write_text("1")
        _ip("link", "set", near, "up")
        _ip("-n", ns, "link", "set", far, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # the ducks' UDP checksums filled in by their kernel: with the veth's tx checksum
        # offload on they reach af_packet/af_xdp partial and the dpdk backend drops them
        # (rx_bad_checksum; docs/dpdk.md)
        subprocess.run(
            ["ip", "netns", "exec", ns, "ethtool", "-K", far, "tx", "off"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        for ip in ips:
            _ip("-n", ns, "addr", "add", f"{ip}/24", "brd", f"{subnet}.255", "dev", far)
        proc = subprocess.Popen(
            [
                "ip", "netns", "exec", ns, str(find_binary("duckpipe-ducks")),
                "--ducks", str(n), "--bind", ",".join(ips), "--base-port", str(DUCK_PORT),
                "--no-gso", "--compute", "echo",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if f"duckpipe-ducks: {n} ducks" not in line:
            raise DuckpipeError(f"the ducks in namespace {ns} did not start: {line!r}")
        pin(proc.pid, DUCKS_CPU)
        yield near, subnet, ips
    finally:
        if proc is not None:
            stop_process(proc)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", near], capture_output=True)


def run(size: Size, *, quiet: bool = False) -> Table:
    table = Table(
        key="forward_veth",
        title="forward over a veth pair into a namespace: socket backend beside the dpdk backend",
        columns=COLUMNS,
    )
    why = unavailable()
    if why:
        table.notes.append(f"skipped: {why}")
        return table
    cfgs = [Config(d, r, h) for d, r, h in configs(size)]
    iters_small, iters_big = size.pick((200, 60), (100, 20), (5, 3))  # type: ignore[misc]
    prog = Progress("forward veth", len(cfgs) * len(ROWS), quiet=quiet)
    xdp_note = ""
    for cfg in cfgs:
        iters = iters_small if cfg.rows == 1 else iters_big
        warmup = max(2, iters // 10)
        rows: dict[str, dict[str, object]] = {}
        with _veth(cfg.ducks) as (near, subnet, ips):
            ducks = [Duck(id=i, ip=ip, port=DUCK_PORT + i) for i, ip in enumerate(ips)]
            pairs = [(i, DUCK_PORT + i) for i in range(cfg.ducks)]
            for name, (label, pmd, devargs, rx_desc) in ROWS.items():
                prog.step(f"{cfg.label}: {label} x{iters}")
                nic = Nic(name="v0", host_ip=f"{subnet}.1", host_port=HOST_PORT, ducks=ducks)
                args: list[str] = []
                prefix = f"duckpipe-bench{os.getpid()}"
                if pmd is None:
                    _ip("addr", "add", f"{subnet}.1/24", "dev", near)
                else:
                    _ip("addr", "flush", "dev", near)
                    nic = Nic(name="v0", backend="dpdk", interface=f"net_{pmd}0",
                              host_ip=f"{subnet}.1", host_port=HOST_PORT, ducks=ducks,
                              rx_desc=rx_desc)  # fmt: skip
                    args = ["--no-pci", "--in-memory", "--no-telemetry", "--file-prefix", prefix,
                            "-l", "0", f"--vdev=net_{pmd}0,iface={near}{devargs}"]  # fmt: skip
                topo = Topology(nics=[nic], max_inflight=16, max_forward_bytes=256 << 10)
                try:
                    r: baselines.Samples = run_duckpipe(
                        pairs, cfg.hidden, cfg.rows, ("block",), iters=iters, warmup=warmup,
                        topology=topo, backend_args=args,
                    )["duckpipe_block"]  # fmt: skip
                except DuckpipeError as e:
                    if pmd == "af_xdp" and "no such DPDK port" in str(e):
                        xdp_note = f"net_af_xdp could not attach to the veth here: {e}"
                        continue
                    raise
                finally:
                    shutil.rmtree(DPDK_RUN_DIR / prefix, ignore_errors=True)
                row = summarise(cfg, "duckpipe_block", r)
                row["row"], row["name"] = label, name
                rows[name] = row
        base = rows["socket"]
        for row in rows.values():
            row["ratio_to_socket"] = row["p50_us"] / base["p50_us"]  # type: ignore[operator]
            table.rows.append(row)
    table.notes += [
        "One veth pair per config, the ducks (duckpipe-ducks --compute echo, kernel sockets, "
        f"--no-gso, their veth's tx checksumming off) in a namespace on CPU {DUCKS_CPU}; "
        "dataplane and client on CPU 0, "
        "wait=block, the dataplane's default idle (back-off: a parked DPDK worker polls "
        "every 100 µs).",
        "socket: kernel UDP from the near end's address; dpdk: the same near end (address "
        "removed) driven by net_af_packet / net_af_xdp with EAL -l 0; the dpdk backend copies "
        "every datagram into an mbuf but for activation chunks, sent in place (zero copy) "
        "where the port chains mbufs (af_packet).",
        f"net_af_packet with framecnt={AF_PACKET_FRAMECNT} is docs/dpdk.md's command (its "
        "target, issue 18: within 1.5x of the socket backend at 8 ducks 8x7168); the row "
        "with the PMD's default 512-frame ring shows what the kernel drops when one "
        "forward's replies (8 x 157 frames) do not fit.",
        "NACKs / fwd and RX drops / fwd: the dataplane's nacks_sent and rxq_overflows over "
        "the timed forwards (socket: SO_RXQ_OVFL; dpdk: rx_missed + rx_nombuf + "
        "rx_kernel_drops, which the worker reads every 100 ms: the last 0.1 s may be "
        "missing). A NACK with no drop is a reply time-out on a busy CPU (the duck's "
        "resent chunks then arrive twice: rx_duplicates).",
        "net_af_xdp: the kernel runs the PMD's XDP program natively on the veth and copies "
        "each frame into the XSK's RX ring (rx_desc); the PMD keeps 2048 mbufs in the fill "
        "ring, so at most 2048 frames wait for the worker: a smaller ring drops first "
        f"(rx_kernel_drops, the rx_desc = {AF_XDP_OLD_RX_DESC} row), a full fill ring "
        "after (rx_missed).",
        "A veth is not a NIC: both PMDs go through the kernel (AF_PACKET, AF_XDP in copy "
        "mode on a veth), so this compares the paths on this machine, not DPDK on hardware.",
    ]
    if xdp_note:
        table.notes.append(xdp_note)
    return table
