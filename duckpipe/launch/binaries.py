"""Finding the C programs: the dataplane, the duck emulator and the bench helpers.

``pip install .`` (meson-python, meson.build) installs them inside the package, in
``duckpipe/bin/``; an editable install serves that directory from its build tree (rebuilt
on import). A checkout's C-only meson build dir ``dataplane/build/`` (tools/setup) holds them
at its top.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import resources
from pathlib import Path

from ..errors import DuckpipeError

__all__ = ["BUILD_DIR", "find_binary", "packaged_binary"]

BUILD_DIR = Path(__file__).resolve().parents[2] / "dataplane" / "build"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def packaged_binary(name: str) -> Path | None:
    """``name`` as installed with the package (``duckpipe/bin/name``), if it is there."""
    path = resources.files("duckpipe") / "bin" / name
    # a plain Path both in an installed wheel and in meson-python's editable build tree
    if isinstance(path, Path) and _executable(path):
        return path
    return None


def find_binary(name: str, *, search_path: bool = True) -> Path:
    """``$DUCKPIPE_BIN_DIR/name``, else the package's own (``duckpipe/bin/name``), else
    ``dataplane/build/name`` of a checkout (its C-only meson build), else PATH."""
    env = os.environ.get("DUCKPIPE_BIN_DIR")
    if env and _executable(Path(env) / name):
        return Path(env) / name
    packaged = packaged_binary(name)
    if packaged:
        return packaged
    if _executable(BUILD_DIR / name):
        return BUILD_DIR / name
    found = shutil.which(name) if search_path else None
    if found:
        return Path(found)
    raise DuckpipeError(
        f"{name} is not built; `pip install .` builds it into the package (meson-python), "
        "`meson setup dataplane/build -Dpython_module=false && meson compile -C dataplane/build` "
        "into dataplane/build (tools/setup does both), "
        "or point DUCKPIPE_BIN_DIR at a directory holding it"
    )


def _exec(name: str) -> None:
    """Replace this process with the program (console scripts: the programs on PATH)."""
    try:
        # not PATH: the console script of the same name is on it
        path = find_binary(name, search_path=False)
    except DuckpipeError as e:
        sys.exit(f"{name}: {e}")
    os.execv(path, [str(path), *sys.argv[1:]])


def dataplane_main() -> None:
    """``duckpipe-dataplane``: the C dataplane installed with the package."""
    _exec("duckpipe-dataplane")


def ducks_main() -> None:
    """``duckpipe-ducks``: the C duck emulator installed with the package."""
    _exec("duckpipe-ducks")
