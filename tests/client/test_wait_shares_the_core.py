"""How the client's wait shares its core (issue 19). ``hybrid`` is the wait for a core the
client shares with the dataplane or the model: its spin yields, so they run first (a pure
spin kept the dataplane that finishes the forward off the core: a one-duck forward's p50
114 -> 57 µs, docs/benchmark-history.md). ``spin`` is for a core of its own: it spins on it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from duckpipe._abi import ffi, lib

# an intruder that hogs the CPU until it is killed, saying when it has begun
_HOG = "print('hogging', flush=True)\nwhile True: pass"
WINDOW_S = 0.25


def _on_cpu_s(tid: int) -> float:
    with open(f"/proc/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


@pytest.mark.parametrize("mode", ["hybrid", "spin"])
def test_a_hybrid_wait_spins_by_yielding_a_spin_wait_on_its_core(mode):
    # a done word that completes only when the test says so: the wait spins (its budget
    # is far longer than the window), with an intruder runnable on the same CPU the while.
    # Both are still running when their CPU time is read, however late the load lets this
    # thread wake: the waiter until the done word is written, the hog until it is killed
    # (with fixed lifetimes, a late read met a thread that had ended: no schedstat).
    cpu = min(os.sched_getaffinity(0))
    header = ffi.new("struct dp_slot_header *")
    spin_ns, sleep_ns = 60_000_000_000, (1_000_000 if mode == "hybrid" else 0)
    tid: list[int] = []
    pinned = threading.Event()

    def wait() -> None:
        tid.append(threading.get_native_id())
        os.sched_setaffinity(0, {cpu})  # this thread only
        pinned.set()
        lib.dp_wait_done(header, 1, spin_ns, sleep_ns)

    waiter = threading.Thread(target=wait)
    hog = subprocess.Popen([sys.executable, "-c", _HOG], stdout=subprocess.PIPE, text=True)
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        assert hog.stdout.readline() == "hogging\n"
        waiter.start()
        assert pinned.wait(10)
        time.sleep(0.05)
        ran, hogged = _on_cpu_s(tid[0]), _on_cpu_s(hog.pid)
        time.sleep(WINDOW_S)
        ran, hogged = _on_cpu_s(tid[0]) - ran, _on_cpu_s(hog.pid) - hogged
    finally:
        header.done = 1 << 32 | lib.DP_STATUS_OK  # generation 1, final: the wait returns
        hog.kill()
        waiter.join(timeout=10)
        hog.wait(timeout=10)
        hog.stdout.close()
    assert not waiter.is_alive()
    if mode == "hybrid":  # it let the intruder run whenever it looked
        assert ran < 0.1 * hogged, (ran, hogged)
    else:  # two CPU-bound threads on one CPU: about even
        assert ran > 0.5 * hogged, (ran, hogged)
