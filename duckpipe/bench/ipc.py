"""``duckpipe bench ipc``: moving one payload between two processes, against the floor.

For each transport and payload size (64 B, 4 KiB, 64 KiB, 1 MiB), a child process
forked on CPU 1 echoes what the parent (CPU 0) sends:

- round trip: send one message, receive the echo; p50 / p99 / p99.9;
- streaming: send N messages back to back; the child receives them all and echoes
  the last one; GB/s and messages/s over first send -> that echo.

Transports: multiprocessing Pipe (send_bytes / recv_bytes_into a page-aligned
buffer) and Queue (pickled bytes), pyzmq PAIR over ipc:// with copy=True and
copy=False, a minimal shared-memory SPSC ring in Python that busy-polls (one ring
each way, page-aligned slots, numpy copies in and views out), iceoryx2 when
installed (every send's return value is counted), and one numpy copy of the payload
(the floor: no second process at all). Every buffer is an mmap (page-aligned) and
touched before timing.

duckpipe's own handoff goes through the dataplane's ``null`` backend (every duck
answers at once, no network): :func:`duckpipe_null_rows`, one row per way of waiting
(:data:`NULL_PROFILES`).
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    CLIENT_CPU,
    DUCKS_CPU,
    Progress,
    Size,
    Table,
    percentiles_us,
    pin,
    task_cpu_seconds,
)

__all__ = [
    "NULL_MTU",
    "SIZES",
    "TRANSPORTS",
    "duckpipe_null_idle_rows",
    "duckpipe_null_rows",
    "run",
]

SIZES = (64, 4096, 65536, 1 << 20)
PAGE = mmap.PAGESIZE
DEADLINE_S = 30.0  # no single transport x size may take longer than this

TRANSPORTS = {
    "numpy_copy": "one numpy copy (the floor, no IPC)",
    "pipe": "multiprocessing Pipe",
    "queue": "multiprocessing Queue",
    "zmq_copy": "pyzmq PAIR ipc://, copy=True",
    "zmq_nocopy": "pyzmq PAIR ipc://, copy=False",
    "shm_ring": "Python shm ring, busy-poll",
    "iceoryx2": "iceoryx2 publish/subscribe",
    "duckpipe_null": "duckpipe through the null backend",
}

COLUMNS = [
    ("transport", "transport"),
    ("size", "size"),
    ("rt_p50_us", "round trip p50 µs"),
    ("rt_p99_us", "p99 µs"),
    ("rt_p999_us", "p99.9 µs"),
    ("stream_gbps", "stream GB/s"),
    ("stream_msgs_per_s", "stream msgs/s"),
    ("ratio_to_copy", "rt p50 / copy"),
    ("stream_delivered", "streamed: received / sent"),
]


def _buffer(n: int, fill: int = 1) -> tuple[mmap.mmap, np.ndarray]:
    """A page-aligned, pre-faulted buffer of n bytes (an anonymous mmap)."""
    m = mmap.mmap(-1, max(PAGE, -(-n // PAGE) * PAGE))
    a = np.frombuffer(m, dtype=np.uint8, count=n)
    a[:] = fill
    return m, a


def _size_label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


class _Timeout(Exception):
    pass


# --------------------------------------------------------------------- the shm ring


class _Ring:
    """SPSC ring in a shared mmap: a header page (head: consumer's cache line; tail:
    producer's, 64 bytes apart) then ``slots`` page-aligned slots of ``size`` bytes.

    Python makes plain stores; on x86 (TSO) the payload's stores are seen before the
    tail's. That is all this baseline relies on: it is the "minimal Python ring".
    """

    def __init__(self, mem: mmap.mmap, offset: int, size: int, slots: int) -> None:
        self.slots, self.size = slots, size
        self.stride = -(-size // PAGE) * PAGE
        self.ctl = np.frombuffer(mem, dtype=np.uint64, count=16, offset=offset)
        self.views = [
            np.frombuffer(mem, dtype=np.uint8, count=size, offset=offset + PAGE + i * self.stride)
            for i in range(slots)
        ]
        self.pending = False  # consumer: a slot handed out, released at the next recv

    @staticmethod
    def nbytes(size: int, slots: int) -> int:
        return PAGE + slots * (-(-size // PAGE) * PAGE)

    def send(self, src: np.ndarray, deadline: float) -> None:
        ctl = self.ctl
        tail = int(ctl[8])
        spins = 0
        while tail - int(ctl[0]) >= self.slots:
            spins += 1
            if not spins & 0xFFF and time.monotonic() > deadline:
                raise _Timeout
        np.copyto(self.views[tail % self.slots], src)
        ctl[8] = tail + 1

    def recv(self, deadline: float) -> np.ndarray:
        ctl = self.ctl
        head = int(ctl[0])
        if self.pending:
            head += 1
            ctl[0] = head
        spins = 0
        while int(ctl[8]) == head:
            spins += 1
            if not spins & 0xFFF and time.monotonic() > deadline:
                raise _Timeout
        self.pending = True
        return self.views[head % self.slots]


# -------------------------------------------------------------- endpoints per transport


def _endpoints(kind: str, size: int) -> tuple[Callable[[], Any], Callable[[], Any], Any]:
    """(make the parent's endpoint, make the child's, state to keep alive). Each endpoint
    has send(ndarray), recv() -> message, and the child's send accepts what recv gave."""
    if kind == "pipe":
        a, b = mp.get_context("fork").Pipe()

        class PipeEnd:
            def __init__(self, conn: Any) -> None:
                self.conn = conn
                self.mem, self.buf = _buffer(size, 0)

            def send(self, x: Any, deadline: float) -> None:
                self.conn.send_bytes(x)

            def recv(self, deadline: float) -> Any:
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    raise _Timeout
                n = self.conn.recv_bytes_into(self.mem)
                return self.buf[:n]

        return lambda: PipeEnd(a), lambda: PipeEnd(b), (a, b)
    if kind == "queue":
        ctx = mp.get_context("fork")
        q1, q2 = ctx.Queue(), ctx.Queue()

        class QueueEnd:
            def __init__(self, out: Any, inq: Any) -> None:
                self.out, self.inq = out, inq

            def send(self, x: Any, deadline: float) -> None:
                self.out.put(x if isinstance(x, bytes) else x.tobytes())

            def recv(self, deadline: float) -> Any:
                try:
                    return self.inq.get(timeout=max(0.001, deadline - time.monotonic()))
                except Exception as e:  # queue.Empty
                    raise _Timeout from e

            def close(self) -> None:
                self.out.close()
                self.out.join_thread()  # its feeder thread flushes the last put

        return lambda: QueueEnd(q1, q2), lambda: QueueEnd(q2, q1), (q1, q2)
    if kind in ("zmq_copy", "zmq_nocopy"):
        tmp = tempfile.TemporaryDirectory(prefix="duckpipe-bench-")
        addr = f"ipc://{tmp.name}/pair"
        copy = kind == "zmq_copy"

        class ZmqEnd:
            def __init__(self, bind: bool) -> None:
                import zmq

                self.ctx = zmq.Context()
                self.s = self.ctx.socket(zmq.PAIR)
                self.s.setsockopt(zmq.LINGER, 2000)  # the last echo leaves before term()
                self.s.setsockopt(zmq.RCVTIMEO, int(DEADLINE_S * 1000))
                self.s.bind(addr) if bind else self.s.connect(addr)

            def send(self, x: Any, deadline: float) -> None:
                self.s.send(x, copy=copy)

            def recv(self, deadline: float) -> Any:
                import zmq

                try:
                    return self.s.recv(copy=copy)
                except zmq.Again as e:
                    raise _Timeout from e

            def close(self) -> None:
                self.s.close()
                self.ctx.term()

        return lambda: ZmqEnd(True), lambda: ZmqEnd(False), tmp
    if kind == "shm_ring":
        slots = 8
        one = _Ring.nbytes(size, slots)
        mem = mmap.mmap(-1, 2 * one)  # shared with the child across fork
        np.frombuffer(mem, dtype=np.uint8)[:] = 0  # pre-fault every page

        class RingEnd:
            def __init__(self, tx_off: int, rx_off: int) -> None:
                self.tx = _Ring(mem, tx_off, size, slots)
                self.rx = _Ring(mem, rx_off, size, slots)

            def send(self, x: Any, deadline: float) -> None:
                self.tx.send(x, deadline)

            def recv(self, deadline: float) -> Any:
                return self.rx.recv(deadline)

        return lambda: RingEnd(0, one), lambda: RingEnd(one, 0), mem
    raise ValueError(kind)


def _child(make: Callable[[], Any], n_rt: int, n_stream: int) -> None:
    pin(0, DUCKS_CPU)
    end = make()
    deadline = time.monotonic() + 2 * DEADLINE_S
    try:
        for _ in range(n_rt):
            end.send(end.recv(deadline), deadline)
        last = None
        for _ in range(n_stream):
            last = end.recv(deadline)
        end.send(last, deadline)
        if hasattr(end, "close"):
            end.close()
        os._exit(0)
    except BaseException:
        os._exit(1)


def _measure_pair(kind: str, size: int, n_rt: int, warm: int, n_stream: int) -> dict[str, float]:
    make_parent, make_child, keep = _endpoints(kind, size)
    ctx = mp.get_context("fork")
    child = ctx.Process(target=_child, args=(make_child, warm + n_rt, n_stream), daemon=True)
    child.start()
    end = make_parent()
    _, src = _buffer(size, 7)
    deadline = time.monotonic() + DEADLINE_S
    rts: list[int] = []
    try:
        for k in range(warm + n_rt):
            t0 = time.perf_counter_ns()
            end.send(src, deadline)
            end.recv(deadline)
            if k >= warm:
                rts.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        for _ in range(n_stream):
            end.send(src, deadline)
        end.recv(deadline)
        stream_ns = time.perf_counter_ns() - t0
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
        if hasattr(end, "close"):
            end.close()
        if hasattr(keep, "cleanup"):
            keep.cleanup()
    if child.exitcode != 0:
        raise RuntimeError(f"the {kind} child exited with {child.exitcode}")
    return _row(rts, stream_ns, size, n_stream)


def _row(rts: list[int], stream_ns: int, size: int, n_stream: int) -> dict[str, float]:
    p50, p99, p999 = percentiles_us(rts, (50, 99, 99.9))
    secs = stream_ns / 1e9
    return {
        "rt_p50_us": p50,
        "rt_p99_us": p99,
        "rt_p999_us": p999,
        "stream_gbps": size * n_stream / secs / 1e9,
        "stream_msgs_per_s": n_stream / secs,
    }


def _measure_copy(size: int, n_rt: int, warm: int, n_stream: int) -> dict[str, float]:
    _, src = _buffer(size, 7)
    _, dst = _buffer(size, 0)
    rts = []
    for k in range(warm + n_rt):
        t0 = time.perf_counter_ns()
        np.copyto(dst, src)
        if k >= warm:
            rts.append(time.perf_counter_ns() - t0)
    t0 = time.perf_counter_ns()
    for _ in range(n_stream):
        np.copyto(dst, src)
    return _row(rts, time.perf_counter_ns() - t0, size, n_stream)


# -------------------------------------------------------------------------- iceoryx2


def _iceoryx2_available() -> str | None:
    """None when iceoryx2 can be imported, else why not."""
    try:
        import iceoryx2  # noqa: F401
    except ImportError:
        return "iceoryx2 is not installed (pip install iceoryx2)"
    return None


def _measure_iceoryx2(size: int, n_rt: int, warm: int, n_stream: int) -> dict[str, float]:
    from . import ipc_iceoryx2

    return ipc_iceoryx2.measure(size, n_rt, warm, n_stream, DEADLINE_S)


# ------------------------------------------------------------------ duckpipe (hook)


#: The null NIC's MTU: one datagram per 64 KiB of payload, so that the handoff is measured
#: (client ring -> dispatcher -> worker -> reduce -> result slot), not the per-datagram
#: work of an emulated 1500-byte network (a 1 MiB forward: 17 chunks instead of 754).
NULL_MTU = 65535

#: duckpipe's handoff, once per way of waiting: the client's wait mode with the dataplane
#: idle strategy and pinning it is meant for (docs/api.md: which mode fits which machine).
#: (name, wait, topology settings, the dataplane thread's CPU or None: the client's)
NULL_PROFILES: tuple[tuple[str, str, dict[str, object], int | None], ...] = (
    ("spin", "spin", {"idle": "spin"}, DUCKS_CPU),
    ("hybrid", "hybrid", {"idle": "backoff"}, None),
    ("block, parked", "block", {"idle": "backoff", "idle_spin_us": 0}, None),
)


def null_profile_label(name: str) -> str:
    settings = {p[0]: p for p in NULL_PROFILES}[name]
    where = "its own core" if settings[3] is not None else "the client's core"
    idle = settings[2]["idle"]
    spin = settings[2].get("idle_spin_us")
    idle = f"{idle}, idle_spin_us={spin}" if spin is not None else idle
    return (
        f"{TRANSPORTS['duckpipe_null']} (mtu {NULL_MTU}), wait={settings[1]}, "
        f"dataplane {idle} on {where}"
    )


def duckpipe_null_rows(
    size: int, n_rt: int, warm: int, n_stream: int
) -> dict[str, dict[str, float]]:
    """duckpipe's handoff alone, through the dataplane's ``null`` backend (every duck
    answers at once, no network), for each of :data:`NULL_PROFILES`: claim + copy-in +
    submit + result() of a float32 activation of ``size`` bytes (round trip), and
    ``n_stream`` such forwards back to back (streaming). One duck, a SwiGLU layer."""
    import duckpipe

    from ..launch.dataplane import DataplaneProcess
    from ..testing import null_topology

    hidden = min(size // 4, 1024)
    x = np.ones((size // 4 // hidden, hidden), np.float32)
    out: dict[str, dict[str, float]] = {}
    for name, wait, settings, cpu in NULL_PROFILES:
        cores = [cpu] if cpu is not None else []
        topo = null_topology(
            1, max_forward_bytes=max(1 << 20, size), cores=cores, mtu=NULL_MTU, **settings
        )
        with DataplaneProcess(topo) as dp:
            with duckpipe.connect(dp.control, wait=wait, slots=8,
                                  slot_size=max(PAGE, size)) as c:  # fmt: skip
                c.load_weights(1, duckpipe.SwiGluMlp.random(hidden, 8, seed=1), progress=False)

                def one() -> None:
                    with c.claim(x.shape, x.dtype) as slot:
                        slot.array[:] = x
                        fwd = c.submit(slot, 1)
                    with fwd:
                        fwd.result(timeout=DEADLINE_S)

                rts = []
                for k in range(warm + n_rt):
                    t0 = time.perf_counter_ns()
                    one()
                    if k >= warm:
                        rts.append(time.perf_counter_ns() - t0)
                t0 = time.perf_counter_ns()
                for _ in range(n_stream):
                    one()
                out[name] = _row(rts, time.perf_counter_ns() - t0, size, n_stream)
    return out


# ----------------------------------------------------------- idle cost (wait modes)

IDLE_COLUMNS = [
    ("profile", "wait mode, dataplane idle setting"),
    ("warm_p50_us", "64 B round trip p50 µs (warm)"),
    ("busy_cpu_us", "CPU µs per round trip (client + dataplane)"),
    ("idle_cpu_pct", "idle CPU, % of a core"),
    ("idle_wakeups_per_s", "dataplane wake-ups / s idle"),
    ("first_after_idle_us", "first round trip after idle µs"),
    ("first_ratio", "first / warm"),
]


def _wakeups(pid: int) -> int:
    """Context switches of every thread of pid: each park -> wake is at least one."""
    n = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError, ValueError):
            for line in status.read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    n += int(line.split()[1])
    return n


def duckpipe_null_idle_rows(idle_s: float, n_rt: int) -> list[dict[str, object]]:
    """What each way of waiting costs: for each of :data:`NULL_PROFILES`, a client
    attached to a null-backend dataplane makes ``n_rt`` 64 B round trips (p50, and CPU
    per round trip of the client and the dataplane together, every thread), then does
    nothing for ``idle_s`` seconds (CPU of both, the dataplane's wake-ups), then one
    more round trip: the first after idle, against the warm p50 of the same run."""
    import duckpipe

    from ..launch.dataplane import DataplaneProcess
    from ..testing import null_topology

    hidden = 16
    x = np.ones((1, hidden), np.float32)
    rows: list[dict[str, object]] = []
    for name, wait, settings, cpu in NULL_PROFILES:
        cores = [cpu] if cpu is not None else []
        topo = null_topology(1, cores=cores, mtu=NULL_MTU, **settings)
        with DataplaneProcess(topo) as dp:
            with duckpipe.connect(dp.control, wait=wait, slots=8, slot_size=PAGE) as c:
                c.load_weights(1, duckpipe.SwiGluMlp.random(hidden, 8, seed=1), progress=False)

                def one() -> int:
                    t0 = time.perf_counter_ns()
                    with c.claim(x.shape, x.dtype) as slot:
                        slot.array[:] = x
                        fwd = c.submit(slot, 1)
                    with fwd:
                        fwd.result(timeout=DEADLINE_S)
                    return time.perf_counter_ns() - t0

                pid, me = dp.proc.pid, os.getpid()
                for _ in range(max(5, n_rt // 10)):
                    one()
                cpu0 = task_cpu_seconds(pid) + task_cpu_seconds(me)
                warm = [one() for _ in range(n_rt)]
                busy = task_cpu_seconds(pid) + task_cpu_seconds(me) - cpu0
                time.sleep(0.2)  # the dataplane's spin and yield after the last work
                cpu0, wake0, t0 = (
                    task_cpu_seconds(pid) + task_cpu_seconds(me),
                    _wakeups(pid),
                    time.monotonic(),
                )
                time.sleep(idle_s)
                idle = task_cpu_seconds(pid) + task_cpu_seconds(me) - cpu0
                wakes, secs = _wakeups(pid) - wake0, time.monotonic() - t0
                first = one() / 1e3
        p50 = percentiles_us(warm, (50,))[0]
        rows.append({
            "profile": null_profile_label(name), "name": f"idle_{name.split(',')[0]}",
            "warm_p50_us": p50, "busy_cpu_us": busy / n_rt * 1e6,
            "idle_cpu_pct": 100 * idle / secs, "idle_wakeups_per_s": wakes / secs,
            "first_after_idle_us": first, "first_ratio": first / p50,
        })  # fmt: skip
    return rows


# ------------------------------------------------------------------------------ run


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    counts = {
        # (round trips, streamed messages) per payload size
        64: size.pick((5000, 50000), (1000, 5000), (20, 50)),
        4096: size.pick((5000, 50000), (1000, 5000), (20, 50)),
        65536: size.pick((2000, 8000), (400, 1000), (20, 50)),
        1 << 20: size.pick((300, 512), (100, 128), (10, 20)),
    }
    null_cap: tuple[int, int] = size.pick((1000, 2000), (200, 300), (20, 50))  # type: ignore[assignment]
    ice_missing = _iceoryx2_available()
    kinds = [k for k in TRANSPORTS if k not in ("iceoryx2", "duckpipe_null")]
    if ice_missing is None:
        kinds.append("iceoryx2")
    prog = Progress("ipc", len(SIZES) * (len(kinds) + 1) + 1, quiet=quiet)
    t = Table(key="ipc", title="ipc: one payload between two processes", columns=COLUMNS)
    before = os.sched_getaffinity(0)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {CLIENT_CPU} & before or before)
    for nbytes in SIZES:
        n_rt, n_stream = counts[nbytes]  # type: ignore[misc]
        warm = max(5, n_rt // 20)
        copy_p50 = float("nan")
        for kind in kinds:
            prog.step(f"{_size_label(nbytes)}: {TRANSPORTS[kind]} ({n_rt} round trips, "
                      f"{n_stream} streamed)")  # fmt: skip
            row: dict[str, object] = {"transport": TRANSPORTS[kind], "name": kind,
                                      "size": _size_label(nbytes), "bytes": nbytes}  # fmt: skip
            if kind == "numpy_copy":
                row.update(_measure_copy(nbytes, n_rt, warm, n_stream))
                copy_p50 = float(row["rt_p50_us"])  # type: ignore[arg-type]
            elif kind == "iceoryx2":
                row.update(_measure_iceoryx2(nbytes, n_rt, warm, n_stream))
            else:
                row.update(_measure_pair(kind, nbytes, n_rt, warm, n_stream))
            row["ratio_to_copy"] = float(row["rt_p50_us"]) / copy_p50  # type: ignore[arg-type]
            got = row.setdefault("stream_received", n_stream)  # reliable ones: all, or a timeout
            row["stream_delivered"] = f"{got}/{n_stream}"
            t.rows.append(row)
        null_rt, null_stream = min(n_rt, null_cap[0]), min(n_stream, null_cap[1])
        prog.step(f"{_size_label(nbytes)}: duckpipe through the null backend, "
                  f"{len(NULL_PROFILES)} ways of waiting")  # fmt: skip
        null = duckpipe_null_rows(nbytes, null_rt, warm, null_stream)
        for name, vals in null.items():
            row = {"transport": null_profile_label(name),
                   "name": f"duckpipe_null_{name.split(',')[0]}", "size": _size_label(nbytes),
                   "bytes": nbytes, **vals}  # fmt: skip
            row["ratio_to_copy"] = float(vals["rt_p50_us"]) / copy_p50
            row["stream_received"] = null_stream
            row["stream_delivered"] = f"{null_stream}/{null_stream}"
            t.rows.append(row)
    t.notes += [
        "Parent on CPU 0, the echoing child on CPU 1 (forked); the numpy copy is one process.",
        "Streaming ends when the child's echo of the last message arrives (one extra "
        "message back, included).",
        "The numpy copy's 'round trip' is one copy of the payload: the floor of any handoff "
        "that delivers the bytes into another buffer.",
        "pyzmq copy=False hands frames over without a copy into Python bytes; the Pipe "
        "receives into a page-aligned buffer (recv_bytes_into); the Queue pickles bytes.",
        "The shm ring copies the payload into a slot (numpy) and the receiver reads a view.",
        f"duckpipe through the null backend (mtu {NULL_MTU}: one datagram per 64 KiB, so "
        "that the handoff is measured, not an emulated network): one duck, claim + copy in "
        "+ submit + result() "
        "per round trip (at most 1000 timed here); streaming is at most 2000 forwards one "
        "after another. wait=spin runs the dataplane spinning on CPU 1 (the core of its own "
        "spin mode needs); the others share CPU 0 with the client: hybrid with the default "
        "backoff, block with a dataplane that parks as soon as it is idle (idle_spin_us=0).",
        "iceoryx2: loaned samples filled by one numpy copy, read in place; streamed: "
        "received / sent counts what the child got (send() return values are in the JSON).",
    ]
    if ice_missing:
        t.notes.append(f"iceoryx2 skipped: {ice_missing}.")
    idle_s: float = size.pick(10.0, 3.0, 1.0)  # type: ignore[assignment]  # --quick: CI
    prog.step(f"what each way of waiting costs: 64 B round trips, then {idle_s:g} s idle")
    idle = Table(key="ipc_idle", title="ipc: what each way of waiting costs, busy and idle",
                 columns=IDLE_COLUMNS)  # fmt: skip
    idle.rows = duckpipe_null_idle_rows(idle_s, null_cap[0])
    idle.notes += [
        f"The null backend (mtu {NULL_MTU}), one duck, a client attached: CPU is the time "
        "on a CPU of every thread of the client process and of the dataplane "
        "(/proc/<pid>/task/*/schedstat, ns; stat's utime + stime count 10 ms ticks); "
        "busy: over the timed round trips; idle: "
        f"over {idle_s:g} s with nothing to do, 0.2 s after the last round trip.",
        "Wake-ups: the dataplane's context switches (voluntary + not) per second idle.",
        "First after idle: one round trip right after the idle stretch, against the warm p50 "
        "of the same dataplane.",
    ]
    os.sched_setaffinity(0, before)
    return [t, idle]
