"""``duckpipe demo``: a real model with every MLP computed by ducks, end to end, one command.

It starts what it needs (emulated ducks and the C dataplane on loopback, or the
mock), loads the weights through shared memory, runs the model with each FFN
offloaded, and prints what a person needs to see that it works: the sentences'
cosine-similarity matrix, the largest difference from the host-only numpy
forward, and a table of per-phase times. ``--json`` prints the same as one JSON
document (embeddings included) and nothing else on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..client.api import Client, connect
from ..errors import BadInput, DuckpipeError
from ..progress import Progress

__all__ = ["add_parser", "run"]

MODELS = ("minilm", "qwen3-0.6b-shape", "deepseek-v3-moe-shape")
MINILM_LAYER_BASE = 1000  # layer ids the demo loads; far from what a user's tests use
QWEN_LAYER_BASE = 2000
MOE_LAYER = 3000
MOE_WARMUP = 2  # untimed calls per batch size (first touches of the ducks' banks)
PHASES = ("prepare_ns", "send_ns", "wait_ns", "fetch_ns", "reduce_ns")
#: The largest |difference| from the host-only numpy forward that passes: MiniLM's
#: unit-length embeddings (absolute), the qwen shape's outputs (relative to the largest).
#: float32 sums in another order differ by ~1e-7 and ~5e-6; a lost or wrong shard by > 1e-2.
TOLERANCE = {"minilm": 1e-4, "qwen3-0.6b-shape": 1e-4}  # the MoE shape's: moe_shape.TOLERANCE


@dataclass
class _Timer:
    """Collects every offloaded FFN call's timings."""

    e2e_ns: list[int] = field(default_factory=list)
    phases: dict[str, list[int]] = field(default_factory=lambda: {p: [] for p in PHASES})
    compute_ns: list[int] = field(default_factory=list)

    def add(self, e2e: int, timings) -> None:
        self.e2e_ns.append(e2e)
        for p in PHASES:
            self.phases[p].append(getattr(timings, p))
        self.compute_ns.append(max(timings.duck_compute_ns, default=0))

    def table(self) -> dict[str, dict[str, float]]:
        rows = {p[:-3]: self.phases[p] for p in PHASES}
        rows["duck compute (slowest)"] = self.compute_ns
        rows["end to end"] = self.e2e_ns
        # the host's own cost: everything but waiting for the ducks' partials. wait runs
        # from the first send, so it holds the send, which is the host's: take only the
        # wait past it
        rows["host overhead"] = [
            max(0, e - max(0, w - s))
            for e, w, s in zip(
                self.e2e_ns, self.phases["wait_ns"], self.phases["send_ns"], strict=True
            )
        ]
        return {
            name: {
                "p50_us": float(np.percentile(v, 50)) / 1e3,
                "p99_us": float(np.percentile(v, 99)) / 1e3,
            }
            for name, v in rows.items()
            if v
        }


def _add_context(e: DuckpipeError, what: str) -> None:
    """Prefix the message with the model's name for the layer: the user's words."""
    e.args = (f"{what}: {e.args[0] if e.args else e}", *e.args[1:])


def _offload(client: Client, base: int, timer: _Timer) -> Callable[[int, np.ndarray], np.ndarray]:
    """An ``ffn(i, h)`` callback that runs the model's FFN ``i`` (the dataplane's layer
    ``base + i``) on the ducks."""

    def ffn(i: int, h: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(h, dtype=np.float32)
        t0 = time.perf_counter_ns()
        try:
            with client.claim(h.shape, h.dtype) as slot:
                slot.array[:] = h
                fwd = client.submit(slot, base + i)
            with fwd:
                y = fwd.result(timeout=30).copy()
                timer.add(time.perf_counter_ns() - t0, fwd.timings)
        except DuckpipeError as e:
            _add_context(e, f"ffn {i} (dataplane layer {base + i})")
            raise
        return y

    return ffn


def _load_ffns(client: Client, mlps: list, base: int, args: argparse.Namespace) -> None:
    """Load the model's FFNs as layers base.., one progress bar over all of them that
    follows the ducks' acknowledgements (lines, not frames, when stderr is no terminal)."""
    total = sum(
        a.nbytes
        for m in mlps
        for a in (*(getattr(m, t) for t in m.TENSORS), m.b_down)
        if a is not None
    )
    label = f"weights, ffn 0..{len(mlps) - 1}, acked by the ducks"
    with Progress(total, label, enabled=not args.json) as bar:
        for i, mlp in enumerate(mlps):
            seen = 0

            def acked(n: int, _total: int) -> None:
                nonlocal seen
                bar.advance(n - seen)
                seen = n

            try:
                client.load_weights(base + i, mlp, progress=acked)
            except DuckpipeError as e:
                _add_context(e, f"loading ffn {i} (dataplane layer {base + i})")
                raise


@contextlib.contextmanager
def _dataplane(args: argparse.Namespace, say: Callable[[str], None]) -> Iterator[str]:
    """Yields a control address; stops whatever it started, on any exit."""
    if args.control:
        yield args.control
        return
    if args.mock:
        from ..mock.process import MockDataplaneProcess

        with MockDataplaneProcess(ducks=args.ducks) as dp:
            say(f"started the mock dataplane (pid {dp.pid}) with {args.ducks} ducks")
            yield dp.control
        return
    if args.backend == "dpdk":
        raise DuckpipeError(
            "the demo cannot start the dpdk backend itself (it needs DPDK ports and a "
            "topology: docs/dpdk.md); start it with `duckpipe dataplane --config "
            "TOPOLOGY -- EAL OPTIONS` and pass --control, or use --backend socket, or --mock"
        )
    from ..launch.cluster import Cluster

    with Cluster(args.ducks, emulators=args.emulators) as cl:
        say(
            f"started {args.ducks} emulated ducks and the C dataplane (socket backend, pid "
            f"{cl.dataplane.pid}) on loopback"
        )
        yield cl.control


def _sentences(args: argparse.Namespace) -> list[str] | None:
    """--sentences FILE's lines, read before anything starts; None: the built-in ones."""
    if not args.sentences:
        return None
    path = Path(args.sentences)
    try:
        sentences = [s.strip() for s in path.read_text().splitlines() if s.strip()]
    except OSError as e:
        raise BadInput(f"cannot read --sentences {path}: {e.strerror}") from e
    if not sentences:
        raise BadInput(f"{path} has no sentences (one per line)")
    return sentences


def _minilm(client: Client, args: argparse.Namespace, say) -> dict:
    from .minilm import SENTENCES, MiniLM, cosine_matrix

    sentences = args.sentence_lines or SENTENCES
    model = MiniLM.load()
    _load_ffns(client, [model.ffn_weights(i) for i in range(model.layers)], MINILM_LAYER_BASE, args)
    timer = _Timer()
    ffn = _offload(client, MINILM_LAYER_BASE, timer)
    emb = model.encode(sentences, ffn)
    for _ in range(args.repeat - 1):  # more samples for the timing table
        model.encode(sentences, ffn)
    host = model.encode(sentences)
    diff = float(np.abs(emb - host).max())
    return {
        "model": "all-MiniLM-L6-v2",
        "sentences": sentences,
        "embeddings": emb,
        "cosine": cosine_matrix(emb),
        "max_abs_diff": diff,
        "checked": ("largest |difference|", diff),
        "runs": f"{args.repeat} encode(s) of {len(sentences)} sentences x {model.layers} FFNs",
        "timer": timer,
    }


def _qwen(client: Client, args: argparse.Namespace, say) -> dict:
    from .qwen_shape import QwenShape

    say(f"making {args.layers} seeded random SwiGLU layers (1024 -> 3072)")
    model = QwenShape(layers=args.layers, seed=0)
    _load_ffns(client, list(model.mlps), QWEN_LAYER_BASE, args)
    timer = _Timer()
    tokens = list(range(args.tokens))
    out = model.decode(tokens, _offload(client, QWEN_LAYER_BASE, timer))
    host = model.decode(tokens)
    rel = float(np.abs(out - host).max() / max(np.abs(host).max(), 1e-30))
    return {
        "model": f"qwen3-0.6b-shape ({args.layers} layers)",
        "tokens": tokens,
        "outputs": out,
        "max_abs_diff": float(np.abs(out - host).max()),
        "max_rel_diff": rel,
        "checked": ("largest relative difference", rel),
        "runs": f"{args.tokens} token(s) decoded one at a time x {args.layers} FFNs",
        "timer": timer,
    }


def _load_moe(client: Client, shape, placement: list[int], args: argparse.Namespace) -> None:
    """Load the MoE layer, one progress bar that follows the ducks' acknowledgements."""
    with Progress(shape.weight_bytes, "MoE layer weights, acked by the ducks",
                  enabled=not args.json) as bar:  # fmt: skip
        seen = 0

        def acked(n: int, _total: int) -> None:
            nonlocal seen
            bar.advance(n - seen)
            seen = n

        try:
            client.load_weights(MOE_LAYER, shape.moe, placement=placement, progress=acked)
        except DuckpipeError as e:
            _add_context(e, f"loading the MoE layer (dataplane layer {MOE_LAYER})")
            raise


def _duck_moe_rows(control: str) -> tuple[int, int] | None:
    """Sum over the ducks of (moe_tokens, moe_expert_rows) from the dataplane's stats
    segment; None where there is none beside the control socket (a remote dataplane)."""
    from ..observe import stats_reader as st

    try:
        snap = st.read_snapshot(control=control)
    except (DuckpipeError, OSError):
        return None
    return sum(d.moe_tokens for d in snap.ducks), sum(d.moe_expert_rows for d in snap.ducks)


def _moe_batch(client: Client, control: str, shape, placement: list[int], tokens: int,
               calls: int):  # fmt: skip
    """Time ``calls`` MoE calls of ``tokens`` tokens, then check each one against
    ``MoeMlp.reference`` (after the timed loop: numpy's threads would take the cores)."""
    from .moe_shape import BatchReport, relative_error, routed_ducks

    def call(k: int, timer: _Timer | None) -> np.ndarray:
        x, indices, weights = shape.batch(tokens, k)
        t0 = time.perf_counter_ns()
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, MOE_LAYER, routing=(indices, weights))
        with fwd:
            y = fwd.result(timeout=60).copy()
            elapsed = time.perf_counter_ns() - t0
            # the ZeroMQ completion comes after the dataplane counted the call in its
            # stats segment (the result word comes before): wait for it, warm-ups too, so
            # that the ducks' rows read after a batch hold every call of it
            timings = fwd.timings
            if timer is not None:
                timer.add(elapsed, timings)
        return y

    try:
        for k in range(MOE_WARMUP):  # batches of their own, after the timed ones
            call(calls + k, None)
        timer = _Timer()
        bytes0 = client.stats().counters.get("moe_bytes")
        rows0 = _duck_moe_rows(control)
        ys = [call(k, timer) for k in range(calls)]
        bytes1 = client.stats().counters.get("moe_bytes")
        rows1 = _duck_moe_rows(control)
    except DuckpipeError as e:
        _add_context(e, f"MoE layer (dataplane layer {MOE_LAYER}), {tokens} token(s) per call")
        raise
    n = tokens * calls
    per_token, per_call, worst = [], [], 0.0
    for k, y in enumerate(ys):
        x, indices, weights = shape.batch(tokens, k)
        per_token += list(routed_ducks(indices, placement))
        per_call.append(len(set(np.asarray(placement)[indices].ravel().tolist())))
        worst = max(worst, relative_error(y, shape.moe.reference(x, indices, weights)))
    t = timer.table()
    measured = rows1 is not None and rows0 is not None and rows1[0] > rows0[0]
    return BatchReport(
        tokens=tokens,
        calls=calls,
        routed_ducks_per_token=float(np.mean(per_token)),
        measured_ducks_per_token=(rows1[0] - rows0[0]) / n if measured else None,  # type: ignore[index]
        expert_rows_per_token=(rows1[1] - rows0[1]) / n if measured else None,  # type: ignore[index]
        ducks_per_call=float(np.mean(per_call)),
        wire_bytes_per_token=(bytes1 - bytes0) / n if bytes0 is not None and bytes1 else None,
        p50_us=t["end to end"]["p50_us"],
        p99_us=t["end to end"]["p99_us"],
        host_overhead_p50_us=t["host overhead"]["p50_us"],
        host_overhead_p99_us=t["host overhead"]["p99_us"],
        duck_compute_p50_us=t["duck compute (slowest)"]["p50_us"],
        max_rel_error=worst,
    )


def _moe(client: Client, control: str, args: argparse.Namespace, say) -> dict:
    from .moe_shape import BATCHES, MoeShape, default_placement

    shape = MoeShape(
        hidden=args.hidden, cache=Path(args.cache), say=say, progress=not args.json or None
    )
    say(
        f"the layer: 256 experts + 1 shared, hidden {args.hidden}, FP8 e4m3 with 128x128 "
        f"block scales ({shape.weight_bytes / 1e9:.2f} GB), bf16 activations"
    )
    ducks = sorted(d.id for d in client.topology().ducks)
    # the client's default placement, spelled out: the report counts ducks by it
    placement = default_placement(shape.moe.n_experts, ducks)
    _load_moe(client, shape, placement, args)
    reports = []
    for tokens in BATCHES:
        say(f"{args.calls} MoE calls of {tokens} token(s) (+{MOE_WARMUP} untimed)")
        reports.append(_moe_batch(client, control, shape, placement, tokens, args.calls))
    return {"model": "deepseek-v3-moe-shape", "reports": reports, "shape": shape,
            "ducks": len(ducks)}  # fmt: skip


def _moe_output(result: dict, args: argparse.Namespace, mode: str) -> tuple[bool, str]:
    """(PASS?, what to print): the text report, or with --json one JSON document."""
    import dataclasses

    from .moe_shape import REFERENCE_DECODE_TOKENS_PER_S, format_report, passed

    reports = result["reports"]
    ok = passed(reports, args.tolerance)
    if args.json:
        doc = {
            "model": result["model"],
            "dataplane": mode,
            "ducks": result["ducks"],
            "hidden": args.hidden,
            "batches": [
                {**dataclasses.asdict(r), "tokens_per_s": r.tokens_per_s()} for r in reports
            ],
            "checked": "largest relative difference from MoeMlp.reference",
            "tolerance": args.tolerance,
            "reference_cluster_decode_tokens_per_s": REFERENCE_DECODE_TOKENS_PER_S,
            "pass": ok,
        }
        return ok, json.dumps(doc)
    text = format_report(
        reports,
        ducks=result["ducks"],
        hidden=args.hidden,
        layer_bytes=result["shape"].weight_bytes,
        tolerance=args.tolerance,
    )
    return ok, text


def _verdict(result: dict, args: argparse.Namespace) -> tuple[bool, str]:
    """PASS/FAIL: the check against the host-only numpy forward, with its tolerance."""
    what, value = result["checked"]
    ok = bool(value <= args.tolerance)
    line = (
        f"{'PASS' if ok else 'FAIL'}: {what} from the host-only numpy forward {value:.2e} "
        f"{'<=' if ok else '>'} tolerance {args.tolerance:.0e}"
    )
    return ok, line


def _print_report(result: dict, args: argparse.Namespace) -> None:
    n = len(result["timer"].e2e_ns)
    print(f"\nmodel: {result['model']}, {result['ducks']} ducks, {n} offloaded MLP calls")
    if "cosine" in result:
        sents = result["sentences"]
        cos = result["cosine"]
        print("\ncosine similarity:")
        width = max(len(s) for s in sents[:12]) if sents else 0
        width = min(width, 44)
        for i, s in enumerate(sents[:12]):
            label = (s if len(s) <= width else s[: width - 1] + "…").ljust(width)
            print(
                f"  {i:2d} {label} "
                + " ".join(f"{cos[i, j]:5.2f}" for j in range(min(len(sents), 12)))
            )
    print(f"\nlargest |difference| from the host-only numpy forward: {result['max_abs_diff']:.2e}")
    print(f"\nper MLP call: p50 and p99 over {n} calls ({result['runs']})")
    print(f"  {'phase':<22} {'p50 (us)':>10} {'p99 (us)':>10}")
    for name, row in result["timer"].table().items():
        print(f"  {name:<22} {row['p50_us']:10.1f} {row['p99_us']:10.1f}")
    print()
    print(_verdict(result, args)[1])


def _json_report(result: dict, args: argparse.Namespace, mode: str) -> str:
    ok, _ = _verdict(result, args)
    doc = {
        "model": result["model"],
        "dataplane": mode,
        "ducks": result["ducks"],
        "max_abs_diff": result["max_abs_diff"],
        "timings_us": result["timer"].table(),
        "mlp_calls": len(result["timer"].e2e_ns),
        "timed_over": result["runs"],
        "checked": result["checked"][0],
        "tolerance": args.tolerance,
        "pass": ok,
    }
    if "cosine" in result:
        doc["sentences"] = result["sentences"]
        doc["embeddings"] = result["embeddings"].tolist()
        doc["cosine"] = result["cosine"].tolist()
    else:
        doc["tokens"] = result["tokens"]
        doc["outputs"] = result["outputs"].tolist()
        doc["max_rel_diff"] = result["max_rel_diff"]
    return json.dumps(doc)


def default_cache() -> Path:
    """Where the MoE demo keeps the checkpoint it writes: the XDG cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "duckpipe"


def run(args: argparse.Namespace) -> int:
    moe = args.model == "deepseek-v3-moe-shape"
    if args.ducks is None:
        args.ducks = {"qwen3-0.6b-shape": 24, "deepseek-v3-moe-shape": 32}.get(args.model, 8)
    if args.tolerance is None:
        from .moe_shape import TOLERANCE as MOE_TOLERANCE

        args.tolerance = MOE_TOLERANCE if moe else TOLERANCE[args.model]
    if moe and (args.hidden < 1 or args.calls < 1):
        raise BadInput(f"--hidden and --calls must be >= 1, got {args.hidden} and {args.calls}")
    # what can be wrong with the arguments is found before anything starts
    args.sentence_lines = _sentences(args) if args.model == "minilm" else None
    say = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    with _dataplane(args, say) as control, connect(control, name="demo") as client:
        if client.backing != "hugetlbfs":
            say("note: segments are on /dev/shm; `tools/setup env` as root reserves hugepages")
        if moe:
            result = _moe(client, control, args, say)
        else:
            result = (_qwen if args.model == "qwen3-0.6b-shape" else _minilm)(client, args, say)
            # the dataplane's own count: --ducks is only what the demo would start, and
            # says nothing of a dataplane given with --control
            result["ducks"] = len(client.topology().ducks)
        mode = client.mode
    if moe:
        ok, text = _moe_output(result, args, mode)
        print(text)
        return 0 if ok else 1
    if args.json:
        print(_json_report(result, args, mode))
    else:
        _print_report(result, args)
    return 0 if _verdict(result, args)[0] else 1


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run a real model with its MLPs on ducks (the main job)",
        description="Runs a model with every FFN computed by the ducks, checks the result "
        "against the host-only numpy forward and prints PASS or FAIL (exit 1) against "
        "--tolerance, with the per-phase times of the offloaded calls.",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default="minilm",
        help="all-MiniLM-L6-v2 (default), Qwen3-0.6B's MLP shapes with random weights, or "
        "one DeepSeek-V3 mixture-of-experts layer (256 experts on the ducks, random weights)",
    )
    p.add_argument(
        "--ducks",
        type=int,
        help="ducks to start (default 8; 24 for the qwen shape, 32 for the MoE shape)",
    )
    p.add_argument("--mock", action="store_true", help="use the mock dataplane, not the C one")
    p.add_argument(
        "--emulators",
        type=int,
        default=1,
        help="duck emulator processes (default 1: its threads compute the ducks on every "
        "CPU it may use; several share those CPUs out)",
    )
    p.add_argument(
        "--backend",
        choices=("socket", "dpdk"),
        default="socket",
        help="the C dataplane's backend (dpdk: start it yourself and pass --control)",
    )
    p.add_argument("--control", help="use this running dataplane instead of starting one")
    p.add_argument("--sentences", help="embed the lines of this file instead of the built-in ones")
    p.add_argument("--repeat", type=int, default=20, help="encode the sentences this many times")
    p.add_argument("--layers", type=int, default=28, help="qwen shape: layers (default 28)")
    p.add_argument("--tokens", type=int, default=16, help="qwen shape: tokens to decode")
    p.add_argument(
        "--hidden",
        type=int,
        default=7168,
        help="MoE shape: hidden size (default DeepSeek-V3's 7168; smaller for a quick run)",
    )
    p.add_argument(
        "--calls", type=int, default=20, help="MoE shape: timed calls per batch size (1, 8, 32)"
    )
    p.add_argument(
        "--cache",
        default=str(default_cache()),
        help="MoE shape: where its checkpoint is written once and read from "
        "(default $XDG_CACHE_HOME/duckpipe or ~/.cache/duckpipe)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help="largest difference from the host-only forward that passes (default 1e-4: "
        "absolute for minilm, relative for the qwen shape; 2e-2 relative for the bf16 + FP8 "
        "MoE shape)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout, nothing else")
    p.set_defaults(func=run)
