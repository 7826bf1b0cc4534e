"""This host, as duckpipe's programs find it: where things live (the run directory, the
control endpoint, each user's ports, hugetlbfs) and what the kernel says of its processes
(alive since when, pidfds of a socket's peer). Not the C dataplane's src/runtime/."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import stat
import struct
import time
from pathlib import Path

import psutil

from .errors import DuckpipeError

__all__ = [
    "HUGEPAGE_SIZE",
    "PORT_BASE",
    "PeerGone",
    "check_private_dir",
    "default_control",
    "default_ports",
    "find_hugetlbfs",
    "free_hugepages",
    "monotonic_ns",
    "open_own_file",
    "peer_pidfd",
    "pidfd_exited",
    "pidfd_getfd",
    "process_alive",
    "process_start_ticks",
    "run_dir",
    "segment_prefix",
    "udp_port_free",
]

HUGEPAGE_SIZE = 2 << 20
monotonic_ns = time.monotonic_ns  # CLOCK_MONOTONIC, the clock every heartbeat uses


def segment_prefix() -> str:
    """Per-user prefix of every segment file name."""
    return f"duckpipe-{os.geteuid()}-"


def run_dir() -> Path:
    """The per-user run directory (mode 0700) that holds the control socket.

    ``$DUCKPIPE_RUN_DIR``, else ``$XDG_RUNTIME_DIR/duckpipe``, else ``/tmp/duckpipe-<uid>``.
    """
    env = os.environ.get("DUCKPIPE_RUN_DIR")
    if env:
        path = Path(env)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "duckpipe"
    else:
        path = Path("/tmp") / f"duckpipe-{os.geteuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise DuckpipeError(
            f"cannot use the run directory {path}: {e.strerror} (you are uid {os.geteuid()}); "
            "set DUCKPIPE_RUN_DIR to a directory of your own, or DUCKPIPE_CONTROL to the "
            "dataplane's endpoint"
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise DuckpipeError(
            f"run directory {path} is not a directory owned by uid {os.geteuid()}; "
            "remove it or set DUCKPIPE_RUN_DIR"
        )
    check_private_dir(path)
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def check_private_dir(path: Path) -> None:
    """Refuse a directory for the control socket and the stats segment that is not ours or
    that others can write to: there another user could plant the file first (a FIFO hangs
    an open, a symlink aims writes at their choice). The C dataplane's check_dir
    (dp_stats.c) says the same."""
    try:
        st = path.stat()
    except OSError as e:
        raise DuckpipeError(f"cannot use the directory {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DuckpipeError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DuckpipeError(
            f"the directory {path} belongs to uid {st.st_uid}, not to this process's uid "
            f"{os.geteuid()}: put the control socket in a directory of your own (mode 0700)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DuckpipeError(
            f"the directory {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
            "another user could plant the stats segment or the socket there first; put the "
            "control socket in a directory only you can write (mode 0700)"
        )


def open_own_file(path: Path) -> int | None:
    """A read-only descriptor of the regular file of ours at ``path``; None when there is
    none. Opened without following a symlink and without blocking (a FIFO's open waits
    for a writer that may never come); anything else there raises DuckpipeError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        link = " (a symlink: remove it)" if e.errno == errno.ELOOP else ""
        raise DuckpipeError(f"cannot open {path}: {e.strerror}{link}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        what = (
            "not a regular file (a FIFO, a socket, a device?)"
            if not stat.S_ISREG(st.st_mode)
            else f"owned by uid {st.st_uid}, not {os.geteuid()}"
        )
        raise DuckpipeError(f"{path} is {what}: remove it")
    return fd


def default_control() -> str:
    """``$DUCKPIPE_CONTROL``, else ``ipc://<run dir>/control``."""
    return os.environ.get("DUCKPIPE_CONTROL") or f"ipc://{run_dir()}/control"


PORT_BASE = 47000  #: root's default dataplane port; ducks from PORT_BASE + 100
PORT_STRIDE = 512  #: each user's block of ports: host port, then up to 412 ducks
PORT_USERS = 32  #: blocks 47000 .. 47000 + 31 * 512 (62872); uids share them modulo 32


def default_ports() -> tuple[int, int, str]:
    """``(dataplane host port, first duck port, why)`` of a loopback cluster.

    ``$DUCKPIPE_PORT_BASE`` (a job's own block), else per user: ``47000 + 512 * (uid %
    32)``, so that two users' (or a user's and root's) clusters do not take each other's
    ports. The ducks listen from base + 100. ``why`` says where the numbers came from.
    """
    env = os.environ.get("DUCKPIPE_PORT_BASE")
    if env:
        try:
            base = int(env)
        except ValueError:
            base = -1
        if not 1024 <= base <= 65535 - PORT_STRIDE:
            raise DuckpipeError(
                f"DUCKPIPE_PORT_BASE={env!r} must be a port in 1024..{65535 - PORT_STRIDE}"
            )
        return base, base + 100, "from $DUCKPIPE_PORT_BASE"
    uid = os.geteuid()
    base = PORT_BASE + PORT_STRIDE * (uid % PORT_USERS)
    return (
        base,
        base + 100,
        f"this user's default: {PORT_BASE} + {PORT_STRIDE} x (uid {uid} mod {PORT_USERS}); "
        "$DUCKPIPE_PORT_BASE changes it",
    )


def udp_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nobody holds UDP ``host:port`` right now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def find_hugetlbfs() -> Path | None:
    """A writable hugetlbfs mount with 2 MiB pages: ``$DUCKPIPE_HUGETLBFS`` or /proc/mounts."""
    env = os.environ.get("DUCKPIPE_HUGETLBFS")
    if env is not None:
        return Path(env) if env else None  # empty: hugepages disabled on purpose
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) < 4 or parts[2] != "hugetlbfs":
            continue
        opts = parts[3].split(",")
        size = next((o.split("=", 1)[1] for o in opts if o.startswith("pagesize=")), "2M")
        if size.upper() in ("2M", "2048K") and os.access(parts[1], os.W_OK):
            return Path(parts[1])
    return None


def free_hugepages() -> int:
    """Free 2 MiB hugepages in the pool (0 when there is no pool)."""
    try:
        return int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read_text())
    except (OSError, ValueError):
        return 0


def process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot, /proc/<pid>/stat field
    22), or None when it cannot be read. With the pid it names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the name may hold spaces and parentheses
    try:
        return int(fields[19])  # field 22; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, started_ns: int | None = None) -> bool:
    """True while ``pid`` runs and is not a zombie. With ``started_ns`` (CLOCK_REALTIME
    of something that process made), a newer process that reused the pid counts as dead."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if started_ns is not None and proc.create_time() > started_ns / 1e9 + 1.0:
            return False
        return True
    except psutil.AccessDenied:
        return True  # someone else's process, but alive
    except (psutil.NoSuchProcess, ValueError):
        return False


SO_PEERPIDFD = 77  # Linux 6.5
_SYS_PIDFD_GETFD = 438  # the same on every architecture (the unified syscall table)


class PeerGone(DuckpipeError):
    """The process that made a connection has exited, or the connection closed."""


def pidfd_exited(pidfd: int) -> bool:
    """True once the process behind ``pidfd`` has exited (the pidfd polls readable)."""
    try:
        p = select.poll()  # not select(): a descriptor past 1023 is refused there
        p.register(pidfd, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True  # cannot tell: refuse rather than guess


def peer_pidfd(sockfd: int, uid: int, gid: int, pid: int) -> int:
    """A pidfd of the process that connected on ``sockfd`` (the connection a request came
    in on, ZMQ_SRCFD), whose credentials libzmq gave as uid, gid, pid: what
    dp_peer_pidfd() in the C dataplane does. Raises PeerGone when the connection closed
    or that process has exited: its pid may be another process's by now."""
    try:
        with socket.socket(fileno=os.dup(sockfd)) as s:
            cred = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if (cred[1], cred[2], cred[0]) != (uid, gid, pid):
                raise OSError(errno.ENOTCONN, "another connection")
            try:
                pidfd = s.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
            except OSError as e:
                if e.errno != errno.ENOPROTOOPT:
                    pidfd = -1
                else:  # before Linux 6.5: the pid, taken now (dp_access.c says what is lost)
                    pidfd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.EINVAL):
            pidfd = -1
        else:
            raise PeerGone("the connection this request came on has closed; reconnect") from e
    if pidfd < 0 or pidfd_exited(pidfd):
        if pidfd >= 0:
            os.close(pidfd)
        raise PeerGone(
            f"the process that opened this connection (pid {pid}) has exited: a connection "
            "serves the process that made it; connect from this one"
        )
    return pidfd


def pidfd_getfd(pidfd: int, pid: int, fd: int, what: str) -> int:
    """Descriptor ``fd`` of the process behind ``pidfd``, as one of ours (take_fd in
    dp_client.c): pidfd_getfd, or where that is not permitted /proc/<pid>/fd/<fd> opened
    O_PATH and kept only if the process is still alive after the open. Raises
    DuckpipeError saying nothing of what was found."""
    if pidfd_exited(pidfd):
        raise DuckpipeError(f"the client (pid {pid}) has exited")
    libc = ctypes.CDLL(None, use_errno=True)
    args = (
        ctypes.c_long(_SYS_PIDFD_GETFD),
        ctypes.c_long(pidfd),
        ctypes.c_long(fd),
        ctypes.c_long(0),
    )
    got = libc.syscall(*args) if fd >= 0 else -1
    err = ctypes.get_errno() if fd >= 0 else errno.EBADF
    if got < 0 and err == errno.EPERM:
        try:
            got = os.open(f"/proc/{pid}/fd/{fd}", os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            err = errno.EPERM if e.errno == errno.EACCES else e.errno or errno.EIO
    if got >= 0 and pidfd_exited(pidfd):
        os.close(got)
        got, err = -1, errno.ESRCH
    if got >= 0:
        return got
    if err == errno.ESRCH:
        raise DuckpipeError(f"the client (pid {pid}) has exited")
    if err in (errno.EBADF, errno.ENOENT):
        raise DuckpipeError(f"cannot open {what} fd {fd}: pid {pid} has no such descriptor")
    if err == errno.EPERM:
        raise DuckpipeError(
            f"cannot take {what} fd {fd} from pid {pid}: not permitted; run the dataplane as "
            "the client's user or as root"
        )
    raise DuckpipeError(f"cannot open {what} fd {fd} of pid {pid}: {os.strerror(err)}")
