"""Another local user at the run directory: what sits beside the control socket.

The stats segment goes next to the control socket (``ipc://<dir>/<name>`` ->
``<dir>/<name>.stats``). Where another user can write to ``<dir>``, they can create that
path first: a FIFO there hung the dataplane's start in an ``open`` (issue 17, point 5).
Both dataplanes now refuse a directory that is not theirs or that others can write to,
and open what is at the path without blocking or following a symlink, checking its type
and owner: the start fails at once, naming the path.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from duckpipe import runtime
from duckpipe.errors import DataplaneUnavailable, DuckpipeError
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.mock.process import MockDataplaneProcess

READY_S = 15.0  # what a hung start would run into; a refusal comes long before


def _process(kind: str, control: str):
    if kind == "mock":
        return MockDataplaneProcess(ducks=2, control=control, ready_timeout=READY_S)
    return DataplaneProcess(control=control, ready_timeout=READY_S)


def _refused(kind: str, control: str) -> str:
    """Start a dataplane at ``control``; it must fail at once. What it said."""
    started = time.monotonic()
    with pytest.raises(DataplaneUnavailable) as refused:
        with _process(kind, control):
            pass
    took = time.monotonic() - started
    said = str(refused.value)
    assert "did not answer" not in said and took < READY_S / 2, f"hung {took:.1f} s: {said}"
    return said


@pytest.fixture
def run(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_fifo_planted_at_the_stats_path_fails_the_start_naming_it(kind, run):
    fifo = run / "dp.stats"
    os.mkfifo(fifo, 0o666)
    said = _refused(kind, f"ipc://{run}/dp")
    assert f"{fifo}" in said and "not a regular file" in said, said
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it was found, for the admin to see


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_symlink_planted_at_the_stats_path_is_not_followed(kind, run, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    (run / "dp.stats").symlink_to(target)
    said = _refused(kind, f"ipc://{run}/dp")
    assert f"{run / 'dp.stats'}" in said and "symlink" in said, said
    assert target.read_bytes() == b"precious"


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_run_directory_others_can_write_to_is_refused(kind, run):
    run.chmod(0o1777)  # as /tmp is
    said = _refused(kind, f"ipc://{run}/dp")
    assert f"the directory {run} is writable by others (mode 1777)" in said, said


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_run_directory_of_another_user_is_refused(kind, run):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    os.chown(run, 65534, -1)  # nobody's; root could still write there
    said = _refused(kind, f"ipc://{run}/dp")
    assert f"the directory {run} belongs to uid 65534" in said, said


def test_the_default_run_directory_is_made_0700_and_refused_when_others_can_write(
    monkeypatch, tmp_path
):
    made = tmp_path / "made"
    monkeypatch.setenv("DUCKPIPE_RUN_DIR", str(made))
    assert runtime.run_dir() == made
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o777)
    with pytest.raises(DuckpipeError, match="writable by others"):
        runtime.run_dir()
