"""A control connection outlives the process that made it (issue 26, point 2).

The peer credentials of a connection (SO_PEERCRED: uid, gid, pid) are those of the process
that called connect(). That process may hand the connection on (fork, SCM_RIGHTS) and exit;
once its pid is taken by another process, root's, an Attach naming descriptors made the
dataplane open ``/proc/<pid>/fd/<n>`` of that process (root's files, read-write) and say
what they were ("owned by uid 0, not the client's 65534"). Now the dataplane asks the
connection for its process (a pidfd, SO_PEERPIDFD), refuses once that process has exited,
and takes descriptors from it alone (pidfd_getfd), never by pid.

ZeroMQ cannot hand a connection to another process, so the attacker here speaks ZMTP 3.0
itself over the ipc socket: a process connects and greets, forks, and exits; its child
keeps the connection and sends the Attach.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

import duckpipe
from duckpipe._abi.shm import Segment
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR
from duckpipe.schema.control import ErrorCode
from duckpipe.testing import assert_clean_exit, null_topology

NOBODY = 65534
NOGROUP = 65534
IS_ROOT = os.geteuid() == 0
IN_OPEN = 0x20


# --- ZMTP 3.0 by hand: a DEALER over a socket we hold ---------------------------------------


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the dataplane closed the connection")
        out += chunk
    return out


def _recv_frame(s: socket.socket) -> tuple[int, bytes]:
    flags = _recv_exact(s, 1)[0]
    size = struct.unpack(">Q", _recv_exact(s, 8))[0] if flags & 0x02 else _recv_exact(s, 1)[0]
    return flags, _recv_exact(s, size)


def _send_frame(s: socket.socket, body: bytes, command: bool = False) -> None:
    flags = 0x04 if command else 0x00
    if len(body) > 255:
        s.sendall(bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body)
    else:
        s.sendall(bytes([flags, len(body)]) + body)


def _zmtp_connect(path: str) -> socket.socket:
    """Connect to an ipc:// ROUTER and finish the ZMTP 3.0 NULL handshake as a DEALER."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
    s.sendall(greeting)
    _recv_exact(s, 64)
    name, value = b"Socket-Type", b"DEALER"
    _send_frame(
        s, b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value, True
    )
    flags, body = _recv_frame(s)
    assert flags & 0x04 and body.startswith(b"\x05READY"), body
    return s


def _zmtp_request(s: socket.socket, msg: msgspec.Struct) -> ctl.AnyReply:
    _send_frame(s, ctl.encoder.encode(msg))
    while True:
        flags, body = _recv_frame(s)
        if not flags & 0x04:  # a command (a PING) is not the reply
            return ctl.reply_decoder.decode(body)


# --- the attack ------------------------------------------------------------------------------


def _handed_on_attach(
    control: str,
    fds: Callable[[int], tuple[int, int]],
    then: Callable[[int], None],
    uid: int | None = None,
) -> tuple[int, ctl.AnyReply]:
    """A process (as uid, if given) connects to control and greets, forks, and exits; once
    it is reaped, then(its pid) runs here, and its child sends Attach naming that pid and
    the descriptors fds(pid) gives it (segment, doorbell). The pid, and the reply."""
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pid_r, pid_w = os.pipe()
    connector = os.fork()
    if connector == 0:  # never returns into pytest
        code = 1
        try:
            os.close(go_w)
            os.close(res_r)
            os.close(pid_r)
            if uid is not None:
                os.setgroups([])
                os.setgid(NOGROUP)
                os.setuid(uid)
            sock = _zmtp_connect(control[len("ipc://") :])
            me = os.getpid()
            if os.fork() == 0:  # the child keeps the connection: the attacker
                try:
                    os.read(go_r, 1)  # the connector is gone (and its pid taken)
                    seg_fd, bell_fd = fds(me)
                    reply = _zmtp_request(
                        sock,
                        ctl.Attach(
                            req_id=1,
                            abi_major=ABI_MAJOR,
                            pid=me,
                            segment="handed-on",
                            segment_fd=seg_fd,
                            doorbell_fd=bell_fd,
                        ),
                    )
                    os.write(res_w, ctl.encoder.encode(reply))
                finally:
                    os._exit(0)
            os.write(pid_w, struct.pack("i", me))
            code = 0
        finally:
            os._exit(code)
    for fd in (go_r, res_w, pid_w):
        os.close(fd)
    try:
        _, status = os.waitpid(connector, 0)  # reaped: its pid is free
        assert os.waitstatus_to_exitcode(status) == 0, "the connector failed"
        raw = os.read(pid_r, 4)
        assert len(raw) == 4, "the connector did not connect"
        pid = struct.unpack("i", raw)[0]
        then(pid)
        os.write(go_w, b"g")
        got = b""
        while chunk := os.read(res_r, 1 << 16):
            got += chunk
        assert got, "the attacker had no reply"
        return pid, ctl.reply_decoder.decode(got)
    finally:
        for fd in (go_w, res_r, pid_r):
            os.close(fd)


@contextlib.contextmanager
def _dataplane(kind: str, factory: Callable[..., DataplaneProcess] | None = None) -> Iterator[str]:
    if kind == "mock":
        with MockDataplaneProcess(ducks=2) as mock:
            yield mock.control
    else:
        assert factory is not None
        yield factory(2).control


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_connection_whose_process_exited_attaches_nothing(kind, request):
    """A connection serves the process that made it: its child, holding it after the
    connector exited, is refused at Attach even naming its own sealed segment (which it
    could attach on a connection of its own), and the refusal is counted."""
    factory = request.getfixturevalue("duckpipe_null_factory") if kind == "real" else None
    with _dataplane(kind, factory) as control:
        segs: list[Segment] = []

        def own_fds(_pid: int) -> tuple[int, int]:
            segs.append(Segment.create(slot_count=2, act_slot_size=4096, backing="devshm"))
            r, _w = os.pipe()
            return segs[-1].fd, r

        pid, reply = _handed_on_attach(control, own_fds, lambda _pid: None)
        assert isinstance(reply, ctl.Error), reply
        assert reply.code == ErrorCode.NOT_PERMITTED, reply
        assert f"pid {pid}" in reply.message and "has exited" in reply.message, reply
        with duckpipe.connect(control, name="after") as c:  # the dataplane is none the worse
            counters = c.stats().counters
        assert counters["peers_gone"] == 1
        assert counters["clients_attached"] == 1  # "after" alone


# --- the attack with the pid reused by root ---------------------------------------------------


@contextlib.contextmanager
def _group_dataplane(kind: str) -> Iterator[str]:
    """A dataplane whose control_group is nogroup, in a run directory nogroup may enter."""
    run = Path(tempfile.mkdtemp(prefix="duckpipe-pidfd-", dir="/tmp"))
    os.chown(run, -1, NOGROUP)
    run.chmod(0o750)
    control = f"ipc://{run}/control"
    try:
        if kind == "mock":
            with MockDataplaneProcess(
                ducks=2, control=control, args=["--control-group=nogroup"]
            ) as mock:
                yield mock.control
        else:
            real = DataplaneProcess(
                null_topology(2, control_group="nogroup"), control=control
            ).start()
            try:
                yield real.control
            finally:
                assert_clean_exit(real)
    finally:
        shutil.rmtree(run, ignore_errors=True)


class _PidTaker:
    """A root process with exactly a given pid (the kernel's ns_last_pid), holding a root
    file at fd 100 and a pipe's read end at fd 101 until closed."""

    SEG_FD, BELL_FD = 100, 101

    def __init__(self, secret: Path) -> None:
        self.secret = secret
        self.pid = 0
        self._hold = -1

    def take(self, pid: int) -> None:
        for _ in range(200):  # other processes on the host fork too: try again
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            ready_r, ready_w = os.pipe()
            hold_r, hold_w = os.pipe()
            child = os.fork()
            if child == 0:  # never returns into pytest
                try:
                    if os.getpid() == pid:
                        os.close(hold_w)
                        os.dup2(os.open(self.secret, os.O_RDONLY), self.SEG_FD)
                        os.dup2(os.pipe()[0], self.BELL_FD)
                        os.write(ready_w, b"r")
                        os.read(hold_r, 1)
                finally:
                    os._exit(0)
            os.close(ready_w)
            os.close(hold_r)
            took = os.read(ready_r, 1) == b"r"
            os.close(ready_r)
            if took:
                self.pid, self._hold = child, hold_w
                return
            os.close(hold_w)
            os.waitpid(child, 0)
        pytest.skip(f"could not start a process with pid {pid} (the host forks too much)")

    def close(self) -> None:
        if self.pid:
            os.close(self._hold)
            os.waitpid(self.pid, 0)


def _inotify_opens(path: Path) -> tuple[Callable[[], int], Callable[[], None]]:
    """Watch path for opens: (how many since, stop)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(path), IN_OPEN) >= 0

    def opens() -> int:
        try:
            return len(os.read(fd, 1 << 16)) // 16  # struct inotify_event, no name
        except BlockingIOError:
            return 0

    return opens, lambda: os.close(fd)


@pytest.mark.skipif(not IS_ROOT, reason="another user (nobody) and a chosen pid need root")
@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
    reason="choosing a pid needs a writable /proc/sys/kernel/ns_last_pid",
)
@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_pid_reused_by_root_opens_and_describes_nothing(kind, tmp_path):
    """nobody connects, hands the connection to its child and exits; root takes the pid,
    holding a root-only file at fd 100. The child's Attach naming the pid and fd 100 made
    the dataplane (root) open that file read-write and answer 'owned by uid 0, not the
    client's 65534'. Now it is refused as a connection whose process exited: the file is
    not opened (inotify sees no open) and nothing of it is said."""
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:secret\n")
    secret.chmod(0o600)
    taker = _PidTaker(secret)
    watch: list[tuple[Callable[[], int], Callable[[], None]]] = []

    def reuse(pid: int) -> None:
        taker.take(pid)
        watch.append(_inotify_opens(secret))  # after the taker's own open

    try:
        with _group_dataplane(kind) as control:
            pid, reply = _handed_on_attach(
                control, lambda _pid: (_PidTaker.SEG_FD, _PidTaker.BELL_FD), reuse, uid=NOBODY
            )
            assert pid == taker.pid
            opened = watch[0][0]()
            with duckpipe.connect(control, name="admin") as admin:
                gone = admin.stats().counters["peers_gone"]
    finally:
        taker.close()
        for _, stop in watch:
            stop()
    assert isinstance(reply, ctl.Error), reply
    assert opened == 0, f"the dataplane opened root's file {opened} times: {reply.message}"
    for said in ("uid 0", "owned", "regular", "memfd", "/proc/", "shadow"):
        assert said not in reply.message, reply.message
    assert reply.code == ErrorCode.NOT_PERMITTED and "has exited" in reply.message, reply
    assert gone == 1
