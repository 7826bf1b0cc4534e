"""The shm-only mock dataplane: the real ring ABI and control protocol, no network.

It maps each attached client's segment, polls its ring, and does the ducks'
work itself: it holds every duck's weight shard, computes each targeted duck's
partial with numpy, sums them into the result slot (float32 accumulation),
publishes the slot's done word and sends the ZeroMQ completion, exactly as the
C dataplane does. Timings are real measurements of what the mock did: the
ducks' compute is sequential here, so ``wait_ns`` is their sum and
``send_ns``/``fetch_ns`` are zero (there is no network).

Fault knobs (``SetFaults`` or command-line flags): delay every completion,
ducks that never answer (their forwards complete TIMEOUT at the deadline,
naming them), and a crash (SIGKILL of itself) on the forward after N.
"""

from __future__ import annotations

import dataclasses
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

from .. import runtime
from .._native import lib
from ..errors import DuckpipeError
from ..idle import IdleStrategy
from ..models import duck_partial, numpy_dtype
from ..ring import SubmissionRing, new_descs
from ..schema import control as ctl
from ..schema.control import ErrorCode
from ..schema.abi import ABI_MAJOR, MAX_DUCKS, DType, MlpKind, Op, Status
from ..shm import Segment, clean_segments

__all__ = ["MockConfig", "MockDataplane", "main_loop"]

log = logging.getLogger("duckpipe.mock")

BURST = 32
HOUSEKEEPING_S = 0.05


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


@dataclasses.dataclass
class _Layer:
    info: ctl.LoadWeights
    raw: dict[tuple[int, int], np.ndarray]  # (duck, tensor) -> bytes being filled
    received: dict[tuple[int, int], int]
    tensors: dict[int, list[np.ndarray]] = dataclasses.field(default_factory=dict)  # ready shards
    b_down: np.ndarray | None = None
    ready: bool = False

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
            ready=self.ready,
        )


def _tensor_shapes(kind: int, hidden: int, f: int) -> list[tuple[int, ...]]:
    if kind == MlpKind.GELU:
        return [(hidden, f), (f,), (f, hidden)]
    return [(hidden, f), (hidden, f), (f, hidden)]


@dataclasses.dataclass(eq=False)
class _Client:
    id: int
    identity: bytes
    pid: int
    name: str
    seg: Segment
    ring: SubmissionRing
    start_ns: int
    submitted: int = 0
    completed: int = 0


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
        self.counters: dict[str, int] = {
            k: 0
            for k in (
                "control_messages",
                "bad_control_messages",
                "clients_attached",
                "clients_detached",
                "clients_reclaimed",
                "stale_segments_removed",
                "descriptors",
                "forwards",
                "forwards_ok",
                "timeouts",
                "stale_epoch",
                "bad_requests",
                "dataplane_errors",
                "weight_chunks",
                "weight_bytes",
                "layers_loaded",
            )
        }
        self.faults = ctl.SetFaults(
            req_id=0,
            delay_ms=cfg.delay_ms,
            dead_ducks=sorted(cfg.dead_ducks),
            crash_after=cfg.crash_after,
        )
        self._deferred: list[_Deferred] = []
        self._seq = itertools.count()
        self._next_client = 1
        self._running = True
        self._descs = new_descs(BURST)
        self._ctx = zmq.Context.instance()
        self.router = self._bind(cfg.control)
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
        try:
            sock.bind(control)
        except zmq.ZMQError as e:
            sock.close()
            raise DuckpipeError(f"cannot listen on {control}: {e}; is the address in use?") from e
        if control.startswith("ipc://"):
            os.chmod(control[len("ipc://") :], 0o600)
        return sock

    # --- main loop -------------------------------------------------------------

    def serve(self) -> None:
        for info in clean_segments():
            log.warning("removed %s left by dead pid %d", info.path, info.creator_pid)
            self.counters["stale_segments_removed"] += 1
        last_house = 0.0
        while self._running:
            work = self._poll_control()
            for client in list(self.clients.values()):
                work += self._drain(client)
            work += self._run_deferred()
            now = time.monotonic()
            if now - last_house >= HOUSEKEEPING_S:
                last_house = now
                self._housekeeping()
            self._idle.idle(work)
        self._teardown()

    def stop(self) -> None:
        self._running = False

    def _teardown(self) -> None:
        for client in self.clients.values():
            client.seg.close()  # the clients own and unlink their segments
        self.clients.clear()
        self.router.close(linger=0)
        if self.cfg.control.startswith("ipc://"):
            Path(self.cfg.control[len("ipc://") :]).unlink(missing_ok=True)

    # --- control -----------------------------------------------------------------

    def _poll_control(self) -> int:
        n = 0
        while n < 64:
            try:
                identity, raw = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:  # not two frames
                self.counters["bad_control_messages"] += 1
                continue
            n += 1
            self.counters["control_messages"] += 1
            try:
                msg = ctl.request_decoder.decode(raw)
            except msgspec.DecodeError as e:
                self.counters["bad_control_messages"] += 1
                self._send(identity, ctl.Error(req_id=0, code=ErrorCode.BAD_MESSAGE, message=str(e)))
                continue
            try:
                reply = self._handle(identity, msg)
            except DuckpipeError as e:
                reply = ctl.Error(req_id=msg.req_id, code=ErrorCode.BAD_REQUEST, message=str(e))
            if reply is not None:
                self._send(identity, reply)
        return n

    def _send(self, identity: bytes, msg: msgspec.Struct) -> None:
        try:
            self.router.send_multipart([identity, ctl.encoder.encode(msg)], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("control reply dropped: client queue full")

    def _handle(self, identity: bytes, msg: ctl.Request) -> msgspec.Struct | None:
        rid = msg.req_id
        match msg:
            case ctl.Attach():
                return self._attach(identity, msg)
            case ctl.Detach():
                client = self.clients.pop(identity, None)
                if client is not None:
                    client.seg.close()
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
                return ctl.Layers(req_id=rid, layers=[la.public() for la in self.layers.values()])
            case ctl.LoadWeights():
                return self._load_weights(msg)
            case ctl.SetEpoch():
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
                        ctl.ClientStats(
                            client_id=c.id,
                            pid=c.pid,
                            name=c.name,
                            segment=str(c.seg.path),
                            submitted=c.submitted,
                            completed=c.completed,
                        )
                        for c in self.clients.values()
                    ],
                )
            case ctl.SetFaults():
                bad = [d for d in msg.dead_ducks if d >= self.cfg.ducks]
                if bad:
                    raise DuckpipeError(f"ducks {bad} do not exist (there are {self.cfg.ducks})")
                self.faults = msg
                return ctl.Ack(req_id=rid)
            case ctl.Shutdown():
                self._running = False
                return ctl.Ack(req_id=rid)
        raise DuckpipeError(f"unhandled request {type(msg).__name__}")

    def _attach(self, identity: bytes, msg: ctl.Attach) -> msgspec.Struct:
        rid = msg.req_id
        if msg.protocol != ctl.PROTOCOL_VERSION or msg.abi_major != ABI_MAJOR:
            return ctl.Error(
                req_id=rid,
                code=ErrorCode.ABI_MISMATCH,
                message=f"client speaks protocol {msg.protocol} / ABI {msg.abi_major}, "
                f"this dataplane {ctl.PROTOCOL_VERSION} / {ABI_MAJOR}",
            )
        if identity in self.clients:
            return ctl.Error(req_id=rid, code=ErrorCode.ALREADY_ATTACHED, message="this socket is attached")
        try:
            seg = Segment.open(msg.segment)
        except DuckpipeError as e:
            return ctl.Error(req_id=rid, code=ErrorCode.BAD_SEGMENT, message=str(e))
        if int(seg.header.creator_pid) != msg.pid:
            seg.close()
            return ctl.Error(
                req_id=rid, code=ErrorCode.BAD_SEGMENT, message="segment was made by another pid"
            )
        cid = self._next_client
        self._next_client += 1
        seg.header.dataplane_pid = os.getpid()
        seg.header.client_id = cid
        seg.header.dataplane_heartbeat_ns = runtime.monotonic_ns()
        self.clients[identity] = _Client(
            cid, identity, msg.pid, msg.name, seg, SubmissionRing(seg), int(seg.header.start_ns)
        )
        self.counters["clients_attached"] += 1
        return ctl.Attached(
            req_id=rid,
            client_id=cid,
            epoch=self.epoch,
            session=self.session,
            dataplane_pid=os.getpid(),
            mode="mock",
            ducks=self.cfg.ducks,
            default_timeout_us=int(self.cfg.default_timeout_ms * 1000),
        )

    def _load_weights(self, msg: ctl.LoadWeights) -> msgspec.Struct:
        if len(msg.ducks) != len(msg.shard_sizes) or sum(msg.shard_sizes) != msg.ffn:
            raise DuckpipeError("shard_sizes must give one size per duck and sum to ffn")
        if len(set(msg.ducks)) != len(msg.ducks) or any(d >= self.cfg.ducks for d in msg.ducks):
            raise DuckpipeError(f"ducks {msg.ducks} must be distinct ids below {self.cfg.ducks}")
        item = numpy_dtype(msg.dtype).itemsize
        raw, received = {}, {}
        for duck, f in zip(msg.ducks, msg.shard_sizes, strict=True):
            for t, shape in enumerate(_tensor_shapes(msg.kind, msg.hidden, f)):
                raw[duck, t] = np.empty(int(np.prod(shape)) * item, np.uint8)
                received[duck, t] = 0
        if msg.has_b_down:
            raw[ctl.HOST_TENSOR_DUCK, 3] = np.empty(msg.hidden * item, np.uint8)
            received[ctl.HOST_TENSOR_DUCK, 3] = 0
        self.layers[msg.layer] = _Layer(msg, raw, received)
        return ctl.Ack(req_id=msg.req_id)

    # --- the data path -------------------------------------------------------------

    def _drain(self, client: _Client) -> int:
        n = client.ring.pop_burst(self._descs, BURST)
        for k in range(n):
            self._execute(client, self._descs[k])
        return n

    def _execute(self, client: _Client, d) -> None:
        pickup = runtime.monotonic_ns()
        client.submitted += 1
        self.counters["descriptors"] += 1
        fields = {
            "forward_id": int(d.forward_id),
            "slot": int(d.slot),
            "generation": int(d.generation),
            "epoch": int(d.epoch),
            "nbytes": 0,
        }
        if fields["slot"] >= client.seg.slot_count:
            self._refuse(client, fields, f"slot {fields['slot']} is out of range")
            return
        if fields["epoch"] != self.epoch:
            self.counters["stale_epoch"] += 1
            self._finish(
                client,
                fields,
                Status.STALE_EPOCH,
                message=f"epoch {fields['epoch']} is stale; now {self.epoch}",
            )
            return
        op = int(d.op)
        try:
            if op == Op.FORWARD:
                self._forward(client, d, fields, pickup)
            elif op == Op.WEIGHT_CHUNK:
                self._weight_chunk(client, d)
                self._finish(client, fields, Status.OK)
            elif op == Op.WEIGHT_COMMIT:
                self._commit(int(d.layer))
                self._finish(client, fields, Status.OK)
            else:
                raise DuckpipeError(f"unknown op {op}")
        except DuckpipeError as e:
            self._refuse(client, fields, str(e))
        except Exception as e:  # a bug here must cost one forward, never the dataplane
            log.exception("forward %d failed", fields["forward_id"])
            self.counters["dataplane_errors"] += 1
            self._finish(client, fields, Status.DATAPLANE_ERROR, message=f"{type(e).__name__}: {e}")

    def _refuse(self, client: _Client, fields: dict, message: str) -> None:
        self.counters["bad_requests"] += 1
        self._finish(client, fields, Status.BAD_REQUEST, message=message)

    def _forward(self, client: _Client, d, fields: dict, pickup: int) -> None:
        layer = self.layers.get(int(d.layer))
        if layer is None or not layer.ready:
            raise DuckpipeError(f"layer {int(d.layer)} is not loaded")
        info = layer.info
        ndim, dtype = int(d.ndim), int(d.dtype)
        if dtype not in (DType.F32, DType.F16) or dtype != info.dtype:
            raise DuckpipeError(f"dtype {dtype} does not match layer {info.layer} ({info.dtype})")
        if not 1 <= ndim <= 4:
            raise DuckpipeError(f"ndim {ndim} is out of range")
        shape = tuple(int(d.shape[k]) for k in range(ndim))
        npdt = numpy_dtype(dtype)
        nbytes = int(np.prod(shape)) * npdt.itemsize
        if 0 in shape or shape[-1] != info.hidden or nbytes != int(d.nbytes):
            raise DuckpipeError(
                f"shape {shape} does not fit layer {info.layer} (hidden {info.hidden})"
            )
        if nbytes > client.seg.act_slot_size or nbytes > client.seg.res_slot_size:
            raise DuckpipeError(f"{nbytes} bytes do not fit the slots")
        targets = _bitmap_ducks(d.ducks) or list(info.ducks)
        stray = sorted(set(targets) - set(info.ducks))
        if stray:
            raise DuckpipeError(f"ducks {stray} hold no shard of layer {info.layer}")

        faults = self.faults
        self.counters["forwards"] += 1
        if faults.crash_after is not None and self.counters["forwards"] > faults.crash_after:
            log.warning("fault injection: crashing on forward %d", fields["forward_id"])
            os.kill(os.getpid(), signal.SIGKILL)

        x = client.seg.act_view(fields["slot"], shape, npdt)
        answered = [t for t in targets if t not in faults.dead_ducks]
        missing = [t for t in targets if t in faults.dead_ducks]
        acc = np.zeros(shape, np.float32)
        compute = []
        t_wait = time.perf_counter_ns()
        for duck in answered:
            t0 = time.perf_counter_ns()
            partial = duck_partial(info.kind, x, layer.tensors[duck])
            compute.append(time.perf_counter_ns() - t0)
            acc += partial
        t_reduce = time.perf_counter_ns()
        if layer.b_down is not None:
            acc += layer.b_down
        if not missing:
            np.copyto(client.seg.res_view(fields["slot"], shape, npdt), acc, casting="same_kind")
        t_end = time.perf_counter_ns()
        fields["nbytes"] = nbytes
        timings = ctl.Timings(
            prepare_ns=max(0, pickup - int(d.submit_ns)),
            wait_ns=t_reduce - t_wait,
            reduce_ns=t_end - t_reduce,
            duck_compute_ns=compute,
        )
        timeout_us = int(d.timeout_us) or int(self.cfg.default_timeout_ms * 1000)
        if missing:
            self.counters["timeouts"] += 1
            due = pickup / 1e9 + timeout_us / 1e6  # a real dataplane gives up at the deadline
            self._finish(
                client,
                fields,
                Status.TIMEOUT,
                answered,
                missing,
                timings,
                f"no reply from ducks {missing} within {timeout_us / 1000:g} ms",
                due=due,
            )
        else:
            self.counters["forwards_ok"] += 1
            self._finish(client, fields, Status.OK, answered, [], timings)

    def _weight_chunk(self, client: _Client, d) -> None:
        layer = self.layers.get(int(d.layer))
        if layer is None or layer.ready:
            raise DuckpipeError(
                f"layer {int(d.layer)} is not being loaded (send LoadWeights first)"
            )
        key = (int(d.duck), int(d.tensor))
        buf = layer.raw.get(key)
        if buf is None:
            raise DuckpipeError(
                f"duck {key[0]} tensor {key[1]} is not in layer {int(d.layer)}'s plan"
            )
        off, n = int(d.offset), int(d.nbytes)
        if n > client.seg.act_slot_size or off + n > buf.size:
            raise DuckpipeError(f"chunk [{off}, {off + n}) overflows tensor of {buf.size} bytes")
        buf[off : off + n] = client.seg.act_bytes(int(d.slot))[:n]
        layer.received[key] += n
        self.counters["weight_chunks"] += 1
        self.counters["weight_bytes"] += n

    def _commit(self, layer_id: int) -> None:
        layer = self.layers.get(layer_id)
        if layer is None:
            raise DuckpipeError(f"layer {layer_id} is not being loaded")
        short = [
            (k, layer.received[k], b.size)
            for k, b in layer.raw.items()
            if layer.received[k] != b.size
        ]
        if short:
            (duck, t), got, want = short[0]
            raise DuckpipeError(
                f"layer {layer_id} incomplete: duck {duck} tensor {t} got {got} of {want} bytes"
            )
        info = layer.info
        npdt = numpy_dtype(info.dtype)
        for duck, f in zip(info.ducks, info.shard_sizes, strict=True):
            shapes = _tensor_shapes(info.kind, info.hidden, f)
            # float32 copies once, at load: what a duck holds is ready to compute with
            layer.tensors[duck] = [
                layer.raw[duck, t].view(npdt).reshape(s).astype(np.float32)
                for t, s in enumerate(shapes)
            ]
        if info.has_b_down:
            layer.b_down = layer.raw[ctl.HOST_TENSOR_DUCK, 3].view(npdt).astype(np.float32)
        layer.raw.clear()
        layer.ready = True
        self.counters["layers_loaded"] += 1

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
            if item.client.identity in self.clients:
                if item.fields["epoch"] != self.epoch and item.fields["status"] == Status.OK:
                    item.fields["status"] = int(
                        Status.STALE_EPOCH
                    )  # the epoch moved while in flight
                self._complete(item.client, item.fields)
            n += 1
        return n

    def _complete(self, client: _Client, f: dict) -> None:
        """Publish the done word (release) and then send the ZeroMQ completion."""
        slot = f["slot"]
        if slot < client.seg.slot_count:
            lib.dp_slot_publish(
                client.seg.slot_headers + slot,
                f["forward_id"],
                f["epoch"],
                f["nbytes"],
                len(f["answered"]),
                len(f["missing"]),
                f["generation"],
                f["status"],
            )
        client.completed += 1
        f = {k: v for k, v in f.items() if k != "nbytes"}
        self._send(client.identity, ctl.Completion(current_epoch=self.epoch, **f))

    # --- housekeeping -------------------------------------------------------------

    def _housekeeping(self) -> None:
        now = runtime.monotonic_ns()
        stale_ns = int(self.cfg.client_timeout_s * 1e9)
        for identity, client in list(self.clients.items()):
            hdr = client.seg.header
            hdr.dataplane_heartbeat_ns = now
            beat_age = now - int(hdr.client_heartbeat_ns)
            if runtime.process_alive(client.pid, client.start_ns) and beat_age < stale_ns:
                continue
            log.warning(
                "client %d (pid %d) is gone; reclaiming %s", client.id, client.pid, client.seg.path
            )
            del self.clients[identity]
            client.seg.close()
            client.seg.unlink()
            self.counters["clients_reclaimed"] += 1


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
