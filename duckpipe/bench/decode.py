"""``duckpipe bench decode``: a DeepSeek-V3-shaped decode step through N layers (issue 29).

One C dataplane (socket backend) and echo ducks (``duckpipe-ducks --compute echo``:
each duck returns its rows times ``id + 1``, weighted as its experts' partials would be)
on CPU 1. The model: hidden 7168, ``--layers`` layers (default 4), the first dense, the
rest mixture-of-experts (DeepSeek-V3's has 3 dense then 58 MoE: ``--layers 61``), bf16
activations. Per layer and batch, the host's part then the layer through the ducks:

1. a modeled attention: the host spins ``--attn-us`` microseconds (default 50): a fixed
   time, not a computation; then an RMSNorm of the residual stream (numpy, float32);
2. on a MoE layer DeepSeek-V3's gate (``Gate.deepseek_v3``: 256 experts, 8 groups, 4
   kept, top 8, sigmoid + bias) on the normalised rows;
3. the layer through duckpipe: claim, fill (bf16), submit (with the routing), result;
   the result added into the residual stream (float32).

The ducks' time: the echo's, plus ``--duck-us`` (default 100, about the reference
cluster's duck forward) held on every reply by the emulator's ``--delay-us``: a fixed
modeled compute per duck and forward, the same for 1 row or 64 (the emulator has no
per-row model). Every MoE layer is the same loaded layer (256 experts of one column and
a shared one on its default set, the default placement): echo ducks compute no weights,
so N layers cost the ducks' memory one, and the host and the wire what N would.

Two ways through a step: one micro-batch (the batch's tokens layer by layer: the ducks
wait for the host, the host for the ducks) and two micro-batches of half the batch each
in flight (at each layer, one's forward is submitted, then the other's result is taken
and its host part done and submitted, then the first's result: the host computes one
while the ducks compute the other). Reported: tokens per second (batch over a step's
p50), a step's and a layer's time, and per layer the model's host work, the time
blocked in ``result()``, the dataplane's wait for the ducks, and duckpipe's host
overhead (a layer's time less the model's host work and the time blocked in result).
The reference cluster's published figures are printed beside them, for scale.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from ..launch.cluster import Cluster
from .common import DUCKS_CPU, Progress, Size, Table, pin

__all__ = ["COLUMNS", "Config", "StepTimes", "config", "run", "summarise"]

LAYER_DENSE, LAYER_MOE = 1, 2
N_EXPERTS = 256
#: The reference cluster (docs/benchmarks.md, forward's third table; other hardware): Qwen3
#: 0.6B on 24 real ducks, and DeepSeek-V3 decoding on 32
REFERENCE_DUCK_FORWARD_US = (109, 112)
REFERENCE_END_TO_END_US = 546
REFERENCE_V3_TOKENS_PER_S = 16.17

COLUMNS = [
    ("config", "config"),
    ("batch", "batch"),
    ("micro_batches", "micro-batches"),
    ("tokens_per_s", "tokens / s"),
    ("step_p50_us", "step p50 µs"),
    ("step_p99_us", "step p99 µs"),
    ("layer_us", "layer µs"),
    ("model_host_us", "model's host work / layer µs"),
    ("blocked_us", "blocked in result / layer µs"),
    ("wait_us", "dataplane wait / forward µs"),
    ("echo_us", "Σ ducks' echo / forward µs"),
    ("overhead_us", "duckpipe host overhead / layer µs"),
    ("vs_one", "tokens/s vs one micro-batch"),
]


@dataclasses.dataclass(frozen=True)
class Config:
    ducks: int
    hidden: int
    layers: int
    batches: tuple[int, ...]
    steps: int
    warmup: int
    duck_us: int
    attn_us: int

    @property
    def label(self) -> str:
        return (
            f"{self.layers} layers (1 dense), hidden {self.hidden}, {self.ducks} echo ducks "
            f"+{self.duck_us} µs, attention {self.attn_us} µs"
        )


def config(
    size: Size, *, layers: int | None = None, duck_us: int | None = None,
    attn_us: int | None = None,
) -> Config:  # fmt: skip
    """Full: batches 1-64 on 32 ducks; quick: 1 and 8 on 8 ducks, seconds; smoke: one
    batch of 2 through 2 narrow layers on 4 ducks (the test's and CI's size)."""
    return Config(
        ducks=size.pick(32, 8, 4),  # type: ignore[arg-type]
        hidden=size.pick(7168, 7168, 256),  # type: ignore[arg-type]
        layers=layers or size.pick(4, 4, 2),  # type: ignore[arg-type]
        batches=size.pick((1, 8, 32, 64), (1, 8), (2,)),  # type: ignore[arg-type]
        steps=size.pick(30, 10, 3),  # type: ignore[arg-type]
        warmup=size.pick(3, 2, 1),  # type: ignore[arg-type]
        duck_us=100 if duck_us is None else duck_us,
        attn_us=50 if attn_us is None else attn_us,
    )


@dataclasses.dataclass
class StepTimes:
    """One way through the steps of one batch: per step its wall time, and summed over
    its layers the model's host work and the time blocked in ``result()``; per forward
    the dataplane's wait phase."""

    step_ns: list[int] = dataclasses.field(default_factory=list)
    model_ns: list[int] = dataclasses.field(default_factory=list)
    blocked_ns: list[int] = dataclasses.field(default_factory=list)
    wait_ns: list[int] = dataclasses.field(default_factory=list)
    echo_ns: list[int] = dataclasses.field(default_factory=list)  # ducks' compute, summed


def summarise(cfg: Config, batch: int, micro: int, t: StepTimes) -> dict[str, object]:
    """One row: medians over the steps, per layer where it says so."""
    step = statistics.median(t.step_ns) / 1e3
    layer = step / cfg.layers
    model = statistics.median(t.model_ns) / 1e3 / cfg.layers
    blocked = statistics.median(t.blocked_ns) / 1e3 / cfg.layers
    return {
        "config": cfg.label,
        "batch": batch,
        "micro_batches": micro,
        "steps": len(t.step_ns),
        "tokens_per_s": batch / (step / 1e6),
        "step_p50_us": step,
        "step_p99_us": float(np.percentile(np.asarray(t.step_ns) / 1e3, 99)),
        "layer_us": layer,
        "model_host_us": model,
        "blocked_us": blocked,
        "wait_us": statistics.median(t.wait_ns) / 1e3 if t.wait_ns else 0.0,
        "echo_us": statistics.median(t.echo_ns) / 1e3 if t.echo_ns else 0.0,
        "overhead_us": layer - model - blocked,
    }


def ratios(rows: list[dict[str, object]]) -> None:
    """Each row's tokens per second over the one-micro-batch row of its batch."""
    one = {r["batch"]: r for r in rows if r["micro_batches"] == 1}
    for r in rows:
        base = one.get(r["batch"])
        r["vs_one"] = (
            float(r["tokens_per_s"]) / float(base["tokens_per_s"])  # type: ignore[arg-type]
            if base else float("nan")
        )  # fmt: skip


def _spin(us: int) -> None:
    """The modeled attention: the host busy for ``us`` microseconds, as a kernel would be."""
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)


class _Model:
    """The host's side of the decode: the residual streams, the gate, the layers' ids."""

    def __init__(self, client, cfg: Config, gate, dtype) -> None:
        self.client, self.cfg, self.gate, self.dtype = client, cfg, gate, dtype

    def host_part(self, x: np.ndarray, layer: int):
        """Attention (modeled), the norm and, on a MoE layer, the gate: what is sent."""
        _spin(self.cfg.attn_us)
        h = _rms_norm(x)
        return h.astype(self.dtype), (None if layer == 0 else self.gate(h))

    def submit(self, h: np.ndarray, layer: int, routing):
        with self.client.claim(h.shape, h.dtype) as slot:
            slot.array[:] = h
            if routing is None:
                return self.client.submit(slot, LAYER_DENSE)
            return self.client.submit(slot, LAYER_MOE, routing=routing)

    def finish(self, fwd, x: np.ndarray, t: StepTimes, acc: list[int]) -> None:
        """Wait for ``fwd`` (counted as blocked), add its result into ``x`` (model work)."""
        with fwd:
            t0 = time.perf_counter_ns()
            y = fwd.result(timeout=30)
            t1 = time.perf_counter_ns()
            phases = fwd.phases
            t.wait_ns.append(phases.wait_ns)
            t.echo_ns.append(phases.duck_compute_sum_ns)
            t2 = time.perf_counter_ns()
            x += y
        acc[0] += t1 - t0
        acc[1] += time.perf_counter_ns() - t2


def _step_one(m: _Model, x: np.ndarray, t: StepTimes) -> None:
    """One micro-batch: each layer's host part, then its forward, then the next."""
    acc = [0, 0]  # blocked, model's host work
    for layer in range(m.cfg.layers):
        t0 = time.perf_counter_ns()
        h, routing = m.host_part(x, layer)
        acc[1] += time.perf_counter_ns() - t0
        m.finish(m.submit(h, layer, routing), x, t, acc)
    t.blocked_ns.append(acc[0])
    t.model_ns.append(acc[1])


def _step_two(m: _Model, xs: list[np.ndarray], t: StepTimes) -> None:
    """Two micro-batches in flight: at each layer, for each in turn, take its previous
    layer's result, do its host part and submit it; the other's forward is at the ducks
    meanwhile."""
    acc = [0, 0]
    pending: list[object] = [None, None]
    for layer in range(m.cfg.layers):
        for i, x in enumerate(xs):
            if pending[i] is not None:
                m.finish(pending[i], x, t, acc)
            t0 = time.perf_counter_ns()
            h, routing = m.host_part(x, layer)
            acc[1] += time.perf_counter_ns() - t0
            pending[i] = m.submit(h, layer, routing)
    for i, x in enumerate(xs):
        m.finish(pending[i], x, t, acc)
    t.blocked_ns.append(acc[0])
    t.model_ns.append(acc[1])


def _measure(m: _Model, batch: int, micro: int, rng) -> StepTimes:
    cfg = m.cfg
    xs = [rng.standard_normal((batch // micro, cfg.hidden), np.float32) for _ in range(micro)]
    t = StepTimes()
    for s in range(cfg.warmup + cfg.steps):
        this = StepTimes() if s < cfg.warmup else t
        t0 = time.perf_counter_ns()
        if micro == 1:
            _step_one(m, xs[0], this)
        else:
            _step_two(m, xs, this)
        this.step_ns.append(time.perf_counter_ns() - t0)
        for x in xs:  # the next token's rows: bounded, whatever the echo made of these
            x[:] = _rms_norm(x)
    return t


def run(
    size: Size, *, quiet: bool = False, layers: int | None = None,
    duck_us: int | None = None, attn_us: int | None = None,
) -> list[Table]:  # fmt: skip
    import duckpipe

    from ..client.models import BFLOAT16, SwiGluMlp
    from ..client.moe import Gate, MoeMlp
    from ..demo.moe_shape import default_placement

    cfg = config(size, layers=layers, duck_us=duck_us, attn_us=attn_us)
    ways = [(b, 1) for b in cfg.batches] + [(b, 2) for b in cfg.batches if b >= 2]
    prog = Progress("decode", 1 + len(ways), quiet=quiet)
    table = Table(key="decode", title="decode: a DeepSeek-V3-shaped decode step through the "
                  "ducks, one and two micro-batches in flight", columns=COLUMNS)  # fmt: skip
    ducks = list(range(cfg.ducks))
    moe = MoeMlp.random(N_EXPERTS, cfg.hidden, 1, shared=True, dtype=BFLOAT16, seed=1)
    dense = SwiGluMlp.random(cfg.hidden, cfg.ducks, BFLOAT16, 2)  # a column a duck
    gate = Gate.deepseek_v3(cfg.hidden, seed=2)
    biggest = max(cfg.batches) * cfg.hidden * 2 + 16 + 8 * max(cfg.batches) * 8
    slot_size = 1 << max(20, (biggest + 4095).bit_length())
    args = ["--compute", "echo"] + (["--delay-us", str(cfg.duck_us)] if cfg.duck_us else [])
    rows = []
    with Cluster(cfg.ducks, duck_args=args, default_timeout_ms=10_000) as cl:
        for em in cl.emulators:
            pin(em.pid, DUCKS_CPU)
        prog.step(f"{cfg.label}: loading a dense and a MoE layer")
        with duckpipe.connect(cl.control, name="bench-decode", slots=8,
                              slot_size=slot_size) as client:  # fmt: skip
            client.load_weights(LAYER_DENSE, dense, ducks=ducks, progress=False)
            placement = default_placement(N_EXPERTS, ducks)
            client.load_weights(LAYER_MOE, moe, placement=placement, progress=False)
            model = _Model(client, cfg, gate, BFLOAT16)
            rng = np.random.default_rng(3)
            for batch, micro in ways:
                prog.step(f"batch {batch}, {micro} micro-batch(es), {cfg.steps} steps")
                rows.append(summarise(cfg, batch, micro, _measure(model, batch, micro, rng)))
    ratios(rows)
    table.rows = sorted(rows, key=lambda r: (r["batch"], r["micro_batches"]))
    lo, hi = REFERENCE_DUCK_FORWARD_US
    table.notes += [
        "A layer: attention modeled as the host busy for the stated µs (not computed), an "
        "RMSNorm (numpy), on MoE layers DeepSeek-V3's gate (Gate.deepseek_v3, float32), "
        "then claim, fill (bf16), submit, result and the residual add. Layer 1 is dense "
        "(a SwiGLU sharded over every duck), the rest MoE (256 experts top-8 and a shared "
        "one, the default placement): every MoE layer is one loaded layer forwarded again.",
        f"Ducks: duckpipe-ducks --compute echo, every reply held {cfg.duck_us} µs "
        "(--delay-us): a fixed modeled compute per duck and forward, whatever its rows; "
        "the emulated ducks share CPU 1, the client and the dataplane CPU 0.",
        "Two micro-batches: the batch's tokens as two halves, each layer of one submitted "
        "while the other's result is taken and its host part done. tokens / s: the batch "
        "over a step's p50 (all layers).",
        "model's host work: attention, norm, gate, residual add; blocked in result: time in "
        "Forward.result(); dataplane wait: its wait phase (first send to last partial in), "
        "p50 per forward; duckpipe host overhead: a layer's time less those two (claim, "
        "fill, submit, the result's read). Σ ducks' echo: the compute times the ducks "
        "reported (the echo itself, before the --delay-us hold), added up, p50 per forward: "
        "the emulator's one thread echoes its ducks one after another, so where the wait "
        "follows this sum rather than --duck-us, the emulator is the ducks' bottleneck.",
        f"For scale (other hardware, real ducks, not this run): the reference cluster's "
        f"Qwen3 0.6B at 24 ducks: duck forward {lo}-{hi} µs, end to end "
        f"{REFERENCE_END_TO_END_US} µs per MLP call; DeepSeek-V3 on 32 ducks: "
        f"{REFERENCE_V3_TOKENS_PER_S} tokens/s.",
    ]
    return [table]
