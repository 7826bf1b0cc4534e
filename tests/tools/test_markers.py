"""The markers that say what a test needs (tests/conftest.py): `dataplane` follows from a
test's fixtures and parameters, and --check-dataplane-mark fails a test that starts the C
programs without it (the sanitizer passes select by that mark)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

INNER_TESTS = """
import subprocess

import pytest

from duckpipe.launch.binaries import find_binary


def _backends():
    subprocess.run([str(find_binary("duckpipe-dataplane")), "--backends"], check=True)


def test_unmarked_starts_it():
    _backends()


@pytest.mark.dataplane
def test_marked_starts_it():
    _backends()


def test_starts_nothing():
    pass


@pytest.fixture(params=["mock", "real"])
def which(request):
    return request.param


def test_by_parameter(which):
    pass


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_by_parametrize(kind):
    pass


def test_by_fixture(duckpipe_cluster_factory):
    pass
"""


def _suite(tmp_path: Path) -> Path:
    """A directory with this suite's conftest and markers, and INNER_TESTS."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = "".join(f"    {m}\n" for m in ini["markers"])
    warnings = "".join(f"    {w}\n" for w in ini["filterwarnings"])
    ini_text = (
        f"[pytest]\naddopts = --strict-markers\nmarkers =\n{markers}filterwarnings =\n{warnings}"
    )
    (tmp_path / "pytest.ini").write_text(ini_text)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    return tmp_path


def _pytest(suite: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_mark_follows_real_parameters_and_the_c_program_fixtures(tmp_path):
    r = _pytest(_suite(tmp_path), "--collect-only", "-m", "dataplane")
    assert r.returncode == 0, r.stdout + r.stderr
    selected = {line.split("::", 1)[1] for line in r.stdout.splitlines() if "::" in line}
    assert selected == {
        "test_marked_starts_it",
        "test_by_parameter[real]",
        "test_by_parametrize[real]",
        "test_by_fixture",
    }


@pytest.mark.dataplane  # its inner suite starts duckpipe-dataplane --backends
def test_a_test_that_starts_the_c_programs_unmarked_fails_naming_itself(tmp_path):
    try:
        find_binary("duckpipe-dataplane")
    except DuckpipeError as e:
        pytest.skip(str(e))
    suite = _suite(tmp_path)
    r = _pytest(suite, "--check-dataplane-mark", "-k", "starts")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    # the unmarked test's own checks pass; its teardown fails it, and only it
    errors = [line for line in out.splitlines() if line.startswith(("ERROR", "FAILED"))]
    assert len(errors) == 1 and "test_inner.py::test_unmarked_starts_it" in errors[0], out
    assert "test_inner.py::test_unmarked_starts_it started the C programs" in out, out
    assert "not marked dataplane" in out
    # without the option nothing is watched (and nothing fails)
    r = _pytest(suite, "-k", "starts")
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
