"""Mixture of experts: ``duckpipe.moe.Gate`` (it returns a ``Routing``), ``MoeMlp``,
``check_routing``.

The code lives in :mod:`duckpipe.client.moe`; this is the name models import.
"""

from .client.moe import SCORES, Gate, MoeMlp, Routing, check_routing

__all__ = ["SCORES", "Gate", "MoeMlp", "Routing", "check_routing"]
