"""The generated C control decoder agrees with msgspec on what it accepts and why it refuses.

A small driver around ``dp_ctl_decode`` (dataplane/include/gen/dp_ctl_gen.c),
dataplane/tests/ctl_decode.c, decodes thousands of random requests, valid and broken
field by field; the mock dataplane's rules (the
shared pre-scan of dp_msgpack_scan.h through cffi, then msgspec's typed decoder) give the
expected verdict for each: accepted as the same type with the same req_id, or refused
with the same ErrorCode.
"""

from __future__ import annotations

import random
import struct
import subprocess
from pathlib import Path

import msgspec
import pytest
from codegen import ROOT
from codegen.ctlgen import request_types
from msgspec import inspect as mi

from duckpipe.mock.dataplane import _decode_error_code, _prescan
from duckpipe.schema import control as ctl


@pytest.fixture(scope="module")
def decoder(c_test_program) -> Path:
    """dataplane/tests/ctl_decode.c: dp_ctl_decode over a stream of messages, one verdict a
    line (built by dataplane/tests/meson.build)."""
    return c_test_program("ctl_decode")


def _c_verdicts(driver: Path, messages: list[bytes]) -> list[str]:
    data = b"".join(struct.pack("<I", len(m)) + m for m in messages)
    run = subprocess.run([str(driver)], input=data, capture_output=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout.decode().splitlines()


def _expected(raw: bytes) -> str:
    if _prescan(raw, ctl.MAX_NESTING) is not None:
        return f"{int(ctl.ErrorCode.BAD_MESSAGE)}"
    try:
        msg = ctl.request_decoder.decode(raw)
    except msgspec.DecodeError as e:
        return f"{int(_decode_error_code(e))}"
    return f"0 {type(msg).__name__} {msg.req_id}"


# --- random requests, valid and broken ----------------------------------------------------


def _int_range(t: mi.IntType) -> tuple[int, int]:
    lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 0)
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**64 - 1)
    return lo, hi


def _valid(rng: random.Random, t: mi.Type) -> object:
    if isinstance(t, mi.UnionType):
        return None if rng.random() < 0.3 else _valid(rng, t.types[0])
    if isinstance(t, mi.IntType):
        lo, hi = _int_range(t)
        return rng.choice([lo, hi, rng.randint(lo, min(hi, lo + 1000)), rng.randint(lo, hi)])
    if isinstance(t, mi.FloatType):
        return rng.choice([0, 0.0, float(t.le or 1.0), rng.uniform(t.ge or 0, t.le or 1e6)])
    if isinstance(t, mi.BoolType):
        return rng.random() < 0.5
    if isinstance(t, mi.StrType):  # ASCII: C counts bytes, msgspec characters
        n = rng.choice([0, 1, t.max_length, rng.randint(0, t.max_length)])
        n = max(n, t.min_length or 0)
        return "".join(rng.choice("abc/-_.XYZ019") for _ in range(n))
    if isinstance(t, mi.ListType):
        lo = t.min_length or 0
        n = rng.choice([lo, t.max_length, rng.randint(lo, min(t.max_length, lo + 5))])
        return [_valid(rng, t.item_type) for _ in range(n)]
    raise TypeError(t)


def _broken(rng: random.Random, t: mi.Type) -> object:
    if isinstance(t, mi.UnionType):
        t = t.types[0]
    wrong_type = rng.choice(["x", 1.5, [1], {"a": 1}, True, None, b"\x00", -1])
    if isinstance(t, mi.IntType):
        lo, hi = _int_range(t)
        return rng.choice([wrong_type, lo - 1 if lo > 0 else -1, hi + 1 if hi < 2**64 - 1 else -5])
    if isinstance(t, mi.FloatType):
        return rng.choice(["1", None, [0.5], -1.0, float(t.le or 1e9) * 2, float("inf")])
    if isinstance(t, mi.BoolType):
        return rng.choice([0, 1, "true", None])
    if isinstance(t, mi.StrType):
        return rng.choice([1, None, ["a"], "a" * (t.max_length + 1)])
    if isinstance(t, mi.ListType):
        items = [_valid(rng, t.item_type) for _ in range(t.max_length + 1)]
        bad_item = [_broken(rng, t.item_type)]
        return rng.choice(["abc", 7, None, items, bad_item, [[1]]])
    raise TypeError(t)


def _message(rng: random.Random, cls: type[msgspec.Struct]) -> bytes:
    fields = mi.type_info(cls).fields
    body: dict[object, object] = {}
    for f in fields:
        if f.required or rng.random() < 0.6:
            body[f.encode_name] = _valid(rng, f.type)
    roll = rng.random()
    if roll < 0.45:  # one field broken
        f = rng.choice(fields)
        body[f.encode_name] = _broken(rng, f.type)
    elif roll < 0.55:  # one required field missing
        required = [f for f in fields if f.required]
        if required:
            body.pop(rng.choice(required).encode_name, None)
    elif roll < 0.6:
        body["unknown_key"] = [1, "two"]  # ignored by both
    items = list(body.items())
    rng.shuffle(items)
    tag = cls.__name__ if rng.random() < 0.97 else rng.choice(["Nope", "", 5])
    return msgspec.msgpack.encode(dict([("type", tag), *items]))


def test_c_decoder_and_msgspec_agree_on_random_requests(decoder):
    rng = random.Random(7)
    messages = [_message(rng, rng.choice(request_types())) for _ in range(4000)]
    got = _c_verdicts(decoder, messages)
    assert len(got) == len(messages)
    disagree = []
    for raw, c_line in zip(messages, got, strict=True):
        want = _expected(raw)
        c_verdict = c_line if c_line.startswith("0 ") else c_line.split(" ", 1)[0]
        if c_verdict != want:
            disagree.append(f"{msgspec.msgpack.decode(raw)!r}: C {c_line!r}, msgspec {want!r}")
    assert not disagree, f"{len(disagree)} disagreements, e.g.:\n" + "\n".join(disagree[:8])
    accepted = sum(line.startswith("0 ") for line in got)
    assert 0.2 * len(got) < accepted < 0.8 * len(got)  # both sides of the line were tried


def test_truncated_or_lying_messages_get_the_same_verdict_on_both_sides(decoder):
    rng = random.Random(11)
    honest = [_message(rng, ctl.LoadWeights) for _ in range(50)]
    lies = []
    for raw in honest:  # cut short, or a length byte raised, anywhere
        cut = rng.randrange(1, len(raw))
        lies.append(raw[:cut])
        k = rng.randrange(len(raw))
        lies.append(raw[:k] + bytes([rng.choice([0xDD, 0xDF, 0xDB, 0xC6, 0xC9, 0xC1])]) + raw[k:])
    got = _c_verdicts(decoder, lies)
    for raw, c_line in zip(lies, got, strict=True):
        assert c_line.split(" ", 1)[0] == _expected(raw).split(" ", 1)[0], (raw, c_line)


def test_every_committed_control_seed_is_a_request_both_decoders_accept(decoder):
    """fuzz_control starts from its seeds: one that a decoder refuses (a field added to the
    schema since the seeds were made) keeps the fuzzer at the first check, and a request
    type without a seed is reached only by luck. make_seeds.py makes them; rerun it."""
    seeds = sorted((ROOT / "dataplane" / "fuzz" / "corpus" / "fuzz_control").glob("seed-*"))
    raws = [p.read_bytes() for p in seeds]
    got = _c_verdicts(decoder, raws)
    refused = [f"{p.name}: {line}" for p, line in zip(seeds, got, strict=True) if line[:2] != "0 "]
    assert not refused, "seeds the C decoder refuses (rerun make_seeds.py):\n" + "\n".join(refused)
    for p, raw, line in zip(seeds, raws, got, strict=True):
        assert _expected(raw) == line, (p.name, line)
    covered = {line.split(" ")[1] for line in got}
    missing = {t.__name__ for t in request_types()} - covered
    assert not missing, f"request types without a seed: {sorted(missing)}"
