"""Parking: idle CPU and the first forward after idle, socket backend beside the dpdk one.

``python -m duckpipe.bench.park_idle`` (root). One namespace with two echo ducks behind a
veth pair whose near end is in a root-namespace bridge; in the same bridge a tap
interface made beforehand (``multi_queue pi``, what DPDK's tap PMD asks for). Rows, one
after the other, against the same ducks over the same veth, idle = "backoff", shared
threads:

- ``socket``: the bridge gets the host address; the kernel's UDP socket wakes the worker;
- ``dpdk net_tap``: the dpdk backend on net_tap, whose RX queue has an interrupt fd: a
  parked worker sleeps on it (dp_dpdk_intr.c);
- ``dpdk net_af_packet``: the dpdk backend on net_af_packet over the bridge: no RX
  interrupt, a parked worker polls every 100 µs.

Per row: the dataplane's CPU (all its threads, /proc/<pid>/task/*/stat) over ``IDLE_S``
seconds with a client attached and nothing to do, and the median of ``ROUNDS`` first
forwards, each after a second of idle. Printed with their ratios to the socket row.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import duckpipe
from duckpipe import GeluMlp

from ..launch.binaries import find_binary
from ..launch.dataplane import DataplaneProcess
from ..launch.process import stop_process
from ..launch.topology import Duck, Nic, Topology

__all__ = ["main"]

DUCK_PORT = 47400
HOST_PORT = 47500
IDLE_S = 10.0
ROUNDS = 7


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _cpu_s(pid: int) -> float:
    ticks = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _measure(topo: Topology, eal: list[str], after_start: list[list[str]]) -> tuple[float, float]:
    dp = DataplaneProcess(topo, backend_args=eal)
    try:
        dp.start()
        for cmd in after_start:
            _ip(*cmd)
        with duckpipe.connect(dp.control) as c:
            mlp = GeluMlp.random(256, 64, seed=1)
            c.load_weights(1, mlp)
            x = np.ones((1, 256), np.float32)
            for _ in range(20):
                c.forward(1, x, timeout=5)
            time.sleep(1.0)
            cpu0 = _cpu_s(dp.pid)
            time.sleep(IDLE_S)
            cpu = (_cpu_s(dp.pid) - cpu0) / IDLE_S
            firsts = []
            for _ in range(ROUNDS):
                time.sleep(1.0)
                t = time.perf_counter()
                c.forward(1, x, timeout=5)
                firsts.append(time.perf_counter() - t)
        return cpu, statistics.median(firsts)
    finally:
        dp.stop()
        dp.close()


def main() -> int:
    if os.geteuid() != 0:
        print("park_idle: needs root (namespaces, DPDK)", file=sys.stderr)
        return 77
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    subnet = f"10.80.{random.randrange(1, 250)}"
    ns, near, far = f"dpk{tag}", f"dpk{tag}h"[:15], f"dpk{tag}d"[:15]
    br, tap = f"dpk{tag}b"[:15], f"dpk{tag}t"[:15]
    ips = [f"{subnet}.10", f"{subnet}.11"]
    ducks = [Duck(id=i, ip=ip, port=DUCK_PORT + i) for i, ip in enumerate(ips)]
    proc = None
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", br, "type", "bridge", "stp_state", "0")
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("tuntap", "add", "dev", tap, "mode", "tap", "multi_queue", "pi")
        _ip("link", "set", far, "netns", ns)
        for dev in (br, near, tap):
            v6 = Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6")
            if v6.exists():
                v6.write_text("1")
        _ip("link", "set", near, "master", br)
        _ip("link", "set", tap, "master", br)
        for dev in (br, near, tap):
            _ip("link", "set", dev, "up")
        _ip("-n", ns, "link", "set", far, "up")
        for ip in ips:
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", far)
        proc = subprocess.Popen(
            [
                "ip", "netns", "exec", ns, str(find_binary("duckpipe-ducks")),
                "--ducks", "2", "--bind", ",".join(ips), "--base-port", str(DUCK_PORT),
                "--no-gso", "--compute", "echo",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None and "2 ducks" in proc.stdout.readline()
        host = f"{subnet}.1"

        def eal(vdev: str) -> list[str]:
            prefix = f"duckpipe-park{tag}"
            return ["--no-pci", "--in-memory", "--no-telemetry", "--file-prefix", prefix,
                    "-l", "0", vdev]  # fmt: skip

        def topo(backend: str, interface: str) -> Topology:
            nic = Nic(name="p0", backend=backend, interface=interface, host_ip=host,
                      host_port=HOST_PORT, ducks=ducks)  # fmt: skip
            return Topology(nics=[nic], max_inflight=16, max_forward_bytes=256 << 10)

        rows: list[tuple[str, float, float]] = []
        _ip("addr", "add", f"{host}/24", "dev", br)
        rows.append(("socket", *_measure(topo("socket", ""), [], [])))
        _ip("addr", "del", f"{host}/24", "dev", br)
        _ip("-n", ns, "neigh", "flush", "dev", far)
        # the tap PMD gives the tap interface the port's MAC: the bridge must not own it
        mac = "02:" + ":".join(f"{random.randrange(256):02x}" for _ in range(5))
        rows.append((
            "dpdk net_tap (RX interrupt)",
            *_measure(topo("dpdk", "net_tap0"), eal(f"--vdev=net_tap0,iface={tap}"),
                      [["link", "set", tap, "address", mac]]),
        ))  # fmt: skip
        _ip("-n", ns, "neigh", "flush", "dev", far)
        rows.append((
            "dpdk net_af_packet (polls 100 µs)",
            *_measure(topo("dpdk", "net_af_packet0"), eal(f"--vdev=net_af_packet0,iface={br}"), []),
        ))  # fmt: skip
        base_cpu, base_first = rows[0][1], rows[0][2]
        print(f"| row | idle CPU ({IDLE_S:.0f} s, % of a core) | / socket | "
              f"first forward after 1 s idle, median of {ROUNDS} (µs) | / socket |")  # fmt: skip
        print("|---|---|---|---|---|")
        for name, cpu, first in rows:
            cpu_ratio = cpu / base_cpu if base_cpu else float("inf")
            print(f"| {name} | {cpu * 100:.2f} | {cpu_ratio:.2f} "
                  f"| {first * 1e6:.0f} | {first / base_first:.2f} |")  # fmt: skip
        return 0
    finally:
        if proc is not None:
            stop_process(proc)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for dev in (near, br):
            subprocess.run(["ip", "link", "del", dev], capture_output=True)
        subprocess.run(["ip", "tuntap", "del", "dev", tap, "mode", "tap", "multi_queue", "pi"],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(f"/var/run/dpdk/duckpipe-park{tag}", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
