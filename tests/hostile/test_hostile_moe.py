"""A MoE duck that answers rows it was not routed.

Three fake MoE ducks (tests/moe_fake.py: numpy banks, raw UDP); duck 1 lies:
before its honest reply to every routed forward it sends whole replies with a row too
many, a row too few, the right rows but a wrong total, no ROUTED flag, and, from duck
2's own socket, a reply in the name of duck 2, which that forward did not route to. The
C dataplane must refuse and count every one (rx_unrouted), never add one into a result,
nor answer duck 2's NACK for an input it was never sent,
and still complete the forward with the honest reply; a duck that only lies makes the
forward time out cleanly, naming it and its experts.
"""

from __future__ import annotations

import numpy as np
import pytest
from moe_fake import FakeMoeDuck, fake_cluster, load_moe, routed_forward

import duckpipe
from duckpipe import MoeMlp
from duckpipe.schema.abi import DescFlag, Status
from duckpipe.schema.wire import WireFlag, WireOp
from duckpipe.testing.datagrams import encode

pytestmark = pytest.mark.dataplane

HIDDEN = 128
PLACEMENT = [[0], [0], [1], [1], [2], [2]]
DUCKS = [0, 1, 2]


class RowLiar(FakeMoeDuck):
    """Duck 1: lies about its rows first, then (unless ``honest`` is off) tells the truth."""

    def __init__(self, port: int, accomplice: FakeMoeDuck) -> None:
        super().__init__(1, port)
        self.accomplice = accomplice
        self.honest = True
        self.lies = 0  # datagrams sent that the dataplane must refuse

    def _message(self, h, common, rows: int, total: int, flags: int) -> list[bytes]:
        raw = np.full(total // 4, 1e6, np.float32).tobytes()  # never to be summed
        chunks = max(1, -(-total // self.payload))
        fields = dict(common, dtype=h.dtype, rows=rows, chunks=chunks, total=total, flags=flags)
        return [
            encode(
                WireOp.PARTIAL,
                raw[c * self.payload : (c + 1) * self.payload],
                **fields,
                chunk=c,
                offset=c * self.payload,
            )
            for c in range(chunks)
        ]

    def _reply(self, h, host, common, rows: np.ndarray, y: np.ndarray) -> None:
        n, row = len(rows), HIDDEN * 4
        lies = [
            *self._message(h, common, n + 1, (n + 1) * row, WireFlag.ROUTED),
            *self._message(h, common, n, n * row + 4, WireFlag.ROUTED),
            *self._message(h, common, n, n * row, 0),
        ]
        if n > 1:
            lies += self._message(h, common, n - 1, (n - 1) * row, WireFlag.ROUTED)
        for d in lies:
            self.sock.sendto(d, host)
        # duck 2, from its own address: this forward routes nothing to it
        for d in self._message(h, dict(common, duck=2), n, n * row, WireFlag.ROUTED):
            self.accomplice.sock.sendto(d, host)
            lies.append(d)
        # and it asks for an input it was never sent: it must get none
        self.accomplice.sock.sendto(
            encode(WireOp.NACK, flags=WireFlag.INPUT, **dict(common, duck=2)), host
        )
        self.lies += len(lies)
        if self.honest:
            super()._reply(h, host, common, rows, y)


def _liars(base: int) -> list:
    """Duck 0 honest, duck 1 a liar answering duck 2's rows too, duck 2 honest."""
    duck2 = FakeMoeDuck(2, base + 3)
    return [FakeMoeDuck(0, base + 1), RowLiar(base + 2, duck2), duck2]


def _no_layer_ducks(base: int) -> list:
    """Duck 0 says NO_LAYER for duck 2's forwards, duck 1 is silent, duck 2 honest."""
    duck2 = FakeMoeDuck(2, base + 3)
    return [NoLayerAccomplice(base + 1, duck2), FakeMoeDuck(1, base + 2, silent=True), duck2]


@pytest.fixture
def liar_cluster():
    with fake_cluster(len(DUCKS), _liars) as pair:
        yield pair


def test_unrouted_rows_are_refused_counted_and_never_summed(liar_cluster):
    dp, ducks = liar_cluster
    liar = ducks[1]
    moe = MoeMlp.random(6, HIDDEN, 8, shared=False, seed=21)
    rng = np.random.default_rng(22)
    with duckpipe.connect(dp.control, slot_size=1 << 17) as c:
        s = c._session
        assert load_moe(s, 30, moe, DUCKS, PLACEMENT) == Status.OK
        # duck 2 is a target once: its state in the (reused) context is then this forward's
        x = rng.standard_normal((2, HIDDEN)).astype(np.float32)
        idx = np.array([[4, 1], [5, 2]], np.uint32)
        w = np.ones((2, 2), np.float32)
        warm = routed_forward(s, 30, x, idx, w, 6, flags=int(DescFlag.MOE_UNICAST))
        assert warm.status == Status.OK and sorted(warm.answered) == DUCKS, warm.message
        duck2_seen = len(ducks[2].seen)
        liar.lies = 0  # the warm-up's were refused too; count from here
        before = c.stats().counters
        forwards = 6
        for i in range(forwards):
            tokens = 2 + i
            x = rng.standard_normal((tokens, HIDDEN)).astype(np.float32)
            # ducks 0 and 1 only: duck 2 is never a target
            idx = np.array([[0, 2 + i % 2]] * tokens, np.uint32)
            w = rng.random((tokens, 2)).astype(np.float32)
            got = routed_forward(s, 30, x, idx, w, 6, flags=0)
            assert got.status == Status.OK, got.message
            np.testing.assert_allclose(got.y, moe.reference(x, idx, w), rtol=2e-4, atol=2e-5)
            assert sorted(got.answered) == [0, 1]
        after = c.stats().counters
        lies = liar.lies
        # a liar alone: refused, then the deadline, naming it with its experts
        liar.honest = False
        x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
        idx = np.array([[0, 2]] * 3, np.uint32)
        lost = routed_forward(s, 30, x, idx, np.ones((3, 2), np.float32), 6, timeout_us=300_000)
        assert lost.status == Status.TIMEOUT
        assert lost.missing == [1] and lost.message == "duck 1 (experts 2 3) did not answer"
        liar.honest = True
        # and the dataplane serves on
        got = routed_forward(s, 30, x, idx, np.ones((3, 2), np.float32), 6)
        assert got.status == Status.OK, got.message
    assert lies >= forwards * 5
    # every lie arrived before the truth that completed its forward (one socket queue,
    # in the order sent): each one refused and counted
    assert after["rx_unrouted"] - before["rx_unrouted"] == lies
    assert after["forwards_ok"] - before["forwards_ok"] == forwards
    assert after["timeouts"] == before["timeouts"]
    assert not any(d.refused for d in ducks), [d.refused for d in ducks]
    # no FORWARD reached duck 2 after the warm-up, however often it asked
    assert not ducks[2].inputs and len(ducks[2].seen) == duck2_seen


class NoLayerAccomplice(FakeMoeDuck):
    """Duck 0: answers honestly, and on every routed forward makes duck 2 (whom the
    forward does not route to) say NACK|NO_LAYER about it, from duck 2's own address, as
    a restarted duck would on a NIC that broadcasts routed forwards to every duck."""

    def __init__(self, port: int, accomplice: FakeMoeDuck) -> None:
        super().__init__(0, port)
        self.accomplice = accomplice

    def _reply(self, h, host, common, rows: np.ndarray, y: np.ndarray) -> None:
        nack = encode(WireOp.NACK, flags=WireFlag.NO_LAYER, **dict(common, duck=2))
        self.accomplice.sock.sendto(nack, host)
        super()._reply(h, host, common, rows, y)


@pytest.fixture
def no_layer_cluster():
    with fake_cluster(len(DUCKS), _no_layer_ducks) as pair:
        yield pair


def test_no_layer_from_a_duck_not_routed_does_not_rename_the_missing_duck(no_layer_cluster):
    """A routed forward to ducks 0 and 1 where duck 1 is silent: duck 2, which the forward
    does not route to, says NO_LAYER about it. The forward times out naming duck 1 and its
    experts, not duck 2 (whose state in the context is another forward's)."""
    dp, ducks = no_layer_cluster
    moe = MoeMlp.random(6, HIDDEN, 8, shared=False, seed=23)
    with duckpipe.connect(dp.control, slot_size=1 << 17) as c:
        s = c._session
        assert load_moe(s, 31, moe, DUCKS, PLACEMENT) == Status.OK
        x = np.ones((3, HIDDEN), np.float32)
        idx = np.array([[0, 2]] * 3, np.uint32)
        lost = routed_forward(s, 31, x, idx, np.ones((3, 2), np.float32), 6, timeout_us=300_000)
        assert lost.status == Status.TIMEOUT, lost.message
        assert lost.missing == [1], lost.missing
        assert lost.message == "duck 1 (experts 2 3) did not answer", lost.message
    assert not ducks[2].inputs  # duck 2 was never sent the forward
