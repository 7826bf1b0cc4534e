"""Several serving processes on one MoE layer (issue 28, point 8): a layer the admin
loaded ``shared=True`` is routable by every client, each its own process, since LayerInfo
carries the experts, the placement and the shared expert's ducks; the same on the mock and
the C dataplane. A non-shared layer of another client stays refused."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

import duckpipe
from duckpipe.client import weights
from duckpipe.client.models import silu
from duckpipe.errors import NotPermitted
from duckpipe.moe import Gate, MoeMlp
from duckpipe.schema import control as ctl

HIDDEN, N_EXPERTS, EFFN, TOPK = 32, 8, 16, 3
CLIENTS, ROUNDS = 3, 4
# 8 experts on ducks 0-5, some replicated; the layer lives on ducks 0-5, and its shared
# expert is cut over all six
PLACEMENT = [[0], [1, 2], [2], [3], [4, 5], [5], [0, 3], [1]]
PLACED = [d for held in PLACEMENT for d in held]


def _moe(seed: int) -> MoeMlp:
    return MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=True, seed=seed)


def _gate(seed: int) -> Gate:
    """DeepSeek-V3's router at a small size: sigmoid scores with a bias, 2 groups of 4
    experts with 1 kept, route scale 2.5."""
    return Gate.random(
        N_EXPERTS,
        HIDDEN,
        topk=TOPK,
        score="sigmoid",
        groups=2,
        topk_groups=1,
        route_scale=2.5,
        bias=True,
        seed=seed,
    )


def deepseek_moe(moe: MoeMlp, x: np.ndarray, indices: np.ndarray, w: np.ndarray) -> np.ndarray:
    """DeepSeek-V3's MoE in numpy, token by token: the sum over its chosen experts of
    weight * expert(x), plus the shared expert's output (float64)."""

    def swiglu(mlp, v):
        v = v.astype(np.float64)
        g = v @ mlp.w_gate.astype(np.float64)
        return (silu(g) * (v @ mlp.w_up.astype(np.float64))) @ mlp.w_down.astype(np.float64)

    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for k in range(indices.shape[1]):
            out[t] += float(w[t, k]) * swiglu(moe.experts[indices[t, k]], x[t])
        out[t] += swiglu(moe.shared, x[t])
    return out


# One serving process: its own connect, then (once every process is connected) ROUNDS
# routed forwards of its own tokens, their results saved for the test to check.
_SERVER = """
import os, sys, time
import numpy as np
import duckpipe

control, layer, inputs, ready, go, out = sys.argv[1:7]
d = np.load(inputs)
with duckpipe.connect(control, name="moe-server") as c:
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no go within 60 s")
        time.sleep(0.002)
    ys = {}
    for k in range(int(d["rounds"])):
        routing = (d[f"i{k}"], d[f"w{k}"])
        ys[f"y{k}"] = c.forward(int(layer), d[f"x{k}"], routing=routing, timeout=30)
np.savez(out, **ys)
"""


def _inputs(gate: Gate, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d: dict[str, np.ndarray] = {"rounds": np.array(ROUNDS)}
    for k in range(ROUNDS):
        x = rng.standard_normal((1 + 5 * k + seed % 3, HIDDEN)).astype(np.float32)
        r = gate(x)
        d[f"x{k}"], d[f"i{k}"], d[f"w{k}"] = x, r.indices, r.weights
    return d


def _serve_at_once(control: str, layer: int, tmp: Path, inputs: list[dict]) -> list[dict]:
    """Start one process per entry of ``inputs``, let them forward together once all are
    connected, and return what each computed."""
    procs, paths = [], []
    for n, d in enumerate(inputs):
        inp, ready, out = tmp / f"in{n}.npz", tmp / f"ready{n}", tmp / f"out{n}.npz"
        np.savez(inp, **d)
        argv = [control, str(layer), inp, ready, tmp / "go", out]
        cmd = [sys.executable, "-c", _SERVER, *map(str, argv)]
        procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
        paths.append((ready, out))
    try:
        deadline = time.monotonic() + 60
        while not all(r.exists() for r, _ in paths):
            failed = [p for p in procs if p.poll() is not None]
            assert not failed, failed[0].stderr.read()
            assert time.monotonic() < deadline, "a serving process did not connect in 60 s"
            time.sleep(0.01)
        (tmp / "go").touch()
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [dict(np.load(out)) for _, out in paths]


def test_three_processes_route_on_one_shared_moe_layer_at_once(dataplane, tmp_path):
    moe, gate, layer = _moe(seed=80), _gate(seed=80), 880
    with duckpipe.connect(dataplane.control, name="admin") as admin:
        admin.load_weights(layer, moe, placement=PLACEMENT, shared=True)  # tests run as root
        inputs = [_inputs(gate, seed=n) for n in range(CLIENTS)]
        results = _serve_at_once(str(dataplane.control), layer, tmp_path, inputs)
    for d, ys in zip(inputs, results, strict=True):
        for k in range(ROUNDS):
            want = deepseek_moe(moe, d[f"x{k}"], d[f"i{k}"], d[f"w{k}"])
            np.testing.assert_allclose(ys[f"y{k}"], want, rtol=1e-4, atol=1e-4)


def test_layer_info_carries_the_placement_and_the_shared_experts_ducks(dataplane):
    with duckpipe.connect(dataplane.control) as admin, duckpipe.connect(dataplane.control) as c:
        m = _moe(seed=81)
        moe = MoeMlp(experts=m.experts, shared=m.shared, shared_ducks=[4, 1])  # a chosen set
        admin.load_weights(881, moe, placement=PLACEMENT, shared=True)
        info = next(i for i in c.layers() if i.layer == 881)
        assert info.expert_ffn == EFFN
        assert info.expert_replicas == [len(held) for held in PLACEMENT]
        assert info.expert_ducks == PLACED
        assert info.shared_ducks == [1, 4]  # the ducks whose banks hold shared columns
        view = weights.moe_view(info)
        assert view is not None and view.placement == tuple(map(tuple, PLACEMENT))
        assert view.shared_ducks == (1, 4)
        assert view.shared_ffn == EFFN and view.n_experts == N_EXPERTS


def test_a_moe_layer_without_a_shared_expert_lists_no_shared_ducks(dataplane):
    moe = MoeMlp.random(N_EXPERTS, HIDDEN, EFFN, shared=False, seed=82)
    with duckpipe.connect(dataplane.control) as admin:
        admin.load_weights(882, moe, placement=PLACEMENT, shared=True)
        info = next(i for i in admin.layers() if i.layer == 882)
        assert info.shared_ducks == [] and info.expert_ducks == PLACED


def test_a_non_shared_moe_layer_of_another_client_stays_refused(dataplane):
    moe, gate = _moe(seed=83), _gate(seed=83)
    x = np.ones((2, HIDDEN), np.float32)
    with duckpipe.connect(dataplane.control) as a, duckpipe.connect(dataplane.control) as b:
        a.load_weights(883, moe, placement=PLACEMENT)
        with pytest.raises(NotPermitted, match="layer 883 belongs to another client"):
            b.forward(883, x, routing=gate(x), timeout=10)


def test_a_layer_info_from_an_older_dataplane_gives_no_view():
    """A LayerInfo without the four fields (a dataplane that predates them) decodes with
    their defaults, and the client routes only on what it loaded (api._routed_arguments
    keeps its message)."""
    old = {
        "layer": 1, "kind": 3, "dtype": 1, "hidden": HIDDEN, "ffn": 64, "ducks": [0],
        "shard_sizes": [64], "has_b_down": False, "ready": True, "owner": 1, "shared": True,
    }  # fmt: skip
    info = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=ctl.LayerInfo)
    assert (info.expert_ffn, info.expert_replicas, info.expert_ducks, info.shared_ducks) == (
        0, [], [], []
    )  # fmt: skip
    assert weights.moe_view(info) is None


def test_layer_info_of_a_moe_layer_is_the_same_on_mock_and_c(
    duckpipe_mock_factory, duckpipe_cluster_factory
):
    moe = _moe(seed=84)
    got = []
    for dp in (duckpipe_mock_factory(ducks=6), duckpipe_cluster_factory(6)):
        with duckpipe.connect(dp.control) as admin:
            admin.load_weights(884, moe, placement=PLACEMENT, shared=True)
            info = next(i for i in admin.layers() if i.layer == 884)
            got.append(msgspec.structs.replace(info, owner=0))
    assert got[0] == got[1]
    # the default shared set: one duck (one NIC), the layer's first
    assert got[0].expert_ducks == PLACED and got[0].shared_ducks == [0]
