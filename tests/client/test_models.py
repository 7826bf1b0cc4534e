"""The MLP kinds: numerics, sharding, and partials that sum to the whole layer."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from duckpipe import GeluMlp, SwiGluMlp
from duckpipe.client.models import duck_partial, erf, gelu, shard_bounds, shard_sizes
from duckpipe.errors import BadInput


def test_erf_matches_the_standard_library_to_float32_resolution():
    x = np.linspace(-7, 7, 20001)
    want = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - want).max() < 2e-7


def test_gelu_is_the_exact_erf_form():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(gelu(x), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ffn,n", [(96, 1), (96, 4), (96, 24), (1536, 7), (10, 10)])
def test_shards_cover_the_ffn_evenly(ffn, n):
    sizes = shard_sizes(ffn, n)
    assert sum(sizes) == ffn and len(sizes) == n and max(sizes) - min(sizes) <= 1
    bounds = shard_bounds(sizes)
    assert bounds[0][0] == 0 and bounds[-1][1] == ffn
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_more_ducks_than_columns_is_refused():
    with pytest.raises(BadInput, match="cannot shard"):
        shard_sizes(3, 4)


@pytest.mark.parametrize("cls", [GeluMlp, SwiGluMlp])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_partials_of_all_shards_sum_to_the_reference(cls, n):
    mlp = cls.random(24, 40, seed=n)
    x = np.random.default_rng(n).standard_normal((5, 24)).astype(np.float32)
    total = sum(
        duck_partial(mlp.kind, x, list(mlp.shard(lo, hi)))
        for lo, hi in shard_bounds(shard_sizes(40, n))
    )
    if mlp.b_down is not None:
        total = total + mlp.b_down
    np.testing.assert_allclose(total, mlp.reference(x), rtol=1e-5, atol=1e-6)


def test_a_transposed_w_up_is_blamed_on_w_up_not_its_bias():
    g = GeluMlp.random(16, 64)
    with pytest.raises(BadInput, match=r"GeluMlp\.w_up has shape \(64, 16\), expected \(16, 64\)"):
        GeluMlp(w_up=g.w_up.T.copy(), b_up=g.b_up, w_down=g.w_down, b_down=g.b_down)
    with pytest.raises(BadInput, match=r"GeluMlp\.w_down .*transposed"):
        GeluMlp(w_up=g.w_up, b_up=g.b_up, w_down=g.w_down.T.copy(), b_down=g.b_down)
    with pytest.raises(BadInput, match=r"GeluMlp\.b_up has shape \(63,\)"):
        GeluMlp(w_up=g.w_up, b_up=g.b_up[:63], w_down=g.w_down, b_down=g.b_down)
    s = SwiGluMlp.random(16, 64)
    with pytest.raises(BadInput, match=r"SwiGluMlp\.w_up has shape \(64, 16\)"):
        SwiGluMlp(w_gate=s.w_gate, w_up=s.w_up.T.copy(), w_down=s.w_down)
    with pytest.raises(BadInput, match=r"SwiGluMlp\.w_gate has shape \(64, 16\)"):
        SwiGluMlp(w_gate=s.w_gate.T.copy(), w_up=s.w_up, w_down=s.w_down)


def test_a_layers_info_and_a_forwards_status_print_their_enums_by_name(client):
    from duckpipe.schema.abi import DType, MlpKind

    info = client.load_weights(11, SwiGluMlp.random(8, 16, dtype=np.float16), ducks=[0, 1])
    assert "kind=MlpKind.SWIGLU" in repr(info) and "dtype=DType.F16" in repr(info), repr(info)
    assert info.kind == MlpKind.SWIGLU and info.dtype == 2  # still the wire's numbers
    with client.claim((2, 8), np.float16) as slot:
        slot.array[:] = 1.0
        fwd = client.submit(slot, 11)
    fwd.result(timeout=10)
    assert (str(fwd.status), f"{fwd.status}", f"{fwd.status:d}") == ("Status.OK", "Status.OK", "1")
    assert str(MlpKind.MOE) == "MlpKind.MOE" and f"{DType.F32:>9}" == "DType.F32"
