"""Reload churn: a client that reloads a layer faster than the dataplane frees the old ones.

A reload unpublishes the layer it replaces; the old one is freed only once no forward or
weight chunk holds it and the dispatcher has made a pass since. Pipelined reloads of one
layer (hidden 65536), replies never read, once grew the dataplane's RSS by 430 MiB against
a 1 MiB weight quota. Retired layers now count against their owner until freed.
"""

from __future__ import annotations

import os

import numpy as np
import psutil
import pytest
import zmq

import duckpipe
from duckpipe import GeluMlp
from duckpipe._abi.shm import Segment
from duckpipe.client.session import Doorbell
from duckpipe.errors import QuotaExceeded
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR, DType, MlpKind
from duckpipe.schema.control import ErrorCode
from duckpipe.testing import null_backend_result

pytestmark = pytest.mark.dataplane

QUOTA = 4 << 20
HIDDEN = 65536  # the default max_hidden: each reload allocates 2 x 256 KiB for b_down
RELOADS = 1000


def _reload(req_id: int) -> ctl.LoadWeights:
    # plan bytes (dp_load_plan_bytes): w_up, b_up and w_down of one column, and b_down raw
    # and as float: 1 MiB and 4 bytes, so four fit the quota and a fifth does not
    return ctl.LoadWeights(
        req_id=req_id,
        layer=1,
        kind=int(MlpKind.GELU),
        dtype=int(DType.F32),
        hidden=HIDDEN,
        ffn=1,
        ducks=[0],
        shard_sizes=[1],
        has_b_down=True,
    )


def test_pipelined_reloads_stay_within_the_weight_quota(duckpipe_null_factory):
    # dedicated threads: the dispatcher parks between the housekeeping's nudges, so the
    # old layers wait for its next pass while the control agent takes the burst; before,
    # all 1000 reloads were acknowledged and the RSS grew by ~250 MiB
    dp = duckpipe_null_factory(1, client_max_weight_bytes=QUOTA, threads="dedicated")
    seg = Segment.create(slot_count=2, act_slot_size=4096, backing="devshm", tag="reloads")
    bell = Doorbell()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dp.control)
    try:
        sock.send(
            ctl.encoder.encode(
                ctl.Attach(
                    req_id=1,
                    abi_major=ABI_MAJOR,
                    pid=os.getpid(),
                    segment="reloads",
                    segment_fd=seg.fd,
                    doorbell_fd=bell.read_fd,
                )
            )
        )
        assert sock.poll(10_000), "no reply to Attach"
        assert isinstance(ctl.reply_decoder.decode(sock.recv()), ctl.Attached)
        proc = psutil.Process(dp.pid)
        rss = proc.memory_info().rss
        for i in range(RELOADS):
            sock.send(ctl.encoder.encode(_reload(10 + i)))  # no reply read in between
        replies = []  # past 256 unread (ROUTER_SNDHWM), the dataplane drops replies
        while len(replies) < RELOADS and sock.poll(5_000):
            replies.append(ctl.reply_decoder.decode(sock.recv()))
        grown = proc.memory_info().rss - rss
    finally:
        sock.close()
        seg.close()
        bell.close()
    refused = [r for r in replies if isinstance(r, ctl.Error)]
    assert refused, f"{len(replies)} replies, none refused"
    assert all(r.code == ErrorCode.QUOTA_EXCEEDED for r in refused), refused[0]
    assert "replaced but not freed yet: read the replies and retry" in refused[0].message
    assert grown < 32 << 20, f"the dataplane grew by {grown >> 20} MiB"


def test_a_layer_near_the_quota_is_reloaded_again_and_again(duckpipe_null_factory):
    # the layer a reload replaces does not count, and those replaced before are freed at
    # the next LoadWeights once nothing holds them: a client that reads its replies
    # reloads a layer of 70% of its quota as often as it likes
    mlp = GeluMlp.random(64, 32, seed=1)
    plan = (64 * 32 * 2 + 32) * 4 + 64 * 8  # shards of one duck, and b_down raw and float
    dp = duckpipe_null_factory(1, client_max_weight_bytes=plan * 10 // 7)
    x = np.ones((1, 64), np.float32)
    with duckpipe.connect(dp.control, slots=2, slot_size=4096) as c:
        for _ in range(20):
            c.load_weights(1, mlp, progress=False)
            np.testing.assert_array_equal(
                c.forward(1, x, timeout=10), null_backend_result(x, 1, mlp.b_down)
            )
        with pytest.raises(QuotaExceeded, match="would pass this client's quota"):
            c.load_weights(2, mlp, progress=False)  # a second one does not fit
