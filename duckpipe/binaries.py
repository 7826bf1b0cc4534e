"""Finding the C programs: the dataplane and the duck emulator."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import DuckpipeError

__all__ = ["BUILD_DIR", "find_binary"]

BUILD_DIR = Path(__file__).resolve().parent.parent / "dataplane" / "build"


def find_binary(name: str) -> Path:
    """``$DUCKPIPE_BIN_DIR/name``, else ``dataplane/build/name`` beside the package, else PATH."""
    env = os.environ.get("DUCKPIPE_BIN_DIR")
    candidates = [Path(env) / name] if env else []
    candidates.append(BUILD_DIR / name)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return Path(found)
    raise DuckpipeError(
        f"{name} is not built; build it with `make -C dataplane` (tools/setup does), "
        "or point DUCKPIPE_BIN_DIR at a directory holding it"
    )
