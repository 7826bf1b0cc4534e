"""The dpdk backend on real virtual NICs: net_af_packet (and net_af_xdp) on veth pairs.

Each test builds its own network: per DPDK port, a veth pair whose far end lives in a
new network namespace with its own subnet (10.77.<k>.0/24), where emulated ducks
(``duckpipe-ducks``, kernel sockets) listen on addresses .10, .11, ...; the near end
stays in the root namespace with no address at all, driven by DPDK's af_packet PMD
(af_xdp in two tests: skipped, with the reason, where it cannot attach to a veth):
the host address (.1) exists only in the dataplane, which answers ARP for it. The
ducks run with --no-gso: a veth hands a UDP GSO send to af_packet as one unsegmented
super-frame, where a real NIC would have cut it into frames.

Skips with the reason when not root, without free hugepages, or when the dataplane
was built without DPDK. Everything made (namespaces, veths, the EAL's runtime
directory) is removed afterwards, also when a test fails.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pytest

import duckpipe
from duckpipe import GeluMlp, host
from duckpipe.errors import DuckpipeError, ForwardTimeout, WaitTimeout
from duckpipe.launch.binaries import find_binary
from duckpipe.launch.dataplane import DataplaneProcess
from duckpipe.launch.process import control_request, ping, stop_process
from duckpipe.launch.topology import Duck, Nic, Topology
from duckpipe.schema import control as ctl

pytestmark = [pytest.mark.dataplane, pytest.mark.dpdk, pytest.mark.root]

DUCK_PORT = 47100
HOST_PORT = 47000
HUGEPAGES = 96  # 192 MiB: the EAL's own, an mbuf pool per port, and the clients' segments
DPDK_RUN_DIR = Path("/var/run/dpdk")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _ethtool_tx_off(ns: str, dev: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def _require_dpdk() -> None:
    if os.geteuid() != 0:
        pytest.skip("the dpdk backend needs root (hugepages, AF_PACKET, network namespaces)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (apt-get install iproute2)")
    if shutil.which("ethtool") is None:
        pytest.skip("`ethtool` is not installed (apt-get install ethtool; tools/setup does)")
    try:
        dataplane = find_binary("duckpipe-dataplane")
        find_binary("duckpipe-ducks")
    except DuckpipeError as e:
        pytest.skip(str(e))
    have = subprocess.run([str(dataplane), "--backends"], capture_output=True, text=True)
    if "dpdk" not in have.stdout.split():
        pytest.skip(
            "this dataplane was built without DPDK: install libdpdk-dev (tools/setup does) "
            "and rebuild"
        )
    if host.free_hugepages() < HUGEPAGES:
        pytest.skip(
            f"{HUGEPAGES} free 2 MiB hugepages needed, {host.free_hugepages()} free "
            "(tools/setup reserves 512 as root)"
        )


@dataclass
class Net:
    """What veth_ducks built: the NICs of a topology and the EAL options that match."""

    nics: list[Nic]
    eal: list[str]
    spaces: list[str]
    far_ends: list[str]
    near_ends: list[str]
    prefix: str
    ducks: list[subprocess.Popen] = field(default_factory=list)
    pending: list[Callable[[], None]] = field(default_factory=list)

    def start_ducks(self) -> None:
        """Give the far ends their addresses and start the ducks (once)."""
        while self.pending:
            self.pending.pop(0)()


@contextmanager
def veth_ducks(
    per_port: list[int],
    *,
    broadcast: bool = False,
    duck_args: tuple[str, ...] = (),
    late: bool = False,
    pmd: str = "af_packet",
    lcores: tuple[str, ...] = ("-l", "0"),
) -> Iterator[Net]:
    """One veth pair + namespace per entry of ``per_port`` with that many ducks in it.

    With ``broadcast`` each namespace has one duck bound to 0.0.0.0 (the subnet's
    broadcast reaches one port per address), and the NIC broadcasts. With ``late``
    the ducks and their addresses wait for ``net.start_ducks()``. ``pmd`` is the
    DPDK driver on the near ends: af_packet or af_xdp. ``lcores``: the EAL's lcore
    options (one main lcore by default; dedicated threads need a worker lcore per port).
    """
    _require_dpdk()
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    base = random.randrange(1, 250 - len(per_port))
    net = Net(nics=[], eal=[], spaces=[], far_ends=[], near_ends=[], prefix=f"duckpipe-t{tag}")
    try:
        first = 0
        for k, n in enumerate(per_port):
            assert not broadcast or n == 1
            subnet = f"10.77.{base + k}"
            ns, near, far = f"dpdk{tag}-{k}", f"dpk{tag}h{k}"[:15], f"dpk{tag}d{k}"[:15]
            _ip("netns", "add", ns)
            net.spaces.append(ns)
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            net.near_ends.append(near)
            _ip("link", "set", far, "netns", ns)
            net.far_ends.append(far)
            # the near end carries DPDK's frames only: no address, no IPv6 chatter
            v6 = Path(f"/proc/sys/net/ipv6/conf/{near}/disable_ipv6")
            if v6.exists():
                v6.write_text("1")
            _ip("link", "set", near, "up")
            ips = [f"{subnet}.{10 + i}" for i in range(n)]
            _ip("-n", ns, "link", "set", far, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # the ducks' UDP checksums filled in by their kernel: with the veth's tx
            # checksum offload on they reach af_packet/af_xdp partial (CHECKSUM_PARTIAL,
            # the pseudo header's sum only) and the dataplane drops them as bad
            _ethtool_tx_off(ns, far)

            def up(ns=ns, far=far, subnet=subnet, ips=ips, n=n, first=first) -> None:
                for ip in ips:
                    _ip("-n", ns, "addr", "add", f"{ip}/24", "brd", f"{subnet}.255", "dev", far)
                proc = subprocess.Popen(
                    [
                        "ip", "netns", "exec", ns, str(find_binary("duckpipe-ducks")),
                        "--ducks", str(n),
                        "--bind", "0.0.0.0" if broadcast else ",".join(ips),
                        "--base-port", str(DUCK_PORT),
                        "--first-id", str(first),
                        "--no-gso",
                        *duck_args,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )  # fmt: skip
                net.ducks.append(proc)
                assert f"duckpipe-ducks: {n} ducks" in proc.stdout.readline()

            net.pending.append(up)
            net.nics.append(
                Nic(
                    name=f"p{k}",
                    backend="dpdk",
                    interface=f"net_{pmd}{k}",
                    host_ip=f"{subnet}.1",
                    host_port=HOST_PORT,
                    broadcast=f"{subnet}.255" if broadcast else "",
                    ducks=[
                        Duck(id=first + i, ip=ip, port=DUCK_PORT + (0 if broadcast else i))
                        for i, ip in enumerate(ips)
                    ],
                )
            )
            net.eal.append(f"--vdev=net_{pmd}{k},iface={near}")
            first += n
        net.eal = [
            "--no-pci",
            "--in-memory",
            "--no-telemetry",
            "--file-prefix",
            net.prefix,
            *lcores,
            *net.eal,
        ]
        if not late:
            net.start_ducks()
        yield net
    finally:
        for proc in net.ducks:
            stop_process(proc)
        for ns in net.spaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for near in net.near_ends:  # gone with its peer's namespace; in case it is not
            subprocess.run(["ip", "link", "del", near], capture_output=True)
        shutil.rmtree(DPDK_RUN_DIR / net.prefix, ignore_errors=True)


def _topology(net: Net, **kw) -> Topology:
    # a small forward window keeps the mbuf pools (sized from it) small
    return Topology(nics=net.nics, max_inflight=16, max_forward_bytes=256 << 10, **kw)


@contextmanager
def _dataplane(net: Net, **kw) -> Iterator[DataplaneProcess]:
    dp = DataplaneProcess(_topology(net, **kw), backend_args=net.eal)
    try:
        dp.start()
    except DuckpipeError as e:
        dp.stop()
        dp.close()
        if "net_af_xdp" in net.nics[0].interface and "no such DPDK port" in str(e):
            pytest.skip(f"net_af_xdp cannot attach to a veth here (kernel, libxdp):\n{e}")
        raise
    failed = True
    try:
        yield dp
        failed = False
    finally:
        code = dp.stop()
        out = dp.output()
        dp.close()
        dp.log = out  # for a test's assertions after the block
        if failed:  # the test's own assertion: the dataplane's log says what it refused
            print(f"the dataplane's output:\n{out}", file=sys.stderr)
    assert code == 0, out
    assert "dpdk backend" in out, out
    assert " xstats: rx_good_packets=" in out, out  # the port's own counters, at close


def _check_forwards(c: duckpipe.Client, mlp: GeluMlp, count: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(count):
        x = rng.standard_normal((3, mlp.hidden)).astype(np.float32)
        np.testing.assert_allclose(
            c.forward(1, x, timeout=5), mlp.reference(x), rtol=1e-4, atol=1e-5
        )


def _near_mac(near: str) -> str:
    return Path(f"/sys/class/net/{near}/address").read_text().strip()


@pytest.mark.parametrize("pmd", ["af_packet", "af_xdp"])
def test_forwards_match_numpy_and_arp_works_both_ways(pmd):
    # af_xdp: its XDP program takes ARP away from the kernel too: the backend answers it
    with (
        veth_ducks([4], pmd=pmd) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(256, 96, seed=1)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 10)
        # the ducks' kernel forgets the host's MAC and must ask again: the dataplane answers
        _ip("-n", net.spaces[0], "neigh", "flush", "dev", net.far_ends[0])
        _check_forwards(c, mlp, 10, seed=1)
        n = c.stats().counters
        assert all(d.alive for d in c.topology().ducks)
        neigh = subprocess.run(
            ["ip", "-n", net.spaces[0], "neigh", "show", net.nics[0].host_ip],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert _near_mac(net.near_ends[0]) in neigh, neigh
    assert n["arp_replies"] >= 1, n  # the ducks' kernel asked who has the host address
    assert n["arp_learned"] >= 1 and n["arp_requests"] >= 1, n  # one MAC: all four on one veth
    assert n["timeouts"] == 0 and n["rx_malformed"] == 0 and n["rx_unknown_sender"] == 0, n
    assert n["rxq_overflows"] == 0, n  # the port's own drops (imissed, rx_nombuf): none here
    assert n["forwards_ok"] == 20 and n["tx_packets"] > 0 and n["rx_packets"] > 0, n
    # activation chunks: in place from the client's slots where the port chains mbufs
    # (af_packet), copied where it cannot (af_xdp); the results above are exact either way
    if pmd == "af_packet":
        assert n["tx_zero_copy"] >= 20 and n["tx_copied"] == 0, n
    else:
        assert n["tx_copied"] >= 20 and n["tx_zero_copy"] == 0, n


def test_zero_copy_survives_clients_coming_and_going():
    # each client's segment is a new mapping: chunks go out from it in place, the
    # slots are reused only after the port let go of them, and a detached client's
    # memory is never read again (its successor's results are exact)
    with veth_ducks([4]) as net, _dataplane(net) as dp:
        mlp = GeluMlp.random(512, 64, seed=5)
        for k in range(3):
            with duckpipe.connect(dp.control) as c:
                c.load_weights(1, mlp)
                _check_forwards(c, mlp, 8, seed=k)
                n = c.stats().counters
        assert n["tx_zero_copy"] >= 3 * 8 and n["tx_copied"] == 0, n
        assert n["timeouts"] == 0 and n["rx_malformed"] == 0, n


def _registered(out: str) -> list[tuple[str, str]]:
    """(address, page KiB) of each "dpdk: registered ..." line of the dataplane's log."""
    return re.findall(r"dpdk: registered \d+ bytes at (0x[0-9a-f]+) .*?pages of (\d+) KiB", out)


def _wait_counter(c: duckpipe.Client, name: str, value: int, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        n = c.stats().counters
        if n[name] >= value or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


@pytest.mark.parametrize("iova", ["pa", "va"])
@pytest.mark.parametrize("backing", ["hugetlbfs", "devshm"])
def test_client_segments_are_registered_with_dpdk_and_again_after_detach(backing, iova):
    # each client's segment is registered at attach (rte_extmem_register, with the page
    # size that backs it and each page's IOVA: a PCI port may DMA from it) and
    # unregistered at detach, once nothing of it is in flight; the next client's mapping
    # often lands at the same address, which must register again (no leak, no EEXIST)
    with veth_ducks([2]) as net:
        net.eal.append(f"--iova-mode={iova}")
        if iova == "pa" and not Path("/proc/self/pagemap").exists():
            pytest.skip("no /proc/self/pagemap: IOVA as PA needs physical addresses")
        with _dataplane(net) as dp:
            _register_again_and_again(dp, backing, iova)


def _unregistered(dp: DataplaneProcess, value: int, timeout: float = 5.0) -> None:
    """Wait until the dataplane has let go of `value` clients' segments: their address
    ranges are free for the next mapping (housekeeping starts an unmap up to 50 ms after a
    detach; a client attaching before then maps elsewhere)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = ping(dp.control, 1.0)
        if stats is not None and stats.counters["extmem_unregistered"] >= value:
            return
        time.sleep(0.02)


def _register_again_and_again(dp: DataplaneProcess, backing: str, iova: str) -> None:
    mlp = GeluMlp.random(256, 32, seed=7)
    for k in range(4):
        with duckpipe.connect(dp.control, backing=backing) as c:
            c.load_weights(1, mlp)
            _check_forwards(c, mlp, 3, seed=k)
        _unregistered(dp, k + 1)
    with duckpipe.connect(dp.control, backing=backing) as c:
        n = _wait_counter(c, "extmem_unregistered", 4)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 3, seed=9)
    out = dp.output()
    assert n["extmem_registered"] == 5 and n["extmem_unregistered"] == 4, n
    assert n["extmem_registered_bytes"] > 0 and n["tx_copied"] == 0, n
    regs = _registered(out)
    assert len(regs) == 5, out
    assert {kib for _, kib in regs} == {"2048" if backing == "hugetlbfs" else "4"}, regs
    # IOVAs: the addresses (VA), a hugepage's physical address from pagemap (PA); none for
    # 4 KiB shmem pages with IOVA as PA (they may move): a PCI port would copy those
    pa4k = iova == "pa" and backing == "devshm"
    assert f"IOVA as {iova.upper()}{', no IOVAs for 4 KiB pages' if pa4k else ';'}" in out, out
    assert len({addr for addr, _ in regs}) < 5, regs  # a range registered again after detach
    assert "rte_extmem_register(" not in out and "rte_extmem_unregister(" not in out, out


def _identity_mlp(hidden: int) -> GeluMlp:
    # gelu(x @ I) @ I == x bit for bit for x >= 16 (gelu's erf is 1.0 in float32 there,
    # and every other product is +0): what the ducks computed from is what was sent
    eye = np.eye(hidden, dtype=np.float32)
    return GeluMlp(w_up=eye, b_up=np.zeros(hidden, np.float32), w_down=eye.copy())


@pytest.mark.parametrize("hold_us", [0, 20000])
def test_zero_copy_results_are_byte_exact(monkeypatch, hold_us):
    # activations sent in place from the slots (and, with the knob, released late) reach
    # the ducks byte for byte: through an identity layer the result is the input, exactly
    if hold_us:
        monkeypatch.setenv("DUCKPIPE_DPDK_TX_HOLD_US", str(hold_us))
    with veth_ducks([2]) as net, _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
        mlp = _identity_mlp(512)
        c.load_weights(1, mlp)
        rng = np.random.default_rng(11)
        for _ in range(6):
            x = rng.uniform(16, 4096, (8, 512)).astype(np.float32)  # 16 KiB: 12 chunks
            y = c.forward(1, x, timeout=10)
            assert np.array_equal(y.view(np.uint32), x.view(np.uint32))
            assert np.array_equal(y.view(np.uint32), mlp.reference(x).view(np.uint32))
        n = c.stats().counters
    assert n["tx_zero_copy"] >= 6 * 12 * 2 and n["tx_copied"] == 0, n  # 2 ducks: unicast
    assert n["forwards_ok"] == 6 and (n["tx_release_deferred"] >= 6) == bool(hold_us), n


def _forward_slowly(c: duckpipe.Client, mlp: GeluMlp, x: np.ndarray) -> float:
    t0 = time.monotonic()
    np.testing.assert_allclose(c.forward(1, x, timeout=10), mlp.reference(x), rtol=1e-4, atol=1e-5)
    return time.monotonic() - t0


def test_a_slot_goes_back_only_after_the_port_freed_its_buffers(monkeypatch):
    # a test knob makes the port hold every external buffer 150 ms after tx_burst, as a
    # NIC that frees on completion does: the ducks answer within milliseconds, yet no
    # done word is published before the free callbacks ran, and results stay exact
    hold = 0.15
    monkeypatch.setenv("DUCKPIPE_DPDK_TX_HOLD_US", str(int(hold * 1e6)))
    with veth_ducks([2]) as net, _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
        mlp = GeluMlp.random(512, 32, seed=8)
        c.load_weights(1, mlp)
        rng = np.random.default_rng(3)
        took = [
            _forward_slowly(c, mlp, rng.standard_normal((4, mlp.hidden)).astype(np.float32))
            for _ in range(4)
        ]
        n = c.stats().counters
        out = dp.output()
    assert min(took) >= hold, took  # each done word waited for the port
    assert n["tx_release_deferred"] >= 4 and n["forwards_ok"] == 4, n
    assert n["tx_zero_copy"] >= 4 and n["timeouts"] == 0, n
    assert "DUCKPIPE_DPDK_TX_HOLD_US" in out, out


def test_a_forward_that_times_out_while_the_port_holds_its_slot_completes_after(monkeypatch):
    # the ducks are gone and the port holds the activation 1.5 s: the forward's deadline
    # (0.3 s) ends it as a timeout, but its completion (and the slot) waits for the port,
    # which is logged after a second. Tensors under 256 bytes go out copied.
    hold = 1.5
    monkeypatch.setenv("DUCKPIPE_DPDK_TX_HOLD_US", str(int(hold * 1e6)))
    with (
        veth_ducks([1]) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control, forward_timeout=0.3) as c,
    ):
        mlp = GeluMlp.random(8, 4, seed=9)
        c.load_weights(1, mlp)
        for proc in net.ducks:
            stop_process(proc)
        x = np.ones((16, 8), np.float32)  # 512 bytes: in place
        t0 = time.monotonic()
        with pytest.raises(ForwardTimeout):
            c.forward(1, x, timeout=10)
        took = time.monotonic() - t0
        n = c.stats().counters
        out = dp.output()
    assert took >= hold, took  # not at the deadline: after the port let go
    assert n["timeouts"] == 1 and n["tx_release_deferred"] == 1, n
    assert re.search(r"the port still holds \d+ buffer\(s\) of forward \d+'s slot", out), out


def test_a_port_that_never_frees_keeps_the_slot_and_is_logged(monkeypatch):
    # the port holds the activation's buffers for good: the forward stays pending (its
    # slot is never handed back early), the dataplane says so after a second, and shuts
    # down cleanly. Tensors under 256 bytes go out copied, so the weights still load.
    monkeypatch.setenv("DUCKPIPE_DPDK_TX_HOLD_US", "forever")
    with veth_ducks([1]) as net, _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
        mlp = GeluMlp.random(8, 4, seed=9)
        c.load_weights(1, mlp)
        x = np.ones((16, 8), np.float32)  # 512 bytes: in place
        slot = c.claim(x.shape, x.dtype)
        slot.array[:] = x
        fwd = c.submit(slot, 1)
        with pytest.raises(WaitTimeout, match="still pending"):
            fwd.result(timeout=1.5)
        n = c.stats().counters
        assert n["tx_release_deferred"] == 1 and n["tx_zero_copy"] >= 1, n
        out = dp.output()
    assert re.search(r"the port still holds \d+ buffer\(s\) of forward \d+'s slot", out), out


def _thread_cpus(pid: int, name: str) -> set[int]:
    """The CPUs the thread of ``pid`` called ``name`` may run on (its affinity)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == name:
            return os.sched_getaffinity(int(task.name))
    raise AssertionError(f"no thread named {name} in process {pid}")


# the EAL's lcores for two ports on this 2-CPU machine: main lcore 0 on CPU 0, lcore 1 on
# CPU 1 and lcore 2 on CPU 0 (`-l 0-2` needs three CPUs: the EAL refuses lcores the
# machine lacks); p0's worker goes to lcore 1, p1's to lcore 2
TWO_WORKER_LCORES = ("--lcores=0@0,1@1,2@0",)


def test_24_ducks_over_two_ports_on_dedicated_threads_each_worker_on_its_lcore():
    # cores: control, dispatcher, nic-p0, nic-p1; the workers' entries are not applied
    # (the EAL places them): p0's (0) contradicts its lcore's CPU 1 and is reported
    with (
        veth_ducks([12, 12], lcores=TWO_WORKER_LCORES) as net,
        _dataplane(net, threads="dedicated", cores=[0, 1, 0, 0]) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(128, 24 * 8, seed=2)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 10)
        assert len(c.topology().ducks) == 24 and all(d.alive for d in c.topology().ducks)
        n = c.stats().counters
        # the threads named after the NICs are the EAL's lcore threads, pinned by it
        assert _thread_cpus(dp.pid, "nic-p0") == {1}
        assert _thread_cpus(dp.pid, "nic-p1") == {0}
        assert _thread_cpus(dp.pid, "dispatch") == {1}  # pinned by duckpipe, as before
        out = dp.output()
    assert n["forwards_ok"] == 10 and n["timeouts"] == 0, n
    assert "nic-p0: worker on EAL lcore 1 (CPU 1)" in out, out
    assert "nic-p1: worker on EAL lcore 2 (CPU 0)" in out, out
    assert "nic-p0: the topology's cores entry (0) is ignored" in out, out
    assert "nic-p1: the topology's cores entry" not in out, out  # 0 is lcore 2's CPU
    assert out.count("inbox rte_ring") == 2, out  # the dispatcher feeds each through one


def test_dedicated_threads_with_too_few_worker_lcores_fail_at_startup_saying_what_to_pass():
    with veth_ducks([1, 1], lcores=("--lcores=0@0,1@1",)) as net:
        dp = DataplaneProcess(_topology(net, threads="dedicated"), backend_args=net.eal)
        try:
            with pytest.raises(DuckpipeError, match="give 1 worker lcore") as e:
                dp.start()
            msg = str(e.value)
            assert "2 dpdk NIC(s) need 2" in msg and "-l 0-2" in msg, msg
            ncpu = os.cpu_count() or 1
            assert f"--lcores='0@0,1@{1 % ncpu},2@{2 % ncpu}'" in msg, msg
            assert "0 (main, CPU 0), 1 (CPU 1)" in msg, msg  # the lcores the EAL has
        finally:
            dp.stop()
            dp.close()


def test_shared_threads_run_the_dpdk_workers_on_the_one_thread_and_leave_lcores_unused():
    with (
        veth_ducks([2], lcores=("--lcores=0@0,1@1",)) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(128, 32, seed=3)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 3)
        out = dp.output()
        names = {(t / "comm").read_text().strip() for t in Path(f"/proc/{dp.pid}/task").iterdir()}
    assert "nic-p0" not in names, names  # no worker thread of its own
    assert "the 1 dpdk NIC worker(s) run on the one dataplane thread" in out, out
    assert "rte_eal_remote_launch" not in out, out


def test_a_broadcast_goes_out_once_as_an_ethernet_broadcast():
    with (
        veth_ducks([1, 1], broadcast=True) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(256, 64, seed=3)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 10)
        n = c.stats().counters
    # 10 forwards of 3 KiB: 3 chunks each per NIC, once, not once per duck
    forward_datagrams = n["tx_packets"] - n["weight_datagrams"] - n["pings"] - n["nacks_sent"]
    assert forward_datagrams <= 2 * 10 * 3, n
    assert n["timeouts"] == 0 and n["tx_no_mac"] == 0, n


def test_routed_moe_forwards_match_numpy_over_two_ports_in_both_modes():
    """A mixture-of-experts layer over two ports (2 + 2 ducks): the routed rows go out
    from the client's slot in place (a unicast's gathered by row, several pieces to a
    frame at 48 tokens), the tables from the context's own area; broadcast, unicast and
    the dataplane's choice alike match numpy, and no activation byte is copied to send."""
    from duckpipe.moe import Gate, MoeMlp

    with (
        veth_ducks([2, 2]) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        moe = MoeMlp.random(8, 128, 32, shared=False, seed=5)
        gate = Gate.random(8, 128, topk=2, seed=5)
        c.load_weights(2, moe)  # 2 experts a duck, ducks 0-1 on one port, 2-3 on the other
        rng = np.random.default_rng(5)
        for mode in ("broadcast", "unicast", "auto"):
            for tokens in (1, 4, 48):
                x = rng.standard_normal((tokens, 128)).astype(np.float32)
                indices, weights = gate(x)
                y = c.forward(2, x, routing=(indices, weights), moe_send=mode, timeout=5)
                np.testing.assert_allclose(
                    y, moe.reference(x, indices, weights), rtol=1e-4, atol=1e-5
                )
        n = c.stats().counters
    assert n["moe_forwards"] == 9 and n["timeouts"] == 0, n
    assert n["moe_broadcasts"] >= 3 and n["moe_unicasts"] >= 3, n
    assert n["rx_unrouted"] == 0 and n["rx_malformed"] == 0, (n, dp.log)
    assert n["moe_copied_bytes"] == 0, n


@pytest.mark.parametrize("pmd", ["af_packet", "af_xdp"])
def test_lost_datagrams_are_recovered_by_nacks(pmd):
    with (
        veth_ducks([4], duck_args=("--drop", "0.05", "--seed", "7"), pmd=pmd) as net,
        _dataplane(net, nack_us=2000, nack_min_us=1000) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(512, 64, seed=4)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 30)
        n = c.stats().counters
    assert n["forwards_ok"] == 30 and n["timeouts"] == 0, n
    assert n["nacks_sent"] + n["retransmits"] > 0, n  # some were lost, and asked for again


def test_a_port_the_eal_does_not_have_fails_at_startup_naming_the_call():
    with veth_ducks([1]) as net:
        bad = Topology(
            nics=[
                Nic(
                    name="p0",
                    backend="dpdk",
                    interface="net_af_packet7",
                    host_ip=net.nics[0].host_ip,
                    ducks=net.nics[0].ducks,
                )
            ],
            max_inflight=16,
            max_forward_bytes=256 << 10,
        )
        dp = DataplaneProcess(bad, backend_args=net.eal)
        try:
            with pytest.raises(DuckpipeError, match="rte_eth_dev_get_port_by_name") as e:
                dp.start()
            assert "net_af_packet0" in str(e.value)  # the ports it does have
        finally:
            dp.stop()
            dp.close()


def test_ducks_that_come_up_after_the_dataplane_are_resolved_on_demand():
    with veth_ducks([2], late=True) as net, _dataplane(net) as dp:
        net.start_ducks()  # the ARP at open found nobody: the first datagrams find no MAC
        with duckpipe.connect(dp.control) as c:
            mlp = GeluMlp.random(256, 64, seed=5)
            c.load_weights(1, mlp)
            _check_forwards(c, mlp, 5)
            n = c.stats().counters
    assert n["tx_no_mac"] >= 1 and n["arp_learned"] >= 1, n  # asked again on the miss
    assert n["forwards_ok"] == 5 and n["timeouts"] == 0, n


_SEND_JUNK = """
import socket, sys
host, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
s.setsockopt(socket.IPPROTO_IP, 10, 0)  # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: may fragment
s.sendto(b"x" * 100, (host, port + 1))  # another port
s.sendto(b"not a wire header" * 4, (host, port))  # the right port, garbage inside
s.sendto(b"y" * 3000, (host, port))  # fragments on a 1500-byte veth
"""


@pytest.mark.parametrize("pmd", ["af_packet", "af_xdp"])
def test_frames_not_for_us_fragments_and_garbage_are_counted_and_dropped(pmd):
    with (
        veth_ducks([1], pmd=pmd) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        nic = net.nics[0]
        subprocess.run(
            ["ip", "netns", "exec", net.spaces[0], sys.executable, "-c", _SEND_JUNK,
             nic.host_ip, str(HOST_PORT), nic.ducks[0].ip],
            check=True, capture_output=True, timeout=10,
        )  # fmt: skip
        mlp = GeluMlp.random(64, 32, seed=6)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 3)  # and the dataplane still serves
        n = c.stats().counters
    assert n["rx_not_ours"] >= 1, n  # the other port
    if pmd == "af_xdp":
        assert n["rx_fragments"] >= 2, n  # the 3000-byte datagram's three fragments
        assert n["rx_malformed"] >= 1, n  # the garbage, refused by the wire check
    else:
        # af_packet's fanout reassembles fragments (PACKET_FANOUT_FLAG_DEFRAG): the
        # datagram arrives whole, in more than one mbuf, and is refused as malformed
        assert n["rx_fragments"] == 0 and n["rx_malformed"] >= 2, n
    assert n["forwards_ok"] == 3, n


_SEND_CUT_FRAMES = r"""
import socket, struct, sys
far, host = sys.argv[1], sys.argv[2:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((far, 0))
for dst in host:  # an IP header that claims 15,244 bytes in a frame of 142: cut
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 15244, 0, 0, 64, 17, 0,
                     socket.inet_aton("127.0.0.1"), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", 40000, 47000, 15224, 0)
    s.send(b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip + udp + b"z" * 100)
"""


def test_a_cut_frame_for_another_address_is_not_ours_and_one_for_us_is_malformed_and_said():
    # net_af_packet's socket hears every interface until the PMD binds it to its own:
    # under load a port started with loopback's 15 KB datagrams queued, cut to the
    # ring's frames, and counted them malformed (a CI failure of the MoE test above)
    with (
        veth_ducks([1]) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        nic = net.nics[0]
        before = c.stats().counters
        subprocess.run(
            ["ip", "netns", "exec", net.spaces[0], sys.executable, "-c", _SEND_CUT_FRAMES,
             net.far_ends[0], "127.0.0.1", nic.host_ip],
            check=True, capture_output=True, timeout=10,
        )  # fmt: skip
        mlp = GeluMlp.random(64, 32, seed=6)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 2)
        n = c.stats().counters
    assert n["rx_malformed"] - before["rx_malformed"] == 1, n  # ours alone
    assert n["rx_not_ours"] - before["rx_not_ours"] >= 1, n
    said = f"from 127.0.0.1 to {nic.host_ip}, IP length 15244, protocol 17 (rx_malformed)"
    assert said in dp.log, dp.log


_SEND_CHECKSUMMED = """
import socket, struct, sys
host, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def csum(b):
    b += bytes(len(b) % 2)
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)  # UDP header ours
s.bind((src, 0))
for mode, n in zip(sys.argv[4::2], map(int, sys.argv[5::2])):
    payload = bytes((7 * i + n) & 0xFF for i in range(n))
    udp = struct.pack("!HHHH", 40000, port, 8 + n, 0) + payload
    phdr = socket.inet_aton(src) + socket.inet_aton(host) + struct.pack("!BBH", 0, 17, 8 + n)
    c = csum(phdr + udp) or 0xFFFF
    c = {"good": c, "none": 0, "bad": c ^ 0x0104}[mode]
    s.sendto(udp[:6] + struct.pack("!H", c) + udp[8:], (host, 0))
"""


@pytest.mark.parametrize("pmd", ["af_packet", "af_xdp"])
def test_datagrams_with_a_wrong_udp_checksum_are_counted_and_dropped(pmd):
    # lengths for both sums (inline below 256 bytes, vector above) and an odd last byte
    sends = [("bad", 17), ("bad", 300), ("bad", 1401), ("good", 17), ("good", 1401), ("none", 64)]
    with (
        veth_ducks([2], pmd=pmd) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        nic = net.nics[0]
        mlp = GeluMlp.random(2048, 64, seed=7)  # replies of several datagrams per duck
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 3)
        before = c.stats().counters
        subprocess.run(
            ["ip", "netns", "exec", net.spaces[0], sys.executable, "-c", _SEND_CHECKSUMMED,
             nic.host_ip, str(HOST_PORT), nic.ducks[0].ip,
             *(str(x) for send in sends for x in send)],
            check=True, capture_output=True, timeout=10,
        )  # fmt: skip
        _check_forwards(c, mlp, 3, seed=1)  # and the dataplane still serves
        n = c.stats().counters
    assert n["rx_bad_checksum"] == 3, n  # the bad ones only: "good" and "none" pass it
    assert before["rx_bad_checksum"] == 0, before  # the ducks' replies all checked good
    # the three that passed the checksum were refused further on (not a duck's port)
    refused = ("rx_unknown_sender", "rx_malformed")
    assert sum(n[k] - before[k] for k in refused) == 3, n
    assert n["forwards_ok"] == 6, n


def test_eal_options_it_refuses_fail_at_startup_naming_rte_eal_init():
    with veth_ducks([1]) as net:
        dp = DataplaneProcess(_topology(net), backend_args=[*net.eal, "--no-such-eal-option"])
        try:
            with pytest.raises(DuckpipeError, match=r"rte_eal_init: .*the EAL options come after"):
                dp.start()
        finally:
            dp.stop()
            dp.close()


def test_stats_shows_the_ports_xstats_beside_the_backends_counters():
    with (
        veth_ducks([4]) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        mlp = GeluMlp.random(256, 96, seed=3)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 10)
        time.sleep(0.25)  # the worker's reading of the port's xstats: up to 100 ms old
        stats = c.stats()
        shown = subprocess.run(
            [sys.executable, "-m", "duckpipe", "stats", "--control-query", "--control",
             dp.control],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    n = stats.counters
    assert [(x.name, x.backend) for x in stats.nics] == [("p0", "dpdk")]
    xs = stats.nics[0].xstats
    # the port saw at least what the backend counted: its frames also carry ARP
    assert n["tx_packets"] > 0 and xs["tx_good_packets"] >= n["tx_packets"], (xs, n)
    assert xs["rx_good_packets"] >= n["rx_packets"] > 0, (xs, n)
    assert xs["tx_good_bytes"] >= n["tx_bytes"], (xs, n)
    assert all(v > 0 for v in xs.values()) and stats.nics[0].xstats_left_out == 0, xs
    assert shown.returncode == 0, shown.stderr
    assert "nic p0 (dpdk) port xstats:" in shown.stdout, shown.stdout
    assert any(line.split()[:1] == ["tx_good_packets"] for line in shown.stdout.splitlines())


@pytest.mark.parametrize("steering", ["auto", "off"])
def test_a_port_without_rte_flow_runs_without_steering_unless_required(steering):
    # af_packet has no rte_flow: "auto" says so once and serves, "off" never asks
    with veth_ducks([2]) as net:
        net.nics = [msgspec.structs.replace(n, flow_steering=steering) for n in net.nics]
        with _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
            mlp = GeluMlp.random(128, 32, seed=4)
            c.load_weights(1, mlp)
            _check_forwards(c, mlp, 3)
            out = dp.output()
    said = "no rte_flow steering" in out and "rte_flow_validate" in out
    assert said == (steering == "auto"), out
    assert ("no flow isolation" in out) == (steering == "auto"), out
    assert "rte_flow steers" not in out, out


def test_required_flow_steering_on_a_port_without_rte_flow_fails_naming_the_call():
    # the first thing "require" asks for is isolation (before rte_eth_dev_configure)
    with veth_ducks([1]) as net:
        net.nics = [msgspec.structs.replace(n, flow_steering="require") for n in net.nics]
        dp = DataplaneProcess(_topology(net), backend_args=net.eal)
        try:
            with pytest.raises(
                DuckpipeError, match=r"flow_steering = \"require\".*rte_flow_isolate"
            ):
                dp.start()
        finally:
            dp.stop()
            dp.close()


def test_the_eal_loads_the_e810_ice_pmd_from_debians_driver_directory():
    # The production NIC's driver (docs/dpdk.md: Intel E810): Debian's DPDK is linked shared,
    # and rte_eal_init opens every PMD in its driver directory (pmds-23.0). There is no
    # E810 here: this checks that the ice PMD is installed and loads into this dataplane.
    with veth_ducks([1]) as net:
        net.eal = [*net.eal, "--log-level=lib.eal:debug"]
        with _dataplane(net) as dp:
            out = dp.output()
    assert re.search(r"open shared lib \S+/pmds-[\d.]+/librte_net_ice\.so", out), (
        "librte_net_ice.so was not loaded: install Debian's librte-net-ice23 (in `dpdk`)\n"
        + "\n".join(line for line in out.splitlines() if "shared lib" in line)[:2000]
    )


def test_stats_asked_all_through_shutdown_never_read_a_closed_port():
    # the control agent reads the port's xstats while the worker owns the port; close
    # waits for a read in flight and none starts after (dp_backend_xstats_dead), however
    # main orders the agents' stop and the ports' close
    # (dedicated threads: the worker on an EAL worker lcore of its own)
    with (
        veth_ducks([2], lcores=("--lcores=0@0,1@1",)) as net,
        _dataplane(net, threads="dedicated") as dp,
    ):
        stop = threading.Event()
        replies: list[ctl.Stats] = []

        def ask() -> None:
            while not stop.is_set():
                r = control_request(dp.control, ctl.GetStats(req_id=1), 0.5)
                if isinstance(r, ctl.Stats):
                    replies.append(r)

        askers = [threading.Thread(target=ask) for _ in range(2)]
        for t in askers:
            t.start()
        time.sleep(0.5)
        try:
            assert dp.stop() == 0, dp.output()  # _dataplane checks the log at exit too
        finally:
            stop.set()
            for t in askers:
                t.join()
    assert replies and all(r.nics[0].xstats.get("tx_good_packets", 0) > 0 for r in replies)


def test_an_idle_port_that_frees_only_on_later_traffic_gets_a_flush_burst(monkeypatch):
    # the knob's "traffic:32": the port frees a sent buffer only once 32 more frames went
    # out after it, as ice does (it reports completions every tx_rs_thresh descriptors).
    # After a forward's last burst the queue falls idle: nothing more would come but a
    # PING now and then, and the slot would wait for 32 of them. Within zc_hold_max_us
    # the worker sends a flush burst instead and the forward completes.
    monkeypatch.setenv("DUCKPIPE_DPDK_TX_HOLD_US", "traffic:32")
    with veth_ducks([2]) as net, _dataplane(net) as dp, duckpipe.connect(dp.control) as c:
        mlp = GeluMlp.random(512, 32, seed=8)
        c.load_weights(1, mlp)
        rng = np.random.default_rng(5)
        for _ in range(4):
            x = rng.standard_normal((4, mlp.hidden)).astype(np.float32)  # 8 KiB: in place
            np.testing.assert_allclose(
                c.forward(1, x, timeout=2), mlp.reference(x), rtol=1e-4, atol=1e-5
            )
        n = c.stats().counters
        out = dp.output()
    assert "traffic:32" in out, out
    assert n["forwards_ok"] == 4 and n["timeouts"] == 0, n
    print({k: n[k] for k in ("tx_release_deferred", "tx_zero_copy", "tx_flush_frames", "pings")})
    # the buffers were let go by flush bursts (32 frames each), never by waiting for 32
    # PINGs (2 s of timeout is 4 PINGs). Whether a part ended before its flush (and so
    # waited: tx_release_deferred) or after depends on the ducks' reply time against
    # zc_hold_max_us: either way each part that waited had its flush.
    assert n["tx_zero_copy"] >= 4 * 2 and n["tx_flush_frames"] >= 32, n
    assert n["tx_flush_frames"] >= 32 * n["tx_release_deferred"], n
