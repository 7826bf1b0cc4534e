"""Render the C side of the control protocol from the request Structs in control.py.

For every request message: a C struct, a decoder from a msgpack-c object that
checks each field's type and range against the Struct's ``Meta`` (every string
and list must declare a ``max_length``: the C struct holds it inline; a string's one
known ``pattern``, ``control.PRINTABLE_ASCII``, becomes ``check_printable``), and one
dispatch table (type name -> decoder). ``dp_ctl_decode`` runs the bounded
pre-scan (``dp_msgpack_prescan``) over the raw bytes before msgpack-c sees them,
because msgpack-c reserves memory from declared lengths.

For every reply (and the Structs nested in them): a C struct whose strings and lists
point at the caller's data, and an encoder to a msgpack-c packer that writes every
field under its schema name.

The decoders follow msgspec's rules: unknown keys are ignored, a missing field
takes its default (a required one is an error), nil is only an Optional's None.
"""

from __future__ import annotations

import typing

import msgspec
from msgspec import inspect as mi

from duckpipe.schema import control

__all__ = [
    "CDEF_BEGIN",
    "CDEF_END",
    "CONFIG_BY_HAND",
    "render_config_c",
    "render_config_h",
    "render_ctl_c",
    "render_ctl_h",
    "reply_types",
    "request_types",
]

# the section of a header duckpipe/_native_build.py hands cffi (render.py's too)
CDEF_BEGIN = "/* @cdef-begin: cffi parses from here */"
CDEF_END = "/* @cdef-end */"

U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF


def request_types() -> list[type[msgspec.Struct]]:
    return list(typing.get_args(control.AnyRequest))


def _snake(name: str) -> str:
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out += "_"
        out += ch.lower()
    return out


def _int_bounds(t: mi.IntType) -> tuple[int, int]:
    lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else U64_MAX)
    if lo is None or lo < 0:
        raise TypeError(f"control integers must be bounded below by 0 ({t})")
    return lo, min(hi, U64_MAX)


def _c_int(hi: int) -> str:
    return "uint32_t" if hi <= U32_MAX else "uint64_t"


def _lit(v: int) -> str:
    return f"{v}u" if v <= U32_MAX else f"{v}ull"


def _flit(v: float | None, dflt: str) -> str:
    return dflt if v is None else repr(float(v))


class _Field:
    """One request field: its C declaration, its default and its decode statement."""

    def __init__(self, msg: str, f: mi.Field) -> None:
        self.msg, self.name, self.key = msg, f.name, f.encode_name
        self.required = f.required
        t = f.type
        self.optional = False
        if isinstance(t, mi.UnionType):
            rest = [x for x in t.types if not isinstance(x, mi.NoneType)]
            if len(rest) != 1 or len(rest) == len(t.types):
                raise TypeError(f"{msg}.{f.name}: only `X | None` unions are supported")
            t, self.optional = rest[0], True
        self.t = t
        default = f.default
        if default is msgspec.NODEFAULT and f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        self.default = None if default is msgspec.NODEFAULT else default
        where = f"{msg}.{f.name}"
        if isinstance(t, mi.StrType | mi.ListType) and t.max_length is None:
            raise TypeError(f"{where}: give it Meta(max_length=...); the C struct holds it inline")
        if isinstance(t, mi.StrType) and t.pattern not in (None, control.PRINTABLE_ASCII):
            raise TypeError(
                f"{where}: the C decoder knows one pattern, control.PRINTABLE_ASCII, "
                f"not {t.pattern!r}"
            )

    def decl(self) -> list[str]:
        t, n = self.t, self.name
        out = [f"\tbool has_{n};"] if self.optional else []
        if isinstance(t, mi.IntType):
            out.append(f"\t{_c_int(_int_bounds(t)[1])} {n};")
        elif isinstance(t, mi.FloatType):
            out.append(f"\tdouble {n};")
        elif isinstance(t, mi.BoolType):
            out.append(f"\tbool {n};")
        elif isinstance(t, mi.StrType):
            out.append(f"\tchar {n}[{t.max_length + 1}];")
        elif isinstance(t, mi.ListType) and isinstance(t.item_type, mi.IntType):
            out.append(f"\tuint32_t {n}_len;")
            out.append(f"\t{_c_int(_int_bounds(t.item_type)[1])} {n}[{t.max_length}];")
        else:
            raise TypeError(f"{self.msg}.{n}: no C mapping for {t}")
        return out

    def set_default(self) -> list[str]:
        t, n, d = self.t, self.name, self.default
        if self.optional:
            return [f"\tout->has_{n} = {'false' if d is None else 'true'};"] + (
                [] if d is None else [f"\tout->{n} = {d!r};"]
            )
        if d is None:
            return []
        if isinstance(t, mi.StrType):
            return [f'\tmemcpy(out->{n}, "{d}", {len(d.encode()) + 1});']
        if isinstance(t, mi.ListType):
            if d:
                raise TypeError(f"{self.msg}.{n}: only empty list defaults are supported")
            return [f"\tout->{n}_len = 0;"]
        if isinstance(t, mi.BoolType):
            return [f"\tout->{n} = {'true' if d else 'false'};"]
        if isinstance(t, mi.IntType):
            return [f"\tout->{n} = {_lit(int(d))};"]
        return [f"\tout->{n} = {float(d)!r};"]

    def decode(self) -> list[str]:
        t, n, where = self.t, self.name, f'"{self.msg}.{self.name}"'
        body: list[str] = []
        if isinstance(t, mi.IntType):
            lo, hi = _int_bounds(t)
            body += [
                "\t\t\tuint64_t v = 0;",
                f"\t\t\tif (get_uint(val, {_lit(lo)}, {_lit(hi)}, &v, {where}, why, n) < 0)",
                "\t\t\t\treturn -1;",
                f"\t\t\tout->{n} = ({_c_int(hi)})v;",
            ]
        elif isinstance(t, mi.FloatType):
            lo = _flit(t.ge, "-HUGE_VAL")
            hi = _flit(t.le, "HUGE_VAL")
            if t.gt is not None or t.lt is not None:
                raise TypeError(f"{self.msg}.{n}: use ge/le on floats")
            body += [
                f"\t\t\tif (get_float(val, {lo}, {hi}, &out->{n}, {where}, why, n) < 0)",
                "\t\t\t\treturn -1;",
            ]
        elif isinstance(t, mi.BoolType):
            body += [
                "\t\t\tif (val->type != MSGPACK_OBJECT_BOOLEAN)",
                f'\t\t\t\treturn fail(why, n, "%s must be true or false", {where});',
                f"\t\t\tout->{n} = val->via.boolean;",
            ]
        elif isinstance(t, mi.StrType):
            body += [
                f"\t\t\tif (get_str(val, {t.min_length or 0}u, {t.max_length}u, out->{n}, "
                f"{where}, why, n) < 0)",
                "\t\t\t\treturn -1;",
            ]
            if t.pattern == control.PRINTABLE_ASCII:
                body += [
                    f"\t\t\tif (check_printable(out->{n}, {where}, why, n) < 0)",
                    "\t\t\t\treturn -1;",
                ]
        else:
            lo, hi = _int_bounds(t.item_type)
            body += [
                f"\t\t\tif (get_list(val, {t.min_length or 0}u, {t.max_length}u, {where}, why, "
                "n) < 0)",
                "\t\t\t\treturn -1;",
                f"\t\t\tout->{n}_len = val->via.array.size;",
                f"\t\t\tfor (uint32_t k = 0; k < out->{n}_len; k++) {{",
                "\t\t\t\tuint64_t v = 0;",
                f"\t\t\t\tif (get_uint(&val->via.array.ptr[k], {_lit(lo)}, {_lit(hi)}, &v, "
                f"{where}, why, n) < 0)",
                "\t\t\t\t\treturn -1;",
                f"\t\t\t\tout->{n}[k] = ({_c_int(hi)})v;",
                "\t\t\t}",
            ]
        if self.optional:
            body = [
                "\t\t\tif (val->type == MSGPACK_OBJECT_NIL) {",
                f"\t\t\t\tout->has_{n} = false;",
                "\t\t\t\tcontinue;",
                "\t\t\t}",
                f"\t\t\tout->has_{n} = true;",
                *body,
            ]
        return body


def _fields(cls: type[msgspec.Struct]) -> list[_Field]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return [_Field(cls.__name__, f) for f in info.fields]


HEADER_DOC = """\
/* dp_ctl_gen.h: GENERATED by tools/gen_abi.py from duckpipe/schema/control.py. Do not edit.
 *
 * The control requests as C structs, and one decoder from raw msgpack bytes:
 *   pre-scan (every declared length fits the bytes left, nesting <= DP_MAX_NESTING),
 *   then msgpack-c, then the message's own decoder, which checks every field
 *   against the schema's limits and names the field that is wrong.
 */"""


def render_ctl_h() -> str:
    types = request_types()
    out = [
        HEADER_DOC,
        "#ifndef DP_CTL_GEN_H",
        "#define DP_CTL_GEN_H",
        "",
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        '#include "dp_abi.h"',
        "",
        "/* The requests as plain structs: the cffi module parses them too, so that the mock",
        " * dataplane hands a request to the dataplane's own rules (dp_ctl_rules.h). */",
        CDEF_BEGIN,
        "",
        "enum dp_ctl_type {",
    ]
    out += [f"\tDP_CTL_{_snake(c.__name__).upper()}," for c in types]
    out += ["\tDP_CTL_NTYPES", "};", ""]
    for cls in types:
        doc = (cls.__doc__ or "").strip().splitlines()
        if doc:
            out.append(f"/* {cls.__name__}: {doc[0]} */")
        out.append(f"struct dp_ctl_{_snake(cls.__name__)} {{")
        for f in _fields(cls):
            out += f.decl()
        out += ["};", ""]
    out += [
        "struct dp_ctl_request {",
        "\tenum dp_ctl_type type;",
        "\tuint64_t req_id; /* also set when the rest fails to decode, to echo in the Error */",
        "\tunion {",
    ]
    out += [f"\t\tstruct dp_ctl_{_snake(c.__name__)} {_snake(c.__name__)};" for c in types]
    out += [
        "\t} u;",
        "};",
        "",
        CDEF_END,
        "",
        *render_reply_decls(),
        "/* Type names, indexed by enum dp_ctl_type. */",
        "extern const char *const dp_ctl_type_names[DP_CTL_NTYPES];",
        "",
        "/* Decode one raw control message. 0, or an enum dp_error_code (BAD_MESSAGE: not a",
        " * map with a known 'type' and a 'req_id'; BAD_REQUEST: a field is wrong) with why",
        " * naming what. Allocates nothing that outlives the call; never trusts a length. */",
        "int dp_ctl_decode(const char *buf, size_t len, struct dp_ctl_request *out, char *why,",
        "\t\t  size_t n);",
        "",
        "#endif /* DP_CTL_GEN_H */",
        "",
    ]
    return "\n".join(out)


C_PRELUDE = """\
/* dp_ctl_gen.c: GENERATED by tools/gen_abi.py from duckpipe/schema/control.py. Do not edit. */
#include "dp_ctl_gen.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dp_ctl_rt.h"
#include "dp_msgpack.h"
"""


def _decoder(cls: type[msgspec.Struct]) -> list[str]:
    s = _snake(cls.__name__)
    fields = _fields(cls)
    if len(fields) > 64:
        raise TypeError(f"{cls.__name__}: more than 64 fields")
    out = [
        "",
        f"static int decode_{s}(const msgpack_object *m, struct dp_ctl_{s} *out, char *why, "
        "size_t n)",
        "{",
        "\tuint64_t seen = 0;",
        "\tmemset(out, 0, sizeof(*out));",
    ]
    for f in fields:
        out += f.set_default()
    out += [
        "\tfor (uint32_t i = 0; i < m->via.map.size; i++) {",
        "\t\tconst msgpack_object *key = &m->via.map.ptr[i].key;",
        "\t\tconst msgpack_object *val = &m->via.map.ptr[i].val;",
        "\t\tif (key->type != MSGPACK_OBJECT_STR)",
        f'\t\t\treturn fail(why, n, "{cls.__name__}: every key must be a string");',
    ]
    for i, f in enumerate(fields):
        kw = "if" if i == 0 else "} else if"
        out.append(f'\t\t{kw} (key_is(key, "{f.key}", {len(f.key.encode())})) {{')
        out.append(f"\t\t\tseen |= 1ull << {i};")
        out += f.decode()
    if fields:
        out.append("\t\t}")
    out.append("\t}")
    for i, f in enumerate(fields):
        if f.required:
            out += [
                f"\tif (!(seen & (1ull << {i})))",
                f'\t\treturn fail(why, n, "{cls.__name__}.{f.name} is required");',
            ]
    out += ["\treturn 0;", "}"]
    return out


def render_ctl_c() -> str:
    types = request_types()
    out = [C_PRELUDE.replace("    ", "\t").rstrip("\n")]  # C in the house style: tabs
    for cls in types:
        out += _decoder(cls)
    out += ["", "const char *const dp_ctl_type_names[DP_CTL_NTYPES] = {"]
    out += [f'\t[DP_CTL_{_snake(c.__name__).upper()}] = "{c.__name__}",' for c in types]
    out += [
        "};",
        "",
        "int dp_ctl_decode(const char *buf, size_t len, struct dp_ctl_request *out, char *why,",
        "\t\t  size_t n)",
        "{",
        "\tmemset(out, 0, sizeof(*out));",
        "\tif (len > DP_MAX_MESSAGE_BYTES)",
        '\t\treturn fail(why, n, "message of %zu bytes (at most %d)", len, DP_MAX_MESSAGE_BYTES),',
        "\t\t       DP_ERROR_CODE_BAD_MESSAGE;",
        "\t/* msgpack-c reserves memory from declared lengths: refuse lies before it reads */",
        "\tif (dp_msgpack_prescan(buf, len, DP_MAX_NESTING, why, n) < 0)",
        "\t\treturn DP_ERROR_CODE_BAD_MESSAGE;",
        "\tmsgpack_unpacked msg;",
        "\tmsgpack_unpacked_init(&msg);",
        "\tsize_t off = 0;",
        "\tint rc = DP_ERROR_CODE_BAD_MESSAGE;",
        "\tconst msgpack_object *type, *rid;",
        "\tif (msgpack_unpack_next(&msg, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||",
        "\t    msg.data.type != MSGPACK_OBJECT_MAP) {",
        '\t\tfail(why, n, "not a msgpack map");',
        "\t\tgoto out;",
        "\t}",
        '\trid = dp_msgpack_get(&msg.data, "req_id");',
        "\tif (rid && rid->type == MSGPACK_OBJECT_POSITIVE_INTEGER)",
        "\t\tout->req_id = rid->via.u64;",
        '\ttype = dp_msgpack_get(&msg.data, "type");',
        "\tif (!type || type->type != MSGPACK_OBJECT_STR) {",
        "\t\tfail(why, n, \"no 'type' naming the message\");",
        "\t\tgoto out;",
        "\t}",
        "\tint t = -1;",
        "\tfor (int i = 0; i < DP_CTL_NTYPES && t < 0; i++)",
        "\t\tif (key_is(type, dp_ctl_type_names[i], strlen(dp_ctl_type_names[i])))",
        "\t\t\tt = i;",
        "\tif (t < 0) {",
        "\t\tfail(why, n, \"unknown message type '%.*s'\", (int)(type->via.str.size > 32 ? 32 : "
        "type->via.str.size), type->via.str.ptr);",
        "\t\tgoto out;",
        "\t}",
        "\tout->type = (enum dp_ctl_type)t;",
        "\tint bad;",
        "\tswitch (out->type) {",
    ]
    for cls in types:
        s = _snake(cls.__name__)
        out += [
            f"\tcase DP_CTL_{s.upper()}:",
            f"\t\tbad = decode_{s}(&msg.data, &out->u.{s}, why, n);",
            "\t\tbreak;",
        ]
    out += [
        "\tdefault:",
        "\t\tbad = -1;",
        "\t}",
        "\trc = bad < 0 ? DP_ERROR_CODE_BAD_REQUEST : 0;",
        "out:",
        "\tmsgpack_unpacked_destroy(&msg);",
        "\treturn rc;",
        "}",
        *render_reply_encoders(),
        "",
    ]
    return "\n".join(out)


def render_config_h() -> str:
    """Defaults of the dataplane config, for dp_config.c: the Struct holds them once."""
    from duckpipe.schema import config

    out = [
        "/* dp_config_gen.h: GENERATED by tools/gen_abi.py from duckpipe/schema/config.py."
        " Do not edit.",
        " *",
        " * The default of every config field; dp_config.c reads each field by its schema name",
        " * (tests/tools/test_generated_files.py checks it names them all). */",
        "#ifndef DP_CONFIG_GEN_H",
        "#define DP_CONFIG_GEN_H",
        "",
    ]
    for cls, prefix in (
        (config.DataplaneConfig, "DP_CFG_DEFAULT_"),
        (config.NicConfig, "DP_CFG_NIC_DEFAULT_"),
    ):
        for f in msgspec.structs.fields(cls):
            d = f.default
            if d is msgspec.NODEFAULT:
                continue
            if isinstance(d, bool):
                lit = "true" if d else "false"
            elif isinstance(d, int):
                lit = _lit(d)
            elif isinstance(d, str):
                lit = f'"{d}"'
            else:
                continue
            out.append(f"#define {prefix}{f.name.upper()} {lit}")
        out.append("")
    out += [
        "/* The readers dp_config_gen.c defines: every field of DataplaneConfig / NicConfig",
        " * that is one scalar in its C struct, by its schema name, with the default above;",
        " * the type of each is checked, a missing one takes its default. The fields in",
        " * CONFIG_BY_HAND (ctlgen.py), and every bound, are dp_config.c's. 0, or -1 with",
        " * dp_error() naming the key. */",
        "struct msgpack_object;",
        "struct dp_config;",
        "struct dp_nic_cfg;",
        "int dp_cfg_gen_read(const struct msgpack_object *o, struct dp_config *cfg);",
        "int dp_cfg_gen_read_nic(const struct msgpack_object *o, struct dp_nic_cfg *nic);",
        "",
        "#endif /* DP_CONFIG_GEN_H */",
        "",
    ]
    return "\n".join(out)


# Config fields dp_config.c reads itself: not one scalar in the C struct (an address from
# two keys, a string that becomes an enum, a list), each with the reason.
CONFIG_BY_HAND: dict[str, dict[str, str]] = {
    "DataplaneConfig": {
        "cores": "a list, -1 for anything but a CPU number",
        "idle": "a Literal, the enum dp_idle_parse returns",
        "nics": "a list of NicConfig, each read by load_nic",
    },
    "NicConfig": {
        "host_ip": "with host_port, one sockaddr_in (get_addr)",
        "host_port": "with host_ip, one sockaddr_in (get_addr)",
        "broadcast": "with broadcast_port, a sockaddr_in only when set",
        "broadcast_port": "with broadcast, a sockaddr_in only when set",
        "flow_steering": "a Literal, enum dp_flow_steering",
        "ducks": "a list of DuckConfig, into the topology's one list",
    },
}


def _cfg_read(cls: type[msgspec.Struct], prefix: str, var: str) -> tuple[list[str], str]:
    """The read of every generated field of cls: one dp_msgpack_* call each."""
    calls, asserts = [], []
    hand = CONFIG_BY_HAND[cls.__name__]
    ctype = "struct dp_config" if var == "cfg" else "struct dp_nic_cfg"
    for f in mi.type_info(cls).fields:
        if f.name in hand:
            continue
        t, key, dst = f.type, f.encode_name, f"{var}->{f.name}"
        dflt = '""' if f.required else f"{prefix}{f.name.upper()}"
        if isinstance(t, mi.BoolType):
            calls.append(f'dp_msgpack_bool(o, "{key}", &{dst}, {dflt})')
        elif isinstance(t, mi.IntType):
            _, hi = _int_bounds(t)
            if _c_int(hi) == "uint32_t":
                calls.append(f'dp_msgpack_u32(o, "{key}", &{dst}, {dflt})')
            else:
                calls.append(f'dp_msgpack_u64(o, "{key}", &{dst}, {dflt}, UINT64_MAX)')
        elif isinstance(t, mi.StrType):
            if t.max_length is None:
                raise TypeError(f"{cls.__name__}.{f.name}: a string read into C needs max_length")
            calls.append(f'dp_msgpack_str(o, "{key}", {dst}, sizeof({dst}), {dflt})')
            asserts.append(
                f"_Static_assert(sizeof((({ctype} *)0)->{f.name}) == {t.max_length + 1}, "
                f'"{cls.__name__}.{f.name}: max_length {t.max_length} and a NUL");'
            )
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: add it to CONFIG_BY_HAND or teach _cfg_read")
    body = "\tif (" + " ||\n\t    ".join(f"{c} < 0" for c in calls) + ")\n\t\treturn -1;"
    return asserts, body


def render_config_c() -> str:
    """The config readers dp_config_gen.h declares: the scalar fields, from config.py."""
    from duckpipe.schema import config

    root_asserts, root = _cfg_read(config.DataplaneConfig, "DP_CFG_DEFAULT_", "cfg")
    nic_asserts, nic = _cfg_read(config.NicConfig, "DP_CFG_NIC_DEFAULT_", "nic")
    return "\n".join(
        [
            "/* dp_config_gen.c: GENERATED by tools/gen_abi.py from duckpipe/schema/config.py."
            " Do not edit. */",
            '#include "dp_config_gen.h"',
            "",
            "#include <msgpack.h>",
            "#include <stdint.h>",
            "",
            '#include "dp_config.h"',
            '#include "dp_msgpack.h"',
            "",
            "/* the C struct holds each string inline: its size is the schema's max_length + 1 */",
            *root_asserts,
            *nic_asserts,
            "",
            "int dp_cfg_gen_read(const msgpack_object *o, struct dp_config *cfg)",
            "{",
            root,
            "\treturn 0;",
            "}",
            "",
            "int dp_cfg_gen_read_nic(const msgpack_object *o, struct dp_nic_cfg *nic)",
            "{",
            nic,
            "\treturn 0;",
            "}",
            "",
        ]
    )


# --- reply encoders ---------------------------------------------------------------------


def reply_types() -> list[type[msgspec.Struct]]:
    """Every reply and the Structs nested in them, each after the ones it holds."""
    out: list[type[msgspec.Struct]] = []

    def visit(t: mi.Type) -> None:
        if isinstance(t, mi.StructType):
            for f in t.fields:
                visit(f.type)
            if t.cls not in out:
                out.append(t.cls)
        elif isinstance(t, mi.ListType | mi.DictType):
            visit(t.item_type if isinstance(t, mi.ListType) else t.value_type)

    for cls in typing.get_args(control.AnyReply):
        visit(mi.type_info(cls))
    return out


def _reply_decl(f: mi.Field, where: str) -> list[str]:
    t, n = f.type, f.name
    if isinstance(t, mi.IntType):
        return [f"\tuint64_t {n};"]
    if isinstance(t, mi.EnumType):
        return [f"\tuint32_t {n}; /* enum dp_{_snake(t.cls.__name__)} */"]
    if isinstance(t, mi.BoolType):
        return [f"\tbool {n};"]
    if isinstance(t, mi.FloatType):
        return [f"\tdouble {n};"]
    if isinstance(t, mi.StrType):
        return [f'\tconst char *{n}; /* NULL packs as "" */']
    if isinstance(t, mi.StructType):
        return [f"\tstruct dp_ctl_{_snake(t.cls.__name__)} {n};"]
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.IntType):
        return [f"\tconst {_c_list_int(t.item_type)} *{n};", f"\tuint32_t {n}_len;"]
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
        return [
            f"\tconst struct dp_ctl_{_snake(t.item_type.cls.__name__)} *{n};",
            f"\tuint32_t {n}_len;",
        ]
    if isinstance(t, mi.DictType) and isinstance(t.value_type, mi.IntType):
        return [
            f"\tconst char *const *{n}_keys;",
            f"\tconst uint64_t *{n}_values;",
            f"\tuint32_t {n}_len;",
        ]
    raise TypeError(f"{where}.{n}: no C encoder for {t}")


def _c_list_int(t: mi.IntType) -> str:
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else U64_MAX)
    return "uint32_t" if hi <= U32_MAX else "uint64_t"


def _reply_pack(f: mi.Field) -> list[str]:
    t, n = f.type, f.name
    key = f'\tkey(pk, "{f.encode_name}", {len(f.encode_name.encode())});'
    if isinstance(t, mi.IntType):
        body = [f"\tmsgpack_pack_uint64(pk, m->{n});"]
    elif isinstance(t, mi.EnumType):
        body = [f"\tmsgpack_pack_uint32(pk, m->{n});"]
    elif isinstance(t, mi.BoolType):
        body = [
            f"\tif (m->{n})",
            "\t\tmsgpack_pack_true(pk);",
            "\telse",
            "\t\tmsgpack_pack_false(pk);",
        ]
    elif isinstance(t, mi.FloatType):
        body = [f"\tmsgpack_pack_double(pk, m->{n});"]
    elif isinstance(t, mi.StrType):
        body = [f"\tstr(pk, m->{n});"]
    elif isinstance(t, mi.StructType):
        body = [f"\tdp_ctl_pack_{_snake(t.cls.__name__)}(pk, &m->{n});"]
    elif isinstance(t, mi.ListType):
        item = (
            f"msgpack_pack_{_c_list_int(t.item_type)[:-2]}(pk, m->{n}[i]);"
            if isinstance(t.item_type, mi.IntType)
            else f"dp_ctl_pack_{_snake(t.item_type.cls.__name__)}(pk, &m->{n}[i]);"
        )
        body = [
            f"\tmsgpack_pack_array(pk, m->{n}_len);",
            f"\tfor (uint32_t i = 0; i < m->{n}_len; i++)",
            f"\t\t{item}",
        ]
    else:
        body = [
            f"\tmsgpack_pack_map(pk, m->{n}_len);",
            f"\tfor (uint32_t i = 0; i < m->{n}_len; i++) {{",
            f"\t\tstr(pk, m->{n}_keys[i]);",
            f"\t\tmsgpack_pack_uint64(pk, m->{n}_values[i]);",
            "\t}",
        ]
    return [key, *body]


def render_reply_decls() -> list[str]:
    out = ["struct msgpack_packer; /* msgpack-c's packer */", ""]
    for cls in reply_types():
        info = mi.type_info(cls)
        s = _snake(cls.__name__)
        out.append(f"/* {cls.__name__} (reply): pack with dp_ctl_pack_{s}. */")
        out.append(f"struct dp_ctl_{s} {{")
        for f in info.fields:
            out += _reply_decl(f, cls.__name__)
        out += [
            "};",
            f"void dp_ctl_pack_{s}(struct msgpack_packer *pk, const struct dp_ctl_{s} *m);",
            "",
        ]
    return out


def render_reply_encoders() -> list[str]:
    out = [
        "",
        "/* --- reply encoders ---------------------------------------------------------- */",
        "",
        "static void key(msgpack_packer *pk, const char *k, size_t n)",
        "{",
        "\tmsgpack_pack_str(pk, n);",
        "\tmsgpack_pack_str_body(pk, k, n);",
        "}",
        "",
        "static void str(msgpack_packer *pk, const char *s)",
        "{",
        '\tkey(pk, s ? s : "", s ? strlen(s) : 0);',
        "}",
    ]
    for cls in reply_types():
        info = mi.type_info(cls)
        s = _snake(cls.__name__)
        tagged = info.tag_field is not None
        out += [
            "",
            f"void dp_ctl_pack_{s}(msgpack_packer *pk, const struct dp_ctl_{s} *m)",
            "{",
            f"\tmsgpack_pack_map(pk, {len(info.fields) + tagged});",
        ]
        if tagged:
            out += [
                f'\tkey(pk, "{info.tag_field}", {len(info.tag_field)});',
                f'\tkey(pk, "{info.tag}", {len(info.tag)});',
            ]
        for f in info.fields:
            out += _reply_pack(f)
        out.append("}")
    return out
