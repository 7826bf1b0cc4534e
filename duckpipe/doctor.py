"""``duckpipe doctor``: what this host offers duckpipe, and the command that fixes each gap.

Every check asks the kernel or the file system directly (a socket option set, a
syscall made, a file read), so the answer is this host's, not a guess from the kernel
version. A check is ``ok``, ``warn`` (duckpipe runs, slower or with less) or
``fail`` (something duckpipe needs); the exit code is 1 when any check fails.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import mmap
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from . import host

__all__ = ["Check", "checks", "run"]

# Linux constants Python's modules do not all export
_UDP_SEGMENT = 103  # linux/udp.h: UDP GSO, kernel 4.18
_SO_RXQ_OVFL = 40  # asm-generic/socket.h: receive-queue drops in a cmsg, 2.6.33
_MADV_POPULATE_WRITE = 23  # 5.14
_AF_XDP = 44  # 4.18
_SYS_EPOLL_PWAIT2 = {"x86_64": 441, "aarch64": 441}  # 5.11
_MFD_ALLOW_SEALING = 2
_F_ADD_SEALS = 1033
_F_SEAL_SHRINK, _F_SEAL_GROW = 0x0002, 0x0004


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _hugepages() -> Check:
    reserved = _read("/proc/sys/vm/nr_hugepages")
    free = _read("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    fix = "echo 512 | sudo tee /proc/sys/vm/nr_hugepages   (or: tools/setup env, as root)"
    if reserved is None or free is None:
        return Check("hugepages (2 MiB)", "warn", "no 2 MiB hugepage pool in this kernel", fix)
    detail = f"{reserved} reserved, {free} free"
    if int(free) == 0:
        return Check(
            "hugepages (2 MiB)", "warn", f"{detail}: segments fall back to 4 KiB pages", fix
        )
    return Check("hugepages (2 MiB)", "ok", detail)


def _hugetlbfs() -> Check:
    mount = host.find_hugetlbfs()
    if mount is not None:
        return Check("hugetlbfs mount", "ok", f"{mount} (writable, 2 MiB pages)")
    return Check(
        "hugetlbfs mount",
        "warn",
        "none writable: segments do not need one (MFD_HUGETLB memfds); DPDK without "
        "--in-memory does",
        "sudo mkdir -p /dev/hugepages && sudo mount -t hugetlbfs -o pagesize=2M none "
        "/dev/hugepages",
    )


def _duckpipe_program(proc) -> str:
    """The duckpipe program ``proc`` runs ("duckpipe-dataplane", "duckpipe-ducks", the
    mock's "duckpipe mock-dataplane") when it is this user's; "" otherwise."""
    try:
        if proc.uids().real != os.getuid():
            return ""
        argv = proc.cmdline()
    except Exception:  # gone, or not ours to read
        return ""
    first = os.path.basename(argv[0]) if argv else ""
    if first in ("duckpipe-dataplane", "duckpipe-ducks"):
        return first
    if "duckpipe" in argv[:4] or any(a.endswith("/duckpipe") for a in argv[:2]):
        for command in ("mock-dataplane", "dataplane", "ducks"):
            if command in argv:
                return f"duckpipe {command}"
    return ""


def _port_holders(ports: list[int]) -> dict[int, tuple[int, str]]:
    """UDP port -> (pid, the duckpipe program of this user's holding it, or "") for the
    ports whose holder this user may see (psutil reads /proc: its own processes)."""
    if not ports:
        return {}
    import psutil

    try:
        conns = psutil.net_connections(kind="udp4")
    except (psutil.Error, OSError):
        return {}
    out: dict[int, tuple[int, str]] = {}
    for c in conns:
        if c.laddr and c.laddr.port in ports and c.pid:
            try:
                name = _duckpipe_program(psutil.Process(c.pid))
            except psutil.Error:
                name = ""
            out[c.laddr.port] = (c.pid, name)
    return out


def _ports() -> Check:
    try:
        host_port, duck, why = host.default_ports()
    except Exception as e:  # a bad $DUCKPIPE_PORT_BASE
        return Check("default ports", "fail", str(e), "unset DUCKPIPE_PORT_BASE or fix it")
    busy = [p for p in [host_port, *range(duck, duck + 8)] if not host.udp_port_free(p)]
    detail = f"dataplane {host_port}, ducks {duck}.. ({why})"
    holders = _port_holders(busy)
    ours = {pid: name for pid, name in holders.values() if name}
    if busy and len(holders) == len(busy) and all(name for _, name in holders.values()):
        # the user's own cluster holds them: its ports are in use because it runs
        running = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(ours.items()))
        return Check(
            "default ports",
            "ok",
            f"{detail}: in use by your running {running}: the default cluster is up "
            "(`duckpipe stats` shows it, `duckpipe shutdown` stops the dataplane)",
        )
    if busy:
        return Check(
            "default ports",
            "warn",
            f"{detail}: UDP {', '.join(map(str, busy))} in use",
            f"DUCKPIPE_PORT_BASE=<another base> duckpipe ...   (see: ss -ulpn | grep {busy[0]})",
        )
    return Check("default ports", "ok", f"{detail}: free on 127.0.0.1")


# meson finds libdpdk when it sets a build up: a new install or a fresh setup picks it up
_REBUILD = "pip install . again, or tools/setup env in a checkout"


def _dpdk() -> list[Check]:
    out = []
    libs = glob.glob("/usr/lib/*/librte_eal.so*") + glob.glob("/usr/local/lib*/**/librte_eal.so*")
    pc = shutil.which("pkg-config")
    version = None
    if pc:
        r = subprocess.run([pc, "--modversion", "libdpdk"], capture_output=True, text=True)
        version = r.stdout.strip() if r.returncode == 0 else None
    fix = "sudo apt-get install dpdk dpdk-dev libdpdk-dev, then rebuild: " + _REBUILD
    if libs:
        out.append(
            Check("DPDK library", "ok", f"{libs[0]}" + (f" (libdpdk {version})" if version else ""))
        )
    else:
        out.append(Check("DPDK library", "warn", "librte_eal not found (dpdk backend off)", fix))
    pmds = sorted(glob.glob("/usr/lib/*/dpdk/pmds-*/librte_net_*.so*"))
    if pmds:
        names = sorted({Path(p).name.split(".so")[0].removeprefix("librte_net_") for p in pmds})
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        out.append(Check("DPDK PMDs", "ok", f"{len(names)} in {Path(pmds[0]).parent}: {shown}"))
    else:
        out.append(Check("DPDK PMDs", "warn", "no net PMDs found", fix))
    try:
        from .launch.binaries import find_binary

        binary = find_binary("duckpipe-dataplane")
        r = subprocess.run([str(binary), "--backends"], capture_output=True, text=True, timeout=10)
        have = r.stdout.split()
        if "dpdk" in have:
            out.append(Check("dataplane backends", "ok", f"{' '.join(have)} ({binary})"))
        else:
            out.append(
                Check(
                    "dataplane backends",
                    "warn",
                    f"{' '.join(have) or '?'}: built without DPDK ({binary})",
                    "install libdpdk-dev, then rebuild: " + _REBUILD,
                )
            )
    except Exception as e:
        out.append(Check("dataplane backends", "fail", str(e), "build it: " + _REBUILD))
    return out


def _sockopt(level: int, opt: int, value: int) -> OSError | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(level, opt, value)
        except OSError as e:
            return e
    return None


def _udp_gso() -> Check:
    err = _sockopt(socket.IPPROTO_UDP, _UDP_SEGMENT, 1400)
    if err is None:
        return Check("UDP GSO (UDP_SEGMENT)", "ok", "socket backend sends a batch per call")
    return Check(
        "UDP GSO (UDP_SEGMENT)",
        "warn",
        f"refused ({err.strerror}): the socket backend falls back to sendmmsg",
        "a kernel >= 4.18 (gso = false in the topology silences the warning)",
    )


def _rxq_ovfl() -> Check:
    err = _sockopt(socket.SOL_SOCKET, _SO_RXQ_OVFL, 1)
    if err is None:
        return Check("SO_RXQ_OVFL", "ok", "receive-queue drops are counted")
    return Check(
        "SO_RXQ_OVFL",
        "warn",
        f"refused ({err.strerror}): rx drops in the socket go uncounted",
        "a kernel >= 2.6.33",
    )


def _madv_populate_write() -> Check:
    with mmap.mmap(-1, mmap.PAGESIZE) as m:
        try:
            m.madvise(_MADV_POPULATE_WRITE)
        except OSError as e:
            return Check(
                "MADV_POPULATE_WRITE",
                "warn",
                f"refused ({e.strerror}): segments are faulted in by touching each page",
                "a kernel >= 5.14",
            )
    return Check("MADV_POPULATE_WRITE", "ok", "segments are faulted in with one call per step")


def _memfd_seals() -> Check:
    fix = "a kernel >= 3.17 with memfd_create"
    try:
        fd = os.memfd_create("duckpipe-doctor", _MFD_ALLOW_SEALING)
    except (OSError, AttributeError) as e:
        return Check("memfd seals", "fail", f"memfd_create: {e}", fix)
    try:
        os.ftruncate(fd, 4096)
        fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_SHRINK | _F_SEAL_GROW)
    except OSError as e:
        return Check("memfd seals", "fail", f"F_ADD_SEALS refused ({e.strerror})", fix)
    finally:
        os.close(fd)
    return Check("memfd seals", "ok", "segments are sealed against shrinking and growing")


def _epoll_pwait2() -> Check:
    nr = _SYS_EPOLL_PWAIT2.get(platform.machine())
    if nr is None:
        return Check("epoll_pwait2", "warn", f"unknown syscall number on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(nr, -1, None, 0, None, None, 0)  # a bad fd: EBADF if it exists
    err = ctypes.get_errno()
    if rc == -1 and err == errno.ENOSYS:
        return Check(
            "epoll_pwait2",
            "warn",
            "missing: parked agents wake at millisecond, not microsecond, granularity",
            "a kernel >= 5.11",
        )
    return Check("epoll_pwait2", "ok", "parked agents sleep with microsecond timeouts")


def _af_xdp() -> Check:
    try:
        s = socket.socket(_AF_XDP, socket.SOCK_RAW, 0)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            return Check("AF_XDP", "warn", "present, but needs CAP_NET_RAW (run as root)", "sudo")
        return Check(
            "AF_XDP",
            "warn",
            f"unavailable ({e.strerror}): the dpdk backend's net_af_xdp PMD cannot run",
            "a kernel >= 4.18 with CONFIG_XDP_SOCKETS=y",
        )
    s.close()
    return Check("AF_XDP", "ok", "XDP sockets available (net_af_xdp)")


def checks() -> list[Check]:
    return [
        _hugepages(),
        _hugetlbfs(),
        _ports(),
        *_dpdk(),
        _udp_gso(),
        _rxq_ovfl(),
        _madv_populate_write(),
        _memfd_seals(),
        _epoll_pwait2(),
        _af_xdp(),
    ]


def run(*, json_output: bool = False) -> int:
    found = checks()
    if json_output:
        print(json.dumps([asdict(c) for c in found], indent=2))
    else:
        width = max(len(c.name) for c in found)
        for c in found:
            print(f"{c.status.upper():<4}  {c.name:<{width}}  {c.detail}")
            if c.fix and c.status != "ok":
                print(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    return 1 if any(c.status == "fail" for c in found) else 0
