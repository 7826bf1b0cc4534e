"""Repair, not reload: a duck that restarted lost its banks; ``Client.repair(layer)``
streams exactly those banks again (counted by the dataplane: ``repair_bytes``), the layer
is ready again, and forwards are exact. Against the mock and the C dataplane."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import BadInput, DuckLost
from duckpipe.moe import MoeMlp
from duckpipe.testing import set_faults

HIDDEN, EFFN, N_EXPERTS = 32, 16, 8
RESTARTED = 3  # the duck that restarts


class _Mock:
    """Four mock ducks; duck 3 restarts when told (the mock's restarted_ducks fault)."""

    def __init__(self, factory) -> None:
        self.control = factory(ducks=4).control

    def restart(self) -> None:
        set_faults(self.control, restarted_ducks=[RESTARTED])


class _Real:
    """Four emulated ducks and the C dataplane; duck 3's emulator forgets its layers once
    it computed its first forward (``--restart-after 1``), as a rebooted duck would."""

    def __init__(self, factory) -> None:
        self.control = factory(4, groups=[(3, []), (1, ["--restart-after", "1"])]).control

    def restart(self) -> None:
        pass  # it forgot them after the first forward it computed


@pytest.fixture(params=["mock", "real"])
def ducks(request):
    if request.param == "mock":
        return _Mock(request.getfixturevalue("duckpipe_mock_factory"))
    return _Real(request.getfixturevalue("duckpipe_cluster_factory"))


def _count(c: duckpipe.Client) -> dict[str, int]:
    return c.stats().counters


def _lose_duck_3(c: duckpipe.Client, restart, layer: int, forward) -> None:
    """The first forward reaches duck 3, which then restarts; the next one that needs it
    fails DuckLost naming the repair, and Layers lists it lost."""
    forward()
    restart()
    with pytest.raises(
        DuckLost,
        match=rf"no layer {layer} \(restarted\?\); repair it: "
        rf"client.repair\({layer}\)",
    ):
        forward()
    (info,) = [li for li in c.layers() if li.layer == layer]
    assert (info.ready, info.failed, info.lost) == (False, False, [RESTARTED])
    # known lost now: the dataplane fails it at dispatch, asking no duck (so none says
    # NO_LAYER again)
    no_layer = _count(c)["no_layer_replies"]
    with pytest.raises(DuckLost, match=rf"client.repair\({layer}\)"):
        forward()
    assert _count(c)["no_layer_replies"] == no_layer


def test_repair_streams_only_the_restarted_ducks_moe_bank_and_forwards_are_exact(ducks):
    # 8 experts, 2 per duck, and a shared expert cut over ducks 1 and 3: duck 3's bank is
    # experts 6 and 7 and its half of the shared expert
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=30)
    moe = dataclasses.replace(moe, shared_ducks=[1, 3])
    rng = np.random.default_rng(30)
    x = rng.standard_normal((6, HIDDEN)).astype(np.float32)
    idx = np.array([[0, 7], [6, 2], [3, 4], [5, 1], [7, 6], [2, 0]], np.int32)
    w = rng.random((6, 2)).astype(np.float32)
    want = moe.reference(x, idx, w)
    with duckpipe.connect(ducks.control) as c:
        info = c.load_weights(40, moe, ducks=[0, 1, 2, 3])
        bank = dict(zip(info.ducks, info.shard_sizes, strict=True))[RESTARTED]
        assert bank == 2 * EFFN + EFFN // 2  # its two experts and half the shared expert
        bank_bytes = 3 * HIDDEN * bank * 4  # w_gate, w_up, w_down float32
        layer_bytes = 3 * HIDDEN * info.ffn * 4

        def forward():
            return c.forward(40, x, routing=(idx, w), timeout=5)

        _lose_duck_3(c, ducks.restart, 40, forward)
        before = _count(c)
        info = c.repair(40)
        after = _count(c)
        sent = after["weight_bytes"] - before["weight_bytes"]
        assert sent == after["repair_bytes"] - before["repair_bytes"] == bank_bytes
        assert sent < layer_bytes / 3  # the whole layer is 3.6x that
        assert after["layers_repaired"] - before["layers_repaired"] == 1
        assert (info.ready, info.lost) == (True, [])
        np.testing.assert_allclose(forward(), want, rtol=1e-4, atol=1e-5)
        assert c.repair(40).ready  # nothing lost: nothing sent
        assert _count(c)["weight_bytes"] == after["weight_bytes"]


def test_a_duck_that_restarts_costs_no_forward_when_its_experts_have_replicas(ducks):
    # every expert on two ducks (e and e + 1, mod 4), no shared expert: the forward that
    # finds duck 3 restarted (NO_LAYER) fails its rows over to their other replicas within
    # it, exact; later forwards go around it until the repair brings it back
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, seed=31)
    placement = [[e % 4, (e + 1) % 4] for e in range(N_EXPERTS)]
    rng = np.random.default_rng(31)
    x = rng.standard_normal((8, HIDDEN)).astype(np.float32)
    idx = np.array([[e, (e + 3) % N_EXPERTS] for e in range(8)], np.int32)
    w = rng.random((8, 2)).astype(np.float32)
    want = moe.reference(x, idx, w)
    with duckpipe.connect(ducks.control) as c:
        c.load_weights(41, moe, ducks=[0, 1, 2, 3], placement=placement)

        def forward():
            return c.forward(41, x, routing=(idx, w), timeout=5)

        np.testing.assert_allclose(forward(), want, rtol=1e-4, atol=1e-5)
        ducks.restart()
        before = _count(c)
        np.testing.assert_allclose(forward(), want, rtol=1e-4, atol=1e-5)  # failed over
        after = _count(c)
        assert after["no_layer_replies"] - before["no_layer_replies"] == 1
        assert after["moe_failovers"] - before["moe_failovers"] == 1
        (info,) = [li for li in c.layers() if li.layer == 41]
        assert info.lost == [RESTARTED]
        np.testing.assert_allclose(forward(), want, rtol=1e-4, atol=1e-5)  # routed around
        assert _count(c)["no_layer_replies"] == after["no_layer_replies"]
        assert c.repair(41, progress=False).lost == []
        np.testing.assert_allclose(forward(), want, rtol=1e-4, atol=1e-5)


def test_a_dense_layer_serves_on_the_other_ducks_and_is_repaired_exactly(ducks):
    mlp = GeluMlp.random(HIDDEN, 64, seed=31)  # with b_down, which a repair leaves alone
    x = np.random.default_rng(31).standard_normal((3, HIDDEN)).astype(np.float32)
    with duckpipe.connect(ducks.control) as c:
        c.load_weights(41, mlp)
        _lose_duck_3(c, ducks.restart, 41, lambda: c.forward(41, x, timeout=5))
        partial = c.forward(41, x, ducks=[0, 1, 2])  # the others still serve
        assert partial.shape == x.shape
        before = _count(c)
        assert c.repair(41).ready
        sent = _count(c)["repair_bytes"] - before["repair_bytes"]
        # duck 3's shard: w_up [32, 16], b_up [16], w_down [16, 32], float32
        assert sent == (HIDDEN * 16 + 16 + 16 * HIDDEN) * 4
        np.testing.assert_allclose(c.forward(41, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_repair_refuses_a_duck_that_did_not_lose_the_layer(ducks):
    from duckpipe.schema import control as ctl

    mlp = GeluMlp.random(HIDDEN, 64, seed=32)
    with duckpipe.connect(ducks.control) as c:
        c.load_weights(42, mlp)
        with pytest.raises(BadInput, match="layer 42: duck 2 did not lose it"):
            c._session.request(lambda rid: ctl.RepairLayer(req_id=rid, layer=42, ducks=[2]))
        x = np.ones((1, HIDDEN), np.float32)
        np.testing.assert_allclose(c.forward(42, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_forwards_on_the_other_ducks_flow_while_a_repair_streams(duckpipe_cluster_factory):
    # a shared layer (the test runs as the admin) so that a second client forwards on it
    # while the loader repairs duck 3's 4 MiB shard. The C dataplane only: the mock, one
    # thread, serves the two clients in turns, and both share this process's GIL here
    ducks = _Real(duckpipe_cluster_factory)
    import threading
    import time

    mlp = GeluMlp.random(512, 4096, seed=33)
    x = np.ones((1, 512), np.float32)
    with duckpipe.connect(ducks.control) as c, duckpipe.connect(ducks.control) as other:
        c.load_weights(43, mlp, shared=True)
        _lose_duck_3(c, ducks.restart, 43, lambda: c.forward(43, x, timeout=5))
        done: list[float] = []
        stop = threading.Event()

        failed: list[BaseException] = []

        def serve() -> None:
            try:
                while not stop.is_set():
                    other.forward(43, x, ducks=[0, 1, 2], timeout=5)
                    done.append(time.monotonic())
            except BaseException as e:  # said below, not lost with the thread
                failed.append(e)
                raise

        t = threading.Thread(target=serve)
        t.start()
        try:
            while not done and not failed:  # serving before the repair begins
                time.sleep(0.001)
            start = time.monotonic()
            assert c.repair(43).ready
            end = time.monotonic()
        finally:
            stop.set()
            t.join(10)
        assert not failed
        during = [s for s in done if start < s < end]
        print(f"repair took {1e3 * (end - start):.1f} ms; {len(during)} forwards meanwhile")
        assert during  # none waited for the repair to end
        np.testing.assert_allclose(c.forward(43, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_a_repair_the_duck_does_not_acknowledge_leaves_it_lost_and_the_layer_serving(
    duckpipe_cluster_factory,
):
    # the C dataplane: duck 3 stops between its loss and the repair, before 3 missed pings
    # would have the dataplane refuse the repair up front (the mock knows its dead ducks
    # at once: DucksUnreachable, test_load_failures.py)
    from duckpipe.errors import DataplaneFault
    from duckpipe.launch.ducks import DucksProcess

    cl = duckpipe_cluster_factory(
        4,
        groups=[(3, []), (1, ["--restart-after", "1"])],
        ping_ms=2000,
        weight_timeout_ms=300,
        weight_rto_us=20_000,
    )
    mlp = GeluMlp.random(HIDDEN, 64, seed=34)
    x = np.ones((2, HIDDEN), np.float32)
    with duckpipe.connect(cl.control) as c:
        c.load_weights(44, mlp)
        _lose_duck_3(c, lambda: None, 44, lambda: c.forward(44, x, timeout=5))
        cl.emulators[1].stop()
        with pytest.raises(
            DataplaneFault, match=r"repairing layer 44 failed: duck 3 did not acknowledge"
        ) as e:
            c.repair(44)
        assert e.value.missing == (RESTARTED,)
        (info,) = c.layers()
        assert (info.ready, info.failed, info.lost) == (False, False, [RESTARTED])
        assert c.forward(44, x, ducks=[0, 1, 2]).shape == x.shape  # the others serve
        cl.emulators[1] = DucksProcess(ducks=1, base_port=cl.duck_base + 3, first_id=3).start()
        assert c.repair(44).ready  # once it answers, a repair again brings it back
        np.testing.assert_allclose(c.forward(44, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
