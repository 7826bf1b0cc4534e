"""A weight load that cannot finish: refused at once when the dataplane knows the ducks
are dead, else failed (naming every duck that did not acknowledge), never "still
loading"; and retryable once the ducks are back. Against the mock and the C dataplane."""

from __future__ import annotations

import time

import numpy as np
import pytest

import duckpipe
from duckpipe.client import weights
from duckpipe.errors import DucksUnreachable, LayerFailed
from duckpipe.schema.control import ErrorCode
from duckpipe.testing import set_faults

HIDDEN, FFN = 32, 64


def _wait_alive(client, ducks: set[int], alive: bool, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = {d.id: d.alive for d in client.topology().ducks}
        if all(now[d] == alive for d in ducks):
            return
        time.sleep(0.05)
    raise AssertionError(f"ducks {sorted(ducks)} never became alive={alive}: {now}")


class _Mock:
    """Four mock ducks; 'killing' ducks is the mock's dead_ducks fault."""

    def __init__(self, factory) -> None:
        self.dp = factory(ducks=4)
        self.control = self.dp.control

    def kill(self, ducks: list[int]) -> None:
        set_faults(self.control, dead_ducks=ducks)

    def revive(self) -> None:
        set_faults(self.control)


class _Real:
    """Four emulated ducks in two emulators (ducks 0-1, 2-3) and the C dataplane."""

    def __init__(self, factory) -> None:
        self.cluster = factory(
            4, groups=[(2, []), (2, [])], ping_ms=100, weight_timeout_ms=400, weight_rto_us=20_000
        )
        self.control = self.cluster.control

    def kill(self, ducks: list[int]) -> None:
        assert ducks == [2, 3]
        self.cluster.emulators[1].stop()

    def revive(self) -> None:
        from duckpipe.launch.ducks import DucksProcess

        cl = self.cluster
        cl.emulators[1] = DucksProcess(ducks=2, base_port=cl.duck_base + 2, first_id=2).start()


@pytest.fixture(params=["mock", "real"])
def ducks4(request):
    if request.param == "mock":
        return _Mock(request.getfixturevalue("duckpipe_mock_factory"))
    return _Real(request.getfixturevalue("duckpipe_cluster_factory"))


def test_a_load_onto_ducks_known_dead_is_refused_at_once_naming_them(ducks4):
    with duckpipe.connect(ducks4.control) as client:
        _wait_alive(client, {0, 1, 2, 3}, True)
        ducks4.kill([2, 3])
        _wait_alive(client, {2, 3}, False)
        t0 = time.monotonic()
        with pytest.raises(DucksUnreachable, match=r"ducks \[2, 3\] did not answer") as e:
            client.load_weights(0, duckpipe.GeluMlp.random(HIDDEN, FFN))
        assert time.monotonic() - t0 < 1.0
        assert e.value.code == ErrorCode.DUCKS_UNREACHABLE
        assert client.layers() == []  # nothing was loaded, nothing is stuck
        # the live ducks still take a layer
        mlp = duckpipe.GeluMlp.random(HIDDEN, FFN)
        client.load_weights(0, mlp, ducks=[0, 1])
        x = np.ones((2, HIDDEN), np.float32)
        np.testing.assert_allclose(client.forward(0, x), mlp.reference(x), rtol=1e-4, atol=1e-4)


def test_a_load_whose_ducks_die_fails_naming_each_and_is_retryable(ducks4, monkeypatch):
    pieces = weights._pieces

    def die_after_load_weights(*a, **kw):  # the dataplane accepted the plan: ducks die now
        ducks4.kill([2, 3])
        return pieces(*a, **kw)

    mlp = duckpipe.GeluMlp.random(HIDDEN, FFN)
    x = np.ones((2, HIDDEN), np.float32)
    with duckpipe.connect(ducks4.control) as client:
        _wait_alive(client, {0, 1, 2, 3}, True)
        monkeypatch.setattr(weights, "_pieces", die_after_load_weights)
        with pytest.raises(LayerFailed, match=r"ducks \[2, 3\] did not acknowledge") as e:
            client.load_weights(0, mlp)
        monkeypatch.setattr(weights, "_pieces", pieces)
        assert e.value.missing == (2, 3)
        (info,) = client.layers()
        assert info.failed and not info.ready and info.missing == [2, 3]
        for _ in range(2):  # failed, and why: not "still loading"
            with pytest.raises(LayerFailed, match=r"layer 0 failed to load: ducks \[2, 3\]"):
                client.forward(0, x)
        ducks4.revive()
        _wait_alive(client, {2, 3}, True)
        client.load_weights(0, mlp)  # the same id again
        np.testing.assert_allclose(client.forward(0, x), mlp.reference(x), rtol=1e-4, atol=1e-4)
        (info,) = client.layers()
        assert info.ready and not info.failed and info.missing == []
