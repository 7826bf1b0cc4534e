"""Stale slot handles: a Slot outlives its claim, and slots are reused last-in-first-out,
so a write through an old handle would change the next forward's activation. Misuse is
loud: Slot.array raises, submit checks the generation, and the debug mode faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import duckpipe
from duckpipe.errors import BadInput

HIDDEN = 32
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(debug: str | None) -> dict[str, str]:
    # this checkout's duckpipe, whichever one is installed
    env = {k: v for k, v in os.environ.items() if k != "DUCKPIPE_DEBUG_SLOTS"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if debug is not None:
        env["DUCKPIPE_DEBUG_SLOTS"] = debug
    return env


@pytest.fixture
def client(duckpipe_mock):
    with duckpipe.connect(duckpipe_mock, name="stale") as c:
        yield c


def test_slot_array_raises_after_release(client):
    slot = client.claim((1, HIDDEN))
    slot.array[:] = 1
    slot.release()
    with pytest.raises(BadInput, match=r"slot \d+ \(generation \d+\) was released; .*stale"):
        slot.array  # noqa: B018


def test_slot_array_raises_after_submit(client):
    client.load_weights(1, duckpipe.GeluMlp.random(HIDDEN, 64))
    with client.claim((1, HIDDEN)) as slot:
        slot.array[:] = 1
        fwd = client.submit(slot, 1)
    with pytest.raises(BadInput, match="submitted: the dataplane reads it"):
        slot.array[:] = 2
    fwd.result(timeout=5)
    fwd.release()
    with pytest.raises(BadInput, match="stale"):
        slot.array  # noqa: B018


def test_a_stale_handle_cannot_change_the_next_forward(client):
    mlp = duckpipe.GeluMlp.random(HIDDEN, 64)
    client.load_weights(1, mlp)
    old = client.claim((1, HIDDEN))
    old.release()
    x = np.full((1, HIDDEN), 0.5, np.float32)
    with client.claim((1, HIDDEN)) as slot:
        assert slot.index == old.index  # LIFO: the same memory
        slot.array[:] = x
        with pytest.raises(BadInput, match="claimed again"):
            old.array[:] = 99  # the write that once changed this forward's result
        with pytest.raises(BadInput, match="not claimed by this client"):
            client.submit(old, 1)  # the generation differs
        fwd = client.submit(slot, 1)
    with fwd:
        np.testing.assert_allclose(fwd.result(timeout=5), mlp.reference(x), rtol=1e-4, atol=1e-4)


SCRIPT = """
import sys, numpy as np, duckpipe
c = duckpipe.connect(sys.argv[1], **eval(sys.argv[2]))
mlp = duckpipe.GeluMlp.random({hidden}, 64)
c.load_weights(1, mlp)                       # weight chunks claim and free slots too
x = np.ones((1, {hidden}), np.float32)
for _ in range(3):                           # claims unprotect, releases protect
    np.testing.assert_allclose(c.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-4)
slot = c.claim((1, {hidden}))
kept = slot.array                            # an array taken from the handle
slot.release()
print("released", flush=True)
kept[:] = 7.0  # STALE WRITE
print("not caught", flush=True)
"""


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_debug_slots_fault_a_stale_write_on_its_line(duckpipe_mock, tmp_path, how):
    script = tmp_path / "stale.py"
    script.write_text(textwrap.dedent(SCRIPT.format(hidden=HIDDEN)))
    kwargs = "{'debug_slots': True}" if how == "argument" else "{}"
    env = _env("1" if how == "environment" else None)
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(script), duckpipe_mock.control, kwargs],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.stdout == "released\n", r.stdout + r.stderr
    assert r.returncode == -signal.SIGSEGV, r.stderr
    line = SCRIPT.splitlines().index("kept[:] = 7.0  # STALE WRITE") + 1  # as written
    assert f'File "{script}", line {line}' in r.stderr, r.stderr


def test_without_debug_slots_a_kept_array_is_not_trapped(duckpipe_mock, tmp_path):
    """What the debug mode is for: without it the stale write lands silently."""
    script = tmp_path / "stale.py"
    script.write_text(textwrap.dedent(SCRIPT.format(hidden=HIDDEN)))
    env = _env(None)
    r = subprocess.run(
        [sys.executable, str(script), duckpipe_mock.control, "{}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0 and r.stdout.endswith("not caught\n"), r.stdout + r.stderr


def test_debug_slots_refuse_hugepages(duckpipe_mock):
    with pytest.raises(BadInput, match="hugepages"):
        duckpipe.connect(duckpipe_mock, debug_slots=True, backing="hugetlbfs")
