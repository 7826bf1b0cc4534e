#!/usr/bin/env python3
"""Time the Python client's per-forward path: claim, fill, submit, result, release.

    python tools/client_hotpath.py              # the Python side alone
    python tools/client_hotpath.py --dataplane  # the round trip through a null dataplane

Without ``--dataplane`` no dataplane runs in the loop: a null-backend dataplane
attaches the client and loads the layer, then is stopped (SIGSTOP), and this
process plays its part itself, outside the timed regions: it pops the
descriptor from the client's ring, publishes the slot's done word, and empties
the client's in-flight table as the ZeroMQ completions would. What is left is
the client's own cost. With ``--dataplane`` it answers for real (the ``null``
backend: no ducks, no network) and the phases include its turn and the
context switches. Either way the process (and the dataplane it starts) is
pinned to one CPU, and the client waits with ``wait="block"``.

Prints the median of each phase in microseconds. The machine's noise moves
these numbers more than many changes do: compare two versions in alternating
runs, not against a number from another day.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

import duckpipe
from duckpipe._abi import lib
from duckpipe._abi.ring import SubmissionRing, new_desc
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.schema.abi import Status
from duckpipe.testing import null_topology

LAYER = 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forwards", type=int, default=20000)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--cpu", type=int, default=0, help="the CPU everything is pinned to")
    p.add_argument("--dataplane", action="store_true", help="a null dataplane answers")
    args = p.parse_args()

    os.sched_setaffinity(0, {args.cpu})  # the dataplane inherits it
    x = np.ones((args.rows, args.hidden), np.float32)
    n = args.forwards
    with DataplaneProcess(null_topology(1)) as dp:
        with duckpipe.connect(
            dp.control,
            wait="block",
            slots=8,
            slot_size=max(4096, x.nbytes),
            dataplane_timeout=5.0 if args.dataplane else 1e6,  # a stopped one does not beat
        ) as c:
            c.load_weights(LAYER, duckpipe.SwiGluMlp.random(args.hidden, 8, seed=1), progress=False)
            c.forward(LAYER, x, timeout=5)
            answer = _real if args.dataplane else _stand_in(c, dp.pid)
            try:
                times = _run(c, x, n, answer)
            finally:
                if not args.dataplane:
                    os.kill(dp.pid, signal.SIGKILL)  # it cannot take its ring back
    p50 = np.percentile(times[n // 10 :], 50, axis=0) / 1000
    phases = ("claim", "fill", "submit", "result", "release", "total")
    print("  ".join(f"{name} {t:.2f}" for name, t in zip(phases, p50, strict=True)), "us (p50)")
    return 0


def _real() -> None:
    pass


def _stand_in(c: duckpipe.Client, dp_pid: int):
    """Stop the dataplane; return what answers a forward in its place."""
    os.kill(dp_pid, signal.SIGSTOP)
    time.sleep(0.05)
    seg = c._session.segment
    seg.header.need_wakeup = 0  # it will not wake: no doorbell to ring
    ring, d, headers = SubmissionRing(seg), new_desc(), seg.slot_headers

    def answer() -> None:
        assert ring.pop(d)
        lib.dp_slot_publish(
            headers + d.slot, d.forward_id, d.epoch, d.nbytes, 1, 0, d.generation, Status.OK
        )

    return answer


def _run(c: duckpipe.Client, x: np.ndarray, n: int, answer) -> np.ndarray:
    clock = time.perf_counter_ns
    stand_in = answer is not _real
    times = np.zeros((n, 6), np.int64)
    for k in range(n):
        t0 = clock()
        slot = c.claim(x.shape, x.dtype)
        t1 = clock()
        slot.array[:] = x
        t2 = clock()
        fwd = c.submit(slot, LAYER)
        t3 = clock()
        answer()
        t4 = clock()
        fwd.result(timeout=5)
        t5 = clock()
        fwd.release()
        t6 = clock()
        if stand_in:
            c._session.inflight.clear()  # what the ZeroMQ completions do
        else:
            t4 = t3  # the wait for the dataplane is part of result
        times[k] = (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t6 - t0 - (t4 - t3))
    return times


if __name__ == "__main__":
    sys.exit(main())
