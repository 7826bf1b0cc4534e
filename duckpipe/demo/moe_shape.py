"""One mixture-of-experts layer shaped like DeepSeek-V3's and served as it is served.

DeepSeek-V3's routed layer (configs/config_671B.json): hidden 7168, 256 routed experts
and one shared expert, SwiGLU, 8 experts per token chosen by DeepSeek-V3's gate (8
groups, 4 kept, sigmoid scores with a selection bias, route scale 2.5:
``duckpipe.moe.Gate.deepseek_v3``). As the published checkpoint holds it: experts in
float8 e4m3 with a float32 scale per 128 x 128 block, the gate in bf16, written once as
a Hugging Face checkpoint folder (moe_checkpoint.py) and read back with
``duckpipe.moe.from_checkpoint``; activations in bf16. The experts are narrowed from
intermediate 2048 to 128 (the shared expert too) so that the layer fits this host's
memory and the emulated ducks' compute: 257 experts x 3 x 7168 x 128 bytes are 0.7 GB of
FP8, which the emulator also holds as float32. What the narrowing keeps is what duckpipe
moves: the activation rows, the routing table and the partials are as wide as V3's.

The layer, the batches, the figures and the report's text: the demo's runner
(:mod:`duckpipe.demo.run`) starts the cluster, loads and times.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ..client.checkpoint import from_checkpoint
from ..client.moe import Gate
from ..progress import Progress
from . import moe_checkpoint

__all__ = [
    "BATCHES",
    "EXPERT_FFN",
    "HIDDEN",
    "N_EXPERTS",
    "REFERENCE_DECODE_TOKENS_PER_S",
    "TOLERANCE",
    "BatchReport",
    "MoeShape",
    "default_placement",
    "format_report",
    "passed",
    "relative_error",
    "routed_ducks",
]

HIDDEN = 7168
N_EXPERTS = 256
TOPK = 8
EXPERT_FFN = 128  # DeepSeek-V3's moe_inter_dim is 2048: narrowed (the module's docstring)
SHARED_FFN = 128
BATCHES = (1, 8, 32)  # tokens per MoE call: decode of one sequence, of 8, of 32
#: The reference cluster (docs/benchmarks.md, its table): the whole DeepSeek-V3 model
#: decoding on 32 real ducks
REFERENCE_DECODE_TOKENS_PER_S = 16.17
#: The largest |ducks - host reference| / largest |host reference| that passes. Both
#: compute in float32 from the same bf16 inputs and FP8 weights dequantized alike; the
#: ducks send their partials in bf16 (relative step 2**-8, each rounded by at most half
#: of it) and the sum of up to 9 partials is stored in bf16 once, where the reference
#: rounds only its sum: a few half-steps of the partials (measured: below 1e-2). A lost or
#: misrouted expert moves the output by a whole partial, several times 2e-2 of its
#: largest value.
TOLERANCE = 2e-2


class MoeShape:
    """``MoeShape(cache=dir, hidden=7168, seed=0)``: the gate and the layer as DeepSeek-V3
    serves them, read by ``duckpipe.moe.from_checkpoint`` from a checkpoint written once
    under ``cache`` (moe_checkpoint.py): FP8 experts with block scales, a bf16 gate;
    activations bf16."""

    def __init__(
        self,
        *,
        cache: Path,
        hidden: int = HIDDEN,
        seed: int = 0,
        say: Callable[[str], None] = lambda s: None,
        progress: bool | None = None,
    ) -> None:
        self.hidden = hidden
        self.dtype = np.dtype(ml_dtypes.bfloat16)
        self.seed = seed
        drawn = Gate.deepseek_v3(hidden, seed=seed)  # what the checkpoint holds, in bf16
        self.folder = moe_checkpoint.cached(
            cache, hidden=hidden, ffn=EXPERT_FFN, shared_ffn=SHARED_FFN, gate=drawn,
            seed=seed, say=say,
            progress=lambda: Progress(N_EXPERTS + 1, "writing the checkpoint (once)",
                                      enabled=progress, unit="experts"),
        )  # fmt: skip
        t0 = time.monotonic()
        layer = from_checkpoint(self.folder, 0, progress=progress)
        assert isinstance(layer, tuple)  # layer 0 is MoE: first_k_dense_replace is 0
        self.gate, self.moe = layer
        say(f"read the layer with from_checkpoint in {time.monotonic() - t0:.1f} s")

    @property
    def weight_bytes(self) -> int:
        """Bytes the ducks hold: FP8 weights and their float32 block scales."""
        mlps = (*self.moe.experts, self.moe.shared)
        arrays = (getattr(m, f.name) for m in mlps if m is not None for f in dataclasses.fields(m))
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))

    def batch(self, tokens: int, call: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Call ``call``'s activation ``x`` ([tokens, hidden], bf16) and its routing by
        the gate on the host: ``(x, indices, weights)``."""
        rng = np.random.default_rng([self.seed, 2, tokens, call])
        x = rng.standard_normal((tokens, self.hidden), np.float32).astype(self.dtype)
        indices, weights = self.gate(x)
        return x, indices, weights


def default_placement(n_experts: int, ducks: Sequence[int]) -> list[int]:
    """The client's default placement: contiguous blocks, expert ``e`` on
    ``ducks[e * len(ducks) // n_experts]`` (256 experts on 32 ducks: 8 each)."""
    return [ducks[e * len(ducks) // n_experts] for e in range(n_experts)]


def routed_ducks(indices: np.ndarray, placement: Sequence[int]) -> np.ndarray:
    """Per token, how many distinct ducks its experts live on (one replica each)."""
    where = np.asarray(placement)[indices]
    return np.array([len(np.unique(row)) for row in where])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|, in float64."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))


@dataclass
class BatchReport:
    """What the demo measured at one batch size (times in µs)."""

    tokens: int
    calls: int
    routed_ducks_per_token: float  # mean distinct routed ducks, from the gate and placement
    #: ducks that computed each token, from their moe_tokens (stats): its routed ducks
    #: and the shared expert's set (the default: one duck), each counted once
    measured_ducks_per_token: float | None
    expert_rows_per_token: float | None  # the ducks' moe_expert_rows / tokens: topk
    ducks_per_call: float  # mean distinct routed ducks a whole call reaches
    wire_bytes_per_token: float | None  # moe_bytes counter delta / tokens
    p50_us: float
    p99_us: float
    host_overhead_p50_us: float
    host_overhead_p99_us: float
    duck_compute_p50_us: float  # the slowest duck's own compute, per call
    max_rel_error: float

    def tokens_per_s(self) -> float:
        """This one layer's throughput at p50: tokens / p50."""
        return self.tokens / (self.p50_us / 1e6) if self.p50_us > 0 else float("nan")


def _opt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def passed(reports: Sequence[BatchReport], tolerance: float) -> bool:
    return bool(reports) and all(r.max_rel_error <= tolerance for r in reports)


def format_report(
    reports: Sequence[BatchReport],
    *,
    ducks: int,
    hidden: int,
    layer_bytes: int,
    tolerance: float = TOLERANCE,
) -> str:
    """The demo's text: one column per batch size, the notes, the reference cluster's
    figure, and the PASS/FAIL line last."""
    per_duck = f"{N_EXPERTS / ducks:g}" if ducks else "-"
    head = (
        f"\nmodel: deepseek-v3-moe-shape: one MoE layer, hidden {hidden}, {N_EXPERTS} routed "
        f"experts (intermediate {EXPERT_FFN}) + 1 shared (intermediate {SHARED_FFN}, on its "
        f"default set of ducks), top-{TOPK} of 8 groups (4 kept), sigmoid + bias, route "
        f"scale 2.5; bf16 activations, FP8 experts (e4m3, 128x128 block scales, read by "
        f"from_checkpoint), {layer_bytes / 1e9:.2f} GB; {ducks} ducks, {per_duck} experts "
        "each (the default placement)"
    )
    rows: list[tuple[str, list[str]]] = [
        ("MoE calls timed", [str(r.calls) for r in reports]),
        ("routed ducks / token", [f"{r.routed_ducks_per_token:.2f}" for r in reports]),
        ("ducks computing / token", [_opt(r.measured_ducks_per_token, ".2f") for r in reports]),
        ("(token, expert) / token", [_opt(r.expert_rows_per_token, ".2f") for r in reports]),
        ("routed ducks / call", [f"{r.ducks_per_call:.1f}" for r in reports]),
        ("wire bytes / token", [_opt(r.wire_bytes_per_token, ",.0f") for r in reports]),
        ("p50 per call (us)", [f"{r.p50_us:.0f}" for r in reports]),
        ("p99 per call (us)", [f"{r.p99_us:.0f}" for r in reports]),
        ("host overhead p50 (us)", [f"{r.host_overhead_p50_us:.0f}" for r in reports]),
        ("host overhead p99 (us)", [f"{r.host_overhead_p99_us:.0f}" for r in reports]),
        ("slowest duck p50 (us)", [f"{r.duck_compute_p50_us:.0f}" for r in reports]),
        ("tokens/s, this layer", [f"{r.tokens_per_s():.0f}" for r in reports]),
        ("max rel. difference", [f"{r.max_rel_error:.1e}" for r in reports]),
        ("check", ["PASS" if r.max_rel_error <= tolerance else "FAIL" for r in reports]),
    ]
    width = 26
    heading = f"  {'tokens per call':<{width}}" + "".join(f"{r.tokens:>12}" for r in reports)
    out = [head, "", heading]
    out += [f"  {name:<{width}}" + "".join(f"{c:>12}" for c in cells) for name, cells in rows]
    out += [
        "",
        "  the shared expert's ducks (its default set, shared_ducks) compute every token: "
        "'routed ducks' counts the routed experts' ducks only, 'ducks computing' both",
        "  wire bytes: the dataplane's moe_bytes counter (activation rows and routing tables "
        "put on the wire, first sends) over the call's tokens",
        "  host overhead: end to end minus the wait for the ducks' partials past the send "
        "(as in the other demos); slowest duck compute: the largest compute time a duck "
        "reported",
        f"  check: largest |ducks - MoeMlp.reference| / largest |reference| <= {tolerance:.0e}",
        "",
        "reference cluster (docs/benchmarks.md; other hardware: real ducks, the whole model "
        f"with its attention and every layer, not this run): DeepSeek-V3 decodes at "
        f"{REFERENCE_DECODE_TOKENS_PER_S} tokens/s, {1e3 / REFERENCE_DECODE_TOKENS_PER_S:.1f} ms "
        "per token for every layer together",
        "",
    ]
    ok = passed(reports, tolerance)
    worst = max((r.max_rel_error for r in reports), default=float("nan"))
    out.append(
        f"{'PASS' if ok else 'FAIL'}: largest relative difference from MoeMlp.reference "
        f"{worst:.2e} {'<=' if ok else '>'} tolerance {tolerance:.0e}"
    )
    return "\n".join(out) + "\n"
