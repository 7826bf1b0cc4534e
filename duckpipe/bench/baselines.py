"""The reference system's path, as rows of ``duckpipe bench forward``.

Each baseline sends one activation (real duckpipe FORWARD datagrams: headers made
by :func:`duckpipe.testing.datagrams.encode` once per duck and chunk, the forward id patched in
per request) to every duck by unicast, and receives every duck's PARTIAL chunks.
No NACKs and no reduce: a forward whose partials are not all in within the
timeout is counted as lost. Before timing, each announces a layer (op LAYER) to
every duck and waits for the acks, since the emulator answers only a known layer.

``run_python(kind, ...)`` runs one of :data:`PYTHON_BASELINES`; ``run_floor`` runs
the C program ``duckpipe-floor`` (sendmmsg, or UDP GSO with ``gso=True``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import DuckpipeError
from ..launch.binaries import find_binary
from ..schema.wire import WireOp
from ..testing import datagrams as wire
from .common import cpu_seconds

__all__ = ["PYTHON_BASELINES", "Sample", "Samples", "run_floor", "run_python"]

#: name -> row label
PYTHON_BASELINES = {
    "new_socket": "Python: new UDP socket per request",
    "cached": "Python: cached sockets, in turn",
    "threads": "Python: a thread per duck",
    "asyncio": "Python: asyncio",
    "epoll": "Python: one socket + epoll",
}

MTU = 1500
LAYER_ID = 0x7F11  # the layer the Python baselines announce (duckpipe-floor uses 0x7F10)
SOCK_BUF = 32 << 20
RX_BUF = 2048
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
# the generated struct dp_wire_header, little-endian, 80 bytes
HEADER = struct.Struct("<IBBBBQQQIHHIIQQIIQ")
assert HEADER.size == wire.HEADER_SIZE
FWD_OFFSET = 24  # forward_id's offset in the header
OP_PARTIAL, OP_ACK = int(WireOp.PARTIAL), int(WireOp.WEIGHT_ACK)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One forward, nanoseconds."""

    e2e: int
    send: int  # first send started -> last send returned
    recv_window: int  # first partial datagram in -> last one in
    max_compute: int  # the slowest duck's reported compute_ns
    sum_compute: int  # every duck's compute_ns added up
    lost: int  # ducks whose partial was not complete in time


@dataclasses.dataclass
class Samples:
    samples: list[Sample]
    cpu_s: float  # host CPU over the timed forwards (client + dataplane where there is one)
    forwards: int
    counters: dict[str, int] = dataclasses.field(default_factory=dict)  # dataplane, per run


def _buffers(s: socket.socket) -> None:
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            s.setsockopt(socket.SOL_SOCKET, force, SOCK_BUF)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, plain, SOCK_BUF)


def _socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _buffers(s)
    s.bind(("127.0.0.1", 0))
    return s


class _Request:
    """Every datagram of one activation, per duck, with the forward id patched per request."""

    def __init__(self, ducks: Sequence[tuple[int, int]], nbytes: int, rows: int, session: int):
        self.ducks = list(ducks)
        self.addrs = [("127.0.0.1", port) for _, port in ducks]
        self.index = {duck_id: i for i, (duck_id, _) in enumerate(ducks)}
        payload = wire.payload_max(MTU)
        self.chunks = max(1, -(-nbytes // payload))
        self.session = session
        x = np.arange(nbytes // 4, dtype=np.float32) * 0.01
        raw = x.tobytes()
        self.dgrams: list[list[bytearray]] = []
        for duck_id, _ in ducks:
            per = []
            for c in range(self.chunks):
                part = raw[c * payload : (c + 1) * payload]
                per.append(
                    bytearray(
                        wire.encode(
                            int(WireOp.FORWARD),
                            part,
                            session=session,
                            epoch=1,
                            duck=duck_id,
                            layer=LAYER_ID,
                            dtype=1,
                            chunk=c,
                            chunks=self.chunks,
                            offset=c * payload,
                            total=nbytes,
                            rows=rows,
                        )
                    )
                )
            self.dgrams.append(per)

    def set_forward(self, fwd: int) -> None:
        for per in self.dgrams:
            for d in per:
                struct.pack_into("<Q", d, FWD_OFFSET, fwd)


class _Gather:
    """Counts the partial chunks of one forward per duck; keeps the timings."""

    def __init__(self, req: _Request, fwd: int) -> None:
        self.req, self.fwd = req, fwd
        self.got = [0] * len(req.ducks)
        self.done = 0
        self.first = self.last = 0
        self.max_c = self.sum_c = 0

    def feed(self, data: bytes, t: int) -> int | None:
        """Take one datagram; returns the duck index whose partial it completed, else None."""
        if len(data) < HEADER.size:
            return None
        h = HEADER.unpack_from(data)
        # magic, version, op, dtype, flags, session, epoch, forward_id, layer, duck, ...
        if h[2] != OP_PARTIAL or h[5] != self.req.session or h[7] != self.fwd:
            return None
        i = self.req.index.get(h[9])
        if i is None:
            return None
        if not self.first:
            self.first = t
        self.last = t
        if self.got[i] == 0:
            self.sum_c += h[17]
            self.max_c = max(self.max_c, h[17])
        self.got[i] += 1
        if self.got[i] == h[12]:
            self.done += 1
            return i
        return None

    def complete(self) -> bool:
        return self.done == len(self.got)

    def sample(self, t0: int, t1: int, t2: int) -> Sample:
        return Sample(
            e2e=t2 - t0,
            send=t1 - t0,
            recv_window=self.last - self.first if self.first else 0,
            max_compute=self.max_c,
            sum_compute=self.sum_c,
            lost=len(self.got) - self.done,
        )


def announce_layer(ducks: Sequence[tuple[int, int]], hidden: int, session: int) -> None:
    """LAYER to every duck, waiting for each ack (resent up to 5 times)."""
    payload = wire.layer_payload(2, 1, hidden, 8)  # SwiGLU, float32, a tiny ffn: echo ignores it
    with _socket() as s:
        s.settimeout(0.2)
        for duck_id, port in ducks:
            dgram = wire.encode(
                int(WireOp.LAYER),
                payload,
                session=session,
                epoch=1,
                duck=duck_id,
                layer=LAYER_ID,
                dtype=1,
            )
            for _ in range(5):
                s.sendto(dgram, ("127.0.0.1", port))
                try:
                    deadline = time.monotonic() + 0.2
                    while time.monotonic() < deadline:
                        h = HEADER.unpack_from(s.recv(RX_BUF))
                        if h[2] == OP_ACK and h[9] == duck_id:
                            break
                    else:
                        continue
                    break
                except (TimeoutError, struct.error):
                    continue
            else:
                raise DuckpipeError(
                    f"duck {duck_id} on 127.0.0.1:{port} never acknowledged the layer: "
                    "is duckpipe-ducks running there?"
                )


# ------------------------------------------------------------------------ the rows


def _drain_one(s: socket.socket, g: _Gather, duck: int, deadline: float) -> None:
    """Blocking receives on ``s`` until duck ``duck``'s partial is complete or the deadline."""
    while g.got[duck] < g.req.chunks:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        s.settimeout(left)
        try:
            data = s.recv(RX_BUF)
        except TimeoutError:
            return
        if g.feed(data, time.perf_counter_ns()) == duck:
            return


def _fwd_new_socket(req: _Request, fwd: int, timeout: float) -> Sample:
    g = _Gather(req, fwd)
    t0 = time.perf_counter_ns()
    socks = []
    for per, addr in zip(req.dgrams, req.addrs, strict=True):
        s = _socket()
        socks.append(s)
        for d in per:
            s.sendto(d, addr)
    t1 = time.perf_counter_ns()
    deadline = time.monotonic() + timeout
    for i, s in enumerate(socks):
        _drain_one(s, g, i, deadline)
        s.close()
    return g.sample(t0, t1, time.perf_counter_ns())


def _make_cached(req: _Request) -> Callable[[int, float], Sample]:
    socks = [_socket() for _ in req.ducks]

    def fwd_once(fwd: int, timeout: float) -> Sample:
        g = _Gather(req, fwd)
        t0 = time.perf_counter_ns()
        for s, per, addr in zip(socks, req.dgrams, req.addrs, strict=True):
            for d in per:
                s.sendto(d, addr)
        t1 = time.perf_counter_ns()
        deadline = time.monotonic() + timeout
        for i, s in enumerate(socks):
            _drain_one(s, g, i, deadline)
        return g.sample(t0, t1, time.perf_counter_ns())

    fwd_once.close = lambda: [s.close() for s in socks]  # type: ignore[attr-defined]
    return fwd_once


def _make_threads(req: _Request) -> Callable[[int, float], Sample]:
    socks = [_socket() for _ in req.ducks]
    pool = ThreadPoolExecutor(max_workers=len(socks), thread_name_prefix="duck")
    lock = threading.Lock()

    def one(i: int, g: _Gather, deadline: float) -> tuple[int, int]:
        s, per, addr = socks[i], req.dgrams[i], req.addrs[i]
        a = time.perf_counter_ns()
        for d in per:
            s.sendto(d, addr)
        b = time.perf_counter_ns()
        while g.got[i] < req.chunks:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                data = s.recv(RX_BUF)
            except TimeoutError:
                break
            with lock:
                g.feed(data, time.perf_counter_ns())
        return a, b

    def fwd_once(fwd: int, timeout: float) -> Sample:
        g = _Gather(req, fwd)
        t0 = time.perf_counter_ns()
        deadline = time.monotonic() + timeout
        futs = [pool.submit(one, i, g, deadline) for i in range(len(socks))]
        spans = [f.result() for f in futs]
        t2 = time.perf_counter_ns()
        s = g.sample(t0, t0, t2)
        send = max(b for _, b in spans) - min(a for a, _ in spans)
        return dataclasses.replace(s, send=send)

    def close() -> None:
        pool.shutdown()
        for s in socks:
            s.close()

    fwd_once.close = close  # type: ignore[attr-defined]
    return fwd_once


def _make_epoll(req: _Request) -> Callable[[int, float], Sample]:
    s = _socket()
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN)
    recv, flags = s.recv, socket.MSG_DONTWAIT

    def fwd_once(fwd: int, timeout: float) -> Sample:
        g = _Gather(req, fwd)
        t0 = time.perf_counter_ns()
        for per, addr in zip(req.dgrams, req.addrs, strict=True):
            for d in per:
                s.sendto(d, addr)
        t1 = time.perf_counter_ns()
        deadline = time.monotonic() + timeout
        while not g.complete():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not ep.poll(left):
                continue
            while True:
                try:
                    data = recv(RX_BUF, flags)
                except BlockingIOError:
                    break
                g.feed(data, time.perf_counter_ns())
        return g.sample(t0, t1, time.perf_counter_ns())

    def close() -> None:
        ep.close()
        s.close()

    fwd_once.close = close  # type: ignore[attr-defined]
    return fwd_once


def _run_asyncio(
    req: _Request, iters: int, warmup: int, timeout: float, fwd0: int
) -> tuple[list[Sample], float]:
    class Proto(asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.g: _Gather | None = None
            self.waiter: asyncio.Future[None] | None = None

        def datagram_received(self, data: bytes, addr: object) -> None:
            g = self.g
            if g is not None and g.feed(data, time.perf_counter_ns()) is not None:
                if g.complete() and self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(None)

    async def main() -> tuple[list[Sample], float]:
        loop = asyncio.get_running_loop()
        proto = Proto()
        transports = []
        for _ in req.ducks:
            tr, _p = await loop.create_datagram_endpoint(lambda: proto, sock=_socket())
            transports.append(tr)
        out: list[Sample] = []
        cpu0 = 0.0
        try:
            for k in range(warmup + iters):
                if k == warmup:
                    cpu0 = cpu_seconds()
                fwd = fwd0 + k
                req.set_forward(fwd)
                g = _Gather(req, fwd)
                proto.g, proto.waiter = g, loop.create_future()
                t0 = time.perf_counter_ns()
                for tr, per, addr in zip(transports, req.dgrams, req.addrs, strict=True):
                    for d in per:
                        tr.sendto(d, addr)
                t1 = time.perf_counter_ns()
                try:
                    await asyncio.wait_for(proto.waiter, timeout)
                except TimeoutError:
                    pass
                if k >= warmup:
                    out.append(g.sample(t0, t1, time.perf_counter_ns()))
            return out, cpu_seconds() - cpu0
        finally:
            for tr in transports:
                tr.close()

    return asyncio.run(main())


def run_python(
    kind: str,
    ducks: Sequence[tuple[int, int]],
    nbytes: int,
    rows: int,
    *,
    iters: int,
    warmup: int,
    timeout: float = 0.5,
) -> Samples:
    """Run baseline ``kind`` against ``ducks`` ((id, port) on 127.0.0.1): one activation
    of ``nbytes`` bytes (float32, ``rows`` rows) per forward."""
    if kind not in PYTHON_BASELINES:
        raise ValueError(f"unknown baseline {kind!r}: one of {list(PYTHON_BASELINES)}")
    session = random.getrandbits(62) | 1
    announce_layer(ducks, nbytes // rows // 4, session)
    req = _Request(ducks, nbytes, rows, session)
    fwd0 = 1
    if kind == "asyncio":
        samples, cpu = _run_asyncio(req, iters, warmup, timeout, fwd0)
        return Samples(samples, cpu, iters)
    if kind == "new_socket":
        fwd_once: Callable[[int, float], Sample] = lambda f, t: _fwd_new_socket(req, f, t)  # noqa: E731
    else:
        fwd_once = {"cached": _make_cached, "threads": _make_threads, "epoll": _make_epoll}[kind](
            req
        )
    out: list[Sample] = []
    cpu0 = 0.0
    try:
        for k in range(warmup + iters):
            if k == warmup:
                cpu0 = cpu_seconds()
            req.set_forward(fwd0 + k)
            s = fwd_once(fwd0 + k, timeout)
            if k >= warmup:
                out.append(s)
        cpu = cpu_seconds() - cpu0
    finally:
        close = getattr(fwd_once, "close", None)
        if close is not None:
            close()
    return Samples(out, cpu, iters)


def run_floor(
    ducks: Sequence[tuple[int, int]],
    nbytes: int,
    rows: int,
    *,
    iters: int,
    warmup: int,
    gso: bool = False,
    timeout: float = 0.5,
) -> Samples:
    """``duckpipe-floor``: the bare C loop (sendmmsg, or one UDP GSO send per duck)."""
    ports = [p for _, p in ducks]
    if ports != list(range(ports[0], ports[0] + len(ports))):
        raise DuckpipeError("duckpipe-floor needs consecutive duck ports")
    cmd = [
        str(find_binary("duckpipe-floor")),
        "--ducks", str(len(ducks)),
        "--base-port", str(ports[0]),
        "--first-id", str(ducks[0][0]),
        "--bytes", str(nbytes),
        "--rows", str(rows),
        "--iters", str(iters),
        "--warmup", str(warmup),
        "--timeout-ms", str(max(1, int(timeout * 1000))),
        "--session", str(random.getrandbits(62) | 1),
        *(["--gso"] if gso else []),
    ]  # fmt: skip
    budget = 30 + (iters + warmup) * (timeout + 0.05)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, check=False)
    if p.returncode != 0:
        raise DuckpipeError(f"duckpipe-floor failed (exit {p.returncode}): {p.stderr.strip()}")
    samples, cpu_ns = [], 0
    for line in p.stdout.splitlines():
        f = line.split()
        if f[:1] == ["fwd"]:
            samples.append(Sample(*(int(v) for v in f[1:7])))
        elif f[:1] == ["cpu"]:
            cpu_ns = int(f[1])
    return Samples(samples, cpu_ns / 1e9, iters)
