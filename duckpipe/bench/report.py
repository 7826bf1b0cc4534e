"""Writing ``duckpipe bench`` results: markdown tables, one JSON document, PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from .common import Table

__all__ = ["fmt", "header_markdown", "plot", "table_markdown", "write_json"]


def fmt(v: object) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        a = abs(v)
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01 or a == 0:
            return f"{v:.2f}"
        return f"{v:.2e}"
    return str(v)


def header_markdown(facts: dict[str, object], command: str) -> str:
    lines = [
        f"# duckpipe bench — {facts.get('date_utc', '')}",
        "",
        f"`{command}`",
        "",
        f"- machine: {facts.get('cpu_model')}, {facts.get('cpus')} CPUs, kernel "
        f"{facts.get('kernel')}, Python {facts.get('python')}, numpy {facts.get('numpy')}"
        + (f", pyzmq {facts['pyzmq']} (libzmq {facts.get('libzmq')})" if "pyzmq" in facts else ""),
        f"- pinning: {facts.get('pinning')}",
        f"- load average at start: {facts.get('loadavg')}; commit {facts.get('git_commit')}",
    ]
    return "\n".join(lines) + "\n"


def table_markdown(t: Table) -> str:
    keys = [k for k, _ in t.columns]
    heads = [h for _, h in t.columns]
    out = [f"### {t.title}", "", "| " + " | ".join(heads) + " |"]
    out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(heads))) + "|")
    for r in t.rows:
        out.append("| " + " | ".join(fmt(r.get(k)) for k in keys) + " |")
    if t.notes:
        out.append("")
        out += [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def _clean(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def write_json(path: Path, facts: dict[str, object], command: str, tables: Sequence[Table],
               extra: dict[str, object]) -> None:  # fmt: skip
    doc = {
        "command": command,
        "machine": facts,
        "tables": [t.to_json() for t in tables],
        **extra,
    }
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")


def plot(path: Path, title: str, series: dict[str, tuple[list[float], list[float]]],
         xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False,
         fits: dict[str, tuple[float, float]] | None = None) -> bool:  # fmt: skip
    """A line plot of ``series`` (name -> (x, y)); False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, (x, y) in series.items():
        ax.plot(x, y, marker="o", label=name)
        if fits and name in fits:
            slope, icpt = fits[name]
            ax.plot(x, [icpt + slope * v for v in x], linestyle="--", alpha=0.6,
                    label=f"{name}: fit {slope:.3g}/unit")  # fmt: skip
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
