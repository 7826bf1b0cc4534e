"""The command line: the example job, stats, shutdown, a busy address, duckpipe-top."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

import msgspec
import psutil
import pytest

from duckpipe.errors import DuckpipeError
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
    flags = ["--mock"] if which == "mock" else ["--standalone"]
    r = _duckpipe("example", "--forwards", "5", "--ducks", "4", *flags)
    assert r.returncode == 0, r.stderr
    assert ("started a mock dataplane" if which == "mock" else "the C dataplane") in r.stdout
    lines = [line for line in r.stdout.splitlines() if "max |y - numpy|" in line]
    assert len(lines) == 2
    for line in lines:
        err = float(line.split("max |y - numpy| = ")[1].split(",")[0])
        assert err < 1e-3
        # the wait for the ducks (first send -> last partial) is part of end to end, and
        # no forward of the real dataplane waits 0 us for ducks that compute
        e2e = float(line.split("end to end p50 ")[1].split(" us")[0])
        wait = float(line.split("wait for the ducks p50 ")[1].split(" us")[0])
        assert wait <= e2e, line
        if which == "real":
            assert wait > 0, line


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
        [
            sys.executable,
            "-m",
            "duckpipe.observe.top",
            "--once",
            "--control",
            f"ipc://{tmp_path}/control",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "no dataplane running" in r.stderr and r.stdout == ""


# ---------------------------------------------------------------- conventions (issue 11, 7)


def test_version_prints_the_package_version():
    import duckpipe

    r = _duckpipe("--version", timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == f"duckpipe {duckpipe.__version__}"


def test_verbose_is_accepted_after_the_subcommand_too():
    from duckpipe.cli import _parser

    p = _parser()
    assert p.parse_args(["-v", "stats"]).verbose is True
    assert p.parse_args(["stats", "-v"]).verbose is True
    assert p.parse_args(["dataplane", "-v", "--check"]).verbose is True
    assert p.parse_args(["shm", "ls", "--verbose"]).verbose is True
    assert p.parse_args(["stats"]).verbose is False


def test_every_option_of_every_command_has_help():
    from duckpipe.cli import _parser, _subparsers

    p = _parser()
    missing = [
        f"{sp.prog} {'/'.join(a.option_strings) or a.dest}"
        for sp in [p, *_subparsers(p)]
        for a in sp._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["shm", "ls"],
        pytest.param(["doctor"], marks=pytest.mark.dataplane),  # duckpipe-dataplane --backends
        ["stats", "--help"],
    ],
)
def test_a_reader_that_goes_away_ends_it_quietly(args):
    proc = subprocess.Popen(
        [sys.executable, "-m", "duckpipe", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = proc.stderr.read()
    proc.wait(60)
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
    assert proc.returncode in (0, 141), (proc.returncode, err)


@pytest.mark.dataplane
def test_dataplane_check_validates_a_topology_and_starts_nothing(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        '[[nics]]\nname = "lo"\nhost_ip = "127.0.0.1"\n'
        '[[nics.ducks]]\nid = 0\nip = "127.0.0.1"\nport = 47999\n'
    )
    control = f"ipc://{tmp_path}/control"
    r = _duckpipe("dataplane", "--config", str(good), "--control", control, "--check")
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout and "1 ducks" in r.stdout and "nothing started" in r.stdout
    assert not (tmp_path / "control").exists() and ping(control, 0.3) is None
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('"127.0.0.1"\n[', '"127.0.0.1"\nmtu = 9\n[', 1))
    r = _duckpipe("dataplane", "--config", str(bad), "--check")
    assert r.returncode == 1 and "mtu" in r.stderr and ">= 576" in r.stderr
    twice = tmp_path / "twice.toml"
    twice.write_text(good.read_text() + '[[nics.ducks]]\nid = 1\nip = "127.0.0.1"\nport = 47999\n')
    r = _duckpipe("dataplane", "--config", str(twice), "--check")
    assert r.returncode == 1 and "share 127.0.0.1:47999" in r.stderr


@pytest.mark.dataplane  # --check runs duckpipe-dataplane --backends
def test_dataplane_check_refuses_an_interface_or_cores_this_host_does_not_have(tmp_path):
    from duckpipe.launch.hostcheck import cpu_list, online_cpus

    online = online_cpus()
    absent = next(c for c in range(99, 4096) if c not in online)  # 99 on a 2-CPU host
    nic = '[[nics]]\nname = "lo"\nhost_ip = "127.0.0.1"\n'
    duck = '[[nics.ducks]]\nid = 0\nip = "127.0.0.1"\nport = 47999\n'
    here = tmp_path / "here.toml"  # what this host has: lo, CPU 0
    here.write_text(f"cores = [{min(online)}]\n" + nic + 'interface = "lo"\n' + duck)
    r = _duckpipe("dataplane", "--config", str(here), "--check")
    assert r.returncode == 0 and "valid" in r.stdout, r.stderr
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(
        f"cores = [{min(online)}, {absent}]\n" + nic + 'interface = "eth99"\n' + duck
    )
    r = _duckpipe("dataplane", "--config", str(elsewhere), "--check")
    assert r.returncode == 1 and "valid" not in r.stdout, r.stdout
    assert "interface 'eth99' does not exist on this host (it has: " in r.stderr, r.stderr
    assert "lo" in r.stderr.split("it has: ", 1)[1]  # and says which it has
    assert (
        f"cores: CPU {absent} does not exist on this host (it has CPUs {cpu_list(online)})"
        in r.stderr
    ), r.stderr
    assert f"CPU {min(online)} " not in r.stderr  # the CPU it has is not blamed
    stranger = tmp_path / "stranger.toml"
    stranger.write_text(nic.replace("127.0.0.1", "192.0.2.77") + duck.replace(
        "127.0.0.1", "192.0.2.78"))  # fmt: skip
    r = _duckpipe("dataplane", "--config", str(stranger), "--check")
    assert r.returncode == 1 and "host_ip 192.0.2.77 is not an address of this host" in r.stderr


def test_cpu_list_reads_like_the_kernels():
    from duckpipe.launch.hostcheck import cpu_list

    assert cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert cpu_list({3}) == "3"


@pytest.mark.dataplane  # runs duckpipe-dataplane --backends
def test_doctor_reports_each_feature_with_a_fix_when_missing():
    r = _duckpipe("doctor", "--json", timeout=60)
    assert r.returncode in (0, 1), r.stderr
    found = {c["name"]: c for c in json.loads(r.stdout)}
    for name in (
        "hugepages (2 MiB)",
        "hugetlbfs mount",
        "default ports",
        "DPDK library",
        "DPDK PMDs",
        "UDP GSO (UDP_SEGMENT)",
        "SO_RXQ_OVFL",
        "MADV_POPULATE_WRITE",
        "memfd seals",
        "epoll_pwait2",
        "AF_XDP",
    ):
        assert name in found, (name, list(found))
    for c in found.values():
        assert c["status"] in ("ok", "warn", "fail")
        assert c["status"] == "ok" or c["fix"], c
    assert "reserved" in found["hugepages (2 MiB)"]["detail"]
    r = _duckpipe("doctor", timeout=60)
    assert "memfd seals" in r.stdout and "AF_XDP" in r.stdout


@pytest.mark.dataplane  # starts duckpipe ducks and duckpipe dataplane
def test_doctor_says_the_default_ports_are_held_by_your_own_running_cluster(tmp_path, monkeypatch):
    from duckpipe import doctor
    from duckpipe.launch.cluster import free_udp_ports

    cluster_class_or_skip()
    base = free_udp_ports(110)  # this test's own block, not the user's default ports
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path), DUCKPIPE_PORT_BASE=str(base))
    env.pop("DUCKPIPE_CONTROL", None)
    monkeypatch.setenv("DUCKPIPE_PORT_BASE", str(base))
    # something else on a duck port: a warning that names no dataplane
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", base + 103))
        check = doctor._ports()
    assert check.status == "warn" and f"UDP {base + 103} in use" in check.detail, check
    started = [
        subprocess.Popen([sys.executable, "-m", "duckpipe", *cmd, "--ducks", "8"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        for cmd in (["ducks"], ["dataplane"])
    ]  # fmt: skip
    try:
        # both programs start in parallel: the ducks may bind after the control socket
        deadline = time.monotonic() + 20
        while True:
            check = doctor._ports()
            if (tmp_path / "control").exists() and "duckpipe-ducks (pid " in check.detail:
                break
            if time.monotonic() > deadline:
                break  # the asserts below say what is missing
            time.sleep(0.1)
        assert (tmp_path / "control").exists(), "the dataplane made no control socket"
        assert check.status == "ok", check
        assert "in use by your running" in check.detail, check.detail
        assert f"duckpipe-dataplane (pid {started[1].pid})" in check.detail, check.detail
        assert "duckpipe-ducks (pid " in check.detail, check.detail  # the wrapper's child
    finally:
        for p in started:
            os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in its terminal
        for p in started:
            p.wait(10)


# ---------------------------------------------------------------- the venv (issue 11, 1)


def test_example_uses_the_default_control_endpoint(tmp_path):
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path))
    env.pop("DUCKPIPE_CONTROL", None)
    cmd = [sys.executable, "-m", "duckpipe", "example", "--forwards", "3"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""  # started nothing of its own
    assert f"ipc://{tmp_path}/control" in r.stderr and "--standalone" in r.stderr
    with MockDataplaneProcess(ducks=2, control=f"ipc://{tmp_path}/control"):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "attached to a mock dataplane with 2 ducks" in r.stdout
    assert "started" not in r.stdout


# ------------------------------------------------------- concurrent launches (issue 11, 6)


DATAPLANE = [sys.executable, "-m", "duckpipe", "dataplane"]


@pytest.mark.dataplane
def test_six_simultaneous_launches_each_start_with_their_own_config(tmp_path):
    cluster_class_or_skip()
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path))
    controls = [f"ipc://{tmp_path}/c{k}" for k in range(6)]
    procs = [
        subprocess.Popen(
            [*DATAPLANE, "--backend", "null", "--ducks", "2", "--control", c],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in controls
    ]
    try:
        for c, p in zip(controls, procs, strict=True):
            deadline = time.monotonic() + 30
            while ping(c, 0.3) is None:
                assert p.poll() is None, p.stderr.read()
                assert time.monotonic() < deadline, f"nothing answers at {c}"
        configs = []
        for c, p in zip(controls, procs, strict=True):
            argv = psutil.Process(p.pid).cmdline()  # exec'd: the dataplane itself
            path = argv[argv.index("--config") + 1]
            configs.append(path)
            cfg = msgspec.msgpack.decode(open(path, "rb").read())
            assert cfg["control"] == c, (path, cfg["control"], c)
        assert len(set(configs)) == 6, configs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)


@pytest.mark.dataplane
def test_a_failed_launch_leaves_the_running_dataplanes_config_alone(tmp_path):
    cluster_class_or_skip()
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path))
    control = f"ipc://{tmp_path}/control"
    cmd = [sys.executable, "-m", "duckpipe", "dataplane", "--backend", "null", "--ducks", "2"]
    first = subprocess.Popen([*cmd, "--control", control], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while ping(control, 0.3) is None:
            assert first.poll() is None and time.monotonic() < deadline
        argv = psutil.Process(first.pid).cmdline()
        path = argv[argv.index("--config") + 1]
        before = open(path, "rb").read()
        r = subprocess.run([*cmd, "--ducks", "3", "--control", control], env=env,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        assert r.returncode != 0  # the address is taken
        assert open(path, "rb").read() == before
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(20)


def test_default_ports_differ_between_users_and_follow_the_environment(monkeypatch):
    from duckpipe import host

    monkeypatch.delenv("DUCKPIPE_PORT_BASE", raising=False)
    seen = set()
    for uid in (0, 1000, 1001, 1002):
        monkeypatch.setattr(os, "geteuid", lambda uid=uid: uid)
        host_port, duck, why = host.default_ports()
        assert duck == host_port + 100 and f"uid {uid}" in why
        seen.add(host_port)
    assert len(seen) == 4
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host.default_ports()[:2] == (47000, 47100)  # root: the documented ones
    monkeypatch.setenv("DUCKPIPE_PORT_BASE", "52000")
    assert host.default_ports()[:2] == (52000, 52100)
    monkeypatch.setenv("DUCKPIPE_PORT_BASE", "80")
    with pytest.raises(DuckpipeError, match="DUCKPIPE_PORT_BASE"):
        host.default_ports()


@pytest.mark.dataplane
def test_dataplane_says_which_ports_and_takes_a_free_host_port_when_its_own_is_busy(tmp_path):
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    base = busy.getsockname()[1]
    try:
        env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path), DUCKPIPE_PORT_BASE=str(base))
        r = subprocess.run(
            [sys.executable, "-m", "duckpipe", "dataplane", "--ducks", "2", "--check"],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert f"127.0.0.1:{base}," in r.stderr and f"{base + 100}..{base + 101}" in r.stderr
        assert "DUCKPIPE_PORT_BASE" in r.stderr
        from duckpipe.cli import _loopback_topology, _parser

        monkey_env = os.environ.copy()
        os.environ["DUCKPIPE_PORT_BASE"] = str(base)
        try:
            topo = _loopback_topology(_parser().parse_args(["dataplane", "--ducks", "2"]))
        finally:
            os.environ.clear()
            os.environ.update(monkey_env)
        assert topo.nics[0].host_port != base  # busy: another, said in the log
        assert topo.nics[0].ducks[0].port == base + 100
    finally:
        busy.close()


# ------------------------------------------------------------------- errors (issue 11, 9)


def test_stats_without_a_dataplane_answers_fast_with_a_hint(tmp_path):
    # no wait for an answer: it looks for the segment, not the socket, and says which
    # (a wall-clock bound here failed under CI's load: Python's start alone took 2 s)
    r = _duckpipe("stats", "--control", f"ipc://{tmp_path}/none")
    assert f"looked for {tmp_path}/none.stats" in r.stderr
    assert r.returncode == 1 and "`duckpipe dataplane`" in r.stderr
    assert "`duckpipe mock-dataplane`" in r.stderr  # a command that exists


def test_connect_says_what_to_do_when_the_run_directory_is_unreadable(tmp_path):
    import shutil

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    code = (
        "import duckpipe, sys\n"
        "try:\n    duckpipe.connect()\n"
        "except duckpipe.DuckpipeError as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
    )
    env = dict(os.environ, DUCKPIPE_CONTROL=f"ipc://{locked}/control")
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:  # root reads any directory: drop the capabilities that let it
        if not shutil.which("setpriv"):
            pytest.skip("root, and no setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o700)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "PermissionError" not in r.stdout + r.stderr
    assert "permission denied" in r.stdout and str(locked) in r.stdout
    assert "DUCKPIPE_CONTROL" in r.stdout  # what to set


# ---------------------------------------------------- the programs on PATH (issue 17, 13)


def _program(name: str) -> str:
    """The console script on this venv's PATH (pip installs it beside the interpreter)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not installed beside {sys.executable} (pip install -e .)")
    return path


@pytest.mark.parametrize("name", ["duckpipe-top", "duckpipe-dataplane", "duckpipe-ducks"])
def test_each_program_on_path_prints_its_version(name):
    import duckpipe

    r = subprocess.run([_program(name), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{name} (duckpipe {duckpipe.__version__})"


def _free_port_block() -> int:
    """A $DUCKPIPE_PORT_BASE whose duck ports (base + 100 ...) are free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1] - 100


@pytest.mark.dataplane
def test_duckpipe_ducks_on_path_listens_where_duckpipe_ducks_and_the_dataplane_look(tmp_path):
    from duckpipe import host

    base = _free_port_block()
    env = dict(os.environ, DUCKPIPE_PORT_BASE=str(base), DUCKPIPE_RUN_DIR=str(tmp_path))
    os.environ["DUCKPIPE_PORT_BASE"], saved = str(base), os.environ.get("DUCKPIPE_PORT_BASE")
    try:
        duck_port = host.default_ports()[1]  # what `duckpipe dataplane --ducks 2` expects
    finally:
        os.environ.pop("DUCKPIPE_PORT_BASE")
        if saved is not None:
            os.environ["DUCKPIPE_PORT_BASE"] = saved
    proc = subprocess.Popen(
        [_program("duckpipe-ducks"), "--ducks", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"on 127.0.0.1:{duck_port}..{duck_port + 1} " in line, (line, proc.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "duckpipe-ducks counters:" in err, err  # the table


def _wait_for(control: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while ping(control, 0.3) is None:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"nothing answers at {control}"


@pytest.mark.dataplane
def test_duckpipe_dataplane_on_path_takes_a_toml_topology_and_a_launchers_msgpack(tmp_path):
    cluster_class_or_skip()
    from duckpipe.launch.dataplane import write_config
    from duckpipe.launch.topology import load

    control = f"ipc://{tmp_path}/control"
    good = tmp_path / "good.toml"
    good.write_text(
        f'control = "{control}"\n[[nics]]\nname = "lo"\nbackend = "null"\n'
        'host_ip = "127.0.0.1"\n[[nics.ducks]]\nid = 0\nip = "127.0.0.1"\nport = 47999\n'
    )
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path))
    program = _program("duckpipe-dataplane")
    r = subprocess.run(
        [program, "--config", str(good), "--check"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and "is valid" in r.stdout, r.stderr
    msgpack_config = write_config(load(str(good)), control, tmp_path)
    for config in (good, msgpack_config):  # what a user writes; what the launchers write
        proc = subprocess.Popen(
            [program, "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for(control, proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, (config, err)
        assert "not one msgpack map" not in err and "1 ducks on 1 NIC" in out, (out, err)


def test_find_binary_on_path_passes_over_the_console_scripts_of_the_same_name(
    tmp_path, monkeypatch
):
    from duckpipe.launch import binaries

    scripts, programs = tmp_path / "venv-bin", tmp_path / "usr-bin"
    scripts.mkdir()
    programs.mkdir()
    # what pip writes for [project.scripts]: running it as "the emulator" would start the
    # console script again, which looks for the emulator again, and so on
    (scripts / "duckpipe-ducks").write_text(
        "#!/usr/bin/python3\nimport sys\nfrom duckpipe.cli import ducks_main\n"
        "sys.exit(ducks_main())\n"
    )
    (programs / "duckpipe-ducks").write_bytes(b"\x7fELF")
    for f in (scripts / "duckpipe-ducks", programs / "duckpipe-ducks"):
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{scripts}{os.pathsep}{programs}")
    assert binaries._on_path("duckpipe-ducks") == programs / "duckpipe-ducks"
    monkeypatch.setenv("PATH", str(scripts))
    assert binaries._on_path("duckpipe-ducks") is None


# ------------------------------------------------------------ small ones (issue 17, 16)


@pytest.mark.dataplane
def test_the_launchs_config_file_leaves_the_run_directory_with_the_dataplane(tmp_path):
    cluster_class_or_skip()
    env = dict(os.environ, DUCKPIPE_RUN_DIR=str(tmp_path))
    control = f"ipc://{tmp_path}/control"
    proc = subprocess.Popen(
        [*DATAPLANE, "--backend", "null", "--ducks", "1", "--control", control],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(control, proc)
        argv = psutil.Process(proc.pid).cmdline()  # exec'd: the dataplane itself
        config = argv[argv.index("--config") + 1]
        assert os.path.dirname(config) == str(tmp_path) and os.path.exists(config)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert proc.returncode == 0, proc.stderr.read()
    assert not os.path.exists(config)
    assert not list(tmp_path.glob("dataplane-*.msgpack"))


NOBODY = NOGROUP = 65534


@pytest.fixture
def group_mock(tmp_path_factory):
    """A mock dataplane whose control_group is nogroup, in a directory that group may
    enter: nobody is one of its clients, not its admin."""
    if os.geteuid() != 0:
        pytest.skip("becoming another user (nobody) needs root")
    import shutil
    import tempfile
    from pathlib import Path

    run = Path(tempfile.mkdtemp(prefix="duckpipe-cli-", dir="/tmp"))
    os.chown(run, -1, NOGROUP)
    run.chmod(0o750)
    try:
        with MockDataplaneProcess(
            ducks=2, control=f"ipc://{run}/control", args=["--control-group=nogroup"]
        ) as dp:
            yield dp
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _as_nobody(*args: str) -> tuple[int, str]:
    """``duckpipe ARGS`` run by nobody:nogroup in a forked child (a subprocess could not
    run this venv's interpreter as nobody): its exit code and stderr."""
    from duckpipe import cli

    return _as_nobody_call(cli.main, list(args))


def _as_nobody_call(main, argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` run by nobody:nogroup in a forked child: its exit code and stderr."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 99
        try:
            os.close(r)
            os.dup2(w, 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(NOBODY)
            sys.stdout = open(os.devnull, "w")  # the child exits below
            code = main(argv)
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def test_shutdown_by_a_client_says_it_was_refused_and_who_may(group_mock):
    code, err = _as_nobody("shutdown", "--control", group_mock.control)
    assert code == 1, err
    assert "no dataplane acknowledged" not in err, err  # it is there: it said no
    assert "refused shutdown" in err and "[not_permitted]" in err, err
    assert "only the user who started it (the admin), root (uid 0)" in err, err
    assert ping(group_mock.control, 2.0) is not None  # and it still runs


def test_top_as_a_control_group_member_says_the_segment_is_there_and_why_not_readable(
    group_mock,
):
    from duckpipe.observe import top

    code, err = _as_nobody_call(top.main, ["--once", "--control", group_mock.control])
    assert code == 1, err
    assert "start one" not in err, err  # it is running: starting another is no answer
    assert f"stats segment is at {group_mock.control[6 : -len('control')]}stats" in err, err
    assert "readable only by root (uid 0), the dataplane's user (you are uid 65534)" in err
    assert "every client's pid, name and segment" in err, err  # why: security.md's choice
    assert f"duckpipe stats --control-query --control {group_mock.control}" in err, err
    # and that way works for the member, showing only what it may see
    code, err = _as_nobody("stats", "--control-query", "--control", group_mock.control)
    assert code == 0, err
