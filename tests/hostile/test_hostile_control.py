"""Attacks on the control socket: every one is refused with a clear error, counted, and
costs the dataplane neither its life nor its memory, nor a well-behaved client its results.

Run against the mock and the C dataplane (the sanitizer rerun in tools/setup picks these
up by "hostile"). Another user is ``nobody`` (uid 65534) in a forked child, which needs
root; its group ``nogroup`` is the dataplane's ``control_group`` here, so it is a client
but not an admin.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import psutil
import pytest
import zmq

import duckpipe
from duckpipe import GeluMlp
from duckpipe.client.models import dtype_code
from duckpipe.errors import (
    BadInput,
    DataplaneFault,
    NotPermitted,
    QuotaExceeded,
    UnknownLayer,
)
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.mock.process import MockDataplaneProcess, ping
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR, LAYER_TABLE, MAX_CLIENTS, Op, Status
from duckpipe.schema.config import default as config_default
from duckpipe.schema.control import ErrorCode
from duckpipe.testing import SANITIZER_MARKS, assert_clean_exit, cluster_class_or_skip

NOBODY = 65534
NOGROUP = 65534
IS_ROOT = os.geteuid() == 0
MAX_LAYERS = 4
MAX_WEIGHT_BYTES = 1 << 20
MAX_HIDDEN = 4096
MAX_FFN = 16384
SETTINGS = {
    "client_max_layers": MAX_LAYERS,
    "client_max_weight_bytes": MAX_WEIGHT_BYTES,
    "max_hidden": MAX_HIDDEN,
    "max_ffn": MAX_FFN,
}
needs_root = pytest.mark.skipif(not IS_ROOT, reason="becoming another user (nobody) needs root")


def _shared_dir(group: int | None) -> Path:
    """A run directory the control group may enter (the socket itself is the fence)."""
    path = Path(tempfile.mkdtemp(prefix="duckpipe-hostile-", dir="/tmp"))
    if group is not None:
        os.chown(path, -1, group)
        path.chmod(0o750)
    return path


@contextlib.contextmanager
def _dataplane(kind: str, control: str, **settings: object) -> Iterator:
    if kind == "mock":
        args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        with MockDataplaneProcess(ducks=4, control=control, args=args) as dp:
            yield dp
        return
    cluster = cluster_class_or_skip()(4, control=control, **settings).start()
    try:
        yield cluster
    finally:
        assert_clean_exit(cluster)


@pytest.fixture(scope="module", params=["mock", "real"])
def dp(request) -> Iterator:
    """A dataplane whose control_group is nogroup (when we are root) and small quotas."""
    group = NOGROUP if IS_ROOT else None
    run = _shared_dir(group)
    settings = dict(SETTINGS, control_group="nogroup") if IS_ROOT else dict(SETTINGS)
    try:
        with _dataplane(request.param, f"ipc://{run}/control", **settings) as d:
            yield d
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _pid(d) -> int:
    return d.dataplane.pid if hasattr(d, "dataplane") else d.pid


def _rss(d) -> int:
    return psutil.Process(_pid(d)).memory_info().rss


def _stats(d) -> ctl.Stats:
    stats = ping(d.control, 5)
    assert stats is not None, "the dataplane stopped answering"
    return stats


def _raw(control: str, payloads: list[bytes], timeout: float = 3.0, ctx=None) -> list:
    """Send each payload on one DEALER; the decoded reply to each, or None."""
    ctx = ctx or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    out = []
    try:
        for p in payloads:
            sock.send(p)
            out.append(ctl.reply_decoder.decode(sock.recv()) if sock.poll(timeout * 1000) else None)
    finally:
        sock.close()
    return out


def _as_nobody(fn: Callable[[zmq.Context], list[bytes]], timeout: float = 20.0) -> list[bytes]:
    """Run fn in a forked child that became nobody:nogroup; what it returns (bytes items)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(NOBODY)
            ctx = zmq.Context()
            data = msgspec.msgpack.encode(fn(ctx))
            ctx.destroy(linger=0)
            os.write(w, data)
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


def _nobody_requests(control: str, msgs: list[ctl.Request]) -> list:
    """Replies (or None) to msgs sent by nobody."""

    def child(ctx: zmq.Context) -> list[bytes]:
        replies = _raw(control, [ctl.encoder.encode(m) for m in msgs], 3.0, ctx)
        return [b"" if r is None else ctl.encoder.encode(r) for r in replies]

    return [ctl.reply_decoder.decode(b) if b else None for b in _as_nobody(child)]


MLP = GeluMlp.random(16, 32, seed=3)
X = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)


# --- attach: only your own segment ---------------------------------------------------------

ATTACKER = """
import os
import sys
import zmq
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR
control, victim_pid, victim_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# the victim's memfd, reopened through /proc as any process of the same user can
stolen = os.open(f"/proc/{victim_pid}/fd/{victim_fd}", os.O_RDWR)
for pid, fd in ((victim_pid, victim_fd), (os.getpid(), victim_fd), (os.getpid(), stolen)):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(control)
    s.send(ctl.encoder.encode(
        ctl.Attach(req_id=1, abi_major=ABI_MAJOR, pid=pid, segment="stolen", segment_fd=fd)))
    assert s.poll(5000), "no reply"
    reply = ctl.reply_decoder.decode(s.recv())
    print(type(reply).__name__, int(getattr(reply, "code", 0)), getattr(reply, "message", ""))
    s.close()
"""


def test_another_process_cannot_attach_a_segment_it_did_not_create(dp):
    with duckpipe.connect(dp.control, name="victim") as victim:
        victim.load_weights(1, MLP, ducks=[0, 1])
        before = victim.forward(1, X, timeout=10).copy()
        victim_fd = victim._session.segment.fd
        out = subprocess.run(
            [sys.executable, "-c", ATTACKER, dp.control, str(os.getpid()), str(victim_fd)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        # claiming the victim's pid; its own pid with the victim's fd number (not open in
        # the attacker); its own pid with the victim's memfd reopened: all refused
        assert len(lines) == 3 and all(
            line.startswith(f"Error {int(ErrorCode.BAD_SEGMENT)}") for line in lines
        ), out.stdout
        assert "not the sender's pid" in lines[0], lines[0]
        for _ in range(20):  # the victim still gets its completions, all of them
            np.testing.assert_array_equal(victim.forward(1, X, timeout=10), before)
        mine = [c for c in victim.stats().clients if c.pid == os.getpid()]
        assert len(mine) == 1


# --- layers: owned by their loader ------------------------------------------------------------


def test_a_client_cannot_replace_or_use_another_clients_layer(dp):
    with duckpipe.connect(dp.control) as a, duckpipe.connect(dp.control) as b:
        a.load_weights(10, MLP, ducks=[0, 1])
        with pytest.raises(NotPermitted, match="layer 10 belongs to another client"):
            b.load_weights(10, GeluMlp.random(16, 32, seed=9), ducks=[0, 1])
        # a forward says what the load says: the admin (same user) sees the layer in
        # layers(), which names its owner, and is refused before anything is sent
        with pytest.raises(NotPermitted, match="layer 10 belongs to another client"):
            b.forward(10, X, timeout=10)
        with pytest.raises(NotPermitted, match="layer 10 belongs to another client"):
            with b.claim(X.shape) as slot:
                slot.array[:] = X
                b.submit(slot, 10)
        # and the dataplane, when a descriptor gets there anyway (a client that does not
        # look at owner): the same words, not "layer 10 is not loaded"
        info = next(li for li in a.layers() if li.layer == 10)
        b._session.layers[10] = msgspec.structs.replace(info, owner=0)
        with pytest.raises(DataplaneFault, match="layer 10 belongs to another client"):
            b.forward(10, X, timeout=10)
        np.testing.assert_allclose(
            a.forward(10, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


def test_a_shared_layer_serves_every_client(dp):
    with duckpipe.connect(dp.control) as a, duckpipe.connect(dp.control) as b:
        a.load_weights(11, MLP, ducks=[0, 1], shared=True)  # a is the admin: same user
        np.testing.assert_allclose(
            b.forward(11, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


def test_only_its_owner_writes_a_shared_layers_weights(dp):
    with duckpipe.connect(dp.control) as a, duckpipe.connect(dp.control) as b:
        _load_plan(a, layer=12, shared=True)  # announced; its chunks are a's to send
        b_session = b._session
        recs = []
        for op in (Op.WEIGHT_CHUNK, Op.WEIGHT_COMMIT):
            i = b_session.take_slot(5)
            b_session.segment.act_bytes(i)[:64] = 7
            n = 64 if op == Op.WEIGHT_CHUNK else 0
            recs.append(b_session.push_weight(i, op, 12, 0, 0, 0, n))
        for rec in recs:
            b_session.await_zmq(rec, 10)  # the refusal's message rides ZeroMQ
            # the words LoadWeights and a forward get (it was "not being loaded")
            assert rec.status == Status.BAD_REQUEST and rec.message == (
                "layer 12 belongs to another client"
            ), (
                rec.status,
                rec.message,
            )
        a.load_weights(12, MLP, ducks=[0, 1], shared=True)  # a still can, b forwards on it
        np.testing.assert_allclose(
            b.forward(12, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


def test_layers_are_freed_when_unloaded_and_when_their_owner_leaves(dp):
    before = _stats(dp).counters["layers_freed"]
    with duckpipe.connect(dp.control) as a:
        a.load_weights(20, MLP, ducks=[0])
        a.load_weights(21, MLP, ducks=[1])
        a.forward(20, X, timeout=10)
        a.unload_layer(20)
        with pytest.raises(UnknownLayer):
            a.forward(20, X, timeout=10)
        with pytest.raises(UnknownLayer):
            a.unload_layer(20)
    deadline = time.monotonic() + 5
    while _stats(dp).counters["layers_freed"] < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _stats(dp).counters["layers_freed"] >= before + 2
    with duckpipe.connect(dp.control) as c:  # its ids are free for the next client
        c.load_weights(21, MLP, ducks=[0])


OWNER = """
import sys, time
import duckpipe
from duckpipe import GeluMlp
c = duckpipe.connect(sys.argv[1], name="doomed")
c.load_weights(int(sys.argv[2]), GeluMlp.random(16, 32, seed=3), ducks=[0])
print("loaded", flush=True)
time.sleep(600)
"""


def test_a_killed_owners_layers_are_freed_and_its_layer_ids_reusable(dp):
    """An owner that never detaches (SIGKILL) loses its layers when it is reclaimed."""
    before = _stats(dp).counters
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, dp.control, "22"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "loaded"
        with duckpipe.connect(dp.control) as other:
            with pytest.raises(NotPermitted, match="layer 22 belongs to another client"):
                other.load_weights(22, MLP, ducks=[1])
            owner.kill()
            owner.wait(10)
            deadline = time.monotonic() + 10
            after = _stats(dp).counters
            # both: an earlier test's retired layer may be freed meanwhile
            while (
                after["clients_reclaimed"] < before["clients_reclaimed"] + 1
                or after["layers_freed"] < before["layers_freed"] + 1
            ) and time.monotonic() < deadline:
                time.sleep(0.05)
                after = _stats(dp).counters
            assert after["clients_reclaimed"] >= before["clients_reclaimed"] + 1
            assert after["layers_freed"] >= before["layers_freed"] + 1
            other.load_weights(22, MLP, ducks=[1])  # the id is free: no longer anyone's
            np.testing.assert_allclose(
                other.forward(22, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
            )
    finally:
        owner.kill()
        owner.wait(10)


# --- quotas and bounds ---------------------------------------------------------------------


def test_layer_count_quota_is_per_client(dp):
    with duckpipe.connect(dp.control) as a, duckpipe.connect(dp.control) as b:
        for i in range(MAX_LAYERS):
            a.load_weights(30 + i, MLP, ducks=[0])
        with pytest.raises(QuotaExceeded, match=f"{MAX_LAYERS} of {MAX_LAYERS} layers"):
            a.load_weights(30 + MAX_LAYERS, MLP, ducks=[0])
        a.load_weights(30, MLP, ducks=[1])  # replacing one of its own is no new layer
        b.load_weights(30 + MAX_LAYERS, MLP, ducks=[0])  # b has a quota of its own
        a.unload_layer(31)
        # the layers a's reload and unload retired are freed once no forward or dispatcher
        # pass can hold them (dp_layers_free_retired): until then the quota counts them and
        # says so, and the client retries, as the refusal tells it to
        deadline = time.monotonic() + 2.0
        while True:
            try:
                a.load_weights(40, MLP, ducks=[0])
                break
            except QuotaExceeded as e:
                if "not freed yet" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        assert _stats(dp).counters["quota_refused"] >= 1


def test_weight_bytes_quota(dp):
    big = GeluMlp.random(256, 1024, seed=1)  # 2 MiB of shards: over the 1 MiB quota
    with duckpipe.connect(dp.control) as a:
        with pytest.raises(QuotaExceeded, match="weight bytes"):
            a.load_weights(50, big, ducks=[0, 1])


def _load_plan(client, **fields) -> None:
    plan = dict(layer=60, kind=1, dtype=1, hidden=16, ffn=32, ducks=[0], shard_sizes=[32])
    plan.update(fields)
    client._session.request(lambda rid: ctl.LoadWeights(req_id=rid, **plan))


def test_huge_hidden_or_ffn_is_refused_before_anything_is_allocated(dp):
    with duckpipe.connect(dp.control) as a:
        rss = _rss(dp)
        for _ in range(4):  # once, 8 of these reserved 268 GB of address space
            with pytest.raises(BadInput, match="max_hidden"):
                _load_plan(a, hidden=2**32 - 1, has_b_down=True)
            with pytest.raises(BadInput, match="max_ffn"):
                _load_plan(a, ffn=2**31, shard_sizes=[2**31])
            with pytest.raises(BadInput, match="ducks"):
                _load_plan(a, ducks=list(range(257)), shard_sizes=[1] * 257, ffn=257)
        assert _rss(dp) - rss < 32 << 20
        a.load_weights(61, MLP, ducks=[0])
        np.testing.assert_allclose(
            a.forward(61, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


def test_load_weights_needs_an_attached_client(dp):
    (reply,) = _raw(
        dp.control,
        [
            ctl.encoder.encode(
                ctl.LoadWeights(
                    req_id=3, layer=70, kind=1, dtype=1, hidden=8, ffn=8, ducks=[0], shard_sizes=[8]
                )
            )
        ],
    )
    assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.NOT_ATTACHED


# --- msgpack bombs -------------------------------------------------------------------------

BOMBS = {
    # a 150-byte LoadWeights whose ducks array declares 2^32 - 1 elements
    "array_length_lie": b"\x83\xa4type\xabLoadWeights\xa6req_id\x05\xa5ducks\xdd\xff\xff\xff\xff"
    + b"\x00" * 118,
    "map_length_lie": b"\xdf\xff\xff\xff\xff" + b"\xc0" * 140,
    "deep_nesting": b"\x91" * 5000 + b"\x00",
    "str_length_lie": b"\x83\xa4type\xa6Attach\xa6req_id\x06\xa7segment\xdb\x7f\xff\xff\xffabc",
    "bin_length_lie": b"\x82\xa4type\xa9Heartbeat\xa6req_id\xc6\xff\xff\xff\xf0\x00",
}


def test_msgpack_bombs_get_clear_errors_and_cost_no_memory(dp):
    before = _stats(dp).counters["bad_control_messages"]
    rss = _rss(dp)
    for _ in range(10):
        replies = _raw(dp.control, list(BOMBS.values()))
        for name, reply in zip(BOMBS, replies, strict=True):
            assert isinstance(reply, ctl.Error), f"{name}: {reply}"
            assert reply.code == ErrorCode.BAD_MESSAGE, f"{name}: {reply}"
    # longer than any request: the sender is disconnected before anything is buffered
    assert _raw(dp.control, [b"\x90" + b"\x00" * (ctl.MAX_MESSAGE_BYTES + 1)], 1.0) == [None]
    assert _stats(dp).counters["bad_control_messages"] >= before + 10 * len(BOMBS)
    assert _rss(dp) - rss < 32 << 20, "a bomb made the dataplane reserve memory"
    with duckpipe.connect(dp.control) as c:  # alive and serving
        c.load_weights(80, MLP, ducks=[0])
        np.testing.assert_allclose(
            c.forward(80, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


def test_wrong_field_types_name_the_field(dp):
    bad = msgspec.msgpack.encode({"type": "SetEpoch", "req_id": 9, "epoch": "soon"})
    (reply,) = _raw(dp.control, [bad])
    assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.BAD_REQUEST
    assert "epoch" in reply.message and reply.req_id == 9


# --- roles ---------------------------------------------------------------------------------


@needs_root
def test_a_group_member_is_a_client_not_an_admin(dp):
    epoch = _stats(dp).epoch
    with duckpipe.connect(dp.control, name="victim") as victim:
        replies = _nobody_requests(
            dp.control,
            [
                ctl.SetEpoch(req_id=1),
                ctl.Shutdown(req_id=2),
                ctl.SetFaults(req_id=3, delay_ms=1000),
                ctl.LoadWeights(
                    req_id=4,
                    layer=90,
                    kind=1,
                    dtype=1,
                    hidden=8,
                    ffn=8,
                    ducks=[0],
                    shard_sizes=[8],
                    shared=True,
                ),
                ctl.GetStats(req_id=5),
            ],
        )
        for reply in replies[:3]:
            assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.NOT_PERMITTED, reply
            assert "admin" in reply.message
        assert isinstance(replies[3], ctl.Error)
        assert replies[3].code in (ErrorCode.NOT_ATTACHED, ErrorCode.NOT_PERMITTED)
        stats = replies[4]
        assert isinstance(stats, ctl.Stats)
        seen = [c for c in stats.clients if c.client_id == victim.client_id]
        assert seen and seen[0].segment == "" and seen[0].pid == 0, seen
        assert _stats(dp).epoch == epoch  # nothing moved
        admin_view = [c for c in victim.stats().clients if c.client_id == victim.client_id]
        assert admin_view[0].segment == victim.segment_name
        victim.load_weights(91, MLP, ducks=[0])
        victim.forward(91, X, timeout=10)
    assert _stats(dp).counters["control_refused"] >= 3


@needs_root
@pytest.mark.parametrize("kind", ["mock", "real"])
def test_another_user_is_refused_by_the_socket_even_when_its_file_is_open(kind):
    run = _shared_dir(None)
    run.chmod(0o755)
    try:
        with _dataplane(kind, f"ipc://{run}/control") as d:
            sock = run / "control"
            assert sock.stat().st_mode & 0o777 == 0o600  # the first fence
            sock.chmod(0o666)  # a mistake: the uid filter is the second fence
            (reply,) = _nobody_requests(d.control, [ctl.GetStats(req_id=1)])
            assert reply is None
            assert _stats(d) is not None  # and the dataplane lives
    finally:
        shutil.rmtree(run, ignore_errors=True)


# --- tcp:// --------------------------------------------------------------------------------


def _tcp() -> str:
    with socket.socket() as s:  # a free TCP port (the kernel may not hand it out again soon)
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _start_raw(kind: str, control: str, settings: dict):
    """The dataplane process, without waiting for an answer (ping has no CURVE keys)."""
    if kind == "mock":
        args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        child = MockDataplaneProcess(ducks=2, control=control, args=args)
    else:
        cluster_class_or_skip()
        from duckpipe.launch.dataplane import DataplaneProcess
        from duckpipe.launch.topology import loopback

        base = free_udp_ports(3)
        topo = loopback(2, host_port=base, duck_port=base + 1, control=control, **settings)
        child = DataplaneProcess(topo)
    child.proc = subprocess.Popen(child.command(), stdout=child._log, stderr=subprocess.STDOUT)
    return child


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_tcp_control_without_curve_keys_is_refused_at_start(kind):
    child = _start_raw(kind, _tcp(), {})
    try:
        assert child.proc.wait(20) != 0
        assert "needs CURVE" in child.output(), child.output()
    finally:
        child.kill()
        child.close()


def _ask(sock, msg: ctl.Request, timeout: float = 5.0):
    """The reply to msg (earlier replies on the socket are skipped), or None. None too when
    the message cannot even leave: a DEALER whose CURVE handshake was refused may have no
    pipe to send on, and a blocking send would wait forever (a hang seen in this file)."""
    deadline = time.monotonic() + timeout
    if not sock.poll(timeout * 1000, zmq.POLLOUT):
        return None
    try:
        sock.send(ctl.encoder.encode(msg), zmq.NOBLOCK)
    except zmq.Again:
        return None
    while (left := deadline - time.monotonic()) > 0 and sock.poll(left * 1000):
        reply = ctl.reply_decoder.decode(sock.recv())
        if getattr(reply, "req_id", None) == msg.req_id:
            return reply
    return None


def _curve_socket(ctx, control: str, server_public: bytes, keys: tuple[bytes, bytes]):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_serverkey = server_public
    s.curve_publickey, s.curve_secretkey = keys
    s.connect(control)
    return s


@pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq has no CURVE")
@pytest.mark.parametrize("kind", ["mock", "real"])
def test_tcp_control_with_curve_serves_only_listed_keys(kind, tmp_path):
    server_public, server_secret = zmq.curve_keypair()
    known, stranger = zmq.curve_keypair(), zmq.curve_keypair()
    (tmp_path / "server.key").write_bytes(server_secret)
    (tmp_path / "server.pub").write_bytes(server_public)
    (tmp_path / "clients").write_bytes(b"# admitted\n" + known[0] + b"\n")
    settings = {
        "curve_secret_key_file": str(tmp_path / "server.key"),
        "curve_public_key_file": str(tmp_path / "server.pub"),
        "curve_clients_file": str(tmp_path / "clients"),
    }
    control = _tcp()
    child = _start_raw(kind, control, settings)
    ctx = zmq.Context()
    try:
        ok = _curve_socket(ctx, control, server_public, known)
        deadline = time.monotonic() + 30
        stats = None
        rid = 0
        while stats is None and time.monotonic() < deadline:
            assert child.proc.poll() is None, child.output()
            rid += 1
            stats = _ask(ok, ctl.GetStats(req_id=rid), 0.3)
        assert isinstance(stats, ctl.Stats), child.output()
        bad = _curve_socket(ctx, control, server_public, stranger)
        assert _ask(bad, ctl.GetStats(req_id=1), 1.5) is None, "an unlisted key was served"
        plain = ctx.socket(zmq.DEALER)
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(control)
        assert _ask(plain, ctl.GetStats(req_id=1), 1.0) is None, "a plain client was served"
        reply = _ask(
            ok,
            ctl.Attach(
                req_id=1000, abi_major=ABI_MAJOR, pid=os.getpid(), segment="/x", segment_fd=0
            ),
        )
        assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.NOT_PERMITTED, reply
        assert "local peer" in reply.message
        reply = _ask(ok, ctl.Shutdown(req_id=1001))  # a tcp peer is no admin
        assert isinstance(reply, ctl.Error) and reply.code == ErrorCode.NOT_PERMITTED, reply
        stats = _ask(ok, ctl.GetStats(req_id=1002))
        assert stats.counters["curve_refused"] >= 1
        for s in (ok, bad, plain):
            s.close()
    finally:
        ctx.destroy(linger=0)
        if child.proc.poll() is None:
            child.proc.terminate()
        code = child.proc.wait(10)
        out = child.output()
        child.close()
    assert code == 0 and not [m for m in SANITIZER_MARKS if m in out], out[-3000:]


@contextlib.contextmanager
def _slow_dataplane(kind: str) -> Iterator:
    """Ducks (or the mock) that answer 200 ms late: forwards stay in flight that long."""
    if kind == "mock":
        with MockDataplaneProcess(ducks=2, args=["--delay-ms", "200"]) as d:
            yield d
        return
    cluster = cluster_class_or_skip()(2, duck_args=["--delay-us", "200000"]).start()
    try:
        yield cluster
    finally:
        assert_clean_exit(cluster)


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_unloading_a_layer_under_forwards_in_flight_lets_them_finish(kind):
    with _slow_dataplane(kind) as d, duckpipe.connect(d.control) as c:
        c.load_weights(5, MLP, ducks=[0, 1])
        stats = _stats(d).counters
        freed, picked = stats["layers_freed"], stats["descriptors"]
        fwds = []
        for _ in range(8):
            slot = c.claim(X.shape, X.dtype)
            slot.array[:] = X
            fwds.append(c.submit(slot, 5))
        deadline = time.monotonic() + 5  # the dataplane took them all: they hold the layer
        while _stats(d).counters["descriptors"] < picked + 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        c.unload_layer(5)
        for f in fwds:
            np.testing.assert_allclose(f.result(timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5)
        deadline = time.monotonic() + 5  # and it is freed once they are done
        while _stats(d).counters["layers_freed"] < freed + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stats(d).counters["layers_freed"] == freed + 1
        with pytest.raises(UnknownLayer):
            c.forward(5, X, timeout=10)


FLOODER = """
import sys, time
import zmq
control, seconds = sys.argv[1], float(sys.argv[2])
junk = [bytes.fromhex(h) for h in sys.argv[3:]]
ctx = zmq.Context()
socks = []
for _ in range(4):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 100000)
    s.connect(control)
    socks.append(s)
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    for s in socks:
        try:
            s.send(junk[sent % len(junk)], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            pass
print(sent)
ctx.destroy(linger=0)
"""


def test_a_control_flood_costs_a_well_behaved_client_nothing(dp):
    junk = [
        *BOMBS.values(),
        b"\xff\x00garbage",
        ctl.encoder.encode(ctl.GetStats(req_id=1)),
        ctl.encoder.encode(ctl.GetLayers(req_id=2)),
        msgspec.msgpack.encode({"type": "LoadWeights", "req_id": 3, "hidden": 2**32 - 1}),
    ]
    with duckpipe.connect(dp.control) as c:
        c.load_weights(95, MLP, ducks=[0, 1])
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOODER, dp.control, "3", *(j.hex() for j in junk)],
            stdout=subprocess.PIPE,
            text=True,
        )
        done = 0
        try:
            while flood.poll() is None:
                np.testing.assert_allclose(
                    c.forward(95, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
                )
                done += 1
        finally:
            out, _ = flood.communicate(timeout=30)
        assert int(out) > 1000 and done > 10, (out, done)
        assert _stats(dp).counters["control_messages"] > 1000
        np.testing.assert_allclose(
            c.forward(95, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )


# --- peer credentials only on ipc:// ------------------------------------------------------


def test_credentials_are_read_only_from_ipc_peers():
    """A tcp:// peer's Peer-Address is its IP: an IPv6 one ending ":0:7:5" is not uid 0.
    (The C parser has the same cases in dataplane/tests/test_ctl.c.)"""
    from duckpipe.mock.dataplane import _peer_credentials

    assert _peer_credentials("ipc:///run/x/control", "localhost:1000:100:2639") == (1000, 100, 2639)
    assert _peer_credentials("ipc:///run/x/control", "2001:db8::0:7:5") == (0, 7, 5)
    assert _peer_credentials("tcp://[::]:5555", "2001:db8::0:7:5") is None
    assert _peer_credentials("tcp://127.0.0.1:5555", "localhost:1000:100:2639") is None


# --- liveness: the kernel's start time, not the header's -------------------------------------


class _ForgedClock:
    """duckpipe._abi.shm's clock, with time_ns() far in the past: the segment header's start_ns
    (written by the client) then says the process started long before it did."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def time_ns() -> int:
        return 10**9


def test_liveness_uses_the_kernels_start_time_not_the_segment_header(dp, monkeypatch):
    """A client writes its header's start_ns: once trusted, a date in the future hid a
    reused pid from the dataplane, and one in the past (here) made a live client 'dead'."""
    import duckpipe._abi.shm

    monkeypatch.setattr(duckpipe._abi.shm, "time", _ForgedClock())
    with duckpipe.connect(dp.control, name="forged-start") as c:
        monkeypatch.undo()
        assert c._session.segment.header.start_ns == 10**9
        c.load_weights(50, MLP, ducks=[0])
        time.sleep(0.5)  # ten housekeeping rounds of the dataplane
        np.testing.assert_allclose(
            c.forward(50, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
        )
        assert [s.name for s in c.stats().clients if s.pid == os.getpid()] == ["forged-start"]


# --- tables and connections: one process cannot fill them --------------------------------------

MAX_CONNECTIONS = 32  # low, so that a flood passes it quickly


@pytest.fixture(scope="module", params=["mock", "real"])
def caps(request) -> Iterator:
    """A dataplane with the default table quotas (client_max_per_pid, client_max_layers)."""
    run = _shared_dir(None)
    try:
        with _dataplane(
            request.param, f"ipc://{run}/control", max_connections=MAX_CONNECTIONS
        ) as d:
            yield d
    finally:
        shutil.rmtree(run, ignore_errors=True)


VICTIM = """
import sys
import numpy as np
import duckpipe
from duckpipe import GeluMlp
mlp = GeluMlp.random(16, 32, seed=3)
x = np.ones((2, 16), np.float32)
with duckpipe.connect(sys.argv[1], name="victim") as v:
    v.load_weights(7, mlp, ducks=[0, 1])
    np.testing.assert_allclose(v.forward(7, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5)
print("victim ok")
"""


def _victim(control: str) -> str:
    """A well-behaved client in another process: loads a layer and checks a forward."""
    out = subprocess.run(
        [sys.executable, "-c", VICTIM, control], capture_output=True, text=True, timeout=120
    )
    # stderr may carry warnings (4 KiB pages when hugepages run short): the verdict is stdout
    return out.stdout.strip() if out.returncode == 0 else (out.stdout + out.stderr).strip()


def test_one_process_attaches_at_most_client_max_per_pid_clients(caps):
    limit = config_default("client_max_per_pid")
    with contextlib.ExitStack() as stack:
        for i in range(limit):
            stack.enter_context(duckpipe.connect(caps.control, name=f"hog{i}", slots=1))
        with pytest.raises(QuotaExceeded, match="client_max_per_pid"):
            duckpipe.connect(caps.control, name="one-too-many", slots=1)
        assert _victim(caps.control).endswith("victim ok")  # another process still can
    with duckpipe.connect(caps.control, name="after") as c:  # closing gave the slots back
        c.load_weights(8, MLP, ducks=[0])


def test_clients_at_their_layer_quota_leave_room_in_the_layer_table(caps):
    tiny = GeluMlp.random(16, 1, seed=1, b_down=False)
    fields = dict(
        kind=int(tiny.kind),
        dtype=int(dtype_code(tiny.dtype)),
        hidden=16,
        ffn=1,
        ducks=[0],
        shard_sizes=[1],
        has_b_down=False,
    )
    greedy = config_default("client_max_per_pid")
    with contextlib.ExitStack() as stack:
        for k in range(greedy):
            c = stack.enter_context(duckpipe.connect(caps.control, name=f"greedy{k}", slots=1))
            for i in range(1 << 16):  # until its quota says no (the table must not first)
                try:
                    c._session.request(
                        lambda rid, lid=100_000 * (k + 1) + i: ctl.LoadWeights(
                            req_id=rid, layer=lid, **fields
                        )
                    )
                except QuotaExceeded:
                    break
            assert i == config_default("client_max_layers")
        assert _victim(caps.control).endswith("victim ok")


@pytest.mark.parametrize("kind", ["mock", "real"])
@pytest.mark.parametrize(
    "settings, why",
    [
        ({"client_max_layers": LAYER_TABLE // MAX_CLIENTS + 1}, "passes the layer table"),
        ({"client_max_per_pid": 0}, "client_max_per_pid 0 is outside"),
        ({"client_max_per_uid": 0}, "client_max_per_uid 0 is outside"),
        ({"admin_reserved_clients": 0}, "admin_reserved_clients 0 is outside"),
        ({"admin_reserved_clients": MAX_CLIENTS}, f"admin_reserved_clients {MAX_CLIENTS} is"),
    ],
)
def test_table_quotas_that_cannot_work_are_refused_at_start(kind, settings, why, tmp_path):
    child = _start_raw(kind, f"ipc://{tmp_path}/control", settings)
    try:
        assert child.proc.wait(20) != 0
        assert why in child.output(), child.output()
    finally:
        child.kill()
        child.close()


def _raw_connections(path: str, n: int, seconds: float = 20.0) -> list[socket.socket]:
    """Up to n AF_UNIX connections to path that never send a ZMTP greeting."""
    socks: list[socket.socket] = []
    deadline = time.monotonic() + seconds
    while len(socks) < n and time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        while time.monotonic() < deadline:
            try:
                s.connect(path)
                socks.append(s)
                break
            except BlockingIOError:  # the backlog is full: wait for the dataplane to accept
                time.sleep(0.001)
            except OSError:
                time.sleep(0.01)  # refused while the dataplane closes the flood: try again
        else:
            s.close()
    return socks


@pytest.mark.dataplane
def test_a_connection_flood_cannot_exhaust_the_dataplanes_file_descriptors(tmp_path):
    """libzmq 4.3 aborts the process when accept() fails with EMFILE: raw connections that
    never greet once killed the dataplane (1k of them under a 1024 fd limit). Past
    max_connections they are closed at once; the rest die after the 2 s handshake limit."""
    import resource

    nofile = 256  # the dataplane's limit, lowered after start (it raised its own to hard)
    flood = nofile + 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < flood + 256:
        pytest.skip(f"this process may hold only {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks: list[socket.socket] = []
    try:
        with _dataplane("real", f"ipc://{tmp_path}/control", max_connections=MAX_CONNECTIONS) as d:
            pid = _pid(d)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (nofile, nofile))
            with duckpipe.connect(d.control, name="attached") as c:
                c.load_weights(60, MLP, ducks=[0, 1])
                socks = _raw_connections(d.control[len("ipc://") :], flood)
                assert d.dataplane.proc.poll() is None, d.output()[-2000:]
                assert len(socks) >= flood // 2, len(socks)
                # a client attached before the flood keeps its connection throughout
                np.testing.assert_allclose(
                    c.forward(60, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
                )
                assert len(os.listdir(f"/proc/{pid}/fd")) < nofile
                for s in socks:
                    s.close()
                socks = []
                assert c.stats().counters["connections_refused"] > 0
            with duckpipe.connect(d.control, name="after", timeout=20) as after:
                after.load_weights(61, MLP, ducks=[0])
                np.testing.assert_allclose(
                    after.forward(61, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
                )
            assert d.dataplane.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.dataplane
def test_a_dataplane_out_of_descriptors_sheds_connections_instead_of_aborting(tmp_path):
    """With no descriptor left, libzmq's accept4() fails with EMFILE, which libzmq 4.3.4
    asserts on (ipc_listener.cpp): the dataplane aborted, whatever max_connections said.
    Here the limit is a few descriptors above what the dataplane holds, so the flood hits
    EMFILE for certain: the dataplane's accept4() sheds those connections (accepts and
    closes them on its reserve descriptor, connections_shed) and lives; the client
    attached before keeps working, and a new one connects once the flood is gone."""
    import resource

    with _dataplane("real", f"ipc://{tmp_path}/control", max_connections=MAX_CONNECTIONS) as d:
        pid = _pid(d)
        with duckpipe.connect(d.control, name="attached") as c:
            c.load_weights(62, MLP, ducks=[0, 1])
            c.forward(62, X, timeout=10)  # every descriptor a forward needs is open
            held = len(os.listdir(f"/proc/{pid}/fd"))
            soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
            # the soft limit only: raising a hard limit back needs CAP_SYS_RESOURCE
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (held + 4, hard))
            socks = _raw_connections(d.control[len("ipc://") :], 64, seconds=5)
            try:
                deadline = time.monotonic() + 10
                while c.stats().counters["connections_shed"] == 0:
                    assert d.dataplane.proc.poll() is None, d.output()[-2000:]
                    assert time.monotonic() < deadline, "no connection was shed"
                    time.sleep(0.05)
                assert d.dataplane.proc.poll() is None, d.output()[-2000:]
                np.testing.assert_allclose(
                    c.forward(62, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
                )
            finally:
                for s in socks:
                    s.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        with duckpipe.connect(d.control, name="after", timeout=20) as after:
            after.load_weights(63, MLP, ducks=[0])
            np.testing.assert_allclose(
                after.forward(63, X, timeout=10), MLP.reference(X), rtol=1e-4, atol=1e-5
            )
        assert d.dataplane.proc.poll() is None


@pytest.mark.dataplane
def test_replies_nobody_reads_cost_bounded_memory(tmp_path):
    """Each control peer's unread replies once queued up to libzmq's default SNDHWM (1000)
    each (500 peers x 1000 GetStats took the dataplane from 7 to 388 MiB); now at most
    ROUTER_SNDHWM (256) per peer, and max_connections peers: the rest are dropped."""
    peers, requests = 100, 1000
    with _dataplane("real", f"ipc://{tmp_path}/control") as d:
        before = _rss(d)
        ctx = zmq.Context()
        socks = []
        try:
            req = ctl.encoder.encode(ctl.GetStats(req_id=2))
            for _ in range(peers):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, 0)
                s.setsockopt(zmq.RCVHWM, 1)  # this side keeps almost nothing
                s.connect(d.control)
                socks.append(s)
            for _ in range(requests):
                for s in socks:
                    s.send(req, zmq.NOBLOCK)
            deadline = time.monotonic() + 60
            while _stats(d).counters["control_messages"] < peers * requests:
                assert time.monotonic() < deadline, "the dataplane did not read the requests"
                time.sleep(0.2)
            grown = (_rss(d) - before) / 2**20
            one = len(ctl.encoder.encode(_stats(d)))
            received = 0  # what was kept for one peer: 256 queued, and the socket buffers
            while socks[0].poll(500):
                while socks[0].poll(0):
                    socks[0].recv()
                    received += 1
            assert received <= 2 * 256 < requests, received
            with open(f"/proc/{_pid(d)}/maps") as f:
                maps = f.read()
            # ASan's quarantine keeps freed memory; TSan's allocator and shadow hold on too
            sanitized = "libasan" in maps or "libtsan" in maps
            # unbounded: peers x requests replies; bounded: peers x 256 (and socket buffers)
            assert sanitized or grown < peers * requests * one / 2**20 / 2, (grown, one)
        finally:
            for s in socks:
                s.close()
            ctx.term()
        assert d.dataplane.proc.poll() is None


@pytest.mark.dataplane
def test_max_connections_past_the_fd_limit_is_refused_at_start(tmp_path):
    child = _start_raw("real", f"ipc://{tmp_path}/control", {"max_connections": 2**31})
    try:
        assert child.proc.wait(20) != 0
        assert "RLIMIT_NOFILE" in child.output(), child.output()
    finally:
        child.kill()
        child.close()
