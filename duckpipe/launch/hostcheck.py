"""What ``duckpipe dataplane --check`` checks on this host, beyond the topology's own rules.

A topology can be valid and still not start here: an ``interface`` this host does not
have, ``cores`` it does not have (or that this process may not run on), a ``host_ip``
that is not one of its addresses, key files it cannot read, a ``control_group`` it does
not know. Each is checked the way the dataplane will meet it, without starting anything
and without holding a port (``host_ip`` is tried with an ephemeral port, let go at once).
"""

from __future__ import annotations

import errno
import grp
import os
import re
import socket
from pathlib import Path

from .topology import Nic, Topology

__all__ = ["cpu_list", "host_problems", "online_cpus"]

SYS_NET = Path("/sys/class/net")
SYS_PCI = Path("/sys/bus/pci/devices")
CPU_SETSIZE = 1024  # glibc's cpu_set_t: the dataplane cannot pin past it
PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def online_cpus() -> set[int]:
    """The CPUs this host has online (``/sys/devices/system/cpu/online``: ``0-3,6``)."""
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return set(range(os.cpu_count() or 1))
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_list(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``, the kernel's own notation."""
    runs: list[str] = []
    for c in sorted(cpus):
        if runs and int(runs[-1].rsplit("-", 1)[-1]) == c - 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{c}"
        else:
            runs.append(str(c))
    return ",".join(runs)


def _core_problems(cores: list[int]) -> list[str]:
    online = online_cpus()
    allowed = os.sched_getaffinity(0)
    problems = []
    for core in cores:
        if core >= CPU_SETSIZE or core not in online:
            problems.append(
                f"cores: CPU {core} does not exist on this host (it has CPUs {cpu_list(online)})"
            )
        elif core not in allowed:
            problems.append(
                f"cores: CPU {core} is not one this process may run on (allowed: "
                f"{cpu_list(allowed)}; taskset, a cgroup's cpuset or isolcpus decide that)"
            )
    return problems


def _interfaces() -> list[str]:
    try:
        return sorted(p.name for p in SYS_NET.iterdir())
    except OSError:
        return [name for _, name in socket.if_nameindex()]


def _nic_problems(nic: Nic) -> list[str]:
    where = f"NIC {nic.name!r}"
    problems = []
    if nic.backend == "socket":
        if nic.interface and nic.interface not in _interfaces():
            problems.append(
                f"{where}: interface {nic.interface!r} does not exist on this host (it has: "
                f"{', '.join(_interfaces())}); `ip link` lists them"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((nic.host_ip, 0))  # an ephemeral port: host_port may be in use now
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    problems.append(
                        f"{where}: host_ip {nic.host_ip} is not an address of this host "
                        "(`ip -4 addr` lists them)"
                    )
    elif nic.backend == "dpdk" and PCI_ADDRESS.match(nic.interface):
        # a vdev (net_af_packet0, ...) is made by the EAL from its --vdev option: only a
        # PCI device has to be there already
        if not (SYS_PCI / nic.interface.lower()).exists():
            problems.append(
                f"{where}: no PCI device {nic.interface} on this host "
                "(`dpdk-devbind.py --status` lists the NICs)"
            )
    return problems


def _file_problems(topo: Topology) -> list[str]:
    problems = []
    for field in ("curve_secret_key_file", "curve_public_key_file", "curve_clients_file"):
        path = getattr(topo, field)
        if path and not os.access(path, os.R_OK):
            why = "does not exist" if not os.path.exists(path) else "is not readable by you"
            problems.append(f"{field}: {path} {why}")
    if topo.control_group:
        try:
            grp.getgrnam(topo.control_group)
        except KeyError:
            problems.append(f"control_group: no group {topo.control_group!r} on this host")
    return problems


def host_problems(topo: Topology) -> list[str]:
    """What in ``topo`` this host cannot give, one sentence each (empty: nothing)."""
    problems = _core_problems(topo.cores)
    for nic in topo.nics:
        problems += _nic_problems(nic)
    return problems + _file_problems(topo)
