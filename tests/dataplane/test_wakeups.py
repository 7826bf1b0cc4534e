"""Wake-ups, not sleeps: a parked dataplane is woken by the work itself.

A client rings the dataplane's doorbell only when the segment says it parks
(need_wakeup), and sleeps on its slot's done word (a futex) only after its spin
budget; the dataplane wakes it only when the slot says a waiter sleeps. These
tests prove each path is taken, and that nothing is lost when it is.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import zmq

import duckpipe
import duckpipe.launch.process
from duckpipe import GeluMlp
from duckpipe.bench.common import task_cpu_seconds
from duckpipe.launch.binaries import find_binary
from duckpipe.testing import null_backend_result

pytestmark = pytest.mark.dataplane

HIDDEN, FFN = 64, 32


def _x(rng: np.random.Generator, rows: int) -> np.ndarray:
    # multiples of 1/64: every k * x is exact in float32 (null_backend_result)
    return (rng.integers(-64, 64, (rows, HIDDEN)) / 64).astype(np.float32)


def _run(control: str, wait: str, n: int, ducks: int) -> dict[str, int]:
    mlp = GeluMlp.random(HIDDEN, FFN, seed=3)
    rng = np.random.default_rng(4)
    with duckpipe.connect(control, wait=wait, slots=8, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        before = c.stats().counters
        rang = c._session.ring.doorbells
        for _ in range(n):
            x = _x(rng, 2)
            got = c.forward(1, x, timeout=10)
            np.testing.assert_array_equal(got, null_backend_result(x, ducks, mlp.b_down))
        after = c.stats().counters
        rang = c._session.ring.doorbells - rang
    delta = {k: after[k] - before.get(k, 0) for k in after}
    delta["client_doorbells"] = rang
    return delta


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_a_parked_dataplane_is_woken_by_the_doorbell_and_wakes_a_sleeping_client(
    duckpipe_null_factory, threads
):
    # idle_spin_us=0: the dataplane parks as soon as a loop finds nothing to do, so
    # (nearly) every forward finds it asleep; wait="block" sleeps on the futex at once
    dp = duckpipe_null_factory(2, idle_spin_us=0, threads=threads)
    n = _run(dp.control, "block", 200, 2)
    assert n["forwards_ok"] == 200 and n["timeouts"] == 0, n
    assert n["parks"] > 0, n
    # the client rang only when need_wakeup said so, and the dataplane drained every ring
    assert n["doorbells"] > 0, n
    assert n["doorbells"] <= n["client_doorbells"] <= 200, n
    # no futex_wakes > 0 here: a null-backend forward takes ~100 us even through a park,
    # and the Python client may find every result before it sleeps (0 in 1 of ~40 runs);
    # test_the_futex_wakes_a_client_on_either_backing makes sure it sleeps first
    if threads == "dedicated":
        assert n["kicks"] > 0, n  # the dispatcher's pushes woke the worker's thread


def test_spin_mode_never_sleeps_on_the_futex(duckpipe_null_factory):
    dp = duckpipe_null_factory(1)
    n = _run(dp.control, "spin", 50, 1)
    assert n["forwards_ok"] == 50 and n["futex_wakes"] == 0, n


def test_an_idle_dataplane_sleeps_until_its_timers(duckpipe_null_factory):
    # idle, it parks until its nearest timer (housekeeping every 50 ms, PINGs): tens of
    # parks a second, where a sleep-and-poll loop wakes thousands of times
    dp = duckpipe_null_factory(1)
    with duckpipe.connect(dp.control) as c:
        first = c.stats().counters["parks"]
        time.sleep(1.0)
        parks = c.stats().counters["parks"] - first
    assert parks <= 200, parks


def test_a_client_of_a_parked_dataplane_keeps_every_completion(duckpipe_null_factory):
    # many forwards in flight at once while the dataplane parks between bursts: each
    # completes exactly once, and the ZeroMQ completions (read in batches) all arrive
    dp = duckpipe_null_factory(2, idle_spin_us=0)
    mlp = GeluMlp.random(HIDDEN, FFN, seed=5)
    rng = np.random.default_rng(6)
    with duckpipe.connect(dp.control, wait="block", slots=16, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        for _ in range(20):
            xs = [_x(rng, 1) for _ in range(8)]
            fwds = []
            for x in xs:
                slot = c.claim(x.shape)
                slot.array[:] = x
                fwds.append(c.submit(slot, 1))
            for x, f in zip(xs, fwds, strict=True):
                with f:
                    np.testing.assert_array_equal(
                        f.result(timeout=10), null_backend_result(x, 2, mlp.b_down)
                    )
        # timings come from ZeroMQ: asking for the last forward's waits for its message
        assert fwds[-1].timings.reduce_ns >= 0
        n = c.stats().counters
    assert n["forwards_ok"] == 160 and n["completions_sent"] >= 160, n
    assert c.counters["stale_completions"] == 0 and c.counters["completion_mismatch"] == 0


def test_zeromq_completions_leave_together_and_all_arrive(duckpipe_null_factory):
    # result() reads the slot; the ZeroMQ completions (timings, duck lists) wait up to
    # completion_flush_us to leave in one burst, which wakes each side's ZeroMQ I/O thread
    # once instead of once a forward
    dp = duckpipe_null_factory(2, completion_flush_us=2000)
    mlp = GeluMlp.random(HIDDEN, FFN, seed=7)
    rng = np.random.default_rng(8)
    with duckpipe.connect(dp.control, wait="block", slots=32, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        before = c.stats().counters
        fwds = []
        for _ in range(32):
            slot = c.claim((1, HIDDEN))
            slot.array[:] = _x(rng, 1)
            fwds.append(c.submit(slot, 1))
        for f in fwds:
            f.result(timeout=10)
        # every completion still comes, with its timings and the ducks that answered
        assert all(f.timings.reduce_ns > 0 and f.answered == (0, 1) for f in fwds)
        after = c.stats().counters
    sent = after["completions_sent"] - before["completions_sent"]
    flushes = after["completion_flushes"] - before["completion_flushes"]
    assert sent >= 32 and 1 <= flushes <= sent // 2, (sent, flushes)


@pytest.mark.parametrize("idle_spin_us", [0, 50])
def test_a_completion_the_client_waits_for_leaves_at_once(duckpipe_null_factory, idle_spin_us):
    # completion_flush_us of a whole second: a client that reads each forward's timings
    # (as `duckpipe bench forward` does) says so in its segment (completions_wanted) and
    # its completion leaves at once, rather than a second later with the burst. Parked
    # (idle_spin_us=0) the flag comes with a doorbell; awake, the next pass sees it.
    dp = duckpipe_null_factory(2, completion_flush_us=1_000_000, idle_spin_us=idle_spin_us)
    mlp = GeluMlp.random(HIDDEN, FFN, seed=9)
    rng = np.random.default_rng(10)
    n = 20
    with duckpipe.connect(dp.control, wait="block", slots=4, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        before = c.stats().counters
        for _ in range(n):
            x = _x(rng, 1)
            with c.claim(x.shape) as slot:
                slot.array[:] = x
                f = c.submit(slot, 1)
            with f:
                np.testing.assert_array_equal(
                    f.result(timeout=10), null_backend_result(x, 2, mlp.b_down)
                )
                assert f.timings.reduce_ns > 0 and f.answered == (0, 1)
        after = c.stats().counters
    wanted = after["completion_flushes_wanted"] - before["completion_flushes_wanted"]
    flushes = after["completion_flushes"] - before["completion_flushes"]
    # every forward's burst left because its client waited (the 1 s timer never came)
    assert wanted == n and flushes == n, (wanted, flushes)
    assert c.counters["stale_completions"] == 0 and c.counters["completion_mismatch"] == 0


# --- what a wake-up costs when it brings no work -----------------------------------------


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _ring_for(doorbell_fd: int, seconds: float, gap_s: float) -> int:
    """Ring a client's doorbell (its pipe's write end) every gap_s, with nothing in its
    ring; returns how many bytes went in."""
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.write(doorbell_fd, b"x")
            sent += 1
        except BlockingIOError:
            pass
        time.sleep(gap_s)
    return sent


def _sanitized(name: str) -> bool:
    """Is this program an ASan or TSan build (DUCKPIPE_BIN_DIR pointing at one)? Their
    CPU costs are not the program's: every memory access is instrumented."""
    data = find_binary(name).read_bytes()
    return b"__tsan_init" in data or b"__asan_init" in data


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_a_stray_doorbell_costs_one_look_not_a_spin(duckpipe_null_factory, threads):
    # a client may ring its own doorbell with nothing to do (another user cannot:
    # tests/hostile/test_hostile_local_user.py). A wake-up that finds no work parks again
    # at once, not after spinning idle_spin_us (100 us of CPU a ring: a flood cost the
    # dataplane ~4x what it cost the flooder), and a doorbell whose rings bring no new
    # descriptor is muted after a few (8), for quiet times that double (1 ms to 128 ms):
    # a steady stream of them is heard a few times a second, not at every ring
    # (tests/hostile/test_hostile_doorbell.py floods harder). Its client loses nothing:
    # its ring is looked at when a quiet time ends, and its next forward completes
    dp = duckpipe_null_factory(2, threads=threads, idle_spin_us=50)
    mlp = GeluMlp.random(HIDDEN, FFN, seed=13)
    x = _x(np.random.default_rng(14), 2)
    with duckpipe.connect(dp.control, slots=4, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        first = c.stats().counters
        cpu = task_cpu_seconds(dp.pid)
        rang = _ring_for(c._session.doorbell.write_fd, 2.0, 0.0003)
        cpu = task_cpu_seconds(dp.pid) - cpu
        n = c.stats().counters
        t0 = time.monotonic()
        np.testing.assert_array_equal(
            c.forward(1, x, timeout=10), null_backend_result(x, 2, mlp.b_down)
        )
        took = time.monotonic() - t0
    n = {k: n[k] - first.get(k, 0) for k in n}
    assert rang > 2000 and n["doorbells"] > 0, (rang, n)
    # heard: the first 8, then about one a quiet time (~20 in 2 s); counted as such
    assert 8 <= n.get("doorbells_idle", 0) < rang // 20, (rang, n)
    assert n.get("doorbell_rate_limited", 0) >= 5, n
    # housekeeping's and PINGs' wake-ups, the quiet times' ends, a few rings: not ~rang
    assert n["parks"] < 500, (rang, n)
    assert took < 1.0, f"the muted client's forward took {took:.3f} s"
    # measured: ~0.005 s in the 2 s (0.06-0.6 s when every ring was heard)
    if not _sanitized("duckpipe-dataplane"):
        assert cpu < 0.05, f"the dataplane used {cpu:.3f} s of CPU in 2 s of stray rings"


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_a_well_behaved_client_is_never_muted(duckpipe_null_factory, threads):
    # a doorbell whose rings bring no new descriptor is muted for a while (dp_dispatch.c);
    # a client of ours rings only after moving its head, or to have a completion it waits
    # for sent at once (dp_completions_want). Batches whose timings are read one by one
    # rang for each (31 rings for nothing a batch, muting it: the next batch waited for
    # the quiet time): a completion already in the client's socket is now taken first
    dp = duckpipe_null_factory(2, threads=threads, idle_spin_us=0, completion_flush_us=2000)
    mlp = GeluMlp.random(HIDDEN, FFN, seed=15)
    x = _x(np.random.default_rng(16), 1)
    want = null_backend_result(x, 2, mlp.b_down)
    with duckpipe.connect(dp.control, wait="block", slots=32, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        first = c.stats().counters
        for _ in range(40):
            fwds = []
            for _ in range(32):
                slot = c.claim(x.shape)
                slot.array[:] = x
                fwds.append(c.submit(slot, 1))
            for f in fwds:
                np.testing.assert_array_equal(f.result(timeout=10), want)
            for f in fwds:
                with f:
                    assert f.timings.reduce_ns > 0
        n = c.stats().counters
    n = {k: n[k] - first.get(k, 0) for k in n}
    assert n["forwards_ok"] == 1280 and n["doorbells"] > 0, n
    assert n["doorbell_rate_limited"] == 0, n


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_a_client_that_closes_its_doorbell_costs_no_spin(duckpipe_null_factory, threads):
    # a pipe whose every write end is closed reads as end of file, and stays readable: a
    # dispatcher that kept watching it would wake for ever. It stops watching it (counted),
    # and parks as before; the client, which can no longer wake it, only loses its own
    dp = duckpipe_null_factory(2, threads=threads, idle_spin_us=0)
    with duckpipe.connect(dp.control) as c:
        bell = c._session.doorbell
        first = c.stats().counters
        _ring_for(bell.write_fd, 0.1, 0.001)  # it is watched: the rings wake a parked dataplane
        os.close(bell.write_fd)
        bell.write_fd = -1
        c._session.ring.use_doorbell(-1)
        time.sleep(0.3)
        cpu = _cpu_s(dp.pid)
        time.sleep(1.5)
        cpu = _cpu_s(dp.pid) - cpu
        n = c.stats().counters
    assert cpu < 0.2, f"the dataplane used {cpu:.2f} s of CPU in 1.5 s"
    assert n["doorbell_unwatched"] - first["doorbell_unwatched"] == 1, n


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_a_pending_layer_commit_is_woken_by_its_last_chunk_not_polled(threads):
    # ducks that never acknowledge: the commit waits for its chunks until weight_timeout.
    # It used to be looked at every 200 us (thousands of wake-ups a second, a third of a
    # core); the worker that completes a layer's last chunk now kicks the dispatcher,
    # which here also proves the kick: with idle_spin_us=0 a lost one hangs the load
    from duckpipe.errors import DataplaneFault
    from duckpipe.launch.cluster import free_udp_ports
    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.launch.topology import loopback

    base = free_udp_ports(3)  # nobody listens on the ducks' ports
    topo = loopback(
        2,
        host_port=base,
        duck_port=base + 1,
        threads=threads,
        idle_spin_us=0,
        weight_rto_us=400_000,  # the worker's own retransmit tick: 50 ms
        weight_timeout_ms=2000,
    )
    with DataplaneProcess(topo) as dp, duckpipe.connect(dp.control, slots=8, slot_size=4096) as c:
        errors: list[BaseException] = []

        def load() -> None:
            try:
                c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=1), progress=False, timeout=10)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=load)
        t.start()
        time.sleep(0.3)
        first = duckpipe.launch.process.ping(dp.control).counters["parks"]
        time.sleep(1.0)
        parks = duckpipe.launch.process.ping(dp.control).counters["parks"] - first
        t0 = time.monotonic()
        t.join(10)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], DataplaneFault), errors
        assert time.monotonic() - t0 < 2.5
    # housekeeping (20/s), the retransmit tick (20/s), the control thread's own: not 1000s
    assert parks < 300, parks


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_without_epoll_pwait2_an_idle_dataplane_still_sleeps(
    duckpipe_null_factory, threads, c_test_program, monkeypatch
):
    # glibc's wrapper says ENOSYS on kernels before 5.11 (EPERM under older seccomp
    # profiles): park() then returned at once, and an idle dataplane spun a whole core.
    # dataplane/tests/no_epoll_pwait2.c is a shim whose epoll_pwait2 says ENOSYS
    monkeypatch.setenv("LD_PRELOAD", str(c_test_program("no_epoll_pwait2.so")))
    # the ASan build wants its runtime first; the shim only adds a symbol, so let it be
    asan = os.environ.get("ASAN_OPTIONS", "")
    monkeypatch.setenv("ASAN_OPTIONS", f"{asan}:verify_asan_link_order=0".lstrip(":"))
    dp = duckpipe_null_factory(2, threads=threads, idle_spin_us=0)
    monkeypatch.delenv("LD_PRELOAD")
    _run(dp.control, "block", 20, 2)  # wake-ups still work
    time.sleep(0.3)
    cpu = _cpu_s(dp.pid)
    time.sleep(1.5)
    cpu = _cpu_s(dp.pid) - cpu
    assert cpu < 0.2, f"an idle dataplane used {cpu:.2f} s of CPU in 1.5 s"


JUNK = 3000  # datagrams, 0.3 ms apart: about 1 s of junk on an idle machine


@pytest.mark.parametrize("threads", ["shared", "dedicated"])
def test_junk_datagrams_cost_one_look_not_a_spin(threads):
    # junk from a duck's address and port (the socket's kernel filter drops any other's
    # before it wakes anyone: test_hostile_local_user.py) wakes a parked worker; a
    # datagram the worker drops (malformed, unknown sender, stale) is no work, so the
    # runner parks again at once instead of spinning for replies that will not come
    from duckpipe.launch.cluster import Cluster

    with Cluster(2, threads=threads, emulators=2) as cl:
        port = cl.host_ports[0]
        cl.emulators[1].stop()  # duck 1's address is free: the junk comes from there
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", cl.duck_base + 1))
        time.sleep(0.3)
        first = duckpipe.launch.process.ping(cl.control).counters
        cpu = _cpu_s(cl.dataplane.pid)
        # a count, not a duration: on a loaded machine (CI's sanitizer passes) fewer sends
        # fit in a time, and the counts below are of what was sent
        for _ in range(JUNK):
            s.sendto(b"junk" * 16, ("127.0.0.1", port))
            time.sleep(0.0003)
        time.sleep(0.2)  # the last ones looked at
        cpu = _cpu_s(cl.dataplane.pid) - cpu
        n = duckpipe.launch.process.ping(cl.control).counters
        s.close()
    parks = n["parks"] - first["parks"]
    # most are looked at (a descheduled worker may let the socket's buffer drop some)
    assert n["rx_malformed"] - first["rx_malformed"] > JUNK // 2, n
    assert parks > JUNK // 4, parks  # several junk datagrams may share one wake-up
    assert cpu / parks < 40e-6, (cpu, parks)  # measured: ~110 us a park before


@pytest.mark.parametrize("backing", ["hugetlbfs", "devshm"])
def test_the_futex_wakes_a_client_on_either_backing(duckpipe_cluster_factory, backing):
    # a shared futex is keyed by the page: a hugetlbfs memfd's 2 MiB page as well as a
    # /dev/shm one. Ducks that answer 2 ms late make sure the client sleeps first; a lost
    # wake-up would cost it a whole sleep slice (50 ms)
    cl = duckpipe_cluster_factory(2, duck_args=["--delay-us", "2000"])
    mlp = GeluMlp.random(HIDDEN, FFN, seed=3)
    rng = np.random.default_rng(8)
    try:
        c = duckpipe.connect(cl.control, wait="block", slots=8, slot_size=4096, backing=backing)
    except duckpipe.DuckpipeError as e:
        if backing == "hugetlbfs":
            pytest.skip(str(e))
        raise
    with c:
        assert c._session.segment.backing.name.lower() == backing
        c.load_weights(1, mlp, progress=False)
        before = c.stats().counters["futex_wakes"]
        t = time.monotonic()
        for _ in range(30):
            x = _x(rng, 1)
            np.testing.assert_allclose(
                c.forward(1, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5
            )
        took = time.monotonic() - t
        wakes = c.stats().counters["futex_wakes"] - before
    assert took < 0.75, (took, wakes)  # 30 lost wake-ups would take 1.5 s
    assert wakes >= 20, (took, wakes)


def _zmq_io_policies(pid: int) -> list[int]:
    """The scheduling policy of each ZeroMQ I/O thread of process pid."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as f:
            if f.read().startswith("ZMQbg/IO"):
                out.append(os.sched_getscheduler(int(task)))
    return out


def test_zeromq_io_threads_run_sched_batch_on_both_sides(duckpipe_null_factory):
    # woken for a burst of completions, neither I/O thread preempts the dataplane's runner
    # or the client's thread on their core (docs/benchmark-history.md, issue 19 goal 2)
    dp = duckpipe_null_factory(1)
    mine = zmq.Context.instance()  # the application's own context is left as it was
    s = mine.socket(zmq.DEALER)
    try:
        with duckpipe.connect(dp.control) as c:
            c.stats()
            assert _zmq_io_policies(dp.proc.pid) == [os.SCHED_BATCH]
            policies = _zmq_io_policies(os.getpid())
            # the client's context (SCHED_BATCH) and the application's (the default)
            assert sorted(policies) == sorted([os.SCHED_BATCH, os.SCHED_OTHER]), policies
    finally:
        s.close(linger=0)


def test_zeromq_io_thread_leaves_the_runners_pinned_cores(duckpipe_null_factory):
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU: nowhere else to put ZeroMQ's I/O thread")
    core = min(allowed)
    dp = duckpipe_null_factory(1, cores=[core])
    with duckpipe.connect(dp.control) as c:
        c.stats()
        pid = dp.proc.pid
        io = [
            int(t)
            for t in os.listdir(f"/proc/{pid}/task")
            if open(f"/proc/{pid}/task/{t}/comm").read().startswith("ZMQbg/IO")
        ]
        assert io and all(os.sched_getaffinity(t) == allowed - {core} for t in io), io


# --- a runner that shares its CPU -------------------------------------------------------


def _on_cpu_s(tid: int) -> float:
    """Seconds thread (or process) tid has run, from schedstat (ns, finer than ticks)."""
    with open(f"/proc/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _runner_tids(pid: int) -> list[int]:
    """The threads that run agents: every thread but ZeroMQ's and the reaper (one
    "dataplane" thread with threads = "shared"; control, dispatch and a worker per NIC with
    "dedicated", as the TSan pass runs, whose main thread only waits)."""
    tids = []
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/comm") as f:
            comm = f.read().strip()
            if not comm.startswith("ZMQbg") and comm != "reaper":
                tids.append(int(t))
    return tids


_HOG = "import time\nend = time.monotonic() + 0.4\nwhile time.monotonic() < end: pass"


@pytest.mark.parametrize("pinned", [False, True], ids=["no-cores", "cores"])
def test_a_runner_without_a_core_of_its_own_spins_by_yielding(duckpipe_null_factory, pinned):
    # After work a backoff runner spins idle_spin_us. Without `cores` it shares its CPU
    # with the client it just woke, or the model: it spins by yielding, so a thread
    # runnable there runs first (a pure spin held a woken client off the CPU for up to
    # idle_spin_us: p99 of a one-duck forward 1.7-1.8x the C floor's against 1.05-1.2x,
    # docs/benchmark-history.md, issue 19 fourth round). Pinned by `cores` the core is its own:
    # it spins on it, and the scheduler shares the CPU out evenly with an intruder.
    cpu = min(os.sched_getaffinity(0))
    # cores: control, dispatch, worker (threads = "dedicated"); the first alone ("shared")
    dp = duckpipe_null_factory(1, idle_spin_us=1_000_000, cores=[cpu] * 3 if pinned else [])
    runners = _runner_tids(dp.proc.pid)
    for t in runners:
        os.sched_setaffinity(t, {cpu})
    with duckpipe.connect(dp.control, wait="block") as c:
        c.load_weights(1, GeluMlp.random(HIDDEN, FFN, seed=3), progress=False)
        c.forward(1, np.ones((1, HIDDEN), np.float32), timeout=10)  # work: a 1 s spin begins
        hog = subprocess.Popen([sys.executable, "-c", _HOG])
        try:
            os.sched_setaffinity(hog.pid, {cpu})
            time.sleep(0.05)
            ran, hogged = sum(map(_on_cpu_s, runners)), _on_cpu_s(hog.pid)
            time.sleep(0.25)
            ran, hogged = sum(map(_on_cpu_s, runners)) - ran, _on_cpu_s(hog.pid) - hogged
        finally:
            hog.wait(timeout=10)
    if pinned:  # CPU-bound threads on one CPU: about even each
        assert ran > 0.5 * hogged, (ran, hogged)
    else:  # it let the other run whenever it looked
        assert ran < 0.1 * hogged, (ran, hogged)


def test_a_runner_kept_from_sleeping_still_answers_control(duckpipe_null_factory):
    # More connections than attached clients (and a few tools) keep the control agent
    # from parking (a flood must be shut down as it comes). Each pass then ends in a park
    # that does not sleep; one that put ZeroMQ's next look off each time answered nothing
    # here (a look is skipped after a sleep that ZeroMQ's fd did not end, never after none)
    dp = duckpipe_null_factory(1)
    ctx = zmq.Context()
    peers = [ctx.socket(zmq.DEALER) for _ in range(20)]
    try:
        for s in peers:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(dp.control)
        time.sleep(0.3)  # accepted, counted
        for _ in range(5):
            assert duckpipe.launch.process.ping(dp.control, 2.0) is not None
    finally:
        for s in peers:
            s.close()
        ctx.term()


@pytest.mark.parametrize("expect", [True, False])
def test_a_worker_parks_until_its_ducks_replies_are_due(duckpipe_cluster_factory, expect):
    # Ducks that answer 10 ms late: once their reply times are measured, the runner
    # sleeps after each send, the NIC's socket unheard, until idle_spin_us before the
    # replies are due (parks_expecting), instead of spinning and then parking until the
    # replies wake it. The first forward measures them (nack_us past the delay: a NACKed
    # duck gives no sample, Karn's rule). idle_expect=false: never.
    cl = duckpipe_cluster_factory(
        2, duck_args=["--delay-us", "10000"], nack_us=40_000, idle_expect=expect
    )
    mlp = GeluMlp.random(HIDDEN, FFN, seed=3)
    rng = np.random.default_rng(9)
    forwards = 5
    with duckpipe.connect(cl.control, slots=4, slot_size=4096) as c:
        c.load_weights(1, mlp, progress=False)
        c.forward(1, _x(rng, 1), timeout=10)  # measures the ducks' reply times
        before = c.stats().counters
        for _ in range(forwards):
            x = _x(rng, 1)
            np.testing.assert_allclose(
                c.forward(1, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5
            )
        n = {k: v - before[k] for k, v in c.stats().counters.items()}
    assert n["forwards_ok"] == forwards, n
    if expect:
        # one a forward at least; a stall past the RTO (30 ms) NACKs a duck, and a forward
        # NACKed measures nothing: the next one may then not park
        assert n["parks_expecting"] >= forwards - 1, n
    else:
        assert n["parks_expecting"] == 0, n
