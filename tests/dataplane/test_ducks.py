"""The duck emulator, duckpipe-ducks, spoken to over loopback UDP as the dataplane would."""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
from free_ducks import start_ducks

from duckpipe._abi import ffi
from duckpipe.client.models import (
    GeluMlp,
    SwiGluMlp,
    dtype_code,
    duck_partial,
    shard_bounds,
    shard_sizes,
)
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.ducks import (
    DucksProcess,
    add_parser,
    command_line,
    format_counters,
    parse_counters,
)
from duckpipe.schema.abi import DType, MlpKind
from duckpipe.schema.wire import CONSTANTS, WireFlag, WireOp
from duckpipe.testing.datagrams import decode, encode, layer_payload, payload_max

# the duck emulator (duckpipe-ducks) in nearly every test; its parsing helpers ride along
pytestmark = pytest.mark.dataplane

try:
    BINARY = find_binary("duckpipe-ducks")
except DuckpipeError as e:
    pytest.skip(str(e), allow_module_level=True)  # says how to build it

HDR = ffi.sizeof("struct dp_wire_header")
PAYLOAD = payload_max(1500)  # the emulator's default MTU
ANY_DUCK = CONSTANTS["WIRE_ANY_DUCK"]
LAYER_TENSOR = CONSTANTS["WIRE_LAYER_TENSOR"]
RECV_TIMEOUT = 2.0  # an expected reply; every receive is bounded
QUIET = 0.3  # how long "nothing comes back" is watched


# --------------------------------------------------------------------------- wire


def chunks_of(raw: bytes, size: int = PAYLOAD) -> list[tuple[int, bytes]]:
    return [(off, raw[off : off + size]) for off in range(0, max(len(raw), 1), size)]


class Host:
    """The dataplane's side of the protocol, on one UDP socket."""

    def __init__(self, ducks: DucksProcess, epoch: int = 7) -> None:
        self.addr = {duck_id: (ip, port) for duck_id, ip, port in ducks.addresses}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.session = random.getrandbits(63) | 1
        self.epoch = epoch

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, to: int, data: bytes) -> None:
        self.sock.sendto(data, self.addr[to])

    def send(self, to: int, op: int, payload: bytes = b"", /, **fields: int) -> None:
        """One datagram to duck ``to``, addressed to it unless ``duck=`` says otherwise."""
        fields.setdefault("duck", to)
        fields.setdefault("session", self.session)
        fields.setdefault("epoch", self.epoch)
        self.send_raw(to, encode(op, payload, **fields))

    def recv(self, timeout: float = RECV_TIMEOUT):
        self.sock.settimeout(timeout)
        data, _ = self.sock.recvfrom(65536)
        h, payload = decode(data)
        assert h.session == self.session and h.epoch == self.epoch, "session/epoch not echoed"
        return h, payload

    def recv_all(self, quiet: float = QUIET) -> list:
        out = []
        while True:
            try:
                out.append(self.recv(quiet))
            except TimeoutError:
                return out

    def expect_nothing(self, quiet: float = QUIET) -> None:
        got = self.recv_all(quiet)
        assert not got, f"expected silence, got ops {[h.op for h, _ in got]}"

    def announce(self, duck: int, layer: int, kind: int, dtype, hidden: int, ffn: int) -> None:
        payload = layer_payload(kind, dtype_code(dtype), hidden, ffn)
        self.send(duck, WireOp.LAYER, payload, layer=layer, chunks=1)
        h, _ = self.recv()
        assert (h.op, h.duck, h.layer, h.tensor) == (WireOp.WEIGHT_ACK, duck, layer, LAYER_TENSOR)
        assert h.length == 0

    def load(
        self, duck: int, layer: int, kind: int, tensors: Sequence[np.ndarray], wire_dtype=None
    ) -> None:
        """LAYER, then every tensor in WEIGHT chunks, each acknowledged."""
        dtype = tensors[0].dtype
        hidden, ffn = tensors[0].shape
        self.announce(duck, layer, kind, dtype, hidden, ffn)
        wire = np.dtype(wire_dtype or dtype)
        pending = set()
        for t, arr in enumerate(tensors):
            raw = np.ascontiguousarray(arr, dtype=wire).tobytes()
            pieces = chunks_of(raw)
            for i, (off, piece) in enumerate(pieces):
                self.send(
                    duck,
                    WireOp.WEIGHT,
                    piece,
                    layer=layer,
                    tensor=t,
                    dtype=dtype_code(wire),
                    chunk=i,
                    chunks=len(pieces),
                    offset=off,
                    total=len(raw),
                )
                pending.add((t, i, off))
        while pending:
            h, _ = self.recv()
            assert (h.op, h.duck, h.layer, h.length) == (WireOp.WEIGHT_ACK, duck, layer, 0)
            pending.discard((h.tensor, h.chunk, h.offset))

    def forward_chunks(self, fwd: int, layer: int, x: np.ndarray) -> list[dict]:
        raw = x.tobytes()
        pieces = chunks_of(raw)
        return [
            {
                "payload": piece,
                "forward_id": fwd,
                "layer": layer,
                "dtype": dtype_code(x.dtype),
                "rows": x.shape[0],
                "chunk": i,
                "chunks": len(pieces),
                "offset": off,
                "total": len(raw),
            }
            for i, (off, piece) in enumerate(pieces)
        ]

    def forward(
        self,
        ducks: Sequence[int],
        fwd: int,
        layer: int,
        x: np.ndarray,
        *,
        skip: Sequence[int] = (),
        addressee: int | None = None,
    ) -> None:
        for c in self.forward_chunks(fwd, layer, x):
            if c["chunk"] in skip:
                continue
            payload = c.pop("payload")
            for d in ducks:
                who = d if addressee is None else addressee
                self.send(d, WireOp.FORWARD, payload, duck=who, **c)

    def partials(
        self, ducks: Sequence[int], fwd: int, timeout: float = 5.0
    ) -> dict[int, tuple[np.ndarray, list]]:
        """Every duck's whole partial for forward ``fwd``, and its chunks' headers."""
        got: dict[int, dict[int, tuple]] = {d: {} for d in ducks}
        deadline = time.monotonic() + timeout
        while any(not v or len(v) < next(iter(v.values()))[0].chunks for v in got.values()):
            h, payload = self.recv(max(0.01, deadline - time.monotonic()))
            assert h.op == WireOp.PARTIAL, f"op {h.op} flags {h.flags} from duck {h.duck}"
            assert h.forward_id == fwd and h.duck in got
            got[h.duck][h.chunk] = (h, payload)
        out = {}
        for d, chunks in got.items():
            heads = [chunks[i][0] for i in sorted(chunks)]
            raw = b"".join(chunks[i][1] for i in sorted(chunks))
            h0 = heads[0]
            assert len(raw) == h0.total
            dt = np.float32 if h0.dtype == dtype_code(np.float32) else np.float16
            out[d] = (np.frombuffer(raw, dtype=dt).reshape(h0.rows, -1), heads)
        return out


# ----------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ducks4() -> Iterator[DucksProcess]:
    """Four ducks computing real shards, shared by the tests that only need that."""
    proc = start_ducks(4)
    yield proc
    assert proc.stop() == 0, proc.output()


@pytest.fixture
def host(ducks4) -> Iterator[Host]:
    h = Host(ducks4)
    yield h
    h.close()


@pytest.fixture
def make_ducks() -> Iterator[Callable[..., DucksProcess]]:
    """Private emulators for fault knobs; stopped after the test."""
    procs: list[DucksProcess] = []

    def make(ducks: int = 1, args: Sequence[str] = (), first_id: int = 0) -> DucksProcess:
        procs.append(start_ducks(ducks, args, first_id))
        return procs[-1]

    yield make
    for p in procs:
        p.stop()


_ids = iter(range(1000, 1 << 30))


def new_id() -> int:
    """Layer and forward ids unique across the module's shared emulator."""
    return next(_ids)


def load_sharded(host: Host, mlp, layer: int, ducks: Sequence[int], wire_dtype=None) -> list:
    shards = [mlp.shard(lo, hi) for lo, hi in shard_bounds(shard_sizes(mlp.ffn, len(ducks)))]
    for d, shard in zip(ducks, shards, strict=True):
        host.load(d, layer, mlp.kind, shard, wire_dtype)
    return shards


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    # Relative to the output's scale too: sums of products can cancel to ~0.
    np.testing.assert_allclose(
        got.astype(np.float32), want, rtol=rtol, atol=rtol * float(np.abs(want).max())
    )


# -------------------------------------------------------------------------- tests


def test_ready_line_names_ducks_ports_and_pid(ducks4):
    base = ducks4.base_port
    assert ducks4.ready_line == (
        f"duckpipe-ducks: 4 ducks, ids 0..3, on 127.0.0.1:{base}..{base + 3} (pid {ducks4.pid})"
    )
    assert ducks4.addresses == [(i, "127.0.0.1", base + i) for i in range(4)]


def test_ping_gets_a_pong_from_each_duck(host):
    for d in range(4):
        host.send(d, WireOp.PING, forward_id=99)
        h, _ = host.recv()
        assert (h.op, h.duck, h.forward_id, h.length) == (WireOp.PONG, d, 99, 0)


@pytest.mark.parametrize(
    ("mlp", "rows"),
    [(GeluMlp.random(128, 512, seed=1), 8), (SwiGluMlp.random(96, 384, seed=2), 20)],
    ids=["gelu", "swiglu"],
)
def test_shards_compute_the_reference_partial(host, mlp, rows):
    layer, fwd, ducks = new_id(), new_id(), [0, 1, 2, 3]
    shards = load_sharded(host, mlp, layer, ducks)
    x = np.random.default_rng(3).standard_normal((rows, mlp.hidden)).astype(np.float32)
    host.forward(ducks, fwd, layer, x, addressee=ANY_DUCK)
    parts = host.partials(ducks, fwd)
    total = np.zeros((rows, mlp.hidden), np.float32)
    for d, shard in zip(ducks, shards, strict=True):
        got, heads = parts[d]
        assert_close(got, duck_partial(mlp.kind, x, list(shard)), 1e-4)
        total += got
        for i, h in enumerate(heads):
            assert (h.layer, h.rows, h.dtype, h.chunk) == (layer, rows, dtype_code(x.dtype), i)
            assert h.offset == i * PAYLOAD and h.compute_ns > 0
    if mlp.b_down is not None:
        total += mlp.b_down
    assert_close(total, mlp.reference(x), 1e-4)


def test_float16_weights_and_activations(host):
    mlp = GeluMlp.random(64, 256, dtype=np.float16, seed=4)
    layer, fwd, ducks = new_id(), new_id(), [0, 1]
    shards = load_sharded(host, mlp, layer, ducks)
    x = np.random.default_rng(5).standard_normal((6, 64)).astype(np.float16)
    host.forward(ducks, fwd, layer, x)
    parts = host.partials(ducks, fwd)
    for d, shard in zip(ducks, shards, strict=True):
        got, heads = parts[d]
        assert got.dtype == np.float16 and heads[0].total == x.nbytes
        assert_close(got, duck_partial(mlp.kind, x, list(shard)), 2e-3)


def test_float16_weights_load_into_a_float32_layer(host):
    mlp = SwiGluMlp.random(32, 64, seed=6)
    layer, fwd = new_id(), new_id()
    (shard,) = load_sharded(host, mlp, layer, [2], wire_dtype=np.float16)
    x = np.random.default_rng(7).standard_normal((3, 32)).astype(np.float32)
    host.forward([2], fwd, layer, x)
    got, _ = host.partials([2], fwd)[2]
    rounded = [t.astype(np.float16).astype(np.float32) for t in shard]
    assert_close(got, duck_partial(mlp.kind, x, rounded), 1e-4)


def test_repeated_weight_chunk_and_layer_are_acked_again_and_harmless(host):
    mlp = GeluMlp.random(32, 32, seed=8)
    layer, ducks = new_id(), [1]
    (shard,) = load_sharded(host, mlp, layer, ducks)
    raw = shard[1].tobytes()  # b_up: one chunk
    for _ in range(2):
        host.send(1, WireOp.WEIGHT, raw, layer=layer, tensor=1, dtype=1, chunks=1, total=len(raw))
        h, _ = host.recv()
        assert (h.op, h.tensor, h.chunk, h.offset) == (WireOp.WEIGHT_ACK, 1, 0, 0)
    host.announce(1, layer, mlp.kind, np.float32, 32, 32)  # same shape: weights stay
    x = np.ones((2, 32), np.float32)
    fwd = new_id()
    host.forward(ducks, fwd, layer, x)
    assert_close(host.partials(ducks, fwd)[1][0], duck_partial(mlp.kind, x, list(shard)), 1e-4)


def _one_forward(host: Host, duck: int = 0, rows: int = 12, hidden: int = 128):
    """A GELU layer on one duck and a forward whose partial spans several datagrams."""
    mlp = GeluMlp.random(hidden, 64, seed=9)
    layer, fwd = new_id(), new_id()
    (shard,) = load_sharded(host, mlp, layer, [duck])
    x = np.random.default_rng(10).standard_normal((rows, hidden)).astype(np.float32)
    return mlp, shard, layer, fwd, x


def test_nack_with_empty_list_resends_the_whole_partial(host):
    _, _, layer, fwd, x = _one_forward(host)
    host.forward([0], fwd, layer, x)
    first, heads = host.partials([0], fwd)[0]
    assert len(heads) == 5  # 12 x 128 float32 = 6144 bytes
    host.send(0, WireOp.NACK, forward_id=fwd, layer=layer)
    again, heads2 = host.partials([0], fwd)[0]
    assert np.array_equal(first, again) and len(heads2) == 5
    assert heads2[0].compute_ns == heads[0].compute_ns


def test_nack_with_a_list_resends_those_chunks(host):
    _, _, layer, fwd, x = _one_forward(host)
    host.forward([0], fwd, layer, x)
    host.partials([0], fwd)
    host.send(0, WireOp.NACK, np.array([4, 1], "<u4").tobytes(), forward_id=fwd, layer=layer)
    got = host.recv_all()
    assert [(h.op, h.chunk) for h, _ in got] == [(WireOp.PARTIAL, 4), (WireOp.PARTIAL, 1)]
    assert len(got[0][1]) == 6144 - 4 * PAYLOAD


def test_nack_for_an_input_missing_a_chunk_names_that_chunk(host):
    mlp, shard, layer, fwd, x = _one_forward(host)
    host.forward([0], fwd, layer, x, skip=[2])
    host.expect_nothing()
    host.send(0, WireOp.NACK, forward_id=fwd, layer=layer)
    h, payload = host.recv()
    assert (h.op, h.flags, h.forward_id) == (WireOp.NACK, WireFlag.INPUT, fwd)
    assert np.frombuffer(payload, "<u4").tolist() == [2]
    assert h.chunks == 5 and h.total == x.nbytes
    chunk2 = host.forward_chunks(fwd, layer, x)[2]
    host.send(0, WireOp.FORWARD, chunk2.pop("payload"), **chunk2)
    assert_close(host.partials([0], fwd)[0][0], duck_partial(mlp.kind, x, list(shard)), 1e-4)


def test_nack_for_an_unknown_forward_asks_for_everything(host):
    host.send(3, WireOp.NACK, forward_id=new_id())
    h, payload = host.recv()
    assert (h.op, h.flags, h.duck, payload) == (WireOp.NACK, WireFlag.INPUT, 3, b"")


def test_repeated_forward_chunks_are_not_answered_twice(host):
    _, _, layer, fwd, x = _one_forward(host)
    host.forward([0], fwd, layer, x)
    host.partials([0], fwd)
    host.forward([0], fwd, layer, x)
    host.expect_nothing()


def test_forward_for_an_unknown_layer_gets_no_layer(host):
    fwd = new_id()
    host.forward([1], fwd, new_id(), np.ones((2, 16), np.float32))
    h, _ = host.recv()
    assert (h.op, h.flags, h.duck, h.forward_id) == (WireOp.NACK, WireFlag.NO_LAYER, 1, fwd)


def test_forward_whose_shape_disagrees_with_the_layer_gets_no_layer(host):
    _, _, layer, fwd, _ = _one_forward(host, duck=1)
    host.forward([1], fwd, layer, np.ones((3, 100), np.float32))  # the layer's hidden is 128
    h, _ = host.recv()
    assert (h.op, h.flags, h.forward_id) == (WireOp.NACK, WireFlag.NO_LAYER, fwd)
    host.forward([1], new_id(), layer, np.ones((3, 128), np.float16))  # layer is float32
    h, _ = host.recv()
    assert (h.op, h.flags) == (WireOp.NACK, WireFlag.NO_LAYER)


def test_weight_for_an_unknown_layer_gets_no_layer(host):
    layer = new_id()
    host.send(2, WireOp.WEIGHT, b"\0" * 8, layer=layer, tensor=0, dtype=1, chunks=1, total=8)
    h, _ = host.recv()
    assert (h.op, h.flags, h.layer) == (WireOp.NACK, WireFlag.NO_LAYER, layer)


def test_weight_whose_size_disagrees_with_the_tensor_is_dropped(host):
    layer = new_id()
    host.announce(2, layer, MlpKind.GELU, np.float32, 8, 4)
    host.send(2, WireOp.WEIGHT, b"\0" * 16, layer=layer, tensor=1, dtype=1, chunks=1, total=20)
    host.send(2, WireOp.WEIGHT, b"\0" * 16, layer=layer, tensor=3, dtype=1, chunks=1, total=16)
    host.expect_nothing()


def test_nonsense_layer_shapes_are_not_acked(host):
    layer = new_id()
    for kind, hidden, ffn, dtype in [
        (MlpKind.GELU, 0, 16, 1),
        (MlpKind.GELU, 16, 0, 1),
        (9, 16, 16, 1),
        (MlpKind.SWIGLU, 16, 16, 4),  # 3 is BF16
        (MlpKind.SWIGLU, 1 << 20, 1 << 20, 1),
        (MlpKind.GELU, 0xFFFFFFFF, 0xFFFFFFFF, 2),
    ]:
        host.send(0, WireOp.LAYER, layer_payload(kind, dtype, hidden, ffn), layer=layer)
    host.expect_nothing()
    host.announce(0, layer, MlpKind.GELU, np.float32, 16, 16)


def test_float8_names_weights_only_and_an_fp8_layer_holds_its_chunks_to_their_bytes(host):
    f8 = int(DType.F8E4M3)
    layer = new_id()
    # FP8 is for SwiGLU weights: not a GELU layer's, not any layer's activations
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.GELU, 1, 8, 8, weight_dtype=f8), layer=layer)
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.SWIGLU, 1, 8, 8, weight_dtype=2), layer=layer)
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.SWIGLU, f8, 8, 8), layer=layer)
    host.expect_nothing()
    # an FP8 SwiGLU layer of hidden 8, ffn 8: each tensor 64 e4m3 bytes and one scale
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.SWIGLU, 1, 8, 8, weight_dtype=f8), layer=layer)
    h, _ = host.recv()
    assert (h.op, h.tensor) == (WireOp.WEIGHT_ACK, LAYER_TENSOR)
    bad = [(66, 0, 4), (68, 64, 8), (68, 0, 69)]  # (total, offset, length): wrong or past it
    for total, off, n in bad:
        host.send(
            0, WireOp.WEIGHT, b"\1" * n, layer=layer, tensor=0, chunks=1, offset=off, total=total
        )
    host.expect_nothing()
    # a chunk across the weights and the scale (offset 62: 2 weights, 2 of the scale's bytes)
    host.send(0, WireOp.WEIGHT, b"\0" * 4, layer=layer, tensor=0, chunks=1, offset=62, total=68)
    h, _ = host.recv()
    assert (h.op, h.tensor, h.offset) == (WireOp.WEIGHT_ACK, 0, 62)
    # a forward that names FP8 as its activations' dtype is dropped, not read as 1-byte floats
    host.send(0, WireOp.FORWARD, b"\0" * 8, layer=layer, dtype=f8, rows=1, chunks=1, total=8)
    host.expect_nothing()


def test_an_fp8_layer_is_dequantized_as_its_last_chunk_lands_and_again_after_a_resend(
    make_ducks,
):
    # the chunk that completes an FP8 layer is dequantized before its ack, so the load ends
    # with the weights ready (the first forward after a load of DeepSeek-V3's shape would
    # otherwise spend its deadline on it); a chunk that comes again later leaves the layer
    # stale, dequantized once the chunks have stopped coming for a while
    ducks = make_ducks(1)
    host = Host(ducks)
    f8, layer = int(DType.F8E4M3), new_id()
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.SWIGLU, 1, 8, 8, weight_dtype=f8), layer=layer)
    assert host.recv()[0].op == WireOp.WEIGHT_ACK
    for t in range(3):  # each tensor: 64 e4m3 bytes, then its one float32 scale
        for off, n in ((0, 40), (40, 28)):
            host.send(0, WireOp.WEIGHT, b"\x38" * n, layer=layer, tensor=t, chunks=2,
                      chunk=off // 40, offset=off, total=68)  # fmt: skip
            assert host.recv()[0].offset == off
    host.send(
        0,
        WireOp.WEIGHT,
        b"\x38" * 28,
        layer=layer,
        tensor=1,
        chunks=2,
        chunk=1,
        offset=40,
        total=68,
    )  # fmt: skip  (a resend)
    assert host.recv()[0].offset == 40
    time.sleep(0.6)  # past the duck's quiet time (250 ms)
    host.close()
    assert ducks.stop() == 0
    c = ducks.counters()
    assert (c["fp8_dequants_at_load"], c["fp8_dequants_later"]) == (1, 1), c


def test_forward_addressed_to_another_duck_is_ignored(host):
    _, _, layer, fwd, x = _one_forward(host, rows=2)
    host.forward([0], fwd, layer, x, addressee=1)
    host.expect_nothing()
    host.forward([0], fwd, layer, x, addressee=ANY_DUCK)
    assert host.partials([0], fwd)[0][0].shape == (2, 128)


def test_malformed_datagrams_are_counted_and_ignored(make_ducks):
    ducks = make_ducks(1)
    host = Host(ducks)
    good = encode(WireOp.PING, session=host.session, epoch=host.epoch)
    bad = [
        b"",
        b"x",
        good[: HDR - 1],
        b"KCUD" + good[4:],  # magic
        good[:4] + b"\x02" + good[5:],  # version
        good[:5] + b"\x00" + good[6:],  # op 0
        good[:5] + b"\x63" + good[6:],  # op 99
        good + b"extra",  # length says 0
        encode(WireOp.FORWARD, b"\0" * 8, chunk=3, chunks=3, total=8),
        encode(WireOp.FORWARD, b"\0" * 8, chunks=1, offset=4, total=8),
        encode(WireOp.NACK, b"\0" * 6),
        encode(WireOp.LAYER, b"\0" * 12),
        os.urandom(1500),
    ]
    for data in bad:
        host.send_raw(0, data)
    host.expect_nothing()
    host.send_raw(0, good)
    assert host.recv()[0].op == WireOp.PONG
    host.close()
    assert ducks.stop() == 0
    c = ducks.counters()
    assert c["dropped_malformed"] == len(bad) and c["pongs"] == 1, c
    assert c["malformed_short"] == 3 and c["malformed_magic"] >= 1 and c["malformed_op"] == 2


def test_echo_mode_returns_x_times_id_plus_one(make_ducks):
    ducks = make_ducks(2, ["--compute", "echo"], first_id=5)
    host = Host(ducks)
    x = np.arange(2 * 1000, dtype=np.float32).reshape(2, 1000) / 7
    for d in (5, 6):
        host.announce(d, 1, MlpKind.SWIGLU, np.float32, 1000, 4)  # shapes only, no weights
    host.forward([5, 6], 1, 1, x)
    parts = host.partials([5, 6], 1)
    for d in (5, 6):
        np.testing.assert_array_equal(parts[d][0], x * (d + 1))
    host.close()


@pytest.mark.parametrize(
    "args", [[], ["--no-gso"], ["--mtu", "9000"]], ids=["gso", "sendmmsg", "mtu9000"]
)
def test_multi_datagram_partials_arrive_whole(make_ducks, args):
    ducks = make_ducks(1, ["--compute", "echo", *args])
    host = Host(ducks)
    x = np.random.default_rng(11).standard_normal((40, 1000)).astype(np.float16)
    host.announce(0, 3, MlpKind.GELU, np.float16, 1000, 8)
    host.forward([0], 1, 3, x)
    got, heads = host.partials([0], 1)[0]
    np.testing.assert_array_equal(got, x)
    payload = payload_max(int(args[1])) if "--mtu" in args else PAYLOAD
    assert len(heads) == -(-x.nbytes // payload) and heads[1].offset == payload
    host.close()
    assert ducks.stop() == 0
    c = ducks.counters()
    assert c["partials_sent"] == len(heads)
    assert (c["gso_sends"] > 0) == ("--no-gso" not in args), c


@pytest.mark.parametrize("args", [[], ["--no-gro"]], ids=["gro", "no-gro"])
def test_an_activation_sent_as_one_gso_send_is_cut_back_into_its_chunks(make_ducks, args):
    # the dataplane sends a duck's chunks as one UDP GSO send; with UDP GRO the duck's
    # socket takes it whole and the emulator cuts it by the cmsg's size (dp_gro.h)
    ducks = make_ducks(1, ["--compute", "echo", *args])
    host = Host(ducks)
    x = np.random.default_rng(12).standard_normal((12, 1000)).astype(np.float16)  # 17 chunks
    host.announce(0, 3, MlpKind.GELU, np.float16, 1000, 8)
    datagrams = [
        encode(WireOp.FORWARD, c.pop("payload"), duck=0, session=host.session,
               epoch=host.epoch, **c)
        for c in host.forward_chunks(1, 3, x)
    ]  # fmt: skip
    seg = len(datagrams[0])
    assert len(datagrams) > 2 and all(len(d) == seg for d in datagrams[:-1])
    udp_segment = 103  # linux/udp.h: UDP_SEGMENT
    host.sock.setsockopt(socket.SOL_UDP, udp_segment, seg)
    host.sock.sendto(b"".join(datagrams), host.addr[0])
    host.sock.setsockopt(socket.SOL_UDP, udp_segment, 0)
    got, _ = host.partials([0], 1)[0]
    np.testing.assert_array_equal(got, x)
    host.close()
    assert ducks.stop() == 0
    c = ducks.counters()
    assert c["dropped_malformed"] == 0, c
    assert (c["gro_receives"] > 0) == ("--no-gro" not in args), c


def test_drop_one_answers_nothing(make_ducks):
    ducks = make_ducks(1, ["--drop", "1.0"])
    host = Host(ducks)
    host.send(0, WireOp.PING)
    host.send(0, WireOp.LAYER, layer_payload(MlpKind.GELU, 1, 8, 8), layer=1)
    host.expect_nothing()
    host.close()
    assert ducks.stop() == 0
    assert ducks.counters()["dropped_injected"] == 2


def test_a_host_recovers_a_forward_from_a_lossy_duck_with_nacks(make_ducks):
    ducks = make_ducks(1, ["--compute", "echo", "--drop", "0.2", "--seed", "3"])
    host = Host(ducks)
    for _ in range(50):  # LAYER until acked
        host.send(0, WireOp.LAYER, layer_payload(MlpKind.GELU, 1, 500, 8), layer=1)
        if any(h.op == WireOp.WEIGHT_ACK for h, _ in host.recv_all(0.05)):
            break
    x = np.random.default_rng(12).standard_normal((20, 500)).astype(np.float32)
    chunks = host.forward_chunks(1, 1, x)
    host.forward([0], 1, 1, x)
    have: dict[int, bytes] = {}
    nchunks = None
    deadline = time.monotonic() + 10
    while (nchunks is None or len(have) < nchunks) and time.monotonic() < deadline:
        for h, payload in host.recv_all(0.05):
            if h.op == WireOp.PARTIAL:
                have[h.chunk], nchunks = payload, h.chunks
            elif h.op == WireOp.NACK and h.flags & WireFlag.INPUT:
                missing = np.frombuffer(payload, "<u4").tolist() or range(len(chunks))
                for i in missing:
                    c = dict(chunks[i])
                    host.send(0, WireOp.FORWARD, c.pop("payload"), **c)
        if nchunks is None or len(have) < nchunks:
            missing = [] if nchunks is None else [i for i in range(nchunks) if i not in have]
            host.send(0, WireOp.NACK, np.array(missing, "<u4").tobytes(), forward_id=1)
    assert nchunks is not None and len(have) == nchunks, "the forward never completed"
    got = np.frombuffer(b"".join(have[i] for i in range(nchunks)), np.float32)
    np.testing.assert_array_equal(got.reshape(x.shape), x)
    host.close()
    assert ducks.stop() == 0
    assert ducks.counters()["dropped_injected"] > 0


def test_stop_after_one_forward_the_duck_goes_quiet(make_ducks):
    ducks = make_ducks(1, ["--compute", "echo", "--stop-after", "1"])
    host = Host(ducks)
    host.announce(0, 1, MlpKind.GELU, np.float32, 16, 4)
    x = np.ones((1, 16), np.float32)
    host.forward([0], 1, 1, x)
    host.partials([0], 1)
    host.forward([0], 2, 1, x)
    host.send(0, WireOp.NACK, forward_id=1)
    host.expect_nothing()
    host.send(0, WireOp.PING)
    assert host.recv()[0].op == WireOp.PONG  # alive, just not answering forwards
    host.close()


def test_restart_after_one_forward_forgets_the_layers(make_ducks):
    ducks = make_ducks(1, ["--compute", "echo", "--restart-after", "1"])
    host = Host(ducks)
    host.announce(0, 1, MlpKind.GELU, np.float32, 16, 4)
    x = np.ones((1, 16), np.float32)
    host.forward([0], 1, 1, x)
    host.partials([0], 1)
    host.forward([0], 2, 1, x)
    h, _ = host.recv()
    assert (h.op, h.flags, h.forward_id) == (WireOp.NACK, WireFlag.NO_LAYER, 2)
    host.announce(0, 1, MlpKind.GELU, np.float32, 16, 4)  # reload, and it computes again
    host.forward([0], 3, 1, x)
    np.testing.assert_array_equal(host.partials([0], 3)[0][0], x)
    host.close()


def test_delay_holds_replies_without_blocking_the_duck(make_ducks):
    ducks = make_ducks(2, ["--delay-us", "150000"])
    host = Host(ducks)
    t0 = time.monotonic()
    for i in range(10):
        host.send(i % 2, WireOp.PING, forward_id=i)
    got = [host.recv()[0] for _ in range(10)]
    elapsed = time.monotonic() - t0
    assert sorted(h.forward_id for h in got) == list(range(10))
    assert 0.14 <= elapsed < 0.6, elapsed  # once 150 ms, not ten times
    host.close()


def test_bind_failure_on_a_busy_port_exits_with_a_clear_message():
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    try:
        with pytest.raises(DuckpipeError, match=rf"127\.0\.0\.1:{port}.*port in use\?"):
            DucksProcess(ducks=2, base_port=port - 1).start()
        r = subprocess.run(
            [str(BINARY), "--ducks", "1", "--base-port", str(port)],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert r.returncode == 1 and r.stdout == ""
        assert f"127.0.0.1:{port}" in r.stderr and "port in use?" in r.stderr
    finally:
        busy.close()


def test_bad_options_are_refused():
    for args in (["--ducks", "33"], ["--drop", "2"], ["--compute", "fast"], ["--bind", "a,b"]):
        r = subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "duckpipe-ducks: --" in r.stderr, (args, r.stderr)


def test_sigint_prints_counters_and_exits_zero(make_ducks):
    ducks = make_ducks(1)
    host = Host(ducks)
    host.send(0, WireOp.PING)
    host.recv()
    host.close()
    ducks.proc.send_signal(signal.SIGINT)
    assert ducks.proc.wait(5) == 0
    c = ducks.counters()
    assert c["rx"] == 1 and c["tx"] == 1 and c["pongs"] == 1


def test_parse_counters_takes_the_key_value_line():
    text = "duckpipe-ducks: UDP GSO refused\nrx=3 tx=4 dropped_malformed=0\n"
    assert parse_counters(text) == {"rx": 3, "tx": 4, "dropped_malformed": 0}
    assert parse_counters("nothing here\n") == {}


def test_cli_subcommand_passes_options_through():
    parser = argparse.ArgumentParser(prog="duckpipe")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ducks", "--ducks", "3", "--drop", "0.5", "--no-gso", "-v"])
    assert command_line(args) == [
        str(BINARY),
        "--ducks",
        "3",
        "--drop",
        "0.5",
        "--no-gso",
        "--verbose",
    ]


def test_cli_subcommand_execs_the_emulator():
    port = random.randrange(40000, 60000)
    code = (
        "import argparse, sys; from duckpipe.launch.ducks import add_parser; "
        "p = argparse.ArgumentParser(); add_parser(p.add_subparsers()); "
        "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
    )
    cmd = [sys.executable, "-c", code, "ducks", "--ducks", "1", "--base-port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "port in use?" in (proc.stderr.read() if not line else ""):
            pytest.skip(f"port {port} happened to be taken")
        assert line.startswith("duckpipe-ducks: 1 ducks, ids 0..0, on 127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=5)
        assert proc.returncode == 0 and "duckpipe-ducks counters:" in err
        assert re.search(r"^rx +0 ", err, re.M), err  # a table, not name=value pairs
        assert "rx=0" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_counters_print_as_an_aligned_table():
    counters = {f"counter_{i}": i * 1000 for i in range(40)}
    table = format_counters(counters, width=80)
    lines = table.splitlines()
    assert 10 <= len(lines) <= 20  # several columns, not one line of 40 and not 40 lines
    assert all(len(line) <= 80 for line in lines)
    assert "=" not in table
    # columns line up: every cell of a column starts at the same offset
    starts = {line.index("counter_", 1) for line in lines if line.count("counter_") > 1}
    assert len(starts) == 1, table


def test_more_ducks_than_one_emulator_runs_says_how_to_run_several():
    r = subprocess.run(
        [sys.executable, "-m", "duckpipe", "ducks", "--ducks", "500", "--base-port", "40000"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert "at most 32 ducks" in r.stderr
    assert "duckpipe ducks --ducks 32 --first-id 32 --base-port 40032" in r.stderr
    assert "--ducks 20 --first-id 480 --base-port 40480" in r.stderr  # the last one
    assert "at most 256 ducks" in r.stderr  # 500 is more than one dataplane serves
    r = subprocess.run(
        [sys.executable, "-m", "duckpipe", "ducks", "--ducks", "40", "--base-port", "40000"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "--ducks 8 --first-id 32 --base-port 40032" in r.stderr
    assert "duckpipe dataplane --ducks 40" in r.stderr
