"""Shared fixtures, and the markers that say what a test needs (tests/README.md).

``dataplane`` is parametrized so that the same client tests run against both
implementations: the shm-only mock and the C dataplane with emulated ducks on loopback.

A test is marked ``dataplane`` (it starts the C programs; the sanitizer passes of
tools/setup select ``-m dataplane``) when any of its parameters is ``"real"`` (the suite's
name for the C dataplane, as in the ``dataplane`` fixture), when it uses one of
``C_PROGRAM_FIXTURES`` (directly or through another fixture), or when it says so itself
(``@pytest.mark.dataplane``, or a module's ``pytestmark``). ``--check-dataplane-mark``
checks that at run time: every start of duckpipe-dataplane or duckpipe-ducks goes through
a wrapper that names the running test, and a test that started one without the mark fails.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import duckpipe
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import BUILD_DIR, find_binary
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.testing import assert_clean_exit, cluster_class_or_skip

DUCKS = 24

# the duckpipe pytest plugin's fixtures that start the C dataplane (duckpipe.testing)
C_PROGRAM_FIXTURES = {"duckpipe_cluster_factory", "duckpipe_null_factory"}
# what --check-dataplane-mark watches: the programs the sanitizer passes rebuild
C_PROGRAMS = ("duckpipe-dataplane", "duckpipe-ducks")
STARTS_LOG = "DUCKPIPE_TEST_STARTS_LOG"


@pytest.fixture(scope="module", params=["mock", "real"])
def dataplane(request) -> Iterator:
    """A running dataplane with 24 ducks, shared by a test module."""
    if request.param == "mock":
        with MockDataplaneProcess(ducks=DUCKS) as dp:
            yield dp
        return
    cluster = cluster_class_or_skip()(DUCKS, default_timeout_ms=2000).start()
    try:
        yield cluster
    finally:
        assert_clean_exit(cluster)


@pytest.fixture
def free_loopback():
    """``free_loopback(ducks=2, **settings)``: a loopback topology on ports that were free
    when asked, for a test that starts the C dataplane itself. Never the default ones
    (47000, 47100..): a user's dataplane and ducks on this machine may hold them."""
    from duckpipe.launch.cluster import free_udp_ports
    from duckpipe.launch.topology import loopback

    def make(ducks: int = 2, **settings):
        base = free_udp_ports(ducks + 1)
        return loopback(ducks, host_port=base, duck_port=base + 1, **settings)

    return make


@pytest.fixture
def client(dataplane) -> Iterator[duckpipe.Client]:
    with duckpipe.connect(dataplane.control, name="pytest") as c:
        yield c


def starts_c_programs(item: pytest.Item) -> bool:
    """Whether ``item`` starts the C dataplane or the duck emulator, from how it is built."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(
        isinstance(value, str) and value == "real" for value in callspec.params.values()
    ):
        return True
    return not C_PROGRAM_FIXTURES.isdisjoint(item.fixturenames)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if starts_c_programs(item) and item.get_closest_marker("dataplane") is None:
            item.add_marker(pytest.mark.dataplane)


# --- --check-dataplane-mark -------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--check-dataplane-mark",
        action="store_true",
        help="fail a test that starts duckpipe-dataplane or duckpipe-ducks without the "
        "dataplane mark (the programs run through wrappers that name the test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # the build dir the run was pointed at, before --check-dataplane-mark points
    # DUCKPIPE_BIN_DIR at its wrappers: c_test_program's programs are there
    config.stash[_bin_dir_key] = os.environ.get("DUCKPIPE_BIN_DIR") or None
    # before collection: some modules look their programs up at import
    if not config.getoption("--check-dataplane-mark"):
        return
    # pytest-xdist (-n): the workers run the tests, each with wrappers and a log of its
    # own; the controller runs none, and its environment is what they start with
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    wrappers = Path(tempfile.mkdtemp(prefix="duckpipe-mark-check-"))
    log = wrappers / "starts.log"
    log.touch()
    for name in C_PROGRAMS:
        try:
            real = find_binary(name)
        except DuckpipeError:
            continue  # not built: the tests that need it skip
        script = wrappers / name
        # the test's id is in the environment of everything it starts (pytest sets it)
        script.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "${{PYTEST_CURRENT_TEST:-?}}" >> "${STARTS_LOG}"\n'
            f'exec {shlex.quote(str(real))} "$@"\n'
        )
        script.chmod(0o755)
    os.environ["DUCKPIPE_BIN_DIR"] = str(wrappers)
    os.environ[STARTS_LOG] = str(log)
    # the log to check, from this run's option: a pytest started by a test inherits the
    # environment, not the option
    config.stash[_starts_log_key] = log


def pytest_unconfigure(config: pytest.Config) -> None:
    log = config.stash.get(_starts_log_key, None)
    if log is not None:
        shutil.rmtree(log.parent, ignore_errors=True)


_starts_log_key = pytest.StashKey[Path]()
_bin_dir_key = pytest.StashKey["str | None"]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    log = item.config.stash.get(_starts_log_key, None)
    if log is not None and item.get_closest_marker("dataplane") is None:
        # PYTEST_CURRENT_TEST is "<nodeid> (<phase>)"
        lines = log.read_text().splitlines()
        started = [line for line in lines if line.startswith(item.nodeid + " ")]
        if started:
            pytest.fail(
                f"{item.nodeid} started the C programs ({len(started)} times, first in "
                f"{started[0].rsplit(' ', 1)[-1]}) but is not marked dataplane, so the "
                "sanitizer passes leave it out: use a dataplane fixture or add "
                "@pytest.mark.dataplane (tests/README.md)",
                pytrace=False,
            )
    return result


# --- the C programs of the pytest files ---------------------------------------------------


def _build_tool(name: str) -> str | None:
    """``name`` (ninja) from this venv, as tools/setup's builds use it, else from PATH."""
    venv = Path(sys.executable).parent / name
    return str(venv) if venv.is_file() else shutil.which(name)


@pytest.fixture(scope="session")
def c_test_program(pytestconfig: pytest.Config) -> Callable[[str], Path]:
    """``c_test_program(name)``: a program or LD_PRELOAD shim of dataplane/tests/meson.build
    (``ctl_decode``, ``no_epoll_pwait2.so``, ...), in ``dataplane/tests/`` of the build dir
    that DUCKPIPE_BIN_DIR names (a sanitizer build's, say) or else of ``dataplane/build``.

    It is brought up to date first (ninja, as ``meson test`` does for the C unit tests), so
    a test never runs a stale one after its C changed; a compile error fails the test with
    the compiler's words, and a build dir without the program fails it with the command
    that builds one."""
    configured = pytestconfig.stash.get(_bin_dir_key, None)
    build = Path(configured) if configured else BUILD_DIR
    setup = (
        f"`meson setup {build} -Dpython_module=false -Dwerror=true` (or `meson setup "
        f"--reconfigure` there), then `meson compile -C {build}`; tools/setup env makes "
        "dataplane/build"
    )

    def find(name: str) -> Path:
        target = f"dataplane/tests/{name}"
        ninja = _build_tool("ninja")
        if (build / "build.ninja").is_file() and ninja:
            r = subprocess.run(
                [ninja, "-C", str(build), target], capture_output=True, text=True, timeout=600
            )
            # an unknown target: a build dir configured before the program was listed, or
            # without DPDK; said below
            if r.returncode != 0 and "unknown target" not in r.stderr:
                pytest.fail(
                    f"building {target} in {build} failed:\n{r.stdout[-4000:]}{r.stderr[-2000:]}",
                    pytrace=False,
                )
        program = build / target
        if not program.is_file():
            # trace_port_stats.so wraps ethdev's calls: a build with DPDK only
            dpdk = " with libdpdk found" if name == "trace_port_stats.so" else ""
            pytest.fail(
                f"{program} is not built (dataplane/tests/meson.build builds it{dpdk}): {setup}",
                pytrace=False,
            )
        return program

    return find
