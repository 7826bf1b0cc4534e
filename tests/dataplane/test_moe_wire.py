"""Routed (mixture-of-experts) forwards through the C dataplane, against fake MoE ducks.

Three ducks on loopback (no broadcast: the dataplane sends the broadcast message to each
targeted duck in turn) are tests/moe_fake.py ducks: they read the wire table with
the dataplane's own rule and compute their banks in numpy, so the sums here check the
whole path (the MOE load and its banks, the routed descriptor and host table, the split
with bank slots, both modes, the row-mapped sum) against MoeMlp.reference.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from moe_fake import FakeMoeDuck, fake_cluster, load_moe, routed_forward

import duckpipe
from duckpipe import MoeMlp
from duckpipe.errors import DuckpipeError
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.observe.stats_reader import PLAN, find_stats, views
from duckpipe.schema import stats as S
from duckpipe.schema.abi import DescFlag, Status

pytestmark = pytest.mark.dataplane

HIDDEN = 256  # 1 KiB rows: 1392-byte chunks end inside rows
EXPERT_FFN = 16
DUCKS = [0, 1, 2]
# expert e on duck e // 2; expert 5 also on duck 0 (replicas: t % 2 picks duck 2 or 0)
PLACEMENT = [[0], [0], [1], [1], [2], [2, 0]]
ANY_DUCK = 0xFFFF


@contextmanager
def _cluster(**settings) -> Iterator[tuple[DataplaneProcess, list[FakeMoeDuck]]]:
    def make(base: int) -> list[FakeMoeDuck]:
        return [FakeMoeDuck(d, base + 1 + d) for d in DUCKS]

    with fake_cluster(len(DUCKS), make, **settings) as (dp, ducks):
        yield dp, ducks
    for d in ducks:
        assert not d.refused, d.refused


@pytest.fixture(scope="module")
def cluster():
    with _cluster() as pair:
        yield pair


def _duck_moe(control: str) -> dict[int, tuple[int, int]]:
    """Each duck's (moe_tokens, moe_expert_rows) from the stats segment's raw duck table."""
    fd = os.open(find_stats(control), os.O_RDONLY)
    try:
        m = mmap.mmap(fd, PLAN["segment_size"], mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        rows = views(m)["ducks"].copy()
    finally:
        m.close()
    return {
        int(r["id"]): (int(r["moe_tokens"]), int(r["moe_expert_rows"]))
        for r in rows
        if int(r["state"]) != S.DuckState.NONE  # unused slots: id 0 too
    }


def _routing(rng: np.random.Generator, tokens: int, topk: int, n_experts: int):
    idx = np.stack([rng.permutation(n_experts)[:topk] for _ in range(tokens)]).astype(np.uint32)
    w = rng.random((tokens, topk)).astype(np.float32)
    return idx, w


def _check(got, moe, x, idx, w):
    assert got.status == Status.OK, got.message
    np.testing.assert_allclose(got.y, moe.reference(x, idx, w), rtol=2e-4, atol=2e-5)


def test_routed_forwards_sum_what_numpy_says_in_every_mode(cluster):
    dp, ducks = cluster
    moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=False, seed=1)
    rng = np.random.default_rng(2)
    with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
        s = c._session
        assert load_moe(s, 10, moe, DUCKS, PLACEMENT) == Status.OK
        before = c.stats()
        moe_before = _duck_moe(dp.control)
        for flags, mode in (
            (DescFlag.MOE_BROADCAST, "broadcast"),
            (DescFlag.MOE_UNICAST, "unicast"),
            (0, "auto"),
        ):
            seen_before = [len(d.seen) for d in ducks]
            x = rng.standard_normal((7, HIDDEN)).astype(np.float32)
            idx, w = _routing(rng, 7, 2, 6)
            got = routed_forward(s, 10, x, idx, w, 6, flags=int(flags))
            _check(got, moe, x, idx, w)
            new = [d.seen[n:] for d, n in zip(ducks, seen_before, strict=True)]
            if mode == "broadcast":  # every targeted duck got the whole table and all 7 rows
                assert all(m.duck == ANY_DUCK and m.rows == 7 for s_ in new for m in s_), new
            if mode == "unicast":  # each its own section, rows renumbered, its rows only
                for d, s_ in zip(DUCKS, new, strict=True):
                    for m in s_:
                        assert m.duck == d and list(m.sections) == [d], m
                        assert m.rows == m.sections[d].n_rows < 7
        # a forward routed to duck 1's experts alone: ducks 0 and 2 get nothing
        seen_before = [len(d.seen) for d in ducks]
        x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
        idx = np.array([[2, 3], [3, 2], [2, 3]], np.uint32)
        w = np.ones((3, 2), np.float32)
        got = routed_forward(s, 10, x, idx, w, 6)
        _check(got, moe, x, idx, w)
        assert got.answered == [1] and got.missing == []
        assert [len(d.seen) - n for d, n in zip(ducks, seen_before, strict=True)] == [0, 1, 0]
        after = c.stats()
        moe_after = _duck_moe(dp.control)
    n = {k: after.counters[k] - before.counters[k] for k in after.counters}
    assert n["moe_forwards"] == 4 and n["forwards_ok"] == 4
    assert n["moe_broadcasts"] >= 1 and n["moe_unicasts"] >= 1
    assert n["moe_broadcasts"] + n["moe_unicasts"] == 4  # one NIC part each
    assert n["moe_bytes"] > 0 and n["rx_unrouted"] == 0
    # the stats count what each duck computed: the four forwards routed 7 + 7 + 7 tokens
    # by 2 and 3 tokens by 2 = 48 (token, expert) pairs; the last one 3 rows on duck 1
    tokens = {d: moe_after[d][0] - moe_before[d][0] for d in DUCKS}
    pairs = {d: moe_after[d][1] - moe_before[d][1] for d in DUCKS}
    assert sum(pairs.values()) == 48, pairs
    assert tokens[1] >= 3 and all(tokens[d] <= 3 * 7 + 3 for d in DUCKS), tokens


def test_a_shared_expert_reaches_every_duck_with_every_row(cluster):
    dp, ducks = cluster
    moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=True, seed=3)
    rng = np.random.default_rng(4)
    with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
        s = c._session
        assert load_moe(s, 11, moe, DUCKS, PLACEMENT) == Status.OK
        for flags in (0, int(DescFlag.MOE_UNICAST)):
            x = rng.standard_normal((5, HIDDEN)).astype(np.float32)
            idx = np.array([[2, 3]] * 5, np.uint32)  # routed to duck 1 alone
            w = rng.random((5, 2)).astype(np.float32)
            got = routed_forward(s, 11, x, idx, w, 6, flags=flags)
            _check(got, moe, x, idx, w)
            assert sorted(got.answered) == DUCKS  # each computes its shared columns
            assert all(d.seen[-1].shared and d.seen[-1].rows == 5 for d in ducks)


def test_float16_routed_forward(cluster):
    dp, _ = cluster
    moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=True, dtype=np.float16, seed=5)
    rng = np.random.default_rng(6)
    with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
        s = c._session
        assert load_moe(s, 12, moe, DUCKS, PLACEMENT) == Status.OK
        x = rng.standard_normal((9, HIDDEN)).astype(np.float16)
        idx, w = _routing(rng, 9, 3, 6)
        got = routed_forward(s, 12, x, idx, w, 6)
        assert got.status == Status.OK, got.message
        want = moe.reference(x, idx, w).astype(np.float32)
        np.testing.assert_allclose(got.y.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_refusals_say_what_is_wrong(cluster):
    dp, _ = cluster
    moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=False, seed=7)
    rng = np.random.default_rng(8)
    with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
        s = c._session
        with pytest.raises(DuckpipeError, match="expert 2 is placed on duck 2, which is not"):
            load_moe(s, 13, moe, [0, 1], [[0], [0], [2], [1], [1], [1]])
        with pytest.raises(DuckpipeError, match="no b_down"):
            load_moe(s, 13, moe, DUCKS, PLACEMENT, has_b_down=True)
        with pytest.raises(DuckpipeError, match="expert_ducks lists 6"):
            load_moe(s, 13, moe, DUCKS, PLACEMENT, expert_ducks=[0, 0, 1, 1, 2, 2])
        assert load_moe(s, 13, moe, DUCKS, PLACEMENT) == Status.OK
        x = rng.standard_normal((4, HIDDEN)).astype(np.float32)
        idx, w = _routing(rng, 4, 2, 6)
        # the table routes over 5 experts: the layer has 6
        bad = routed_forward(s, 13, x, idx % 5, w, 5)
        assert bad.status == Status.BAD_REQUEST
        assert bad.message.startswith("routing: the table routes over 5 experts"), bad.message
        both = int(DescFlag.MOE_BROADCAST | DescFlag.MOE_UNICAST)
        bad = routed_forward(s, 13, x, idx, w, 6, flags=both)
        assert bad.status == Status.BAD_REQUEST and "together" in bad.message
        # the same forward still works after
        _check(routed_forward(s, 13, x, idx, w, 6), moe, x, idx, w)
        n = c.stats().counters
    assert n["bad_requests"] >= 2


def test_a_silent_duck_is_named_with_its_experts_and_routes_around_it_complete(cluster):
    dp, ducks = cluster
    moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=False, seed=9)
    rng = np.random.default_rng(10)
    with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
        s = c._session
        assert load_moe(s, 14, moe, DUCKS, PLACEMENT) == Status.OK
        ducks[1].silent = True
        try:
            x = rng.standard_normal((2, HIDDEN)).astype(np.float32)
            w = np.ones((2, 2), np.float32)
            lost = routed_forward(
                s, 14, x, np.array([[0, 2], [1, 3]], np.uint32), w, 6, timeout_us=300_000
            )
            assert lost.status == Status.TIMEOUT
            assert lost.missing == [1] and lost.answered == [0]
            assert lost.message == "duck 1 (experts 2 3) did not answer", lost.message
            idx = np.array([[0, 4], [1, 5]], np.uint32)  # ducks 0 and 2 only
            _check(routed_forward(s, 14, x, idx, w, 6), moe, x, idx, w)
        finally:
            ducks[1].silent = False


def test_a_duck_that_asks_for_its_input_again_gets_its_own_message():
    with _cluster() as (dp, ducks):
        ducks[2].ask_input_once = True
        moe = MoeMlp.random(6, HIDDEN, EXPERT_FFN, shared=False, seed=11)
        rng = np.random.default_rng(12)
        with duckpipe.connect(dp.control, slot_size=1 << 18) as c:
            s = c._session
            assert load_moe(s, 15, moe, DUCKS, PLACEMENT) == Status.OK
            for flags in (int(DescFlag.MOE_UNICAST), int(DescFlag.MOE_BROADCAST)):
                ducks[2].nacks_sent = 0
                x = rng.standard_normal((6, HIDDEN)).astype(np.float32)
                idx = np.array([[4, 0]] * 6, np.uint32)  # duck 2 (expert 4) and duck 0
                w = rng.random((6, 2)).astype(np.float32)
                _check(routed_forward(s, 15, x, idx, w, 6, flags=flags), moe, x, idx, w)
                assert ducks[2].nacks_sent == 2
            n = c.stats().counters
        assert n["retransmits"] >= 2
