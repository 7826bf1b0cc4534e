"""The C dataplane's ``null`` backend: no network, every duck answers at once with
the activation itself, so a forward returns exactly ducks * x + b_down."""

from __future__ import annotations

import numpy as np
import pytest
from moe_fake import load_moe, routed_forward

import duckpipe
from duckpipe import GeluMlp, MoeMlp, SwiGluMlp
from duckpipe.schema.abi import Status
from duckpipe.testing import null_backend_result


@pytest.fixture
def null_factory(duckpipe_null_factory):
    return duckpipe_null_factory


def _grid(rng, shape, dtype) -> np.ndarray:
    """Values k/64 with |k| < 4096: k * x stays exact in float32 for k <= 256 ducks."""
    return (rng.integers(-4096, 4096, shape) / 64).astype(dtype)


def _assert_sane(n: dict[str, int], forwards: int) -> None:
    assert n["forwards"] == forwards and n["forwards_ok"] == forwards, n
    for k in (
        "timeouts",
        "duck_lost",
        "tx_errors",
        "rx_malformed",
        "rx_unknown_sender",
        "rx_bad_session",
        "rx_stale_epoch",
        "rx_duplicates",
        "nacks_sent",
        "nacks_received",
        "retransmits",
    ):
        assert n[k] == 0, (k, n)
    assert n["rx_packets"] > 0 and n["tx_packets"] > 0


@pytest.mark.parametrize(
    "kind, dtype, hidden, rows",
    [
        (GeluMlp, np.float32, 64, 1),
        (GeluMlp, np.float16, 384, 4),
        (SwiGluMlp, np.float32, 1024, 8),  # 32 KiB: 23 datagrams each way per duck
        (SwiGluMlp, np.float16, 7168, 3),  # 42 KiB in float16
    ],
)
def test_a_forward_returns_ducks_times_its_input_plus_b_down(
    null_factory, kind, dtype, hidden, rows
):
    dp = null_factory(ducks=5)
    mlp = kind.random(hidden, 40, dtype=dtype, seed=hidden)
    rng = np.random.default_rng(rows)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(3, mlp)
        for _ in range(20):
            x = _grid(rng, (rows, hidden), dtype)
            y = c.forward(3, x, timeout=5)
            assert y.dtype == dtype and y.shape == x.shape
            np.testing.assert_array_equal(y, null_backend_result(x, 5, mlp.b_down))
        n = c.stats().counters
    _assert_sane(n, 20)
    assert n["layers_loaded"] == 1 and n["weight_chunks"] > 0


def test_float16_is_exact_for_any_values(null_factory):
    dp = null_factory(ducks=7)
    mlp = GeluMlp.random(256, 32, dtype=np.float16, seed=1)
    rng = np.random.default_rng(5)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp)
        x = rng.standard_normal((6, 256)).astype(np.float16)
        np.testing.assert_array_equal(c.forward(1, x), null_backend_result(x, 7, mlp.b_down))


@pytest.mark.parametrize("mtu", [9000, 65535])
def test_datagrams_near_64_kib_are_sent_one_per_send(null_factory, mtu):
    # at mtu 65535 a datagram is more than a GSO send may carry: the worker once cut
    # zero of them per send and spun forever (the dataplane stopped heartbeating)
    dp = null_factory(ducks=2, mtu=mtu)
    mlp = GeluMlp.random(1024, 16, seed=2)
    rng = np.random.default_rng(9)
    with duckpipe.connect(dp.control, slot_size=1 << 20) as c:
        c.load_weights(1, mlp)
        for rows in (1, 64, 256):  # 4 KiB to 1 MiB: one chunk to seventeen
            x = _grid(rng, (rows, 1024), np.float32)
            np.testing.assert_array_equal(
                c.forward(1, x, timeout=5), null_backend_result(x, 2, mlp.b_down)
            )


def test_many_forwards_in_flight_all_come_back_exact(null_factory):
    dp = null_factory(ducks=8)
    mlp = GeluMlp.random(512, 64, seed=2)
    rng = np.random.default_rng(6)
    total = 0
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp)
        for _ in range(40):  # waves of 16 forwards in flight at once
            xs, fwds = [], []
            for _ in range(16):
                x = _grid(rng, (2, 512), np.float32)
                with c.claim(x.shape, np.float32) as slot:
                    slot.array[:] = x
                    fwds.append(c.submit(slot, layer=1))
                xs.append(x)
            for x, f in zip(xs, fwds, strict=True):
                with f:
                    np.testing.assert_array_equal(
                        f.result(timeout=5), null_backend_result(x, 8, mlp.b_down)
                    )
                    assert f.answered == tuple(range(8)) and f.missing == ()
            total += 16
        n = c.stats().counters
    _assert_sane(n, total)
    assert n["rx_late"] == 0


def test_ducks_on_several_nics_are_reduced_across_them(null_factory):
    dp = null_factory(ducks=7, nics=3)
    mlp = SwiGluMlp.random(2048, 48, seed=3)
    rng = np.random.default_rng(7)
    with duckpipe.connect(dp.control) as c:
        assert len(c.topology().ducks) == 7
        c.load_weights(2, mlp)
        for _ in range(30):
            x = _grid(rng, (3, 2048), np.float32)
            np.testing.assert_array_equal(c.forward(2, x), null_backend_result(x, 7, mlp.b_down))
        # a subset on two of the NICs: only those ducks answer
        x = _grid(rng, (1, 2048), np.float32)
        np.testing.assert_array_equal(
            c.forward(2, x, ducks=[0, 1, 4]), null_backend_result(x, 3, mlp.b_down)
        )
        n = c.stats().counters
    _assert_sane(n, 31)


def test_broadcast_reaches_every_duck_of_the_nic(null_factory):
    dp = null_factory(ducks=6, nics=2, broadcast=True)
    mlp = GeluMlp.random(1024, 24, seed=4, b_down=False)
    rng = np.random.default_rng(8)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp)
        for _ in range(10):
            x = _grid(rng, (4, 1024), np.float32)
            np.testing.assert_array_equal(c.forward(1, x), null_backend_result(x, 6))
        n = c.stats().counters
    _assert_sane(n, 10)
    # one FORWARD datagram per chunk and NIC, answered by each of the NIC's 3 ducks (every
    # weight datagram is acknowledged, every ping answered)
    sent = n["tx_packets"] - n["weight_datagrams"] - n["pings"]
    assert n["rx_packets"] - n["weight_datagrams"] - n["pongs"] == 3 * sent > 0


def test_a_one_mib_forward_is_answered_exactly(null_factory):
    dp = null_factory(ducks=2, max_forward_bytes=1 << 20)
    mlp = GeluMlp.random(4096, 16, seed=5)
    rng = np.random.default_rng(9)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp)
        x = _grid(rng, (64, 4096), np.float32)  # 1 MiB: ~720 datagrams each way per duck
        np.testing.assert_array_equal(c.forward(1, x), null_backend_result(x, 2, mlp.b_down))
        n = c.stats().counters
    _assert_sane(n, 1)


def test_a_routed_forward_is_refused_saying_the_null_backend_computes_nothing(null_factory):
    # a null duck echoes its input: no MoE reply could be right, so the dispatcher refuses
    # routed forwards on a null NIC outright instead of letting them time out
    dp = null_factory(ducks=2)
    moe = MoeMlp.random(4, 64, 8, shared=False, seed=2)
    rng = np.random.default_rng(3)
    with duckpipe.connect(dp.control, slot_size=1 << 16) as c:
        assert load_moe(c._session, 5, moe, [0, 1], [[0], [0], [1], [1]]) == Status.OK
        x = rng.standard_normal((3, 64)).astype(np.float32)
        idx = np.array([[0, 3]] * 3, np.uint32)
        got = routed_forward(c._session, 5, x, idx, np.ones((3, 2), np.float32), 4)
        n = c.stats().counters
    assert got.status == Status.BAD_REQUEST
    assert "null-backend NIC, which computes nothing" in got.message, got.message
    assert n["bad_requests"] == 1 and n["moe_forwards"] == 0 and n["forwards"] == 0


def _bf16(bits) -> np.ndarray:
    import ml_dtypes

    return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16)


def test_bfloat16_sums_round_to_nearest_even_bit_for_bit_as_ml_dtypes(null_factory):
    """One duck, so the result is x + b_down in float32, rounded to bfloat16 by the
    dataplane's store (AVX2 for 8 columns at a time, scalar for the 4 left over): each
    column's b_down is half an ulp of that column's x (a tie), three quarters (up) or a
    quarter (down), of either sign; the last columns take the largest finite value to
    inf (a tie with an odd last bit) or not, and carry infinities and NaNs."""
    hidden, rows = 260, 6
    rng = np.random.default_rng(28)
    exps = rng.integers(-100, 100, hidden)  # each column's binade
    frac = rng.choice([0.5, 0.75, 0.25], hidden) * rng.choice([-1.0, 1.0], hidden)
    b = (frac * 2.0 ** (exps - 7)).astype(np.float32)  # x's ulp is 2**(e - 7)
    m = rng.integers(128, 256, (rows, hidden)) / 128  # 1.xxxxxxx: 8 significant bits
    x = (m * rng.choice([-1.0, 1.0], (rows, hidden)) * 2.0**exps).astype(np.float32)
    x[:, -4:] = _bf16([0x7F7F, 0x7F7F, 0xFF80, 0x7FC0]).astype(np.float32)[None]
    b[-4:] = [2.0**119, 2.0**118, 1.0, 1.0]  # tie, odd lsb: inf; below the tie: stays
    x[1, -1] = -np.inf  # inf + 1; NaN + 1 in the other rows
    bf = _bf16(0).dtype
    mlp = GeluMlp.random(hidden, 8, dtype=bf, seed=28)
    mlp = GeluMlp(w_up=mlp.w_up, b_up=mlp.b_up, w_down=mlp.w_down, b_down=b.astype(bf))
    assert (mlp.b_down.astype(np.float32) == b).all()  # exact: the test means these values
    assert np.array_equal(x.astype(bf).astype(np.float32), x, equal_nan=True)
    sums = x + b
    ties = (sums.view(np.uint32) & 0xFFFF) == 0x8000
    assert ties.sum() > rows * hidden // 4  # the rounding is asked, not skirted
    dp = null_factory(ducks=1)
    with duckpipe.connect(dp.control) as c:
        c.load_weights(1, mlp)
        xb = x.astype(bf)
        y = c.forward(1, xb, timeout=5)
    want = null_backend_result(xb, 1, mlp.b_down)
    assert y.dtype == bf
    bad = np.nonzero(y.view(np.uint16) != want.view(np.uint16))
    assert not bad[0].size, [
        (hex(int(sums.view(np.uint32)[r, k])), hex(int(y.view(np.uint16)[r, k])),
         hex(int(want.view(np.uint16)[r, k])))
        for r, k in zip(*bad, strict=True)
    ][:5]  # fmt: skip
    assert y.view(np.uint16)[0, -4] == 0x7F80 and y.view(np.uint16)[0, -3] == 0x7F7F
    assert np.isnan(y.astype(np.float32)[0, -1]) and y.astype(np.float32)[1, -1] == -np.inf
