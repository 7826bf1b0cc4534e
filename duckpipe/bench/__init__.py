"""``duckpipe bench [SECTION|all] [--quick|--smoke] [--out DIR] [--doc PAGE] [decode options]``.

Sections, one module each: :mod:`.ipc` (the handoff against IPC baselines),
:mod:`.forward` (the reference system's path against duckpipe, same ducks),
:mod:`.scale` (duckpipe's host overhead against ducks and payload), :mod:`.pps`
(one worker's DPDK transmit rate against dpdk-testpmd; skipped without root,
DPDK or hugepages), :mod:`.moe` (a mixture-of-experts layer broadcast, unicast and
as a dense baseline; then, :mod:`.moe_floor`, duckpipe's routed sends against the C
floor ``duckpipe-floor --moe``), :mod:`.decode` (a DeepSeek-V3-shaped decode step
through N layers, one and two micro-batches in flight); on request only (not in
``all``), :mod:`.emulator` (the duck emulator's compute rate against numpy's float32
matmul). Markdown
tables go to stdout, progress to stderr, ``bench.json`` (and PNG plots when
matplotlib is installed: ``pip install 'duckpipe[bench]'``) into ``--out``. With
``--doc`` (``docs/benchmarks.md``) each section that ran replaces its own block of that
page, with the date and the machine (:func:`.report.update_doc`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .common import Size, Table, machine_facts, pin_self
from .report import (
    DocError,
    doc_sections,
    header_markdown,
    plot,
    section_markdown,
    table_markdown,
    update_doc,
    write_json,
)

__all__ = ["SECTIONS", "add_parser", "run"]

SECTIONS = ("ipc", "forward", "scale", "pps", "moe", "decode")


def _forward_plot(out: Path, t: Table) -> bool:
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in t.rows:
        if r["rows"] != 1:
            continue
        x, y = series.setdefault(str(r["row"]), ([], []))
        x.append(float(r["ducks"]))  # type: ignore[arg-type]
        y.append(float(r["p50_us"]))  # type: ignore[arg-type]
    return plot(out / "forward.png", "forward p50, one row", series, "ducks", "p50 (µs)", logy=True)


def _ipc_plot(out: Path, t: Table) -> bool:
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in t.rows:
        x, y = series.setdefault(str(r["transport"]), ([], []))
        x.append(float(r["bytes"]))  # type: ignore[arg-type]
        y.append(float(r["rt_p50_us"]))  # type: ignore[arg-type]
    return plot(out / "ipc.png", "round trip p50 by payload", series, "payload (bytes)",
                "round trip p50 (µs)", logx=True, logy=True)  # fmt: skip


def run(
    sections: list[str],
    size: Size,
    out: Path,
    command: str,
    *,
    quiet: bool = False,
    doc: Path | None = None,
    decode: dict[str, int | None] | None = None,
) -> int:
    if doc is not None and doc.exists():
        try:  # before a run of minutes, not after it
            doc_sections(doc.read_text())
        except DocError as e:
            print(f"duckpipe bench: --doc {doc}: {e}; fix its markers first", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    before, pinning = pin_self()
    facts = machine_facts(pinning)
    facts["size"] = size.name
    print(header_markdown(facts, command))
    tables: list[Table] = []
    by_section: dict[str, list[Table]] = {}
    extra: dict[str, object] = {"sections": sections, "seconds": {}, "plots": []}
    plots: list[str] = extra["plots"]  # type: ignore[assignment]
    seconds: dict[str, float] = extra["seconds"]  # type: ignore[assignment]
    have_plots = True
    try:
        for name in sections:
            t0 = time.monotonic()
            if name == "forward":
                from . import forward, forward_veth

                main, *notes = forward.run(size, quiet=quiet)
                new = [main, forward_veth.run(size, quiet=quiet), *notes]
                if _forward_plot(out, new[0]):
                    plots.append("forward.png")
                else:
                    have_plots = False
            elif name == "scale":
                from . import scale

                new, pngs = scale.run(size, out, quiet=quiet)
                plots += pngs
                have_plots = have_plots and bool(pngs)
            elif name == "ipc":
                from . import ipc

                new = ipc.run(size, quiet=quiet)
                if _ipc_plot(out, new[0]):
                    plots.append("ipc.png")
                else:
                    have_plots = False
            elif name == "pps":
                from . import pps

                new = pps.run(size, quiet=quiet)
            elif name == "moe":
                from . import moe

                new = moe.run(size, quiet=quiet)
            elif name == "decode":
                from . import decode as decode_bench

                new = decode_bench.run(size, quiet=quiet, **(decode or {}))
            elif name == "emulator":  # not in SECTIONS (not in `all`): on request
                from . import emulator

                new = emulator.run(size, quiet=quiet)
            else:
                raise ValueError(name)
            seconds[name] = round(time.monotonic() - t0, 1)
            for t in new:
                print(table_markdown(t))
            tables += new
            by_section[name] = new
            sys.stdout.flush()
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
    if not have_plots:
        print("(no plots: matplotlib is not installed; pip install 'duckpipe[bench]')")
    write_json(out / "bench.json", facts, command, tables, extra)
    print(f"wrote {out / 'bench.json'}" + (f" and {', '.join(plots)}" if plots else ""))
    if doc is not None:
        update_doc(
            doc,
            {
                name: section_markdown(name, facts, command, seconds.get(name), new)
                for name, new in by_section.items()
            },
        )
        print(f"wrote the {', '.join(by_section)} section(s) of {doc}")
    return 0


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return n


def _non_negative(v: str) -> int:
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return n


def _main(args: argparse.Namespace) -> int:
    sections = list(SECTIONS) if args.section == "all" else [args.section]
    size = Size("smoke" if args.smoke else "quick" if args.quick else "full")
    command = "duckpipe bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "duckpipe bench"
    doc = Path(args.doc) if args.doc else None
    decode = {"layers": args.layers, "duck_us": args.duck_us, "attn_us": args.attn_us}
    return run(
        sections, size, Path(args.out), command.strip(), quiet=args.quiet, doc=doc, decode=decode
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="benchmarks: the handoff, the forward path, scaling, DPDK pps, mixture of "
        "experts, a decode step",
    )
    b.add_argument(
        "section",
        nargs="?",
        default="all",
        choices=(*SECTIONS, "emulator", "all"),
        help="which benchmark (default all; emulator: the duck emulator's compute rate "
        "against numpy, on request only)",
    )
    g = b.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small sizes, under 5 minutes on 2 cores")
    g.add_argument("--smoke", action="store_true", help="tiniest sizes, seconds (CI, tests)")
    b.add_argument("--out", default="bench-results", help="results folder (default bench-results)")
    b.add_argument(
        "--doc",
        metavar="PAGE",
        help="also write each section's tables, date and machine into this markdown page "
        "(docs/benchmarks.md), replacing that section's earlier block",
    )
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    d = b.add_argument_group("decode", "the decode section's model (defaults: by size)")
    d.add_argument("--layers", type=_positive, help="layers, the first dense (61: DeepSeek-V3's)")
    d.add_argument(
        "--duck-us", type=_non_negative, help="modeled compute per duck and forward (default 100)"
    )
    d.add_argument(
        "--attn-us", type=_non_negative, help="modeled attention per layer, µs (default 50)"
    )
    b.set_defaults(func=_main)
