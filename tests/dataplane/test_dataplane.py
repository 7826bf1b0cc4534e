"""The C dataplane over real UDP with emulated ducks: loss, dead ducks, garbage, NICs."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, Status, SwiGluMlp
from duckpipe.errors import DataplaneLost, DuckLost, ForwardTimeout, StaleEpoch
from duckpipe.moe import MoeMlp
from duckpipe.testing import killed_client_segment, mapped_by, wait_until_gone

pytestmark = pytest.mark.dataplane


@pytest.fixture
def cluster_factory(duckpipe_cluster_factory):
    return duckpipe_cluster_factory


def _counters(client) -> dict[str, int]:
    return client.stats().counters


def test_every_forward_completes_correctly_with_5_percent_loss(cluster_factory):
    cl = cluster_factory(8, duck_args=["--drop", "0.05", "--seed", "7"], nack_us=1000)
    mlp = SwiGluMlp.random(1024, 512, seed=1)  # 4 KiB per row: three datagrams
    rng = np.random.default_rng(0)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        for _ in range(60):
            x = rng.standard_normal((4, 1024)).astype(np.float32)
            np.testing.assert_allclose(
                c.forward(1, x, timeout=10), mlp.reference(x), rtol=2e-4, atol=2e-5
            )
        n = _counters(c)
    assert n["forwards_ok"] == 60 and n["timeouts"] == 0
    assert n["nacks_sent"] > 0 and n["weight_retransmits"] > 0
    assert n["retransmits"] + n["rx_duplicates"] > 0 or n["nacks_received"] > 0


@pytest.mark.parametrize(
    ("hidden", "copied"),
    [(1024, False), (16, True)],
    ids=["rows-of-4KiB-in-place", "rows-of-64B-copied"],
)
def test_routed_forwards_under_5_percent_loss_are_resent_from_the_slot(
    cluster_factory, hidden, copied
):
    # A routed forward's rows go out from the client's slot (a unicast's by its row map)
    # and a duck's NACK is answered from the same places (dp_moe_resend). Rows of 4 KiB go
    # in place; rows of 64 bytes, more than 16 to a datagram, are copied into it (the one
    # case moe_copied_bytes counts, docs/api.md).
    cl = cluster_factory(4, duck_args=["--drop", "0.05", "--seed", "11"], nack_us=1000)
    moe = MoeMlp.random(8, hidden, 8, shared=False, seed=11)
    rng = np.random.default_rng(11)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, moe)  # 2 experts on each duck
        for n in range(16):
            x = rng.standard_normal((48, hidden)).astype(np.float32)
            i = np.argsort(rng.random((48, 8)), axis=1)[:, :2].astype(np.int32)
            w = rng.random((48, 2)).astype(np.float32)
            mode = ("unicast", "broadcast")[n % 2]
            np.testing.assert_allclose(
                c.forward(1, x, routing=(i, w), moe_send=mode, timeout=10),
                moe.reference(x, i, w),
                rtol=1e-4,
                atol=1e-5,
            )
        k = _counters(c)
    assert k["moe_unicasts"] == 8 and k["moe_broadcasts"] == 8 and k["timeouts"] == 0
    assert k["nacks_received"] > 0 and k["retransmits"] > 0
    assert (k["moe_copied_bytes"] > 0) == copied


def test_a_duck_that_stops_answering_times_out_by_name_and_others_continue(cluster_factory):
    cl = cluster_factory(groups=[(3, []), (1, ["--stop-after", "2"])])
    mlp = GeluMlp.random(64, 64, seed=2)
    x = np.ones((1, 64), np.float32)
    with duckpipe.connect(cl.control, forward_timeout=0.3) as c:
        c.load_weights(1, mlp)
        for _ in range(2):
            np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        t0 = time.monotonic()
        with pytest.raises(ForwardTimeout, match=r"ducks \[3\] did not answer") as e:
            c.forward(1, x, timeout=5)
        assert 0.25 <= time.monotonic() - t0 < 3.0
        assert e.value.missing == (3,)
        partial = c.forward(1, x, ducks=[0, 1, 2])  # the healthy ducks still serve
        assert partial.shape == x.shape
        assert _counters(c)["timeouts"] == 1


def test_a_duck_that_lost_its_weights_fails_the_forward_naming_it(cluster_factory):
    cl = cluster_factory(groups=[(2, []), (1, ["--restart-after", "1"])])
    mlp = GeluMlp.random(32, 48, seed=3)
    x = np.ones((1, 32), np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        c.forward(1, x)
        with pytest.raises(DuckLost, match="duck 2 holds no layer 1"):
            c.forward(1, x, timeout=5)
        assert _counters(c)["no_layer_replies"] >= 1


def test_when_every_duck_restarts_duck_lost_names_them_all_and_layers_says_not_ready(
    cluster_factory,
):
    cl = cluster_factory(groups=[(8, ["--restart-after", "1"])])
    mlp = GeluMlp.random(32, 48, seed=3)
    x = np.ones((1, 32), np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        c.forward(1, x)  # each duck computes it, then forgets its weights
        (info,) = c.layers()
        assert info.ready and info.lost == []  # the dataplane cannot know yet
        with pytest.raises(DuckLost) as e:
            c.forward(1, x, timeout=5)
        assert e.value.missing == tuple(range(8))
        assert "ducks [0, 1, 2, 3, 4, 5, 6, 7] hold no layer 1 (restarted?)" in str(e.value)
        (info,) = c.layers()
        assert (info.ready, info.failed, info.lost) == (False, False, list(range(8)))
        c.load_weights(1, mlp)  # a reload restores it
        (info,) = c.layers()
        assert (info.ready, info.lost) == (True, [])


def test_ducks_that_lost_a_layer_are_not_ready_for_it_and_the_others_still_serve(
    cluster_factory,
):
    from duckpipe.observe import stats_reader

    cl = cluster_factory(groups=[(2, []), (2, ["--restart-after", "1"])])
    mlp = GeluMlp.random(32, 48, seed=3)
    x = np.ones((1, 32), np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        c.forward(1, x)
        with pytest.raises(DuckLost, match=r"ducks \[2, 3\] hold no layer 1") as e:
            c.forward(1, x, timeout=5)
        assert e.value.missing == (2, 3)
        (info,) = c.layers()
        assert (info.ready, info.lost) == (False, [2, 3])
        assert c.forward(1, x, ducks=[0, 1]).shape == x.shape  # the others still serve
        with pytest.raises(DuckLost, match="duck 3 holds no layer 1"):
            c.forward(1, x, ducks=[3], timeout=5)
        deadline = time.monotonic() + 5  # the stats segment's layer counts follow
        while time.monotonic() < deadline:
            snap = stats_reader.read_snapshot(control=cl.control)
            if [d.layers for d in snap.ducks] == [1, 1, 0, 0]:
                break
            time.sleep(0.05)
        assert [d.layers for d in snap.ducks] == [1, 1, 0, 0]


def test_wait_runs_from_the_first_send_to_the_last_partial(duckpipe_null_factory):
    """Timings.wait_ns as defined (docs/walkthrough.md, the schema): first send -> last
    partial in. So it holds the whole send: no duck answers before its last chunk went
    out. The null backend answers each duck as its copy goes out, as loopback ducks on a
    busy core do during a long send; measured from the sends' end, wait was a sliver of
    send (380 ns against 154,262)."""
    dp = duckpipe_null_factory(4)
    x = np.ones((16, 4096), np.float32)  # 256 KiB: ~180 chunks to each duck
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, GeluMlp.random(4096, 64, seed=5))
        for _ in range(10):
            with c.claim(x.shape) as slot:
                slot.array[:] = x
                fwd = c.submit(slot, 1)
            with fwd:
                fwd.result()
                t = fwd.timings
            assert t.send_ns > 0 and t.wait_ns >= t.send_ns, t
            assert t.wait_ns >= max(t.duck_compute_ns) and t.wait_ns >= t.spread_ns, t


def test_garbage_udp_is_dropped_by_the_kernel_and_counted(cluster_factory):
    cl = cluster_factory(2)
    mlp = GeluMlp.random(32, 32, seed=4)
    x = np.ones((2, 32), np.float32)
    junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        before = _counters(c)
        header = bytearray(80)
        header[0:4] = b"DUCK"
        header[4] = 1
        header[5] = 2  # PARTIAL, from nobody in the topology
        for dgram in (b"", b"x", b"\x00" * 200, bytes(header), b"DUCK" + os.urandom(300)):
            junk.sendto(dgram, ("127.0.0.1", cl.host_ports[0]))
        np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        time.sleep(0.1)
        after = _counters(c)
    junk.close()
    # from no duck's address and port: the socket's kernel filter drops them before the
    # worker wakes (counted by the kernel, read as rxq_overflows), never the worker's parse
    refused = sum(after[k] - before[k] for k in ("rx_malformed", "rx_unknown_sender"))
    assert refused == 0
    assert after["rxq_overflows"] - before["rxq_overflows"] >= 4  # "" may not be one


def test_killing_the_dataplane_fails_pending_forwards_quickly(cluster_factory):
    cl = cluster_factory(2, duck_args=["--delay-us", "3000000"])
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, GeluMlp.random(16, 16, seed=5))
        slot = c.claim((1, 16))
        slot.array[:] = 1
        fwd = c.submit(slot, 1)
        cl.dataplane.kill()
        t0 = time.monotonic()
        with pytest.raises(DataplaneLost):
            fwd.result(timeout=10)
        assert time.monotonic() - t0 < 3
    cl.dataplane.proc = None  # killed on purpose: no clean exit to check
    cl.exit_code = 0


def test_the_dataplane_reclaims_a_killed_clients_segment(cluster_factory):
    cl = cluster_factory(1)
    name = killed_client_segment(cl.control)
    assert wait_until_gone(name), f"{name} is still mapped by {mapped_by(name)}"
    with duckpipe.connect(cl.control) as c:
        assert _counters(c)["clients_reclaimed"] == 1


def test_ducks_on_two_nics_are_reduced_together(cluster_factory):
    cl = cluster_factory(6, nics=2)
    mlp = GeluMlp.random(48, 96, seed=6)
    rng = np.random.default_rng(1)
    with duckpipe.connect(cl.control) as c:
        assert len(c.topology().nics) == 2
        c.load_weights(1, mlp)
        for _ in range(10):
            x = rng.standard_normal((3, 48)).astype(np.float32)
            np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        ducks_on_lo1 = [d.id for d in c.topology().ducks if d.nic == "lo1"]
        y = c.forward(1, x, ducks=ducks_on_lo1)  # one NIC only
        assert y.shape == x.shape


def test_echo_compute_is_cheap_and_checkable(cluster_factory):
    cl = cluster_factory(4, duck_args=["--compute", "echo"])
    mlp = GeluMlp.random(256, 8, seed=7, b_down=False)
    x = np.random.default_rng(2).standard_normal((2, 256)).astype(np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        np.testing.assert_allclose(c.forward(1, x), x * (1 + 2 + 3 + 4), rtol=1e-6)
        fwd = c.submit(_filled(c, x), 1)
        fwd.result(timeout=5)
        t = fwd.timings
        assert len(t.duck_compute_ns) == 4
        assert 0 < t.send_ns < 5e9 and 0 < t.wait_ns < 5e9 and t.spread_ns < 5e9  # no wrap
        assert fwd.answered == (0, 1, 2, 3)


def test_large_activations_go_out_as_gso_sends(cluster_factory):
    cl = cluster_factory(2)
    mlp = GeluMlp.random(1024, 64, seed=8)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        x = np.random.default_rng(3).standard_normal((16, 1024)).astype(np.float32)  # 64 KiB
        np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        n = _counters(c)
    assert n["gso_sends"] > 0 and n["tx_errors"] == 0 and n["rxq_overflows"] == 0
    # loading is windowed: no retransmission storm on a lossless path
    assert n["weight_retransmits"] <= n["weight_datagrams"] // 4


def test_float16_layers_accumulate_in_float32(cluster_factory):
    cl = cluster_factory(8)
    mlp = SwiGluMlp.random(128, 256, dtype=np.float16, seed=9)
    x = np.random.default_rng(4).standard_normal((5, 128)).astype(np.float16)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        y = c.forward(1, x)
    assert y.dtype == np.float16
    np.testing.assert_allclose(
        y.astype(np.float32), mlp.reference(x).astype(np.float32), rtol=2e-2, atol=2e-2
    )


def test_forward_status_is_ok_and_result_slot_agrees_with_zmq(cluster_factory):
    cl = cluster_factory(3)
    mlp = GeluMlp.random(16, 24, seed=10)
    with duckpipe.connect(cl.control, wait="spin") as c:
        c.load_weights(1, mlp)
        for _ in range(50):
            fwd = c.submit(_filled(c, np.ones((1, 16), np.float32)), 1)
            fwd.result(timeout=5)
            assert fwd.status == Status.OK and fwd.answered == (0, 1, 2)
            fwd.release()
        assert c.counters["completion_mismatch"] == 0


def _filled(client, x):
    slot = client.claim(x.shape, x.dtype)
    slot.array[:] = x
    return slot


def test_dedicated_threads_serve_forwards_like_the_shared_one(cluster_factory):
    cl = cluster_factory(4, threads="dedicated", idle="yield")
    mlp = GeluMlp.random(64, 64, seed=11)
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(1, mlp)
        for _ in range(20):
            np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_socket_backend_refuses_backend_options(tmp_path):
    from duckpipe.launch.binaries import find_binary
    from duckpipe.launch.dataplane import write_config
    from duckpipe.launch.topology import loopback
    from duckpipe.testing import cluster_class_or_skip

    cluster_class_or_skip()
    config = write_config(loopback(1), f"ipc://{tmp_path}/c", tmp_path)
    r = subprocess.run(
        [str(find_binary("duckpipe-dataplane")), "--config", str(config), "--", "-l", "0"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert r.returncode == 2 and "socket backend takes no options" in r.stderr


def test_a_build_without_dpdk_refuses_the_dpdk_backend_clearly(tmp_path):
    # here, not in test_dpdk.py: it needs neither root nor DPDK, only a build without it
    from duckpipe.errors import DuckpipeError
    from duckpipe.launch.binaries import find_binary
    from duckpipe.launch.dataplane import DataplaneProcess
    from duckpipe.launch.topology import Duck, Nic, Topology

    try:
        binary = find_binary("duckpipe-dataplane")
    except DuckpipeError as e:
        pytest.skip(str(e))
    have = subprocess.run([str(binary), "--backends"], capture_output=True, text=True)
    if "dpdk" in have.stdout.split():
        pytest.skip("this dataplane has DPDK (the refusal is for builds without it)")
    topo = Topology(
        nics=[
            Nic(name="p0", backend="dpdk", interface="net_af_packet0", host_ip="10.77.0.1",
                ducks=[Duck(id=0, ip="10.77.0.10", port=47100)])
        ]
    )  # fmt: skip
    dp = DataplaneProcess(topo)
    try:
        with pytest.raises(DuckpipeError, match="built without DPDK: install libdpdk-dev"):
            dp.start()
    finally:
        dp.stop()
        dp.close()


def test_a_forward_in_flight_when_the_epoch_moves_is_not_committed(cluster_factory):
    cl = cluster_factory(2, duck_args=["--delay-us", "300000"])
    with duckpipe.connect(cl.control) as a, duckpipe.connect(cl.control) as b:
        a.load_weights(1, GeluMlp.random(16, 16, seed=12))
        fwd = a.submit(_filled(a, np.ones((1, 16), np.float32)), 1)
        time.sleep(0.1)  # picked up and sent; the ducks hold their answers for 300 ms
        b.set_epoch()
        with pytest.raises(StaleEpoch, match="epoch moved"):
            fwd.result(timeout=5)
        assert a.epoch == b.epoch  # the completion told a where the dataplane went
        assert a.forward(1, np.ones((1, 16), np.float32), timeout=5).shape == (1, 16)


@pytest.mark.slow  # 44 s: a thousand messages
def test_random_control_messages_never_hurt_the_dataplane(cluster_factory):
    """A thousand msgpack maps with real message names and random fields."""
    import msgspec
    import zmq

    cl = cluster_factory(2)
    rng = random.Random(7)
    names = [
        "Attach",
        "Detach",
        "Heartbeat",
        "GetTopology",
        "GetLayers",
        "LoadWeights",
        "SetEpoch",
        "GetStats",
        "SetFaults",
        "Nope",
        "",
    ]
    keys = [
        "req_id",
        "layer",
        "kind",
        "dtype",
        "hidden",
        "ffn",
        "ducks",
        "shard_sizes",
        "has_b_down",
        "epoch",
        "segment",
        "pid",
        "abi_major",
        "protocol",
        "name",
    ]

    def value(depth: int = 0):
        choices = [
            lambda: rng.randrange(-(2**63), 2**64),
            lambda: rng.randrange(0, 300),
            lambda: "x" * rng.randrange(0, 300),
            lambda: "/dev/shm/" + "a" * rng.randrange(0, 50),
            lambda: rng.random(),
            lambda: None,
            lambda: rng.random() < 0.5,
            lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
        ]
        if depth < 2:
            choices.append(lambda: [value(depth + 1) for _ in range(rng.randrange(0, 300))])
            choices.append(lambda: {"k": value(depth + 1)})
        return rng.choice(choices)()

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(cl.control)
    try:
        for _ in range(1000):
            msg = {k: value() for k in rng.sample(keys, rng.randrange(len(keys)))}
            if rng.random() < 0.9:
                msg["type"] = rng.choice(names)
            sock.send(msgspec.msgpack.encode(msg))
            while sock.poll(0):
                sock.recv()
        # The requests are handled in order: once this one's Ack is back, no random
        # SetEpoch is still queued to make the next client's epoch stale (a slow build,
        # ThreadSanitizer's, is still working through the backlog otherwise).
        sock.send(msgspec.msgpack.encode({"type": "Heartbeat", "req_id": 2**62}))
        while True:
            assert sock.poll(30_000), "the dataplane stopped answering"
            if msgspec.msgpack.decode(sock.recv()).get("req_id") == 2**62:
                break
    finally:
        sock.close()
    with duckpipe.connect(cl.control) as c:  # still serving, and correct
        mlp = GeluMlp.random(32, 32, seed=13)
        c.load_weights(1, mlp)
        x = np.ones((1, 32), np.float32)
        np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        assert c.stats().counters["bad_control_messages"] > 0


def _fails_with_fanout_first(tmp_path, times: int):
    """A stand-in binary: prints the EAL's fanout refusal and exits 1 the first ``times``
    starts (as a dataplane whose af_packet group id another process holds), then runs the
    real dataplane."""
    from duckpipe.launch.binaries import find_binary
    from duckpipe.launch.dataplane import FANOUT_TAKEN

    count = tmp_path / "starts"
    script = tmp_path / "dataplane"
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -lt {times} ]; then\n'
        f'  echo "rte_pmd_init_internals(): net_af_packet0: {FANOUT_TAKEN} on AF_PACKET '
        'socket for dpk0:Invalid argument"; exit 1\n'
        "fi\n"
        f'exec {find_binary("duckpipe-dataplane")} "$@"\n'
    )
    script.chmod(0o755)
    return script, count


def test_a_start_that_meets_another_processs_fanout_group_is_tried_again(
    tmp_path, caplog, free_loopback
):
    from duckpipe.launch.dataplane import DataplaneProcess

    script, count = _fails_with_fanout_first(tmp_path, 2)
    with (
        DataplaneProcess(free_loopback(), binary=script) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        assert c.stats().counters["forwards"] == 0  # the third start answers
    assert count.read_text().strip() == "3"
    assert caplog.text.count("fanout group id") == 2, caplog.text


def test_a_fanout_group_that_stays_taken_fails_after_three_starts_saying_so(
    tmp_path, free_loopback
):
    from duckpipe.errors import DataplaneUnavailable
    from duckpipe.launch.dataplane import FANOUT_TAKEN, DataplaneProcess

    script, count = _fails_with_fanout_first(tmp_path, 99)
    dp = DataplaneProcess(free_loopback(), binary=script)
    try:
        with pytest.raises(DataplaneUnavailable, match=FANOUT_TAKEN):
            dp.start()
    finally:
        dp.stop()
        dp.close()
    assert count.read_text().strip() == "3"
