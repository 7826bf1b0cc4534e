"""Forwards through the dataplane match the numpy reference, for both MLP kinds."""

from __future__ import annotations

import os

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, Status, SwiGluMlp
from duckpipe.errors import RingFull

TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float16: dict(rtol=2e-2, atol=2e-2)}
TOL1 = TOL[np.float32]


def _layer_id(kind: str, degree: int, dtype) -> int:
    return {"gelu": 100, "swiglu": 200}[kind] + degree * 2 + (dtype == np.float16)


def _mlp(kind: str, dtype, seed: int):
    if kind == "gelu":
        return GeluMlp.random(64, 96, dtype=dtype, seed=seed)
    return SwiGluMlp.random(64, 96, dtype=dtype, seed=seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("degree", [1, 4, 24])
@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_forward_matches_numpy_reference(client, kind, degree, dtype):
    mlp = _mlp(kind, dtype, seed=degree)
    layer = _layer_id(kind, degree, dtype)
    info = client.load_weights(layer, mlp, ducks=list(range(degree)))
    assert info.ready and info.ducks == list(range(degree)) and sum(info.shard_sizes) == mlp.ffn
    rng = np.random.default_rng(degree)
    for rows in (1, 3, 16):
        x = rng.standard_normal((rows, mlp.hidden)).astype(dtype)
        y = client.forward(layer, x)
        assert y.dtype == dtype and y.shape == x.shape
        np.testing.assert_allclose(
            y.astype(np.float32), mlp.reference(x).astype(np.float32), **TOL[dtype]
        )


def test_result_is_a_view_of_the_result_slot_and_timings_are_reported(client):
    mlp = GeluMlp.random(32, 48, seed=3)
    client.load_weights(1, mlp, ducks=[0, 1, 2])
    x = np.ones((2, 32), np.float32)
    with client.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        fwd = client.submit(slot, 1)
    with fwd:
        y = fwd.result(timeout=10)
        assert not y.flags.owndata  # no copy: it lives in shared memory
        np.testing.assert_allclose(y, mlp.reference(x), rtol=1e-5, atol=1e-6)
        assert fwd.status == Status.OK
        assert fwd.answered == (0, 1, 2) and fwd.missing == ()
        t = fwd.timings
        assert t.prepare_ns >= 0 and t.wait_ns > 0 and t.reduce_ns > 0
        assert len(t.duck_compute_ns) == 3 and all(n > 0 for n in t.duck_compute_ns)
    assert client.counters["completion_mismatch"] == 0


@pytest.mark.parametrize("wait", ["spin", "block", "hybrid"])
def test_every_wait_strategy_returns_the_same_result(dataplane, wait):
    mlp = SwiGluMlp.random(32, 64, seed=4)
    with duckpipe.connect(dataplane.control, wait=wait) as c:
        c.load_weights(2, mlp, ducks=[0, 5, 9, 23])
        x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
        for _ in range(20):
            np.testing.assert_allclose(
                c.forward(2, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5
            )
        assert c.counters["completion_mismatch"] == 0 and c.counters["stale_completions"] == 0


def test_forward_on_a_subset_of_ducks_sums_only_their_partials(client):
    mlp = GeluMlp.random(16, 40, seed=5, b_down=False)
    client.load_weights(3, mlp, ducks=[0, 1, 2, 3])  # 10 columns each
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    y = client.forward(3, x, ducks=[1, 3])
    want = sum(
        duckpipe.client.models.duck_partial(mlp.kind, x, list(mlp.shard(lo, lo + 10)))
        for lo in (10, 30)
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_all_slots_in_flight_at_once_complete_in_any_order(dataplane):
    mlp = GeluMlp.random(32, 32, seed=6)
    with duckpipe.connect(dataplane.control, slots=16, slot_size=4096) as c:
        c.load_weights(4, mlp, ducks=[0, 1])
        xs = [np.full((1, 32), i / 10, np.float32) for i in range(16)]
        fwds = []
        for x in xs:
            slot = c.claim(x.shape, x.dtype)
            slot.array[:] = x
            fwds.append(c.submit(slot, 4))
        for x, f in reversed(list(zip(xs, fwds, strict=True))):
            np.testing.assert_allclose(f.result(timeout=10), mlp.reference(x), rtol=1e-5, atol=1e-6)
            f.release()


def _every_slot_is_free(c: duckpipe.Client, shape: tuple[int, ...]) -> bool:
    """Whether all of the client's slots can be claimed at once (then given back). The
    short timeout takes in completions already sent, but cannot wait out a slot that a
    live Forward or result holds."""
    held: list[duckpipe.Slot] = []
    try:
        for _ in range(c.slot_count):
            held.append(c.claim(shape, np.float32, timeout=0.2))
        return True
    except RingFull:
        return False
    finally:
        for slot in held:
            slot.release()


def test_dropping_a_forward_frees_its_slot(dataplane):
    mlp = GeluMlp.random(16, 16, seed=7)
    with duckpipe.connect(dataplane.control, slots=2, slot_size=4096) as c:
        c.load_weights(5, mlp, ducks=[0])
        x = np.ones((1, 16), np.float32)
        fwd = c.submit(_filled(c, x), 5)
        fwd.result(timeout=10)  # the array is dropped at once
        assert not _every_slot_is_free(c, x.shape)  # the Forward holds its slot
        del fwd  # no gc.collect(): no reference cycle may keep a Forward
        assert _every_slot_is_free(c, x.shape)


def test_a_result_outlives_its_dropped_forward(dataplane):
    """The array result() returns keeps its Forward (and so its slot) while any view
    of it lives: slots are reused last-in-first-out, so a freed slot would be the very
    next forward's, and the kept array would read that forward's result."""
    mlp = GeluMlp.random(16, 16, seed=11)
    with duckpipe.connect(dataplane.control, slots=2, slot_size=4096) as c:
        c.load_weights(5, mlp, ducks=[0])
        x = np.full((1, 16), 0.5, np.float32)
        y = c.submit(_filled(c, x), 5).result(timeout=10)  # the Forward is dropped here
        want = mlp.reference(x)
        for k in range(4):  # each would take y's slot, were it free
            xk = np.full((1, 16), -1.0 - k, np.float32)
            np.testing.assert_allclose(c.forward(5, xk, timeout=10), mlp.reference(xk), **TOL1)
        np.testing.assert_allclose(y, want, **TOL1)
        row = y[0, 4:]  # a view of the view keeps it too
        del y
        assert not _every_slot_is_free(c, x.shape)
        np.testing.assert_allclose(row, want[0, 4:], **TOL1)
        del row  # the last view: the slot is free at once (no gc.collect())
        assert _every_slot_is_free(c, x.shape)


def test_a_dropped_client_closes_its_segment_once_its_last_handle_goes(dataplane):
    """Slots and Forwards hold the client's session, and nothing holds them back: the
    segment is closed when the last of them goes, at once (no gc.collect())."""
    c = duckpipe.connect(dataplane.control, slots=2, slot_size=4096)
    path = c.segment
    link = os.readlink(path)  # the memfd's name: a reused fd number reads otherwise
    slot = c.claim((1, 16))
    del c
    assert os.readlink(path) == link  # the slot keeps it
    del slot
    assert not path.exists() or os.readlink(path) != link


def test_two_clients_share_layers_and_get_their_own_results(dataplane):
    mlp = GeluMlp.random(24, 48, seed=8)
    with duckpipe.connect(dataplane.control) as a, duckpipe.connect(dataplane.control) as b:
        a.load_weights(6, mlp, ducks=[0, 1, 2], shared=True)  # a is the admin: same user
        xa = np.full((2, 24), 0.5, np.float32)
        xb = np.full((2, 24), -0.25, np.float32)
        fa = a.submit(_filled(a, xa), 6)
        fb = b.submit(_filled(b, xb), 6)
        np.testing.assert_allclose(fb.result(timeout=10), mlp.reference(xb), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fa.result(timeout=10), mlp.reference(xa), rtol=1e-5, atol=1e-6)
        stats = a.stats()
        assert {c.client_id for c in stats.clients} >= {a.client_id, b.client_id}


def _filled(client, x):
    slot = client.claim(x.shape, x.dtype)
    slot.array[:] = x
    return slot


@pytest.mark.parametrize("backing", ["devshm", "hugetlbfs"])
def test_forwards_work_on_both_backings(dataplane, backing):
    from duckpipe import host

    if backing == "hugetlbfs":
        if host.free_hugepages() < 2:
            pytest.skip(f"only {host.free_hugepages()} free 2 MiB hugepages; 2 are needed")
    mlp = GeluMlp.random(32, 64, seed=9)
    with duckpipe.connect(dataplane.control, slots=4, slot_size=65536, backing=backing) as c:
        assert c.backing == backing
        c.load_weights(12, mlp, ducks=[0, 1])
        x = np.random.default_rng(3).standard_normal((2, 32)).astype(np.float32)
        np.testing.assert_allclose(c.forward(12, x), mlp.reference(x), rtol=1e-5, atol=1e-6)


def test_datagrams_of_64_kib_on_loopback(duckpipe_cluster_factory):
    # loopback carries 64 KiB datagrams: the socket backend's receive buffers follow the
    # NIC's mtu (they were 9 KiB: a longer partial arrived truncated and was refused)
    cl = duckpipe_cluster_factory(2, mtu=65535, duck_args=["--mtu", "65535"])
    mlp = GeluMlp.random(8192, 64, seed=11)
    rng = np.random.default_rng(12)
    with duckpipe.connect(cl.control, slot_size=1 << 20) as c:
        c.load_weights(1, mlp)
        for rows in (1, 8):  # 32 KiB and 256 KiB: one datagram, then four per duck
            x = rng.standard_normal((rows, 8192)).astype(np.float32)
            np.testing.assert_allclose(
                c.forward(1, x, timeout=10), mlp.reference(x), rtol=2e-4, atol=2e-4
            )
        n = c.stats().counters
    assert n["rx_malformed"] == 0 and n["forwards_ok"] == 2, n
