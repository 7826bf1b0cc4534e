"""Routed forwards on a mixture-of-experts layer match MoeMlp.reference, over placements,
batch sizes, dtypes, with and without a shared expert and in every send mode; bad
routing is BadInput before anything is sent; the dataplane refuses malformed routed
descriptors; a routed duck that does not answer fails the forwards that need it only.

Tolerances. The dataplane and the reference both compute in float32 from the same
weights and differ only in the order of the sums (per duck, then across ducks): measured
at most 1.7e-6 absolute on outputs up to 5.4 (16 experts of 32 columns, hidden 64, 1 to
32 tokens); 1e-5 absolute and relative leaves a margin of six. In float16 both round
their float32 result to float16 once: one float16 ulp (2**-10 relative) plus that same
float32 difference, which near zero spans several ulps of a small output (measured: 2
ulps at 2.4e-4), hence 1e-5 absolute again.
"""

from __future__ import annotations

import mmap
import time

import numpy as np
import pytest

import duckpipe
from duckpipe import Status
from duckpipe._abi.ring import new_desc
from duckpipe.client.api import Forward
from duckpipe.client.routing import pack
from duckpipe.errors import BadInput, DataplaneFault, DuckLost, ForwardTimeout
from duckpipe.moe import Gate, MoeMlp
from duckpipe.observe.stats_reader import stats_path_for, views
from duckpipe.schema.abi import DescFlag, Op

HIDDEN, N_EXPERTS, EFFN, TOPK = 64, 16, 32, 4
# float16: each duck's reply travels in float16 (rounded once, half an ulp of its own
# magnitude), then the host adds the replies in float32 and rounds once more: up to TOPK
# routed replies and the shared expert's, each at most the result's magnitude, so the
# error is bounded by (TOPK + 2) half-ulps of the largest value (the mock rounds as they do)
TOL = {
    np.dtype(np.float32): dict(rtol=1e-5, atol=1e-5),
    np.dtype(np.float16): dict(rtol=2**-10, atol=0.0),
}
F16_ULPS = TOPK + 2

# placements of 16 experts on the 24-duck dataplane of the ``dataplane`` fixture
PLACEMENTS = {
    "default": None,
    "hand": [(e * 5) % 24 for e in range(N_EXPERTS)],  # scattered, one duck each
    "replicas": [[e % 8, 8 + (e * 3) % 8, 16 + e % 4][: 1 + e % 3] for e in range(N_EXPERTS)],
}


def _moe(shared: bool, dtype, seed: int) -> MoeMlp:
    return MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=shared, dtype=dtype, seed=seed)


def _ducks(placement, shared: bool) -> list[int] | None:
    """The default placement on 24 ducks leaves 8 without an expert: without a shared
    expert they would hold nothing, so that layer lives on 8 ducks (2 experts each)."""
    return list(range(8)) if placement is None and not shared else None


def _check(y: np.ndarray, want: np.ndarray) -> None:
    assert y.dtype == want.dtype and y.shape == want.shape
    tol = dict(TOL[np.dtype(want.dtype)])
    if want.dtype == np.float16:
        tol["atol"] = F16_ULPS * 2**-11 * float(np.abs(want.astype(np.float32)).max())
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "routed-only"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_routed_forward_matches_the_numpy_reference(client, placement, shared, dtype):
    seed = list(PLACEMENTS).index(placement) * 4 + shared * 2 + (dtype == np.float16)
    moe = _moe(shared, dtype, seed)
    layer = 500 + seed
    place = PLACEMENTS[placement]
    client.load_weights(layer, moe, ducks=_ducks(place, shared), placement=place)
    gate = Gate.random(N_EXPERTS, HIDDEN, topk=TOPK, score="sigmoid", seed=seed)
    rng = np.random.default_rng(seed)
    for tokens in (1, 8, 32):
        x = rng.standard_normal((tokens, HIDDEN)).astype(dtype)
        i, w = gate(x)
        _check(client.forward(layer, x, routing=(i, w), timeout=30), moe.reference(x, i, w))


def test_the_gates_routing_is_passed_to_routing_as_it_is(client):
    # the gate used to return (weights, indices), the reverse of what routing= takes
    moe = _moe(shared=True, dtype=np.float32, seed=30)
    client.load_weights(530, moe)
    x = np.random.default_rng(30).standard_normal((8, HIDDEN)).astype(np.float32)
    routing = Gate.random(N_EXPERTS, HIDDEN, topk=TOPK, seed=30)(x)
    assert isinstance(routing, duckpipe.moe.Routing)
    assert routing.indices.dtype == np.int32 and routing.weights.dtype == np.float32
    indices, weights = routing  # unpacks in routing='s order
    assert indices is routing.indices and weights is routing.weights
    _check(client.forward(530, x, routing=routing, timeout=30), moe.reference(x, *routing))


def test_every_send_mode_gives_the_same_result_and_is_counted(client):
    moe = _moe(shared=False, dtype=np.float32, seed=1)
    client.load_weights(520, moe, ducks=list(range(16)), placement=list(range(16)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, HIDDEN)).astype(np.float32)
    i = np.stack([rng.permutation(N_EXPERTS)[:2] for _ in range(32)]).astype(np.int32)
    w = rng.random((32, 2)).astype(np.float32)
    want = moe.reference(x, i, w)
    for mode, counter in (("broadcast", "moe_broadcasts"), ("unicast", "moe_unicasts")):
        before = client.stats().counters
        _check(client.forward(520, x, routing=(i, w), moe_send=mode, timeout=30), want)
        after = client.stats().counters
        assert after["moe_forwards"] - before["moe_forwards"] == 1
        assert after[counter] - before[counter] == 1, mode
        assert after["moe_bytes"] > before["moe_bytes"]
    # auto, 32 tokens by 2 of 16 ducks: each duck's own rows (~4 of 32) cost far fewer bytes
    # than every row to each of the 16 targets (no broadcast address on one host)
    before = client.stats().counters
    _check(client.forward(520, x, routing=(i, w), timeout=30), want)
    after = client.stats().counters
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1
    assert after["moe_broadcasts"] == before["moe_broadcasts"]


def test_auto_broadcasts_when_the_layer_has_a_shared_expert(client):
    # every duck computes the shared expert for every row: sending each its own rows alone
    # cannot save anything
    moe = _moe(shared=True, dtype=np.float32, seed=2)
    client.load_weights(521, moe, ducks=list(range(8)))
    x = np.random.default_rng(2).standard_normal((8, HIDDEN)).astype(np.float32)
    i = np.zeros((8, 1), np.int32)
    w = np.ones((8, 1), np.float32)
    before = client.stats().counters
    _check(client.forward(521, x, routing=(i, w), timeout=30), moe.reference(x, i, w))
    after = client.stats().counters
    assert after["moe_broadcasts"] - before["moe_broadcasts"] == 1
    assert after["moe_unicasts"] == before["moe_unicasts"]


def test_experts_no_token_chose_cost_nothing_and_their_ducks_are_not_asked(client):
    moe = _moe(shared=False, dtype=np.float32, seed=3)
    client.load_weights(522, moe, ducks=list(range(8)))  # experts 2d, 2d+1 on duck d
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, HIDDEN)).astype(np.float32)
    chosen = np.array([0, 5, 6, 11])  # ducks 0, 2, 3, 5
    i = np.stack([rng.permutation(chosen)[:2] for _ in range(8)]).astype(np.int64)
    w = rng.standard_normal((8, 2)).astype(np.float32)  # any finite weight, negative too
    with client.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        fwd = client.submit(slot, 522, routing=(i, w))
    with fwd:
        _check(fwd.result(timeout=30), moe.reference(x, i, w))
        assert set(fwd.answered) == set(np.unique(i) // 2) and fwd.missing == ()


def _duck_stats(control: str) -> tuple[np.ndarray, np.ndarray]:
    """Every duck's moe_tokens and moe_expert_rows, from the stats segment."""
    with open(stats_path_for(control), "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        d = views(m)["ducks"]
        out = d["moe_tokens"].copy(), d["moe_expert_rows"].copy()
        del d
    finally:
        m.close()
    return out


def test_each_duck_counts_the_tokens_and_expert_rows_it_computed(client, dataplane):
    moe = _moe(shared=False, dtype=np.float32, seed=4)
    # experts 0-3 on duck 20, 4-7 on 21 and 22 (replicas), the rest on 23
    place = [20] * 4 + [[21, 22]] * 4 + [23] * 8
    client.load_weights(523, moe, placement=place)
    x = np.random.default_rng(4).standard_normal((6, HIDDEN)).astype(np.float32)
    # token t's experts; a replicated expert goes to replica t % 2 (21 even, 22 odd)
    i = np.array([[0, 1], [4, 8], [5, 6], [2, 9], [7, 3], [10, 11]], np.int32)
    w = np.full((6, 2), 0.5, np.float32)
    tokens0, rows0 = _duck_stats(dataplane.control)
    with client.claim(x.shape, x.dtype) as slot:
        slot.array[:] = x
        fwd = client.submit(slot, 523, routing=(i, w))
    with fwd:
        _check(fwd.result(timeout=30), moe.reference(x, i, w))
        fwd.timings  # noqa: B018  the ZeroMQ completion: sent after the stats are written
    tokens, rows = _duck_stats(dataplane.control)
    # (token, expert) by duck: 20: (0,0) (0,1) (3,2) (4,3); 21: (2,5) (2,6) (4,7);
    # 22: (1,4); 23: (1,8) (3,9) (5,10) (5,11)
    want_tokens = {20: 3, 21: 2, 22: 1, 23: 3}
    want_rows = {20: 4, 21: 3, 22: 1, 23: 4}
    assert {d: int(tokens[d] - tokens0[d]) for d in range(20, 24)} == want_tokens
    assert {d: int(rows[d] - rows0[d]) for d in range(20, 24)} == want_rows
    assert not (tokens[:20] - tokens0[:20]).any()


# --- bad routing: BadInput before anything is sent ------------------------------------


@pytest.fixture
def moe_layer(client):
    """Layer 530: 16 experts (no shared) on ducks 0-7, and a dense layer 531."""
    moe = _moe(shared=False, dtype=np.float32, seed=5)
    client.load_weights(530, moe, ducks=list(range(8)))
    client.load_weights(531, duckpipe.SwiGluMlp.random(HIDDEN, 32, seed=5), ducks=[0, 1])
    return moe


def _routing(tokens: int, topk: int = 2, seed: int = 6):
    rng = np.random.default_rng(seed)
    i = np.stack([rng.permutation(N_EXPERTS)[:topk] for _ in range(tokens)]).astype(np.int32)
    return i, rng.random((tokens, topk)).astype(np.float32)


def _nan_weight():
    i, w = _routing(4)
    w[2, 1] = np.nan
    return i, w


def _out_of_range():
    i, w = _routing(4)
    i[1, 0] = N_EXPERTS
    return i, w


@pytest.mark.parametrize(
    "layer, routing, kw, match",
    [
        (531, _routing(4), {}, "layer 531 is dense: routing is only for mixture-of-experts"),
        (530, None, {}, "layer 530 is a mixture of experts: the forward needs its routing"),
        (530, _out_of_range(), {}, r"names expert 16; the layer has 16 \(0\.\.15\)"),
        (530, _routing(3), {}, r"routing indices have shape \(3, 2\) but x has 4 tokens"),
        (
            530,
            _nan_weight(),
            {},
            r"token 2, choice 1 \(expert \d+\) has weight bits 0x7fc00000: NaN",
        ),
        (530, (_routing(4)[0],), {}, "routing must be a pair"),
        (530, _routing(4), {"moe_send": "multicast"}, "moe_send must be 'auto'"),
        (530, None, {"moe_send": "unicast"}, "pass its routing"),
        (530, _routing(4), {"ducks": [0]}, "pass routing= or ducks=, not both"),
    ],
    ids=[
        "dense-with-routing",
        "moe-without-routing",
        "expert-out-of-range",
        "wrong-shape",
        "nan-weight",
        "not-a-pair",
        "bad-moe-send",
        "mode-without-routing",
        "routing-and-ducks",
    ],
)
def test_bad_routing_is_bad_input_before_anything_is_sent(
    client, moe_layer, layer, routing, kw, match
):
    x = np.ones((4, HIDDEN), np.float32)
    before = client.stats().counters["descriptors"]
    with pytest.raises(BadInput, match=match):
        client.forward(layer, x, routing=routing, **kw)
    assert client.stats().counters["descriptors"] == before
    # the slot went back: the next forward claims and completes
    i, w = _routing(4)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))


@pytest.fixture
def first_checks(monkeypatch) -> list:
    """The calls of the routed submit's first-submit checks (check_routing_arguments),
    recorded as they pass through: empty while submits go on their plan."""
    import duckpipe.client.api as api

    calls: list = []
    real_check = api.check_routing_arguments
    monkeypatch.setattr(
        api, "check_routing_arguments", lambda *a: calls.append(a) or real_check(*a)
    )
    return calls


def test_a_routed_submit_of_a_shape_already_checked_is_judged_by_the_c_rule_alone(
    client, moe_layer, first_checks
):
    # the second submit of a layer, shape and topk skips the Python checks the first
    # passed (issue 29: 26 us a routed submit against 5 dense): dp_routing_pack still
    # judges every entry, and a reloaded layer is checked afresh
    calls = first_checks
    x = np.random.default_rng(40).standard_normal((4, HIDDEN)).astype(np.float32)
    i, w = _routing(4, seed=40)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))
    calls.clear()
    i, w = _routing(4, seed=41)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))
    assert calls == []
    before = client.stats().counters["descriptors"]
    refusals = [
        (_out_of_range(), r"names expert 16; the layer has 16 \(0\.\.15\)"),
        (_nan_weight(), r"token 2, choice 1 \(expert \d+\) has weight bits"),
    ]
    for bad, match in refusals:
        with pytest.raises(BadInput, match=match):
            client.forward(530, x, routing=bad)
    assert client.stats().counters["descriptors"] == before
    assert calls == []
    # another layer in its place: checked as a first submit, against its own experts
    client.unload_layer(530)
    other = _moe(shared=False, dtype=np.float32, seed=42)
    client.load_weights(530, other, ducks=list(range(8)))
    _check(client.forward(530, x, routing=(i, w), timeout=30), other.reference(x, i, w))
    assert len(calls) == 1


def _bad_at(i: np.ndarray, w: np.ndarray, t: int, k: int, what: str):
    i, w = i.copy(), w.copy()
    if what == "expert":
        i[t, k] = N_EXPERTS
    elif what == "weight":
        w[t, k] = np.inf
    else:  # a duplicate of the token's other choice
        i[t, k] = i[t, k ^ 1]
    return i, w


def test_a_routed_submit_on_its_plan_judges_every_entry_before_publishing(
    client, moe_layer, first_checks
):
    # the submit that follows a checked one goes on its plan, one call into C that packs
    # and publishes (issue 29 point 4): a bad expert, weight or duplicate at any entry of
    # any token is still the C rule's BadInput, with nothing published and the slot
    # still the caller's, and a good routing then goes out from that same slot
    tokens, topk = 4, 2
    x = np.random.default_rng(43).standard_normal((tokens, HIDDEN)).astype(np.float32)
    i, w = _routing(tokens, topk, seed=43)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))
    assert len(first_checks) == 1
    before = client.stats().counters["descriptors"]
    match = {
        "expert": r"token {t}, choice {k} names expert 16; the layer has 16",
        "weight": r"token {t}, choice {k} \(expert \d+\) has weight bits 0x7f800000",
        "duplicate": r"token {t} names expert \d+ twice",
    }
    with client.claim(x.shape, x.dtype) as slot:
        slot.array[...] = x
        for what in match:
            for t in range(tokens):
                for k in range(topk):
                    with pytest.raises(BadInput, match=match[what].format(t=t, k=k)):
                        client.submit(slot, 530, routing=_bad_at(i, w, t, k, what))
        assert len(first_checks) == 1  # judged on the plan, not by a first submit's checks
        assert client.stats().counters["descriptors"] == before
        fwd = client.submit(slot, 530, routing=(i, w))
    with fwd:
        _check(fwd.result(30), moe_layer.reference(x, i, w))
    assert client.stats().counters["descriptors"] == before + 1


def test_a_routed_submit_on_its_plan_makes_one_call_into_c_as_a_dense_one_does(
    client, moe_layer, monkeypatch
):
    # what the plan is for (issue 29: a routed submit <= 1.5x a dense one at 1 token): the
    # pack, the C rule and the publish in one call, not a call per step with Python
    # between them; ffi.from_buffer of the two arrays is the rest
    import duckpipe.client.routing as routing_module
    import duckpipe.client.session as session_module
    from duckpipe._abi import lib

    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str):
            fn = getattr(lib, name)
            return lambda *a: calls.append(name) or fn(*a)

    x = np.ones((1, HIDDEN), np.float32)
    i, w = _routing(1, seed=44)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))
    monkeypatch.setattr(session_module, "lib", Counting())
    monkeypatch.setattr(routing_module, "lib", Counting())
    for layer, routing in ((531, None), (530, (i, w))):
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x
            calls.clear()
            client._session.unpumped = 0  # no reading of completions inside this submit
            fwd = client.submit(slot, layer, routing=routing)
            assert len(calls) == 1, calls
        with fwd:
            fwd.result(30)


def test_a_gates_routing_goes_on_the_plan_with_the_pointers_it_was_made_with(
    client, moe_layer, first_checks, monkeypatch
):
    # a Gate's Routing carries its arrays' C pointers (issue 29 point 4: two
    # ffi.from_buffer and the form checks were most of a one-token routed submit over a
    # dense one): the submit makes none, the C rule still judges what the arrays hold now
    # (an entry the caller changed after the gate), and the result is the reference's
    import duckpipe.client.api as api

    gate = Gate.random(N_EXPERTS, HIDDEN, topk=2, score="sigmoid", seed=45)
    x = np.random.default_rng(45).standard_normal((3, HIDDEN)).astype(np.float32)
    r = gate(x)
    assert r._c is not None
    _check(client.forward(530, x, routing=r, timeout=30), moe_layer.reference(x, *r))
    assert len(first_checks) == 1
    made: list = []
    ffi = api.ffi

    class Counting:  # api.ffi with its from_buffer counted
        def __getattr__(self, name):
            fn = getattr(ffi, name)
            return (lambda *a, **k: made.append(a) or fn(*a, **k)) if name == "from_buffer" else fn

    monkeypatch.setattr(api, "ffi", Counting())
    for seed in (46, 47):
        r = gate(np.random.default_rng(seed).standard_normal((3, HIDDEN)).astype(np.float32))
        _check(client.forward(530, x, routing=r, timeout=30), moe_layer.reference(x, *r))
    assert made == [] and len(first_checks) == 1
    r.indices[1, 0] = N_EXPERTS  # written after the gate: what the pointer reads now
    with pytest.raises(BadInput, match=r"token 1, choice 0 names expert 16; the layer has 16"):
        client.forward(530, x, routing=r)
    # the same pair without the pointers (a Routing of its own, _replace, a plain tuple):
    # from_buffer of each array, still on the plan
    i, w = _routing(3, seed=48)
    for plain in (duckpipe.moe.Routing(i, w), r._replace(indices=i, weights=w), (i, w)):
        made.clear()
        _check(client.forward(530, x, routing=plain, timeout=30), moe_layer.reference(x, i, w))
        assert len(made) == 2
    assert len(first_checks) == 1


def test_a_gates_routing_pickles_and_copies_as_its_arrays_and_of_gate_takes_only_its_form():
    import copy
    import pickle

    from duckpipe.moe import Routing

    r = Gate.random(N_EXPERTS, HIDDEN, topk=2, seed=49)(np.ones((2, HIDDEN), np.float32))
    for again in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert type(again) is Routing and again._c is None
        np.testing.assert_array_equal(again.indices, r.indices)
        np.testing.assert_array_equal(again.weights, r.weights)
    i, w = r
    for bad in (
        (i.astype(np.int64), w),
        (i.astype(np.int16), w),
        (i, w.astype(np.float64)),
        (i, w[:1]),
        (np.asfortranarray(np.ones((2, 3), np.int32)), np.ones((2, 3), np.float32)),
        (i.tolist(), w),
    ):
        with pytest.raises(BadInput, match="of_gate takes C-contiguous int32"):
            Routing.of_gate(*bad)


def test_a_slot_too_small_for_activation_and_routing_says_what_to_connect_with(
    dataplane, client, moe_layer
):
    # 15 tokens of 64 float32: 3840 bytes fit a 4096-byte slot; the routing table behind
    # them at byte 3840 (16 + 8 * 15 * 4 = 496 bytes) does not
    i, w = _routing(15, topk=4)
    x = np.ones((15, HIDDEN), np.float32)
    with duckpipe.connect(dataplane.control, slot_size=4096) as small:
        small.load_weights(533, moe_layer, ducks=list(range(8)))
        before = small.stats().counters["descriptors"]
        # one forward (submit) says so; forward() sends it as two that fit (test below)
        with small.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x
            with pytest.raises(BadInput, match=r"needs 4336 bytes .* connect\(slot_size=...\)"):
                small.submit(slot, 533, routing=(i, w))
        assert small.stats().counters["descriptors"] == before
        _check(small.forward(533, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))
        assert small.stats().counters["descriptors"] == before + 2
        # 14 tokens: 3584 + 464 bytes fit
        _check(
            small.forward(533, x[:14], routing=(i[:14], w[:14]), timeout=30),
            moe_layer.reference(x[:14], i[:14], w[:14]),
        )


def test_a_routed_forward_in_float16_takes_float32_or_float64_weights(client):
    moe = _moe(shared=True, dtype=np.float16, seed=7)
    client.load_weights(532, moe, ducks=list(range(4)))
    x = np.random.default_rng(7).standard_normal((8, HIDDEN)).astype(np.float16)
    i, w = _routing(8, seed=7)
    want = moe.reference(x, i, w)
    _check(client.forward(532, x, routing=(i.astype(np.int64), w.astype(np.float64))), want)


# --- the dataplane's own checks of a routed descriptor ---------------------------------


def _raw_forward(client, layer: int, x: np.ndarray, table: np.ndarray | None, *, flags: int,
                 ducks: tuple[int, ...] = ()) -> Forward:  # fmt: skip
    """Submit ``x`` with ``table`` behind it as the descriptor says, past every client
    check: what a hostile or buggy client can put in its ring."""
    session = client._session
    slot = client.claim(x.shape, x.dtype)
    slot.array[:] = x
    if table is not None:
        at = -(-x.nbytes // 64) * 64
        session.segment.act_bytes(slot.index)[at : at + table.size] = table
    d = new_desc()
    d.op, d.layer, d.dtype, d.ndim = Op.FORWARD, layer, 1, x.ndim
    for k, n in enumerate(x.shape):
        d.shape[k] = n
    d.nbytes, d.flags = x.nbytes, flags
    for duck in ducks:
        d.ducks[duck >> 6] |= 1 << (duck & 63)
    return Forward(session, session.push(d, int(Op.FORWARD), slot.index, x.shape, x.dtype))


def _refused(fwd: Forward, match: str) -> None:
    with fwd, pytest.raises(DataplaneFault, match=match):
        fwd.result(timeout=30)
    assert fwd.status == Status.BAD_REQUEST


ROUTED = int(DescFlag.ROUTED)


def _table(i=None, w=None, n_experts: int = N_EXPERTS) -> np.ndarray:
    if i is None:
        i, w = _routing(4)
    return pack(i, w, n_experts).copy()


def test_the_dataplane_refuses_routing_on_a_dense_layer(client, moe_layer):
    fwd = _raw_forward(client, 531, np.ones((4, HIDDEN), np.float32), _table(), flags=ROUTED)
    _refused(fwd, "layer 531 is dense: routing is only for mixture-of-experts layers")


def test_the_dataplane_refuses_an_unrouted_forward_on_a_moe_layer(client, moe_layer):
    fwd = _raw_forward(client, 530, np.ones((4, HIDDEN), np.float32), None, flags=0)
    _refused(fwd, "layer 530 is a mixture of experts: the forward needs its routing")


def test_the_dataplane_refuses_both_mode_bits(client, moe_layer):
    flags = ROUTED | DescFlag.MOE_BROADCAST | DescFlag.MOE_UNICAST
    fwd = _raw_forward(client, 530, np.ones((4, HIDDEN), np.float32), _table(), flags=flags)
    _refused(fwd, "MOE_BROADCAST and MOE_UNICAST")


def test_the_dataplane_refuses_a_routed_forward_with_a_target_set(client, moe_layer):
    x = np.ones((4, HIDDEN), np.float32)
    fwd = _raw_forward(client, 530, x, _table(), flags=ROUTED, ducks=(0,))
    _refused(fwd, r"a routed forward takes no target set \(ducks=\)")


@pytest.mark.parametrize("damage", ["magic", "expert", "topk", "n_experts", "weight"])
def test_the_dataplane_refuses_a_damaged_routing_table_with_the_c_rule(client, moe_layer, damage):
    table = _table()
    if damage == "magic":
        table[0] ^= 0xFF
    elif damage == "expert":
        table[16:20] = np.frombuffer(np.uint32(N_EXPERTS).tobytes(), np.uint8)
    elif damage == "topk":
        table[6:8] = np.frombuffer(np.uint16(200).tobytes(), np.uint8)  # over MAX_TOPK
    elif damage == "n_experts":
        table = _table(n_experts=N_EXPERTS + 1)
    else:
        table[20:24] = np.frombuffer(np.float32(np.inf).tobytes(), np.uint8)
    fwd = _raw_forward(client, 530, np.ones((4, HIDDEN), np.float32), table, flags=ROUTED)
    _refused(fwd, "BAD_REQUEST: routing: ")  # dp_routing_check's reason follows
    # the client's forwards go on
    i, w = _routing(4)
    x = np.ones((4, HIDDEN), np.float32)
    _check(client.forward(530, x, routing=(i, w), timeout=30), moe_layer.reference(x, i, w))


def test_the_dataplane_refuses_a_routed_forward_whose_message_passes_max_forward_bytes(
    duckpipe_mock_factory,
):
    # one duck's message: 16 + 8 * (256 + 8 * 2) + 8 * 256 = 4240 bytes, over a cap of 4096
    # (what a duck reassembles and a NACK names chunks of)
    dp = duckpipe_mock_factory(ducks=8, args=["--max-forward-bytes", "4096"])
    with duckpipe.connect(dp.control, slot_size=8192) as c:
        c.load_weights(1, _moe(shared=False, dtype=np.float32, seed=8))
        i, w = _routing(8)
        x = np.ones((8, HIDDEN), np.float32)
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x
            with pytest.raises(BadInput, match="sends a duck up to 4240 bytes in one message"):
                c.submit(slot, 1, routing=(i, w))
        # forward() sends it as forwards of the tokens whose messages fit
        np.testing.assert_allclose(
            c.forward(1, x, routing=(i, w), timeout=30),
            _moe(shared=False, dtype=np.float32, seed=8).reference(x, i, w), rtol=2e-4, atol=2e-5
        )  # fmt: skip
        table = pack(i, w, N_EXPERTS).copy()
        _refused(
            _raw_forward(c, 1, x, table, flags=ROUTED),
            r"up to 4240 bytes in one message \(table and rows\); max_forward_bytes is 4096",
        )


# --- a routed duck that does not answer -------------------------------------------------


def test_a_dead_routed_duck_fails_only_the_forwards_routed_to_it(ducks4):
    moe = _moe(shared=False, dtype=np.float32, seed=9)
    with duckpipe.connect(ducks4.control, forward_timeout=0.5) as c:
        c.load_weights(7, moe)  # experts 4d..4d+3 on duck d
        ducks4.kill()
        x = np.random.default_rng(9).standard_normal((4, HIDDEN)).astype(np.float32)
        i = np.array([[0, 4], [1, 5], [2, 6], [7, 3]], np.int32)  # ducks 0 and 1 only
        w = np.full((4, 2), 0.5, np.float32)
        _check(c.forward(7, x, routing=(i, w), timeout=30), moe.reference(x, i, w))
        i[2, 1] = 9  # one pair on duck 2
        t0 = time.monotonic()
        # the C dataplane does not know it lost yet (3 s of silence): the deadline; the
        # mock knows its dead ducks at once: DuckLost now (test_moe_lost_ducks.py)
        with pytest.raises((ForwardTimeout, DuckLost)) as e:
            c.forward(7, x, routing=(i, w), timeout=30)
        assert time.monotonic() - t0 < 10
        # the dataplane names the duck and its experts, the client adds them from its placement
        assert "duck 2 (experts 8 9 10 11)" in str(e.value)
        if isinstance(e.value, ForwardTimeout):
            assert e.value.missing == (2,)
            assert "layer 7: duck 2 (experts 8 9 10 11)" in str(e.value)
        else:
            assert "layer 7: expert 9 has no live replica" in str(e.value)
        i[2, 1] = 6  # routed away from it again: fine
        _check(c.forward(7, x, routing=(i, w), timeout=30), moe.reference(x, i, w))


def _layer_of_4096_wide_rows(client, layer: int, seed: int) -> MoeMlp:
    moe = MoeMlp.random(8, 4096, 8, shared=False, seed=seed)
    client.load_weights(layer, moe, ducks=list(range(8)), placement=list(range(8)))
    return moe


def test_a_forced_unicast_of_more_than_max_forward_bytes_stays_a_unicast(client):
    # 64 tokens of 8 KiB, each routed to 4 ducks: their rows alone are 2 MiB, twice
    # max_forward_bytes (1 MiB), which once bounded a staging area and sent this as the
    # broadcast; now each duck's rows go from the slot in place (issue 28.6)
    moe = MoeMlp.random(4, 2048, 8, shared=False, seed=40)
    client.load_weights(540, moe, ducks=[0, 1, 2, 3], placement=[0, 1, 2, 3])
    x = np.random.default_rng(40).standard_normal((64, 2048)).astype(np.float32)
    i = np.tile(np.arange(4, dtype=np.int32), (64, 1))
    w = np.full((64, 4), 0.25, np.float32)
    before = client.stats().counters
    _check(
        client.forward(540, x, routing=(i, w), moe_send="unicast", timeout=30),
        moe.reference(x, i, w),
    )
    after = client.stats().counters
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1
    assert after["moe_broadcasts"] == before["moe_broadcasts"]
    table = 16 + 8 + 8 * 64  # each duck: a header, its directory entry, 64 entries
    assert after["moe_bytes"] - before["moe_bytes"] == 4 * (table + x.nbytes)
    assert after["moe_copied_bytes"] == before["moe_copied_bytes"]


@pytest.mark.parametrize(("tokens", "topk"), [(16, 4), (48, 2)])
def test_auto_sends_the_smaller_unicast_from_16_tokens_up(client, tokens, topk):
    # 16 KiB rows, top-k of 8 experts on 8 ducks: the unicast is k/8 of the broadcast, and
    # (1 MiB of rows and more) no longer fits what the staging area was, so it went as the
    # broadcast. Now it is the unicast, sent in place, counted, and correct.
    moe = _layer_of_4096_wide_rows(client, 542, seed=42)
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, 4096)).astype(np.float32)
    i = np.argsort(rng.random((tokens, 8)), axis=1)[:, :topk].astype(np.int32)
    w = rng.random((tokens, topk)).astype(np.float32)
    before = client.stats().counters
    _check(client.forward(542, x, routing=(i, w), timeout=30), moe.reference(x, i, w))
    after = client.stats().counters
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1
    assert after["moe_broadcasts"] == before["moe_broadcasts"]
    assert after["moe_copied_bytes"] == before["moe_copied_bytes"]


def test_a_forced_unicast_with_a_shared_expert_counts_the_bytes_it_sends(client):
    # every duck gets every row for the shared expert; duck 0 also its section (expert 0
    # for each token), ducks 1..3 a bare table header: 16 bytes, no directory entry
    moe = MoeMlp.random(4, HIDDEN, EFFN, shared=True, seed=41)
    moe = MoeMlp(experts=moe.experts, shared=moe.shared, shared_ducks=[0, 1, 2, 3])
    client.load_weights(541, moe, ducks=[0, 1, 2, 3], placement=[0, 1, 2, 3])
    x = np.random.default_rng(41).standard_normal((5, HIDDEN)).astype(np.float32)
    i = np.zeros((5, 1), np.int32)
    w = np.ones((5, 1), np.float32)
    before = client.stats().counters
    _check(
        client.forward(541, x, routing=(i, w), moe_send="unicast", timeout=30),
        moe.reference(x, i, w),
    )
    after = client.stats().counters
    assert after["moe_unicasts"] - before["moe_unicasts"] == 1
    assert after["moe_bytes"] - before["moe_bytes"] == (16 + 8 + 8 * 5 + x.nbytes) + 3 * (
        16 + x.nbytes
    )
