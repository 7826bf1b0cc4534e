"""A client that lies about when it submitted: the shared histograms keep their own time.

Each descriptor carries ``submit_ns``, the client's own CLOCK_MONOTONIC stamp. The
dataplane-wide ``end_to_end`` and ``prepare`` histograms that ``duckpipe stats``,
``duckpipe-top`` and the exporter show once took it on trust: ``submit_ns = 1`` on
ordinary forwards moved their mean to 1.2e12 ns and their p99 to the top bucket, for
everyone. Now they take only the dataplane's own clock (picked up -> completion, picked
up -> first send), and a stamp that cannot be honest (after pickup, or before the client
attached) gives that client's own ``prepare_ns`` as 0 and is counted
(``client_clock_implausible``).

The hostile client is a real ``duckpipe.Client`` whose stamp is replaced as it submits
(the same copy-and-push ``dp_submit_template`` does, with the forged stamp). Runs
against the mock and the C dataplane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import duckpipe
import duckpipe.client.session as session_module
from duckpipe import GeluMlp
from duckpipe._abi import ffi, lib
from duckpipe.host import monotonic_ns
from duckpipe.observe import stats_reader as stats

HIDDEN = 32
LAYER = 26
MLP = GeluMlp.random(HIDDEN, 64, seed=26)
N = 12  # forwards per run
TOP = 2**35  # the last finite bucket bound: a p99 at or past it is the poisoned one
PHASES = ("end_to_end", "prepare")


class _ForgingLib:
    """``duckpipe._abi.lib`` for the session module, but each submit carries the stamp
    ``stamp()`` returns instead of the clock's."""

    def __init__(self, stamp: Callable[[], int]) -> None:
        self._stamp = stamp

    def __getattr__(self, name: str):
        return getattr(lib, name)

    def dp_submit_template(self, s, tpl, forward_id, slot, generation, epoch) -> int:
        d = ffi.new("struct dp_desc *")
        ffi.memmove(d, tpl, ffi.sizeof("struct dp_desc"))
        d.forward_id, d.slot, d.generation, d.epoch = forward_id, slot, generation, epoch
        d.submit_ns = self._stamp()
        return lib.dp_client_submit(s.seg, s.ring, s.descs, s.capacity, d, s.doorbell_fd)


@contextmanager
def _forged(monkeypatch: pytest.MonkeyPatch, stamp: Callable[[], int]) -> Iterator[None]:
    with monkeypatch.context() as m:
        m.setattr(session_module, "lib", _ForgingLib(stamp))
        yield


def _run(c: duckpipe.Client, control: str, rng: np.random.Generator) -> tuple[dict, list[int]]:
    """N checked forwards; the shared histograms' part of them, and their own prepare_ns."""
    before = stats.read_snapshot(control=control).latency
    prepares = []
    for _ in range(N):
        x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
        with c.claim(x.shape, x.dtype) as slot:
            slot.array[...] = x
            fwd = c.submit(slot, LAYER)
        with fwd:
            np.testing.assert_allclose(fwd.result(10), MLP.reference(x), rtol=2e-4, atol=2e-5)
            prepares.append(fwd.timings.prepare_ns)
    deadline = time.monotonic() + 5
    while True:  # a completion's histograms are written before its Completion is sent
        now = stats.read_snapshot(control=control).latency
        delta = {p: now[p].minus(before[p]) for p in PHASES}
        if all(h.total() >= N for h in delta.values()) or time.monotonic() > deadline:
            return delta, prepares
        time.sleep(0.02)


def _mean(h: stats.Histogram) -> float:
    return h.sum_ns / max(1, h.total())


def _implausible(c: duckpipe.Client) -> int:
    return c.stats().counters["client_clock_implausible"]


@pytest.fixture(scope="module")
def loaded(dataplane) -> Iterator[str]:
    with duckpipe.connect(dataplane.control, name="loader") as c:
        c.load_weights(LAYER, MLP, ducks=[0, 1, 2], shared=True)
        yield dataplane.control


@pytest.mark.parametrize(
    "stamp",
    [lambda: 1, lambda: monotonic_ns() + 3600 * 10**9],
    ids=["submit_ns=1", "an hour ahead"],
)
def test_a_forged_submit_stamp_leaves_the_shared_histograms_sane(loaded, monkeypatch, stamp):
    rng = np.random.default_rng(26)
    with duckpipe.connect(loaded, name="honest") as c:
        good, good_prepares = _run(c, loaded, rng)
    assert all(p >= 0 for p in good_prepares)
    with duckpipe.connect(loaded, name="liar") as c:
        counted = _implausible(c)
        with _forged(monkeypatch, stamp):
            bad, bad_prepares = _run(c, loaded, rng)
        deadline = time.monotonic() + 5
        while _implausible(c) - counted < N and time.monotonic() < deadline:
            time.sleep(0.02)
        implausible = _implausible(c) - counted
    for phase in PHASES:
        g, b = good[phase], bad[phase]
        assert g.total() == N and b.total() == N, (phase, g.total(), b.total())
        # the liar's forwards weigh as much as the honest ones (a loaded machine may slow
        # either run: a wide margin, and a floor of 1 s against a poisoned 1.2e12)
        assert 0 < _mean(b) < max(50 * _mean(g), 1e9), (phase, _mean(g), _mean(b))
        assert b.quantile(0.99) < TOP, (phase, b.counts)
    # its own figures: the stamp could not be honest, so no prepare time at all; counted
    assert bad_prepares == [0] * N
    assert implausible == N


def test_an_honest_stamp_is_not_counted(loaded):
    with duckpipe.connect(loaded, name="honest") as c:
        counted = _implausible(c)
        good, prepares = _run(c, loaded, np.random.default_rng(7))
        assert _implausible(c) == counted
    assert good["end_to_end"].total() == N and any(p > 0 for p in prepares)
