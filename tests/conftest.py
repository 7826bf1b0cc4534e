"""Shared fixtures. ``dataplane`` is parametrized so that the same client tests run
against both implementations: the shm-only mock and the C dataplane with emulated
ducks on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import duckpipe
from duckpipe.errors import DuckpipeError
from duckpipe.mock.process import MockDataplaneProcess

DUCKS = 24
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def real_cluster_or_skip():
    """Import the cluster pieces, or skip saying exactly what is missing."""
    from duckpipe.binaries import find_binary

    try:
        find_binary("duckpipe-dataplane")
        find_binary("duckpipe-ducks")
    except DuckpipeError as e:
        pytest.skip(str(e))
    from duckpipe.cluster import Cluster

    return Cluster


def check_clean_exit(cluster) -> None:
    """A dataplane that crashed or tripped a sanitizer fails the tests that used it."""
    code = cluster.stop()
    out = cluster.output()
    cluster.close()
    bad = [m for m in SANITIZER_MARKS if m in out]
    assert code == 0 and not bad, f"dataplane exited {code}; {bad}:\n{out[-4000:]}"


@pytest.fixture(scope="module", params=["mock", "real"])
def dataplane(request) -> Iterator:
    """A running dataplane with 24 ducks, shared by a test module."""
    if request.param == "mock":
        with MockDataplaneProcess(ducks=DUCKS) as dp:
            yield dp
        return
    Cluster = real_cluster_or_skip()
    cluster = Cluster(DUCKS, default_timeout_ms=2000).start()
    try:
        yield cluster
    finally:
        check_clean_exit(cluster)


@pytest.fixture
def client(dataplane) -> Iterator[duckpipe.Client]:
    with duckpipe.connect(dataplane.control, name="pytest") as c:
        yield c
