"""The C side in Python: the one wrapper over the cffi module ``duckpipe._native``.

As pyzmq's backend sits under its sugar, this sits under the client and the mock
dataplane alike: ``ffi`` and ``lib`` (built by ``_native_build.py`` from the dataplane's
own headers), the helper that turns a C check's reason into an exception, and the
shared-memory primitives both sides need: ``shm`` (a segment: create, attach, validate,
list), ``ring`` (the submission ring, descriptors) and ``rules`` (the control plane's:
attach admission, LoadWeights bounds, weight bytes, quota). Nothing else in duckpipe
imports ``_native`` (tests/tools/test_python_seams.py holds it to that).
"""

from __future__ import annotations

from .._native import ffi, lib
from ..errors import DuckpipeError

__all__ = ["check", "ffi", "lib", "text"]


def text(chars) -> str:
    """A C string (``char[]`` or ``const char *``) as str; bytes that are not UTF-8 are
    replaced, since a reason may quote what a peer sent."""
    return ffi.string(chars).decode(errors="replace")


def check(rc: int, why, error: type[DuckpipeError] = DuckpipeError) -> None:
    """Raise ``error`` with the reason a C check wrote into ``why`` when it refused (rc != 0)."""
    if rc:
        raise error(text(why))
