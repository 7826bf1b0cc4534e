"""Generated files and the compiled ABI agree with the schemas in duckpipe/schema/."""

from __future__ import annotations

import difflib
import enum
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
import pytest
from codegen import ROOT, render_all
from codegen import render as codegen

from duckpipe._abi import ffi, lib
from duckpipe.schema import abi, control, layout_of, routing, stats, wire
from duckpipe.schema.layout import U8, U32, U64, Pad

INCLUDE = ROOT / "dataplane" / "include"
GEN = INCLUDE / "gen"  # written by tools/gen_abi.py
ALL_LAYOUTS = (*abi.LAYOUTS, *wire.LAYOUTS, *routing.LAYOUTS)
# every enum the headers carry, WireFlag and the routing errors included
ENUMS = (*codegen.ENUMS, *routing.ENUMS)


def _c_enum_prefix(cls: type[enum.IntEnum]) -> str:
    return "DP_" + re.sub(r"(?<=[a-z])(?=[A-Z])", "_", cls.__name__).upper() + "_"


# --- committed files ----------------------------------------------------------------


def test_committed_generated_files_match_what_the_schemas_render() -> None:
    stale: list[str] = []
    diffs: list[str] = []
    for rel, text in render_all().items():
        path = ROOT / rel
        committed = path.read_text() if path.exists() else ""
        if committed != text:
            stale.append(str(rel))
            diff = difflib.unified_diff(
                committed.splitlines(),
                text.splitlines(),
                f"committed/{rel}",
                f"rendered/{rel}",
                lineterm="",
                n=1,
            )
            diffs.append("\n".join(list(diff)[:30]))
    assert not stale, (
        f"stale generated files: {', '.join(stale)}; run `python tools/gen_abi.py`\n"
        + "\n".join(diffs)
    )


def test_gen_abi_check_exits_zero_when_files_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_abi.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"gen_abi.py --check said:\n{proc.stdout}{proc.stderr}"


def test_render_all_covers_the_header_every_schema_json_and_the_protocols_doc() -> None:
    rendered = set(render_all())
    committed = (
        {p.relative_to(ROOT) for p in GEN.glob("*_abi.h")}
        | {Path("docs/protocols.md")}
        | {p.relative_to(ROOT) for p in (ROOT / "schemas").glob("*.json")}
    )
    assert committed <= rendered, f"committed but never rendered: {committed - rendered}"


def test_the_protocols_doc_shows_every_message_code_op_and_struct_field() -> None:
    """docs/protocols.md, as rendered, against the schema modules themselves (not the JSON
    the page is made from): nothing the contracts define is left off the page."""
    text = render_all()[Path("docs/protocols.md")]
    messages = [*typing.get_args(control.AnyRequest), *typing.get_args(control.AnyReply)]
    assert len(messages) > 15
    for cls in messages:
        assert f"\n#### {cls.__name__}\n" in text, cls.__name__
        for f in msgspec.structs.fields(cls):
            assert f"| `{f.name}` |" in text, (cls.__name__, f.name)
    for code in control.ErrorCode:
        assert f"| {int(code)} | `{code.name}` |" in text, code
    for cls in (*ENUMS, *codegen.STATS_ENUMS):
        if cls is control.ErrorCode:  # its own table, above
            continue
        for m in cls:
            assert f"`{m.name}` = {int(m.value)}" in text, (cls.__name__, m.name)
    for cls in (*ALL_LAYOUTS, *stats.LAYOUTS):
        lay = layout_of(cls)
        assert f"#### `{lay.c_name}` ({lay.size} bytes)" in text, lay.c_name
        for f in lay.fields:
            assert f"| {f.offset} | `{f.name}` |" in text, (lay.c_name, f.name)
    for name in stats.HIST_NAMES:
        assert f"`{name}`" in text, name


def test_the_routing_header_draws_its_layouts_and_u16_fields_hold_the_maximums() -> None:
    header = (GEN / "dp_routing_abi.h").read_text()
    for line in ("| dp_routing_header (16 B)", "| dp_routing_wire_entry[E] (8 B each)"):
        assert line in header
    entry = layout_of(routing.RoutingWireEntry)
    # a wire row, expert and duck are u16: the maximums must fit them
    assert entry.field("row").size == entry.field("expert").size == 2
    assert routing.MAX_TOKENS <= 1 << 16 and routing.MAX_EXPERTS <= 1 << 16
    assert abi.MAX_DUCKS <= 1 << 16 and routing.MAX_TOPK <= 0xFFFF
    assert layout_of(routing.Placement).field("replicas").count == routing.MAX_EXPERTS


# --- the compiled cffi module -----------------------------------------------------


@pytest.mark.parametrize("cls", ALL_LAYOUTS, ids=lambda c: c.__c_name__)
def test_cffi_struct_size_and_offsets_match_the_schema(cls: type[msgspec.Struct]) -> None:
    lay = layout_of(cls)
    ctype = f"struct {lay.c_name}"
    assert ffi.sizeof(ctype) == lay.size
    offsets = {f.name: ffi.offsetof(ctype, f.name) for f in lay.fields}
    assert offsets == {f.name: f.offset for f in lay.fields}
    c_fields = dict(ffi.typeof(ctype).fields)
    assert list(c_fields) == [f.name for f in lay.fields]
    assert {n: ffi.sizeof(cf.type) for n, cf in c_fields.items()} == {
        f.name: f.size for f in lay.fields
    }


def test_cffi_constants_and_enums_match_the_schema() -> None:
    expected = {
        **abi.CONSTANTS,
        **wire.CONSTANTS,
        **routing.CONSTANTS,
        "HOST_TENSOR_DUCK": control.HOST_TENSOR_DUCK,
        "PROTOCOL_VERSION": control.PROTOCOL_VERSION,
    }
    assert {name: getattr(lib, f"DP_{name}") for name in expected} == expected
    for cls in ENUMS:
        prefix = _c_enum_prefix(cls)
        compiled = {n[len(prefix) :]: getattr(lib, n) for n in dir(lib) if n.startswith(prefix)}
        assert compiled == {m.name: int(m.value) for m in cls}, cls.__name__


@pytest.mark.parametrize("mtu", [576, 1500, 9000, 65535, 65536, 100_000])
def test_python_chunks_by_the_dataplanes_payload_rule(mtu: int) -> None:
    """duckpipe.testing.datagrams.payload_max is dp_wire_payload_max (dp_wire.h) itself, not
    a copy: a copy once left out the cap at the largest UDP datagram (65507 bytes)."""
    from duckpipe.testing.datagrams import HEADER_SIZE, payload_max

    assert payload_max(mtu) == lib.dp_wire_payload_max(mtu)
    assert payload_max(mtu) % 4 == 0 and payload_max(mtu) <= 65507 - HEADER_SIZE


def test_a_layer_payload_is_the_wire_layer_struct() -> None:
    """datagrams.layer_payload fills struct dp_wire_layer (it was a struct.pack copy)."""
    from duckpipe.testing.datagrams import layer_payload

    raw = layer_payload(2, 1, 7168, 2048)
    assert len(raw) == ffi.sizeof("struct dp_wire_layer")
    w = ffi.new("struct dp_wire_layer *")
    ffi.memmove(w, raw, len(raw))
    assert (w.kind, w.dtype, w.hidden, w.ffn) == (2, 1, 7168, 2048)
    assert (w.experts, w.expert_ffn) == (0, 0)  # MOE only
    moe = ffi.new("struct dp_wire_layer *")
    ffi.memmove(moe, layer_payload(3, 2, 7168, 8 * 128 + 4, experts=8, expert_ffn=128), 16)
    assert (moe.kind, moe.experts, moe.ffn, moe.expert_ffn) == (3, 8, 1028, 128)


# --- the C header ----------------------------------------------------------------

# The fixed program (the headers alone as strict C11, a ring round trip) is
# dataplane/tests/abi_c11.c, built by meson with the project's flags. What stays compiled
# here is test input: static asserts this test renders from the schema itself, apart from
# the code generator that wrote the header's own, so a generator that wrote both wrong
# alike is still caught; the build could only hold them by running Python in a C build.
_SCHEMA_CHECK = r"""
#include "dp_abi.h"
#include "dp_ring.h"
#include "dp_routing.h"

/* Checked against the schema independently of the header's own asserts. */
@SCHEMA_ASSERTS@
"""


def _schema_asserts() -> str:
    lines = []
    for cls in ALL_LAYOUTS:
        lay = layout_of(cls)
        lines.append(f'_Static_assert(sizeof(struct {lay.c_name}) == {lay.size}, "size");')
        lines += [
            f"_Static_assert(offsetof(struct {lay.c_name}, {f.name}) == {f.offset}, "
            f'"{lay.c_name}.{f.name}");'
            for f in lay.fields
        ]
    return "\n".join(lines)


def test_abi_and_ring_headers_compile_as_strict_c11_and_ring_works(c_test_program) -> None:
    run = subprocess.run(
        [str(c_test_program("abi_c11"))], capture_output=True, timeout=30, check=False
    )
    assert run.returncode == 0, "dp_ring.h push/pop round trip failed in C"


def test_the_compiled_headers_place_every_field_where_the_schema_does(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) to compile dataplane/include/*.h")
    src = tmp_path / "schema_check.c"
    src.write_text(_SCHEMA_CHECK.replace("@SCHEMA_ASSERTS@", _schema_asserts()))
    cmd = [cc, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
    cmd += ["-I", str(INCLUDE), "-I", str(GEN), str(src)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert build.returncode == 0, f"{' '.join(cmd)} failed:\n{build.stderr}"


# --- layout_of refuses layouts C would pad ---------------------------------------


class _ImplicitPadding(msgspec.Struct):
    __c_name__: ClassVar[str] = "dp_test_implicit"

    flag: U8
    value: U64


class _TailPadding(msgspec.Struct):
    __c_name__: ClassVar[str] = "dp_test_tail"

    value: U64
    flag: U8


class _WrongSize(msgspec.Struct):
    __c_name__: ClassVar[str] = "dp_test_wrong_size"
    __c_size__: ClassVar[int] = 24

    value: U64
    count: U32
    pad0: Pad(4)


class _Padded(msgspec.Struct):
    __c_name__: ClassVar[str] = "dp_test_padded"
    __c_size__: ClassVar[int] = 16

    flag: U8
    pad0: Pad(7)
    value: U64


def test_layout_rejects_implicit_padding_between_fields() -> None:
    with pytest.raises(TypeError, match=r"_ImplicitPadding\.value: offset 1 is not 8-byte"):
        layout_of(_ImplicitPadding)


def test_layout_rejects_implicit_tail_padding() -> None:
    with pytest.raises(TypeError, match=r"_TailPadding: size 9 leaves tail padding"):
        layout_of(_TailPadding)


def test_layout_rejects_a_wrong_declared_c_size() -> None:
    with pytest.raises(TypeError, match=r"_WrongSize: size is 16, declared 24"):
        layout_of(_WrongSize)


def test_layout_accepts_explicit_padding_and_places_fields() -> None:
    lay = layout_of(_Padded)
    assert lay.c_name == "dp_test_padded"
    assert lay.size == 16
    assert [(f.name, f.offset, f.size, f.pad) for f in lay.fields] == [
        ("flag", 0, 1, False),
        ("pad0", 1, 7, True),
        ("value", 8, 8, False),
    ]


# --- the generated control codec ------------------------------------------------------


def test_control_codec_needs_a_length_limit_on_every_string_and_list() -> None:
    from codegen import ctlgen

    class Unbounded(control.Request, kw_only=True):
        names: list[Annotated[int, msgspec.Meta(ge=0)]]

    with pytest.raises(TypeError, match=r"Unbounded\.names: give it Meta\(max_length"):
        ctlgen._fields(Unbounded)


def test_every_message_has_a_generated_struct_and_decoder_or_encoder() -> None:
    from codegen import ctlgen

    h = (GEN / "dp_ctl_gen.h").read_text()
    c = (GEN / "dp_ctl_gen.c").read_text()
    for cls in ctlgen.request_types():
        snake = ctlgen._snake(cls.__name__)
        assert f"struct dp_ctl_{snake} {{" in h
        assert f'[DP_CTL_{snake.upper()}] = "{cls.__name__}"' in c
        assert f"decode_{snake}(" in c
    for cls in ctlgen.reply_types():  # and every reply an encoder the dataplane uses
        snake = ctlgen._snake(cls.__name__)
        assert f"void dp_ctl_pack_{snake}(msgpack_packer *pk" in c
    used = "".join(p.read_text() for p in (ROOT / "dataplane/src/control").glob("*.c"))
    for cls in typing.get_args(control.AnyReply):
        assert f"PACK(c, {ctlgen._snake(cls.__name__)}," in used, cls.__name__


def test_the_c_config_reader_reads_every_config_field_by_its_schema_name() -> None:
    from duckpipe.schema import config

    hand = (ROOT / "dataplane" / "src" / "runtime" / "dp_config.c").read_text()
    gen = (ROOT / "dataplane" / "include" / "gen" / "dp_config_gen.c").read_text()
    text = hand + gen
    for cls in (config.DataplaneConfig, config.NicConfig, config.DuckConfig):
        missing = [f.name for f in msgspec.structs.fields(cls) if f'"{f.name}"' not in text]
        assert not missing, f"dp_config.c never reads {cls.__name__}: {missing}"
        defaults = [
            f.name
            for f in msgspec.structs.fields(cls)
            if f.default is not msgspec.NODEFAULT and isinstance(f.default, bool | int | str)
        ]
        for name in defaults:  # a hand-typed default would drift from the Struct's
            assert re.search(rf'"{name}",[^;]*DP_CFG_(NIC_)?DEFAULT_{name.upper()}\b', text), name


def test_the_config_fields_read_by_hand_are_real_and_read_only_by_hand() -> None:
    from codegen import ctlgen

    from duckpipe.schema import config

    hand = (ROOT / "dataplane" / "src" / "runtime" / "dp_config.c").read_text()
    gen = (ROOT / "dataplane" / "include" / "gen" / "dp_config_gen.c").read_text()
    assert "dp_cfg_gen_read(" in hand and "dp_cfg_gen_read_nic(" in hand
    for cls_name, names in ctlgen.CONFIG_BY_HAND.items():
        fields = {f.name for f in msgspec.structs.fields(getattr(config, cls_name))}
        assert set(names) <= fields, f"CONFIG_BY_HAND names what {cls_name} lacks"
        for name in names:  # one reader per field: the generated one skips these
            assert f'"{name}"' in hand and f'"{name}"' not in gen, name
