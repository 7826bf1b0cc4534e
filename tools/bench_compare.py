#!/usr/bin/env python3
"""Before and after: two or more ``duckpipe bench`` results side by side, row by row.

    tools/bench_compare.py BEFORE/bench.json AFTER/bench.json [MORE/bench.json ...]

Runs are grouped by the order given: with four files ``b1 a1 b2 a2`` and ``--pairs``, the
medians of the befores (b1, b2) are set against the medians of the afters (a1, a2), so
that a change is judged by runs alternated in one sitting on one machine, never by a
number from another day. Rows are matched by their text columns (transport, config,
row...); each measured column prints before, after and after/before. A ratio column of
the bench itself (p50 / floor, rt / copy) is the better judge where there is one: both
sides of it were measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: the columns worth comparing, per table title prefix (the rest are context)
METRICS = {
    "ipc": ["rt_p50_us", "rt_p99_us", "ratio_to_copy"],
    "forward:": ["p50_us", "p99_us", "cpu_per_forward_us", "ratio_to_floor", "p99_ratio_to_floor"],
    "forward over": ["p50_us", "ratio_to_socket"],
    "scale: duckpipe": ["p50_us", "host_overhead_p50_us"],
    "pps": ["duckpipe_mpps", "ratio"],
}


def _metrics(title: str) -> list[str]:
    for prefix, cols in METRICS.items():
        if title.startswith(prefix):
            return cols
    return []


def _rows(doc: dict) -> dict[tuple[str, tuple], dict]:
    out = {}
    for t in doc["tables"]:
        cols = _metrics(t["title"])
        if not cols:
            continue
        for r in t["rows"]:
            key = tuple(str(v) for k, v in r.items() if isinstance(v, str))
            out[(t["title"], key)] = {c: r.get(c) for c in cols}
    return out


def _median(values: list) -> float | None:
    nums = [v for v in values if isinstance(v, int | float) and v == v]
    return statistics.median(nums) if nums else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench.json files, before first")
    ap.add_argument(
        "--pairs",
        action="store_true",
        help="the files alternate before, after, before, after...: compare medians",
    )
    args = ap.parse_args(argv)
    docs = [json.loads(p.read_text()) for p in args.files]
    if args.pairs:
        if len(docs) % 2:
            ap.error("--pairs takes an even number of files (before, after, ...)")
        before, after = docs[0::2], docs[1::2]
    else:
        if len(docs) != 2:
            ap.error("two files (before, after), or --pairs")
        before, after = docs[:1], docs[1:]
    b_rows = [_rows(d) for d in before]
    a_rows = [_rows(d) for d in after]
    worst: list[tuple[float, str]] = []
    title = None
    for key in b_rows[0]:
        if not all(key in r for r in b_rows + a_rows):
            continue
        if key[0] != title:
            title = key[0]
            print(f"\n## {title}")
        label = " / ".join(key[1])
        cells = []
        for col in b_rows[0][key]:
            b = _median([r[key][col] for r in b_rows])
            a = _median([r[key][col] for r in a_rows])
            if b is None or a is None:
                continue
            ratio = a / b if b else float("nan")
            cells.append(f"{col} {b:.3g} -> {a:.3g} ({ratio:.2f}x)")
            if col.endswith("_us") and col.startswith(("p50", "rt_p50", "cpu")):
                worst.append((ratio, f"{title} | {label} | {col}"))
        print(f"- {label}: " + "; ".join(cells))
    if worst:
        worst.sort(reverse=True)
        print("\nlargest after/before (latency and CPU at p50; > 1 is slower):")
        for ratio, what in worst[:5]:
            print(f"  {ratio:.2f}x  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
