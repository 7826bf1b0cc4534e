"""The command line: the example job, stats, shutdown, a busy address, duckpipe-top."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from duckpipe.mock.process import MockDataplaneProcess, ping
from duckpipe.testing import cluster_class_or_skip


def _duckpipe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "duckpipe", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("which", ["mock", "real"])
def test_example_runs_checked_forwards_against_a_fresh_dataplane(which):
    if which == "real":
        cluster_class_or_skip()
    flags = ["--mock"] if which == "mock" else []
    r = _duckpipe("example", "--forwards", "5", "--ducks", "4", *flags)
    assert r.returncode == 0, r.stderr
    assert ("started a mock dataplane" if which == "mock" else "the C dataplane") in r.stdout
    lines = [line for line in r.stdout.splitlines() if "max |y - numpy|" in line]
    assert len(lines) == 2
    for line in lines:
        err = float(line.split("max |y - numpy| = ")[1].split(",")[0])
        assert err < 1e-3


def test_stats_and_shutdown_talk_to_a_running_dataplane():
    dp = MockDataplaneProcess(ducks=3).start()
    try:
        r = _duckpipe("stats", "--control", dp.control, "--json", "--control-query")
        assert r.returncode == 0, r.stderr
        stats = json.loads(r.stdout)
        assert stats["mode"] == "mock" and "forwards" in stats["counters"]
        r = _duckpipe("stats", "--control", dp.control, "--json")  # the stats segment
        assert r.returncode == 0, r.stderr
        snap = json.loads(r.stdout)
        assert snap["dataplane"]["kind"] == "mock" and "forwards" in snap["counters"]
        r = _duckpipe("shutdown", "--control", dp.control)
        assert r.returncode == 0 and "acknowledged" in r.stdout
        assert dp.proc.wait(10) == 0
        assert ping(dp.control, 0.3) is None
    finally:
        dp.__exit__(None, None, None)


def test_stats_without_a_dataplane_fails_clearly(tmp_path):
    r = _duckpipe("stats", "--control", f"ipc://{tmp_path}/none")
    assert r.returncode == 1 and "no dataplane running" in r.stderr
    assert f"{tmp_path}/none.stats" in r.stderr  # where it looked
    r = _duckpipe("stats", "--control", f"ipc://{tmp_path}/none", "--control-query")
    assert r.returncode == 1 and "no dataplane answered" in r.stderr


def test_mock_refuses_an_address_another_dataplane_serves(dataplane):
    r = _duckpipe("mock-dataplane", "--control", dataplane.control, timeout=30)
    assert r.returncode == 1 and "already running" in r.stderr
    assert ping(dataplane.control, 2) is not None


def test_duckpipe_top_without_a_dataplane_says_so_and_exits_1(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "duckpipe.top", "--once", "--control", f"ipc://{tmp_path}/control"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "no dataplane running" in r.stderr and r.stdout == ""
