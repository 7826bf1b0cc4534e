"""Fixtures shared by the client tests."""

from __future__ import annotations

import pytest

from duckpipe.testing import set_faults


class _Mock:
    """Four mock ducks; 'killing' ducks 2 and 3 is the mock's dead_ducks fault."""

    def __init__(self, factory) -> None:
        self.dp = factory(ducks=4)
        self.control = self.dp.control

    def kill(self) -> None:
        set_faults(self.control, dead_ducks=[2, 3])


class _Real:
    """Four emulated ducks in two emulators (ducks 0-1, 2-3) and the C dataplane."""

    def __init__(self, factory) -> None:
        self.cluster = factory(4, groups=[(2, []), (2, [])], ping_ms=100)
        self.control = self.cluster.control

    def kill(self) -> None:
        self.cluster.emulators[1].stop()


@pytest.fixture(params=["mock", "real"])
def ducks4(request):
    """Four ducks on the mock or the C dataplane; .kill() takes ducks 2 and 3 away (a
    module may define its own, as test_load_failures.py does)."""
    if request.param == "mock":
        return _Mock(request.getfixturevalue("duckpipe_mock_factory"))
    return _Real(request.getfixturevalue("duckpipe_cluster_factory"))
