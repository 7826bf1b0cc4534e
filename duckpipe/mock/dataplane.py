"""The shm-only mock dataplane: the real ring ABI and control protocol, no network.

It maps each attached client's segment, polls its ring, and does the ducks'
work itself: it holds every duck's weight shard, computes each targeted duck's
partial with numpy, sums them into the result slot (float32 accumulation),
publishes the slot's done word and sends the ZeroMQ completion, exactly as the
C dataplane does. Timings are real measurements of what the mock did: the
ducks' compute is sequential here, so ``wait_ns`` is their sum and
``send_ns``/``fetch_ns`` are zero (there is no network); the slot header's second
line gets the same numbers (``Forward.phases``), before the done word.

Policy is the C dataplane's own, through cffi, not a copy: each descriptor passes
dp_desc_check (dataplane/include/dp_desc_check.h), each client's share of the forwards
in flight is dp_client_quota (dp_fair_share.h), and the counters are the schema's
(COUNTER_NAMES in duckpipe/schema/stats.py). What is the mock's own is the numpy compute.
Mixture-of-experts layers (their load checks, routed descriptors, the routing table
checked by dp_routing_check, each duck's bank compute) are in ``moe.py`` next door.

Fault knobs (``SetFaults`` or command-line flags): delay every completion,
ducks that never answer (their forwards complete TIMEOUT at the deadline,
naming them), and a crash (SIGKILL of itself) on the forward after N.
"""

from __future__ import annotations

import collections
import dataclasses
import grp
import heapq
import itertools
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import zmq
from zmq.utils import z85

from .. import host
from .._abi import check, ffi, lib, rules, text
from .._abi.ring import new_descs
from .._abi.shm import Segment, clean_segments
from ..client import fp8
from ..client.models import duck_partial, numpy_dtype
from ..errors import DuckpipeError
from ..schema import control as ctl
from ..schema.abi import (
    ABI_MAJOR,
    B_DOWN_TENSOR,
    FP8_BLOCK,
    MAX_DUCKS,
    SHARD_TENSORS,
    DetachReason,
    Op,
    Status,
    tensor_shape,
)
from ..schema.config import check_limits
from ..schema.config import default as config_default
from ..schema.control import ErrorCode
from ..schema.stats import COUNTER_NAMES
from . import moe
from .idle import IdleStrategy
from .stats_writer import StatsWriter, check_stats_path

__all__ = ["DescriptorCheck", "MockConfig", "MockDataplane", "main_loop"]

log = logging.getLogger("duckpipe.mock")

BURST = 32
HOUSEKEEPING_S = 0.05
# completions held for a client whose socket is full are offered again after this, doubled
# after each offer that sent nothing up to the most (dp_control_outbox.c's HELD_RETRY_*)
HELD_RETRY_MIN_S = 100e-6
HELD_RETRY_MAX_S = 0.02
STATS_TICK_S = 0.01  # the stats segment's heartbeat and counters


@dataclasses.dataclass
class MockConfig:
    control: str
    ducks: int = 8
    idle: str = "backoff"
    default_timeout_ms: float = 1000.0
    client_timeout_s: float = 10.0
    delay_ms: float = 0.0
    dead_ducks: frozenset[int] = frozenset()
    crash_after: int | None = None
    # per-client limits, as the C dataplane's config (duckpipe/launch/topology.py)
    client_max_inflight: int = config_default("client_max_inflight")
    max_inflight: int = config_default("max_inflight")
    max_forward_bytes: int = config_default("max_forward_bytes")
    client_max_slots: int = config_default("client_max_slots")
    client_max_segment_bytes: int = config_default("client_max_segment_bytes")
    max_timeout_us: int = config_default("max_timeout_us")
    # the C dataplane's names and defaults (duckpipe/schema/config.py)
    client_max_layers: int = config_default("client_max_layers")
    client_max_weight_bytes: int = config_default("client_max_weight_bytes")
    max_hidden: int = config_default("max_hidden")
    max_ffn: int = config_default("max_ffn")
    client_max_per_pid: int = config_default("client_max_per_pid")
    client_max_per_uid: int = config_default("client_max_per_uid")
    admin_reserved_clients: int = config_default("admin_reserved_clients")
    max_connections: int = config_default("max_connections")
    control_group: str = config_default("control_group")
    curve_secret_key_file: str = config_default("curve_secret_key_file")
    curve_public_key_file: str = config_default("curve_public_key_file")
    curve_clients_file: str = config_default("curve_clients_file")


class _Refused(DuckpipeError):
    """A control request refused with a specific ErrorCode."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _CompletedAs(DuckpipeError):
    """A descriptor completes with this status and message (not BAD_REQUEST)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class _Peer:
    """Who sent a control request: uid, gid, pid from the socket (ipc://), or none."""

    identity: bytes
    creds: bool
    uid: int = -1
    gid: int = -1
    pid: int = -1  # the process that connected, maybe gone since (host.peer_pidfd)
    admin: bool = False
    srcfd: int = -1  # the connection's socket (ZMQ_SRCFD), libzmq's: only looked at


def _peer_credentials(control: str, address: str | None) -> tuple[int, int, int] | None:
    """(uid, gid, pid) from the ":uid:gid:pid" tail libzmq gives an ipc peer's address.

    Only on an ipc:// endpoint: a tcp:// peer's address is its IP, and an IPv6 one such
    as "2001:db8::0:7:5" has the same shape (uid 0, the admin)."""
    if not control.startswith("ipc://") or not address:
        return None
    parts = address.rsplit(":", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return None
    return int(parts[1]), int(parts[2]), int(parts[3])


@dataclasses.dataclass
class _Layer:
    info: ctl.LoadWeights
    owner: int  # client id of the loader
    weight_bytes: int
    raw: dict[tuple[int, int], np.ndarray]  # (duck, tensor) -> bytes being filled
    received: dict[tuple[int, int], int]
    tensors: dict[int, list[np.ndarray]] = dataclasses.field(default_factory=dict)  # ready shards
    b_down: np.ndarray | None = None
    ready: bool = False
    failed: bool = False  # a chunk or the commit failed: unusable until reloaded
    missing: set[int] = dataclasses.field(default_factory=set)  # ducks that did not ack
    moe: moe.MoePlan | None = None  # a mixture of experts: placement and bank slots
    # ducks that restarted since the commit (a SetFaults fault) and have not said so yet:
    # their next forward is answered NO_LAYER, which puts them in ``lost``
    forgot: set[int] = dataclasses.field(default_factory=set)
    lost: set[int] = dataclasses.field(default_factory=set)  # LayerInfo.lost
    repair: set[int] = dataclasses.field(default_factory=set)  # an open RepairLayer's ducks
    repair_failed: set[int] = dataclasses.field(default_factory=set)  # of them, unacked
    # an open MoveLayer: the layer as it will be (its new placement and, for the ducks
    # whose experts change, their new banks filling), taking the move's chunks; this one
    # serves meanwhile. Its commit puts it in this one's place.
    moving: _Layer | None = None
    # ducks a failed move sent a bank (on real ducks a stale bank of the generation the
    # next move takes): the next move must send them one again
    tainted: set[int] = dataclasses.field(default_factory=set)
    # what dp_desc_check reads of the layer (struct dp_desc_layer), and the tables it
    # points into (kept alive with it)
    _view: object = dataclasses.field(init=False, repr=False)
    _tables: tuple = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        i = self.info
        index = ffi.new("int16_t[]", [-1] * MAX_DUCKS)
        for k, duck in enumerate(i.ducks):
            index[duck] = k
        shard = ffi.new("uint32_t[]", list(i.shard_sizes))
        repair = ffi.new("uint64_t[]", MAX_DUCKS // 64)  # dp_desc_layer.repair's bits
        self._tables = (index, shard, repair)
        self._view = ffi.new(
            "struct dp_desc_layer *",
            {
                "id": i.layer,
                "hidden": i.hidden,
                "kind": i.kind,
                "dtype": i.dtype,
                "has_b_down": i.has_b_down,
                "index": index,
                "shard": shard,
                "weight_dtype": i.weight_dtype,
                "expert_ffn": i.expert_ffn,
                # the plan's own table (dp_layer_moe.experts_on, kept alive by self.moe)
                "experts_on": self.moe.state.experts_on if self.moe is not None else ffi.NULL,
            },
        )

    def desc_view(self):  # -> struct dp_desc_layer *
        """The layer as dp_desc_check reads it, its ready and failed flags as they are now."""
        v = self._view
        v.ready = self.ready
        v.failed = self.failed
        bits = self._tables[2]
        for w in range(MAX_DUCKS // 64):
            bits[w] = sum(1 << (d & 63) for d in self.repair if d >> 6 == w)
        v.repair = bits if self.repair else ffi.NULL
        return v

    def public(self) -> ctl.LayerInfo:
        i = self.info
        return ctl.LayerInfo(
            layer=i.layer,
            kind=i.kind,
            dtype=i.dtype,
            hidden=i.hidden,
            ffn=i.ffn,
            ducks=list(i.ducks),
            shard_sizes=list(i.shard_sizes),
            has_b_down=i.has_b_down,
            ready=self.ready and not self.lost,
            failed=self.failed,
            missing=[d for d in i.ducks if d in self.missing],
            lost=[] if self.failed else [d for d in i.ducks if d in self.lost],
            owner=self.owner,
            shared=i.shared,
            **(self.moe.listing(i.shard_sizes) if self.moe is not None else {}),
        )


class DescriptorCheck:
    """dp_desc_check (dataplane/include/dp_desc_check.h), the C dataplane's own descriptor
    check, under one dataplane's limits: the mock lets through what the C dataplane lets
    through, and refuses the rest with its words."""

    def __init__(
        self, *, max_forward_bytes: int, default_timeout_us: int, max_timeout_us: int
    ) -> None:
        self.limits = ffi.new(
            "struct dp_limits *",
            {
                "max_forward_bytes": max_forward_bytes,
                "default_timeout_us": default_timeout_us,
                "max_timeout_us": max_timeout_us,
            },
        )
        self._plan = ffi.new("struct dp_desc_plan *")
        self._why = ffi.new("char[]", lib.DP_DESC_WHY_LEN)
        # another client's layer, as the dispatcher shows it to the check: that alone
        self._foreign = ffi.new("struct dp_desc_layer *", {"foreign": True})

    def __call__(
        self, layout, layer: _Layer | None, d, foreign: bool = False
    ):  # -> struct dp_desc_plan *
        """The plan (struct dp_desc_plan *, until the next call) of descriptor ``d`` (a
        struct dp_desc *) from a client of ``layout`` (struct dp_client_layout *) on
        ``layer`` (None: no such layer, or, ``foreign``, another client's); DuckpipeError
        with the dataplane's reason when it is refused."""
        view = ffi.NULL if layer is None else layer.desc_view()
        if layer is None and foreign:
            view = self._foreign
        rc = lib.dp_desc_check(layout, view, d, self.limits, self._plan, self._why, len(self._why))
        check(rc, self._why)
        return self._plan


def _tensor_shapes(kind: int, hidden: int, f: int) -> list[tuple[int, ...]]:
    return [tensor_shape(kind, t, hidden, f) for t in range(SHARD_TENSORS)]


def _fp8_blocks(msg: ctl.LoadWeights, duck: int, plan: moe.MoePlan | None) -> list[int]:
    """The widths of a duck's column blocks, each with its own scale-grid columns
    (dp_fp8.h): its routed experts' expert_ffn each, then the rest of its shard."""
    f = msg.shard_sizes[msg.ducks.index(duck)]
    experts = plan.n_local.get(duck, 0) if plan is not None else 0
    rest = f - experts * msg.expert_ffn
    return [msg.expert_ffn] * experts + ([rest] if rest else [])


def _fp8_tensor_bytes(msg: ctl.LoadWeights, duck: int, plan: moe.MoePlan | None) -> int:
    """dp_fp8_tensor_bytes: hidden * f e4m3 bytes, then hb x cb float32 scales."""
    f = msg.shard_sizes[msg.ducks.index(duck)]
    cb = sum(-(-b // FP8_BLOCK) for b in _fp8_blocks(msg, duck, plan))
    return msg.hidden * f + 4 * -(-msg.hidden // FP8_BLOCK) * cb


def _fp8_dequant(raw: np.ndarray, shape: tuple[int, ...], t: int, blocks: list[int]) -> np.ndarray:
    """Tensor t of an FP8 shard in float32, as dp_mlp_fp8_dequant: each column block's
    e4m3 weights times its own scale grid (fp8.weight_dequant, float32 products)."""
    n = int(np.prod(shape))
    w = raw[:n].view(fp8.FLOAT8_E4M3).reshape(shape)
    down = t == 2
    w = w.T if down else w  # [hidden, f]: blocks are column ranges
    grid = (
        raw[n:]
        .view("<f4")
        .reshape((-1, -(-shape[1] // FP8_BLOCK)) if down else (-(-shape[0] // FP8_BLOCK), -1))
    )
    grid = grid.T if down else grid
    out, c, g = [], 0, 0
    for b in blocks:
        nb = -(-b // FP8_BLOCK)
        out.append(fp8.weight_dequant(w[:, c : c + b], grid[:, g : g + nb]))
        c, g = c + b, g + nb
    full = np.concatenate(out, axis=1)
    return np.ascontiguousarray(full.T if down else full)


@dataclasses.dataclass(eq=False)
class _Client:
    id: int
    identity: bytes
    pid: int
    name: str
    seg: Segment
    start_ticks: int  # the kernel's start time of pid, read at attach (never the header's)
    # the consumer's private ring indices (tail, head seen): the segment's copy of tail is
    # only published for the producer, so a client cannot make us replay or skip entries
    indices: object = dataclasses.field(default_factory=lambda: ffi.new("uint64_t[2]"))
    uid: int = -1
    # its layout, copied out of the header once at attach (struct dp_client_layout):
    # what dp_desc_check holds descriptors to
    layout: object = None
    submitted: int = 0
    completed: int = 0
    inflight: int = 0  # deferred completions not sent yet, and held ones
    closing: bool = False  # detached: unmapped once nothing is in flight
    # when it attached: no submit stamp of an honest client is older (_client_prepare)
    attach_ns: int = dataclasses.field(default_factory=host.monotonic_ns)
    # encoded completions its full socket refused, oldest first (_deliver)
    held: collections.deque = dataclasses.field(default_factory=collections.deque)


#: what a completion's fields carry for the mock alone: never sent in the Completion
_PRIVATE_FIELDS = ("nbytes", "_pickup_ns", "_sent_ns", "_bytes_in")


@dataclasses.dataclass(order=True)
class _Deferred:
    due: float
    seq: int
    client: _Client = dataclasses.field(compare=False)
    fields: dict = dataclasses.field(compare=False)


class MockDataplane:
    """One process, one thread: control, ring polling and the ducks' compute."""

    def __init__(self, cfg: MockConfig) -> None:
        if not 1 <= cfg.ducks <= MAX_DUCKS:
            raise DuckpipeError(f"--ducks must be between 1 and {MAX_DUCKS}, not {cfg.ducks}")
        self.cfg = cfg
        self.epoch = 1
        self.session = secrets.randbits(63)
        self.clients: dict[bytes, _Client] = {}
        self.layers: dict[int, _Layer] = {}
        # every counter of the schema, as the C dataplane keeps them: a name not in it
        # raises KeyError at its first +=
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._check = DescriptorCheck(
            max_forward_bytes=cfg.max_forward_bytes,
            default_timeout_us=int(cfg.default_timeout_ms * 1000),
            max_timeout_us=cfg.max_timeout_us,
        )
        self.faults = ctl.SetFaults(
            req_id=0,
            delay_ms=cfg.delay_ms,
            dead_ducks=sorted(cfg.dead_ducks),
            crash_after=cfg.crash_after,
        )
        self._deferred: list[_Deferred] = []
        self._held: dict[int, _Client] = {}  # clients with completions held, by id
        self._held_retry = 0.0
        self._held_backoff = HELD_RETRY_MIN_S
        self._slot_value = ffi.new("struct dp_slot_header *")  # what _complete publishes
        self._seq = itertools.count()
        self._next_client = 1
        self._running = True
        self._descs = new_descs(BURST)
        self._ctx = zmq.Context.instance()
        self._euid = os.geteuid()
        self._topology = rules.topology(cfg.ducks)  # the ducks LoadWeights may name
        why = check_limits(
            cfg.client_max_layers,
            cfg.client_max_per_pid,
            cfg.client_max_per_uid,
            cfg.admin_reserved_clients,
        )
        if why:  # as the C dataplane: refused at start
            raise DuckpipeError(why)
        self._group_gid: int | None = None
        if cfg.control_group:
            try:
                self._group_gid = grp.getgrnam(cfg.control_group).gr_gid
            except KeyError:
                raise DuckpipeError(
                    f"control_group {cfg.control_group!r} is not a group here"
                ) from None
        self._ipc = cfg.control.startswith("ipc://")
        self._zap: zmq.Socket | None = None
        self._curve_clients: set[bytes] = set()
        check_stats_path(cfg.control)  # before the bind, as the C dataplane's order
        self.router = self._bind(cfg.control)
        self.stats = StatsWriter(cfg.control, cfg.ducks)
        self._mark_dead_ducks()
        self._idle = IdleStrategy(cfg.idle, park=lambda s: self.router.poll(max(1, int(s * 1000))))

    # --- setup ---------------------------------------------------------------

    def _bind(self, control: str) -> zmq.Socket:
        if control.startswith("ipc://"):
            path = Path(control[len("ipc://") :])
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.exists():
                if _someone_answers(self._ctx, control):
                    raise DuckpipeError(
                        f"a dataplane is already running at {control}; stop it "
                        "(duckpipe shutdown) or choose another --control address"
                    )
                path.unlink()  # left behind by a dataplane that died
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # a longer message disconnects its sender before libzmq buffers it
        sock.setsockopt(zmq.MAXMSGSIZE, ctl.MAX_MESSAGE_BYTES)
        # as the C dataplane: a peer that never greets is closed after 2 s, and one that
        # never reads has at most 256 messages queued; past that a send fails rather
        # than vanishing (ROUTER_MANDATORY): a reply is dropped and counted, a
        # completion held until the peer reads (_deliver)
        sock.setsockopt(zmq.HANDSHAKE_IVL, 2000)
        sock.setsockopt(zmq.SNDHWM, 256)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._limit_access(sock, control)
        except BaseException:
            sock.close()
            raise
        old = os.umask(0o077)  # the socket's mode is the first fence
        try:
            sock.bind(control)
        except zmq.ZMQError as e:
            sock.close()
            raise DuckpipeError(f"cannot listen on {control}: {e}; is the address in use?") from e
        finally:
            os.umask(old)
        if self._ipc:  # created 0700 under the umask; a socket needs no x bit
            path = control[len("ipc://") :]
            if self._group_gid is not None:
                os.chown(path, -1, self._group_gid)
            os.chmod(path, 0o600 if self._group_gid is None else 0o660)
        return sock

    def _limit_access(self, sock: zmq.Socket, control: str) -> None:
        """ipc://: our user (and control_group) by SO_PEERCRED; tcp://: listed CURVE keys."""
        cfg = self.cfg
        if self._ipc:
            sock.setsockopt(zmq.IPC_FILTER_UID, self._euid)
            if self._group_gid is not None:
                sock.setsockopt(zmq.IPC_FILTER_GID, self._group_gid)
            return
        if not control.startswith("tcp://"):
            raise DuckpipeError(
                f"control endpoint {control}: only ipc:// (or tcp:// with CURVE keys) is served"
            )
        if not (cfg.curve_secret_key_file and cfg.curve_public_key_file and cfg.curve_clients_file):
            raise DuckpipeError(
                "tcp:// control needs CURVE: set curve_secret_key_file, curve_public_key_file "
                "and curve_clients_file (or use ipc://)"
            )
        try:
            secret = Path(cfg.curve_secret_key_file).read_text().strip().encode()
            public = Path(cfg.curve_public_key_file).read_text().strip().encode()
            lines = Path(cfg.curve_clients_file).read_text().splitlines()
        except OSError as e:
            raise DuckpipeError(f"cannot read a CURVE key file: {e}") from e
        for i, line in enumerate(lines, 1):
            key = line.strip()
            if not key or key.startswith("#"):
                continue
            if len(key) != 40:
                raise DuckpipeError(f"{cfg.curve_clients_file} line {i}: not a z85 public key")
            self._curve_clients.add(z85.decode(key))
        self._zap = self._ctx.socket(zmq.REP)  # bound before any handshake can ask it
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind("inproc://zeromq.zap.01")
        sock.curve_server = True
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.zap_domain = b"duckpipe"

    def _serve_zap(self) -> int:
        """Answer libzmq's ZAP requests (RFC 27): admit the keys of curve_clients_file."""
        n = 0
        while self._zap is not None:
            try:
                frames = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            ok = len(frames) >= 7 and frames[5] == b"CURVE" and frames[6] in self._curve_clients
            if not ok:
                self.counters["curve_refused"] += 1
                log.warning(
                    "refused a CURVE client whose key is not in %s", self.cfg.curve_clients_file
                )
            rid = frames[1] if len(frames) > 1 else b""
            status = [b"200", b"OK"] if ok else [b"400", b"unknown key"]
            self._zap.send_multipart([b"1.0", rid, *status, b"", b""])
        return n

    # --- main loop -------------------------------------------------------------

    def serve(self) -> None:
        for info in clean_segments():
            log.warning("removed %s left by dead pid %d", info.path, info.creator_pid)
        last_house = last_stats = 0.0
        while self._running:
            work = self._serve_zap() + self._poll_control()
            # each client's quota this pass: the C dispatcher's fair share of its forward
            # contexts (max_inflight) among the clients it polls
            quota = lib.dp_client_quota(
                self.cfg.max_inflight, len(self.clients), self.cfg.client_max_inflight
            )
            for client in list(self.clients.values()):
                if client.identity in self.clients:  # not evicted by an earlier one
                    work += self._drain(client, quota)
            work += self._run_deferred()
            now = time.monotonic()
            if self._held and now >= self._held_retry:
                work += self._retry_held(now)
            if now - last_stats >= STATS_TICK_S:
                last_stats = now
                self._stats_tick()
            if now - last_house >= HOUSEKEEPING_S:
                last_house = now
                self._housekeeping()
            self._idle.idle(work)
        self._teardown()

    def stop(self) -> None:
        self._running = False

    def _teardown(self) -> None:
        self.stats.close()
        for client in self.clients.values():
            client.seg.close()  # the clients own their memfds
        self.clients.clear()
        self.router.close(linger=0)
        if self._zap is not None:
            self._zap.close(linger=0)
        if self.cfg.control.startswith("ipc://"):
            Path(self.cfg.control[len("ipc://") :]).unlink(missing_ok=True)

    # --- control -----------------------------------------------------------------

    def _poll_control(self) -> int:
        n = 0
        while n < 64:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n += 1
            self.counters["control_messages"] += 1
            if len(frames) != 2:  # identity + one payload
                self.counters["bad_control_messages"] += 1
                continue
            identity, raw = frames[0].bytes, frames[1]
            peer = self._peer(identity, raw)
            if peer is None:
                continue
            lie = _prescan(raw.bytes, ctl.MAX_NESTING)
            if lie is not None:  # as the C dataplane's dp_msgpack_prescan refuses it
                self.counters["bad_control_messages"] += 1
                self._send(identity, ctl.Error(req_id=0, code=ErrorCode.BAD_MESSAGE, message=lie))
                continue
            try:
                msg = ctl.request_decoder.decode(raw.buffer)
            except msgspec.DecodeError as e:
                self.counters["bad_control_messages"] += 1
                code = _decode_error_code(e)
                self._send(
                    identity,
                    ctl.Error(
                        req_id=_req_id(raw.bytes), code=code, message=_decode_error(e, raw.bytes)
                    ),
                )
                continue
            try:
                reply = self._handle(peer, msg)
            except _Refused as e:
                if e.code == ErrorCode.NOT_PERMITTED:
                    self.counters["control_refused"] += 1
                reply = ctl.Error(req_id=msg.req_id, code=e.code, message=str(e))
            except DuckpipeError as e:
                reply = ctl.Error(req_id=msg.req_id, code=ErrorCode.BAD_REQUEST, message=str(e))
            if reply is not None:
                self._send(identity, reply)
        return n

    def _peer(self, identity: bytes, frame: zmq.Frame) -> _Peer | None:
        """Who sent it, or None (refused and counted) when an ipc peer has no credentials."""
        if not self._ipc:
            return _Peer(identity, creds=False)
        creds = _peer_credentials(self.cfg.control, frame.get("Peer-Address"))
        if creds is None:
            self.counters["control_refused"] += 1
            self._send(
                identity,
                ctl.Error(
                    req_id=0,
                    code=ErrorCode.NO_CREDENTIALS,
                    message="the sender's credentials could not be read",
                ),
            )
            return None
        uid, gid, pid = creds
        if uid != self._euid and self._group_gid is None:
            self.counters["control_refused"] += 1  # the socket filter's second fence
            return None
        return _Peer(
            identity, True, uid, gid, pid, admin=uid == self._euid, srcfd=frame.get(zmq.SRCFD)
        )

    def _send(self, identity: bytes, msg: msgspec.Struct) -> None:
        try:
            self.router.send_multipart([identity, ctl.encoder.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # Again: 256 unread; EHOSTUNREACH: the peer is gone
            self.counters["replies_dropped"] += 1
            log.debug("control reply dropped: %s", e)

    # --- completions to the clients' sockets (dp_control_outbox.c) -------------------

    def _deliver(self, client: _Client, raw: bytes) -> None:
        """Send one encoded completion; held while the client's socket is full (behind
        those held already), dropped and counted when its peer is gone."""
        if client.held:
            self._hold(client, raw)
            return
        try:
            self.router.send_multipart([client.identity, raw], zmq.NOBLOCK)
        except zmq.Again:
            self._hold(client, raw)
            return
        except zmq.ZMQError as e:
            self._drop(1, str(e))
            return
        self.counters["completions_sent"] += 1

    def _hold(self, client: _Client, raw: bytes) -> None:
        """Keep it until the socket takes it: its forward stays in flight meanwhile, so the
        client's quota bounds how many it can have held. A client that left gets none."""
        if client.closing:
            self._drop(1, "the client left")
            return
        if not self._held:
            self._held_backoff = HELD_RETRY_MIN_S
            self._held_retry = time.monotonic() + self._held_backoff
        client.held.append(raw)
        client.inflight += 1
        self._held[client.id] = client
        self.counters["completions_held"] += 1

    def _drop(self, n: int, why: str) -> None:
        log.debug("%d completions dropped: %s", n, why)
        self.counters["completions_dropped"] += n

    def _retry_held(self, now: float) -> int:
        """Offer each client's held completions, oldest first, until its socket refuses."""
        sent = 0
        for client in list(self._held.values()):
            while client.held:
                if client.closing:
                    self._drop(len(client.held), "the client left")
                    client.inflight -= len(client.held)
                    client.held.clear()
                    break
                try:
                    self.router.send_multipart([client.identity, client.held[0]], zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError as e:  # its connection is gone
                    self._drop(len(client.held), str(e))
                    client.inflight -= len(client.held)
                    client.held.clear()
                    break
                client.held.popleft()
                client.inflight -= 1
                sent += 1
                self.counters["completions_sent"] += 1
            if not client.held:
                del self._held[client.id]
                if client.closing and client.inflight == 0:
                    client.seg.close()
        # nothing taken: the clients still do not read; ask less often
        self._held_backoff = (
            HELD_RETRY_MIN_S if sent else min(2 * self._held_backoff, HELD_RETRY_MAX_S)
        )
        self._held_retry = now + self._held_backoff
        return sent

    def _handle(self, peer: _Peer, msg: ctl.Request) -> msgspec.Struct | None:
        rid = msg.req_id
        me = self.clients.get(peer.identity)
        match msg:
            case ctl.Attach():
                return self._attach(peer, msg)
            case ctl.Detach():
                client = self.clients.pop(peer.identity, None)
                if client is not None:
                    self._drop_layers_of(client)
                    self._retire(client)
                    self.counters["clients_detached"] += 1
                return ctl.Ack(req_id=rid)
            case ctl.Heartbeat():
                return ctl.Ack(req_id=rid)
            case ctl.GetTopology():
                return ctl.Topology(
                    req_id=rid,
                    nics=[ctl.NicInfo(name="mock0", backend="mock")],
                    ducks=[
                        ctl.DuckInfo(id=d, nic="mock0", alive=d not in self.faults.dead_ducks)
                        for d in range(self.cfg.ducks)
                    ],
                )
            case ctl.GetLayers():
                return ctl.Layers(
                    req_id=rid,
                    layers=[
                        la.public()
                        for la in self.layers.values()
                        if peer.admin or la.info.shared or (me and la.owner == me.id)
                    ],
                )
            case ctl.LoadWeights():
                return self._load_weights(peer, me, msg)
            case ctl.RepairLayer():
                return self._repair_layer(me, msg)
            case ctl.MoveLayer():
                return self._move_layer(me, msg)
            case ctl.UnloadLayer():
                layer = self.layers.get(msg.layer)
                if layer is None:
                    raise _Refused(ErrorCode.UNKNOWN_LAYER, f"layer {msg.layer} is not loaded")
                if not peer.admin and (me is None or layer.owner != me.id):
                    raise _Refused(
                        ErrorCode.NOT_PERMITTED, f"layer {msg.layer} belongs to another client"
                    )
                self._drop_layer(msg.layer)
                return ctl.Ack(req_id=rid)
            case ctl.SetEpoch():
                _need_admin(peer, "SetEpoch")
                new = self.epoch + 1 if msg.epoch is None else msg.epoch
                if new == self.epoch:
                    raise DuckpipeError(f"already in epoch {new}")
                self.epoch = new
                return ctl.EpochChanged(req_id=rid, epoch=new)
            case ctl.GetStats():
                return ctl.Stats(
                    req_id=rid,
                    mode="mock",
                    epoch=self.epoch,
                    counters=dict(self.counters),
                    clients=[
                        # where another client's segment is, and who it is, is the admin's
                        ctl.ClientStats(
                            client_id=c.id,
                            pid=c.pid if peer.admin or c is me else 0,
                            name=c.name if peer.admin or c is me else "",
                            segment=c.seg.name if peer.admin or c is me else "",
                            submitted=c.submitted,
                            completed=c.completed,
                        )
                        for c in self.clients.values()
                    ],
                    # like the C dataplane's socket and null NICs: no port, no xstats
                    nics=[ctl.NicStats(name="mock0", backend="mock")],
                )
            case ctl.SetFaults():
                _need_admin(peer, "SetFaults")
                bad = [d for d in msg.dead_ducks if d >= self.cfg.ducks]
                if bad:
                    raise DuckpipeError(f"ducks {bad} do not exist (there are {self.cfg.ducks})")
                self.faults = msg
                self._mark_dead_ducks()
                for la in self.layers.values():  # they forget every layer they held
                    if la.ready:
                        la.forgot |= set(msg.restarted_ducks) & set(la.info.ducks)
                return ctl.Ack(req_id=rid)
            case ctl.Shutdown():
                _need_admin(peer, "Shutdown")
                self._running = False
                return ctl.Ack(req_id=rid)
        raise DuckpipeError(f"unhandled request {type(msg).__name__}")

    def _mark_dead_ducks(self) -> None:
        """Ducks that never answer are lost in the stats segment, and the log names them
        with what to check, as the C dataplane's does once its PINGs go unanswered."""
        newly = self.stats.ducks_dead(set(self.faults.dead_ducks))
        if newly:
            log.warning(
                "ducks lost: %d never answer (a fault): %s; check that that many ducks run "
                "(the topology names %d), on the port and address the topology gives each",
                len(newly),
                ", ".join(f"{d} (mock:{d})" for d in newly),
                self.cfg.ducks,
            )

    def _attach(self, peer: _Peer, msg: ctl.Attach) -> msgspec.Struct:
        rid = msg.req_id
        if msg.protocol != ctl.PROTOCOL_VERSION or msg.abi_major != ABI_MAJOR:
            return ctl.Error(
                req_id=rid,
                code=ErrorCode.ABI_MISMATCH,
                message=f"client speaks protocol {msg.protocol} / ABI {msg.abi_major}, "
                f"this dataplane {ctl.PROTOCOL_VERSION} / {ABI_MAJOR}",
            )
        if not peer.creds:
            raise _Refused(
                ErrorCode.NOT_PERMITTED,
                "shared memory needs a local peer: attach over ipc://, not tcp://",
            )
        if msg.pid != peer.pid:
            raise _Refused(
                ErrorCode.BAD_SEGMENT,
                f"Attach.pid {msg.pid} is not the sender's pid {peer.pid}: attach your own segment",
            )
        if peer.identity in self.clients:
            return ctl.Error(
                req_id=rid, code=ErrorCode.ALREADY_ATTACHED, message="this socket is attached"
            )
        refused = self._attach_refusal(peer)
        if refused:
            if refused.quota:
                self.counters["quota_refused"] += 1
            return ctl.Error(req_id=rid, code=refused.code, message=refused.message)
        # the process that connected, from the connection: its pid may be another
        # process's by now (the connection handed on, the connector gone)
        try:
            pidfd = host.peer_pidfd(peer.srcfd, peer.uid, peer.gid, peer.pid)
        except host.PeerGone as e:
            self.counters["peers_gone"] += 1
            raise _Refused(ErrorCode.NOT_PERMITTED, str(e)) from e
        try:
            return self._attach_from(peer, msg, pidfd)
        finally:
            os.close(pidfd)

    def _attach_refusal(self, peer: _Peer) -> rules.Refusal | None:
        """Why peer may not take a client slot, by the C dataplane's rule (dp_attach_admit)."""
        cfg, clients = self.cfg, list(self.clients.values())
        return rules.attach_refusal(
            pid=peer.pid,
            uid=peer.uid,
            admin=peer.admin,
            taken=len(clients),
            of_pid=sum(1 for c in clients if c.pid == peer.pid),
            of_uid=sum(1 for c in clients if c.uid == peer.uid),
            not_admin=sum(1 for c in clients if c.uid != self._euid),
            client_max_per_pid=cfg.client_max_per_pid,
            client_max_per_uid=cfg.client_max_per_uid,
            admin_reserved_clients=cfg.admin_reserved_clients,
        )

    def _attach_from(self, peer: _Peer, msg: ctl.Attach, pidfd: int) -> msgspec.Struct:
        """Attach, the segment taken from the process behind pidfd (the one that connected)."""
        rid, cfg = msg.req_id, self.cfg
        try:  # the file first: a second attach of one memfd is refused before it is mapped
            held = host.pidfd_getfd(pidfd, peer.pid, msg.segment_fd, "segment")
            try:
                st = os.fstat(held)
            finally:
                os.close(held)
        except (OSError, DuckpipeError):
            st = None  # open_fd says why
        twin = next(
            (
                c
                for c in self.clients.values()
                if st is not None
                and st.st_uid == peer.uid  # of another user's file nothing is said
                and (c.seg.st_dev, c.seg.st_ino) == (st.st_dev, st.st_ino)
            ),
            None,
        )
        if twin is not None:
            return ctl.Error(
                req_id=rid,
                code=ErrorCode.BAD_SEGMENT,
                message=f"memfd {twin.seg.name} is already attached (client {twin.id})",
            )
        try:
            seg = Segment.open_fd(
                peer.pid,
                msg.segment_fd,
                uid=peer.uid,
                max_slots=cfg.client_max_slots,
                max_bytes=cfg.client_max_segment_bytes,
                pidfd=pidfd,
            )
        except DuckpipeError as e:
            return ctl.Error(req_id=rid, code=ErrorCode.BAD_SEGMENT, message=str(e))
        if int(seg.header.creator_pid) != peer.pid:
            seg.close()
            return ctl.Error(
                req_id=rid, code=ErrorCode.BAD_SEGMENT, message="segment was made by another pid"
            )
        start_ticks = host.process_start_ticks(peer.pid)
        if start_ticks is None or host.pidfd_exited(pidfd):  # else: another's ticks
            seg.close()
            return ctl.Error(
                req_id=rid,
                code=ErrorCode.BAD_SEGMENT,
                message=f"cannot read /proc/{peer.pid}/stat: is the client alive?",
            )
        cid = self._next_client
        self._next_client += 1
        seg.header.dataplane_pid = os.getpid()
        seg.header.client_id = cid
        seg.header.dataplane_heartbeat_ns = host.monotonic_ns()
        layout = ffi.new(
            "struct dp_client_layout *",
            {
                "slot_count": seg.slot_count,
                "ring_capacity": seg.ring_capacity,
                "act_slot_size": seg.act_slot_size,
                "res_slot_size": seg.res_slot_size,
            },
        )
        client = _Client(
            cid, peer.identity, peer.pid, msg.name, seg, start_ticks, uid=peer.uid, layout=layout
        )
        client.indices[0] = client.indices[1] = lib.dp_load_acquire_u64(
            ffi.addressof(seg.ring, "tail")
        )
        self.clients[peer.identity] = client
        self.counters["clients_attached"] += 1
        self.stats.client_attached(
            cid,
            peer.pid,
            msg.name,
            seg.name,
            int(seg.header.page_size),
            seg.ring_capacity,
            seg.slot_count,
        )
        return ctl.Attached(
            req_id=rid,
            client_id=cid,
            epoch=self.epoch,
            session=self.session,
            dataplane_pid=os.getpid(),
            mode="mock",
            ducks=self.cfg.ducks,
            default_timeout_us=int(self._check.limits.default_timeout_us),
            max_forward_bytes=self.cfg.max_forward_bytes,
            max_timeout_us=int(self._check.limits.max_timeout_us),
        )

    def _load_weights(
        self, peer: _Peer, me: _Client | None, msg: ctl.LoadWeights
    ) -> msgspec.Struct:
        cfg = self.cfg
        if me is None:
            raise _Refused(ErrorCode.NOT_ATTACHED, "LoadWeights needs an attached client")
        if msg.shared and not peer.admin:
            raise _Refused(
                ErrorCode.NOT_PERMITTED,
                "a shared layer needs the admin role (the dataplane's user)",
            )
        # the C dataplane's rules (dp_ctl_rules.h), in its order: every bound before
        # anything is made, who holds the ducks and the layer, the quota, the MoE plan
        req = rules.load_request(msg)
        _refuse(
            rules.load_refusal(
                req, max_hidden=cfg.max_hidden, max_ffn=cfg.max_ffn, topology=self._topology
            )
        )
        dead = [d for d in msg.ducks if d in self.faults.dead_ducks]
        if dead:  # the dataplane knows they are dead: nothing is sent (as dp_control_requests.c)
            raise _Refused(
                ErrorCode.DUCKS_UNREACHABLE,
                f"ducks [{', '.join(map(str, dead))}] did not answer the dataplane's last 3 "
                "pings: nothing was sent; start them, or load the layer onto ducks that answer "
                "(ducks=[...])",
            )
        prev = self.layers.get(msg.layer)
        if prev is not None and prev.owner != me.id:
            raise _Refused(ErrorCode.NOT_PERMITTED, f"layer {msg.layer} belongs to another client")
        weight_bytes = rules.plan_bytes(req)
        mine = [la for la in self.layers.values() if la.owner == me.id and la is not prev]
        over = rules.quota_refusal(
            req,
            nlayers=len(mine),
            held=sum(la.weight_bytes for la in mine),
            retired=0,  # one thread: a replaced or unloaded layer is freed at once
            max_layers=cfg.client_max_layers,
            max_bytes=cfg.client_max_weight_bytes,
            weight_bytes=weight_bytes,
        )
        if over:
            self.counters["quota_refused"] += 1
            _refuse(over)
        moe_plan = moe.plan_of(msg, req)  # refuses a bad placement or bank plan
        item = numpy_dtype(msg.dtype).itemsize
        raw = _bank_buffers(msg, moe_plan, msg.ducks)
        if msg.has_b_down:
            raw[ctl.HOST_TENSOR_DUCK, B_DOWN_TENSOR] = np.zeros(msg.hidden * item, np.uint8)
        received = dict.fromkeys(raw, 0)
        if prev is not None:  # replaced, and freed at once (one thread: nothing holds it)
            self.counters["layers_freed"] += 1
        self.layers[msg.layer] = _Layer(msg, me.id, weight_bytes, raw, received, moe=moe_plan)
        return ctl.Ack(req_id=msg.req_id)

    def _repair_layer(self, me: _Client | None, msg: ctl.RepairLayer) -> msgspec.Struct:
        """Open a repair of the ducks that lost a committed layer, as dp_control_requests.c
        does: its chunks for them are taken from now on, and its commit closes it."""
        layer = self.layers.get(msg.layer)
        if me is None:
            raise _Refused(ErrorCode.NOT_ATTACHED, "RepairLayer needs an attached client")
        if layer is None:
            raise _Refused(ErrorCode.UNKNOWN_LAYER, f"layer {msg.layer} is not loaded")
        if layer.owner != me.id:
            raise _Refused(
                ErrorCode.NOT_PERMITTED,
                f"layer {msg.layer} belongs to another client: its owner repairs it",
            )
        if layer.failed or not layer.ready:
            state = "failed" if layer.failed else "still loading"
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is {state}: load it (LoadWeights), a repair restores only "
                "a committed layer's lost ducks",
            )
        if layer.repair:
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is being repaired already: commit that repair first",
            )
        if layer.moving is not None:
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is being moved to a new placement: repair it after the "
                "move's commit",
            )
        seen: set[int] = set()
        for d in msg.ducks:
            why = (
                "is not one of its ducks"
                if d not in layer.info.ducks
                else "is named twice"
                if d in seen
                else "did not lose it (LayerInfo.lost)"
                if d not in layer.lost
                else None
            )
            if why:
                raise _Refused(ErrorCode.BAD_REQUEST, f"layer {msg.layer}: duck {d} {why}")
            seen.add(d)
        dead = [d for d in msg.ducks if d in self.faults.dead_ducks]
        if dead:
            raise _Refused(
                ErrorCode.DUCKS_UNREACHABLE,
                f"ducks [{', '.join(map(str, dead))}] did not answer the dataplane's last 3 "
                "pings: nothing was sent; start them, or load the layer onto ducks that answer "
                "(ducks=[...])",
            )
        fresh = _bank_buffers(layer.info, layer.moe, seen)
        layer.raw.update(fresh)
        layer.received.update(dict.fromkeys(fresh, 0))
        layer.repair = seen
        layer.repair_failed = set()
        return ctl.Ack(req_id=msg.req_id)

    def _move_layer(self, me: _Client | None, msg: ctl.MoveLayer) -> msgspec.Struct:
        """Open a move of a committed MOE layer to a new placement (docs/architecture.md,
        "Moving a live layer"): the layer as it will be is built beside the serving one,
        expecting chunks for the ducks whose experts change only; its commit swaps it in."""
        layer = self.layers.get(msg.layer)
        if me is None:
            raise _Refused(ErrorCode.NOT_ATTACHED, "MoveLayer needs an attached client")
        if layer is None:
            raise _Refused(ErrorCode.UNKNOWN_LAYER, f"layer {msg.layer} is not loaded")
        if layer.owner != me.id:
            raise _Refused(
                ErrorCode.NOT_PERMITTED,
                f"layer {msg.layer} belongs to another client: only its owner moves it to a "
                "new placement",
            )
        if layer.moe is None:
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is dense: a move places a MOE layer's experts anew",
            )
        if layer.failed or not layer.ready:
            state = "failed" if layer.failed else "still loading"
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is {state}: a move places a committed layer anew; load it "
                "(LoadWeights) with the placement instead",
            )
        if layer.repair:
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is being repaired: a move waits for the repair's commit; "
                "move it after",
            )
        if layer.moving is not None:
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is being moved already: commit that move first",
            )
        if layer.lost or layer.forgot & set(layer.info.ducks):
            lost = sorted(layer.lost) or sorted(layer.forgot)
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer} is lost on ducks {lost}: repair it (Client.repair) before "
                "moving it",
            )
        old = layer.info
        new = msgspec.structs.replace(
            old,
            shard_sizes=list(msg.shard_sizes),
            ffn=sum(msg.shard_sizes),
            expert_replicas=list(msg.expert_replicas),
            expert_ducks=list(msg.expert_ducks),
        )
        req = rules.load_request(new)
        _refuse(
            rules.load_refusal(
                req,
                max_hidden=self.cfg.max_hidden,
                max_ffn=self.cfg.max_ffn,
                topology=self._topology,
            )
        )
        plan = moe.plan_of(new, req)  # refuses a bad placement or bank plan
        assert plan is not None and layer.moe is not None
        if plan.shared_ducks != layer.moe.shared_ducks or any(
            f - plan.n_local[d] * plan.expert_ffn != g - layer.moe.n_local[d] * plan.expert_ffn
            for d, f, g in zip(old.ducks, new.shard_sizes, old.shard_sizes, strict=True)
        ):
            raise _Refused(
                ErrorCode.BAD_REQUEST,
                f"layer {msg.layer}: a move keeps the shared expert's ducks and each one's "
                "shared columns; load the layer anew (LoadWeights) to change them",
            )
        changed = {d for d in old.ducks if _experts_of(plan, d) != _experts_of(layer.moe, d)}
        changed |= layer.tainted
        if msg.ducks:
            named = set(msg.ducks)
            for d in msg.ducks:
                if d not in old.ducks:
                    raise _Refused(
                        ErrorCode.BAD_REQUEST,
                        f"layer {msg.layer}: duck {d} is not one of its ducks",
                    )
            for d in sorted(changed - named):
                why = (
                    "a failed move left it a stale one"
                    if d in layer.tainted
                    else "its experts change"
                )
                raise _Refused(
                    ErrorCode.BAD_REQUEST,
                    f"layer {msg.layer}: the move must send duck {d} a bank ({why})",
                )
            changed = named
        dead = sorted(changed & set(self.faults.dead_ducks))
        if dead:
            raise _Refused(
                ErrorCode.DUCKS_UNREACHABLE,
                f"ducks [{', '.join(map(str, dead))}] did not answer the dataplane's last 3 "
                "pings: nothing was sent; move the layer once they answer, or to a placement "
                "that leaves their experts as they are",
            )
        raw = _bank_buffers(new, plan, changed)
        received = dict.fromkeys(raw, 0)
        # ready, with the changed ducks as its open "repair": the descriptor check takes
        # chunks for them alone, sized by their new banks (dp_desc_check.h)
        layer.moving = _Layer(
            new,
            layer.owner,
            rules.plan_bytes(req),
            raw,
            received,
            moe=plan,
            ready=True,
            repair=changed,
        )
        return ctl.Ack(req_id=msg.req_id)

    def _move_commit(self, layer: _Layer, layer_id: int) -> None:
        """A commit on a layer being moved: the new placement serves every forward
        dispatched from now on. The mock computes a forward at its dispatch, so none is in
        flight on the old banks here; they go with the old layer."""
        to = layer.moving
        assert to is not None
        layer.moving = None
        layer.tainted |= to.repair  # if it fails (the C dataplane's dp_layer_settle_move)
        short = [(k, to.received[k], b.size) for k, b in to.raw.items()]
        short = [x for x in short if x[1] != x[2]]
        if to.repair_failed:
            raise _CompletedAs(
                Status.DATAPLANE_ERROR,
                f"move of layer {layer_id} failed: duck {min(to.repair_failed)} did not "
                f"acknowledge its new bank within {config_default('weight_timeout_ms')} ms; "
                "the layer serves on its old placement (move it again once the duck answers)",
            )
        if short:
            (duck, t), got, want = short[0]
            raise DuckpipeError(
                f"move of layer {layer_id} incomplete: duck {duck} tensor {t} got {got} of "
                f"{want} bytes; the layer serves on its old placement"
            )
        changed = to.repair
        self._make_banks(to, changed)
        to.raw.clear()
        to.tensors = {**layer.tensors, **to.tensors}  # the unchanged ducks' banks stay
        to.b_down = layer.b_down
        to.repair = set()
        to.forgot = layer.forgot - changed  # a new bank was announced to the changed ducks
        self.layers[layer_id] = to
        self.counters["layers_moved"] += 1

    def _usable_layer(self, client: _Client, layer_id: int, write: bool = False) -> _Layer | None:
        """The layer if this client may use it: its own, or a shared one to forward on
        (weights only its owner writes)."""
        layer = self.layers.get(layer_id)
        if layer is None or (layer.owner != client.id and (write or not layer.info.shared)):
            return None
        return layer

    def _drop_layer(self, layer_id: int) -> None:
        # one thread: nothing in flight holds it (deferred completions carry their results)
        if self.layers.pop(layer_id, None) is not None:
            self.counters["layers_freed"] += 1

    def _drop_layers_of(self, client: _Client) -> None:
        for lid in [k for k, la in self.layers.items() if la.owner == client.id]:
            self._drop_layer(lid)

    # --- the data path -------------------------------------------------------------

    def _drain(self, client: _Client, quota: int) -> int:
        room = min(BURST, quota - client.inflight)
        seg = client.seg
        if room <= 0:
            if lib.dp_load_acquire_u64(ffi.addressof(seg.ring, "head")) != client.indices[0]:
                self.counters["client_quota_waits"] += 1  # its descriptors wait in its ring
            return 0
        idx = client.indices
        n = lib.dp_ring_consume(
            seg.ring, seg.descs, seg.ring_capacity, idx, idx + 1, self._descs, room
        )
        if n < 0:
            self._evict(client, DetachReason.RING_BROKEN)
            return 0
        for k in range(n):
            self._execute(client, self._descs + k)
        return n

    def _evict(self, client: _Client, reason: DetachReason) -> None:
        """The client broke its ring: stop reading it and say why in its header."""
        log.warning("client %d (pid %d) detached: %s", client.id, client.pid, reason.name)
        client.seg.header.detach_reason = int(reason)
        del self.clients[client.identity]
        self._retire(client)
        self.counters["clients_evicted"] += 1

    def _retire(self, client: _Client) -> None:
        """A client left the ring table: unmap its segment once every forward it submitted
        has completed (as the C dataplane does: each one still gets its completion)."""
        client.closing = True
        self.stats.client_gone(client.id)
        if client.inflight == 0:
            client.seg.close()

    def _execute(self, client: _Client, d) -> None:
        """Act on descriptor d (a struct dp_desc *, our own copy) as dp_dispatch.c does."""
        pickup = host.monotonic_ns()
        client.submitted += 1
        self.counters["descriptors"] += 1
        fields = {
            "forward_id": int(d.forward_id),
            "slot": int(d.slot),
            "generation": int(d.generation),
            "epoch": int(d.epoch),
            "nbytes": 0,
        }
        op = int(d.op)
        try:
            # a stale epoch's completion is published in its slot: only a slot that exists
            # (one that does not is the check's to refuse, as the dispatcher does)
            if fields["epoch"] != self.epoch and fields["slot"] < client.layout.slot_count:
                self.counters["stale_epoch"] += 1
                self._finish(
                    client,
                    fields,
                    Status.STALE_EPOCH,
                    message=f"epoch {fields['epoch']} is stale; now {self.epoch}",
                )
                return
            # weights only their owner writes; forwards may use a shared layer
            layer = self._usable_layer(client, int(d.layer), write=op != Op.FORWARD)
            if op == Op.WEIGHT_CHUNK and layer is not None and layer.moving is not None:
                layer = layer.moving  # a move's chunk: checked against the new banks
            plan = self._check(client.layout, layer, d, foreign=int(d.layer) in self.layers)
            if op == Op.FORWARD:
                assert layer is not None  # the check refuses a forward on no layer
                self._forward(client, d, layer, plan, fields, pickup)
            elif op == Op.WEIGHT_CHUNK:
                unacked = self._weight_chunk(client, d, layer, plan)
                if unacked:  # a dead duck: the C dataplane's worker gives up at the deadline
                    self._finish(client, fields, Status.DATAPLANE_ERROR, message=unacked)
                else:
                    fields["_bytes_in"] = int(plan.bytes)
                    self._finish(client, fields, Status.OK)
            else:  # Op.WEIGHT_COMMIT: the check lets no other op through
                self._commit(layer, int(d.layer))
                self._finish(client, fields, Status.OK)
        except _CompletedAs as e:
            self._finish(client, fields, e.status, message=str(e))
        except DuckpipeError as e:
            self._refuse(client, fields, str(e))
        except Exception as e:  # a bug here must cost one forward, never the dataplane
            log.exception("forward %d failed", fields["forward_id"])
            self.counters["dataplane_errors"] += 1
            self._finish(client, fields, Status.DATAPLANE_ERROR, message=f"{type(e).__name__}: {e}")

    def _refuse(self, client: _Client, fields: dict, message: str) -> None:
        self.counters["bad_requests"] += 1
        self._finish(client, fields, Status.BAD_REQUEST, message=message)

    def _forward(self, client: _Client, d, layer: _Layer, plan, fields: dict, pickup: int) -> None:
        """Compute a forward that passed the check: the plan says its bytes, ducks, deadline."""
        info = layer.info
        shape = tuple(int(d.shape[k]) for k in range(int(d.ndim)))
        npdt = numpy_dtype(info.dtype)
        nbytes = int(plan.bytes)
        targets = _bitmap_ducks(plan.targets)
        timeout_us = int(plan.timeout_us)
        routed = None
        if layer.moe is not None:  # dp_desc_check let through only a ROUTED forward
            try:
                routed = self._routed(client, d, layer, plan, shape)  # or refused here
            except moe.NoLiveReplica as e:  # known lost: now, not at the deadline
                self.counters["moe_no_live_replica"] += 1
                self._finish(client, fields, Status.DUCK_LOST, message=str(e))
                return
            targets = routed.targets

        gone = [t for t in targets if t in layer.lost]
        if gone:  # known lost: failed at dispatch, asked of nobody (dp_dispatch.c)
            self.counters["duck_lost"] += 1
            self._finish(client, fields, Status.DUCK_LOST, message=_lost_message(layer, gone))
            return
        faults = self.faults
        self.counters["forwards"] += 1
        if faults.crash_after is not None and self.counters["forwards"] > faults.crash_after:
            log.warning("fault injection: crashing on forward %d", fields["forward_id"])
            os.kill(os.getpid(), signal.SIGKILL)

        x = client.seg.act_view(fields["slot"], shape, npdt)
        silent = frozenset(faults.silent_ducks)  # not known lost: asked, never answering
        gone_now = set(faults.dead_ducks) | silent
        forgot = [t for t in targets if t in layer.forgot and t not in gone_now]
        answered = [t for t in targets if t not in gone_now and t not in forgot]
        missing = [t for t in targets if t in gone_now or t in forgot]
        # a routed forward's silent ducks fail over to other replicas (dp_moe_failover):
        # the ducks computing are then the answered ones and their replacements
        # ... and so do those that answer NO_LAYER (restarted): as the C's, at once
        computed, failed_over, stuck = routed, [], []
        gone_in_fwd = silent | frozenset(forgot)
        if routed is not None and gone_in_fwd & set(targets):
            lost = frozenset(faults.dead_ducks) | frozenset(layer.lost)
            computed, failed_over, stuck = moe.failover(
                layer.moe, routed, gone_in_fwd, lost, info.shard_sizes
            )
            self.counters["moe_failovers"] += len(failed_over)
        extra = (
            []
            if computed is None or stuck
            # ... and the stand-ins that compute a silent shared-set duck's columns
            else sorted(
                (set(np.unique(computed.duck[computed.duck >= 0]).tolist()) | computed.shared)
                - set(targets)
            )
        )
        acc = np.zeros(shape, np.float32)
        compute = []
        sent = host.monotonic_ns()  # the mock's "first send": its ducks start computing
        t_wait = time.perf_counter_ns()
        for duck in answered + extra:
            t0 = time.perf_counter_ns()
            if computed is None:
                partial = duck_partial(info.kind, x, layer.tensors[duck])
            else:
                partial = moe.duck_partial(layer.moe, computed, duck, layer.tensors[duck], x)
            if duck in extra:  # a replacement's failover reply: not in answered
                acc += partial.astype(npdt).astype(np.float32) if npdt.itemsize == 2 else partial
                continue
            compute.append(time.perf_counter_ns() - t0)
            self._beat()  # a prefill's ducks take seconds in numpy on a loaded machine
            if npdt.itemsize == 2:  # a duck sends its partial in the layer's dtype (RNE)
                partial = partial.astype(npdt).astype(np.float32)
            acc += partial
        t_reduce = time.perf_counter_ns()
        if layer.b_down is not None:
            acc += layer.b_down
        unanswered = [m for m in missing if m not in failed_over]  # their rows went nowhere
        if not unanswered:
            np.copyto(client.seg.res_view(fields["slot"], shape, npdt), acc, casting="same_kind")
        t_end = time.perf_counter_ns()
        fields["nbytes"] = nbytes
        fields["_pickup_ns"] = pickup
        fields["_sent_ns"] = sent
        fields["_bytes_in"] = nbytes
        for duck, ns in zip(answered, compute, strict=True):
            self.stats.duck_reply(duck, ns)
            if routed is not None:
                self.stats.duck_moe(duck, *moe.duck_rows(layer.moe, routed, duck))
        for duck in missing:
            if duck in failed_over:
                self.stats.duck_failed_over(duck)
            else:
                self.stats.duck_missed(duck, 1)  # the mock counts one chunk per missed partial
        if routed is not None and targets:  # one no duck was asked for completes at dispatch
            entries = {t: moe.duck_rows(layer.moe, routed, t)[1] for t in targets}
            self.stats.moe_forward(int(d.layer), layer.moe, routed.indices, entries)
        timings = ctl.Timings(
            prepare_ns=self._client_prepare(client, int(d.submit_ns), pickup),
            spread_ns=max(compute) - min(compute) if compute else 0,
            wait_ns=t_reduce - t_wait,
            reduce_ns=0 if unanswered else t_end - t_reduce,  # as the C: nothing is stored
            duck_compute_ns=compute,
        )
        if forgot:  # they said NO_LAYER: lost from now on (LayerInfo.lost)
            self.counters["no_layer_replies"] += len(forgot)
            layer.forgot -= set(forgot)
            layer.lost |= set(forgot)
        if forgot and not (failed_over and not stuck):  # their rows went nowhere
            self.counters["duck_lost"] += 1
            why = _lost_message(layer, forgot)
            self._finish(client, fields, Status.DUCK_LOST, answered, missing, timings, why)
        elif unanswered:
            self.counters["timeouts"] += 1
            due = pickup / 1e9 + timeout_us / 1e6  # a real dataplane gives up at the deadline
            why = f"no reply from ducks {missing} within {timeout_us / 1000:g} ms"
            if layer.moe is not None:  # as the C dataplane: each duck with its experts
                why += ": " + "; ".join(f"{layer.moe.describe(m)} did not answer" for m in missing)
            self._finish(client, fields, Status.TIMEOUT, answered, missing, timings, why, due=due)
        elif failed_over:  # as the C dataplane: at the failover deadline, the silent missing
            self.counters["forwards_ok"] += 1
            late = silent & set(failed_over)  # a NO_LAYER fails over at once
            due = pickup / 1e9 + (config_default("failover_ms") / 1e3 if late else 0)
            self._finish(client, fields, Status.OK, answered, missing, timings, due=due)
        else:
            self.counters["forwards_ok"] += 1
            self._finish(client, fields, Status.OK, answered, [], timings)

    def _client_prepare(self, client: _Client, submit: int, pickup: int) -> int:
        """The client's own prepare_ns from its submit stamp, as dp_fwd_client_prepare: 0
        and counted when the stamp is after pickup or before the client attached."""
        if not submit:
            return 0
        if submit > pickup or submit < client.attach_ns:
            self.counters["client_clock_implausible"] += 1
            return 0
        return pickup - submit

    def _routed(self, client: _Client, d, layer: _Layer, desc_plan, shape) -> moe.Routed:
        """A ROUTED forward's routing out of its slot, copied once and checked by the C
        dispatcher's own dp_desc_routing_copy, and its NIC part's send mode counted
        (DuckpipeError: refused, in the C dispatcher's words)."""
        slot = client.seg.act_bytes(int(d.slot))
        nbytes = int(desc_plan.bytes)
        plan = layer.moe
        table = moe.copy_routing(client.layout, self._check.limits, desc_plan, slot, plan)
        # known lost: the ducks the stats segment says are (the dead_ducks fault: the
        # mock has no PING to wait on, so they are lost at once), and those that said
        # NO_LAYER (restarted), until a repair
        restarted = frozenset(layer.lost)
        lost = frozenset(self.faults.dead_ducks) | restarted
        routed = moe.read_routing(table, shape[0], plan, lost, int(d.forward_id), restarted)
        self.counters["moe_forwards"] += 1
        self.counters["moe_rows_rerouted"] += routed.rerouted
        if not routed.targets:  # every choice -1, no shared expert: zeros, nothing sent
            self.counters["moe_no_duck_forwards"] += 1
            return routed
        mode, sent = moe.send_mode(int(d.flags), plan, routed, nbytes, nbytes // shape[0])
        self.counters["moe_broadcasts" if mode == "broadcast" else "moe_unicasts"] += 1
        self.counters["moe_bytes"] += sent
        return routed

    def _weight_chunk(self, client: _Client, d, layer: _Layer, plan) -> str:
        """Take in a chunk that passed the check; the reason it failed ("" when it did not)."""
        key = (int(d.duck), int(d.tensor))
        buf = layer.raw[key]  # the check found this duck's tensor (or b_down) in the layer
        off, n = int(d.offset), int(plan.bytes)
        if off != layer.received[key]:  # once, in order: the commit's count then proves it all
            raise DuckpipeError(
                f"layer {int(d.layer)} duck {key[0]} tensor {key[1]}: chunk at byte {off}, but "
                f"the next byte due is {layer.received[key]} (send each tensor once, in order)"
            )
        layer.received[key] += n  # the C dataplane counts it due once dispatched, too
        if key[0] in self.faults.dead_ducks:
            if layer.ready:  # a repair's chunk: that duck's repair fails, not the layer
                layer.repair_failed.add(key[0])
            else:
                layer.failed = True
                layer.missing.add(key[0])
            return (
                f"duck {key[0]} did not acknowledge layer {int(d.layer)} tensor {key[1]} "
                f"within {config_default('weight_timeout_ms')} ms"
            )
        buf[off : off + n] = client.seg.act_bytes(int(d.slot))[:n]
        self.counters["weight_chunks"] += 1
        self.counters["weight_bytes"] += n
        if layer.ready and layer.moe is not None and layer is not self.layers.get(int(d.layer)):
            self.counters["move_bytes"] += n  # the moving layer's (_move_layer)
        elif layer.ready:
            self.counters["repair_bytes"] += n
        return ""

    def _commit(self, layer: _Layer | None, layer_id: int) -> None:
        if layer is None:
            foreign = layer_id in self.layers  # as its chunks and forwards are refused
            raise DuckpipeError(
                f"layer {layer_id} belongs to another client"
                if foreign
                else f"layer {layer_id} is not being loaded"
            )
        if layer.moving is not None:
            self._move_commit(layer, layer_id)
            return
        if layer.ready:
            self._repair_commit(layer, layer_id)
            return
        if layer.failed:
            missing = ", ".join(str(d) for d in sorted(layer.missing))
            raise DuckpipeError(
                f"layer {layer_id} failed: ducks [{missing}] did not acknowledge their weights; "
                "load it again"
            )
        short = [
            (k, layer.received[k], b.size)
            for k, b in layer.raw.items()
            if layer.received[k] != b.size
        ]
        if short:
            layer.failed = True  # failed, not loading for ever: Layers says so until a reload
            (duck, t), got, want = short[0]
            raise DuckpipeError(
                f"layer {layer_id} incomplete: duck {duck} tensor {t} got {got} of {want} bytes"
            )
        self._make_banks(layer, set(layer.info.ducks))
        info = layer.info
        npdt = numpy_dtype(info.dtype)
        if info.has_b_down:
            layer.b_down = (
                layer.raw[ctl.HOST_TENSOR_DUCK, B_DOWN_TENSOR].view(npdt).astype(np.float32)
            )
        layer.raw.clear()
        layer.ready = True
        self.counters["layers_loaded"] += 1

    def _repair_commit(self, layer: _Layer, layer_id: int) -> None:
        """A commit on a committed layer closes its repair, as dp_dispatch.c does: the
        repaired ducks leave ``lost`` when every byte of theirs is in, else stay lost."""
        if not layer.repair:
            raise DuckpipeError(
                f"layer {layer_id} is loaded and no repair of it is open: nothing to commit"
            )
        ducks, failed = layer.repair, layer.repair_failed
        layer.repair, layer.repair_failed = set(), set()
        short = [(k, layer.received[k], b.size) for k, b in layer.raw.items()]
        short = [s for s in short if s[1] != s[2]]
        if failed:
            layer.raw.clear()
            raise _CompletedAs(
                Status.DATAPLANE_ERROR,
                f"repair of layer {layer_id} failed: duck {min(failed)} did not acknowledge its "
                f"bank within {config_default('weight_timeout_ms')} ms; it stays lost (repair "
                "again once it answers)",
            )
        if short:
            layer.raw.clear()
            (duck, t), got, want = short[0]
            raise DuckpipeError(
                f"repair of layer {layer_id} incomplete: duck {duck} tensor {t} got {got} of "
                f"{want} bytes; it stays lost"
            )
        self._make_banks(layer, ducks)
        layer.raw.clear()
        layer.lost -= ducks
        self.counters["layers_repaired"] += 1

    def _make_banks(self, layer: _Layer, ducks: set[int]) -> None:
        """The float32 tensors ``ducks`` compute with, from the bytes that came in."""
        info = layer.info
        npdt = numpy_dtype(info.dtype)
        for duck, f in zip(info.ducks, info.shard_sizes, strict=True):
            if duck not in ducks:
                continue
            self._beat()  # a big layer's ducks take seconds of numpy on a loaded machine
            shapes = _tensor_shapes(info.kind, info.hidden, f)
            if info.weight_dtype:  # FP8: dequantized as a duck does, block by block
                layer.tensors[duck] = [
                    _fp8_dequant(layer.raw[duck, t], s, t, _fp8_blocks(info, duck, layer.moe))
                    for t, s in enumerate(shapes)
                ]
                continue
            # float32 copies once, at load: what a duck holds is ready to compute with
            layer.tensors[duck] = [
                layer.raw[duck, t].view(npdt).reshape(s).astype(np.float32)
                for t, s in enumerate(shapes)
            ]

    def _finish(
        self,
        client: _Client,
        fields: dict,
        status: Status,
        answered=(),
        missing=(),
        timings: ctl.Timings | None = None,
        message: str = "",
        due: float | None = None,
    ) -> None:
        fields = dict(
            fields,
            status=int(status),
            answered=list(answered),
            missing=list(missing),
            timings=timings or ctl.Timings(),
            message=message,
        )
        delay = self.faults.delay_ms / 1000
        if due is None and delay:
            due = time.monotonic() + delay
        if due is not None:
            client.inflight += 1
            heapq.heappush(
                self._deferred,
                _Deferred(max(due, time.monotonic() + delay), next(self._seq), client, fields),
            )
            return
        self._complete(client, fields)

    def _run_deferred(self) -> int:
        n = 0
        now = time.monotonic()
        while self._deferred and self._deferred[0].due <= now:
            item = heapq.heappop(self._deferred)
            client = item.client
            client.inflight -= 1
            # a detached client still gets every completion it is owed, into the segment
            # it submitted from (not a newer one on the same socket)
            if item.fields["epoch"] != self.epoch and item.fields["status"] == Status.OK:
                item.fields["status"] = int(Status.STALE_EPOCH)  # the epoch moved in flight
            self._complete(client, item.fields)
            if client.closing and client.inflight == 0:
                client.seg.close()
            n += 1
        return n

    def _complete(self, client: _Client, f: dict) -> None:
        """Publish the done word (release) and then send the ZeroMQ completion."""
        slot = f["slot"]
        if slot < client.seg.slot_count:
            hdr = self._slot_value
            hdr.forward_id, hdr.epoch, hdr.nbytes = f["forward_id"], f["epoch"], f["nbytes"]
            hdr.answered, hdr.missing = len(f["answered"]), len(f["missing"])
            # line 1: this completion's timings as phases, as the C dataplane writes them
            phases = ctl.Phases.of(f["timings"])
            for name in ctl.Phases.__struct_fields__:  # SlotHeader's line-1 fields, by name
                setattr(hdr, name, getattr(phases, name))
            lib.dp_slot_publish(client.seg.slot_headers + slot, hdr, f["generation"], f["status"])
        client.completed += 1
        self._stats_completion(client, f)
        f = {k: v for k, v in f.items() if k not in _PRIVATE_FIELDS}
        self._deliver(client, ctl.encoder.encode(ctl.Completion(current_epoch=self.epoch, **f)))

    # --- the stats segment ----------------------------------------------------------

    def _stats_completion(self, client: _Client, f: dict) -> None:
        """A completion's bytes, status and (forwards) phase times into the segment, as
        the C dataplane counts them (dp_stats.c)."""
        ok = f["status"] == Status.OK
        forward = "_pickup_ns" in f
        self.stats.client_bytes(
            client.id,
            f.get("_bytes_in", 0) if ok or forward else 0,
            int(f.get("nbytes", 0)) if ok and forward else 0,
            not ok,
        )
        pickup = f.get("_pickup_ns")
        if pickup is None:
            return
        t: ctl.Timings = f["timings"]
        # the shared histograms take the dataplane's own clock only, never the client's
        # submit stamp (dp_stats.c): picked up -> completion, picked up -> "sent"
        self.stats.record("end_to_end", max(0, host.monotonic_ns() - pickup))
        self.stats.record("prepare", max(0, f["_sent_ns"] - pickup))
        for name in ("send", "wait", "fetch", "reduce"):
            self.stats.record(name, getattr(t, name + "_ns"))
        if len(f["answered"]) > 1:
            self.stats.record("reply_spread", t.spread_ns)

    def _stats_tick(self) -> None:
        self.stats.tick(self.counters, self.epoch)
        for client in self.clients.values():
            self.stats.client_update(
                client.id,
                head=int(lib.dp_load_acquire_u64(ffi.addressof(client.seg.ring, "head"))),
                tail=int(client.indices[0]),
                inflight=client.inflight,
                submits=client.submitted,
                completions=client.completed,
            )
        layers: dict[int, int] = {}
        for la in self.layers.values():
            if la.ready:
                for duck in la.info.ducks:
                    layers[duck] = layers.get(duck, 0) + 1
        self.stats.duck_layers(layers)
        self.stats.moe_tick(
            {lid: la.moe for lid, la in self.layers.items() if la.ready and la.moe is not None}
        )

    # --- housekeeping -------------------------------------------------------------

    def _beat(self) -> None:
        """Tell every client the dataplane lives, as the C dataplane's control thread does
        while its workers compute: the mock computes its ducks (a forward's, a layer's
        dequantization at commit) in its one loop, between housekeeping passes."""
        now = host.monotonic_ns()
        for client in self.clients.values():
            client.seg.header.dataplane_heartbeat_ns = now

    def _housekeeping(self) -> None:
        now = host.monotonic_ns()
        stale_ns = int(self.cfg.client_timeout_s * 1e9)
        for identity, client in list(self.clients.items()):
            hdr = client.seg.header
            hdr.dataplane_heartbeat_ns = now
            beat_age = now - int(hdr.client_heartbeat_ns)
            # a pid whose start time changed was reused: the client is gone
            alive = host.process_alive(client.pid) and (
                host.process_start_ticks(client.pid) == client.start_ticks
            )
            if alive and beat_age < stale_ns:
                continue
            log.warning(
                "client %d (pid %d) is gone; unmapping %s", client.id, client.pid, client.seg.name
            )
            del self.clients[identity]
            self._drop_layers_of(client)
            self._retire(client)  # a memfd needs no unlink: its memory goes with the mapping
            self.counters["clients_reclaimed"] += 1


def _prescan(buf: bytes, max_depth: int) -> str | None:
    """None when buf is one msgpack object whose declared lengths fit and whose nesting is
    at most max_depth, else why: the dataplane's own dp_msgpack_prescan (dp_msgpack_scan.h)."""
    why = ffi.new("char[256]")
    if lib.dp_msgpack_prescan(buf, len(buf), max_depth, why, 256) == 0:
        return None
    return text(why)


def _refuse(refused: rules.Refusal | None) -> None:
    """Raise a rule's refusal as the Error reply it stands for."""
    if refused is not None:
        raise _Refused(refused.code, refused.message)


def _need_admin(peer: _Peer, what: str) -> None:
    if not peer.admin:
        raise _Refused(ErrorCode.NOT_PERMITTED, f"{what} needs the admin role")


def _decode_error_code(e: msgspec.DecodeError) -> ErrorCode:
    """BAD_MESSAGE when it is not a map with a known 'type' (as the C decoder says), else
    BAD_REQUEST: a field is wrong."""
    text = str(e)
    if not isinstance(e, msgspec.ValidationError) or (
        "`$.type`" in text or "field `type`" in text or text.startswith("Expected `object`")
    ):
        return ErrorCode.BAD_MESSAGE
    return ErrorCode.BAD_REQUEST


def _decode_error(e: msgspec.DecodeError, raw: bytes) -> str:
    """msgspec's message, but for a string outside ctl.PRINTABLE_ASCII the C decoder's
    words (check_printable in dp_ctl_rt.h): the field, the first bad byte, what is allowed."""
    text = str(e)
    if f"matching regex {ctl.PRINTABLE_ASCII!r}" not in text or " - at `$." not in text:
        return text
    field = text.rsplit(" - at `$.", 1)[1].rstrip("`")
    try:
        obj = msgspec.msgpack.decode(raw)
        value = obj[field].encode()
    except Exception:
        return text
    i = next((k for k, b in enumerate(value) if not 0x20 <= b <= 0x7E), None)
    if i is None:
        return text
    return (
        f"{obj.get('type')}.{field} must be printable ASCII (0x20-0x7e): "
        f"byte {i} is 0x{value[i]:02x}"
    )


def _req_id(raw: bytes) -> int:
    """The req_id of a message that failed to decode, to echo; 0 when there is none."""
    try:
        obj = msgspec.msgpack.decode(raw)
    except Exception:
        return 0
    rid = obj.get("req_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, int) and 0 <= rid < 1 << 64 else 0


def _experts_of(plan: moe.MoePlan, duck: int) -> tuple[int, ...]:
    """The experts ``duck``'s bank holds under ``plan``, ascending: what decides whether a
    move gives it a new bank."""
    return tuple(e for e, held in enumerate(plan.ducks_of) if duck in held)


def _bank_buffers(spec, plan, ducks) -> dict[tuple[int, int], np.ndarray]:
    """Zeroed bytes for every tensor of ``ducks``' shards (a LoadWeights or LayerInfo
    ``spec``: kind, hidden, dtype, weight_dtype, ducks, shard_sizes; ``plan`` its MoE
    plan or None), by (duck, tensor), as the dataplane's books take them: FP8 tensors as
    e4m3 bytes and block scales (dp_fp8_tensor_bytes)."""
    item = numpy_dtype(spec.dtype).itemsize
    out = {}
    for duck, f in zip(spec.ducks, spec.shard_sizes, strict=True):
        if duck not in ducks:
            continue
        for t, shape in enumerate(_tensor_shapes(spec.kind, spec.hidden, f)):
            size = int(np.prod(shape)) * item
            if spec.weight_dtype:
                size = _fp8_tensor_bytes(spec, duck, plan)
            out[duck, t] = np.zeros(size, np.uint8)
    return out


def _lost_message(layer: _Layer, ducks: list[int]) -> str:
    """DUCK_LOST's words, as dp_fwd_lost_message writes them: the ducks (each with its
    experts on a MoE layer) that hold no such layer, and what to do."""
    lid = layer.info.layer
    if layer.moe is not None:
        who = "; ".join(layer.moe.describe(d) for d in ducks)
    else:
        who = f"duck {ducks[0]}" if len(ducks) == 1 else f"ducks [{', '.join(map(str, ducks))}]"
    verb = "holds" if len(ducks) == 1 else "hold"
    return f"{who} {verb} no layer {lid} (restarted?); repair it: client.repair({lid})"


def _bitmap_ducks(words) -> list[int]:
    out = []
    for w in range(MAX_DUCKS // 64):
        bits = int(words[w])
        while bits:
            low = bits & -bits
            out.append(w * 64 + low.bit_length() - 1)
            bits ^= low
    return out


def _someone_answers(zctx: zmq.Context, control: str) -> bool:
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(control)
        sock.send(ctl.encoder.encode(ctl.GetStats(req_id=1)))
        return bool(sock.poll(300))
    finally:
        sock.close()


def main_loop(cfg: MockConfig) -> int:
    """Run a mock dataplane until Shutdown, SIGINT or SIGTERM."""
    dp = MockDataplane(cfg)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: dp.stop())
    print(
        f"duckpipe mock dataplane: {cfg.ducks} ducks on {cfg.control} (pid {os.getpid()}, "
        f"idle {cfg.idle})",
        flush=True,
    )
    dp.serve()
    print("duckpipe mock dataplane: stopped", file=sys.stderr, flush=True)
    return 0
