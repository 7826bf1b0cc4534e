"""Helpers to test duckpipe clients (importable without pytest), and the pytest plugin.

The plugin's fixtures live in :mod:`duckpipe.testing.plugin` (entry point ``pytest11``,
installed with duckpipe); this module imports pytest only inside the helpers that skip a
test, so ``set_faults``, ``null_backend_result``, ``null_topology`` and the rest work in a
plain script::

    def test_my_model(duckpipe_mock):
        with duckpipe.connect(duckpipe_mock) as client:   # or duckpipe_mock.control
            ...

    def test_my_layer(duckpipe_client):                    # a connected client, closed after
        ...

``duckpipe_mock`` is one mock dataplane with 8 ducks per test module;
``duckpipe_mock_factory(ducks=24, args=[...])`` starts private ones for a test
(faults, crashes) and stops them after it. ``duckpipe_null_factory(ducks=8)``
starts the C dataplane with the ``null`` backend (no ducks, no network: each
duck's partial is the activation itself) and :func:`null_backend_result` says
what a forward through it returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataplaneRefused, DataplaneUnavailable
from ..mock.process import MockDataplaneProcess, control_request
from ..schema import control as ctl

__all__ = [
    "MockDataplaneProcess",
    "assert_clean_exit",
    "cluster_class_or_skip",
    "killed_client_segment",
    "mapped_by",
    "null_backend_result",
    "null_topology",
    "set_faults",
    "wait_until_gone",
]

SANITIZER_MARKS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "runtime error:",
    "WARNING: ThreadSanitizer",
)


def cluster_class_or_skip():
    """``duckpipe.launch.cluster.Cluster``, or a pytest skip naming the C program not built."""
    import pytest  # only ever called inside a test

    from ..errors import DuckpipeError
    from ..launch.binaries import find_binary

    try:
        find_binary("duckpipe-dataplane")
        find_binary("duckpipe-ducks")
    except DuckpipeError as e:
        pytest.skip(str(e))
    from ..launch.cluster import Cluster

    return Cluster


def assert_clean_exit(cluster) -> None:
    """Stop a cluster; fail if its dataplane crashed or a sanitizer reported anything."""
    code = cluster.stop()
    out = cluster.output()
    cluster.close()
    bad = [m for m in SANITIZER_MARKS if m in out]
    assert code == 0 and not bad, f"dataplane exited {code}; {bad}:\n{out[-4000:]}"


def set_faults(
    control: str,
    *,
    delay_ms: float = 0.0,
    dead_ducks: Sequence[int] = (),
    crash_after: int | None = None,
    restarted_ducks: Sequence[int] = (),
    silent_ducks: Sequence[int] = (),
) -> None:
    """Change a running mock dataplane's fault knobs (replacing the previous ones);
    ``restarted_ducks`` forget every layer they hold now, once (a duck's restart)."""
    msg = ctl.SetFaults(
        req_id=1,
        delay_ms=delay_ms,
        dead_ducks=list(dead_ducks),
        crash_after=crash_after,
        restarted_ducks=list(restarted_ducks),
        silent_ducks=list(silent_ducks),
    )
    reply = control_request(control, msg, 5.0)
    if reply is None:
        raise DataplaneUnavailable(f"no dataplane answered at {control}")
    if isinstance(reply, ctl.Error):
        raise DataplaneRefused(reply.code, reply.message)


def killed_client_segment(control: str, timeout: float = 10.0) -> str:
    """Attach a client in a child process, SIGKILL it, return its segment's memfd name."""
    script = (
        "import time, duckpipe\n"
        f"c = duckpipe.connect({control!r})\n"
        "print(c.segment_name, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        name = child.stdout.readline().strip()
        assert name and mapped_by(name), "the child client did not attach"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout)
    return name


def mapped_by(name: str) -> list[int]:
    """Pids of this user's processes that map the memfd segment ``name``."""
    needle = f"/memfd:{name} "
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "maps").read_text():
                pids.append(int(proc.name))
        except OSError:
            continue  # gone, or not ours
    return pids


def wait_until_gone(name: str, timeout: float = 10.0) -> bool:
    """True once no process maps the memfd segment ``name`` (its memory is freed)."""
    deadline = time.monotonic() + timeout
    while mapped_by(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not mapped_by(name)


def null_backend_result(x: np.ndarray, ducks: int, b_down: np.ndarray | None = None) -> np.ndarray:
    """What a forward of ``x`` through the ``null`` backend returns, bit for bit.

    Every duck's partial is ``x`` itself, so the dataplane's float32 sum is
    ``ducks * x`` (``ducks``: how many answered: the layer's, or the ``ducks=``
    subset), plus ``b_down``, rounded to x's dtype (bfloat16: by ml_dtypes, to nearest
    even, as the dataplane rounds). Exact whenever every ``k * x`` (k <= ducks) is a
    float32: always for float16 and bfloat16 activations; for float32 ones use values
    with a few significant bits (e.g. multiples of 1/64).
    """
    acc = np.zeros(x.shape, np.float32)
    xf = np.asarray(x, np.float32)
    for _ in range(ducks):
        acc += xf
    if b_down is not None:
        acc += np.asarray(b_down, np.float32)
    return acc.astype(x.dtype)


def null_topology(
    ducks: int = 8, *, nics: int = 1, broadcast: bool = False, mtu: int = 1500, **settings
):
    """A topology of ``ducks`` over ``nics`` NICs with the ``null`` backend: no duck runs
    and nothing is sent; the addresses (loopback, unused) only name the ducks. With
    ``broadcast`` each NIC's FORWARD datagrams go to 127.255.255.255 and reach every duck
    of the NIC, as a subnet broadcast does. ``mtu`` sizes the datagrams the null NIC
    pretends to carry (up to 65535: one chunk per 64 KiB, the handoff without a
    network's per-datagram work)."""
    from ..launch.topology import Duck, Nic, Topology

    port = 47100  # never bound: every duck may share it, as broadcast requires
    per_nic: list[list[Duck]] = [[] for _ in range(nics)]
    for i in range(ducks):
        per_nic[i % nics].append(Duck(id=i, ip=f"127.0.{i // 250}.{1 + i % 250}", port=port))
    return Topology(
        nics=[
            Nic(
                name=f"null{k}",
                backend="null",
                host_ip="127.0.0.1",
                host_port=47000 + k,
                broadcast="127.255.255.255" if broadcast else "",
                mtu=mtu,
                ducks=per_nic[k],
            )
            for k in range(nics)
        ],
        **settings,
    )


# An install made before the plugin had a module of its own names this module as its
# pytest11 entry point: when pytest is running (the only time it is already imported),
# carry the fixtures here too so that such an install keeps them until it is reinstalled.
if sys.modules.get("pytest") is not None:
    from .plugin import (  # noqa: F401
        duckpipe_client,
        duckpipe_cluster_factory,
        duckpipe_mock,
        duckpipe_mock_factory,
        duckpipe_null_factory,
    )
