"""No test starts a program on the default ports (issue 27, point 12).

A user's dataplane on this machine holds 47000 (and its ducks 47100..) as any user's
would: a test that started the C dataplane there failed for the port, before it reached
what it meant to test. Tests take free ports (the ``free_loopback`` fixture,
``free_udp_ports``, ``Cluster``); one that checks the defaults runs them in a network
namespace of its own. This reads the test tree: cheap, and it names the line.
"""

from __future__ import annotations

import ast
from pathlib import Path

from duckpipe.launch.topology import DEFAULT_DUCK_PORT, DEFAULT_HOST_PORT
from duckpipe.schema.abi import MAX_DUCKS

TESTS = Path(__file__).resolve().parents[1]
DEFAULTS = {DEFAULT_HOST_PORT, *range(DEFAULT_DUCK_PORT, DEFAULT_DUCK_PORT + MAX_DUCKS)}
# the ports a program binds: a dataplane's host port, the emulator's first duck (a
# topology's duck ports are where the dataplane sends: nothing binds them for it)
PORT_KEYWORDS = {"host_port", "base_port"}


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)


def _defaults_used(call: ast.Call) -> str | None:
    """Why this call would start something on the default ports, or None."""
    kws = {k.arg: k.value for k in call.keywords}
    name = _name(call)
    if name == "DataplaneProcess":
        topo = call.args[0] if call.args else kws.get("topology")
        if topo is None:
            return "DataplaneProcess without a topology (loopback() on 47000)"
        if (
            isinstance(topo, ast.Call)
            and _name(topo) == "loopback"
            and "host_port" not in {k.arg for k in topo.keywords}
        ):
            return "DataplaneProcess(loopback(...)) without host_port (47000)"
    if name == "DucksProcess" and "base_port" not in kws:
        return "DucksProcess without base_port (47100..)"
    for k in call.keywords:
        if (
            k.arg in PORT_KEYWORDS
            and isinstance(k.value, ast.Constant)
            and k.value.value in DEFAULTS
        ):
            return f"{name}({k.arg}={k.value.value}): a default port"
    return None


def test_no_test_starts_a_program_on_the_default_ports():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and (why := _defaults_used(node)):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {why}")
    assert not found, (
        "tests on the default ports fail where a user's dataplane runs; take free ones "
        "(the free_loopback fixture, free_udp_ports):\n" + "\n".join(found)
    )


def test_the_check_sees_each_way_of_using_the_defaults():
    def why(src: str) -> str | None:
        return _defaults_used(ast.parse(src).body[0].value)

    assert why("DataplaneProcess(control=c)")
    assert why("DataplaneProcess(loopback(2), binary=b)")
    assert why("DucksProcess(ducks=2)")
    assert why("Nic(name='lo', host_port=47000)")
    assert why("DucksProcess(ducks=2, base_port=47100)")
    assert not why("DataplaneProcess(free_loopback(), binary=b)")
    assert not why("DataplaneProcess(loopback(2, host_port=base, duck_port=base + 1))")
    assert not why("DucksProcess(ducks=2, base_port=base)")
