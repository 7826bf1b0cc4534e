"""The control plane: clear errors when nobody listens, garbage never hurts the dataplane."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

import duckpipe
from duckpipe import GeluMlp
from duckpipe.errors import BadInput, DataplaneRefused, DataplaneUnavailable, SegmentError
from duckpipe.mock.process import MockDataplaneProcess, control_request, ping
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR
from duckpipe.testing import set_faults


def test_connect_without_a_dataplane_says_how_to_start_one(tmp_path):
    with pytest.raises(DataplaneUnavailable, match="duckpipe mock-dataplane"):
        duckpipe.connect(f"ipc://{tmp_path}/nobody")


def test_connect_to_a_silent_endpoint_times_out_cleanly():
    t0 = time.monotonic()
    with pytest.raises(DataplaneUnavailable, match=r"within 0\.3 s"):
        duckpipe.connect("tcp://127.0.0.1:9", timeout=0.3)
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("address", ["foo", "tcp://127.0.0.1", "/run/duckpipe/control", ""])
def test_connect_to_something_not_an_address_says_what_an_address_is(address):
    # libzmq would refuse it with a bare EINVAL (zmq.error.ZMQError), outside the family
    with pytest.raises(BadInput, match=r"is not a control address.*ipc://.*tcp://HOST:PORT"):
        duckpipe.connect(address)


@pytest.mark.parametrize("which", ["mock", "real"])
def test_a_segment_over_a_limit_names_that_limit_and_both_ways_past_it(which, request):
    limits = {"client_max_segment_bytes": 16 << 20, "client_max_slots": 16}
    if which == "mock":
        flags = [f for k, v in limits.items() for f in ("--" + k.replace("_", "-"), str(v))]
        dp = request.getfixturevalue("duckpipe_mock_factory")(ducks=2, args=flags)
    else:
        dp = request.getfixturevalue("duckpipe_null_factory")(ducks=2, **limits)
    with pytest.raises(SegmentError) as e:
        duckpipe.connect(dp.control, slots=8, slot_size=2 << 20)  # 8 x (2 + 2) MiB and more
    bytes_msg = str(e.value)
    assert "over this dataplane's client_max_segment_bytes 16777216 (16.0 MiB)" in bytes_msg
    assert "smaller slots (slots=, slot_size=)" in bytes_msg, bytes_msg
    assert "raise client_max_segment_bytes in its topology" in bytes_msg, bytes_msg
    assert "client_max_slots" not in bytes_msg  # not the limit it is over
    with pytest.raises(SegmentError) as e:
        duckpipe.connect(dp.control, slots=32, slot_size=4096)
    slots_msg = str(e.value)
    assert "32 slots: over this dataplane's client_max_slots 16; " in slots_msg, slots_msg
    assert "fewer (slots=), or raise client_max_slots in its topology" in slots_msg
    assert "client_max_segment_bytes" not in slots_msg


def test_garbage_on_the_control_socket_is_counted_and_ignored(dataplane):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dataplane.control)
    before = ping(dataplane.control, 2).counters["bad_control_messages"]
    for junk in (b"", b"\xff\x00garbage", b"\x81\xa4type\xa7Nothing"):
        sock.send(junk)
        assert sock.poll(2000)
        reply = ctl.reply_decoder.decode(sock.recv())
        assert isinstance(reply, ctl.Error) and reply.code == ctl.ErrorCode.BAD_MESSAGE
    sock.send_multipart([b"two", b"frames"])
    sock.close()
    time.sleep(0.1)
    assert ping(dataplane.control, 2).counters["bad_control_messages"] == before + 4
    with duckpipe.connect(dataplane.control) as c:  # still serving
        c.load_weights(40, GeluMlp.random(8, 8, seed=1), ducks=[0])
        assert c.forward(40, np.ones((1, 8), np.float32)).shape == (1, 8)


def test_attach_with_another_abi_version_is_refused(dataplane):
    reply = control_request(
        dataplane.control,
        ctl.Attach(req_id=1, abi_major=99, pid=1, segment="none", segment_fd=0),
        2,
    )
    assert isinstance(reply, ctl.Error) and reply.code == ctl.ErrorCode.ABI_MISMATCH


def test_attach_to_a_missing_segment_is_refused(dataplane):
    reply = control_request(
        dataplane.control,
        ctl.Attach(req_id=1, abi_major=ABI_MAJOR, pid=1, segment="missing", segment_fd=0),
        2,
    )
    assert isinstance(reply, ctl.Error) and reply.code == ctl.ErrorCode.BAD_SEGMENT


def test_a_second_dataplane_on_a_busy_address_refuses_to_start(dataplane):
    with pytest.raises(DataplaneUnavailable, match="already running"):
        MockDataplaneProcess(control=dataplane.control, ready_timeout=10).start()
    assert ping(dataplane.control, 2) is not None


def test_set_faults_rejects_unknown_ducks_or_points_to_the_emulator(dataplane):
    if isinstance(dataplane, MockDataplaneProcess):
        with pytest.raises(DataplaneRefused, match="do not exist"):
            set_faults(dataplane.control, dead_ducks=[200])
    else:  # the C dataplane has no fault knobs of its own: the duck emulator has them
        with pytest.raises(DataplaneRefused, match="duckpipe ducks --drop"):
            set_faults(dataplane.control, dead_ducks=[1])


def test_topology_lists_every_duck(client, dataplane):
    topo = client.topology()
    assert [d.id for d in topo.ducks] == list(range(dataplane.ducks))
    assert all(d.nic == topo.nics[0].name for d in topo.ducks)


def test_stats_lists_every_nic_and_a_socket_nic_has_no_port_xstats(client, dataplane):
    topo = client.topology()
    stats = control_request(dataplane.control, ctl.GetStats(req_id=9), 2.0)
    assert isinstance(stats, ctl.Stats)
    assert [(n.name, n.backend) for n in stats.nics] == [(n.name, n.backend) for n in topo.nics]
    assert all(n.xstats == {} and n.xstats_left_out == 0 for n in stats.nics)


def test_an_older_stats_reply_without_nics_still_decodes():
    old = {"type": "Stats", "req_id": 1, "mode": "socket", "epoch": 0, "counters": {},
           "clients": []}  # fmt: skip
    stats = ctl.reply_decoder.decode(ctl.encoder.encode(old))
    assert isinstance(stats, ctl.Stats) and stats.nics == []
