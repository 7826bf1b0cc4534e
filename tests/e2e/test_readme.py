"""The README's commands as written: the two set-up commands (tools/setup jobs, the
second the one CI runs), the "three terminals" walk-through in the venv it names, and the
API example against a mock dataplane."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from duckpipe.launch.cluster import free_udp_ports
from duckpipe.testing import cluster_class_or_skip

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(heading: str, lang: str = "sh") -> str:
    """The first code block of that language under a heading of the README."""
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def _commands(heading: str) -> list[str]:
    """The commands of a shell block, comments and blank lines dropped."""
    block = _block(heading)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _three_terminals() -> list[str]:
    return _commands("## By hand: three terminals")


def test_the_two_commands_are_tools_setup_jobs_and_ci_runs_the_test_job():
    commands = _commands("## Two commands (fresh Debian 12, as root)")
    assert commands == ["tools/setup demo", "tools/setup test"], commands
    script = (README.parent / "tools" / "setup").read_text()
    jobs = re.search(r'case "\$job" in ([\w|]+)\)', script).group(1).split("|")
    assert {"demo", "test"} <= set(jobs), jobs
    assert (README.parent / "tools" / "setup").stat().st_mode & 0o111, (
        "tools/setup is not executable"
    )
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^tools/setup test\b", ci, re.M), ci


def test_the_readme_api_example_runs_against_a_mock(duckpipe_mock):
    code = _block("## Using it", "python")
    assert "duckpipe.connect()" in code and "mlp.reference(x)" in code
    env = dict(os.environ, DUCKPIPE_CONTROL=duckpipe_mock.control)
    # the example's process imports this checkout's duckpipe, whichever one is installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(README.parent), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # print(fwd.status, fwd.phases.wait_ns, fwd.answered, fwd.missing): Status.OK by
    # name, every duck; the README shows it in a comment, its wait time any number
    assert re.fullmatch(r"Status\.OK \d+ \(0, 1, 2, 3, 4, 5, 6, 7\) \(\)\n", r.stdout), r.stdout
    shown = re.search(r"# prints: (.*)", code).group(1)
    assert re.fullmatch(re.sub(r"\d{3,}", r"\\d+", re.escape(shown)) + "\n", r.stdout), shown


def test_the_readme_moe_example_runs_against_a_mock(duckpipe_mock):
    code = _block("### Mixture of experts", "python")
    assert "routing=(indices, weights)" in code and "moe.reference(" in code
    env = dict(os.environ, DUCKPIPE_CONTROL=duckpipe_mock.control)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(README.parent), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_readme_says_to_activate_the_venv_first():
    text = README.read_text()
    section = text[text.index("## By hand: three terminals") :][:600]
    assert "source .venv/bin/activate" in section


@pytest.mark.dataplane
def test_the_three_terminals_run_as_written(tmp_path):
    cluster_class_or_skip()
    commands = _three_terminals()
    assert commands[:3] == [
        "duckpipe ducks --ducks 8",
        "duckpipe dataplane --ducks 8",
        "duckpipe example",
    ], commands
    assert commands[3].startswith("duckpipe-top")  # a full-screen program: test_top.py
    # "source .venv/bin/activate": the venv's bin first on PATH, as activate does; a run
    # directory and a block of ports of this test's own (other jobs share the host)
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "duckpipe").exists(), f"no duckpipe command in {venv_bin}"
    env = dict(os.environ)
    env.update(
        PATH=f"{venv_bin}:{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv_bin.parent),
        # the venv's `duckpipe` script, importing this checkout (a worktree of the one
        # the venv installed in editable mode)
        PYTHONPATH=os.pathsep.join(filter(None, [str(README.parent), env.get("PYTHONPATH")])),
        DUCKPIPE_RUN_DIR=str(tmp_path),
        DUCKPIPE_PORT_BASE=str(free_udp_ports(110)),
    )
    env.pop("DUCKPIPE_CONTROL", None)
    started = []
    try:
        for command in commands[:2]:  # terminals 1 and 2 run until stopped
            started.append(
                subprocess.Popen(
                    ["bash", "-c", command],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
            time.sleep(0.5)
        deadline = time.monotonic() + 20
        while not (tmp_path / "control").exists():
            assert time.monotonic() < deadline, "the dataplane made no control socket"
            assert all(p.poll() is None for p in started), [p.communicate() for p in started]
            time.sleep(0.1)
        r = subprocess.run(
            ["bash", "-c", commands[2]], env=env, capture_output=True, text=True, timeout=180
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "segment" in r.stdout and r.stdout.count("max |y - numpy|") == 2
    finally:
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in that terminal
        outputs = [p.communicate(timeout=10)[0] for p in started]
    # Ctrl-C on the emulator: its counters as a table, one counter per cell
    ducks_out = outputs[0]
    assert "duckpipe-ducks counters:" in ducks_out, ducks_out
    assert not re.search(r"(\w+=\d+ ){5}", ducks_out), ducks_out
    assert re.search(r"forwards_computed +[1-9][\d,]*", ducks_out), ducks_out


def test_tools_setup_ends_env_and_demo_by_saying_the_commands_live_in_the_venv():
    script = (README.parent / "tools" / "setup").read_text()
    jobs = script[script.index('case "$job" in\n    env)') :]
    env_job = jobs[: jobs.index("test)")]
    demo_job = jobs[jobs.index("demo)") :]
    for job in (env_job, demo_job):
        assert "source .venv/bin/activate" in job and ".venv/bin/duckpipe" in job, job
    assert "exec .venv/bin/duckpipe demo" not in demo_job  # the message comes after it
