"""A fake mixture-of-experts duck (numpy, one UDP socket) and the raw host-side steps of a
MoE layer, for tests of the C dataplane's routed forwards.

The duck reads what the dataplane sends as the spec says a duck must (docs/protocols.md,
issue 16): it reassembles a FORWARD message flagged ROUTED, checks the wire table in
front of it with the dataplane's own rule (duckpipe.client.routing.sections), and
replies with one row per row of its section, computed in numpy from the bank the
dataplane streamed to it. So a test against it checks the dataplane's wire format
independently of the duck emulator. It also answers the host's NACKs, and can be told
to stay silent, to ask for its input again, or to lie about its rows.

The host side (load_moe, routed_forward) writes what the client API writes for MoE
(duckpipe.client.weights.load_weights, Client.submit with routing=), but with the
session's low-level pieces, so a test can bend each field: a LoadWeights of kind MOE,
each duck's bank as weight chunks, and a routed FORWARD descriptor whose host table
follows the activation in its slot.

A helper of the project's own tests, not of the package: tests/ is on sys.path (pytest's
prepend import mode puts tests/conftest.py's folder there), so a test imports it as
``moe_fake``.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from duckpipe._abi.ring import new_desc
from duckpipe.client import routing
from duckpipe.client.models import BFLOAT16, dtype_code, shard_bounds, shard_sizes, silu
from duckpipe.client.moe import MoeMlp
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.topology import Duck, Nic, Topology
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import DescFlag, MlpKind, Op, Status
from duckpipe.schema.routing import MAX_EXPERTS, RoutingWireFlag
from duckpipe.schema.wire import WireFlag, WireOp
from duckpipe.testing import cluster_class_or_skip
from duckpipe.testing.datagrams import decode, encode, payload_max

__all__ = ["Bank", "FakeMoeDuck", "banks", "fake_cluster", "load_moe", "routed_forward"]

_LAYER = struct.Struct("<BBHIIIB7x")  # struct dp_wire_layer
_WIRE_HEADER = struct.Struct("<IBBHII")  # struct dp_routing_wire_header
_NP = {1: np.float32, 2: np.float16, 3: BFLOAT16}


@dataclass
class _Layer:
    kind: int
    dtype: int
    hidden: int
    ffn: int
    experts: int
    expert_ffn: int
    tensors: dict[int, bytearray] = field(default_factory=dict)


@dataclass
class Seen:
    """One routed message the duck reassembled: what a test asserts the mode by."""

    forward_id: int
    duck: int  # the header's addressee (0xFFFF: any)
    rows: int
    sections: dict[int, routing.Section]
    shared: bool


class FakeMoeDuck(threading.Thread):
    """Duck ``duck_id`` on 127.0.0.1:``port``.

    ``lie(rows_to_reply) -> rows`` may change which rows it replies (the rows it sends;
    values stay computed for the rows it was routed where they exist). ``silent``: it
    acknowledges weights but never answers a forward. ``ask_input_once``: on its first
    routed forward it drops chunk 0 and asks for it with a NACK INPUT, then answers."""

    def __init__(
        self,
        duck_id: int,
        port: int,
        *,
        mtu: int = 1500,
        silent: bool = False,
        ask_input_once: bool = False,
        lie: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.duck_id = duck_id
        self.payload = payload_max(mtu)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # capped by rmem_max
        self.sock.bind(("127.0.0.1", port))
        self.chunks: dict[int, int] = {}  # chunks of each forward's message, once one came
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.silent = silent
        self.ask_input_once = ask_input_once
        self.lie = lie
        self.layers: dict[int, _Layer] = {}
        self.inputs: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.replies: dict[int, list[bytes]] = {}
        self.seen: list[Seen] = []
        self.skipped = 0  # routed messages with nothing for it
        self.refused: list[str] = []  # messages it could not read: a test fails on any
        self.nacks_sent = 0
        self.computed_rows = 0

    def close(self) -> None:
        self.stop.set()
        self.join(2)
        self.sock.close()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data, host = self.sock.recvfrom(65536)
            except (TimeoutError, OSError):
                continue
            h, payload = decode(data)
            common = dict(
                session=h.session,
                epoch=h.epoch,
                forward_id=h.forward_id,
                duck=self.duck_id,
                layer=h.layer,
            )
            if h.op == WireOp.LAYER:
                kind, dt, experts, hidden, ffn, effn, _wdt = _LAYER.unpack(payload)
                self.layers[h.layer] = _Layer(kind, dt, hidden, ffn, experts, effn)
                self._ack(h, host, common)
            elif h.op == WireOp.WEIGHT:
                lay = self.layers.get(h.layer)
                if lay is not None:
                    t = lay.tensors.setdefault(h.tensor, bytearray(h.total))
                    t[h.offset : h.offset + len(payload)] = payload
                self._ack(h, host, common)
            elif h.op == WireOp.PING:
                self.sock.sendto(encode(WireOp.PONG, **common), host)
            elif h.op == WireOp.FORWARD:
                self._on_forward(h, payload, host, common)
            elif h.op == WireOp.NACK:
                self._on_nack(h, payload, host)

    def _ack(self, h, host, common) -> None:
        self.sock.sendto(
            encode(WireOp.WEIGHT_ACK, tensor=h.tensor, chunk=h.chunk, offset=h.offset, **common),
            host,
        )

    def _on_nack(self, h, payload: bytes, host) -> None:
        sent = self.replies.get(h.forward_id)
        if sent is None:
            # still reassembling (a chunk was lost: a socket buffer overflowed): ask for
            # the input chunks it lacks, as a real duck does
            got = self.inputs.get(h.forward_id)
            n = self.chunks.get(h.forward_id)
            if got is not None and n is not None and not self.silent:
                lacking = [c for c in range(n) if c not in got][:64]
                nack = encode(
                    WireOp.NACK,
                    struct.pack(f"<{len(lacking)}I", *lacking),
                    flags=WireFlag.INPUT,
                    session=h.session,
                    epoch=h.epoch,
                    forward_id=h.forward_id,
                    duck=self.duck_id,
                    layer=h.layer,
                )
                self.sock.sendto(nack, host)
            return
        listed = struct.unpack(f"<{len(payload) // 4}I", payload) if payload else ()
        for c in listed or range(len(sent)):
            if c < len(sent):
                self.sock.sendto(sent[c], host)

    def _on_forward(self, h, payload: bytes, host, common) -> None:
        if h.forward_id in self.replies or self.silent:
            return
        got = self.inputs[h.forward_id]
        self.chunks[h.forward_id] = h.chunks
        if self.ask_input_once and h.chunk == 0 and not self.nacks_sent:
            self.nacks_sent += 1  # dropped: asked for once the rest is in
            return
        got[h.chunk] = payload
        if self.ask_input_once and self.nacks_sent == 1 and 0 not in got:
            if len(got) == h.chunks - 1:
                self.nacks_sent += 1
                nack = encode(WireOp.NACK, struct.pack("<I", 0), flags=WireFlag.INPUT, **common)
                self.sock.sendto(nack, host)
            return
        if len(got) != h.chunks:
            return
        message = b"".join(got[c] for c in range(h.chunks))
        del self.inputs[h.forward_id]
        try:
            reply = self._compute(h, message)
        except Exception as e:  # a test reads the list and fails on any
            self.refused.append(f"forward {h.forward_id}: {e}")
            return
        if reply is None:
            self.skipped += 1
            return
        rows, y = reply
        self._reply(h, host, common, rows, y)

    def _compute(self, h, message: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        lay = self.layers[h.layer]
        if not h.flags & WireFlag.ROUTED or lay.kind != MlpKind.MOE:
            raise ValueError(f"flags {h.flags} on a layer of kind {lay.kind}")
        _, _, flags, n_ducks, rows, entries = _WIRE_HEADER.unpack_from(message)
        wsize = 16 + 8 * (n_ducks + entries)
        if rows != h.rows:
            raise ValueError(f"the table has {rows} rows, the header {h.rows}")
        # A broadcast table holds every routed duck's section, each entry's expert a slot in
        # *that* duck's bank: another duck may hold more experts than this one, so the
        # table is checked against the largest bank a table can name, and this duck's
        # own slots against its bank below.
        secs = routing.sections(np.frombuffer(message[:wsize], np.uint8), rows, MAX_EXPERTS)
        shared = bool(flags & RoutingWireFlag.SHARED)
        self.seen.append(Seen(h.forward_id, h.duck, rows, secs, shared))
        item = np.dtype(_NP[lay.dtype]).itemsize
        if len(message) - wsize != rows * lay.hidden * item:
            raise ValueError(f"{len(message) - wsize} activation bytes for {rows} rows")
        mine = secs.get(self.duck_id)
        if mine is not None and int(mine.expert.max()) >= lay.experts:
            raise ValueError(f"slot {int(mine.expert.max())} of a bank of {lay.experts}")
        if mine is None and not shared:
            return None
        x = np.frombuffer(message[wsize:], _NP[lay.dtype]).reshape(rows, lay.hidden)
        xf = x.astype(np.float32)
        f, e_ffn = lay.ffn, lay.expert_ffn
        w = [
            np.frombuffer(bytes(lay.tensors[t]), _NP[lay.dtype]).astype(np.float32)
            for t in range(3)
        ]
        w_gate, w_up = w[0].reshape(lay.hidden, f), w[1].reshape(lay.hidden, f)
        w_down = w[2].reshape(f, lay.hidden)

        def swiglu(xs: np.ndarray, lo: int, hi: int) -> np.ndarray:
            return (silu(xs @ w_gate[:, lo:hi]) * (xs @ w_up[:, lo:hi])) @ w_down[lo:hi]

        y = np.zeros_like(xf)
        if mine is not None:
            for row, slot, weight in zip(mine.row, mine.expert, mine.weight, strict=True):
                lo = int(slot) * e_ffn
                y[row] += weight * swiglu(xf[row : row + 1], lo, lo + e_ffn)[0]
        if shared:
            y += swiglu(xf, lay.experts * e_ffn, f)
            out_rows = np.arange(rows)
        else:
            out_rows = np.unique(mine.row)
        self.computed_rows += len(out_rows)
        return out_rows, y[out_rows].astype(_NP[lay.dtype])

    def _reply(self, h, host, common, rows: np.ndarray, y: np.ndarray) -> None:
        if self.lie is not None:
            lied = np.asarray(self.lie(rows))
            y = np.resize(y, (len(lied), y.shape[1]))
            rows = lied
        raw = y.tobytes()
        total = len(raw)
        chunks = max(1, -(-total // self.payload))
        sent = []
        for c in range(chunks):
            off = c * self.payload
            part = raw[off : off + self.payload]
            sent.append(
                encode(
                    WireOp.PARTIAL,
                    part,
                    **common,
                    flags=WireFlag.ROUTED,
                    dtype=h.dtype,
                    rows=len(rows),
                    chunk=c,
                    chunks=chunks,
                    offset=off,
                    total=total,
                )
            )
        self.replies[h.forward_id] = sent
        for d in sent:
            self.sock.sendto(d, host)


# --- the host side --------------------------------------------------------------------------


@dataclass
class Bank:
    """One duck's bank: its routed experts (ascending) and its shared-expert columns."""

    duck: int
    experts: list[int]
    shared: tuple[int, int]  # the shared expert's columns [lo, hi)
    tensors: list[np.ndarray]  # w_gate [hidden, F], w_up [hidden, F], w_down [F, hidden]


def banks(moe: MoeMlp, ducks: Sequence[int], placement: Sequence[Sequence[int]]) -> list[Bank]:
    """Each duck's bank: the columns of its experts by ascending id, then its share of the
    shared expert's columns (split as evenly as a dense layer's)."""
    shared_cols = (
        shard_bounds(shard_sizes(moe.shared.ffn, len(ducks)))
        if moe.shared is not None
        else [(0, 0)] * len(ducks)
    )
    out = []
    for d, (lo, hi) in zip(ducks, shared_cols, strict=True):
        mine = [e for e in range(moe.n_experts) if d in placement[e]]
        parts = [(moe.experts[e].w_gate, moe.experts[e].w_up, moe.experts[e].w_down) for e in mine]
        if moe.shared is not None:
            s = moe.shared
            parts.append((s.w_gate[:, lo:hi], s.w_up[:, lo:hi], s.w_down[lo:hi]))
        tensors = [
            np.ascontiguousarray(np.concatenate([p[0] for p in parts], axis=1)),
            np.ascontiguousarray(np.concatenate([p[1] for p in parts], axis=1)),
            np.ascontiguousarray(np.concatenate([p[2] for p in parts], axis=0)),
        ]
        out.append(Bank(d, mine, (lo, hi), tensors))
    return out


def load_moe(
    session,
    layer: int,
    moe: MoeMlp,
    ducks: Sequence[int],
    placement: Sequence[Sequence[int]],
    *,
    timeout: float = 20.0,
    **override: object,
) -> ctl.AnyReply:
    """LoadWeights of kind MOE (``override`` replaces request fields, to test refusals;
    a refused request raises the client's error), then every bank's tensors as weight
    chunks and the commit; returns the commit's status."""
    bk = banks(moe, ducks, placement)
    fields: dict[str, object] = dict(
        layer=layer,
        kind=int(MlpKind.MOE),
        dtype=int(dtype_code(moe.dtype)),
        hidden=moe.hidden,
        ffn=sum(b.tensors[0].shape[1] for b in bk),
        ducks=list(ducks),
        shard_sizes=[b.tensors[0].shape[1] for b in bk],
        expert_ffn=moe.ffn,
        expert_replicas=[len(p) for p in placement],
        expert_ducks=[d for p in placement for d in p],
        shared_ducks=list(ducks) if moe.shared is not None else [],  # banks(): every duck
    )
    fields.update(override)
    session.request(lambda rid: ctl.LoadWeights(req_id=rid, **fields))
    recs = []
    for b in bk:
        for t, arr in enumerate(b.tensors):
            raw = arr.reshape(-1).view(np.uint8)
            for off in range(0, raw.size, session.max_bytes):
                part = raw[off : off + session.max_bytes]
                i = session.take_slot(timeout)
                session.segment.act_bytes(i)[: part.size] = part
                recs.append(
                    session.push_weight(i, Op.WEIGHT_CHUNK, layer, b.duck, t, off, part.size)
                )
    i = session.take_slot(timeout)
    commit = session.push_weight(i, Op.WEIGHT_COMMIT, layer, 0, 0, 0, 0)
    for rec in [*recs, commit]:
        session.wait_done(rec, timeout, "block")
    return Status(commit.status)


@dataclass
class Routed:
    """A routed forward's outcome: its status, message, ducks, and result (if OK)."""

    status: Status
    message: str
    answered: list[int]
    missing: list[int]
    y: np.ndarray | None


def routed_forward(
    session,
    layer: int,
    x: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    n_experts: int,
    *,
    flags: int = 0,
    timeout_us: int = 0,
    table: bytes | None = None,
) -> Routed:
    """One routed forward written as the client writes it: x then, at the next
    64-byte boundary of the slot, the host table (``table`` instead, raw, to test
    refusals); ``flags`` adds to ROUTED. Waits for both completions."""
    i = session.take_slot(10.0)
    act = session.segment.act_bytes(i)
    raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    act[: raw.size] = raw
    at = (raw.size + 63) & ~63
    if table is None:
        routing.pack(indices, weights, n_experts, out=act[at:])
    else:
        act[at : at + len(table)] = np.frombuffer(table, np.uint8)
    d = new_desc()
    d.op = Op.FORWARD
    d.layer = layer
    d.dtype = int(dtype_code(x.dtype))
    d.ndim = 2
    d.shape[0], d.shape[1] = x.shape
    d.nbytes = raw.size
    d.flags = int(DescFlag.ROUTED) | flags
    d.timeout_us = timeout_us
    rec = session.push(d, int(Op.FORWARD), i, x.shape, x.dtype)
    session.await_zmq(rec, 30.0)
    y = None
    if rec.status == Status.OK:
        y = session.segment.res_view(i, x.shape, x.dtype).copy()
    session.release_forward(rec)
    return Routed(
        Status(rec.status),
        rec.message or "",
        list(rec.answered or []),
        list(rec.missing or []),
        y,
    )


@contextmanager
def fake_cluster(
    n_ducks: int, make: Callable[[int], Sequence[threading.Thread]], **settings: object
) -> Iterator[tuple[object, list]]:
    """The C dataplane on loopback with fake ducks: ``make(base)`` builds them, duck ``i``
    listening on port ``base + 1 + i`` (the dataplane's own port is ``base``); started
    here, stopped at the end, and the dataplane's exit must be clean (status 0, no
    sanitizer report). Yields (the DataplaneProcess, the ducks)."""
    cluster_class_or_skip()
    base = free_udp_ports(n_ducks + 1)
    ducks = list(make(base))
    for d in ducks:
        d.start()
    settings.setdefault("default_timeout_ms", 3000)
    topo = Topology(
        nics=[
            Nic(
                name="lo",
                host_ip="127.0.0.1",
                host_port=base,
                ducks=[Duck(id=i, ip="127.0.0.1", port=base + 1 + i) for i in range(n_ducks)],
            )
        ],
        **settings,
    )
    dp = DataplaneProcess(topo).start()
    try:
        yield dp, ducks
    finally:
        code = dp.stop()
        out = dp.output()
        dp.close()
        for d in ducks:
            d.close()
        assert code == 0 and "runtime error" not in out and "Sanitizer" not in out, out[-3000:]
