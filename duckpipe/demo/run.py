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

from ..client import Client, connect
from ..errors import BadInput, DuckpipeError

__all__ = ["add_parser", "run"]

MODELS = ("minilm", "qwen3-0.6b-shape")
MINILM_LAYER_BASE = 1000  # layer ids the demo loads; far from what a user's tests use
QWEN_LAYER_BASE = 2000
PHASES = ("prepare_ns", "send_ns", "wait_ns", "fetch_ns", "reduce_ns")


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
        # the host's own cost: everything but waiting for the ducks' partials
        rows["host overhead"] = [
            max(0, e - w) for e, w in zip(self.e2e_ns, self.phases["wait_ns"], strict=True)
        ]
        return {
            name: {
                "p50_us": float(np.percentile(v, 50)) / 1e3,
                "p99_us": float(np.percentile(v, 99)) / 1e3,
            }
            for name, v in rows.items()
            if v
        }


def _offload(client: Client, base: int, timer: _Timer) -> Callable[[int, np.ndarray], np.ndarray]:
    """An ``ffn(i, h)`` callback that runs layer ``base + i`` on the ducks."""

    def ffn(i: int, h: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(h, dtype=np.float32)
        t0 = time.perf_counter_ns()
        with client.claim(h.shape, h.dtype) as slot:
            slot.array[:] = h
            fwd = client.submit(slot, base + i)
        with fwd:
            y = fwd.result(timeout=30).copy()
            timer.add(time.perf_counter_ns() - t0, fwd.timings)
        return y

    return ffn


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
            "topology: README, DPDK backend); start it with `duckpipe dataplane --config "
            "TOPOLOGY -- EAL OPTIONS` and pass --control, or use --backend socket, or --mock"
        )
    from ..cluster import Cluster

    with Cluster(args.ducks, emulators=args.emulators) as cl:
        say(
            f"started {args.ducks} emulated ducks and the C dataplane (socket backend, pid "
            f"{cl.dataplane.pid}) on loopback"
        )
        yield cl.control


def _minilm(client: Client, args: argparse.Namespace, say) -> dict:
    from .minilm import SENTENCES, MiniLM, cosine_matrix

    sentences = SENTENCES
    if args.sentences:
        path = Path(args.sentences)
        try:
            sentences = [s.strip() for s in path.read_text().splitlines() if s.strip()]
        except OSError as e:
            raise BadInput(f"cannot read {path}: {e.strerror}") from e
        if not sentences:
            raise BadInput(f"{path} has no sentences (one per line)")
    model = MiniLM.load()
    for i in range(model.layers):
        client.load_weights(MINILM_LAYER_BASE + i, model.ffn_weights(i), progress=not args.json)
    timer = _Timer()
    ffn = _offload(client, MINILM_LAYER_BASE, timer)
    emb = model.encode(sentences, ffn)
    for _ in range(args.repeat - 1):  # more samples for the timing table
        model.encode(sentences, ffn)
    host = model.encode(sentences)
    return {
        "model": "all-MiniLM-L6-v2",
        "sentences": sentences,
        "embeddings": emb,
        "cosine": cosine_matrix(emb),
        "max_abs_diff": float(np.abs(emb - host).max()),
        "timer": timer,
    }


def _qwen(client: Client, args: argparse.Namespace, say) -> dict:
    from .qwen_shape import QwenShape

    say(f"making {args.layers} seeded random SwiGLU layers (1024 -> 3072)")
    model = QwenShape(layers=args.layers, seed=0)
    for i, mlp in enumerate(model.mlps):
        client.load_weights(QWEN_LAYER_BASE + i, mlp, progress=not args.json)
    timer = _Timer()
    tokens = list(range(args.tokens))
    out = model.decode(tokens, _offload(client, QWEN_LAYER_BASE, timer))
    host = model.decode(tokens)
    return {
        "model": f"qwen3-0.6b-shape ({args.layers} layers)",
        "tokens": tokens,
        "outputs": out,
        "max_abs_diff": float(np.abs(out - host).max()),
        "max_rel_diff": float(np.abs(out - host).max() / max(np.abs(host).max(), 1e-30)),
        "timer": timer,
    }


def _print_report(result: dict, args: argparse.Namespace) -> None:
    print(
        f"\nmodel: {result['model']}, {args.ducks} ducks, {len(result['timer'].e2e_ns)} "
        "offloaded MLP calls"
    )
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
    print("\nper MLP call      p50 (us)   p99 (us)")
    for name, row in result["timer"].table().items():
        print(f"  {name:<22} {row['p50_us']:8.1f} {row['p99_us']:10.1f}")


def _json_report(result: dict, args: argparse.Namespace, mode: str) -> str:
    doc = {
        "model": result["model"],
        "dataplane": mode,
        "ducks": args.ducks,
        "max_abs_diff": result["max_abs_diff"],
        "timings_us": result["timer"].table(),
        "mlp_calls": len(result["timer"].e2e_ns),
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


def run(args: argparse.Namespace) -> int:
    if args.ducks is None:
        args.ducks = 24 if args.model == "qwen3-0.6b-shape" else 8
    say = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    with _dataplane(args, say) as control, connect(control, name="demo") as client:
        if client.backing != "hugetlbfs":
            say("note: segments are on /dev/shm; `tools/setup env` as root reserves hugepages")
        result = (_qwen if args.model == "qwen3-0.6b-shape" else _minilm)(client, args, say)
        mode = client.mode
    if args.json:
        print(_json_report(result, args, mode))
    else:
        _print_report(result, args)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run a real model with its MLPs on ducks (the main job)")
    p.add_argument("--model", choices=MODELS, default="minilm")
    p.add_argument("--ducks", type=int, help="ducks to start (default 8; 24 for the qwen shape)")
    p.add_argument("--mock", action="store_true", help="use the mock dataplane, not the C one")
    p.add_argument(
        "--emulators",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="duck emulator processes (one thread each; default: up to 2 cores)",
    )
    p.add_argument("--backend", choices=("socket", "dpdk"), default="socket")
    p.add_argument("--control", help="use this running dataplane instead of starting one")
    p.add_argument("--sentences", help="embed the lines of this file instead of the built-in ones")
    p.add_argument("--repeat", type=int, default=20, help="encode the sentences this many times")
    p.add_argument("--layers", type=int, default=28, help="qwen shape: layers (default 28)")
    p.add_argument("--tokens", type=int, default=16, help="qwen shape: tokens to decode")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout, nothing else")
    p.set_defaults(func=run)
