"""Seed corpora for the libFuzzer harnesses in dataplane/fuzz, made from real messages.

    .venv/bin/python dataplane/fuzz/make_seeds.py

Datagrams come from duckpipe.testing.datagrams's encoder, control messages from the msgspec
schema (duckpipe/schema/control.py) and its encoder: what a real duck and a real
client send, so the fuzzers start from inside the parsers rather than at their
first check. Rerun after a wire or control schema change and commit the result.
Each harness's input format is described at the top of its .c file.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

from duckpipe._native import lib

from duckpipe.testing import datagrams as wire

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"

# fuzz_wire_reasm's fixed forward (see the harness)
SESSION, EPOCH, FWD_ID = 0x5E55, 7, (3 << 16) | 1


def write(harness: str, name: str, data: bytes, prefix: str = "seed") -> None:
    d = CORPUS / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{prefix}-{name}").write_bytes(data)


# --- fuzz_routing -----------------------------------------------------------------------


def routing_params(
    n_experts: int, rows: int, replicas: int = 1, stride: int = 0, nic: int = 0, broken=False
) -> bytes:
    """fuzz_routing's layer, forward, placement and NIC before the table (see the harness)."""
    shape = (replicas - 1) | (0x80 if broken else 0)
    return struct.pack("<HHBBBx", n_experts - 1, rows, shape, stride, nic)


def routing_seeds() -> None:
    """Tables packed by duckpipe.client.routing from real gates (seed-*), the hostile
    variants the C test refuses (hostile-*), and wire tables split from them (wire-*)."""
    import numpy as np

    from duckpipe.client import routing
    from duckpipe.moe import Gate
    from duckpipe.schema.routing import ROUTING_MAGIC

    h = "fuzz_routing"
    rng = np.random.default_rng(7)
    # DeepSeek-V3's gate: 256 experts, 8 of 8 groups kept 4, sigmoid with bias
    i, w = Gate.deepseek_v3(hidden=64)(rng.standard_normal((8, 64)).astype(np.float32))
    ds = routing.pack(i, w, 256).tobytes()
    write(h, "deepseek-v3-8-tokens", routing_params(256, 8) + ds)
    # replicas (up to 3 per expert), and the odd ducks as one NIC's (v = 0x19)
    write(h, "deepseek-v3-replicas-one-nic", routing_params(256, 8, 3, 5, 0x19) + ds)
    small = Gate.random(8, 16, topk=2, seed=3)
    i, w = small(rng.standard_normal((4, 16)).astype(np.float32))
    write(
        h, "softmax-8-experts", routing_params(8, 4, 2, 1, 0x02) + routing.pack(i, w, 8).tobytes()
    )
    one = routing.pack(np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32), 1).tobytes()
    write(h, "one-token-one-expert", routing_params(1, 1) + one)
    wide = Gate.random(64, 16, topk=16, seed=4)
    i, w = wide(rng.standard_normal((3, 16)).astype(np.float32))
    write(h, "topk-16", routing_params(64, 3, 8, 9) + routing.pack(i, w, 64).tobytes())
    # DeepEP's -1 ("no expert"): mixed in, a token of only -1, weights there NaN
    holes = np.array([[3, -1, 0, -1], [-1, -1, -1, -1], [2, 7, -1, 5]], np.int32)
    hw = np.where(holes < 0, np.nan, 0.5).astype(np.float32)
    write(h, "no-expert", routing_params(8, 3, 2, 1) + routing.pack(holes, hw, 8).tobytes())

    # hostile variants of the DeepSeek-V3 table: each one is refused
    def entry(t: int, k: int) -> int:
        return 16 + 8 * (t * 8 + k)

    def patched(offset: int, fmt: str, value) -> bytes:
        b = bytearray(ds)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    prm = routing_params(256, 8)
    dup_expert = struct.unpack_from("<I", ds, entry(2, 0))[0]
    write(h, "duplicate-expert", prm + patched(entry(2, 1), "<I", dup_expert), "hostile")
    # a token's experts out of their ascending order (a gate's by-score order, unsorted)
    swapped = bytearray(ds)
    swapped[entry(4, 0) : entry(4, 2)] = ds[entry(4, 1) : entry(4, 2)] + ds[entry(4, 0) : entry(4, 1)]
    write(h, "experts-out-of-order", prm + bytes(swapped), "hostile")
    write(h, "expert-past-the-layer", prm + patched(entry(7, 7), "<I", 256), "hostile")
    write(h, "nan-weight", prm + patched(entry(3, 1) + 4, "<I", 0x7FC00000), "hostile")
    write(h, "inf-weight", prm + patched(entry(0, 0) + 4, "<I", 0x7F800000), "hostile")
    write(h, "truncated", prm + ds[:-1], "hostile")
    # 2^32-1 tokens by 2^16-1 experts: 2^51 bytes, if anything multiplied it unchecked
    huge = struct.pack("<IBBHII", ROUTING_MAGIC, 1, 0, 0xFFFF, 0xFFFFFFFF, 256)
    write(h, "counts-overflow", routing_params(256, 0xFFFF) + huge + ds[16:], "hostile")
    write(h, "placement-without-duck", routing_params(256, 8, broken=True) + ds, "hostile")

    # wire tables: DeepSeek-V3's on 32 ducks of 8 experts, and one duck's unicast
    place = routing.placement([[e // 8] for e in range(256)])
    wire_table, targets = routing.split(ds, place)
    write(h, "wire-deepseek-v3-32-ducks", prm + wire_table.tobytes())
    duck = min(targets)
    uni, row_map = routing.unicast(wire_table, duck)
    write(h, "wire-unicast", routing_params(256, len(row_map)) + uni.tobytes())
    # the first two entries of the first section that has two, swapped
    by_duck = routing.sections(wire_table, 8, 256)
    before = 0
    for d in sorted(by_duck):
        if len(by_duck[d].row) >= 2:
            break
        before += len(by_duck[d].row)
    at = 16 + 8 * (len(by_duck) + before)
    swapped = bytearray(wire_table.tobytes())
    swapped[at : at + 16] = swapped[at + 8 : at + 16] + swapped[at : at + 8]
    write(h, "wire-out-of-order", prm + bytes(swapped), "hostile")


# --- fuzz_wire_reasm ------------------------------------------------------------------


def scenario(f16: bool, elems: int, mtu: int, nducks: int) -> bytes:
    return struct.pack("<BHHBxx", int(f16), elems, mtu - 128, nducks - 1)


def framed(datagrams: list[bytes]) -> bytes:
    """Tag 0: each datagram as long as its header says."""
    return b"".join(b"\0" + d for d in datagrams)


def partials(f16: bool, elems: int, mtu: int, duck: int, rng: random.Random) -> list[bytes]:
    """A duck's whole answer, cut the way dp_duck.c cuts it."""
    item = 2 if f16 else 4
    total = elems * item
    payload = wire.payload_max(mtu)
    chunks = max(1, -(-total // payload))
    fmt = f"<{elems}{'e' if f16 else 'f'}"
    values = struct.pack(fmt, *(rng.uniform(-2, 2) for _ in range(elems)))
    out = []
    for c in range(chunks):
        body = values[c * payload : (c + 1) * payload]
        out.append(
            wire.encode(
                lib.DP_WIRE_OP_PARTIAL,
                body,
                dtype=lib.DP_DTYPE_F16 if f16 else lib.DP_DTYPE_F32,
                session=SESSION,
                epoch=EPOCH,
                forward_id=FWD_ID,
                layer=1,
                duck=duck,
                chunk=c,
                chunks=chunks,
                offset=c * payload,
                total=total,
                rows=1,
                compute_ns=1000 + c,
            )
        )
    return out


def nack(duck: int, chunks: list[int], flags: int) -> bytes:
    return wire.encode(
        lib.DP_WIRE_OP_NACK,
        struct.pack(f"<{len(chunks)}I", *chunks),
        session=SESSION,
        epoch=EPOCH,
        forward_id=FWD_ID,
        layer=1,
        duck=duck,
        flags=flags,
    )


def wire_seeds() -> None:
    rng = random.Random(7)
    h = "fuzz_wire_reasm"
    inp, nl = lib.DP_WIRE_FLAG_INPUT, lib.DP_WIRE_FLAG_NO_LAYER
    # one chunk per duck, two ducks: the common small forward
    dgs = [*partials(False, 256, 1500, 0, rng), *partials(False, 256, 1500, 1, rng)]
    write(h, "one-chunk", scenario(False, 256, 1500, 2) + framed(dgs))
    # nine chunks out of order with a duplicate, and a NACK for activation chunks
    p = partials(False, 1000, 576, 0, rng)
    dgs = [nack(1, [1, 3], inp), nack(1, [], inp), *p[::-1], p[3]]
    dgs += partials(False, 1000, 576, 1, rng)
    write(h, "reorder-dup-nack", scenario(False, 1000, 576, 2) + framed(dgs))
    # float16, a duck that lost its layer
    dgs = [*partials(True, 3000, 1500, 0, rng), nack(1, [], nl)]
    dgs += partials(True, 3000, 1500, 2, rng)
    write(h, "f16-no-layer", scenario(True, 3000, 1500, 3) + framed(dgs))
    # a short last chunk, jumbo MTU
    dgs = partials(False, 2500, 9000, 0, rng)
    write(h, "short-last", scenario(False, 2500, 9000, 1) + framed(dgs))


# --- fuzz_control -----------------------------------------------------------------------


def control_seeds() -> None:
    from duckpipe.schema import control as c

    msgs = {
        "attach": c.Attach(
            req_id=1,
            abi_major=lib.DP_ABI_MAJOR,
            pid=4242,
            segment="/memfd:duckpipe-4242-0",
            name="model-a",
            segment_fd=5,
        ),
        "detach": c.Detach(req_id=2),
        "heartbeat": c.Heartbeat(req_id=3),
        "get-topology": c.GetTopology(req_id=4),
        "get-layers": c.GetLayers(req_id=5),
        "load-weights": c.LoadWeights(
            req_id=6,
            layer=3,
            kind=1,
            dtype=2,
            hidden=4096,
            ffn=16384,
            ducks=[0, 1, 2, 3],
            shard_sizes=[4096] * 4,
            has_b_down=True,
        ),
        # a mixture of experts: 8 experts on 4 ducks, expert 7 twice, a shared expert of
        # 8 columns on each duck: what reaches the MoE plan (dp_load_moe_plan) whole
        "load-weights-moe": c.LoadWeights(
            req_id=13,
            layer=3,
            kind=3,
            dtype=1,
            hidden=64,
            ffn=176,
            ducks=[0, 1, 2, 3],
            shard_sizes=[56, 40, 40, 40],
            expert_ffn=16,
            expert_replicas=[1, 1, 1, 1, 1, 1, 1, 2],
            expert_ducks=[0, 0, 1, 1, 2, 2, 3, 3, 0],
            shared_ducks=[0, 1, 2, 3],
        ),
        "set-epoch": c.SetEpoch(req_id=7, epoch=9),
        "set-epoch-next": c.SetEpoch(req_id=8),
        "get-stats": c.GetStats(req_id=9),
        "set-faults": c.SetFaults(req_id=10, delay_ms=1.5, dead_ducks=[2], crash_after=5),
        "shutdown": c.Shutdown(req_id=11),
        "unload-layer": c.UnloadLayer(req_id=12, layer=3),
    }
    for name, msg in msgs.items():
        write("fuzz_control", name, c.encoder.encode(msg))
    # Issue 7 item 8: msgpack-c reserves room for a container's declared length before
    # reading it. A LoadWeights whose ducks list declares 2^32-1 entries in 70 bytes; a
    # decoder that checks lengths against the bytes left refuses it without allocating.
    # (bomb-found-map32 is the fuzzer's own find: a map declaring 2^32-1 pairs.)
    head = c.encoder.encode(
        c.LoadWeights(
            req_id=1, layer=1, kind=1, dtype=1, hidden=64, ffn=64, ducks=[0], shard_sizes=[64]
        )
    )
    ducks = c.encoder.encode("ducks") + b"\x91\x00"
    assert ducks in head
    bomb = head.replace(ducks, c.encoder.encode("ducks") + b"\xdd\xff\xff\xff\xff\x00")
    write("fuzz_control", "array32-ducks", bomb, prefix="bomb")


# --- fuzz_desc ----------------------------------------------------------------------------


def desc_params(
    flags: int,
    hidden: int,
    ducks: list[tuple[int, int]],
    slots: int,
    act: int,
    res: int,
    max_forward_bytes: int = 4096,
) -> bytes:
    """fuzz_desc's layer, layout and limits after the descriptor (see the harness)."""
    out = struct.pack("<BHB", flags, hidden - 1, len(ducks) - 1)
    out += b"".join(struct.pack("<BH", i, s - 1) for i, s in ducks)
    limits = (max_forward_bytes, 2_000_000, 10_000_000)
    return out + struct.pack("<BHHIII", slots - 1, act, res, *limits)


def desc(**fields) -> bytes:
    from duckpipe._native import ffi

    d = ffi.new("struct dp_desc *")
    for name, value in fields.items():
        if name in ("shape", "ducks"):
            for i, v in enumerate(value):
                getattr(d, name)[i] = v
        else:
            setattr(d, name, value)
    assert ffi.sizeof(d[0]) == 128
    return bytes(ffi.buffer(d))


def desc_seeds() -> None:
    h = "fuzz_desc"
    f16, swiglu, gelu_b_down, ready, no_layer = 1, 2, 4, 8, 16
    ducks = [(0, 32), (1, 32), (5, 16)]
    committed = desc_params(f16 | ready, 64, ducks, 8, 4096, 4096)
    loading = desc_params(f16 | gelu_b_down, 64, ducks, 8, 4096, 4096)
    # slots of 4096 bytes, but max_forward_bytes 512: the limit, not the slot, refuses
    small_limit = desc_params(f16 | ready, 64, ducks, 8, 4096, 4096, max_forward_bytes=512)
    loading_small_limit = desc_params(f16, 64, ducks, 8, 4096, 4096, max_forward_bytes=512)
    common = dict(forward_id=17, submit_ns=1, epoch=1, layer=3, slot=5, generation=2)
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=2,
        shape=[4, 64],
        nbytes=4 * 64 * 2,
        **common,
    )
    write(h, "forward-all-ducks", fwd + committed)
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=3,
        shape=[2, 3, 64],
        nbytes=2 * 3 * 64 * 2,
        ducks=[(1 << 1) | (1 << 5)],
        timeout_us=5000,
        **common,
    )
    write(h, "forward-some-ducks", fwd + committed)
    # every dimension used: the shape whose product once wrapped
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=4,
        shape=[1, 2, 3, 64],
        nbytes=1 * 2 * 3 * 64 * 2,
        **common,
    )
    write(h, "forward-4d", fwd + committed)
    # issue 7 item 5: 2^31 * 2^31 * 4 * 64 wraps to 0 in 64 bits; nbytes 0 "matches"
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=4,
        shape=[1 << 31, 1 << 31, 4, 64],
        nbytes=0,
        **common,
    )
    write(h, "forward-shape-wraps", fwd + committed)
    w = desc(op=lib.DP_OP_WEIGHT_CHUNK, nbytes=1024, offset=2048, duck=1, tensor=2, **common)
    write(h, "weight-chunk", w + loading)
    w = desc(op=lib.DP_OP_WEIGHT_CHUNK, nbytes=64, offset=64, duck=0xFFFF, tensor=3, **common)
    write(h, "weight-b-down", w + loading)
    w = desc(op=lib.DP_OP_WEIGHT_COMMIT, **common)
    write(h, "weight-commit", w + loading)
    # issue 15: the mock once completed an empty chunk OK and knew no max_forward_bytes
    w = desc(op=lib.DP_OP_WEIGHT_CHUNK, nbytes=0, offset=0, duck=1, tensor=0, **common)
    write(h, "weight-chunk-empty", w + loading)
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=2,
        shape=[8, 64],
        nbytes=8 * 64 * 2,
        **common,
    )
    write(h, "forward-over-max-forward-bytes", fwd + small_limit)
    w = desc(op=lib.DP_OP_WEIGHT_CHUNK, nbytes=1024, offset=0, duck=1, tensor=0, **common)
    write(h, "weight-chunk-over-max-forward-bytes", w + loading_small_limit)
    # refusals on the way to the plan: no such layer, a duck outside it, a loading layer
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=2,
        shape=[1, 64],
        nbytes=64 * 2,
        **common,
    )
    write(h, "forward-no-such-layer", fwd + desc_params(no_layer, 64, ducks, 8, 4096, 4096))
    write(h, "forward-on-a-loading-layer", fwd + loading)
    fwd = desc(
        op=lib.DP_OP_FORWARD,
        dtype=lib.DP_DTYPE_F16,
        ndim=2,
        shape=[1, 64],
        nbytes=64 * 2,
        ducks=[1 << 2],
        **common,
    )
    write(h, "forward-duck-without-a-shard", fwd + committed)
    # SwiGLU's second tensor is [hidden x ffn] (GELU's is [ffn]): its last bytes
    swiglu_loading = desc_params(f16 | swiglu, 64, ducks, 8, 4096, 4096)
    w = desc(
        op=lib.DP_OP_WEIGHT_CHUNK, nbytes=64, offset=64 * 16 * 2 - 64, duck=5, tensor=1, **common
    )
    write(h, "weight-chunk-swiglu-up-tail", w + swiglu_loading)


if __name__ == "__main__":
    routing_seeds()
    wire_seeds()
    control_seeds()
    desc_seeds()
