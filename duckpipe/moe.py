"""Mixture of experts: ``duckpipe.moe.Gate`` (it returns a ``Routing``), ``MoeMlp``,
``check_routing``, ``from_checkpoint`` (a layer of a Hugging Face DeepSeek-V3 checkpoint),
and ``plan_placement`` (a placement from observed expert load: DeepSeek's EPLB).

The code lives in :mod:`duckpipe.client.moe` and :mod:`duckpipe.client.eplb`; this is the
name models import.
"""

from .client.checkpoint import CheckpointError, from_checkpoint
from .client.eplb import Plan, plan_placement, rebalance_experts
from .client.moe import SCORES, Gate, MoeMlp, Routing, check_routing

__all__ = [
    "SCORES",
    "CheckpointError",
    "Gate",
    "MoeMlp",
    "Plan",
    "Routing",
    "check_routing",
    "from_checkpoint",
    "plan_placement",
    "rebalance_experts",
]
