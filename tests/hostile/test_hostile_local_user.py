"""Another local user: what a process of another uid on the same host can reach.

The other user is ``nobody`` (uid 65534) in a forked child, which needs root; the
dataplane and its clients run as root here, which is the case the kernel's /proc and
socket permissions make hardest to get right (root reaches everything, others nothing
unless the dataplane hands it to them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil
import pytest
import zmq

import duckpipe
from duckpipe import GeluMlp
from duckpipe._abi.shm import Segment
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR, MAX_CLIENTS
from duckpipe.schema.control import ErrorCode
from duckpipe.testing import assert_clean_exit, null_backend_result, null_topology

NOBODY = 65534
NOGROUP = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="becoming another user (nobody) needs root")


def _as_nobody(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Run fn in a forked child that became nobody:nogroup; what it returns (msgpack)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(NOBODY)
            os.write(w, msgspec.msgpack.encode(fn()))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the nobody child failed"
    return msgspec.msgpack.decode(b"".join(chunks))


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# --- the doorbell -------------------------------------------------------------------------


def _datagram_sockets_of(pid: int) -> list[str]:
    """The addresses of pid's AF_UNIX datagram sockets as /proc/net/unix lists them to every
    user ('@' for an abstract name); read as root, who may look at pid's descriptors."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    names = []
    with open("/proc/net/unix") as f:
        next(f)  # Num RefCount Protocol Flags Type St Inode Path
        for line in f:
            cols = line.split()
            if len(cols) >= 8 and cols[4] == "0002" and cols[6] in inodes:  # SOCK_DGRAM
                names.append(cols[7])
    return names


def _flood(names: list[str], paths: list[str], seconds: float) -> dict[str, Any]:
    """As another user: send 1-byte datagrams to every name that accepts a connect, and
    write a byte into every path that opens, for `seconds`; what was reached, how often."""
    reached: dict[str, int] = {}
    targets: list[tuple[str, Callable[[], None]]] = []
    for name in names:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.connect("\0" + name[1:] if name.startswith("@") else name)
        except OSError:
            s.close()
            continue
        s.setblocking(False)
        targets.append((name, lambda s=s: s.send(b"x")))
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        targets.append((path, lambda fd=fd: os.write(fd, b"x")))
    end = time.monotonic() + seconds
    while targets and time.monotonic() < end:
        for name, ring in targets:
            try:
                ring()
                reached[name] = reached.get(name, 0) + 1
            except OSError:  # a full queue: the flood goes on
                pass
    return {"reached": reached}


@needs_root
def test_another_user_cannot_ring_a_clients_doorbell(duckpipe_null_factory):
    """The doorbell was an abstract AF_UNIX socket: its name is in /proc/net/unix for every
    user, and another uid sending 1-byte datagrams took the dataplane from 0.01 s to 2.2 s
    of CPU per 5 s. Now each client's doorbell is its own pipe: another user finds no
    socket of the dataplane's to send to, and cannot open the client's pipe through /proc
    (nor the dataplane's descriptors). Nothing it does rings, as the doorbells counter
    says, and the dataplane stays idle."""
    dp = duckpipe_null_factory(1, idle_spin_us=0)
    with duckpipe.connect(dp.control) as c:
        names = _datagram_sockets_of(dp.pid)
        # every descriptor of the client (its doorbell pipe among them) and the dataplane
        paths = [
            f"/proc/{pid}/fd/{fd}"
            for pid in (os.getpid(), dp.pid)
            for fd in os.listdir(f"/proc/{pid}/fd")
        ]
        time.sleep(0.3)  # attached and parked
        before = c.stats().counters["doorbells"]
        cpu = _cpu_s(dp.pid)
        got = _as_nobody(lambda: _flood(names, paths, 2.0))
        cpu = _cpu_s(dp.pid) - cpu
        rang = c.stats().counters["doorbells"] - before
        # the client's own ringing still wakes the parked dataplane
        mlp = GeluMlp.random(16, 32, seed=3)
        c.load_weights(1, mlp, progress=False)
        x = np.ones((1, 16), np.float32)
        for _ in range(20):
            np.testing.assert_array_equal(
                c.forward(1, x, timeout=10), null_backend_result(x, 1, mlp.b_down)
            )
        own = c.stats().counters["doorbells"] - before - rang
    assert own > 0, "the client never rang its doorbell: was the dataplane parked?"
    assert got["reached"] == {}, f"another user reached {got['reached']}"
    assert rang == 0, f"{rang} doorbells from another user"
    assert cpu < 0.3, f"the dataplane used {cpu:.2f} s of CPU while another user flooded"


def _attach(control: str, seg_fd: int, **fields: int) -> ctl.AnyReply:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    try:
        msg = ctl.Attach(
            req_id=1,
            abi_major=ABI_MAJOR,
            pid=os.getpid(),
            segment="bell",
            segment_fd=seg_fd,
            **fields,
        )
        sock.send(ctl.encoder.encode(msg))
        assert sock.poll(10_000), "no reply to Attach"
        return ctl.reply_decoder.decode(sock.recv())
    finally:
        sock.close()


def test_a_doorbell_must_be_the_clients_own_anonymous_pipe(duckpipe_null_factory, tmp_path):
    """A named FIFO can be opened by whoever its directory and mode let in, a socket or a
    file is no pipe at all, and a client without a doorbell would never wake a parked
    dataplane: each is refused at attach, saying why; a pipe attaches."""
    dp = duckpipe_null_factory(1)
    fifo = tmp_path / "bell"
    os.mkfifo(fifo, 0o666)
    named = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r, w = os.pipe()
    try:
        for fields, why in (
            ({}, "no doorbell pipe"),
            ({"doorbell_fd": named}, "not an anonymous pipe"),
            ({"doorbell_fd": sock.fileno()}, "not an anonymous pipe"),
            ({"doorbell_fd": 1 << 20}, "cannot open doorbell"),
        ):
            seg = Segment.create(slot_count=2, act_slot_size=4096, backing="devshm", tag="bell")
            try:
                reply = _attach(dp.control, seg.fd, **fields)
            finally:
                seg.close()
            assert isinstance(reply, ctl.Error), (fields, reply)
            assert reply.code == ErrorCode.BAD_SEGMENT and why in reply.message, reply
        seg = Segment.create(slot_count=2, act_slot_size=4096, backing="devshm", tag="bell")
        try:
            reply = _attach(dp.control, seg.fd, doorbell_fd=r)
        finally:
            seg.close()
        assert isinstance(reply, ctl.Attached), reply
    finally:
        for fd in (named, r, w):
            os.close(fd)
        sock.close()
    with duckpipe.connect(dp.control) as c:  # the dataplane is none the worse
        assert c.stats().counters["clients_attached"] == 2


# --- client slots: quotas per user, and the admin's reserve -------------------------------


@contextlib.contextmanager
def _group_dataplane(kind: str, **settings: object) -> Iterator[str]:
    """A dataplane (the mock or the C one, null backend) whose control_group is nogroup, in
    a run directory nogroup may enter; yields its control endpoint."""
    run = Path(tempfile.mkdtemp(prefix="duckpipe-users-", dir="/tmp"))
    os.chown(run, -1, NOGROUP)
    run.chmod(0o750)
    control = f"ipc://{run}/control"
    settings = {"control_group": "nogroup", **settings}
    try:
        if kind == "mock":
            args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
            with MockDataplaneProcess(ducks=2, control=control, args=args) as mock:
                yield mock.control
        else:
            real = DataplaneProcess(null_topology(2, **settings), control=control).start()
            try:
                yield real.control
            finally:
                assert_clean_exit(real)  # stops it: no sanitizer report, a clean exit
    finally:
        shutil.rmtree(run, ignore_errors=True)


class _Holders:
    """Processes of one uid, each attaching clients one after another and holding those
    that got in until released: what each attempt said ("ok" or the error's message)."""

    def __init__(self, uid: int, control: str, procs: int, each: int) -> None:
        self.pids: list[int] = []
        self.release: list[int] = []
        self.said: list[str] = []
        for _ in range(procs):
            r, w = os.pipe()
            hold_r, hold_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never return into pytest
                code = 1
                try:
                    os.close(r)
                    os.close(hold_w)
                    os.setgroups([])
                    os.setgid(NOGROUP)
                    os.setuid(uid)
                    code = _hold(control, each, w, hold_r)
                finally:
                    os._exit(code)
            os.close(w)
            os.close(hold_r)
            self.pids.append(pid)
            self.release.append(hold_w)
            self.said += msgspec.msgpack.decode(_read_all(r))  # this one holds its clients

    def close(self) -> None:
        for fd in self.release:
            os.close(fd)  # the children close their clients and exit
        for pid in self.pids:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "a holder failed"


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _hold(control: str, each: int, report: int, hold: int) -> int:
    said, clients = [], []
    for i in range(each):
        try:
            clients.append(
                duckpipe.connect(
                    control, name=f"h{os.getpid()}-{i}", slots=1, slot_size=4096, backing="devshm"
                )
            )
            said.append("ok")
        except duckpipe.DuckpipeError as e:
            said.append(f"{type(e).__name__}: {e}")
    os.write(report, msgspec.msgpack.encode(said))
    os.close(report)
    os.read(hold, 1)  # until the test closes its end
    for c in clients:
        c.close()
    return 0


@needs_root
@pytest.mark.parametrize("kind", ["mock", "real"])
def test_one_user_cannot_take_every_client_slot_from_another(kind):
    """16 forked processes of one user with 4 clients each took all 64 client slots, and
    the next client was refused ('every client slot is taken'). A user other than the
    dataplane's own now holds at most client_max_per_uid slots however many processes it
    forks; another user and the admin still get in."""
    per_uid = 6
    with _group_dataplane(kind, client_max_per_uid=per_uid) as control:
        hogs = _Holders(NOBODY, control, procs=3, each=4)  # 12 tries, per pid within quota
        try:
            assert hogs.said.count("ok") == per_uid, hogs.said
            refused = [s for s in hogs.said if s != "ok"]
            assert all(s.startswith("QuotaExceeded") for s in refused), refused
            assert all(f"client_max_per_uid is {per_uid}" in s for s in refused), refused
            other = _Holders(NOBODY - 1, control, procs=1, each=1)  # another user
            other.close()
            assert other.said == ["ok"], other.said
            with duckpipe.connect(control, name="admin") as admin:  # the dataplane's user
                refusals = admin.stats().counters["quota_refused"]
        finally:
            hogs.close()
    assert refusals == len(refused)


@needs_root
@pytest.mark.parametrize("kind", ["mock", "real"])
def test_other_users_leave_the_admin_its_reserved_client_slots(kind):
    """Users other than the dataplane's own, however many, together take at most
    MAX_CLIENTS - admin_reserved_clients slots: the admin's clients always get in."""
    reserved = 4
    with _group_dataplane(
        kind, client_max_per_uid=MAX_CLIENTS, admin_reserved_clients=reserved
    ) as control:
        hogs = _Holders(NOBODY, control, procs=MAX_CLIENTS // 4, each=4)
        try:
            assert hogs.said.count("ok") == MAX_CLIENTS - reserved, hogs.said
            refused = [s for s in hogs.said if s != "ok"]
            assert len(refused) == reserved, refused
            assert all("admin_reserved_clients 4 are kept" in s for s in refused), refused
            with contextlib.ExitStack() as stack:  # the admin: one process, its pid quota
                for i in range(reserved):
                    c = stack.enter_context(duckpipe.connect(control, name=f"admin{i}", slots=1))
                assert len(c.stats().clients) == MAX_CLIENTS
        finally:
            hogs.close()


# --- the dataplane's UDP host port ----------------------------------------------------------


def _junk_flood(port: int, seconds: float, report: int) -> None:
    """64-byte random datagrams at 127.0.0.1:port for `seconds`, from a port of the
    kernel's choosing; how many went out is written to `report`."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    junk, sent, end = os.urandom(64), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(256):
            try:
                s.send(junk)
                sent += 1
            except OSError:  # a full queue: the flood goes on
                pass
    os.write(report, str(sent).encode())


def _start_flood(port: int, seconds: float) -> tuple[int, int]:
    """A forked child floods port, as nobody when we are root (else as ourselves: the
    filter knows addresses and ports, not users); its pid and the read end of its report."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(r)
            if IS_ROOT:
                os.setgroups([])
                os.setgid(NOGROUP)
                os.setuid(NOBODY)
            _junk_flood(port, seconds, w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _flood_sent(pid: int, report: int) -> int:
    out = b""
    while chunk := os.read(report, 64):
        out += chunk
    os.close(report)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the flooding child failed"
    return int(out)


FLOOD_S = 2.0


def _run_s(pid: int) -> float:
    """Seconds every thread of pid has run, from schedstat (ns, finer than ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def _paced_forwards(c: duckpipe.Client, mlp: GeluMlp, seconds: float) -> int:
    """Checked forwards every 50 ms for `seconds`: how many."""
    rng, done = np.random.default_rng(6), 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x = rng.standard_normal((2, 32)).astype(np.float32)
        np.testing.assert_allclose(
            c.forward(1, x, timeout=10), mlp.reference(x), rtol=2e-4, atol=2e-5
        )
        done += 1
        time.sleep(0.05)
    return done


def test_junk_datagrams_at_the_host_port_are_dropped_before_they_wake_the_dataplane(
    duckpipe_cluster_factory,
):
    """Any local user may send to the dataplane's UDP host port: a flood of junk cost the
    worker 3.3 CPU-s per 5 s, each datagram a wake-up and an rx_malformed. The socket's
    kernel filter admits only the NIC's ducks' address and port: the flood (from another
    user, or another port of ours without root) costs the dataplane nothing, no junk
    reaches the worker's counters, and forwards go on."""
    cl = duckpipe_cluster_factory(2)
    mlp = GeluMlp.random(32, 48, seed=6)
    pid = cl.dataplane.proc.pid
    with duckpipe.connect(cl.control, name="bystander") as c:
        c.load_weights(1, mlp, ducks=[0, 1])
        assert c.stats().counters["rx_duck_filters"] == 1  # one NIC, one filter
        cpu0 = _run_s(pid)
        quiet = _paced_forwards(c, mlp, 1.0)
        cpu1 = _run_s(pid)
        before = c.stats().counters
        flood = _start_flood(cl.host_ports[0], FLOOD_S)
        during = _paced_forwards(c, mlp, FLOOD_S)
        sent = _flood_sent(*flood)
        cpu2 = _run_s(pid)
        _paced_forwards(c, mlp, 0.1)  # a datagram let through reports the kernel's drops
        after = c.stats().counters
    reached = sum(after[k] - before[k] for k in ("rx_malformed", "rx_unknown_sender"))
    assert sent > 10_000, f"the flood sent only {sent} datagrams"
    assert quiet > 0 and during > 0
    assert reached <= sent // 1000, f"{reached} of {sent} junk datagrams reached the worker"
    # the kernel dropped them at the socket: in rxq_overflows (one count for both causes)
    assert after["rxq_overflows"] - before["rxq_overflows"] >= sent // 2
    # per second, the flood's window may cost a little more than the quiet one (its
    # forwards compete with the flood for the cores), never a core's worth
    quiet_rate, flood_rate = (cpu1 - cpu0) / 1.0, (cpu2 - cpu1) / FLOOD_S
    assert flood_rate < 2 * quiet_rate + 0.03, (quiet_rate, flood_rate, sent)
