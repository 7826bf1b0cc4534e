"""Writing ``duckpipe bench`` results: markdown tables, one JSON document, PNG plots, and
the sections of a markdown page (``--doc docs/benchmarks.md``)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .common import Table

__all__ = [
    "DocError",
    "doc_sections",
    "fmt",
    "header_markdown",
    "machine_line",
    "plot",
    "section_markdown",
    "table_markdown",
    "update_doc",
    "write_json",
]


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


# --- the page: docs/benchmarks.md ---------------------------------------------------------

#: A section's block in the page: everything between these lines is the bench's own and
#: is replaced by the next run of that section; the text around the blocks is kept.
BEGIN = "<!-- duckpipe bench: {} begin -->"
END = "<!-- duckpipe bench: {} end -->"
_MARKER = re.compile(r"^<!-- duckpipe bench: (\w+) (begin|end) -->$", re.M)

NEW_DOC = """\
# Benchmarks

Written by `duckpipe bench SECTION --doc PATH`: each section between its
`duckpipe bench` markers is replaced by the next run of that section, with the date
and the machine it ran on; text outside the markers is kept as it is.
"""


class DocError(ValueError):
    """The page's section markers are not in begin/end pairs."""


def doc_sections(text: str) -> dict[str, tuple[int, int]]:
    """Each section's block in ``text``: (start of its begin line, end of its end line).

    Raises ``DocError`` naming the marker that does not pair up."""
    out: dict[str, tuple[int, int]] = {}
    open_name, open_at = "", 0
    for m in _MARKER.finditer(text):
        name, edge = m.group(1), m.group(2)
        if edge == "begin":
            if open_name:
                raise DocError(f"section {open_name!r} has no end marker before {name!r} begins")
            if name in out:
                raise DocError(f"section {name!r} appears twice")
            open_name, open_at = name, m.start()
        else:
            if name != open_name:
                raise DocError(f"an end marker for {name!r} without its begin marker")
            out[name] = (open_at, m.end())
            open_name = ""
    if open_name:
        raise DocError(f"section {open_name!r} has no end marker")
    return out


def machine_line(facts: Mapping[str, object], command: str, seconds: float | None) -> str:
    """One sentence: when, by which command, on what machine, under what load."""
    took = f", {seconds:.0f} s" if seconds is not None else ""
    libs = f"Python {facts.get('python')}, numpy {facts.get('numpy')}"
    if "pyzmq" in facts:
        libs += f", pyzmq {facts['pyzmq']} (libzmq {facts.get('libzmq')})"
    load = facts.get("loadavg")
    load_s = ", ".join(str(x) for x in load) if isinstance(load, list | tuple) else "unknown"
    return (
        f"Measured {facts.get('date_utc')} by `{command}` ({facts.get('size', 'full')} "
        f"size{took}) on {facts.get('cpu_model')}, {facts.get('cpus')} CPUs, kernel "
        f"{facts.get('kernel')}; {libs}; pinning: {facts.get('pinning')}; load average at "
        f"the start {load_s}; commit {facts.get('git_commit') or 'unknown'}."
    )


def section_markdown(
    name: str, facts: Mapping[str, object], command: str, seconds: float | None,
    tables: Sequence[Table],
) -> str:  # fmt: skip
    """One section's block for the page, markers included."""
    parts = [BEGIN.format(name), f"## {name}", "", machine_line(facts, command, seconds), ""]
    parts += [table_markdown(t) for t in tables]
    return "\n".join(parts).rstrip("\n") + "\n" + END.format(name)


def update_doc(path: Path, blocks: Mapping[str, str]) -> None:
    """Put each section's block into the page at ``path``: in place of that section's
    earlier block, else at the end. A page that does not exist yet is started."""
    text = path.read_text() if path.exists() else NEW_DOC
    for name, block in blocks.items():
        found = doc_sections(text).get(name)
        if found:
            text = text[: found[0]] + block + text[found[1] :]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
