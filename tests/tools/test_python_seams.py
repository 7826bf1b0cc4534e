"""The Python package's seams (issue 27.5), read from its imports with ast.

- ``duckpipe._abi`` is the one wrapper over the cffi module: nothing else imports
  ``duckpipe._native``, and it sits below the client and the mock dataplane, which both
  take the segment and the ring from it (as pyzmq's backend sits under its sugar). The
  mock once imported the client's own ``shm`` and ``ring``.
- No module imports one that imports it back, at the top or inside a function (``if
  TYPE_CHECKING:`` imports do not run): ``launch.binaries`` and ``cli`` once called each
  other, and ``bench.forward`` and ``bench.forward_veth``.
- The code generators are build tools (``tools/codegen/``): the package never imports
  them.

The test_layering.py of the Python side; tests/ and tools/ are not the package.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "duckpipe"

# testing/__init__.py carries the plugin's fixtures while pytest runs, for installs whose
# pytest11 entry point still names duckpipe.testing (made before plugin.py): that
# module imports the helpers back. The one circle allowed, until that shim goes.
ALLOWED_CIRCLES = [{"duckpipe.testing", "duckpipe.testing.plugin"}]


@cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(name: str, path: Path) -> set[str]:
    """The duckpipe modules ``name`` imports anywhere in its code but under TYPE_CHECKING:
    ``from P import m`` counts as m when m is a module, else as P."""
    mods = _modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                found.add(sub if sub in mods else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


@cache
def _graph() -> dict[str, set[str]]:
    """Every module of the package and the names it imports (duckpipe's or not)."""
    return {name: _imported(name, path) for name, path in _modules().items()}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_only_the_abi_wrapper_imports_the_cffi_module():
    importers = sorted(
        m
        for m, deps in _graph().items()
        if "duckpipe._native" in deps and not _under(m, "duckpipe._abi")
    )
    assert importers == [], f"import ffi and lib from duckpipe._abi instead: {importers}"


def test_the_abi_wrapper_sits_below_the_client_and_the_mock():
    below = (
        "duckpipe._abi",
        "duckpipe._native",
        "duckpipe.errors",
        "duckpipe.host",
        "duckpipe.schema",
    )
    for m, deps in _graph().items():
        if _under(m, "duckpipe._abi"):
            above = sorted(
                d for d in deps if _under(d, "duckpipe") and not any(_under(d, b) for b in below)
            )
            assert above == [], f"{m} imports {above}, which sit above the wrapper"


def test_the_mock_takes_the_segment_and_the_ring_from_the_wrapper_not_the_client():
    # what the mock may share with the client: the numpy reference (the models, and FP8's
    # weight_dequant as DeepSeek-V3 writes it) and the routing rule
    shared = {"duckpipe.client.models", "duckpipe.client.fp8", "duckpipe.client.routing"}
    for m, deps in _graph().items():
        if _under(m, "duckpipe.mock"):
            internals = sorted(d for d in deps if _under(d, "duckpipe.client") and d not in shared)
            assert internals == [], f"{m} imports the client's {internals}: use duckpipe._abi"
    assert not (PKG / "client" / "shm.py").exists() and not (PKG / "client" / "ring.py").exists()


def test_no_module_imports_one_that_imports_it_back():
    circles = [c for c in _circles(_graph()) if c not in ALLOWED_CIRCLES]
    assert circles == [], f"import circles: {[sorted(c) for c in circles]}"


def test_the_package_never_imports_the_code_generators():
    users = sorted(
        m
        for m, deps in _graph().items()
        if any(
            _under(d, "codegen")
            or _under(d, "tools")
            or d.endswith(("codegen", "ctlgen", "docgen"))
            for d in deps
        )
    )
    assert users == [], f"tools/codegen/ is a build tool, not the package: {users}"
    assert not list(PKG.rglob("*gen.py")), "a generator inside the package"


def test_the_graph_sees_what_it_judges():
    # the checks above pass on an empty graph too: it must hold the modules and edges
    graph = _graph()
    assert "duckpipe._abi.shm" in graph and "duckpipe.cli" in graph
    assert "duckpipe._native" in graph["duckpipe._abi"]
    assert "duckpipe._abi.shm" in graph["duckpipe.mock.dataplane"]
    assert "duckpipe.launch.binaries" in graph["duckpipe.cli"]  # a lazy import, inside a function
    assert "duckpipe.client.weights" not in graph["duckpipe.client.session"]  # TYPE_CHECKING only
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
