"""Expert load you can see (issue 30 point 4): after routed forwards with a known routing,
the stats segment's MoE region holds each expert's tokens (the numpy histogram of the
routing's indices, -1 left out, an expert's replicas counted once), each duck's routed
(token, expert) rows by the placement's replica rule, in running totals and in the recent
windows, on the mock and the C dataplane; `duckpipe stats --experts` names the hottest.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from duckpipe.moe import MoeMlp
from duckpipe.observe.stats_reader import MoeLayerStats, read_snapshot

HIDDEN, N_EXPERTS, EFFN = 64, 16, 32
# experts with 1, 2 and 3 replicas over ducks 0-15 of the fixture's 24
PLACEMENT = [[e % 8, 8 + (e * 3) % 8, 16 + e % 4][: 1 + e % 3] for e in range(N_EXPERTS)]
WINDOW_WAIT_S = 10.0  # a window ends about every second; this bounds a loaded machine's


def _layer(control: str, layer: int) -> MoeLayerStats:
    found = [la for la in read_snapshot(control=control).moe_layers if la.layer == layer]
    assert len(found) == 1, f"layer {layer}: {len(found)} MoE slots"
    return found[0]


def _routings(seed: int, forwards: int) -> list[np.ndarray]:
    """Indices [tokens, 3] of each forward, skewed to experts 0-3, with -1 (no expert)
    choices and whole -1 tokens."""
    rng = np.random.default_rng(seed)
    p = np.r_[np.full(4, 4.0), np.ones(N_EXPERTS - 4)]
    out = []
    for f in range(forwards):
        tokens = 5 + 3 * f
        i = np.stack(
            [rng.choice(N_EXPERTS, 3, replace=False, p=p / p.sum()) for _ in range(tokens)]
        ).astype(np.int32)
        i[rng.random(i.shape) < 0.15] = -1
        i[0] = -1
        out.append(i)
    return out


def _want_duck_rows(routings: list[np.ndarray]) -> dict[int, int]:
    """Each duck's (token, expert) rows by the placement's rule: token t reaches expert e
    through replica t % replicas[e] (dp_routing.h)."""
    want: dict[int, int] = {}
    for i in routings:
        for t, k in zip(*np.nonzero(i >= 0), strict=True):
            held = PLACEMENT[i[t, k]]
            d = held[t % len(held)]
            want[d] = want.get(d, 0) + 1
    return want


def _run(client, layer: int, routings: list[np.ndarray], on_each=None) -> None:
    rng = np.random.default_rng(layer)
    for i in routings:
        x = rng.standard_normal((i.shape[0], HIDDEN)).astype(np.float32)
        w = np.full(i.shape, 0.25, np.float32)
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, layer, routing=(i, w))
        with fwd:
            fwd.result(timeout=30)
            fwd.timings  # noqa: B018  the ZeroMQ completion: sent after the stats are written
        if on_each:
            on_each()


def test_each_experts_tokens_are_the_histogram_of_the_routing(client, dataplane):
    layer = 700
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, dtype=np.float32, seed=7)
    client.load_weights(layer, moe, placement=PLACEMENT)
    routings = _routings(7, 4)
    windows: dict[int, MoeLayerStats] = {}  # every recent window seen, by its end
    looks = [time.monotonic_ns()]

    def look() -> None:
        la = _layer(dataplane.control, layer)
        windows[la.window_end_ns] = la
        looks.append(time.monotonic_ns())

    start = looks[0]
    _run(client, layer, routings, on_each=look)
    done = time.monotonic_ns()  # every forward was counted by now (its completion came)
    hist = np.bincount(np.concatenate([i[i >= 0] for i in routings]), minlength=N_EXPERTS)
    la = _layer(dataplane.control, layer)
    assert la.loaded and la.n_experts == N_EXPERTS
    assert la.expert_tokens == hist.tolist()
    assert la.forwards == len(routings)
    assert la.tokens == sum(i.shape[0] for i in routings)
    assert la.entries == hist.sum()
    assert la.no_expert == sum(int((i < 0).sum()) for i in routings)
    assert la.expert_ducks == PLACEMENT
    want = _want_duck_rows(routings)
    assert {d: n for d, n in la.duck_rows.items() if n} == want
    assert la.imbalance() == max(want.values()) / (sum(want.values()) / len(la.duck_rows))
    assert la.hottest(1)[0].expert == int(np.argmax(hist))

    # the recent windows: together, those that ended since the first forward hold them all
    deadline = time.monotonic() + WINDOW_WAIT_S
    while max(windows) < done and time.monotonic() < deadline:
        time.sleep(0.05)
        look()
    assert max(windows) >= done, "no recent window ended after the forwards"
    seen = [w for end, w in windows.items() if end > start]
    assert all(0 < w.window_ns < 3 * 10**9 for w in seen)
    recent = np.sum([w.expert_recent for w in seen], axis=0)
    if max(np.diff(looks)) > 0.9e9:  # a window may have come and gone unseen (a slow machine)
        assert (recent <= hist).all()
        return
    assert recent.tolist() == hist.tolist()
    assert sum(w.recent_forwards for w in seen) == len(routings)
    recent_ducks: dict[int, int] = {}
    for w in seen:
        for d, n in w.duck_recent.items():
            if n:
                recent_ducks[d] = recent_ducks.get(d, 0) + n
    assert recent_ducks == want


def test_an_unloaded_layers_slot_says_so_and_keeps_its_counts(client, dataplane):
    layer = 701
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, dtype=np.float32, seed=8)
    client.load_weights(layer, moe, placement=PLACEMENT)
    routings = _routings(8, 1)
    _run(client, layer, routings)
    client.unload_layer(layer)
    deadline = time.monotonic() + WINDOW_WAIT_S
    while (la := _layer(dataplane.control, layer)).loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not la.loaded
    assert la.forwards == 1 and sum(la.expert_tokens) == int((routings[0] >= 0).sum())


def test_stats_experts_names_the_hottest_expert_and_its_ducks(client, dataplane):
    layer = 702
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, dtype=np.float32, seed=9)
    client.load_weights(layer, moe, placement=PLACEMENT)
    i = np.array([[5, 11, -1]] * 6 + [[5, 2, 9]] * 2, np.int32)  # expert 5: 8 tokens
    _run(client, layer, [i])
    out = subprocess.run(
        [sys.executable, "-m", "duckpipe", "stats", "--experts", "2", "--control",
         dataplane.control],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    block = out.split(f"MoE layer {layer} ", 1)[1].split("MoE layer ", 1)[0]
    lines = block.splitlines()
    assert "1 forwards, 8 tokens, 18 (token, expert) rows, 6 without an expert" in lines[0]
    hot = [ln.split() for ln in lines if ln.strip().startswith("expert ")]
    # expert 5 (ducks 5, 15, 17: 8 tokens, t % 3), then expert 11 (duck 3: 6 tokens)
    assert hot[0][:3] == ["expert", "5", "8"]
    assert "5 (" in " ".join(hot[0][4:]) and "15 (" in " ".join(hot[0][4:])
    assert hot[1][:3] == ["expert", "11", "6"]
    assert len(hot) == 2
    assert "imbalance (max/mean duck rows):" in block
