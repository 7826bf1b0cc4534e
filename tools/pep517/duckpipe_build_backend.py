"""duckpipe's PEP 517 backend: meson-python's, with one check before an editable build.

An editable install rebuilds the C programs and the cffi module on ``import duckpipe``
with the ninja (and, when a meson.build changed, the meson) that built it, by their
absolute paths. Under build isolation, ``pip install -e .`` (and ``uv pip install -e .``)
builds with tools from a temporary environment that the installer deletes as soon as the
build is done, and the next ``import duckpipe`` fails with ``FileNotFoundError:
.../pip-build-env-.../ninja`` (meson-python's documented limit: "build isolation is
fundamentally incompatible with editable installs"). So an editable build here refuses
to start with such tools and prints the one command that works; wheels (``pip install .``,
``pip wheel .``) are meson-python's own, untouched.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import mesonpy
from mesonpy import (
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)

__all__ = [
    "FIX",
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "temporary_tools",
]

#: the build dependencies (pyproject.toml's build-system.requires) into the environment
#: itself, then the editable install built with them: they stay for every later rebuild
#: (one line: docs/contributing.md shows it, and its test finds it here as it is)
FIX = "pip install 'meson-python>=0.17' 'meson>=1.2' ninja 'cffi>=1.16' && pip install --no-build-isolation -e ."  # noqa: E501


def _in_temporary_build_env(path: str) -> bool:
    """A path inside an isolated build environment its installer deletes after the build:
    pip's ``$TMPDIR/pip-build-env-*``, uv's ``<cache>/builds-v0/.tmp*``."""
    parts = Path(path).parts
    return any(p.startswith("pip-build-env-") for p in parts) or "builds-v0" in parts


def temporary_tools(
    ninja: str | None, meson: str | None, prefix: str = sys.prefix
) -> dict[str, str]:
    """The build tools (``name: path``) an editable install would keep calling that live
    in a temporary build environment (empty: the install will keep working)."""
    tools = {"ninja": ninja, "meson": meson, "the build's Python environment": prefix}
    return {name: path for name, path in tools.items() if path and _in_temporary_build_env(path)}


def _refuse_temporary_tools() -> None:
    gone = temporary_tools(os.environ.get("NINJA") or shutil.which("ninja"), shutil.which("meson"))
    if not gone:
        return
    where = ", ".join(f"{name} at {path}" for name, path in gone.items())
    print(
        "\nduckpipe: an editable install cannot be built with build isolation: it rebuilds "
        f"the C programs on every `import duckpipe` with the build's own tools ({where}), "
        "which the installer deletes when this build ends, and the import would then fail "
        "with FileNotFoundError. Install the build tools into your environment and build "
        f"without isolation, in one command:\n\n    {FIX}\n\n"
        "(tools/setup env does that too; `pip install .` builds a wheel, which needs none of it)\n",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(1)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _refuse_temporary_tools()  # the first hook an installer calls: refuse before building
    return mesonpy.get_requires_for_build_editable(config_settings)


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _refuse_temporary_tools()  # for an installer that skips the hook above
    return mesonpy.build_editable(wheel_directory, config_settings, metadata_directory)
