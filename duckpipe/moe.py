"""Mixture of experts: ``duckpipe.moe.Gate``, ``duckpipe.moe.MoeMlp``, ``check_routing``.

The code lives in :mod:`duckpipe.client.moe`; this is the name models import.
"""

from .client.moe import SCORES, Gate, MoeMlp, check_routing

__all__ = ["SCORES", "Gate", "MoeMlp", "check_routing"]
