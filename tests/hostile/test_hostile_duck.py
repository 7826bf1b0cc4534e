"""A duck that lies: malformed, misplaced, duplicated, spoofed and stale partials.

Duck 1 of the topology is this test, on a UDP socket: it acknowledges its weights
like a real duck, then answers every forward with a barrage of bad datagrams
before the honest (all-zero) partial. The C dataplane must drop and count every
bad one, never add one into a result, and never crash (this module also runs
against the sanitizer build).
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections import defaultdict
from contextlib import contextmanager

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.client.models import duck_partial
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.ducks import DucksProcess
from duckpipe.launch.topology import Duck, Nic, Topology
from duckpipe.schema.wire import WireFlag, WireOp
from duckpipe.testing import cluster_class_or_skip
from duckpipe.testing.datagrams import decode, encode, payload_max

pytestmark = pytest.mark.dataplane

PAYLOAD = payload_max(1500)


class HostileDuck(threading.Thread):
    """Duck 1: honest about weights, hostile about partials."""

    def __init__(self, port: int, seed: int = 1) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.inputs: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.sent_bad = 0
        self.last_total = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data, host = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            h, payload = decode(data)
            common = dict(
                session=h.session, epoch=h.epoch, forward_id=h.forward_id, duck=1, layer=h.layer
            )
            if h.op in (WireOp.LAYER, WireOp.WEIGHT):
                self.sock.sendto(
                    encode(
                        WireOp.WEIGHT_ACK, tensor=h.tensor, chunk=h.chunk, offset=h.offset, **common
                    ),
                    host,
                )
            elif h.op == WireOp.PING:
                self.sock.sendto(encode(WireOp.PONG, **common), host)
            elif h.op == WireOp.FORWARD:
                got = self.inputs[h.forward_id]
                got[h.chunk] = payload
                if len(got) == h.chunks:
                    self.answer(h, host, common, hostile=True)
            elif h.op == WireOp.NACK:
                self.answer(h, host, common, hostile=False)

    def answer(self, h, host, common, *, hostile: bool) -> None:
        total = h.total if h.op == WireOp.FORWARD else self.last_total
        if not total:
            return
        self.last_total = total
        chunks = max(1, -(-total // PAYLOAD))
        zeros = bytes(PAYLOAD)

        def partial(index: int, **over) -> bytes:
            off = index * PAYLOAD
            n = min(PAYLOAD, total - off)
            fields = dict(
                common, dtype=1, rows=h.rows, chunk=index, chunks=chunks, offset=off, total=total
            )
            fields.update(over)
            return encode(WireOp.PARTIAL, zeros[:n] if n > 0 else b"", **fields)

        if hostile:
            r = self.rng
            bad = [
                partial(0, total=total + 4),  # another message's size
                partial(0, chunks=chunks + 1),  # another chunk count
                partial(0, chunk=chunks + 7),  # chunk past the count
                partial(0, chunks=5000, chunk=4999),  # more chunks than any message may have
                partial(0, offset=2),  # not a whole float
                partial(0, dtype=2),  # float16 for a float32 layer
                partial(0, session=h.session ^ 1),  # another dataplane's session
                partial(0, epoch=h.epoch + 1),  # a stale (or future) epoch
                partial(0, duck=0),  # claims to be duck 0 from duck 1's address
                partial(0, forward_id=h.forward_id + (1 << 16)),  # a forward not in flight
                partial(0, forward_id=r.getrandbits(64)),
                partial(0)[:-3],  # truncated
                b"DUCK" + bytes(r.getrandbits(8) for _ in range(90)),
                _with_op(partial(0), r.choice([0, 9, 200])),  # no such op
            ]
            for dgram in bad:
                self.sock.sendto(dgram, host)
            self.sent_bad += len(bad)
        for c in range(chunks):
            self.sock.sendto(partial(c), host)
        if hostile:  # duplicates of every chunk, with garbage in them: must not be added
            ones = np.ones(PAYLOAD // 4, np.float32).tobytes()
            for c in range(chunks):
                n = min(PAYLOAD, total - c * PAYLOAD)
                dup = encode(
                    WireOp.PARTIAL,
                    ones[:n],
                    **dict(
                        common,
                        dtype=1,
                        rows=h.rows,
                        chunk=c,
                        chunks=chunks,
                        offset=c * PAYLOAD,
                        total=total,
                    ),
                )
                self.sock.sendto(dup, host)
            self.sent_bad += chunks


def _with_op(dgram: bytes, op: int) -> bytes:
    b = bytearray(dgram)
    b[5] = op  # magic (4), version (1), op
    return bytes(b)


class NackFloodDuck(HostileDuck):
    """Duck 1: once its input is complete, asks for chunk 0 again 2,000 times in one NACK,
    twice over, then answers honestly (a zero partial)."""

    REPEAT = 2000

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.flooded: set[int] = set()

    def answer(self, h, host, common, *, hostile: bool) -> None:
        if h.op == WireOp.FORWARD and h.forward_id not in self.flooded:
            self.flooded.add(h.forward_id)
            listing = struct.pack(f"<{self.REPEAT}I", *([0] * self.REPEAT))
            nack = encode(WireOp.NACK, listing, flags=WireFlag.INPUT, **common)
            for _ in range(2):
                self.sock.sendto(nack, host)
        super().answer(h, host, common, hostile=False)


@contextmanager
def _cluster(liar: HostileDuck, port: int, **settings):
    """Duck 0 emulated honestly on port - 1, duck 1 the liar, the dataplane on port - 2."""
    real = DucksProcess(ducks=1, base_port=port - 1, first_id=0).start()
    liar.start()
    topo = Topology(
        default_timeout_ms=3000,
        nics=[
            Nic(
                name="lo",
                host_ip="127.0.0.1",
                host_port=port - 2,
                ducks=[
                    Duck(id=0, ip="127.0.0.1", port=port - 1),
                    Duck(id=1, ip="127.0.0.1", port=port),
                ],
            )
        ],
        **settings,
    )
    dp = DataplaneProcess(topo).start()
    try:
        yield dp, liar
    finally:
        code = dp.stop()
        out = dp.output()
        dp.close()
        liar.stop.set()
        liar.join(2)
        liar.sock.close()
        real.stop()
        assert code == 0 and "runtime error" not in out and "Sanitizer" not in out, out[-3000:]


@pytest.fixture
def hostile_cluster():
    cluster_class_or_skip()
    base = free_udp_ports(3)
    with _cluster(HostileDuck(base + 2), base + 2) as pair:
        yield pair


@pytest.fixture
def nack_flood_cluster():
    cluster_class_or_skip()
    base = free_udp_ports(3)
    # a NACK interval far longer than the flood takes: both NACKs fall in one interval
    with _cluster(NackFloodDuck(base + 2), base + 2, nack_us=200_000) as pair:
        yield pair


def test_lies_are_dropped_counted_and_never_summed(hostile_cluster):
    dp, liar = hostile_cluster
    mlp = GeluMlp.random(512, 64, seed=3, b_down=False)  # 2 KiB rows: several chunks
    rng = np.random.default_rng(0)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp, ducks=[0, 1])
        for _ in range(10):
            x = rng.standard_normal((3, 512)).astype(np.float32)
            y = c.forward(1, x, timeout=10)
            # duck 0's shard only: duck 1's honest partial is all zeros
            want = duck_partial(mlp.kind, x, list(mlp.shard(0, 32)))
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        n = c.stats().counters
    assert liar.sent_bad > 100
    assert n["forwards_ok"] == 10 and n["timeouts"] == 0
    assert n["rx_malformed"] >= 10 * 8
    assert n["rx_bad_session"] >= 10 and n["rx_stale_epoch"] >= 10
    assert n["rx_unknown_sender"] >= 10
    # per forward: two for forwards not in flight, five copies of chunks already in
    # (late, when the forward completed before they came); the last forward's may
    # still be on their way when the counters are read
    assert n["rx_late"] + n["rx_duplicates"] >= 9 * (2 + 5)


def test_a_nack_flood_resends_each_chunk_once_per_interval(nack_flood_cluster):
    dp, liar = nack_flood_cluster
    mlp = GeluMlp.random(512, 64, seed=4, b_down=False)
    rng = np.random.default_rng(1)
    forwards = 5
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp, ducks=[0, 1])
        for _ in range(forwards):
            x = rng.standard_normal((3, 512)).astype(np.float32)
            want = duck_partial(mlp.kind, x, list(mlp.shard(0, 32)))
            np.testing.assert_allclose(c.forward(1, x, timeout=10), want, rtol=1e-4, atol=1e-5)
        n = c.stats().counters
    assert len(liar.flooded) == forwards
    assert n["nacks_received"] >= 2 * forwards
    # once per forward (the first NACK); never 4,000 times
    assert forwards <= n["retransmits"] <= 2 * forwards, n["retransmits"]
    assert n["nack_resends_suppressed"] >= forwards * (2 * NackFloodDuck.REPEAT - 2)
