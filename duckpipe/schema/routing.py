"""Routing tables of a mixture-of-experts forward: the experts each token goes to, and weights.

Two layouts, little-endian, fixed-width, 8-byte aligned. ``tools/gen_abi.py`` writes
``dataplane/include/gen/dp_routing_abi.h`` and ``schemas/routing.json`` from here;
``dataplane/include/dp_routing.h`` holds the one validator of each (C, header-only: the
dataplane, the duck emulator, the cffi module and the fuzz harness compile it alike).

The host table: written by the client, read by the dataplane. Token ``t``'s ``k``-th
choice is entry ``t * topk + k``, as in DeepEP's ``topk_idx``/``topk_weights`` and the
gate's ``Routing(indices, weights)``, except that a token's choices are listed by
expert id, ascending (so they are distinct), ROUTING_NO_EXPERT last: the order each
duck's section needs, so that the dataplane's split writes every entry where it goes
without sorting (the client's pack sorts a gate's choices, which come by score)::

    0             +--------------------------------------------------+
                  | dp_routing_header (16 B)                         |
                  |   magic "DPRT" | version | flags | topk          |
                  |   tokens | n_experts                             |
    16            +--------------------------------------------------+
                  | dp_routing_entry[T * K] (8 B each)               |
                  |   expert (u32) | weight (f32)                    |
    16 + 8*T*K    +--------------------------------------------------+

    (T tokens, K topk.) An expert of ROUTING_NO_EXPERT is the gate's -1, DeepEP's "no
    expert" (a padded or dropped slot): it contributes nothing, its weight is not read,
    and the split leaves it out of the wire table. In shared memory the table follows
    the activation in the forward's activation slot, at align(activation bytes, 64). The
    dataplane copies it
    out of the slot once (T from the descriptor's rows; K read once from the slot and
    bounded by MAX_TOPK, so the copy is at most 16 + 8 * MAX_TOKENS * MAX_TOPK bytes)
    and checks the copy, never the slot, against the forward's rows and the layer's
    n_experts.

The wire table: built by the dataplane from a checked host table and the layer's
placement, sent once per NIC in front of the activation; each duck reads its own
section. Entries of a section are strictly ascending by (row, expert); a duck's
reply holds one row per distinct ``row`` of its section, ascending, the weighted
sum of its experts for that row, so the host adds the rows in place::

    0             +--------------------------------------------------+
                  | dp_routing_wire_header (16 B)                    |
                  |   magic "DPRW" | version | flags | n_ducks       |
                  |   rows | entries                                 |
    16            +--------------------------------------------------+
                  | dp_routing_wire_duck[D] (8 B each)               |
                  |   duck | n_rows | n_entries, duck ascending      |
    16 + 8*D      +--------------------------------------------------+
                  | dp_routing_wire_entry[E] (8 B each)              |
                  |   the first duck's section, then the next...     |
                  |   row (u16) | expert (u16) | weight (f32)        |
    16 + 8*(D+E)  +--------------------------------------------------+

    (D n_ducks, E entries.) ``row`` indexes the rows of the activation that travels
    with the table: every token when it is broadcast with a target set (ducks without
    a section skip it), only one duck's rows when it is unicast to that duck
    (dp_routing_wire_unicast renumbers them 0..n_rows-1). ``expert`` is the expert's
    slot in the receiving duck's bank (dp_routing_bank_slots: a duck's experts ascending
    by id). Other ducks' banks differ in size, so a duck checks the whole table with
    n_experts = MAX_EXPERTS and then its own section's slots against its bank. With flag SHARED the
    layer has a shared expert: a duck of its set (shared_ducks; its bank holds shared
    columns) that the message reaches computes them for every row and replies every row,
    with or without a section, and a table may have no section at all; a duck outside
    the set computes its section alone, as without the flag, and skips a table without
    one. Its unicast table keeps the flag and has its rows alone.

The placement (``dp_routing_placement``): expert ``e`` lives on ducks
``ducks[e * MAX_REPLICAS + r]`` for ``r < replicas[e]``; token ``t`` reaches expert ``e``
through replica ``t % replicas[e]``, so that one rule splits every NIC's table alike.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import msgspec

from .layout import F32, U8, U16, U32, Array

__all__ = [
    "CONSTANTS",
    "ENUMS",
    "LAYOUTS",
    "MAX_EXPERTS",
    "MAX_REPLICAS",
    "MAX_TOKENS",
    "MAX_TOPK",
    "ROUTING_MAGIC",
    "ROUTING_NO_EXPERT",
    "ROUTING_VERSION",
    "ROUTING_WIRE_MAGIC",
    "Placement",
    "RoutingEntry",
    "RoutingError",
    "RoutingHeader",
    "RoutingWireDuck",
    "RoutingWireEntry",
    "RoutingWireFlag",
    "RoutingWireHeader",
]

ROUTING_MAGIC = int.from_bytes(b"DPRT", "little")
ROUTING_WIRE_MAGIC = int.from_bytes(b"DPRW", "little")
ROUTING_VERSION = 1
MAX_EXPERTS = 1024  # routed experts of one layer (DeepSeek-V3: 256; a wire expert is u16)
MAX_TOPK = 16  # experts per token (DeepSeek-V3, Qwen3: 8)
MAX_TOKENS = 4096  # rows of one routed forward (a wire row is u16)
MAX_REPLICAS = 8  # ducks holding one expert
#: a host entry's expert for "no expert": the gate's -1 (DeepEP's padded or dropped
#: slot). Any number per token, any weight (never read); the split skips it, so it
#: never reaches a duck, and a token of only these gets the shared expert or zeros.
ROUTING_NO_EXPERT = 0xFFFFFFFF


class RoutingError(enum.IntEnum):
    """Why dp_routing.h refused a table (dp_routing_strerror says it in words, and the
    ``why`` buffer says where)."""

    OK = 0
    TRUNCATED = -1  # fewer bytes than the header, or than the sizes it declares
    BAD_MAGIC = -2  # not a routing table (or the other kind: host vs wire)
    BAD_VERSION = -3
    BAD_FLAGS = -4  # flags this version does not define (none are)
    TOKENS = -5  # zero, over MAX_TOKENS, or not the forward's rows
    TOPK = -6  # zero, over MAX_TOPK, or more than n_experts
    N_EXPERTS = -7  # zero, over MAX_EXPERTS, or not the layer's
    EXPERT = -8  # an expert id at or past n_experts
    DUPLICATE = -9  # a token names one expert twice
    WEIGHT = -10  # a weight that is NaN or infinite
    DUCKS = -11  # wire: no ducks, a duck past MAX_DUCKS, or not strictly ascending
    ENTRIES = -12  # wire: a section's count is zero, or the counts do not add up
    ORDER = -13  # wire: a section not strictly ascending by (row, expert)
    ROWS = -14  # wire: a row past the rows, or n_rows not its distinct rows
    PLACEMENT = -15  # an expert with no duck or too many, a duck twice or past MAX_DUCKS
    NO_ROOM = -16  # the caller's output buffer is too small
    NO_SUCH_DUCK = -17  # the duck has no section in this table


class RoutingWireFlag(enum.IntFlag):
    """Bits of a wire table's ``flags``."""

    #: the layer has a shared expert: every duck of its set (shared_ducks: its bank holds
    #: shared columns) the activation reaches computes them for every row, adds its
    #: section's experts, and replies every row (without a section, the shared part
    #: alone); a duck outside the set answers its section's rows as without the flag
    SHARED = 1


class RoutingHeader(msgspec.Struct, frozen=True):
    """Host routing table header, at byte 0 of the table; entries follow at byte 16."""

    __c_name__: ClassVar[str] = "dp_routing_header"
    __c_size__: ClassVar[int] = 16
    __field_docs__: ClassVar[dict[str, str]] = {
        "magic": "ROUTING_MAGIC",
        "version": "ROUTING_VERSION",
        "flags": "none defined: must be 0",
        "topk": "experts per token, 1..MAX_TOPK",
        "tokens": "rows of the activation, 1..MAX_TOKENS: the forward's rows",
        "n_experts": "routed experts of the layer, 1..MAX_EXPERTS",
    }

    magic: U32
    version: U8
    flags: U8
    topk: U16
    tokens: U32
    n_experts: U32


class RoutingEntry(msgspec.Struct, frozen=True):
    """One choice of one token: entry t * topk + k of the host table."""

    __c_name__: ClassVar[str] = "dp_routing_entry"
    __c_size__: ClassVar[int] = 8
    __field_docs__: ClassVar[dict[str, str]] = {
        "expert": "0..n_experts-1, above the token's previous entry (ascending: distinct); "
        "or ROUTING_NO_EXPERT (the gate's -1: the slot contributes nothing), only after "
        "the token's experts",
        "weight": "finite; scales the expert's output for this token (not read with "
        "ROUTING_NO_EXPERT)",
    }

    expert: U32
    weight: F32


class RoutingWireHeader(msgspec.Struct, frozen=True):
    """Wire routing table header, at byte 0 of the table; the duck directory follows."""

    __c_name__: ClassVar[str] = "dp_routing_wire_header"
    __c_size__: ClassVar[int] = 16
    __field_docs__: ClassVar[dict[str, str]] = {
        "magic": "ROUTING_WIRE_MAGIC",
        "version": "ROUTING_VERSION",
        "flags": "enum dp_routing_wire_flag bits",
        "n_ducks": "sections (directory entries), 0..MAX_DUCKS (0 only with SHARED)",
        "rows": "rows of the activation sent with the table, 1..MAX_TOKENS",
        "entries": "entries of every section together, n_ducks..rows*MAX_TOPK",
    }

    magic: U32
    version: U8
    flags: U8
    n_ducks: U16
    rows: U32
    entries: U32


class RoutingWireDuck(msgspec.Struct, frozen=True):
    """One duck's section: its entries follow the previous duck's."""

    __c_name__: ClassVar[str] = "dp_routing_wire_duck"
    __c_size__: ClassVar[int] = 8
    __field_docs__: ClassVar[dict[str, str]] = {
        "duck": "topology index, below MAX_DUCKS; strictly ascending in the directory",
        "n_rows": "distinct rows of its section: the rows of its reply",
        "n_entries": "entries of its section, at least 1",
    }

    duck: U16
    n_rows: U16
    n_entries: U32


class RoutingWireEntry(msgspec.Struct, frozen=True):
    """One (row, expert) a duck computes, with the weight it scales the output by."""

    __c_name__: ClassVar[str] = "dp_routing_wire_entry"
    __c_size__: ClassVar[int] = 8
    __field_docs__: ClassVar[dict[str, str]] = {
        "row": "row of the activation sent with the table",
        "expert": "the expert's slot in the receiving duck's bank, 0..its experts-1 "
        "(dp_routing_split with bank slots; the global id without)",
        "weight": "finite",
    }

    row: U16
    expert: U16
    weight: F32


class Placement(msgspec.Struct, frozen=True):
    """Which ducks hold each routed expert of a layer: the dataplane's private copy,
    built from the layer's load and checked once (dp_routing_placement_check)."""

    __c_name__: ClassVar[str] = "dp_routing_placement"
    __c_size__: ClassVar[int] = 4 + MAX_EXPERTS + 2 * MAX_EXPERTS * MAX_REPLICAS
    __field_docs__: ClassVar[dict[str, str]] = {
        "n_experts": "routed experts, 1..MAX_EXPERTS",
        "replicas": "ducks holding expert e, 1..MAX_REPLICAS (e < n_experts)",
        "ducks": "expert e's ducks at e * MAX_REPLICAS + r, distinct, below MAX_DUCKS",
    }

    n_experts: U32
    replicas: Array("uint8_t", MAX_EXPERTS)
    ducks: Array("uint16_t", MAX_EXPERTS * MAX_REPLICAS)


LAYOUTS = (
    RoutingHeader,
    RoutingEntry,
    RoutingWireHeader,
    RoutingWireDuck,
    RoutingWireEntry,
    Placement,
)
ENUMS = (RoutingError, RoutingWireFlag)

CONSTANTS: dict[str, int] = {
    "ROUTING_MAGIC": ROUTING_MAGIC,
    "ROUTING_WIRE_MAGIC": ROUTING_WIRE_MAGIC,
    "ROUTING_VERSION": ROUTING_VERSION,
    "MAX_EXPERTS": MAX_EXPERTS,
    "MAX_TOPK": MAX_TOPK,
    "MAX_TOKENS": MAX_TOKENS,
    "MAX_REPLICAS": MAX_REPLICAS,
    "ROUTING_NO_EXPERT": ROUTING_NO_EXPERT,
}
