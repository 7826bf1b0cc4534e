"""A model shaped like the reference system's 0.6B experiment, with seeded random weights.

Qwen3-0.6B's MLP dimensions (hidden 1024, intermediate 3072, SwiGLU, 28 layers),
decoding one token at a time: each layer is ``x = x + mlp(rms_norm(x))``. Attention
is left out: the MLPs are what the ducks compute, and what the reference numbers
(duck compute ~110 µs, host end to end ~546 µs per MLP call at 24 ducks) measure.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..client.models import SwiGluMlp

__all__ = ["HIDDEN", "INTERMEDIATE", "LAYERS", "QwenShape"]

HIDDEN = 1024
INTERMEDIATE = 3072
LAYERS = 28
RMS_EPS = 1e-6

Mlp = Callable[[int, np.ndarray], np.ndarray]


class QwenShape:
    """``QwenShape(layers=28, seed=0)``: random SwiGLU MLPs and RMSNorm gains."""

    def __init__(self, *, layers: int = LAYERS, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.layers = layers
        self.hidden = HIDDEN
        self.mlps = [
            SwiGluMlp.random(HIDDEN, INTERMEDIATE, seed=seed * 1000 + i) for i in range(layers)
        ]
        self.norms = [
            (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32) for _ in range(layers)
        ]
        self.embedding = (rng.standard_normal((256, HIDDEN)) * 0.5).astype(np.float32)

    @staticmethod
    def rms_norm(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * gain).astype(
            np.float32
        )

    def decode(self, tokens: list[int], mlp: Mlp | None = None) -> np.ndarray:
        """Run each token through every layer, one token at a time; returns [n, hidden]."""
        mlp = mlp or (lambda i, h: self.mlps[i].reference(h))
        out = np.empty((len(tokens), self.hidden), np.float32)
        for t, token in enumerate(tokens):
            x = self.embedding[token % len(self.embedding)][None, :].copy()
            for i in range(self.layers):
                x = x + mlp(i, self.rms_norm(x, self.norms[i]))
            out[t] = x[0]
        return out
