"""A MoE layer's memory in the dataplane beyond its weights counts against its owner's quota.

A MoE layer holds ~34 KiB of placement and bank slots and ~15 KiB of layer state in the
dataplane besides its weights. Counted by no quota (only ``client_max_layers`` bounded
it), a client could hold ~92 MiB a user for nothing (issue 26, point 7). Run against the
mock and the C dataplane.
"""

from __future__ import annotations

import pytest

import duckpipe
from duckpipe import SwiGluMlp
from duckpipe.client import weights
from duckpipe.errors import QuotaExceeded
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.moe import MoeMlp
from duckpipe.schema.abi import MOE_LAYER_STATE_BYTES

HIDDEN, EFFN = 64, 16


def _moe(n_experts: int) -> MoeMlp:
    return MoeMlp.random(n_experts, HIDDEN, EFFN, shared=False, seed=0)


@pytest.fixture(params=["mock", "real"])
def tight_quota(request, duckpipe_cluster_factory):
    """``start(quota)``: a private dataplane (4 ducks) with that client_max_weight_bytes."""
    started: list[MockDataplaneProcess] = []

    def start(quota: int) -> str:
        if request.param == "mock":
            dp = MockDataplaneProcess(ducks=4, args=[f"--client-max-weight-bytes={quota}"])
            started.append(dp.start())
            return dp.control
        return duckpipe_cluster_factory(4, client_max_weight_bytes=quota).control

    yield start
    for dp in started:
        dp.__exit__(None, None, None)


def test_a_moe_layers_placement_and_state_count_against_the_weight_quota(tight_quota):
    """A MoE layer holds ~34 KiB of placement and ~15 KiB of layer state in the dataplane
    besides its weights, once counted by no quota: a client could hold client_max_layers
    of them for nothing. They count as MOE_LAYER_STATE_BYTES of its weight bytes: a quota
    that covers the weights and not that is refused, saying so."""
    moe = _moe(4)
    plan = weights.moe_layer(0, moe, range(4))
    weight_bytes = sum(3 * HIDDEN * w * 4 for w in plan.bank_sizes)  # gate, up, down: f32
    control = tight_quota(weight_bytes + MOE_LAYER_STATE_BYTES - 1)
    with duckpipe.connect(control) as c:
        with pytest.raises(QuotaExceeded, match="MoE placement and state") as e:
            c.load_weights(7, moe, ducks=list(range(4)))
        assert f"{MOE_LAYER_STATE_BYTES} of MoE placement and state" in str(e.value)
        assert f"({weight_bytes + MOE_LAYER_STATE_BYTES} bytes" in str(e.value)
        # the quota covers the weights alone: a dense layer of as many bytes loads
        dense = SwiGluMlp.random(HIDDEN, sum(plan.bank_sizes), seed=1)
        c.load_weights(8, dense, ducks=list(plan.ducks))
        assert c.stats().counters["quota_refused"] == 1
