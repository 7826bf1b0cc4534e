"""The duck emulator's worker threads (``--threads``) and kernel choice (``--isa``).

Each worker thread owns a group of ducks: their sockets, layers and replies. These tests
play the dataplane over loopback UDP and check that every duck still answers as its own,
that the counters printed at the end add up over the threads, and that ``--drop`` draws
per duck, so a seed drops the same datagrams however the ducks are spread over threads.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from free_ducks import start_ducks

from duckpipe.client.models import dtype_code, duck_partial
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.ducks import DucksProcess
from duckpipe.schema.abi import MlpKind
from duckpipe.schema.wire import CONSTANTS, WireOp
from duckpipe.testing.datagrams import decode, encode, layer_payload

pytestmark = pytest.mark.dataplane

try:
    BINARY = find_binary("duckpipe-ducks")
except DuckpipeError as e:
    pytest.skip(str(e), allow_module_level=True)

LAYER_TENSOR = CONSTANTS["WIRE_LAYER_TENSOR"]
HIDDEN, FFN = 24, 8  # one small SwiGLU shard per duck: every tensor fits one datagram


class Host:
    """The dataplane's side, on one UDP socket."""

    def __init__(self, ducks: DucksProcess) -> None:
        self.addr = {d: (ip, port) for d, ip, port in ducks.addresses}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.session = random.getrandbits(63) | 1

    def close(self) -> None:
        self.sock.close()

    def send(self, to: int, op: int, payload: bytes = b"", /, **fields: int) -> None:
        fields.setdefault("duck", to)
        self.sock.sendto(
            encode(op, payload, session=self.session, epoch=1, **fields), self.addr[to]
        )

    def recv_all(self, quiet: float) -> list:
        out = []
        self.sock.settimeout(quiet)
        while True:
            try:
                out.append(decode(self.sock.recvfrom(65536)[0]))
            except TimeoutError:
                return out

    def recv_n(self, n: int, timeout: float = 5.0) -> list:
        self.sock.settimeout(timeout)
        return [decode(self.sock.recvfrom(65536)[0]) for _ in range(n)]


@pytest.fixture
def make_ducks() -> Iterator:
    procs: list[DucksProcess] = []

    def make(ducks: int, args: Sequence[str] = ()) -> DucksProcess:
        procs.append(start_ducks(ducks, args))
        return procs[-1]

    yield make
    for p in procs:
        p.stop()


def threads_of(pid: int) -> int:
    """The emulator's worker threads: its main thread and those it named ``ducks-w<i>``
    (not a sanitizer's own)."""
    names = [
        open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        for tid in os.listdir(f"/proc/{pid}/task")
    ]
    return 1 + sum(n.startswith("ducks-w") for n in names)


def shard(duck: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + duck)
    return [
        (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        for shape in ((HIDDEN, FFN), (HIDDEN, FFN), (FFN, HIDDEN))
    ]


@pytest.mark.parametrize(
    ("ducks", "args", "threads"),
    [(5, ["--threads", "2"], 2), (3, ["--threads", "1", "--isa", "portable"], 1)],
    ids=["2-threads", "1-thread-portable"],
)
def test_every_duck_computes_its_own_shard_whatever_thread_owns_it(
    make_ducks, ducks, args, threads
):
    proc = make_ducks(ducks, args)
    assert threads_of(proc.pid) == threads
    host = Host(proc)
    shards = [shard(d) for d in range(ducks)]
    for d in range(ducks):  # every duck: LAYER, three WEIGHTs, a PING
        host.send(d, WireOp.LAYER, layer_payload(MlpKind.SWIGLU, 1, HIDDEN, FFN), layer=3)
        for t, w in enumerate(shards[d]):
            raw = w.tobytes()
            host.send(d, WireOp.WEIGHT, raw, layer=3, tensor=t, dtype=dtype_code(np.float32),
                      chunk=0, chunks=1, offset=0, total=len(raw))  # fmt: skip
        host.send(d, WireOp.PING, forward_id=d)
    acks = host.recv_n(5 * ducks)
    assert sorted((h.duck, h.op) for h, _ in acks) == sorted(
        [(d, WireOp.WEIGHT_ACK) for d in range(ducks) for _ in range(4)]
        + [(d, WireOp.PONG) for d in range(ducks)]
    )
    x = np.random.default_rng(7).standard_normal((2, HIDDEN)).astype(np.float32)
    for d in range(ducks):
        host.send(d, WireOp.FORWARD, x.tobytes(), forward_id=50, layer=3, rows=2,
                  dtype=dtype_code(np.float32), chunk=0, chunks=1, offset=0,
                  total=x.nbytes)  # fmt: skip
    for h, payload in host.recv_n(ducks):
        assert h.op == WireOp.PARTIAL and h.forward_id == 50
        got = np.frombuffer(payload, np.float32).reshape(2, HIDDEN)
        want = duck_partial(MlpKind.SWIGLU, x, shards[h.duck])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    host.close()
    assert proc.stop() == 0
    c = proc.counters()  # summed over the threads
    assert c["rx"] == 6 * ducks and c["tx"] == 6 * ducks, c
    assert (c["layers"], c["weight_acks"], c["pongs"]) == (ducks, 4 * ducks, ducks), c
    assert c["forwards_computed"] == ducks and c["partials_sent"] == ducks, c


def test_threads_are_capped_by_the_ducks_and_default_to_the_cpus_it_may_use(make_ducks):
    assert threads_of(make_ducks(3, ["--threads", "8"]).pid) == 3
    cpus = len(os.sched_getaffinity(0))  # the emulator inherits this affinity
    assert threads_of(make_ducks(32).pid) == min(cpus, 32)


def test_drop_loses_the_same_datagrams_on_one_thread_as_on_four(make_ducks):
    answered = []
    for threads in ("1", "4"):
        proc = make_ducks(4, ["--drop", "0.3", "--seed", "9", "--threads", threads])
        host = Host(proc)
        for i in range(40):
            for d in range(4):
                host.send(d, WireOp.PING, forward_id=i)
        answered.append(sorted((h.duck, h.forward_id) for h, _ in host.recv_all(0.3)))
        host.close()
        assert proc.stop() == 0
        assert proc.counters()["dropped_injected"] > 0
    assert 0 < len(answered[0]) < 160
    assert answered[0] == answered[1]


def test_bad_threads_and_isa_are_refused():
    for args in (["--threads", "0"], ["--threads", "x"], ["--isa", "sse9"]):
        r = subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "duckpipe-ducks: --" in r.stderr, (args, r.stderr)
