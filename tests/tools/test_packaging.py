"""Packaging: `pip wheel .` builds the cffi module and the C programs into the wheel, and a
fresh venv with only that wheel (and its dependencies) runs them; every C file of dataplane/
is in one of meson's lists (the one build)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATAPLANE = ROOT / "dataplane"


def _in_a_build_dir(path: Path) -> bool:
    """dataplane/build*/ and the like: meson's own files (meson-private/sanitycheckc.c)."""
    return any((parent / "meson-private").is_dir() for parent in path.parents)


def test_every_c_file_of_the_dataplane_is_in_a_meson_list():
    # meson lists sources by name (no globbing): a program's file left out fails at link
    # time, far from the cause; a C unit test or fuzz harness left out never runs at all.
    listed = set()
    for build_file in DATAPLANE.rglob("meson.build"):
        if _in_a_build_dir(build_file):
            continue
        for name in re.findall(r"'([\w./-]+\.c)'", build_file.read_text()):
            listed.add((build_file.parent / name).resolve().relative_to(DATAPLANE).as_posix())
    on_disk = {
        p.relative_to(DATAPLANE).as_posix()
        for p in DATAPLANE.rglob("*.c")
        if not _in_a_build_dir(p)
    }
    unlisted, gone = sorted(on_disk - listed), sorted(listed - on_disk)
    assert not unlisted, f"in no list of dataplane/**/meson.build: {unlisted}"
    assert not gone, f"listed in meson.build, gone from disk: {gone}"


def _run(argv: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, (
        f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return r


@pytest.mark.slow  # 27-37 s: builds a wheel
def test_wheel_installs_into_a_fresh_venv_with_its_programs(tmp_path):
    if (
        shutil.which("pkg-config") is None
        or subprocess.run(["pkg-config", "--exists", "libzmq", "msgpack"], check=False).returncode
    ):
        pytest.skip(
            "pkg-config, libzmq or msgpack missing: "
            "apt-get install pkg-config libzmq3-dev libmsgpack-dev"
        )
    # Neither a sanitizer build (DUCKPIPE_BIN_DIR) nor the checkout may stand in for the wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("DUCKPIPE_BIN_DIR", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    # `pip wheel .` as a user runs it: build isolation, so build-system.requires is complete
    # (meson-python, meson, ninja, cffi: from pip's cache or PyPI).
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("duckpipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("duckpipe-dataplane", "duckpipe-ducks", "duckpipe-floor"):
        assert f"duckpipe/bin/{name}" in names
    assert any(re.fullmatch(r"duckpipe/_native\..*\.so", n) for n in names)
    assert not [n for n in names if "__pycache__" in n], (
        "meson.build: exclude the new package's __pycache__"
    )
    tracked = subprocess.run(
        ["git", "ls-files", "duckpipe"], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode == 0:
        modules = {n for n in tracked.stdout.split() if n.endswith(".py")} - {
            "duckpipe/_native_build.py"
        }
        assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, env=env)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", str(wheel)], timeout=600, env=env, cwd=tmp_path)

    # the programs on the venv's PATH (console scripts that exec the package's own)
    r = _run(
        [str(venv / "bin" / "duckpipe-dataplane"), "--backends"], timeout=60, env=env, cwd=tmp_path
    )
    assert "socket" in r.stdout.split()
    r = _run([str(venv / "bin" / "duckpipe-ducks"), "--help"], timeout=60, env=env, cwd=tmp_path)
    assert "duckpipe-ducks" in r.stdout

    # duckpipe.launch.binaries of the installed package finds them inside that package
    r = _run(
        [
            str(py),
            "-c",
            (
                "import duckpipe, duckpipe._native\n"
                "from duckpipe.launch.binaries import find_binary\n"
                "print(duckpipe.__file__)\n"
                "print(find_binary('duckpipe-dataplane'))\n"
                "print(find_binary('duckpipe-ducks'))\n"
            ),
        ],
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    init, dataplane, ducks = (Path(line) for line in r.stdout.split())
    package = init.parent
    assert package.is_relative_to(venv), f"imported {init}, not the venv's"
    assert dataplane == package / "bin" / "duckpipe-dataplane"
    assert ducks == package / "bin" / "duckpipe-ducks"

    # `duckpipe bench` run from the wheel records the commit the wheel was built from
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    r = _run([str(py), "-c", "from duckpipe.bench.common import machine_facts\n"
              "print(machine_facts('none')['git_commit'])"],
             timeout=60, env=env, cwd=tmp_path)  # fmt: skip
    if head.returncode == 0:
        assert r.stdout.strip() == (
            f"{head.stdout.strip()} (the commit the installed package was built from)"
        )
    else:  # a tree from an sdist: it says so, never a blank
        assert r.stdout.startswith("not a git checkout")


# ------------------------------------------ editable installs (issue 17, 15)


def _build_backend():
    """tools/pep517/duckpipe_build_backend.py, the backend pyproject.toml names."""
    import importlib.util

    path = ROOT / "tools" / "pep517" / "duckpipe_build_backend.py"
    spec = importlib.util.spec_from_file_location("duckpipe_build_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_backend_is_the_one_that_checks_editable_builds():
    import tomllib

    system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert system["build-backend"] == "duckpipe_build_backend"
    assert (ROOT / system["backend-path"][0] / "duckpipe_build_backend.py").is_file()


def test_an_editable_build_knows_tools_its_installer_will_delete():
    backend = _build_backend()
    pip_env = "/tmp/pip-build-env-r_3iqxw7/overlay/bin"
    assert backend.temporary_tools(f"{pip_env}/ninja", f"{pip_env}/meson", "/work/.venv") == {
        "ninja": f"{pip_env}/ninja",
        "meson": f"{pip_env}/meson",
    }
    uv_env = "/root/.cache/uv/builds-v0/.tmpAbC123"  # uv builds in a venv of its own
    assert set(backend.temporary_tools(f"{uv_env}/bin/ninja", None, uv_env)) == {
        "ninja",
        "the build's Python environment",
    }
    # a venv of one's own, even under /tmp, and the system's ninja stay
    assert backend.temporary_tools("/tmp/x/venv/bin/ninja", "/usr/bin/meson", "/tmp/x/venv") == {}


@pytest.mark.slow  # 60-90 s: builds the C programs in a fresh venv
def test_editable_install_under_build_isolation_refuses_and_says_the_command_that_works(
    tmp_path,
):
    import shlex

    if (
        not shutil.which("pkg-config")
        or subprocess.run(["pkg-config", "--exists", "libzmq", "msgpack"], check=False).returncode
    ):
        pytest.skip("pkg-config, libzmq or msgpack missing: apt-get install pkg-config "
                    "libzmq3-dev libmsgpack-dev")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DUCKPIPE_BIN_DIR", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    # every Python developer's habit: pip builds in a temporary environment it deletes
    # after the build; the editable install would have called that environment's ninja on
    # the first import (FileNotFoundError: .../pip-build-env-.../ninja)
    r = subprocess.run([*pip, "install", "-e", str(ROOT)], capture_output=True, text=True,
                       timeout=600, env=env, cwd=ROOT)  # fmt: skip
    assert r.returncode != 0, "an editable install under build isolation was built"
    out = r.stdout + r.stderr
    fix = _build_backend().FIX
    assert fix in out and "pip-build-env-" in out, out[-3000:]
    # the command it printed, as printed, but building outside the checkout's build/cp311
    # (the developer's own editable install builds there)
    tools, editable = (shlex.split(part) for part in fix.split("&&"))
    assert tools[0] == editable[0] == "pip"
    _run([*pip, *tools[1:]], timeout=600, env=env, cwd=ROOT)
    build_dir = tmp_path / "editable-build"
    _run([*pip, *editable[1:], f"-Cbuild-dir={build_dir}"], timeout=900, env=env, cwd=ROOT)
    r = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import duckpipe, duckpipe._native\n"
            "from duckpipe.launch.binaries import packaged_binary\n"
            "print(duckpipe.__file__)\nprint(packaged_binary('duckpipe-dataplane'))\n",
        ],
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    init, dataplane = r.stdout.split()
    assert Path(init) == ROOT / "duckpipe" / "__init__.py"  # the checkout itself: editable
    assert Path(dataplane).is_relative_to(build_dir)
