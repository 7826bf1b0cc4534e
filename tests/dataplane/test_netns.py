"""Ducks on their own hosts: one network namespace each, on a bridge, reached by broadcast.

Each duck lives in a namespace of its own with its own address on 10.199.<k>.0/24;
the dataplane stays in the root namespace on the bridge (SO_BINDTODEVICE) and sends
each activation once, to the subnet's broadcast address. Needs root and iproute2.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import DuckpipeError
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.process import stop_process
from duckpipe.launch.topology import Duck, Nic, Topology

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

DUCKS = 3
DUCK_PORT = 47100  # the default, in each duck's namespace of its own


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def bridged_ducks() -> Iterator[tuple[str, str, list[str]]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (apt-get install iproute2)")
    try:
        find_binary("duckpipe-ducks")
        find_binary("duckpipe-dataplane")
    except DuckpipeError as e:
        pytest.skip(str(e))
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    subnet = f"10.199.{random.randrange(1, 250)}"
    bridge = f"dpbr{tag}"[:15]
    spaces = [f"dpns{tag}-{i}" for i in range(DUCKS)]
    procs: list[subprocess.Popen] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "brd", f"{subnet}.255", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(spaces):
            host_end, duck_end = f"dpv{tag}h{i}"[:15], f"dpv{tag}d{i}"[:15]
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", duck_end)
            _ip("link", "set", host_end, "master", bridge, "up")
            _ip("link", "set", duck_end, "netns", ns)
            _ip(
                "-n",
                ns,
                "addr",
                "add",
                f"{subnet}.{10 + i}/24",
                "brd",
                f"{subnet}.255",
                "dev",
                duck_end,
            )
            _ip("-n", ns, "link", "set", duck_end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # bound to INADDR_ANY so that the subnet's broadcasts reach it
            proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    str(find_binary("duckpipe-ducks")),
                    "--ducks",
                    "1",
                    "--bind",
                    "0.0.0.0",
                    "--base-port",
                    str(DUCK_PORT),
                    "--first-id",
                    str(i),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append(proc)
            assert "duckpipe-ducks: 1 ducks" in proc.stdout.readline()
        yield subnet, bridge, spaces
    finally:
        for proc in procs:
            stop_process(proc)
        for ns in spaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _topology(subnet: str, bridge: str, *, host_port: int) -> Topology:
    return Topology(
        nics=[
            Nic(
                name="br",
                interface=bridge,  # SO_BINDTODEVICE
                host_ip=f"{subnet}.1",
                host_port=host_port,
                broadcast=f"{subnet}.255",
                ducks=[Duck(id=i, ip=f"{subnet}.{10 + i}", port=DUCK_PORT) for i in range(DUCKS)],
            )
        ]
    )


def test_forwards_broadcast_to_ducks_in_their_own_namespaces(bridged_ducks):
    subnet, bridge, _ = bridged_ducks
    topo = _topology(subnet, bridge, host_port=free_udp_ports(1, host="0.0.0.0"))
    dp = DataplaneProcess(topo).start()
    try:
        mlp = GeluMlp.random(256, 96, seed=1)
        rng = np.random.default_rng(0)
        with duckpipe.connect(dp.control) as c:
            c.load_weights(1, mlp)
            for _ in range(20):
                x = rng.standard_normal((3, 256)).astype(np.float32)
                np.testing.assert_allclose(
                    c.forward(1, x, timeout=5), mlp.reference(x), rtol=1e-4, atol=1e-5
                )
            n = c.stats().counters
            assert all(d.alive for d in c.topology().ducks)
        # one broadcast per chunk, not one send per duck: 20 forwards x 3 chunks each
        forward_datagrams = n["tx_packets"] - n["weight_datagrams"] - n["pings"] - n["nacks_sent"]
        assert forward_datagrams <= 20 * 3, n
        assert n["rx_unknown_sender"] == 0 and n["timeouts"] == 0
    finally:
        code = dp.stop()
        out = dp.output()
        dp.close()
    assert code == 0, out


def test_a_forward_to_a_subset_ignores_the_other_ducks_replies(bridged_ducks):
    subnet, bridge, _ = bridged_ducks
    topo = _topology(subnet, bridge, host_port=free_udp_ports(1, host="0.0.0.0"))
    with DataplaneProcess(topo) as dp, duckpipe.connect(dp.control) as c:
        mlp = GeluMlp.random(32, 30, seed=2, b_down=False)
        c.load_weights(1, mlp)
        x = np.ones((1, 32), np.float32)
        y = c.forward(1, x, ducks=[0, 2], timeout=5)
        want = sum(
            duckpipe.client.models.duck_partial(mlp.kind, x, list(mlp.shard(lo, lo + 10)))
            for lo in (0, 20)
        )
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        # duck 1 answered a broadcast not meant for it; its reply may land after the
        # forward completed (the others' replies end it), so wait for the count a while
        deadline = time.monotonic() + 3.0
        while c.stats().counters["rx_late"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.stats().counters["rx_late"] >= 1
