"""The mock dataplane answers every control message as the C dataplane does.

Each input of the control fuzzer's corpus (dataplane/fuzz/corpus/fuzz_control), and
messages made from its LoadWeights and Attach seeds that cross each rule of
dataplane/include/dp_ctl_rules.h (the attach admission, the LoadWeights bounds, the MoE
plan, the weight-byte quota), goes to a mock and a C dataplane of the same settings from
the same kind of peer: a socket that attached a client (the admin's, as the test runs as
the dataplanes' user), and one that did not. Both must give the same reply type and
error code; where the refusal comes from the shared rules, the same message too.

(As tests/hostile/test_desc_verdicts.py does for descriptors.)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

import duckpipe
from duckpipe.mock.process import MockDataplaneProcess
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import ABI_MAJOR, MlpKind
from duckpipe.testing import assert_clean_exit, cluster_class_or_skip

pytestmark = pytest.mark.dataplane

CORPUS = Path(__file__).resolve().parents[2] / "dataplane" / "fuzz" / "corpus" / "fuzz_control"
DUCKS = 4
SETTINGS = {
    "client_max_layers": 3,
    "client_max_weight_bytes": 1 << 20,
    "max_hidden": 4096,
    "max_ffn": 16384,
    "client_max_per_pid": 1,  # a second Attach of this process meets the admission rule
}
# What the mock does on purpose where the C dataplane cannot: SetFaults sets the mock's
# fault knobs; the C dataplane's are the duck emulator's (UNSUPPORTED, naming them).
MOCK_ONLY = {"SetFaults"}
# Requests whose refusals come from the shared rules (dp_ctl_rules.h) or the handlers
# both dataplanes write alike: their messages must match word for word.
SAME_WORDS = {"Attach", "LoadWeights", "UnloadLayer", "RepairLayer", "MoveLayer"}
REPLY_TIMEOUT_MS = 3000
SETTLE_S = 5.0  # a housekeeping tick and a dispatcher pass, on a loaded machine
# the messages that may replace or unload a layer of the attached client (when Ack'ed)
RETIRES = {"seed-unload-layer", "load-17", "load-21"}


def _seed(name: str) -> dict:
    return msgspec.msgpack.decode((CORPUS / f"seed-{name}").read_bytes())


def _load_variants() -> list[dict]:
    """The corpus's LoadWeights with each rule crossed, and loads that pass (small ones,
    under the 1 MiB quota), in an order in which the layer count quota is reached."""
    seed = _seed("load-weights")  # GELU, float16, hidden 4096, ffn 16384 on ducks 0..3
    small = dict(seed, layer=20, hidden=16, ffn=32, ducks=[0, 1], shard_sizes=[16, 16])
    moe = dict(
        seed,
        layer=30,
        kind=int(MlpKind.MOE),
        hidden=16,
        ffn=16,
        ducks=[0, 1],
        shard_sizes=[8, 8],
        has_b_down=False,
        expert_ffn=4,
        expert_replicas=[1, 1, 1, 1],
        expert_ducks=[0, 0, 1, 1],
    )
    return [
        seed,  # 268 MB against a 1 MiB quota
        dict(seed, hidden=4097),
        dict(seed, ffn=16385, shard_sizes=[4096, 4096, 4096, 4097]),
        dict(seed, shard_sizes=[4096, 4096, 8192]),
        dict(seed, shard_sizes=[4096, 4096, 4096, 4095]),
        dict(seed, ducks=[0, 1, 2, 9]),  # not in the topology
        dict(seed, ducks=[0, 1, 1, 3]),  # listed twice
        dict(small, expert_ffn=4),  # a dense layer with MoE fields
        dict(moe, expert_ducks=[0, 0, 1, 3]),  # an expert off the layer's ducks
        dict(moe, expert_ducks=[0, 0, 1]),  # replicas add up to 4, 3 ducks listed
        dict(moe, expert_replicas=[2, 1, 1], expert_ducks=[0, 0, 1, 1]),  # a replica twice
        dict(moe, shard_sizes=[4, 12]),  # duck 0's bank narrower than its 2 experts
        dict(moe, ffn=17, shard_sizes=[9, 8]),  # shared columns on one duck only
        dict(moe, has_b_down=True),
        dict(moe, expert_ffn=0),
        dict(moe, expert_replicas=[], expert_ducks=[]),
        small,  # passes
        dict(small, hidden=32),  # a reload of layer 20: passes
        dict(small, layer=21, shared=True),  # shared: the admin's, passes
        moe,  # passes: the third layer
        dict(small, layer=22),  # a fourth: over client_max_layers
        {"type": "UnloadLayer", "req_id": 40, "layer": 21},
        dict(small, layer=22, hidden=4096, ffn=64, shard_sizes=[32, 32]),  # over the bytes
        {"type": "UnloadLayer", "req_id": 41, "layer": 99},
    ]


def _attach_variants() -> list[dict]:
    """The corpus's Attach at this ABI: another pid's (the corpus's own), an old
    protocol, and this process's, which on a socket that is not attached meets
    client_max_per_pid."""
    seed = dict(_seed("attach"), abi_major=ABI_MAJOR, protocol=ctl.PROTOCOL_VERSION)
    return [
        seed,
        dict(seed, protocol=ctl.PROTOCOL_VERSION - 1),
        dict(seed, pid=os.getpid()),
    ]


# Last, in this order: the mock's fault knobs would change its later answers (dead ducks),
# Detach ends the client, Shutdown the dataplane.
LAST = ("seed-set-faults", "seed-detach", "seed-shutdown")


def _messages() -> list[tuple[str, bytes]]:
    """(name, raw message): the corpus and the variants, LAST at the end."""
    corpus = sorted(CORPUS.iterdir())
    last = sorted((p for p in corpus if p.name in LAST), key=lambda p: LAST.index(p.name))
    out = [(p.name, p.read_bytes()) for p in corpus if p not in last]
    out += [(f"load-{i}", msgspec.msgpack.encode(m)) for i, m in enumerate(_load_variants())]
    out += [(f"attach-{i}", msgspec.msgpack.encode(m)) for i, m in enumerate(_attach_variants())]
    return out + [(p.name, p.read_bytes()) for p in last]


def _type_of(raw: bytes) -> str:
    try:
        obj = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return ""
    return obj.get("type", "") if isinstance(obj, dict) else ""


def _layers_freed(sock: zmq.Socket) -> int:
    sock.send(ctl.encoder.encode(ctl.GetStats(req_id=1)))
    assert sock.poll(REPLY_TIMEOUT_MS), "no Stats"
    return ctl.reply_decoder.decode(sock.recv()).counters["layers_freed"]


def _settled(sock: zmq.Socket, freed: int) -> None:
    """Wait until the dataplane freed a layer more than `freed`: the C dataplane frees a
    replaced or unloaded layer after its dispatcher's next pass and counts it against the
    owner's quota until then ("replaced but not freed yet"); the mock frees it at once."""
    deadline = time.monotonic() + SETTLE_S
    while _layers_freed(sock) <= freed:
        assert time.monotonic() < deadline, f"a retired layer was not freed in {SETTLE_S} s"
        time.sleep(0.01)


def _ask(sock: zmq.Socket, raw: bytes) -> tuple:
    """The reply to raw on sock (completions skipped): (type, code, message)."""
    sock.send(raw)
    while sock.poll(REPLY_TIMEOUT_MS):
        reply = ctl.reply_decoder.decode(sock.recv())
        if isinstance(reply, ctl.Completion):
            continue
        return type(reply).__name__, int(getattr(reply, "code", 0)), getattr(reply, "message", "")
    return ("no reply", 0, "")


@contextlib.contextmanager
def _dataplane(kind: str, control: str) -> Iterator[None]:
    if kind == "mock":
        args = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
        with MockDataplaneProcess(ducks=DUCKS, control=control, args=args):
            yield
        return
    cluster = cluster_class_or_skip()(DUCKS, control=control, **SETTINGS).start()
    try:
        yield
    finally:
        assert_clean_exit(cluster)  # no crash, no sanitizer report


def _verdicts(kind: str, control: str) -> dict[str, list[tuple]]:
    """Each message's reply on an attached client's socket and on a bare one."""
    msgs = _messages()
    out: dict[str, list[tuple]] = {name: [] for name, _ in msgs}
    with _dataplane(kind, control):
        client = duckpipe.connect(control, name="verdicts")
        attached = client._session.channel.sock
        bare = zmq.Context.instance().socket(zmq.DEALER)
        bare.setsockopt(zmq.LINGER, 0)
        bare.connect(control)
        try:
            for name, raw in msgs:
                freed = _layers_freed(bare) if name in RETIRES else 0
                # Shutdown once, from the bare socket: no answer is due after it
                shutdown = name == "seed-shutdown"
                out[name].append(("not sent", 0, "") if shutdown else _ask(attached, raw))
                if name in RETIRES and out[name][0][0] == "Ack":
                    _settled(bare, freed)
                out[name].append(_ask(bare, raw))
        finally:
            bare.close()
            with contextlib.suppress(Exception):
                client.close()
    return out


def test_the_mock_answers_every_control_message_as_the_c_dataplane(tmp_path: Path) -> None:
    mock = _verdicts("mock", f"ipc://{tmp_path}/mock")
    real = _verdicts("real", f"ipc://{tmp_path}/real")
    raws = dict(_messages())
    differ = []
    for name, raw in raws.items():
        kind = _type_of(raw)
        if kind in MOCK_ONLY:
            continue
        for peer, m, r in zip(("attached", "bare"), mock[name], real[name], strict=True):
            same = m == r if kind in SAME_WORDS else m[:2] == r[:2]
            if not same:
                differ.append(f"{name} ({peer}): mock {m} / C {r}")
    assert differ == [], "\n".join(differ)
    # the rules were met, not only agreed on: each refusal the variants aim at
    codes = {c for name in raws if name.startswith("load-") for _, c, _ in real[name]}
    assert {
        ctl.ErrorCode.BAD_REQUEST,
        ctl.ErrorCode.QUOTA_EXCEEDED,
        ctl.ErrorCode.NOT_ATTACHED,
        ctl.ErrorCode.UNKNOWN_LAYER,
    } <= codes
    assert [v[:2] for v in real["attach-0"]] == [("Error", ctl.ErrorCode.BAD_SEGMENT)] * 2
    assert real["attach-2"][0][1] == ctl.ErrorCode.ALREADY_ATTACHED
    assert "client_max_per_pid is 1" in real["attach-2"][1][2]
    assert ("Ack", 0, "") in real["load-16"]
