"""TOML topologies: what a good file gives, and errors that name the key, value and why."""

from __future__ import annotations

import subprocess
import sys
import time

import msgspec
import numpy as np
import pytest

import duckpipe
from duckpipe.errors import BadInput
from duckpipe.launch.topology import load, loopback

GOOD = """
threads = "shared"
default_timeout_ms = 500

[[nics]]
name = "lo"
host_ip = "127.0.0.1"
host_port = {host}
mtu = 1500

[[nics.ducks]]
id = 0
ip = "127.0.0.1"
port = {duck0}

[[nics.ducks]]
id = 1
ip = "127.0.0.1"
port = {duck1}
"""


def _write(tmp_path, text):
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return path


def test_a_good_file_decodes_into_nics_and_ducks(tmp_path):
    topo = load(_write(tmp_path, GOOD.format(host=47000, duck0=47100, duck1=47101)))
    assert [d.id for d in topo.ducks] == [0, 1]
    assert topo.nics[0].broadcast == "" and topo.default_timeout_ms == 500
    config = msgspec.msgpack.decode(topo.to_config("ipc:///x"))
    assert (
        config["default_timeout_us"] == 500_000 and config["nics"][0]["ducks"][1]["port"] == 47101
    )


@pytest.mark.parametrize(
    "edit,message",
    [
        (("mtu = 1500", 'mtu = "big"'), r"Expected `int`, got `str` - at `\$.nics\[0\].mtu`"),
        (("mtu = 1500", "mtu = 100"), r"Expected `int` >= 576 - at `\$.nics\[0\].mtu`"),
        (("mtu = 1500", "mtu_bytes = 1500"), r"unknown field `mtu_bytes`"),
        (("id = 1", "id = 0"), r"duck id 0 appears twice"),
        (('host_ip = "127.0.0.1"', 'host_ip = "127.0.0.999"'), r"'127.0.0.999' is not an IPv4"),
        (("port = 47101", "port = 70000"), r"Expected `int` <= 65535"),
        (
            ('threads = "shared"', 'threads = "many"'),
            r"Expected `str` matching|Invalid enum value 'many'",
        ),
        (
            ("mtu = 1500", 'mtu = 1500\nflow_steering = "maybe"'),
            r"Invalid enum value 'maybe' - at `\$.nics\[0\].flow_steering`",
        ),
    ],
)
def test_a_bad_file_names_the_key_the_value_and_why(tmp_path, edit, message):
    text = GOOD.format(host=47000, duck0=47100, duck1=47101).replace(*edit)
    with pytest.raises(BadInput, match=message):
        load(_write(tmp_path, text))


def _enum_fields() -> list[tuple[str, str, tuple[str, ...]]]:
    """Every field of the topology that takes one of a few words: (table, key, words)."""
    from typing import Annotated, Literal, get_args, get_origin, get_type_hints

    from duckpipe.launch.topology import Nic, Topology

    found = []
    for table, struct in (("", Topology), ("nics", Nic)):
        for key, hint in get_type_hints(struct, include_extras=True).items():
            while get_origin(hint) is Annotated:
                hint = get_args(hint)[0]
            if get_origin(hint) is Literal:
                found.append((table, key, get_args(hint)))
    return found


def test_every_word_field_of_the_topology_is_found():
    names = {key for _, key, _ in _enum_fields()}
    assert {"threads", "idle", "backend", "flow_steering"} <= names


@pytest.mark.parametrize("table,key,words", _enum_fields(), ids=lambda v: str(v))
def test_an_invalid_word_lists_the_valid_ones(tmp_path, table, key, words):
    text = GOOD.format(host=47000, duck0=47100, duck1=47101)
    typo = words[-1][:-1] + "x"  # one letter off the last valid word
    if table:
        text = text.replace("mtu = 1500", f'mtu = 1500\n{key} = "{typo}"')
    else:
        text = f'{key} = "{typo}"\n' + text.replace(f"{key} = ", f"# {key} = ")
    with pytest.raises(BadInput) as e:
        load(_write(tmp_path, text))
    where = f"$.nics[0].{key}" if table else f"$.{key}"
    assert f"Invalid enum value '{typo}' - at `{where}`" in str(e.value)
    assert f"(valid: {', '.join(words)}; did you mean {words[-1]!r}?)" in str(e.value)


def test_not_toml_and_missing_files_are_clear(tmp_path):
    with pytest.raises(BadInput, match="not valid TOML"):
        load(_write(tmp_path, "[[nics]\nname ="))
    with pytest.raises(BadInput, match="cannot read topology"):
        load(tmp_path / "missing.toml")


def test_loopback_puts_n_ducks_on_consecutive_ports():
    topo = loopback(3, duck_port=41000)
    assert [(d.id, d.port) for d in topo.ducks] == [(0, 41000), (1, 41001), (2, 41002)]
    with pytest.raises(BadInput):
        loopback(0)


@pytest.mark.dataplane
def test_three_terminals_ducks_then_dataplane_then_a_client(tmp_path):
    pytest.importorskip("duckpipe.launch.cluster")
    from duckpipe.launch.cluster import free_udp_ports
    from duckpipe.testing import cluster_class_or_skip

    cluster_class_or_skip()
    base = free_udp_ports(3)
    control = f"ipc://{tmp_path}/control"
    path = _write(tmp_path, GOOD.format(host=base, duck0=base + 1, duck1=base + 2))
    cli = [sys.executable, "-m", "duckpipe"]
    ducks = subprocess.Popen(
        [*cli, "ducks", "--ducks", "2", "--base-port", str(base + 1)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    dp = subprocess.Popen(
        [*cli, "dataplane", "--config", str(path), "--control", control],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert "duckpipe-ducks: 2 ducks" in ducks.stdout.readline()
        lines: list[str] = []  # log lines (the NIC's, the stats segment's), then ready
        while len(lines) < 10 and not any("ducks on" in line for line in lines):
            lines.append(dp.stdout.readline())
        assert any("duckpipe-dataplane: 2 ducks on 1 NIC" in line for line in lines), lines
        deadline = time.monotonic() + 10
        while True:
            try:
                client = duckpipe.connect(control, timeout=1)
                break
            except duckpipe.errors.DataplaneUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with client:
            mlp = duckpipe.GeluMlp.random(32, 16, seed=1)
            client.load_weights(1, mlp)
            x = np.ones((1, 32), np.float32)
            np.testing.assert_allclose(client.forward(1, x), mlp.reference(x), rtol=1e-4, atol=1e-5)
        r = subprocess.run([*cli, "shutdown", "--control", control], capture_output=True, text=True)
        assert r.returncode == 0
        assert dp.wait(10) == 0
    finally:
        for p in (dp, ducks):
            if p.poll() is None:
                p.terminate()
                p.wait(10)


def test_dataplane_cli_refuses_a_bad_topology(tmp_path):
    path = _write(
        tmp_path, GOOD.format(host=47000, duck0=47100, duck1=47101).replace("mtu = 1500", "mtu = 1")
    )
    r = subprocess.run(
        [sys.executable, "-m", "duckpipe", "dataplane", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "nics[0].mtu" in r.stderr


@pytest.mark.parametrize(("env", "threads"), [(None, False), ("1", True)])
def test_dedicated_threads_env_forces_the_mode_the_tsan_run_needs(
    monkeypatch, env, threads, free_loopback
):
    """DUCKPIPE_DEDICATED_THREADS=1 (tools/setup's TSan run) turns every launched
    dataplane's config to dedicated threads; unset, the topology's own mode stands."""
    from pathlib import Path

    from duckpipe.launch.dataplane import DataplaneProcess

    if env is None:
        monkeypatch.delenv("DUCKPIPE_DEDICATED_THREADS", raising=False)
    else:
        monkeypatch.setenv("DUCKPIPE_DEDICATED_THREADS", env)
    dp = DataplaneProcess(free_loopback(threads="shared"), binary=Path("/bin/true"))
    try:
        config = Path(dp.command()[2]).read_bytes()
        assert msgspec.msgpack.decode(config)["dedicated_threads"] is threads
    finally:
        dp.close()


SUBNET = """
[[nics]]
name = "ens1f0"
host_ip = "10.0.1.1"
{extra}

[[nics.ducks]]
id = 0
ip = "10.0.1.10"
port = 47100

[[nics.ducks]]
id = 7
ip = "{duck7}"
port = 47100
"""


@pytest.mark.parametrize(
    "extra,duck7,subnet",
    [
        ("", "10.0.2.10", "10.0.1.0/24"),  # default: /24
        ('broadcast = "10.0.1.255"', "10.0.2.10", "10.0.1.0/24"),  # the broadcast's subnet
        ("prefix = 28", "10.0.1.20", "10.0.1.0/28"),
    ],
)
def test_refuses_a_duck_outside_its_nics_subnet_naming_duck_address_and_subnet(
    tmp_path, extra, duck7, subnet
):
    path = _write(tmp_path, SUBNET.format(extra=extra, duck7=duck7))
    with pytest.raises(BadInput) as e:
        load(path)
    msg = str(e.value)
    assert f"duck 7's address {duck7} is outside the subnet {subnet} of NIC 'ens1f0'" in msg, msg


@pytest.mark.parametrize(
    "extra",
    ["prefix = 16", 'broadcast = "10.0.255.255"', 'broadcast = "10.0.255.255"\nprefix = 16'],
)
def test_a_duck_inside_a_wider_subnet_is_accepted(tmp_path, extra):
    topo = load(_write(tmp_path, SUBNET.format(extra=extra, duck7="10.0.2.10")))
    assert [d.id for d in topo.ducks] == [0, 7]
    assert "prefix" not in msgspec.msgpack.decode(topo.to_config("ipc:///x"))["nics"][0]


def test_refuses_a_broadcast_that_is_not_the_prefixs(tmp_path):
    extra = 'broadcast = "10.0.1.255"\nprefix = 16'
    with pytest.raises(BadInput, match=r"broadcast 10.0.1.255 is not the broadcast address"):
        load(_write(tmp_path, SUBNET.format(extra=extra, duck7="10.0.1.11")))
