"""DeepSeek-V3's MoE in numpy, token by token, for the tests to judge duckpipe against.

Written from the official inference code's ``MoE.forward`` (each token's routed experts'
outputs times their weights, plus ``shared_experts(x)``) with DeepEP's rule that a ``-1``
slot contributes nothing, whatever its weight. It reads duckpipe's ``SwiGluMlp`` weights
(``x @ w`` layout) but none of duckpipe's own reference code. float32.
"""

from __future__ import annotations

import numpy as np


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def swiglu(mlp, row: np.ndarray) -> np.ndarray:
    """One SwiGLU expert on a row (or rows): ``(silu(x w_gate) * (x w_up)) w_down``."""
    g = row @ mlp.w_gate.astype(np.float32)
    u = row @ mlp.w_up.astype(np.float32)
    return (silu(g) * u) @ mlp.w_down.astype(np.float32)


def moe(layer, x: np.ndarray, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``layer`` (a MoeMlp) on ``x`` routed by ``idx``/``w`` ([tokens, topk] each)."""
    xf = x.astype(np.float32)
    y = np.zeros_like(xf)
    for t in range(xf.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if e == -1:
                continue
            y[t] += swiglu(layer.experts[e], xf[t]) * np.float32(w[t, k])
        if layer.shared is not None:
            y[t] += swiglu(layer.shared, xf[t])
    return y
