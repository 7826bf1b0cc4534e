"""Shared fixtures. ``dataplane`` is parametrized so that the same client tests run
against both implementations: the shm-only mock and the C dataplane with emulated
ducks on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import duckpipe
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.testing import assert_clean_exit, cluster_class_or_skip

DUCKS = 24


@pytest.fixture(scope="module", params=["mock", "real"])
def dataplane(request) -> Iterator:
    """A running dataplane with 24 ducks, shared by a test module."""
    if request.param == "mock":
        with MockDataplaneProcess(ducks=DUCKS) as dp:
            yield dp
        return
    cluster = cluster_class_or_skip()(DUCKS, default_timeout_ms=2000).start()
    try:
        yield cluster
    finally:
        assert_clean_exit(cluster)


@pytest.fixture
def client(dataplane) -> Iterator[duckpipe.Client]:
    with duckpipe.connect(dataplane.control, name="pytest") as c:
        yield c
