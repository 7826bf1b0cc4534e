"""The duck emulator's mixture-of-experts banks and routed forwards, over loopback UDP.

A test plays the dataplane: it announces each duck's bank (LAYER kind MOE), fills it with
WEIGHT chunks, splits a host routing table into the wire table with
duckpipe.client.routing (the dataplane's own C rules), and sends ``wire ‖ activation``
as FORWARD datagrams flagged ROUTED, to every duck (broadcast) or ``unicast(wire, d) ‖
its rows`` to one. Each duck's reply rows are checked against numpy, and the replies
added into their tokens against :meth:`duckpipe.moe.MoeMlp.reference`.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from free_ducks import start_ducks

from duckpipe._abi import ffi
from duckpipe.client import routing
from duckpipe.client.models import SwiGluMlp, dtype_code, duck_partial, shard_bounds, shard_sizes
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.ducks import DucksProcess
from duckpipe.moe import MoeMlp
from duckpipe.schema.abi import MlpKind
from duckpipe.schema.routing import MAX_TOKENS, MAX_TOPK
from duckpipe.schema.wire import CONSTANTS, WireFlag, WireOp
from duckpipe.testing.datagrams import decode, encode, layer_payload, payload_max

pytestmark = pytest.mark.dataplane

try:
    find_binary("duckpipe-ducks")
except DuckpipeError as e:
    pytest.skip(str(e), allow_module_level=True)

PAYLOAD = payload_max(1500)  # the emulator's default MTU
ANY_DUCK = CONSTANTS["WIRE_ANY_DUCK"]
LAYER_TENSOR = CONSTANTS["WIRE_LAYER_TENSOR"]
WIRE_HEADER = ffi.sizeof("struct dp_routing_wire_header")
WIRE_ENTRY = ffi.sizeof("struct dp_routing_wire_entry")
QUIET = 0.3  # how long "nothing comes back" is watched


# --------------------------------------------------------------------------- host


class Host:
    """The dataplane's side of the protocol on one UDP socket."""

    def __init__(self, ducks: DucksProcess) -> None:
        self.addr = {duck_id: (ip, port) for duck_id, ip, port in ducks.addresses}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.session = random.getrandbits(63) | 1
        self.epoch = 3

    def close(self) -> None:
        self.sock.close()

    def send(self, to: int, op: int, payload: bytes = b"", /, **fields: int) -> None:
        fields.setdefault("duck", to)
        fields.setdefault("session", self.session)
        fields.setdefault("epoch", self.epoch)
        self.sock.sendto(encode(op, payload, **fields), self.addr[to])

    def recv(self, timeout: float = 5.0):
        self.sock.settimeout(timeout)
        data, _ = self.sock.recvfrom(65536)
        return decode(data)

    def expect_nothing(self) -> None:
        try:
            h, _ = self.recv(QUIET)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got op {h.op} from duck {h.duck}")

    def announce(self, duck: int, layer: int, payload: bytes) -> None:
        self.send(duck, WireOp.LAYER, payload, layer=layer, chunks=1)
        h, _ = self.recv()
        assert (h.op, h.duck, h.layer, h.tensor) == (WireOp.WEIGHT_ACK, duck, layer, LAYER_TENSOR)

    def load(
        self,
        duck: int,
        layer: int,
        tensors: Sequence[np.ndarray],
        kind: int = MlpKind.MOE,
        experts: int = 0,
        expert_ffn: int = 0,
    ) -> None:
        """LAYER (a MOE bank of ``experts`` of ``expert_ffn`` columns, or a dense shard),
        then its three tensors in WEIGHT chunks, 256 unacked at most (a bank of hidden
        7168 is tens of thousands of datagrams)."""
        hidden, ffn = tensors[0].shape
        dtype = dtype_code(tensors[0].dtype)
        payload = layer_payload(kind, dtype, hidden, ffn, experts=experts, expert_ffn=expert_ffn)
        self.announce(duck, layer, payload)
        pending: set[tuple[int, int]] = set()
        for t, arr in enumerate(tensors):
            raw = np.ascontiguousarray(arr).tobytes()
            n = -(-len(raw) // PAYLOAD)
            for c in range(n):
                while len(pending) >= 256:
                    self._ack(duck, layer, pending)
                off = c * PAYLOAD
                self.send(
                    duck,
                    WireOp.WEIGHT,
                    raw[off : off + PAYLOAD],
                    layer=layer,
                    tensor=t,
                    dtype=dtype,
                    chunk=c,
                    chunks=n,
                    offset=off,
                    total=len(raw),
                )
                pending.add((t, c))
        while pending:
            self._ack(duck, layer, pending)

    def _ack(self, duck: int, layer: int, pending: set[tuple[int, int]]) -> None:
        h, _ = self.recv()
        assert (h.op, h.duck, h.layer) == (WireOp.WEIGHT_ACK, duck, layer), (h.op, h.flags)
        pending.discard((h.tensor, h.chunk))

    def forward(
        self,
        ducks: Sequence[int],
        fwd: int,
        layer: int,
        message: bytes,
        rows: int,
        dtype: np.dtype,
        *,
        addressee: int = ANY_DUCK,
        flags: int = WireFlag.ROUTED,
    ) -> None:
        """``message`` (a wire table and rows, or any bytes) as FORWARD chunks to each duck."""
        n = -(-len(message) // PAYLOAD)
        for c in range(n):
            off = c * PAYLOAD
            for d in ducks:
                self.send(
                    d,
                    WireOp.FORWARD,
                    message[off : off + PAYLOAD],
                    duck=addressee,
                    forward_id=fwd,
                    layer=layer,
                    dtype=dtype_code(dtype),
                    flags=flags,
                    rows=rows,
                    chunk=c,
                    chunks=n,
                    offset=off,
                    total=len(message),
                )

    def partials(self, ducks: Sequence[int], fwd: int, dtype: np.dtype, hidden: int) -> dict:
        """Each duck's whole partial of forward ``fwd``: (rows as float32, chunk headers);
        then nothing more may come (a duck without a part stays silent)."""
        got: dict[int, dict[int, tuple]] = {d: {} for d in ducks}
        deadline = time.monotonic() + 10.0
        while any(not v or len(v) < next(iter(v.values()))[0].chunks for v in got.values()):
            h, payload = self.recv(max(0.01, deadline - time.monotonic()))
            assert h.op == WireOp.PARTIAL, f"op {h.op} flags {h.flags} from duck {h.duck}"
            assert h.forward_id == fwd and h.duck in got, (h.forward_id, h.duck)
            got[h.duck][h.chunk] = (h, payload)
        self.expect_nothing()
        out = {}
        for d, chunks in got.items():
            heads = [chunks[i][0] for i in sorted(chunks)]
            raw = b"".join(chunks[i][1] for i in sorted(chunks))
            assert len(raw) == heads[0].total
            rows = np.frombuffer(raw, dtype=dtype).reshape(heads[0].rows, hidden)
            out[d] = (rows.astype(np.float32), heads)
        return out


# ------------------------------------------------------------------------ a layer


class Layer:
    """A MoE layer placed on ducks as the dataplane places it: expert ``e`` on
    ``ducks_of[e]``, each duck's bank its experts ascending then its shared columns."""

    def __init__(self, moe: MoeMlp, ducks: Sequence[int], ducks_of: Sequence[Sequence[int]]):
        self.moe, self.ducks, self.ducks_of = moe, list(ducks), [list(d) for d in ducks_of]
        self.place = routing.placement(self.ducks_of)
        self.slots, _ = routing.bank_slots(self.place)
        self.experts = {d: [e for e, on in enumerate(self.ducks_of) if d in on] for d in ducks}
        self.shared_cols: dict[int, tuple[int, int]] = {}
        if moe.shared is not None:
            bounds = shard_bounds(shard_sizes(moe.shared.ffn, len(ducks)))
            self.shared_cols = dict(zip(ducks, bounds, strict=True))

    def bank(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [self.moe.experts[e].shard(0, self.moe.ffn) for e in self.experts[d]]
        if d in self.shared_cols:
            parts.append(self.moe.shared.shard(*self.shared_cols[d]))
        return tuple(
            np.concatenate([p[t] for p in parts], axis=0 if t == 2 else 1) for t in range(3)
        )

    def load(self, host: Host, layer: int) -> None:
        for d in self.ducks:
            host.load(d, layer, self.bank(d), MlpKind.MOE, len(self.experts[d]), self.moe.ffn)

    def wire(self, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
        table = routing.pack(idx, w, self.moe.n_experts)
        shared = self.moe.shared is not None
        wire, _ = routing.split(table, self.place, slots=self.slots, shared=shared)
        return wire

    def expected(self, d: int, x: np.ndarray, idx: np.ndarray, w: np.ndarray):
        """(token of each reply row, rows in float32) duck d owes: its experts' share of
        each token routed to it (replica t % replicas), plus its shared columns."""
        xf = x.astype(np.float32)
        y = np.zeros_like(xf)
        hit = np.zeros(len(x), bool)
        for t in range(len(x)):
            for e, wt in zip(idx[t], w[t], strict=True):
                on = self.ducks_of[e]
                if on[t % len(on)] == d:
                    y[t] += wt * self.moe.experts[e].reference(xf[t : t + 1])[0]
                    hit[t] = True
        if d in self.shared_cols:
            y += duck_partial(MlpKind.SWIGLU, xf, list(self.moe.shared.shard(*self.shared_cols[d])))
            return np.arange(len(x)), y
        return np.flatnonzero(hit), y[hit]


def routing_of(tokens: int, n_experts: int, topk: int, seed: int):
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.permutation(n_experts)[:topk] for _ in range(tokens)]).astype(np.int32)
    w = rng.uniform(0.1, 1.0, (tokens, topk)).astype(np.float32)
    return idx, w


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


# ----------------------------------------------------------------------- fixtures


@pytest.fixture
def ducks3() -> Iterator[tuple[DucksProcess, Host]]:
    """Three ducks, ids 0..2, with --verbose; their counters are read after a stop."""
    proc = start_ducks(3, ["--verbose"])
    host = Host(proc)
    yield proc, host
    host.close()
    proc.stop()


_ids = iter(range(500, 1 << 30))


def new_id() -> int:
    return next(_ids)


def stopped_counters(proc: DucksProcess) -> dict[str, int]:
    assert proc.stop() == 0, proc.output()
    return proc.counters()


# -------------------------------------------------------------------------- tests

# 7 experts on ducks 0..2 in contiguous blocks, e -> ducks[e * 3 // 7]: banks of 3, 2, 2.
UNEVEN = [[0], [0], [0], [1], [1], [2], [2]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared"])
def test_broadcast_replies_add_up_to_the_layer(ducks3, dtype, shared):
    proc, host = ducks3
    moe = MoeMlp.random(7, 48, 24, shared=shared, dtype=dtype, seed=1)
    lay = Layer(moe, [0, 1, 2], UNEVEN)
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(2).standard_normal((10, 48)).astype(dtype)
    idx, w = routing_of(10, 7, 3, seed=3)
    wire = lay.wire(idx, w)
    host.forward([0, 1, 2], fwd, layer, wire.tobytes() + x.tobytes(), 10, x.dtype)
    parts = host.partials([0, 1, 2], fwd, x.dtype, 48)
    rtol = 1e-4 if dtype == np.float32 else 4e-3
    total = np.zeros((10, 48), np.float32)
    for d, (got, heads) in parts.items():
        tokens, want = lay.expected(d, x, idx, w)
        assert got.shape == want.shape
        assert_close(got, want, rtol)
        for i, h in enumerate(heads):
            assert h.flags == WireFlag.ROUTED and h.rows == len(tokens) and h.chunk == i
            assert h.dtype == dtype_code(x.dtype) and h.compute_ns > 0
            assert h.total == len(tokens) * 48 * x.itemsize
        total[tokens] += got
    assert_close(total, moe.reference(x, idx, w).astype(np.float32), rtol * 2)
    c = stopped_counters(proc)
    assert c["moe_forwards"] == 3 and c["moe_expert_rows"] == idx.size, c


def test_unicast_gets_the_rows_of_its_section_only(ducks3):
    _, host = ducks3
    moe = MoeMlp.random(7, 40, 16, shared=False, seed=4)
    lay = Layer(moe, [0, 1, 2], UNEVEN)
    layer = new_id()
    lay.load(host, layer)
    x = np.random.default_rng(5).standard_normal((9, 40)).astype(np.float32)
    idx, w = routing_of(9, 7, 2, seed=6)
    wire = lay.wire(idx, w)
    for d in (0, 1, 2):
        table, row_map = routing.unicast(wire, d)
        fwd = new_id()
        message = table.tobytes() + x[row_map].tobytes()
        host.forward([d], fwd, layer, message, len(row_map), x.dtype, addressee=d)
        got, heads = host.partials([d], fwd, x.dtype, 40)[d]
        tokens, want = lay.expected(d, x, idx, w)
        assert row_map.tolist() == tokens.tolist() and heads[0].rows == len(tokens)
        assert_close(got, want, 1e-4)


def test_replicas_each_take_their_tokens(ducks3):
    """Expert 0 on ducks 0 and 1: token t goes to replica t % 2; duck 2 holds expert 1."""
    _, host = ducks3
    moe = MoeMlp.random(2, 32, 16, shared=False, seed=7)
    lay = Layer(moe, [0, 1, 2], [[0, 1], [2]])
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(8).standard_normal((5, 32)).astype(np.float32)
    idx = np.array([[0, 1]] * 5, np.int32)
    w = np.full((5, 2), 0.5, np.float32)
    host.forward([0, 1, 2], fwd, layer, lay.wire(idx, w).tobytes() + x.tobytes(), 5, x.dtype)
    parts = host.partials([0, 1, 2], fwd, x.dtype, 32)
    assert [parts[d][1][0].rows for d in (0, 1, 2)] == [3, 2, 5]
    for d in (0, 1, 2):
        assert_close(parts[d][0], lay.expected(d, x, idx, w)[1], 1e-4)


def test_a_duck_without_a_section_does_not_answer(ducks3):
    proc, host = ducks3
    moe = MoeMlp.random(7, 32, 16, shared=False, seed=9)
    lay = Layer(moe, [0, 1, 2], UNEVEN)
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(10).standard_normal((4, 32)).astype(np.float32)
    idx = np.array([[0, 3], [1, 4], [2, 0], [4, 3]], np.int32)  # ducks 0 and 1 only
    w = np.ones((4, 2), np.float32)
    host.forward([0, 1, 2], fwd, layer, lay.wire(idx, w).tobytes() + x.tobytes(), 4, x.dtype)
    parts = host.partials([0, 1], fwd, x.dtype, 32)  # and then silence: duck 2 skipped it
    assert sorted(parts) == [0, 1]
    c = stopped_counters(proc)
    assert c["moe_skipped"] == 1 and c["moe_forwards"] == 2, c


def test_a_duck_with_only_shared_columns_answers_every_row(ducks3):
    """Two experts on three ducks: duck 2's bank is shared columns alone (no slot at all),
    and a table with no section for it still gets every row's shared part."""
    _, host = ducks3
    moe = MoeMlp.random(2, 32, 16, shared=True, seed=11)
    lay = Layer(moe, [0, 1, 2], [[0], [1]])
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(12).standard_normal((3, 32)).astype(np.float32)
    idx = np.array([[0], [0], [0]], np.int32)  # duck 1 has no section either
    w = np.ones((3, 1), np.float32)
    wire = lay.wire(idx, w)
    host.forward([0, 1, 2], fwd, layer, wire.tobytes() + x.tobytes(), 3, x.dtype)
    parts = host.partials([0, 1, 2], fwd, x.dtype, 32)
    total = np.zeros((3, 32), np.float32)
    for d in (0, 1, 2):
        assert parts[d][1][0].rows == 3
        assert_close(parts[d][0], lay.expected(d, x, idx, w)[1], 1e-4)
        total += parts[d][0]
    assert_close(total, moe.reference(x, idx, w), 2e-4)


def test_nack_resends_a_routed_partial_as_it_was(ducks3):
    _, host = ducks3
    moe = MoeMlp.random(3, 64, 16, shared=False, seed=13)
    lay = Layer(moe, [0], [[0], [0], [0]])
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(14).standard_normal((12, 64)).astype(np.float32)
    idx, w = routing_of(12, 3, 2, seed=15)
    host.forward([0], fwd, layer, lay.wire(idx, w).tobytes() + x.tobytes(), 12, x.dtype)
    first, heads = host.partials([0], fwd, x.dtype, 64)[0]
    assert len(heads) == 3  # 12 rows x 64 float32: three datagrams
    host.send(0, WireOp.NACK, np.array([1], "<u4").tobytes(), forward_id=fwd, layer=layer)
    h, payload = host.recv()
    assert (h.op, h.flags, h.chunk, h.rows, h.total) == (
        WireOp.PARTIAL,
        WireFlag.ROUTED,
        1,
        12,
        heads[0].total,
    )
    assert payload == first.tobytes()[PAYLOAD : 2 * PAYLOAD]


def _bad_tables(wire: np.ndarray, section_end: int, bank: int) -> dict[str, bytes]:
    """Ways to spoil a good wire table whose first duck's section ends at entry byte
    ``section_end`` and holds ``bank`` experts."""
    raw = wire.tobytes()
    magic = b"XPRW" + raw[4:]
    rows = bytearray(raw)
    rows[8:12] = (int.from_bytes(raw[8:12], "little") + 1).to_bytes(4, "little")
    past = bytearray(raw)  # the section's last entry: past every slot before it
    last = section_end - WIRE_ENTRY
    past[last + 2 : last + 4] = bank.to_bytes(2, "little")
    return {
        "bad magic": magic,
        "rows mismatch": bytes(rows),
        "slot past its bank": bytes(past),
        "truncated": raw[: len(raw) // 2],
    }


def test_hostile_tables_are_dropped_and_the_duck_keeps_serving(ducks3):
    proc, host = ducks3
    moe = MoeMlp.random(3, 32, 16, shared=False, seed=16)
    lay = Layer(moe, [0], [[0], [0], [0]])
    layer = new_id()
    lay.load(host, layer)
    x = np.random.default_rng(17).standard_normal((4, 32)).astype(np.float32)
    idx, w = routing_of(4, 3, 2, seed=18)
    wire = lay.wire(idx, w)
    bad = _bad_tables(wire, len(wire), bank=3)  # one duck: its section ends the table
    for name, table in bad.items():
        message = table + x.tobytes() if name != "truncated" else table
        host.forward([0], new_id(), layer, message, 4, x.dtype)
        host.expect_nothing()
    # and a good one still gets its answer
    fwd = new_id()
    host.forward([0], fwd, layer, wire.tobytes() + x.tobytes(), 4, x.dtype)
    got, _ = host.partials([0], fwd, x.dtype, 32)[0]
    assert_close(got, lay.expected(0, x, idx, w)[1], 1e-4)
    c = stopped_counters(proc)
    assert c["moe_bad_tables"] == len(bad) and c["moe_forwards"] == 1, c
    log = proc.output()
    assert "is not a wire routing table's" in log  # bad magic, said with --verbose
    assert "names slot 3, the bank holds 3 experts" in log


def test_randomly_spoiled_tables_never_stop_the_duck(ducks3):
    """300 copies of a good routed message, a few bytes of each table changed at random:
    whatever the duck makes of them (most are refused; some still read as tables), it
    answers the good one after them and exits cleanly."""
    proc, host = ducks3
    moe = MoeMlp.random(5, 16, 8, shared=True, seed=28)
    lay = Layer(moe, [0, 1], [[0], [0], [1], [1], [0, 1]])
    layer = new_id()
    lay.load(host, layer)
    x = np.random.default_rng(29).standard_normal((6, 16)).astype(np.float32)
    idx, w = routing_of(6, 5, 2, seed=30)
    wire = lay.wire(idx, w)
    rng = np.random.default_rng(31)
    for _ in range(300):
        table = wire.copy()
        at = rng.integers(0, table.size, rng.integers(1, 4))
        table[at] = rng.integers(0, 256, at.size)
        host.forward([0, 1], new_id(), layer, table.tobytes() + x.tobytes(), 6, x.dtype)
    while True:  # drain whatever was answered
        try:
            host.recv(QUIET)
        except TimeoutError:
            break
    fwd = new_id()
    host.forward([0, 1], fwd, layer, wire.tobytes() + x.tobytes(), 6, x.dtype)
    parts = host.partials([0, 1], fwd, x.dtype, 16)
    for d in (0, 1):
        assert_close(parts[d][0], lay.expected(d, x, idx, w)[1], 1e-4)
    c = stopped_counters(proc)
    assert c["moe_bad_tables"] > 0, c


def test_activation_of_the_wrong_size_gets_no_layer(ducks3):
    _, host = ducks3
    moe = MoeMlp.random(1, 32, 16, shared=False, seed=19)
    lay = Layer(moe, [1], [[1]])
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.ones((2, 32), np.float32)
    wire = lay.wire(np.zeros((2, 1), np.int32), np.ones((2, 1), np.float32))
    host.forward([1], fwd, layer, wire.tobytes() + x.tobytes()[:-8], 2, x.dtype)
    h, _ = host.recv()
    assert (h.op, h.flags, h.duck, h.forward_id) == (WireOp.NACK, WireFlag.NO_LAYER, 1, fwd)


def test_routing_and_layer_kind_must_agree(ducks3):
    proc, host = ducks3
    moe = MoeMlp.random(1, 32, 16, shared=False, seed=20)
    lay = Layer(moe, [0], [[0]])
    moe_layer, dense_layer = new_id(), new_id()
    lay.load(host, moe_layer)
    dense = SwiGluMlp.random(32, 16, seed=21)
    host.load(0, dense_layer, dense.shard(0, 16), MlpKind.SWIGLU)
    x = np.ones((2, 32), np.float32)
    wire = lay.wire(np.zeros((2, 1), np.int32), np.ones((2, 1), np.float32))
    routed = wire.tobytes() + x.tobytes()
    host.forward([0], new_id(), dense_layer, routed, 2, x.dtype)  # routed, dense layer
    host.expect_nothing()
    host.forward([0], new_id(), moe_layer, x.tobytes(), 2, x.dtype, flags=0)  # unrouted, MoE
    host.expect_nothing()
    host.forward([0], new_id(), new_id(), routed, 2, x.dtype)  # routed, no such layer
    assert host.recv()[0].flags == WireFlag.NO_LAYER
    fwd = new_id()
    host.forward([0], fwd, dense_layer, x.tobytes(), 2, x.dtype, flags=0)
    assert_close(
        host.partials([0], fwd, x.dtype, 32)[0][0],
        duck_partial(MlpKind.SWIGLU, x, list(dense.shard(0, 16))),
        1e-4,
    )
    c = stopped_counters(proc)
    assert (c["moe_routed_dense"], c["moe_unrouted"], c["moe_forwards"]) == (1, 1, 0), c
    assert f"layer {dense_layer} is dense, the forward carries routing" in proc.output()


def test_a_bank_too_narrow_for_its_experts_is_refused(ducks3):
    proc, host = ducks3
    layer = new_id()
    for payload in (
        layer_payload(MlpKind.MOE, 1, 32, 47, experts=3, expert_ffn=16),  # 48 > 47 columns
        layer_payload(MlpKind.MOE, 1, 32, 48, experts=3, expert_ffn=0),
        layer_payload(MlpKind.SWIGLU, 1, 32, 48, experts=3, expert_ffn=16),  # dense: no bank
    ):
        host.send(2, WireOp.LAYER, payload, layer=layer, chunks=1)
    host.expect_nothing()
    host.announce(2, layer, layer_payload(MlpKind.MOE, 1, 32, 48, experts=3, expert_ffn=16))
    host.announce(2, layer, layer_payload(MlpKind.MOE, 1, 32, 48, experts=2, expert_ffn=16))
    c = stopped_counters(proc)
    assert c["moe_bad_banks"] == 3 and c["layers_rejected"] == 3 and c["layers"] == 2, c
    assert "3 experts of 16 columns need 48 columns, the bank has 47" in proc.output()


def test_the_largest_table_and_its_rows_fit_one_message(ducks3):
    """MAX_TOKENS tokens routed to MAX_TOPK experts of one duck: a 512 KiB table in front
    of the activation, under 1 MiB (the dataplane's default max_forward_bytes: 64 MiB), every
    entry computed."""
    proc, host = ducks3
    tokens, topk, hidden = MAX_TOKENS, MAX_TOPK, 32
    moe = MoeMlp.random(topk, hidden, 8, shared=False, dtype=np.float16, seed=25)
    lay = Layer(moe, [1], [[1]] * topk)
    layer, fwd = new_id(), new_id()
    lay.load(host, layer)
    x = np.random.default_rng(26).standard_normal((tokens, hidden)).astype(np.float16)
    idx = np.stack([np.random.default_rng(t).permutation(topk) for t in range(tokens)])
    w = np.random.default_rng(27).uniform(0, 0.2, (tokens, topk)).astype(np.float32)
    message = lay.wire(idx, w).tobytes() + x.tobytes()
    assert len(message) == 16 + 8 * (1 + tokens * topk) + x.nbytes <= 1 << 20
    host.forward([1], fwd, layer, message, tokens, x.dtype)
    got, heads = host.partials([1], fwd, x.dtype, hidden)[1]
    assert heads[0].rows == tokens
    assert_close(got, moe.reference(x, idx, w).astype(np.float32), 4e-3)
    c = stopped_counters(proc)
    assert c["moe_expert_rows"] == tokens * topk, c


def test_echo_mode_weighs_x_times_id_plus_one():
    proc = start_ducks(2, ["--compute", "echo"])
    host = Host(proc)
    try:
        moe = MoeMlp.random(2, 16, 8, shared=True, seed=22)
        lay = Layer(moe, [0, 1], [[0], [1]])
        layer, fwd = new_id(), new_id()
        lay.load(host, layer)
        x = np.random.default_rng(23).standard_normal((3, 16)).astype(np.float32)
        idx = np.array([[0, 1], [1, 0], [1, 0]], np.int32)
        w = np.array([[0.5, 0.25], [2.0, 1.0], [1.0, 0.0]], np.float32)
        host.forward([0, 1], fwd, layer, lay.wire(idx, w).tobytes() + x.tobytes(), 3, x.dtype)
        parts = host.partials([0, 1], fwd, x.dtype, 16)
        for d in (0, 1):
            weight = np.where(idx == d, w, 0).sum(axis=1) + 1.0  # its expert, and shared
            assert_close(parts[d][0], x * weight[:, None] * (d + 1), 1e-6)
    finally:
        host.close()
        proc.stop()


@pytest.mark.slow
def test_deepseek_sized_bank_compute_time():
    """hidden 7168, 8 local experts of 128 columns, float16: one routed forward of 1 and of
    32 tokens, every token routed to all 8 (the most one duck computes), checked against
    numpy; compute_ns is printed (-s) for the record."""
    proc = start_ducks(1)
    host = Host(proc)
    try:
        hidden, experts, cols = 7168, 8, 128
        moe = MoeMlp.random(experts, hidden, cols, shared=False, dtype=np.float16, seed=24)
        lay = Layer(moe, [0], [[0]] * experts)
        layer = new_id()
        lay.load(host, layer)
        for tokens in (1, 32):
            x = np.random.default_rng(tokens).standard_normal((tokens, hidden)).astype(np.float16)
            idx = np.tile(np.arange(experts, dtype=np.int32), (tokens, 1))
            w = np.full((tokens, experts), 1.0 / experts, np.float32)
            times = []
            for _ in range(5):
                fwd = new_id()
                message = lay.wire(idx, w).tobytes() + x.tobytes()
                host.forward([0], fwd, layer, message, tokens, x.dtype)
                got, heads = host.partials([0], fwd, x.dtype, hidden)[0]
                times.append(heads[0].compute_ns)
            assert_close(got, moe.reference(x, idx, w).astype(np.float32), 1e-2)
            print(f"\n{tokens} tokens x {experts} experts: compute_ns {times}")
    finally:
        host.close()
        proc.stop()
