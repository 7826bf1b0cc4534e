"""The iceoryx2 row of ``duckpipe bench ipc`` (optional: ``pip install iceoryx2``).

Two publish/subscribe services of ``Slice[c_uint8]`` (request, reply) between this
process (CPU 0) and a forked child (CPU 1); each creates its own node after the
fork. Samples are loaned, filled with one numpy copy through their memoryview and
sent; receivers busy-poll ``receive()`` and read in place. Byte 0 of every payload
says what it is (0 data, 1 last of a stream, 2 child ready). Every ``send()``'s
return value (subscribers reached) is added up, and the child reports how many
streamed messages it actually received: some versions drop under back pressure.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import struct
import time

import numpy as np

from .common import DUCKS_CPU, percentiles_us, pin

__all__ = ["measure"]

DATA, LAST, READY = 0, 1, 2


class _End:
    def __init__(self, tx_name: str, rx_name: str, size: int) -> None:
        import iceoryx2 as iox2

        iox2.set_log_level_from_env_or(iox2.LogLevel.Error)  # not "no config file" on stdout
        self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)

        def svc(name: str):  # type: ignore[no-untyped-def]
            return (
                self.node.service_builder(iox2.ServiceName.new(name))
                .publish_subscribe(iox2.Slice[ctypes.c_uint8])
                .subscriber_max_buffer_size(16)
                .open_or_create()
            )

        self.tx_svc, self.rx_svc = svc(tx_name), svc(rx_name)
        self.pub = self.tx_svc.publisher_builder().initial_max_slice_len(size).create()
        self.sub = self.rx_svc.subscriber_builder().buffer_size(16).create()
        self.size = size
        self.delivered = 0

    def send(self, src: np.ndarray | None, tag: int, extra: int = 0) -> None:
        s = self.pub.loan_slice_uninit(self.size)
        a = np.frombuffer(s.payload().as_memory_view(), dtype=np.uint8)
        if src is not None:
            np.copyto(a, src)
        a[0] = tag
        if extra:
            a[8:16] = np.frombuffer(struct.pack("<Q", extra), np.uint8)
        self.delivered += s.assume_init().send()

    def recv(self, deadline: float) -> tuple[int, int]:
        """(tag, extra) of the next sample; the payload is read in place."""
        spins = 0
        while True:
            r = self.sub.receive()
            if r is not None:
                a = np.frombuffer(r.payload().as_memory_view(), dtype=np.uint8)
                out = int(a[0]), struct.unpack("<Q", a[8:16].tobytes())[0]
                del a, r
                return out
            spins += 1
            if not spins & 0xFF and time.monotonic() > deadline:
                raise TimeoutError("iceoryx2: nothing received before the deadline")


def _child(req: str, rep: str, size: int, n_rt: int, deadline_s: float) -> None:
    pin(0, DUCKS_CPU)
    try:
        end = _End(rep, req, size)
        buf = np.zeros(size, np.uint8)
        deadline = time.monotonic() + deadline_s
        # announce until the parent's first request arrives
        while True:
            end.send(None, READY)
            r = end.sub.receive()
            if r is not None:
                del r
                break
            if time.monotonic() > deadline:
                os._exit(1)
            time.sleep(0.005)
        end.send(buf, DATA)  # the echo of that first request
        for _ in range(n_rt - 1):
            end.recv(deadline)
            end.send(buf, DATA)
        got = 0
        while True:
            tag, _ = end.recv(deadline)
            got += 1
            if tag == LAST:
                break
        end.send(buf, DATA, extra=got)
        os._exit(0)
    except BaseException:
        os._exit(1)


def measure(size: int, n_rt: int, warm: int, n_stream: int, deadline_s: float) -> dict[str, float]:
    tag = f"duckpipe-bench-{os.getpid()}-{size}-{time.monotonic_ns()}"
    req, rep = f"{tag}-req", f"{tag}-rep"
    child = mp.get_context("fork").Process(
        target=_child, args=(req, rep, size, warm + n_rt, deadline_s), daemon=True
    )
    child.start()
    try:
        end = _End(req, rep, size)
        src = np.full(size, 7, np.uint8)
        deadline = time.monotonic() + deadline_s
        while end.recv(deadline)[0] != READY:  # the child is up
            pass
        end.send(src, DATA)  # its first request: the child stops announcing
        while end.recv(deadline)[0] != DATA:  # READYs still queued, then the echo
            pass
        rts: list[int] = []
        for k in range(warm + n_rt - 1):
            t0 = time.perf_counter_ns()
            end.send(src, DATA)
            while end.recv(deadline)[0] == READY:
                pass
            if k >= warm:
                rts.append(time.perf_counter_ns() - t0)
        sent0 = end.delivered
        t0 = time.perf_counter_ns()
        for i in range(n_stream):
            end.send(src, LAST if i == n_stream - 1 else DATA)
        _, received = end.recv(deadline)
        stream_ns = time.perf_counter_ns() - t0
        delivered = end.delivered - sent0
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
            child.join()
    secs = stream_ns / 1e9
    p50, p99, p999 = percentiles_us(rts, (50, 99, 99.9))
    return {
        "rt_p50_us": p50,
        "rt_p99_us": p99,
        "rt_p999_us": p999,
        "stream_gbps": size * received / secs / 1e9,
        "stream_msgs_per_s": received / secs,
        "stream_sent": n_stream,
        "stream_send_returned": delivered,
        "stream_received": received,
    }
