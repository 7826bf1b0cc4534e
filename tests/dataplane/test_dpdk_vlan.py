"""802.1Q: the dpdk backend parses no VLAN tag (docs/dpdk.md says so).

A datagram for the host's address and port from a duck's address, sent with a VLAN tag
from the ducks' namespace, is counted as ``rx_not_ours`` and dropped,
and the untagged ducks are served as before. Same network helpers as test_dpdk.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_dpdk import (
    HOST_PORT,
    _check_forwards,
    _dataplane,
    _near_mac,
    _wait_counter,
    veth_ducks,
)

import duckpipe
from duckpipe import GeluMlp

pytestmark = [pytest.mark.dataplane, pytest.mark.dpdk, pytest.mark.root]

TAGGED = 20  # datagrams sent with a VLAN tag

# One Ethernet frame with an 802.1Q tag (VLAN 5) around IPv4/UDP to host:port, sent raw
# on the far end (this kernel has no 8021q module for a VLAN sub-interface).
_SEND = """
import socket, struct, sys
dev, dst_mac, src_ip, dst_ip, port, count = sys.argv[1:7]
src_mac = open(f"/sys/class/net/{dev}/address").read().strip()
payload = b"x" * 64
udp = struct.pack("!HHHH", 47999, int(port), 8 + len(payload), 0) + payload
ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0x4000, 64, 17, 0,
                           socket.inet_aton(src_ip), socket.inet_aton(dst_ip)))
words = sum(struct.unpack("!10H", ip))
words = (words & 0xFFFF) + (words >> 16)
ip[10:12] = struct.pack("!H", ~((words & 0xFFFF) + (words >> 16)) & 0xFFFF)
mac = lambda m: bytes.fromhex(m.replace(":", ""))
frame = mac(dst_mac) + mac(src_mac) + struct.pack("!HHH", 0x8100, 5, 0x0800) + bytes(ip) + udp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
for _ in range(int(count)):
    s.send(frame)
"""


def test_a_vlan_tagged_datagram_for_the_host_is_counted_as_not_ours_and_dropped():
    with (
        veth_ducks([1]) as net,
        _dataplane(net) as dp,
        duckpipe.connect(dp.control) as c,
    ):
        ns, far, host = net.spaces[0], net.far_ends[0], net.nics[0].host_ip
        before = c.stats().counters["rx_not_ours"]
        subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _SEND, far,
             _near_mac(net.near_ends[0]), net.nics[0].ducks[0].ip, host, str(HOST_PORT),
             str(TAGGED)],
            check=True, capture_output=True, timeout=10,
        )  # fmt: skip
        n = _wait_counter(c, "rx_not_ours", before + TAGGED)
        mlp = GeluMlp.random(64, 16, seed=8)
        c.load_weights(1, mlp)
        _check_forwards(c, mlp, 2)  # the untagged ducks: served as before
        after = c.stats().counters
    assert n["rx_not_ours"] >= before + TAGGED, (before, n)
    assert after["rx_malformed"] == 0 and after["rx_unknown_sender"] == 0, after
