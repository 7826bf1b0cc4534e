"""Finding the C programs: the dataplane, the duck emulator and the bench helpers.

``pip install .`` (meson-python, meson.build) installs them inside the package, in
``duckpipe/bin/``; an editable install serves that directory from its build tree (rebuilt
on import). A checkout's C-only meson build dir ``dataplane/build/`` (tools/setup) holds them
at its top.
"""

from __future__ import annotations

import os
import shutil
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


#: what pip writes into this package's console scripts of a C program's name: duckpipe.cli's
#: ``dataplane_main`` and ``ducks_main`` (and, in a venv installed before they moved there,
#: duckpipe.launch.binaries')
_CONSOLE_SCRIPT_MODULES = (b"duckpipe.cli", b"duckpipe.launch.binaries")


def _is_console_script(path: Path) -> bool:
    """One of this package's own programs on PATH (``dataplane_main``, ``ducks_main``):
    Python that runs the C program, never the C program itself."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return head.startswith(b"#!") and any(m in head for m in _CONSOLE_SCRIPT_MODULES)


def _on_path(name: str) -> Path | None:
    """``name`` on PATH, passing over this package's console scripts of that name: running
    one of those in place of the C program would start the console script again."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which(name, path=directory or ".")
        if found and not _is_console_script(Path(found)):
            return Path(found)
    return None


def find_binary(name: str, *, search_path: bool = True) -> Path:
    """``$DUCKPIPE_BIN_DIR/name``, else the package's own (``duckpipe/bin/name``), else
    ``dataplane/build/name`` of a checkout (its C-only meson build), else PATH (where this
    package's console scripts of the same name do not count)."""
    env = os.environ.get("DUCKPIPE_BIN_DIR")
    if env and _executable(Path(env) / name):
        return Path(env) / name
    packaged = packaged_binary(name)
    if packaged:
        return packaged
    if _executable(BUILD_DIR / name):
        return BUILD_DIR / name
    found = _on_path(name) if search_path else None
    if found:
        return found
    raise DuckpipeError(
        f"{name} is not built; `pip install .` builds it into the package (meson-python), "
        "`meson setup dataplane/build -Dpython_module=false && meson compile -C dataplane/build` "
        "into dataplane/build (tools/setup does both), "
        "or point DUCKPIPE_BIN_DIR at a directory holding it"
    )
