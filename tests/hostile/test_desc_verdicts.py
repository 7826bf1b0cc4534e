"""The mock dataplane decides every descriptor as the C dataplane does.

Each input of the descriptor fuzzer's corpus (dataplane/fuzz/corpus/fuzz_desc), and
deterministic mutations of them, goes through both:

- the C dataplane's path: dataplane/fuzz/desc_verdicts.c, built with the dataplane's
  sources (dataplane/tests/meson.build), decodes it as the fuzz_desc harness does into a
  struct dp_layer, a layout and limits, and checks it as the dispatcher does
  (dp_desc_check on the layer read through dp_desc_layer_of); it prints the verdict,
  the reason, the plan and what the input decoded to;
- the mock's path: a mock layer made from that layer's LoadWeights, the layout and the
  limits, checked with the mock's DescriptorCheck.

They must agree on every input: pass or refuse, the reason word for word, and the plan.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from codegen import ROOT

from duckpipe._abi import ffi
from duckpipe.errors import DuckpipeError
from duckpipe.mock.dataplane import DescriptorCheck, _Layer
from duckpipe.schema import control as ctl
from duckpipe.schema.abi import MAX_DUCKS, Op

DATAPLANE = ROOT / "dataplane"
CORPUS = DATAPLANE / "fuzz" / "corpus" / "fuzz_desc"
DESC_SIZE = ffi.sizeof("struct dp_desc")
MUTANTS_PER_INPUT = 40


@pytest.fixture(scope="module")
def desc_verdicts(c_test_program) -> Path:
    """desc_verdicts.c, built by dataplane/tests/meson.build with the dataplane's flags."""
    return c_test_program("desc_verdicts")


def _mutants(data: bytes, rng: random.Random) -> list[bytes]:
    """Variations of one input near the checks' edges: descriptor fields set to values
    around their bounds, and bytes of the layer, layout and limits changed."""
    d = ffi.new("struct dp_desc *")
    out = []
    for _ in range(MUTANTS_PER_INPUT):
        ffi.memmove(d, data[:DESC_SIZE], DESC_SIZE)
        tail = bytearray(data[DESC_SIZE:])
        for _ in range(rng.randint(1, 3)):
            what = rng.randrange(10)
            if what == 0:
                d.op = rng.choice([*map(int, Op), 0, 4, 0xFFFF])
            elif what == 1:
                n = rng.choice([0, 1, d.nbytes - 2, d.nbytes + 2, 512, 513, 4096, 4097])
                d.nbytes = n & ((1 << 64) - 1)
            elif what == 2:
                d.offset = rng.choice([0, 2, 64, 1023, 1 << 63, (1 << 64) - 64])
            elif what == 3:
                d.duck = rng.choice([0, 1, 2, 5, MAX_DUCKS - 1, MAX_DUCKS, ctl.HOST_TENSOR_DUCK])
                d.tensor = rng.randrange(5)
            elif what == 4:
                d.ndim = rng.randrange(6)
                d.shape[rng.randrange(4)] = rng.choice([0, 1, 64, 65, 1 << 31, 0xFFFF_FFFF])
            elif what == 5:
                d.dtype = rng.randrange(4)
            elif what == 6:
                d.timeout_us = rng.choice([0, 1, 10_000_000, 10_000_001, 0xFFFF_FFFF])
            elif what == 7:
                d.ducks[rng.randrange(4)] ^= 1 << rng.randrange(64)
            elif what == 8:
                d.slot = rng.choice([0, 7, 8, 15, 16, 0xFFFF_FFFF])
            elif tail:
                tail[rng.randrange(len(tail))] = rng.randrange(256)
        out.append(bytes(ffi.buffer(d)) + bytes(tail))
    return out


def _inputs(tmp_path: Path) -> list[Path]:
    corpus = sorted(CORPUS.iterdir())
    assert len(corpus) >= 10, f"the fuzz_desc corpus is missing from {CORPUS}"
    rng = random.Random(15)
    paths = list(corpus)
    for src in corpus:
        data = src.read_bytes()
        if len(data) < DESC_SIZE:
            continue
        for i, m in enumerate(_mutants(data, rng)):
            path = tmp_path / f"{src.name}-mutant-{i}"
            path.write_bytes(m)
            paths.append(path)
    return paths


def _c_verdicts(program: Path, paths: list[Path]) -> list[dict]:
    r = subprocess.run(
        [str(program), *map(str, paths)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [line["file"] for line in lines] == [str(p) for p in paths]
    return lines


def _mock_layer(layer: dict) -> _Layer:
    """The mock's layer for what the C side decoded: as its LoadWeights handler makes it."""
    info = ctl.LoadWeights(
        req_id=0,
        layer=layer["id"],
        kind=layer["kind"],
        dtype=layer["dtype"],
        hidden=layer["hidden"],
        ffn=sum(layer["shard_sizes"]),
        ducks=layer["ducks"],
        shard_sizes=layer["shard_sizes"],
        has_b_down=layer["has_b_down"],
    )
    return _Layer(
        info,
        owner=1,
        weight_bytes=0,
        raw={},
        received={},
        ready=layer["ready"],
        failed=layer["failed"],
    )


def _mock_verdict(data: bytes, case: dict) -> tuple[int, str, dict | None]:
    check = DescriptorCheck(**case["limits"])
    layout = ffi.new("struct dp_client_layout *", case["layout"])
    layer = None if case["layer"] is None else _mock_layer(case["layer"])
    d = ffi.new("struct dp_desc *")
    ffi.memmove(d, data[:DESC_SIZE], DESC_SIZE)
    try:
        p = check(layout, layer, d)
    except DuckpipeError as e:
        return -1, str(e), None
    plan = {
        "bytes": p.bytes,
        "timeout_us": p.timeout_us,
        "rows": p.rows,
        "duck_index": p.duck_index,
        "targets": list(p.targets),
    }
    return 0, "", plan


def test_the_mock_decides_every_corpus_descriptor_as_the_c_dataplane(desc_verdicts, tmp_path):
    paths = _inputs(tmp_path)
    verdicts = _c_verdicts(desc_verdicts, paths)
    differ = []
    for path, c in zip(paths, verdicts, strict=True):
        if c.get("short"):
            continue  # shorter than a descriptor: the harness skips it
        mock = _mock_verdict(path.read_bytes(), c)
        if mock != (c["rc"], c["why"], c["plan"]):
            differ.append(f"{path.name}: C {(c['rc'], c['why'], c['plan'])}, mock {mock}")
    assert not differ, f"{len(differ)} of {len(paths)} differ:\n" + "\n".join(differ[:20])
    # the inputs reach both answers, and every way of refusing the seeds exercise
    passed = sum(c.get("rc") == 0 for c in verdicts)
    refused = {c["why"].split(" ")[0] for c in verdicts if c.get("rc") == -1}
    assert passed > len(paths) // 10, f"only {passed} of {len(paths)} inputs passed"
    assert {"weight", "layer", "duck", "shape", "slot", "unknown", "timeout"} <= refused, refused


def test_the_seeds_hold_the_two_drifts_of_issue_15(desc_verdicts):
    # an empty weight chunk, once completed OK by the mock; and max_forward_bytes, once
    # unknown to it: refused here by the limit, though the 4 KiB slots would hold them
    files = {
        name: CORPUS / f"seed-{name}"
        for name in (
            "weight-chunk-empty",
            "forward-over-max-forward-bytes",
            "weight-chunk-over-max-forward-bytes",
        )
    }
    c = dict(zip(files, _c_verdicts(desc_verdicts, list(files.values())), strict=True))
    assert c["weight-chunk-empty"]["why"] == "weight chunk of 0 bytes"
    assert c["forward-over-max-forward-bytes"]["why"] == (
        "1024 bytes exceed the slots or max_forward_bytes 512"
    )
    assert c["weight-chunk-over-max-forward-bytes"]["why"] == "weight chunk of 1024 bytes"
    for name, path in files.items():
        assert _mock_verdict(path.read_bytes(), c[name]) == (-1, c[name]["why"], None), name
        if "max-forward-bytes" in name:
            assert c[name]["layout"]["act_slot_size"] > c[name]["limits"]["max_forward_bytes"]
