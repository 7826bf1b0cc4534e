"""Placement rebalanced live (issue 30.5): ``load_weights(layer, moe, placement=new)`` on
a committed MoE layer its client loaded moves it while forwards flow, sending only the
banks of the ducks whose experts change (``move_bytes``). Both dataplanes move
it (docs/architecture.md, "Moving a live layer"). Another client's layer, and a layer with
a repair open, are refused on both."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

import duckpipe
from duckpipe.client.eplb import plan_placement
from duckpipe.client.weights import moe_view
from duckpipe.errors import BadInput, DuckLost, NotPermitted
from duckpipe.moe import MoeMlp
from duckpipe.schema import control as ctl
from duckpipe.testing import set_faults

# hidden 512: a changed bank is 3 MiB, several slots of chunks, so that the other
# client's forwards come in between them (the mock serves its clients in turns)
HIDDEN, EFFN, N_EXPERTS = 512, 256, 8
DUCKS = [0, 1, 2, 3]
# a skewed load whose EPLB plan moves experts between ducks 0 and 1 only: ducks 2 and 3
# keep experts 4 5 and 6 7 (the default placement's), so they must be sent nothing
LOAD = [50, 40, 1, 1, 30, 2, 3, 20]
RESTARTED = 3


def _moe(seed: int, hidden: int = HIDDEN, effn: int = EFFN) -> MoeMlp:
    # the shared expert cut over ducks 1 (which changes) and 3 (which does not)
    moe = MoeMlp.random(N_EXPERTS, hidden, effn, shared=True, seed=seed)
    return dataclasses.replace(moe, shared_ducks=[1, 3])


def _experts_on(placement, duck: int) -> list[int]:
    return [e for e, held in enumerate(placement) if duck in held]


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, HIDDEN)).astype(np.float32)
    idx = np.array([[0, 7], [6, 2], [3, 4], [5, 1], [7, 6], [2, 0]], np.int32)
    w = rng.random((6, 2)).astype(np.float32)
    return x, idx, w


@pytest.fixture(params=["mock", "real"])
def four_ducks(request) -> str:
    """The control address of four ducks behind the mock or the C dataplane."""
    if request.param == "mock":
        return request.getfixturevalue("duckpipe_mock_factory")(ducks=4).control
    return request.getfixturevalue("duckpipe_cluster_factory")(4).control


def test_a_live_layer_moves_to_a_planned_placement_sending_only_the_changed_banks(four_ducks):
    control = four_ducks
    moe = _moe(50)
    x, idx, w = _inputs(50)
    want = moe.reference(x, idx, w)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(control) as c, duckpipe.connect(control) as other:
        # shared (the test runs as the admin), so that a second client forwards on it
        info = c.load_weights(50, moe, ducks=DUCKS, shared=True)
        old = moe_view(info)
        assert old is not None
        changed = [d for d in DUCKS if _experts_on(new, d) != _experts_on(old.placement, d)]
        assert changed == [0, 1]  # the plan keeps ducks 2 and 3 as they are
        shared_cols = {1: EFFN // 2, 3: EFFN // 2}
        new_bank = {d: len(_experts_on(new, d)) * EFFN + shared_cols.get(d, 0) for d in DUCKS}
        want_bytes = sum(3 * HIDDEN * new_bank[d] * 4 for d in changed)  # float32
        layer_bytes = 3 * HIDDEN * info.ffn * 4

        done: list[float] = []
        failed: list[BaseException] = []
        stop = threading.Event()

        def serve() -> None:
            try:
                while not stop.is_set():
                    got = other.forward(50, x, routing=(idx, w), timeout=5)
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
                    done.append(time.monotonic())
            except BaseException as e:  # said below, not lost with the thread
                failed.append(e)
                raise

        t = threading.Thread(target=serve)
        t.start()
        try:
            while not done and not failed:  # serving before the move begins
                time.sleep(0.001)
            before = c.stats().counters
            start = time.monotonic()
            moved = c.load_weights(50, moe, placement=new, shared=True)
            end = time.monotonic()
            after = c.stats().counters
            n_before = len(done)
            while len(done) < n_before + 3 and not failed:  # and after it
                time.sleep(0.001)
        finally:
            stop.set()
            t.join(10)
        assert not failed, failed
        during = [s for s in done if start < s < end]
        sent = after["weight_bytes"] - before["weight_bytes"]
        print(f"move: {1e3 * (end - start):.1f} ms, {len(during)} forwards meanwhile, {sent} of")
        print(f"the layer's {layer_bytes} bytes sent")
        assert sent == after["move_bytes"] - before["move_bytes"] == want_bytes
        assert sent < layer_bytes
        assert during  # forwards flowed while the changed banks streamed
        assert after["layers_moved"] - before["layers_moved"] == 1
        assert after["layers_loaded"] == before["layers_loaded"]  # not a reload
        # layers() shows the new placement, to the loader and to the other client
        for cl in (c, other):
            (li,) = [li for li in cl.layers() if li.layer == 50]
            view = moe_view(li)
            assert view is not None and li.ready
            assert view.placement == tuple(tuple(h) for h in new)
            assert li.shard_sizes == [new_bank[d] for d in li.ducks]
        assert moe_view(moved).placement == view.placement
        np.testing.assert_allclose(c.forward(50, x, routing=(idx, w)), want, rtol=1e-4, atol=1e-5)
        # moving it to where it is sends nothing
        c.load_weights(50, moe, placement=new, shared=True)
        assert c.stats().counters["weight_bytes"] == after["weight_bytes"]
        # and back: ducks 0 and 1 get their first banks again (the ducks' third
        # generation of the layer, beside their second), exact as ever
        c.load_weights(50, moe, placement=old.placement, shared=True)
        back = c.stats().counters
        assert back["move_bytes"] - after["move_bytes"] == 3 * HIDDEN * 4 * sum(old.bank_sizes[:2])
        (li,) = [li for li in c.layers() if li.layer == 50]
        assert moe_view(li).placement == old.placement
        np.testing.assert_allclose(
            other.forward(50, x, routing=(idx, w)), want, rtol=1e-4, atol=1e-5
        )


@dataclasses.dataclass
class _Dataplane:
    control: str
    restart: object  # () -> None: duck 3 forgets its layers (after its first forward)


@pytest.fixture(params=["mock", "real"])
def dataplane(request):
    if request.param == "mock":
        ctl_addr = request.getfixturevalue("duckpipe_mock_factory")(ducks=4).control
        return _Dataplane(ctl_addr, lambda: set_faults(ctl_addr, restarted_ducks=[RESTARTED]))
    factory = request.getfixturevalue("duckpipe_cluster_factory")
    # duck 3's emulator forgets its layers once it computed its first forward
    cl = factory(4, groups=[(3, []), (1, ["--restart-after", "1"])])
    return _Dataplane(cl.control, lambda: None)


def test_moving_another_clients_layer_is_refused(dataplane):
    control = dataplane.control
    moe = _moe(51)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(control) as c, duckpipe.connect(control) as other:
        c.load_weights(51, moe, ducks=DUCKS)
        with pytest.raises(NotPermitted, match="only the client that loaded it moves it"):
            other.load_weights(51, moe, placement=new)
        placed = [d for held in new for d in held]
        sizes = [len(_experts_on(new, d)) * EFFN + (EFFN // 2 if d in (1, 3) else 0) for d in DUCKS]
        with pytest.raises(NotPermitted, match="another client: only its owner moves it"):
            other._session.request(
                lambda rid: ctl.MoveLayer(
                    req_id=rid,
                    layer=51,
                    shard_sizes=sizes,
                    expert_replicas=[1] * N_EXPERTS,
                    expert_ducks=placed,
                )
            )
        (li,) = [li for li in c.layers() if li.layer == 51]
        assert li.ready and moe_view(li).placement == tuple((d,) for d in (0, 0, 1, 1, 2, 2, 3, 3))


def test_a_move_while_a_repair_is_open_is_refused(dataplane):
    control = dataplane.control
    moe = _moe(52)
    x, idx, w = _inputs(52)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(control) as c:
        c.load_weights(52, moe, ducks=DUCKS)

        def forward():
            return c.forward(52, x, routing=(idx, w), timeout=5)

        forward()  # duck 3 computes it, then forgets its layers
        dataplane.restart()
        with pytest.raises(DuckLost):
            forward()
        c._session.request(lambda rid: ctl.RepairLayer(req_id=rid, layer=52, ducks=[RESTARTED]))
        with pytest.raises(BadInput, match="is being repaired: a move waits for the repair"):
            c.load_weights(52, moe, placement=new)


def test_a_move_keeps_the_layers_ducks_and_refuses_a_dead_changed_duck(duckpipe_mock_factory):
    from duckpipe.errors import DucksUnreachable

    control = duckpipe_mock_factory(ducks=4).control
    moe = _moe(54)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(control) as c:
        c.load_weights(54, moe, ducks=DUCKS)
        with pytest.raises(BadInput, match=r"a move keeps its ducks \(ducks=\[0, 1, 2\]"):
            c.load_weights(54, moe, ducks=[0, 1, 2], placement=new)
        before = c.stats().counters["weight_bytes"]
        set_faults(control, dead_ducks=[1])  # duck 1 changes under the plan
        with pytest.raises(DucksUnreachable, match=r"\[1\] did not .* move the layer once"):
            c.load_weights(54, moe, placement=new)
        assert c.stats().counters["weight_bytes"] == before  # nothing sent
        (li,) = [li for li in c.layers() if li.layer == 54]
        assert moe_view(li).placement == tuple((d,) for d in (0, 0, 1, 1, 2, 2, 3, 3))


def test_a_repair_while_a_move_is_open_is_refused(four_ducks):
    control = four_ducks
    moe = _moe(55)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    sizes = [len(_experts_on(new, d)) * EFFN + (EFFN // 2 if d in (1, 3) else 0) for d in DUCKS]
    with duckpipe.connect(control) as c:
        c.load_weights(55, moe, ducks=DUCKS)
        c._session.request(
            lambda rid: ctl.MoveLayer(
                req_id=rid,
                layer=55,
                shard_sizes=sizes,
                expert_replicas=[1] * N_EXPERTS,
                expert_ducks=[d for held in new for d in held],
            )
        )
        with pytest.raises(BadInput, match="is being moved to a new placement: repair it after"):
            c._session.request(lambda rid: ctl.RepairLayer(req_id=rid, layer=55, ducks=[3]))
        with pytest.raises(BadInput, match="is being moved already: commit that move first"):
            c.load_weights(55, moe, placement=new)


def test_a_layer_with_two_shared_sets_keeps_them_through_a_move(four_ducks):
    # the shared expert replicated (two sets, each holding all of it): the move sends
    # ducks 0 and 1 their new experts with their half of the first set's shared columns
    moe = dataclasses.replace(
        MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=56),
        shared_ducks=[(0, 1), (2, 3)],
    )
    x, idx, w = _inputs(56)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(four_ducks) as c:
        info = c.load_weights(56, moe, ducks=DUCKS)
        before = c.stats().counters
        moved = c.load_weights(56, moe, placement=new)
        sent = c.stats().counters["move_bytes"] - before["move_bytes"]
        half = EFFN // 2  # each duck's columns of its set's shared expert
        assert sent == 3 * HIDDEN * 4 * sum(len(_experts_on(new, d)) * EFFN + half for d in (0, 1))
        assert (moved.shared_ducks, moved.shared_sets) == (info.shared_ducks, info.shared_sets)
        assert moe_view(moved).placement == tuple(tuple(h) for h in new)
        np.testing.assert_allclose(
            c.forward(56, x, routing=(idx, w)), moe.reference(x, idx, w), rtol=1e-4, atol=1e-5
        )


def test_a_move_a_changed_duck_does_not_acknowledge_leaves_the_old_placement_serving(
    duckpipe_cluster_factory,
):
    # the C dataplane: duck 0 (which the plan changes) stops before the move, within its
    # pings (the mock knows its dead ducks at once: the DucksUnreachable test above)
    from duckpipe.errors import DataplaneFault
    from duckpipe.launch.ducks import DucksProcess

    cl = duckpipe_cluster_factory(
        4, groups=[(1, []), (3, [])], ping_ms=2000, weight_timeout_ms=1000, weight_rto_us=20_000
    )
    hidden = 64  # small: the sanitizer passes load it within the short weight timeout
    moe = _moe(57, hidden, 32)
    x = np.random.default_rng(57).standard_normal((3, hidden)).astype(np.float32)
    idx = np.array([[2, 7], [4, 5], [3, 6]], np.int32)  # ducks 1-3 under the old placement
    w = np.full((3, 2), 0.5, np.float32)
    new = plan_placement(LOAD, DUCKS, redundant=0).placement
    with duckpipe.connect(cl.control) as c:
        info = c.load_weights(57, moe, ducks=DUCKS)
        cl.emulators[0].stop()
        before = c.stats().counters
        with pytest.raises(DataplaneFault, match=r"moving layer 57 failed: .*serves on its old"):
            c.load_weights(57, moe, placement=new)
        after = c.stats().counters
        assert after["layers_moved"] == before["layers_moved"]
        (li,) = c.layers()
        assert li.ready and moe_view(li).placement == moe_view(info).placement
        np.testing.assert_allclose(
            c.forward(57, x, routing=(idx, w)), moe.reference(x, idx, w), rtol=1e-4, atol=1e-5
        )
        # duck 0 back (it lost its banks: repaired on the old placement). The failed
        # move gave duck 1 a bank of the generation the next move takes: a move that
        # leaves ducks 0 and 1 as they are (2 and 3 trade their experts) sends them one
        # again, else duck 1 would answer that move's forwards from the stale one
        cl.emulators[0] = DucksProcess(ducks=1, base_port=cl.duck_base, first_id=0).start()
        with pytest.raises(DuckLost):
            c.forward(57, x[:1], routing=(np.array([[0, 1]], np.int32), w[:1]), timeout=5)
        assert c.repair(57).ready
        swapped = [0, 0, 1, 1, 3, 3, 2, 2]
        before = c.stats().counters
        moved = c.load_weights(57, moe, placement=swapped)
        sent = c.stats().counters["move_bytes"] - before["move_bytes"]
        assert sent == 3 * hidden * 4 * sum(moved.shard_sizes)  # all four this time
        assert moe_view(moved).placement == tuple((d,) for d in swapped)
        np.testing.assert_allclose(
            c.forward(57, x, routing=(idx, w)), moe.reference(x, idx, w), rtol=1e-4, atol=1e-5
        )
