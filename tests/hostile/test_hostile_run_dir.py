"""Another local user at the run directory: what sits beside the control socket.

The stats segment goes next to the control socket (``ipc://<dir>/<name>`` ->
``<dir>/<name>.stats``). Where another user can write to ``<dir>``, they can create that
path first: a FIFO there hung the dataplane's start in an ``open`` (issue 17, point 5).
Both dataplanes now refuse a directory that is not theirs or that others can write to,
and open what is at the path without blocking or following a symlink, checking its type
and owner: the start fails at once, naming the path.

They check before they bind anything: here the C dataplane's host port is held by another
socket (as another dataplane on the machine would hold it), and the refusal must still
name the run directory, not the port (issue 27, point 12).
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from duckpipe import host
from duckpipe.errors import DataplaneUnavailable, DuckpipeError
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.topology import loopback
from duckpipe.mock.process import MockDataplaneProcess

READY_S = 15.0  # what a hung start would run into; a refusal comes long before


@pytest.fixture
def held_port() -> Iterator[int]:
    """A UDP port on 127.0.0.1 that another socket holds for the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def _process(kind: str, control: str, host_port: int):
    if kind == "mock":
        return MockDataplaneProcess(ducks=2, control=control, ready_timeout=READY_S)
    topo = loopback(2, host_port=host_port, duck_port=free_udp_ports(2))
    return DataplaneProcess(topo, control=control, ready_timeout=READY_S)


def _refused(kind: str, control: str, host_port: int) -> str:
    """Start a dataplane at ``control`` (the C one on a held ``host_port``); it must fail
    at once, for its run directory. What it said."""
    started = time.monotonic()
    with pytest.raises(DataplaneUnavailable) as refused:
        with _process(kind, control, host_port):
            pass
    took = time.monotonic() - started
    said = str(refused.value)
    assert "did not answer" not in said and took < READY_S / 2, f"hung {took:.1f} s: {said}"
    assert "already in use" not in said, f"refused for the port, not the directory: {said}"
    return said


@pytest.fixture
def run(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_fifo_planted_at_the_stats_path_fails_the_start_naming_it(kind, run, held_port):
    fifo = run / "dp.stats"
    os.mkfifo(fifo, 0o666)
    said = _refused(kind, f"ipc://{run}/dp", held_port)
    assert f"{fifo}" in said and "not a regular file" in said, said
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it was found, for the admin to see


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_symlink_planted_at_the_stats_path_is_not_followed(kind, run, tmp_path, held_port):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    (run / "dp.stats").symlink_to(target)
    said = _refused(kind, f"ipc://{run}/dp", held_port)
    assert f"{run / 'dp.stats'}" in said and "symlink" in said, said
    assert target.read_bytes() == b"precious"


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_run_directory_others_can_write_to_is_refused(kind, run, held_port):
    run.chmod(0o1777)  # as /tmp is
    said = _refused(kind, f"ipc://{run}/dp", held_port)
    assert f"the directory {run} is writable by others (mode 1777)" in said, said


@pytest.mark.parametrize("kind", ["mock", "real"])
def test_a_run_directory_of_another_user_is_refused(kind, run, held_port):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    os.chown(run, 65534, -1)  # nobody's; root could still write there
    said = _refused(kind, f"ipc://{run}/dp", held_port)
    assert f"the directory {run} belongs to uid 65534" in said, said


def test_the_default_run_directory_is_made_0700_and_refused_when_others_can_write(
    monkeypatch, tmp_path
):
    made = tmp_path / "made"
    monkeypatch.setenv("DUCKPIPE_RUN_DIR", str(made))
    assert host.run_dir() == made
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o777)
    with pytest.raises(DuckpipeError, match="writable by others"):
        host.run_dir()
