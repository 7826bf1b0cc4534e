"""Where the client reads its ZeroMQ completions: in batches when forwards are released,
after their results, never between a submit and its result while forwards are released;
at a submit only when nobody releases them. Either way nothing is lost and the records of
completed forwards do not pile up."""

from __future__ import annotations

import numpy as np
import pytest

from duckpipe import GeluMlp
from duckpipe.client import session as session_mod

HIDDEN, FFN = 32, 48


class _Where:
    """The phase of the test's loop (submit, release or other) at each ZeroMQ read."""

    def __init__(self, monkeypatch) -> None:
        self.now = "other"
        self.calls: list[str] = []
        real = session_mod.Session.pump

        def pump(session, timeout_s):
            self.calls.append(self.now)
            return real(session, timeout_s)

        monkeypatch.setattr(session_mod.Session, "pump", pump)


@pytest.fixture
def layer(client):
    client.load_weights(51, GeluMlp.random(HIDDEN, FFN, seed=51), ducks=[0, 1])
    return 51


def test_completions_are_read_when_forwards_are_released_not_when_submitted(
    client, layer, monkeypatch
):
    where = _Where(monkeypatch)
    x = np.ones((1, HIDDEN), np.float32)
    n = 5 * session_mod._PUMP_EVERY
    for _ in range(n):
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            where.now = "submit"
            fwd = client.submit(slot, layer)
            where.now = "other"
        fwd.result(timeout=10)
        where.now = "release"
        fwd.release()
        where.now = "other"
    assert "submit" not in where.calls, where.calls
    assert where.calls.count("release") >= 4, where.calls
    # completed forwards do not pile up waiting for their completions
    assert len(client._session.inflight) <= 2 * session_mod._PUMP_EVERY + 8


def test_a_client_that_never_releases_has_them_read_at_submit(client, layer, monkeypatch):
    where = _Where(monkeypatch)
    x = np.ones((1, HIDDEN), np.float32)
    n = 3 * session_mod._PUMP_AT_SUBMIT
    kept = []
    for _ in range(n):
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            where.now = "submit"
            fwd = client.submit(slot, layer)
            where.now = "other"
        kept.append(fwd.result(timeout=10).copy())
        del fwd  # dropped, never released by hand: the finalizer frees the slot
    assert where.calls.count("submit") >= 2, where.calls
    assert len(client._session.inflight) <= session_mod._PUMP_AT_SUBMIT + 8
    assert len(kept) == n
