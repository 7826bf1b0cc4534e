"""The dataplane's modules form a hierarchy: no module calls into one that calls it back.

A module is a ``dp_<name>.c`` under ``dataplane/src/`` with its ``dp_<name>.h``; a module
uses another when its ``.c`` includes the other's header. The NIC worker's modules
(gather, weight, tx, release) once called back into the worker that calls them: a circle
of five files. This test keeps the graph acyclic, and keeps each folder's role: the
forward path's leaves know nothing of the worker or the control agent, and the backends
know nothing of either.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "dataplane" / "src"
INCLUDE = re.compile(r'^#include "(dp_\w+)\.h"', re.M)


def _graph() -> dict[str, set[str]]:
    sources = {p.stem: p for p in SRC.rglob("dp_*.c")}
    return {
        name: {h for h in INCLUDE.findall(path.read_text()) if h in sources and h != name}
        for name, path in sources.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_reads_every_module() -> None:
    graph = _graph()
    assert {"dp_main", "dp_worker", "dp_gather", "dp_control", "dp_dispatch"} <= set(graph)
    assert "dp_gather" in graph["dp_worker"]  # the parser sees real edges


def test_no_dataplane_module_calls_into_one_that_calls_it_back() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_workers_leaves_know_nothing_of_the_worker_or_the_control_agent() -> None:
    graph = _graph()
    for leaf in ("dp_gather", "dp_weight", "dp_tx", "dp_release", "dp_fwd"):
        assert not graph[leaf] & {"dp_worker", "dp_dispatch", "dp_control"}, leaf


def test_backends_know_nothing_of_the_forward_path_or_control() -> None:
    graph = _graph()
    above = {p.stem for d in ("forward", "control") for p in (SRC / d).glob("dp_*.c")}
    for path in (SRC / "backend").rglob("dp_*.c"):
        assert not graph[path.stem] & above, (path.stem, graph[path.stem] & above)
