"""The dataplane's modules form a hierarchy: no module calls into one that calls it back.

A module is a ``dp_<name>.c`` under ``dataplane/src/``. A module uses another when its
``.c`` includes the other's header, or names a function the other defines: a call, a
function put in an ops table, or a macro (from any header) whose body calls one. Include
names alone missed two circles: the control agent and the files of its requests, outbox
and housekeeping called each other through ``dp_control_internal.h``, and the dpdk
backend's ARP, frames and zero copy through the transmit queue. The NIC worker's modules
(gather, weight, tx, release) once called back into the worker that calls them: a circle
of five files. This test keeps the graph acyclic, and keeps each folder's role: the
forward path's leaves know nothing of the worker or the control agent, and the backends
know nothing of either.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "dataplane" / "src"
INCLUDE = re.compile(r'^#include "(dp_\w+)\.h"', re.M)
# comments, strings and character constants: blanked before names are read
NOISE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])'", re.S)
# a function or an object (an ops table) with external linkage, defined at the top level
DEFINITION = re.compile(
    r"^(?!static\b|extern\b)[A-Za-z_][\w \t*]*?\b(dp_\w+)\s*(?:\([^;{]*?\)\s*\{|(?:\[\w*\])?\s*=)",
    re.M,
)
MACRO = re.compile(r"^#\s*define\s+(\w+)\s*\([^)]*\)((?:.*\\\n)*.*)$", re.M)
NAME = re.compile(r"\b(dp_\w+|[A-Z_][A-Z0-9_]*)\b")
FUNCTION_NAME = re.compile(r"\b(dp_\w+)\b")


def _code(path: Path) -> str:
    return NOISE.sub(lambda m: " " if m.group(0).startswith("/") else '""', path.read_text())


def _include_graph(src: Path = SRC) -> dict[str, set[str]]:
    sources = {p.stem: p for p in src.rglob("dp_*.c")}
    return {
        name: {h for h in INCLUDE.findall(path.read_text()) if h in sources and h != name}
        for name, path in sources.items()
    }


def _call_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules defining a function it names, directly or through a macro."""
    code = {p.stem: _code(p) for p in src.rglob("dp_*.c")}
    definer = {f: name for name, text in code.items() for f in DEFINITION.findall(text)}
    macros: dict[str, set[str]] = {}
    for path in [*src.rglob("*.h"), *src.rglob("*.c")]:
        for macro, body in MACRO.findall(_code(path)):
            macros[macro] = set(FUNCTION_NAME.findall(body))
    graph = {}
    for name, text in code.items():
        named = set()
        for n in set(NAME.findall(text)):
            named |= {n} if n in definer else macros.get(n, set())
        graph[name] = {definer[f] for f in named if f in definer and definer[f] != name}
    return graph


def _graph(src: Path = SRC) -> dict[str, set[str]]:
    includes, calls = _include_graph(src), _call_graph(src)
    return {name: includes[name] | calls[name] for name in includes}


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


def test_call_edges_are_read_from_calls_tables_and_macros() -> None:
    calls = _call_graph()
    assert "dp_gather" in calls["dp_worker"]  # a call
    assert "dp_dispatch" in calls["dp_main"]  # dp_dispatch_unpark put in the agent table
    assert "dp_backend_socket" in calls["dp_backend"]  # an ops table by name


def test_the_call_graph_finds_a_circle_that_includes_hide(tmp_path: Path) -> None:
    """Two files that call each other through a macro of a third header, no header each."""
    (tmp_path / "dp_a.c").write_text(
        '#include "dp_shared.h"\nint dp_a_run(void)\n{\n\treturn CALL_B();\n}\n'
    )
    (tmp_path / "dp_b.c").write_text(
        '#include "dp_shared.h"\nint dp_b_run(void)\n{\n\treturn dp_a_run(); /* dp_c */\n}\n'
    )
    (tmp_path / "dp_shared.h").write_text(
        "#define CALL_B() \\\n\tdp_b_run()\nint dp_a_run(void);\n"
    )
    assert _include_graph(tmp_path) == {"dp_a": set(), "dp_b": set()}
    assert _cycles(_call_graph(tmp_path)) == [["dp_a", "dp_b"]]


def test_no_dataplane_module_calls_into_one_that_calls_it_back() -> None:
    # calls alone: a backend includes dp_backend.h for its types while dp_backend.c names
    # the backend in its table; only a call back would make that a circle
    assert _cycles(_call_graph()) == []


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


# --- the build enforces the directions -------------------------------------------------

BUILD = SRC.parents[1] / "dataplane" / "build"
# roles bottom to top (dataplane/meson.build), each with a header of its own
ROLES = {
    "runtime": "dp_common.h",
    "backend": "dp_backend.h",
    "state": "dp_world.h",
    "forward": "dp_fwd.h",
    "control": "dp_control.h",
}


def _role_compilers() -> dict[str, list[str]]:
    """Each role library's compiler command line, as the build dir's introspection has it."""
    info = BUILD / "meson-info" / "intro-targets.json"
    if not info.exists():
        pytest.skip(f"no C build dir at {BUILD}: `tools/setup env` makes it")
    found = {}
    for target in json.loads(info.read_text()):
        role = target["name"].removeprefix("dp_")
        if role in ROLES:
            source = target["target_sources"][0]
            found[role] = source["compiler"] + source["parameters"]
    assert set(found) == set(ROLES), (
        f"role libraries missing from {BUILD}: {set(ROLES) - set(found)}"
    )
    return found


def _compiles(command: list[str], header: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, "-fsyntax-only", "-x", "c", "-"],
        input=f'#include "{header}"\n',
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("role", list(ROLES))
def test_a_role_may_include_its_own_and_lower_headers_and_no_higher_one(role: str) -> None:
    command = _role_compilers()[role]
    order = list(ROLES)
    for other in order[: order.index(role) + 1]:
        done = _compiles(command, ROLES[other])
        assert done.returncode == 0, (role, ROLES[other], done.stderr[-2000:])
    for higher in order[order.index(role) + 1 :]:
        done = _compiles(command, ROLES[higher])
        assert done.returncode != 0 and f"{ROLES[higher]}: No such file" in done.stderr, (
            f"{role} reaches {higher}'s {ROLES[higher]}: the build must refuse an upward include"
        )
