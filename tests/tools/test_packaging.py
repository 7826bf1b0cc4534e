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
    # a driver that a pytest compiles itself, beside the sources it checks, so that the
    # check runs without any build dir: tests/hostile/test_desc_verdicts.py
    on_disk -= {"fuzz/desc_verdicts.c"}
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
