"""Routing tables (issue 16 item 2's contract): the client packs a gate's (indices, weights)
into the layout of duckpipe/schema/routing.py, the dataplane's C rule (dp_routing.h, through
cffi) checks it, splits it into per-duck wire sections and checks those; Python and C agree."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from duckpipe import MoeMlp
from duckpipe.client import routing
from duckpipe.client.routing import RoutingRefused
from duckpipe.errors import BadInput
from duckpipe.moe import Gate, check_routing
from duckpipe.schema.abi import MAX_DUCKS
from duckpipe.schema.routing import (
    MAX_EXPERTS,
    MAX_REPLICAS,
    MAX_TOKENS,
    MAX_TOPK,
    ROUTING_MAGIC,
    ROUTING_NO_EXPERT,
    ROUTING_WIRE_MAGIC,
    RoutingError,
)

E = RoutingError


def _gate_routing(tokens: int, n_experts: int = 64, topk: int = 4, seed: int = 0):
    gate = Gate.random(n_experts, 16, topk=topk, seed=seed)
    x = np.random.default_rng(seed).standard_normal((tokens, 16)).astype(np.float32)
    indices, weights = gate(x)
    return indices, weights


def _deepseek(tokens: int, seed: int = 0):
    x = np.random.default_rng(seed).standard_normal((tokens, 64)).astype(np.float32)
    indices, weights = Gate.deepseek_v3(hidden=64, seed=seed)(x)
    return indices, weights


# --- the layout ------------------------------------------------------------------------


def _by_id(indices: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A gate's routing as a host table lists it: each token's choices by expert id,
    -1 (no expert) last."""
    key = np.where(indices < 0, np.iinfo(np.int64).max, indices.astype(np.int64))
    order = np.argsort(key, axis=1, kind="stable")
    return np.take_along_axis(indices, order, 1), np.take_along_axis(weights, order, 1)


def test_a_packed_table_is_the_schemas_layout_byte_for_byte() -> None:
    indices = np.array([[3, 1], [0, 2], [1, 3]], dtype=np.int64)
    weights = np.array([[0.5, 0.25], [1.0, -2.0], [0.0, 3.5]], dtype=np.float32)
    table = routing.pack(indices, weights, 4)
    raw = table.tobytes()
    assert len(raw) == routing.table_size(3, 2) == 16 + 3 * 2 * 8
    magic, version, flags, topk, tokens, n_experts = struct.unpack_from("<IBBHII", raw)
    assert (magic, version, flags, topk, tokens, n_experts) == (ROUTING_MAGIC, 1, 0, 2, 3, 4)
    assert raw[:4] == b"DPRT"
    entries = [struct.unpack_from("<If", raw, 16 + 8 * i) for i in range(6)]
    # each token's choices by expert id, with their weights: the order a duck's section
    # needs, so that the dataplane's split writes each entry where it goes, unsorted
    assert entries == [(1, 0.25), (3, 0.5), (0, 1.0), (2, -2.0), (1, 0.0), (3, 3.5)]


@pytest.mark.parametrize("tokens", [1, 8, 32])
def test_pack_then_unpack_gives_back_the_gates_routing(tokens: int) -> None:
    indices, weights = _deepseek(tokens)
    table = routing.pack(indices, weights, 256)
    got_indices, got_weights = routing.unpack(table, tokens, 256)
    assert got_indices.dtype == np.int32 and got_weights.dtype == np.float32
    want_indices, want_weights = _by_id(indices, weights)
    np.testing.assert_array_equal(got_indices, want_indices)
    np.testing.assert_array_equal(got_weights, want_weights)


def test_pack_writes_into_the_callers_buffer_and_unpack_copies_out_once() -> None:
    indices, weights = _gate_routing(5)
    slot = np.zeros(4096, dtype=np.uint8)  # the activation slot's bytes after the activation
    table = routing.pack(indices, weights, 64, out=slot[128:])
    assert np.shares_memory(table, slot) and table.size == routing.table_size(5, 4)
    got_indices, got_weights = routing.unpack(slot[128:], 5, 64)
    assert not np.shares_memory(got_weights, slot)
    slot[128 + 16 : 128 + 24] = 0xFF  # the client writes again after the dataplane read
    np.testing.assert_array_equal(got_indices, _by_id(indices, weights)[0])


def test_pack_refuses_a_buffer_too_small_for_the_table() -> None:
    indices, weights = _gate_routing(5)
    with pytest.raises(BadInput, match=r"needs 176 writable bytes, the buffer has 175"):
        routing.pack(indices, weights, 64, out=np.zeros(175, np.uint8))


# --- every hostile host table is refused by the C rule, saying why ----------------------


def _good() -> bytes:
    indices = np.array([[1, 5], [5, 2], [7, 0], [2, 1]], dtype=np.int32)
    weights = np.array([[0.5, 0.25], [1.0, 2.0], [-0.5, 0.125], [3.0, 0.0]], dtype=np.float32)
    return routing.pack(indices, weights, 8).tobytes()


def _patched(fmt: str, offset: int, value, *more) -> bytes:
    """_good() with value written at offset, then each (fmt, offset, value) of more."""
    raw = bytearray(_good())
    for f, at, v in ((fmt, offset, value), *more):
        struct.pack_into(f, raw, at, v)
    return bytes(raw)


HOSTILE = {
    "bad magic": (_patched("<I", 0, ROUTING_WIRE_MAGIC), E.BAD_MAGIC, r"not a host routing"),
    "version 2": (_patched("<B", 4, 2), E.BAD_VERSION, r"version 2, this build reads 1"),
    "flags": (_patched("<B", 5, 1), E.BAD_FLAGS, r"flags 0x01: none are defined"),
    "topk 0": (_patched("<H", 6, 0), E.TOPK, r"topk 0 is outside 1\.\.16"),
    "topk over the experts": (_patched("<H", 6, 9), E.TOPK, r"topk 9"),
    "tokens not the rows": (_patched("<I", 8, 3), E.TOKENS, r"3 tokens, the forward 4 rows"),
    "n_experts not the layer's": (
        _patched("<I", 12, 16),
        E.N_EXPERTS,
        r"routes over 16 experts, the layer has 8",
    ),
    "counts that overflow": (
        _patched("<H", 6, 0xFFFF),
        E.TOPK,
        r"topk 65535 is outside",
    ),
    "expert out of range": (
        _patched("<I", 16 + 8 * 5, 8),
        E.EXPERT,
        r"token 2, choice 1 names expert 8; the layer has 8 \(0\.\.7\)",
    ),
    # 2^32-1 is ROUTING_NO_EXPERT (the gate's -1); the id below it is past every layer
    "expert 2^32-2": (_patched("<I", 16 + 8 * 5, 0xFFFFFFFE), E.EXPERT, r"expert 4294967294"),
    "duplicate": (_patched("<I", 16 + 8 * 7, 1), E.DUPLICATE, r"token 3 names expert 1 twice"),
    # the packed table lists token 1 as {2, 5}: the other way round is out of order
    "experts descending": (
        _patched("<I", 16 + 8 * 2, 5, ("<I", 16 + 8 * 3, 2)),
        E.ORDER,
        r"token 1, choice 1 names expert 2 after expert 5: .* ascending order",
    ),
    "an expert after -1": (
        _patched("<I", 16 + 8 * 2, ROUTING_NO_EXPERT),
        E.ORDER,
        r"token 1, choice 1 names expert 5 after a -1 \(no expert\)",
    ),
    "NaN weight": (
        _patched("<I", 16 + 8 * 6 + 4, 0x7FC00000),
        E.WEIGHT,
        r"token 3, choice 0 \(expert 1\) has weight bits 0x7fc00000: NaN or infinite",
    ),
    "inf weight": (_patched("<f", 16 + 4, float("inf")), E.WEIGHT, r"token 0, choice 0"),
    "-inf weight": (_patched("<f", 16 + 4, float("-inf")), E.WEIGHT, r"bits 0xff800000"),
    "truncated by one byte": (_good()[:-1], E.TRUNCATED, r"need 80 bytes, the table has 79"),
    "header cut": (_good()[:15], E.TRUNCATED, r"15 bytes are fewer than the routing header"),
    "empty": (b"", E.TRUNCATED, r"0 bytes"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_the_c_rule_refuses_every_hostile_table_with_a_clear_reason(name: str) -> None:
    raw, code, reason = HOSTILE[name]
    with pytest.raises(RoutingRefused, match=reason) as err:
        routing.check(raw, 4, 8)
    assert err.value.code == code
    assert isinstance(err.value, BadInput)
    with pytest.raises(RoutingRefused):  # unpack checks the copy it reads
        routing.unpack(raw, 4, 8)


def test_the_c_rule_refuses_tokens_that_would_overflow_the_size() -> None:
    # 2^32-1 tokens by 2^16-1: 2^51 bytes; refused on the maximums before any product
    raw = struct.pack("<IBBHII", ROUTING_MAGIC, 1, 0, 0xFFFF, 0xFFFFFFFF, 8)
    with pytest.raises(RoutingRefused, match=r"4294967295 tokens") as err:
        routing.check(raw, 0xFFFFFFFF, 8)
    assert err.value.code == E.TOKENS
    with pytest.raises(BadInput, match=r"does not fit 64 bits"):
        routing.table_size(1 << 62, 4)


def test_the_c_rule_accepts_the_table_at_every_maximum() -> None:
    rng = np.random.default_rng(1)
    indices = np.argsort(rng.random((MAX_TOKENS, MAX_EXPERTS)), axis=1)[:, :MAX_TOPK]
    weights = rng.random(indices.shape).astype(np.float32)
    table = routing.pack(indices, weights, MAX_EXPERTS)
    assert table.size == 16 + 8 * MAX_TOKENS * MAX_TOPK


@pytest.mark.parametrize(
    "indices, weights, message",
    [
        # -1 is "no expert"; any other negative id is refused
        (np.array([[0, -2]]), np.ones((1, 2), np.float32), r"names expert -2; the layer has 8"),
        (
            np.array([[0, 2**32 - 1]], np.int64),  # the table's NO_EXPERT, not a gate's -1
            np.ones((1, 2), np.float32),
            r"names expert 4294967295; the layer has 8",
        ),
        (
            np.array([[0, 2**63 + 1]], np.uint64),
            np.ones((1, 2), np.float32),
            r"names expert 9223372036854775809: no layer has",
        ),
        (np.zeros((1, 17), np.int32), np.ones((1, 17), np.float32), r"1\.\.16 experts, got"),
        (
            np.zeros((MAX_TOKENS + 1, 1), np.int32),
            np.ones((MAX_TOKENS + 1, 1), np.float32),
            r"1\.\.4096 tokens, got 4097; split the batch",
        ),
        (np.array([[0, 1]]), np.array([[1.0, 1e300]]), r"weight 1e\+300, beyond float32"),
        (np.array([[0, 1]]), np.ones((1, 3), np.float32), r"must both be \[tokens, topk\]"),
        (np.array([[0.0, 1.0]]), np.ones((1, 2), np.float32), r"numpy array of integers"),
    ],
)
def test_pack_refuses_what_the_table_cannot_hold(indices, weights, message) -> None:
    with pytest.raises(BadInput, match=message):
        routing.pack(indices, weights, 8)


# --- the C rule against the spec ----------------------------------------------------------


@st.composite
def routings(draw):
    """A gate-like routing, then perhaps one or more faults of the kinds the rule names."""
    tokens = draw(st.integers(1, 12))
    n_experts = draw(st.integers(1, 40))
    topk = draw(st.integers(1, min(n_experts, MAX_TOPK)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = np.argsort(rng.random((tokens, n_experts)), axis=1)[:, :topk].astype(np.int64)
    weights = rng.standard_normal((tokens, topk)).astype(np.float32)
    for _ in range(draw(st.integers(0, 3))):
        t, k = draw(st.integers(0, tokens - 1)), draw(st.integers(0, topk - 1))
        fault = draw(st.sampled_from(["range", "duplicate", "nan", "inf", "none", "none-nan"]))
        if fault == "range":
            indices[t, k] = draw(st.integers(n_experts, 0xFFFFFFFF) | st.integers(-(2**40), -2))
        elif fault.startswith("none"):  # not a fault: DeepEP's "no expert", any weight
            indices[t, k] = -1
            weights[t, k] = np.nan if fault == "none-nan" else weights[t, k]
        elif fault == "duplicate" and topk > 1:
            indices[t, k] = indices[t, (k + 1) % topk]
        elif fault == "nan":
            weights[t, k] = np.nan
        elif fault == "inf":
            weights[t, k] = draw(st.sampled_from([np.inf, -np.inf]))
    return indices, weights, n_experts


def _spec_verdict(indices, weights, n_experts) -> set[RoutingError]:
    """The faults a routing has, by the rule docs/protocols.md states, written in numpy
    here so that the C rule (the client's and the dataplane's one check) is judged against
    the spec and not against itself: ids in 0..n_experts-1 or -1 (DeepEP's "no expert":
    any number per token, its weight not looked at), the others distinct per token, with
    finite weights."""
    faults = set()
    none = indices == -1
    if (((indices < 0) | (indices >= n_experts)) & ~none).any():
        faults.add(E.EXPERT)
    ordered = np.sort(np.where(none, -1 - np.arange(indices.shape[1]), indices), axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():  # each -1 made unique: never a duplicate
        faults.add(E.DUPLICATE)
    if (~np.isfinite(weights) & ~none).any():
        faults.add(E.WEIGHT)
    return faults


@settings(max_examples=300, deadline=None)
@given(routings())
def test_the_c_rule_refuses_exactly_the_routings_the_spec_refuses(case) -> None:
    indices, weights, n_experts = case
    spec = _spec_verdict(indices, weights, n_experts)
    try:
        check_routing(np.empty((indices.shape[0], 1)), indices, weights, n_experts)
        c: RoutingRefused | None = None
    except RoutingRefused as e:
        c = e
    event("refused" if c else "accepted")
    assert (not spec) == (c is None), (spec, c)
    if c is None:
        return
    assert c.code in spec, f"C said {c.code.name} of a routing with faults {spec}"
    if len(spec) == 1:  # one kind of fault: the message says it
        words = {E.EXPERT: "the layer has", E.DUPLICATE: "twice", E.WEIGHT: "NaN or infinite"}
        assert re.search(words[c.code], str(c)), c


def _python_table_verdict(raw: bytes, tokens: int, n_experts: int) -> bool:
    """The host table rules from the schema's dtypes and the spec, for comparison."""
    if len(raw) < routing.HEADER_DTYPE.itemsize:
        return False
    h = np.frombuffer(raw[:16], routing.HEADER_DTYPE)[0]
    topk = int(h["topk"])
    if (int(h["magic"]), int(h["version"]), int(h["flags"])) != (ROUTING_MAGIC, 1, 0):
        return False
    if int(h["n_experts"]) != n_experts or int(h["tokens"]) != tokens or tokens > MAX_TOKENS:
        return False
    if not 1 <= topk <= min(MAX_TOPK, n_experts) or len(raw) < 16 + 8 * tokens * topk:
        return False
    entries = np.frombuffer(raw[16 : 16 + 8 * tokens * topk], routing.ENTRY_DTYPE)
    entries = entries.reshape(tokens, topk)
    ids = entries["expert"].astype(np.int64)
    # a table lists a token's experts ascending, "no expert" (2^32-1, the largest) last:
    # each above the one before, or both no expert
    after, before = ids[:, 1:], ids[:, :-1]
    if ((after < before) | ((after == before) & (after != ROUTING_NO_EXPERT))).any():
        return False
    experts = ids.copy()
    experts[experts == ROUTING_NO_EXPERT] = -1  # the table's "no expert" is the gate's -1
    return not _spec_verdict(experts, entries["weight"], n_experts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 8),
)
def test_the_c_check_and_the_spec_agree_on_mutated_tables(seed: int, flips, cut: int) -> None:
    rng = np.random.default_rng(seed)
    tokens, n_experts = int(rng.integers(1, 6)), int(rng.integers(1, 12))
    topk = int(rng.integers(1, min(n_experts, 4) + 1))
    indices = np.argsort(rng.random((tokens, n_experts)), axis=1)[:, :topk]
    weights = rng.standard_normal((tokens, topk)).astype(np.float32)
    raw = bytearray(routing.pack(indices, weights, n_experts).tobytes())
    for at, byte in flips:  # small header fields and entries alike
        raw[at % len(raw)] = byte
    raw = bytes(raw[: len(raw) - cut])
    try:
        routing.check(raw, tokens, n_experts)
        c = True
    except RoutingRefused:
        c = False
    event("accepted" if c else "refused")
    assert c == _python_table_verdict(raw, tokens, n_experts)


# --- the placement, the split, the wire ------------------------------------------------


def test_placement_refuses_what_a_split_cannot_follow() -> None:
    with pytest.raises(BadInput, match=r"expert 1 is placed on 0 ducks"):
        routing.placement([[0], []])
    with pytest.raises(BadInput, match=rf"on {MAX_REPLICAS + 1} ducks; give it 1\.\.8"):
        routing.placement([list(range(MAX_REPLICAS + 1))])
    with pytest.raises(BadInput, match=r"ducks are 0\.\.255"):
        routing.placement([[MAX_DUCKS]])
    with pytest.raises(RoutingRefused, match=r"expert 0 is placed on duck 3 twice") as err:
        routing.placement([[3, 3]])
    assert err.value.code == E.PLACEMENT
    with pytest.raises(BadInput, match=r"1\.\.1024 experts, got 0"):
        routing.placement([])


def _reference_split(indices, weights, ducks_of, nic=None) -> dict[int, list[tuple]]:
    """Per duck, its (row, expert, weight) entries ascending, by the rule in
    schema/routing.py: token t reaches expert e through replica t % replicas."""
    out: dict[int, list[tuple]] = {}
    for t in range(indices.shape[0]):
        for k in range(indices.shape[1]):
            e = int(indices[t, k])
            if e == -1:  # no expert: no duck hears of it
                continue
            d = ducks_of[e][t % len(ducks_of[e])]
            if nic is None or d in nic:
                out.setdefault(d, []).append((t, e, float(weights[t, k])))
    return {d: sorted(v) for d, v in out.items()}


@st.composite
def placements(draw):
    n_experts = draw(st.integers(1, 48))
    ducks_of = [
        draw(st.lists(st.integers(0, 40), min_size=1, max_size=MAX_REPLICAS, unique=True))
        for _ in range(n_experts)
    ]
    return ducks_of


@settings(max_examples=150, deadline=None)
@given(
    ducks_of=placements(),
    tokens=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    nic=st.none() | st.frozensets(st.integers(0, 40)),
)
def test_split_gives_each_duck_exactly_its_routed_rows(ducks_of, tokens, seed, nic) -> None:
    n_experts = len(ducks_of)
    rng = np.random.default_rng(seed)
    topk = int(rng.integers(1, min(n_experts, 8) + 1))
    indices = np.argsort(rng.random((tokens, n_experts)), axis=1)[:, :topk]
    weights = rng.standard_normal((tokens, topk)).astype(np.float32)
    indices[rng.random(indices.shape) < rng.random()] = -1  # "no expert", a share of them
    table = routing.pack(indices, weights, n_experts)
    wire, targets = routing.split(table, routing.placement(ducks_of), nic)
    want = _reference_split(indices, weights, ducks_of, nic)
    assert targets == set(want)
    if not want:
        assert wire.size == 0
        return
    got = routing.sections(wire, tokens, n_experts)  # checked by the C wire rule first
    assert set(got) == set(want)
    for d, s in got.items():
        entries = list(zip(s.row.tolist(), s.expert.tolist(), s.weight.tolist(), strict=True))
        assert entries == want[d], d
        assert s.n_rows == len({row for row, _, _ in want[d]})


def test_the_sections_carry_the_whole_layer_every_nic_once() -> None:
    """Each duck computes its rows' experts, weighted; the host adds the rows in place:
    the sum over every NIC's sections is the layer's reference (without the shared expert)."""
    tokens, n_experts = 9, 16
    layer = MoeMlp.random(n_experts, 32, 8, shared=False, seed=5)
    x = np.random.default_rng(5).standard_normal((tokens, 32)).astype(np.float32)
    gate = Gate.random(n_experts, 32, topk=3, seed=5)
    indices, weights = gate(x)
    ducks_of = [[e % 6, (e + 1) % 6] if e % 3 == 0 else [e % 6] for e in range(n_experts)]
    table = routing.pack(indices, weights, n_experts)
    place = routing.placement(ducks_of)
    y = np.zeros_like(x)
    for nic in ({0, 1, 2}, {3, 4, 5}):
        wire, targets = routing.split(table, place, nic)
        assert targets <= nic
        for duck, s in routing.sections(wire, tokens, n_experts).items():
            rows = np.unique(s.row)  # the reply's rows, ascending
            reply = np.zeros((s.n_rows, x.shape[1]), np.float32)
            for row, e, w in zip(s.row, s.expert, s.weight, strict=True):
                assert duck in ducks_of[e]
                at = np.searchsorted(rows, row)
                reply[at] += w * layer.experts[e].reference(x[row : row + 1])[0]
            y[rows] += reply
    np.testing.assert_allclose(y, layer.reference(x, indices, weights), rtol=1e-5, atol=1e-5)


def test_a_nic_with_no_routed_duck_sends_nothing() -> None:
    indices, weights = _gate_routing(4, n_experts=8, topk=2)
    place = routing.placement([[e] for e in range(8)])
    wire, targets = routing.split(routing.pack(indices, weights, 8), place, {100, 101})
    assert wire.size == 0 and targets == frozenset()


def test_minus_one_is_no_expert_in_the_table_and_reaches_no_duck() -> None:
    indices = np.array([[2, -1, 0], [-1, -1, -1], [-1, 1, 3]], np.int64)
    weights = np.array([[0.5, np.nan, 0.25], [np.inf, 7.0, -1.0], [1e30, 2.0, 3.0]], np.float32)
    table = routing.pack(indices, weights, 4)
    entries = [struct.unpack_from("<If", table.tobytes(), 16 + 8 * i) for i in range(9)]
    none = (ROUTING_NO_EXPERT, 0.0)  # its weight is not read: the pack stores 0, no NaN
    # each token's experts ascending, -1 last
    assert entries == [(0, 0.25), (2, 0.5), none, none, none, none, (1, 2.0), (3, 3.0), none]
    got_i, _ = routing.unpack(table, 3, 4)
    np.testing.assert_array_equal(got_i, [[0, 2, -1], [-1, -1, -1], [1, 3, -1]])
    # a table written by someone else: any weight bits in a "no expert" entry pass
    raw = bytearray(table.tobytes())
    struct.pack_into("<I", raw, 16 + 8 * 2 + 4, 0x7FC00000)
    routing.check(bytes(raw), 3, 4)
    # the split: token 1 reaches no duck, no section names -1
    place = routing.placement([[0], [1], [2], [3]])
    wire, targets = routing.split(table, place)
    assert targets == {0, 1, 2, 3}
    secs = routing.sections(wire, 3, 4)
    pairs = {d: list(zip(s.row.tolist(), s.expert.tolist(), strict=True)) for d, s in secs.items()}
    assert pairs == {0: [(0, 0)], 1: [(2, 1)], 2: [(0, 2)], 3: [(2, 3)]}
    # every slot -1: nothing to send, unless a shared expert gives every duck work
    all_none = routing.pack(np.full((3, 2), -1, np.int32), np.ones((3, 2), np.float32), 4)
    wire, targets = routing.split(all_none, place)
    assert wire.size == 0 and targets == frozenset()
    wire, targets = routing.split(all_none, place, shared=True)
    assert targets == frozenset() and routing.sections(wire, 3, 4) == {}


def test_split_refuses_a_placement_of_another_layer() -> None:
    indices, weights = _gate_routing(4, n_experts=8, topk=2)
    with pytest.raises(RoutingRefused, match=r"routes over 8 experts, the placement places 7"):
        routing.split(routing.pack(indices, weights, 8), routing.placement([[0]] * 7))


def test_a_unicast_carries_one_ducks_rows_renumbered() -> None:
    indices, weights = _deepseek(16)
    table = routing.pack(indices, weights, 256)
    ducks_of = [[e // 8] for e in range(256)]
    wire, targets = routing.split(table, routing.placement(ducks_of))
    whole = routing.sections(wire, 16, 256)
    for duck in sorted(targets)[:5]:
        uni, row_map = routing.unicast(wire, duck)
        s = whole[duck]
        np.testing.assert_array_equal(row_map, np.unique(s.row))
        (only,) = routing.sections(uni, len(row_map), 256).values()
        np.testing.assert_array_equal(row_map[only.row], s.row)
        np.testing.assert_array_equal(only.expert, s.expert)
        np.testing.assert_array_equal(only.weight, s.weight)
    with pytest.raises(RoutingRefused, match=r"duck 255 has no section") as err:
        routing.unicast(wire, 255)
    assert err.value.code == E.NO_SUCH_DUCK


def _wire() -> tuple[bytes, int]:
    indices, weights = _deepseek(8)
    wire, targets = routing.split(
        routing.pack(indices, weights, 256), routing.placement([[e // 8] for e in range(256)])
    )
    return wire.tobytes(), len(targets)


def _wire_patched(fmt: str, offset, value) -> bytes:
    raw, n_ducks = _wire()
    b = bytearray(raw)
    struct.pack_into(fmt, b, offset(n_ducks) if callable(offset) else offset, value)
    return bytes(b)


WIRE_HOSTILE = {
    "host magic": (_wire_patched("<I", 0, ROUTING_MAGIC), E.BAD_MAGIC, r"not a wire routing"),
    "no ducks": (_wire_patched("<H", 6, 0), E.DUCKS, r"0 duck sections, not 1\.\.256"),
    "rows not the activation's": (_wire_patched("<I", 8, 9), E.TOKENS, r"9 rows, the activation 8"),
    "entries past the bytes": (
        _wire_patched("<I", 12, 8 * 8 + 1),
        E.TRUNCATED,
        r"need \d+ bytes, the table has \d+",
    ),
    "a duck past MAX_DUCKS": (_wire_patched("<H", 16, 300), E.DUCKS, r"duck 300: ducks must"),
    "a section's rows wrong": (_wire_patched("<H", 18, 77), E.ROWS, r"says 77 rows"),
    "a row past the activation": (
        _wire_patched("<H", lambda n: 16 + 8 * n, 8),
        E.ROWS,
        r"row 8 of 8",
    ),
    "an expert past the layer": (
        _wire_patched("<H", lambda n: 16 + 8 * n + 2, 256),
        E.EXPERT,
        r"names expert 256",
    ),
    "NaN weight": (
        _wire_patched("<I", lambda n: 16 + 8 * n + 4, 0x7FC00001),
        E.WEIGHT,
        r"0x7fc00001: NaN",
    ),
    "truncated": (_wire()[0][:-1], E.TRUNCATED, r"the table has"),
}


@pytest.mark.parametrize("name", WIRE_HOSTILE)
def test_the_c_wire_rule_refuses_every_hostile_table(name: str) -> None:
    raw, code, reason = WIRE_HOSTILE[name]
    with pytest.raises(RoutingRefused, match=reason) as err:
        routing.check_wire(raw, 8, 256)
    assert err.value.code == code


def _python_wire_verdict(raw: bytes, rows: int, n_experts: int) -> bool:
    """The wire rules from the schema's dtypes, for comparison with dp_routing_wire_check."""
    if len(raw) < 16:
        return False
    h = np.frombuffer(raw[:16], routing.WIRE_HEADER_DTYPE)[0]
    n_ducks, entries = int(h["n_ducks"]), int(h["entries"])
    if (int(h["magic"]), int(h["version"]), int(h["flags"])) != (ROUTING_WIRE_MAGIC, 1, 0):
        return False
    if int(h["rows"]) != rows or not 1 <= n_ducks <= MAX_DUCKS:
        return False
    if not n_ducks <= entries <= rows * MAX_TOPK or len(raw) < 16 + 8 * (n_ducks + entries):
        return False
    directory = np.frombuffer(raw[16 : 16 + 8 * n_ducks], routing.WIRE_DUCK_DTYPE)
    ducks = directory["duck"].astype(np.int64)
    if (ducks >= MAX_DUCKS).any() or (np.diff(ducks) <= 0).any():
        return False
    counts = directory["n_entries"].astype(np.int64)
    if (counts < 1).any() or counts.sum() != entries:
        return False
    table = np.frombuffer(
        raw[16 + 8 * n_ducks : 16 + 8 * (n_ducks + entries)], routing.WIRE_ENTRY_DTYPE
    )
    ends = np.cumsum(counts)
    for n_rows, lo, hi in zip(directory["n_rows"], ends - counts, ends, strict=True):
        e = table[lo:hi]
        key = e["row"].astype(np.int64) << 16 | e["expert"]
        if (e["row"] >= rows).any() or (e["expert"] >= n_experts).any():
            return False
        if (np.diff(key) <= 0).any() or not np.isfinite(e["weight"]).all():
            return False
        if len(np.unique(e["row"])) != n_rows:
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 8),
)
def test_python_and_c_agree_on_mutated_wire_tables(seed: int, flips, cut: int) -> None:
    rng = np.random.default_rng(seed)
    tokens, n_experts = int(rng.integers(1, 6)), int(rng.integers(2, 12))
    topk = int(rng.integers(1, min(n_experts, 4) + 1))
    indices = np.argsort(rng.random((tokens, n_experts)), axis=1)[:, :topk]
    weights = rng.standard_normal((tokens, topk)).astype(np.float32)
    ducks_of = [[int(d)] for d in rng.integers(0, 4, n_experts)]
    wire, _ = routing.split(routing.pack(indices, weights, n_experts), routing.placement(ducks_of))
    raw = bytearray(wire.tobytes())
    for at, byte in flips:
        raw[at % len(raw)] = byte
    raw = bytes(raw[: len(raw) - cut])
    try:
        routing.check_wire(raw, tokens, n_experts)
        c = True
    except RoutingRefused:
        c = False
    event("accepted" if c else "refused")
    assert c == _python_wire_verdict(raw, tokens, n_experts)
