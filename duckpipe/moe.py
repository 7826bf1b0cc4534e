"""Mixture of experts: ``duckpipe.moe.Gate`` (it returns a ``Routing``), ``MoeMlp``,
``check_routing``, and ``from_checkpoint`` (a layer of a Hugging Face DeepSeek-V3 checkpoint).

The code lives in :mod:`duckpipe.client.moe`; this is the name models import.
"""

from .client.checkpoint import CheckpointError, from_checkpoint
from .client.moe import SCORES, Gate, MoeMlp, Routing, check_routing

__all__ = [
    "SCORES",
    "CheckpointError",
    "Gate",
    "MoeMlp",
    "Routing",
    "check_routing",
    "from_checkpoint",
]
