"""Shared fixtures. ``dataplane`` is parametrized so that the same client tests run
against every dataplane implementation (the mock now; the C dataplane joins it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import duckpipe
from duckpipe.mock.process import MockDataplaneProcess

DUCKS = 24


@pytest.fixture(scope="module", params=["mock"])
def dataplane(request) -> Iterator[MockDataplaneProcess]:
    """A running dataplane with 24 ducks, shared by a test module."""
    with MockDataplaneProcess(ducks=DUCKS) as dp:
        yield dp


@pytest.fixture
def client(dataplane) -> Iterator[duckpipe.Client]:
    with duckpipe.connect(dataplane.control, name="pytest") as c:
        yield c
