"""``duckpipe bench moe``: a routed layer three ways on one cluster (issue 16).

One C dataplane (socket backend) and emulated ducks computing for real, on CPU 1. The
layer: DeepSeek-V3's routing (256 experts, 8 per token by ``Gate.deepseek_v3``: 8 groups,
4 kept, sigmoid + bias) with narrow experts and no shared expert (the second table has
one), float16, the default placement. At
each batch size, the same seeded activations go through:

- ``broadcast``: ``moe_send="broadcast"``, the activation and the routing table sent once
  per NIC with a target set; ducks not named skip it;
- ``unicast``: ``moe_send="unicast"``, each routed duck gets its own rows and table;
- ``dense``: the same banks (each duck's experts' columns, in the order the MoE load
  puts them) loaded as one dense SwiGLU layer and forwarded without routing: every duck
  computes every token over its whole bank: the baseline.

Per mode: p50/p99 end to end, bytes per call from the dataplane's counters (``tx_bytes``
for every mode, ``moe_bytes`` for the routed ones), the ducks' compute per call from the
completion's timings (summed over the ducks, and the slowest), and ratios to the dense
baseline. Every first timed result is checked against the host reference.

A second table, ``moe_shared``: the same experts plus a shared expert (DeepSeek-V3's one,
as wide as an expert), send mode auto, the shared expert on its default set (as few
ducks as the bank limit needs, one per NIC: one duck here) and, for comparison, on every
duck (what duckpipe did before ``shared_ducks``). Its bytes per token on the wire (the
``moe_bytes`` counter: activation rows and routing tables of first sends, over calls x
tokens) against the minimum: per token, one row (hidden x dtype bytes) to each duck that
needs it, its routed ducks and the shared set counted once each,
``|routed_ducks(t) U shared_ducks| x row_bytes``, averaged over the same tokens.

Then ``moe_placement`` (:mod:`.moe_placement`): rows per duck on a Zipf-skewed token
stream, the default placement against ``plan_placement``'s, without a cluster.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..launch.cluster import Cluster
from .common import DUCKS_CPU, Progress, Size, Table, percentiles_us, pin

__all__ = ["COLUMNS", "MODES", "Config", "config", "ratios", "run", "summarise"]

MODES = ("broadcast", "unicast", "dense")
LAYER_MOE, LAYER_DENSE, LAYER_SHARED, LAYER_SHARED_EVERY = 1, 2, 3, 4
N_EXPERTS = 256

COLUMNS = [
    ("config", "config"),
    ("tokens", "tokens"),
    ("mode", "mode"),
    ("p50_us", "p50 µs"),
    ("p99_us", "p99 µs"),
    ("tx_bytes_per_call", "tx bytes / call"),
    ("moe_bytes_per_call", "MoE wire bytes / call"),
    ("duck_compute_sum_p50_us", "Σ duck compute p50 µs"),
    ("duck_compute_max_p50_us", "slowest duck p50 µs"),
    ("ducks_per_call", "ducks answering / call"),
    ("p50_vs_dense", "p50 / dense"),
    ("bytes_vs_dense", "tx bytes / dense"),
    ("compute_vs_dense", "Σ compute / dense"),
    ("max_rel_diff", "rel. diff"),
]


SHARED_COLUMNS = [
    ("config", "config"),
    ("tokens", "tokens"),
    ("shared_set", "shared expert on"),
    ("mode", "mode"),
    ("p50_us", "p50 µs"),
    ("moe_bytes_per_token", "MoE wire bytes / token"),
    ("min_bytes_per_token", "minimum / token"),
    ("bytes_vs_min", "wire / minimum"),
    ("ducks_per_call", "ducks answering / call"),
    ("max_rel_diff", "rel. diff"),
]


@dataclasses.dataclass(frozen=True)
class Config:
    ducks: int
    hidden: int
    expert_ffn: int
    tokens: tuple[int, ...]
    iters: int
    warmup: int
    shared_tokens: tuple[int, ...] = (1, 8, 32, 64)  # the shared-expert table's batches

    @property
    def label(self) -> str:
        return f"{self.ducks} ducks, hidden {self.hidden}, {N_EXPERTS} experts x {self.expert_ffn}"


def config(size: Size) -> Config:
    """Full: batches 1, 8, 32; quick: one batch of 8, under ~20 s; smoke: seconds."""
    return Config(
        ducks=size.pick(32, 16, 4),  # type: ignore[arg-type]
        hidden=size.pick(2048, 1024, 256),  # type: ignore[arg-type]
        expert_ffn=size.pick(32, 16, 8),  # type: ignore[arg-type]
        tokens=size.pick((1, 8, 32), (8,), (8,)),  # type: ignore[arg-type]
        iters=size.pick(40, 30, 3),  # type: ignore[arg-type]
        warmup=size.pick(4, 3, 1),  # type: ignore[arg-type]
        shared_tokens=size.pick((1, 8, 32, 64), (1, 64), (8,)),  # type: ignore[arg-type]
    )


def minimum_bytes(
    indices: np.ndarray, placement: list[int], shared_ducks: list[int], row_bytes: int
) -> int:
    """The fewest activation bytes a routed forward can put on the wire without a
    broadcast: each token's row once to each duck that needs it, its routed ducks
    (``placement[e]``: expert e's duck; -1 slots need none) and the shared set."""
    shared = set(shared_ducks)
    need = sum(len({placement[e] for e in row if e >= 0} | shared) for row in indices.tolist())
    return need * row_bytes


def summarise_shared(
    cfg: Config, tokens: int, label: str, s: Samples, min_bytes: int
) -> dict[str, object]:
    """One row of the shared-expert table: wire bytes per token against the minimum."""
    row = summarise(cfg, tokens, "auto", s)
    per = max(1, len(s.e2e_ns)) * tokens
    wire, least = s.counters.get("moe_bytes", 0) / per, min_bytes / per
    return {
        **row,
        "shared_set": label,
        "moe_bytes_per_token": wire,
        "min_bytes_per_token": least,
        "bytes_vs_min": wire / least if least else float("nan"),
    }


@dataclasses.dataclass
class Samples:
    """One mode at one batch size: per call, end to end and the ducks' compute times."""

    e2e_ns: list[int] = dataclasses.field(default_factory=list)
    compute_ns: list[list[int]] = dataclasses.field(default_factory=list)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)  # deltas over the run
    max_rel_diff: float = float("nan")


def summarise(cfg: Config, tokens: int, mode: str, s: Samples) -> dict[str, object]:
    """One row of the table (ratios to the dense baseline are added by :func:`ratios`)."""
    n = max(1, len(s.e2e_ns))
    p50, p99 = percentiles_us(s.e2e_ns)
    sums = [sum(c) for c in s.compute_ns]
    maxes = [max(c, default=0) for c in s.compute_ns]
    return {
        "config": cfg.label,
        "ducks": cfg.ducks,
        "hidden": cfg.hidden,
        "tokens": tokens,
        "mode": mode,
        "calls": len(s.e2e_ns),
        "p50_us": p50,
        "p99_us": p99,
        "tx_bytes_per_call": s.counters.get("tx_bytes", 0) / n,
        "moe_bytes_per_call": s.counters.get("moe_bytes", 0) / n,
        "duck_compute_sum_p50_us": percentiles_us(sums)[0],
        "duck_compute_max_p50_us": percentiles_us(maxes)[0],
        "ducks_per_call": float(np.mean([len(c) for c in s.compute_ns])) if s.compute_ns else 0.0,
        "max_rel_diff": s.max_rel_diff,
        **{f"{k}_per_call": v / n for k, v in s.counters.items() if k not in ("tx_bytes",)},
    }


def ratios(rows: list[dict[str, object]]) -> None:
    """Each row's p50, tx bytes and Σ compute over the dense row's of its batch size."""

    def over(a: object, b: object) -> float:
        return float(a) / float(b) if b else float("nan")  # type: ignore[arg-type]

    dense = {r["tokens"]: r for r in rows if r["mode"] == "dense"}
    for r in rows:
        d = dense.get(r["tokens"])
        if d is None:
            r["p50_vs_dense"] = r["bytes_vs_dense"] = r["compute_vs_dense"] = float("nan")
            continue
        r["p50_vs_dense"] = over(r["p50_us"], d["p50_us"])
        r["bytes_vs_dense"] = over(r["tx_bytes_per_call"], d["tx_bytes_per_call"])
        r["compute_vs_dense"] = over(r["duck_compute_sum_p50_us"], d["duck_compute_sum_p50_us"])


def _banks_as_dense(moe, placement: list[int], ducks: list[int]):
    """One SwiGLU layer whose columns are every duck's bank in duck order (its experts
    ascending): sharded evenly over ``ducks``, each duck holds its MoE bank again."""
    from ..client.models import SwiGluMlp

    order = [e for d in ducks for e in range(moe.n_experts) if placement[e] == d]
    experts = [moe.experts[e] for e in order]
    return SwiGluMlp(
        w_gate=np.concatenate([m.w_gate for m in experts], axis=1),
        w_up=np.concatenate([m.w_up for m in experts], axis=1),
        w_down=np.concatenate([m.w_down for m in experts], axis=0),
    )


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))


COUNTERS = ("tx_bytes", "tx_packets", "moe_bytes", "moe_broadcasts", "moe_unicasts",
            "nacks_sent", "timeouts")  # fmt: skip


def _measure(client, mode: str, batches, moe, dense, layer: int = LAYER_MOE) -> Samples:
    """Warm-up batches first, then the timed ones; counters differenced over the timed."""
    import duckpipe

    warm, timed = batches
    out = Samples()

    def call(x, indices, weights):
        t0 = time.perf_counter_ns()
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            if mode == "dense":
                fwd = client.submit(slot, LAYER_DENSE)
            else:
                fwd = client.submit(slot, layer, routing=(indices, weights), moe_send=mode)
        with fwd:
            y = fwd.result(timeout=30).copy()
            return y, time.perf_counter_ns() - t0, list(fwd.timings.duck_compute_ns)

    for b in warm:
        call(*b)
    c0 = client.stats().counters
    first = None
    for b in timed:
        try:
            y, e2e, comp = call(*b)
        except duckpipe.errors.DuckpipeError as e:
            raise duckpipe.errors.DuckpipeError(f"bench moe, {mode}: {e}") from e
        out.e2e_ns.append(e2e)
        out.compute_ns.append(comp)
        if first is None:
            first = y
    c1 = client.stats().counters
    out.counters = {k: c1.get(k, 0) - c0.get(k, 0) for k in COUNTERS}
    x, indices, weights = timed[0]
    want = dense.reference(x) if mode == "dense" else moe.reference(x, indices, weights)
    out.max_rel_diff = _relative(first, want)
    return out


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    import duckpipe
    from duckpipe.moe import Gate, MoeMlp

    from ..demo.moe_shape import default_placement

    cfg = config(size)
    prog = Progress(
        "moe", 2 + len(cfg.tokens) * len(MODES) + 2 * len(cfg.shared_tokens), quiet=quiet
    )
    table = Table(key="moe", title="moe: one routed layer three ways, same cluster",
                  columns=COLUMNS)  # fmt: skip
    prog.step(f"{cfg.label}: making the layer and the batches")
    moe = MoeMlp.random(N_EXPERTS, cfg.hidden, cfg.expert_ffn, shared=False,
                        dtype=np.float16, seed=1)  # fmt: skip
    gate = Gate.deepseek_v3(cfg.hidden, seed=2)
    ducks = list(range(cfg.ducks))
    placement = default_placement(N_EXPERTS, ducks)
    dense = _banks_as_dense(moe, placement, ducks)
    rng = np.random.default_rng(3)

    def batch(tokens: int):
        x = rng.standard_normal((tokens, cfg.hidden), np.float32).astype(np.float16)
        indices, weights = gate(x)
        return x, indices, weights

    batches = {
        t: ([batch(t) for _ in range(cfg.warmup)], [batch(t) for _ in range(cfg.iters)])
        for t in sorted(set(cfg.tokens) | set(cfg.shared_tokens))
    }
    with_shared = MoeMlp.random(N_EXPERTS, cfg.hidden, cfg.expert_ffn, shared=True,
                                dtype=np.float16, seed=1)  # fmt: skip
    every = MoeMlp(experts=with_shared.experts, shared=with_shared.shared, shared_ducks=ducks)
    shared_table = Table(
        key="moe_shared",
        title="moe_shared: wire bytes per token with a shared expert, against the minimum",
        columns=SHARED_COLUMNS,
    )
    with Cluster(cfg.ducks, default_timeout_ms=10_000) as cl:
        for em in cl.emulators:
            pin(em.pid, DUCKS_CPU)
        prog.step(f"{cfg.label}: loading the MoE layer and its banks as a dense one")
        with duckpipe.connect(cl.control, name="bench-moe") as client:
            client.load_weights(LAYER_MOE, moe, placement=placement, progress=False)
            client.load_weights(LAYER_DENSE, dense, ducks=ducks, progress=False)
            for tokens in cfg.tokens:
                rows = []
                for mode in MODES:
                    prog.step(f"{cfg.label}: {tokens} token(s), {mode} x{cfg.iters}")
                    s = _measure(client, mode, batches[tokens], moe, dense)
                    rows.append(summarise(cfg, tokens, mode, s))
                ratios(rows)
                table.rows += rows
            _measure_shared(client, cfg, prog, batches, placement, with_shared, every,
                            shared_table)  # fmt: skip
    table.notes += [
        'broadcast: moe_send="broadcast" (activation + routing table once, target set); '
        'unicast: moe_send="unicast" (each routed duck its own rows); dense: the same '
        "banks as one dense SwiGLU layer, no routing: every duck computes every token.",
        "The layer has no shared expert (moe_shared below has one). Experts are "
        "narrow so that the dense baseline's every-duck-every-token compute stays short on "
        "the emulator; the routing is DeepSeek-V3's (Gate.deepseek_v3).",
        "tx bytes / call: the dataplane's tx_bytes counter (every datagram it sent, headers "
        "and resends included) over the timed calls; MoE wire bytes: its moe_bytes counter "
        "(activation and table bytes of first sends).",
        "Σ duck compute: the compute times the ducks reported in the completion, added up "
        "(the work the mode costs the cluster); slowest duck: the largest of them.",
        "All emulated ducks share CPU 1 (one emulator thread): their compute is serial, so "
        "end to end grows with Σ compute here, not with the slowest duck as on real ducks.",
        "rel. diff: the first timed call's result against the host reference (MoeMlp."
        "reference, or the dense layer's), largest |difference| / largest |reference|.",
    ]
    shared_table.notes += [
        "mode auto (the dataplane picks broadcast or unicast by bytes). default: "
        "MoeMlp(shared_ducks=None), as few ducks as the bank limit needs, one per NIC; "
        "every duck: shared_ducks=all ducks, a token then reaches every duck.",
        "MoE wire bytes / token: the moe_bytes counter (activation rows and routing "
        "tables of first sends) over calls x tokens. minimum / token: each token's row "
        "(hidden x 2 bytes) once to each duck that needs it, |its routed ducks U the "
        "shared set|, averaged over the same tokens; no broadcast address (loopback).",
        "auto sends whichever of the unicast and the broadcast puts fewer bytes on the "
        "wire, both from the slot in place (no staging area): one duck's message, not "
        "their sum, is held to max_forward_bytes (64 MiB by default).",
    ]
    # the floor: its own ducks and dataplane; the placement table: numpy, no cluster
    from . import emulator, moe_floor, moe_placement

    # what the ducks' compute is worth here: the emulator's expert kernel beside numpy's
    # float32 matmul on the same machine (issue 29.5), to read the tables above by
    return [
        table,
        shared_table,
        *moe_placement.run(),
        *moe_floor.run(size, quiet=quiet),
        *emulator.run(size, quiet=quiet),
    ]


def _measure_shared(client, cfg: Config, prog, batches, placement, moe, every, table) -> None:
    """The shared-expert table: the layer on its default set and on every duck."""
    ducks = list(range(cfg.ducks))
    client.load_weights(LAYER_SHARED, moe, placement=placement, progress=False)
    client.load_weights(LAYER_SHARED_EVERY, every, placement=placement, progress=False)
    default_set = list(client._session.moe[LAYER_SHARED].shared_ducks)
    row_bytes = cfg.hidden * 2  # float16
    for tokens in cfg.shared_tokens:
        timed = batches[tokens][1]
        for layer, m, shared_set, label in (
            (LAYER_SHARED, moe, default_set, f"default {default_set}"),
            (LAYER_SHARED_EVERY, every, ducks, f"every duck ({len(ducks)})"),
        ):
            prog.step(f"{cfg.label}: shared expert on {label}, {tokens} token(s)")
            s = _measure(client, "auto", batches[tokens], m, None, layer)
            least = sum(minimum_bytes(i, placement, shared_set, row_bytes) for _, i, _ in timed)
            table.rows.append(summarise_shared(cfg, tokens, label, s, least))
