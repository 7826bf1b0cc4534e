"""Weight chunks in flight share the NIC worker's send budget and window of datagrams
fairly (dp_worker.c, timers()): none waits behind chunks that came after it until its
deadline passes.

A load is a stream of chunks, client_max_inflight at a time. When a chunk is done the
worker moves its newest entry into the freed place; a scheduler that always starts at
the same place serves the newest chunks first, loop after loop, and a chunk in the
middle waits until the stream ends. With replies held by the ducks, the window caps the
load's rate on any machine, so the load lasts well past weight_timeout_ms while a
fair share gets every chunk acknowledged in a fraction of it: an unfair scheduler fails
the load (the dataplane's own deadline), a fair one loads it.
"""

from __future__ import annotations

import time

import numpy as np

import duckpipe

# Every reply held 10 ms: with at most WEIGHT_WINDOW (128, dp_worker.c) datagrams of at
# most 1500 bytes unacknowledged, the load moves at most 128 * 1500 B / 10 ms = 19.2 MB/s.
DELAY_US = 10_000
WINDOW_BYTES_PER_DELAY = 128 * 1500
WEIGHT_TIMEOUT_MS = 1000
# 16 chunks of 64 KiB in flight (about 720 datagrams, each chunk 45): many more than the
# window holds, so the scheduler decides who waits; a fair share acknowledges a chunk in
# about 1 MiB / 19 MB/s = 55 ms, far within the deadline.
CHUNK_BYTES = 64 << 10
CHUNKS_IN_FLIGHT = 16
HIDDEN, FFN = 256, 24576  # float32 GELU: 50 MB, 2.6 s or more at the rate above


def test_no_weight_chunk_waits_behind_later_ones_past_its_deadline(duckpipe_cluster_factory):
    cl = duckpipe_cluster_factory(
        2,
        duck_args=["--delay-us", str(DELAY_US)],
        weight_timeout_ms=WEIGHT_TIMEOUT_MS,
        max_forward_bytes=CHUNK_BYTES,
        client_max_inflight=CHUNKS_IN_FLIGHT,
    )
    mlp = duckpipe.GeluMlp.random(HIDDEN, FFN)
    nbytes = sum(a.nbytes for a in (mlp.w_up, mlp.b_up, mlp.w_down))
    floor_s = nbytes / WINDOW_BYTES_PER_DELAY * DELAY_US / 1e6
    assert floor_s > 2 * WEIGHT_TIMEOUT_MS / 1000  # the stream outlasts a chunk's deadline
    with duckpipe.connect(cl.control) as client:
        t0 = time.monotonic()
        client.load_weights(0, mlp)  # LayerFailed: a chunk missed its deadline
        took = time.monotonic() - t0
        # the cap holds (a wider window would make this test prove nothing): a lower bound,
        # which a loaded machine only makes longer
        assert took >= floor_s, f"{nbytes} bytes loaded in {took:.2f} s"
        x = np.random.default_rng(1).standard_normal((4, HIDDEN)).astype(np.float32)
        np.testing.assert_allclose(client.forward(0, x), mlp.reference(x), rtol=1e-4, atol=1e-4)
