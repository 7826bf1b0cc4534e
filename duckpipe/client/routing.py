"""Routing tables in numpy: pack a gate's ``(indices, weights)`` into the table the dataplane
reads, and check, split and read tables with the dataplane's own C rules.

The layouts are :mod:`duckpipe.schema.routing`'s (drawn there); the rules are
``dataplane/include/dp_routing.h``, reached through cffi, so that a table this module
accepts is one the dataplane accepts. :func:`pack` writes a gate's choices and checks
them by that rule in one pass (dp_routing_pack), so the client's check of a routing is the
dataplane's; :func:`check` judges a table already written.

    table = pack(indices, weights, n_experts)            # [tokens, topk] each
    check(table, tokens, n_experts)                       # BadInput with the C rule's reason
    wire, targets = split(table, placement(ducks_of))     # one NIC's per-duck sections
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np

from .._abi import ffi, lib, text
from ..errors import BadInput
from ..schema import routing as schema
from ..schema.abi import MAX_DUCKS
from ..schema.layout import layout_of
from ..schema.routing import MAX_EXPERTS, MAX_REPLICAS, MAX_TOKENS, MAX_TOPK, RoutingError
from .models import is_float_dtype

__all__ = [
    "ENTRY_DTYPE",
    "HEADER_DTYPE",
    "WIRE_DUCK_DTYPE",
    "WIRE_ENTRY_DTYPE",
    "WIRE_HEADER_DTYPE",
    "RoutingRefused",
    "Section",
    "bank_slots",
    "check",
    "check_wire",
    "pack",
    "pack_into",
    "placement",
    "sections",
    "split",
    "table_size",
    "unicast",
    "unpack",
]

_WHY = 256  # bytes of the C rule's reason


def _numpy_dtype(cls: type[msgspec.Struct]) -> np.dtype:
    """A structured dtype with every field of a layout struct at its schema offset."""
    lay = layout_of(cls)
    base = {"uint8_t": "<u1", "uint16_t": "<u2", "uint32_t": "<u4", "float": "<f4"}
    formats: list[Any] = [
        (base[f.ctype], (f.count,)) if f.count else base[f.ctype] for f in lay.fields
    ]
    return np.dtype(
        {
            "names": [f.name for f in lay.fields],
            "formats": formats,
            "offsets": [f.offset for f in lay.fields],
            "itemsize": lay.size,
        }
    )


HEADER_DTYPE = _numpy_dtype(schema.RoutingHeader)
ENTRY_DTYPE = _numpy_dtype(schema.RoutingEntry)
WIRE_HEADER_DTYPE = _numpy_dtype(schema.RoutingWireHeader)
WIRE_DUCK_DTYPE = _numpy_dtype(schema.RoutingWireDuck)
WIRE_ENTRY_DTYPE = _numpy_dtype(schema.RoutingWireEntry)
_WH, _WD, _WE = (d.itemsize for d in (WIRE_HEADER_DTYPE, WIRE_DUCK_DTYPE, WIRE_ENTRY_DTYPE))


class RoutingRefused(BadInput):
    """A routing table (or placement) the dataplane's rule refuses; ``code`` says which rule."""

    def __init__(self, message: str, code: RoutingError) -> None:
        super().__init__(message)
        self.code = code


def _refused(rc: int, why: Any, what: str) -> RoutingRefused:
    code = RoutingError(rc)
    reason = text(why) or text(lib.dp_routing_strerror(rc))
    return RoutingRefused(f"{what} refused ({code.name}): {reason}", code)


def _bytes_of(table: Any) -> np.ndarray:
    """A 1-D uint8 view of a buffer (numpy array, bytes, bytearray, memoryview)."""
    if isinstance(table, np.ndarray):
        if not table.flags.c_contiguous:
            raise BadInput("a routing table must be one contiguous buffer")
        return table.reshape(-1).view(np.uint8)
    return np.frombuffer(table, dtype=np.uint8)


def _fits_u32(name: str, value: int) -> None:
    if not isinstance(value, int | np.integer) or not 0 <= value <= 0xFFFFFFFF:
        raise BadInput(f"{name} must be an integer in 0..2**32-1, got {value!r}")


def table_size(tokens: int, topk: int) -> int:
    """Bytes of a host routing table of ``tokens`` by ``topk``."""
    out = ffi.new("uint64_t *")
    if tokens < 0 or topk < 0 or lib.dp_routing_size(tokens, topk, out) < 0:
        raise BadInput(f"a routing table of {tokens} tokens by {topk} does not fit 64 bits")
    return int(out[0])


_PACKED = (np.dtype(np.int32), np.dtype(np.int64))  # index widths dp_routing_pack reads
_F32 = np.dtype(np.float32)


def packable(indices: Any, weights: Any) -> bool:
    """Whether dp_routing_pack can read ``indices`` and ``weights`` as they are: numpy
    arrays, C-contiguous, int32 or int64 and float32, one ``[tokens, topk]`` shape within
    the maximums (a gate's output). Anything else goes through :func:`pack`'s conversions
    and its messages."""
    return (
        type(indices) is np.ndarray
        and type(weights) is np.ndarray
        and indices.dtype in _PACKED
        and weights.dtype == _F32
        and indices.ndim == 2
        and indices.shape == weights.shape
        and 1 <= indices.shape[0] <= MAX_TOKENS
        and 1 <= indices.shape[1] <= MAX_TOPK
        and indices.flags.c_contiguous
        and weights.flags.c_contiguous
    )


def _as_routing(indices: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """indices as C-contiguous int32 or int64 and weights as C-contiguous float32, both
    [tokens, topk], or BadInput for what the table cannot hold. What it can hold (ids in
    range, distinct, finite weights) is for the C rule to judge, in dp_routing_pack."""
    if packable(indices, weights):
        return indices, weights  # the gate's own arrays: what the C rule reads, as they are
    if not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu":
        raise BadInput("routing indices must be a numpy array of integers (the gate's int32)")
    if not isinstance(weights, np.ndarray) or not is_float_dtype(weights.dtype):
        raise BadInput("routing weights must be a numpy array of floats (the gate's float32)")
    if indices.ndim != 2 or weights.shape != indices.shape:
        raise BadInput(
            f"routing indices {indices.shape} and weights {weights.shape} must both be "
            "[tokens, topk]"
        )
    # the bounds that size the table (the C rule refuses them too, after the allocation)
    tokens, topk = indices.shape
    if not 1 <= tokens <= MAX_TOKENS:
        raise BadInput(
            f"a routed forward carries 1..{MAX_TOKENS} tokens, got {tokens}; "
            "split the batch into several forwards"
        )
    if not 1 <= topk <= MAX_TOPK:
        raise BadInput(f"a token is routed to 1..{MAX_TOPK} experts, got topk {topk}")
    if indices.dtype not in (np.int32, np.int64):
        if indices.dtype == np.uint64 and (indices > np.iinfo(np.int64).max).any():
            t, k = (int(i) for i in np.argwhere(indices > np.iinfo(np.int64).max)[0])
            raise BadInput(
                f"token {t}, choice {k} names expert {int(indices[t, k])}: no layer has "
                "that many experts (route with this layer's gate)"
            )
        indices = indices.astype(np.int64)
    if weights.dtype != np.float32:
        with np.errstate(over="ignore"):
            w32 = weights.astype(np.float32)
        lost = ~np.isfinite(w32) & np.isfinite(weights)
        if lost.any():
            t, k = (int(i) for i in np.argwhere(lost)[0])
            raise BadInput(
                f"token {t}, choice {k} has weight {float(weights[t, k])}, beyond float32's "
                "range: the dataplane weighs experts in float32"
            )
        weights = w32
    return np.ascontiguousarray(indices), np.ascontiguousarray(weights)


def pack(indices: np.ndarray, weights: np.ndarray, n_experts: int, out: Any = None) -> np.ndarray:
    """The host routing table of a gate's ``indices`` and ``weights`` (``[tokens, topk]``
    each) for a layer of ``n_experts``, written into ``out`` (a writable buffer of at least
    :func:`table_size` bytes: the slot's bytes after the activation) or a new array, and
    checked by the dataplane's rule in the same pass (dp_routing_pack). A gate gives each
    token's choices by score; the table lists them by expert id, -1 last (the order a
    duck's section needs, so the dataplane's split writes without sorting): the pack sorts
    them with their weights. Returns the table's bytes (a view of ``out``); raises
    :class:`RoutingRefused` with the rule's reason."""
    _fits_u32("n_experts", n_experts)
    idx, w = _as_routing(indices, weights)
    tokens, topk = idx.shape
    size = table_size(tokens, topk)
    if out is None:
        buf = np.empty(size, dtype=np.uint8)
    else:
        buf = _bytes_of(out)
        if buf.size < size or not buf.flags.writeable:
            raise BadInput(
                f"the routing table needs {size} writable bytes, the buffer has {buf.size}"
                + ("" if buf.flags.writeable else " read-only")
            )
        buf = buf[:size]
    pack_into(idx, w, n_experts, ffi.from_buffer(buf), size)
    return buf


def pack_into(idx: np.ndarray, w: np.ndarray, n_experts: int, out: Any, size: int) -> None:
    """dp_routing_pack of arrays already in its form (C-contiguous int32 or int64 indices
    and float32 weights, ``[tokens, topk]`` within the maximums: what :func:`pack` makes of
    any routing, and what a gate returns) into ``out``, a cffi pointer to ``size`` bytes
    (:func:`table_size`). A routed submit on its cached plan calls this alone."""
    tokens, topk = idx.shape
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_pack(
        ffi.from_buffer(idx), idx.itemsize, ffi.from_buffer(w), tokens, topk, n_experts,
        out, size, why, _WHY,
    )  # fmt: skip
    if rc:
        raise _refused(rc, why, "routing")


def check(table: Any, tokens: int, n_experts: int) -> None:
    """Raise :class:`RoutingRefused` unless ``table`` is a host routing table for a forward of
    ``tokens`` rows on a layer of ``n_experts``: dp_routing_check, the dataplane's rule."""
    buf = _bytes_of(table)
    _fits_u32("tokens", tokens)
    _fits_u32("n_experts", n_experts)
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_check(ffi.from_buffer(buf), buf.size, tokens, n_experts, why, _WHY)
    if rc:
        raise _refused(rc, why, "routing table")


def unpack(table: Any, tokens: int, n_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indices int32, weights float32)``, ``[tokens, topk]`` each, of a host routing table,
    as the dataplane reads one: copied out of ``table`` once (another process may still
    write it), then the copy checked and read. Each token's choices come in the table's
    order: by expert id, -1 (no expert) last."""
    buf = _bytes_of(table)
    head = buf[: HEADER_DTYPE.itemsize].copy()
    topk = int(head.view(HEADER_DTYPE)["topk"][0]) if head.size == HEADER_DTYPE.itemsize else 0
    size = table_size(tokens, topk)
    copy = buf[:size].copy()
    check(copy, tokens, n_experts)
    topk = int(copy[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)["topk"][0])
    entries = copy[HEADER_DTYPE.itemsize :].view(ENTRY_DTYPE).reshape(tokens, topk)
    return entries["expert"].astype(np.int32), entries["weight"].copy()


def placement(ducks_of: Sequence[Sequence[int]]) -> Any:
    """The C placement (``struct dp_routing_placement *``) of ``ducks_of[e]``, the ducks
    holding expert ``e`` (one, or several replicas), checked by the dataplane's rule."""
    n = len(ducks_of)
    if not 1 <= n <= MAX_EXPERTS:
        raise BadInput(f"a placement places 1..{MAX_EXPERTS} experts, got {n}")
    p = ffi.new("struct dp_routing_placement *")
    p.n_experts = n
    replicas = np.frombuffer(ffi.buffer(p.replicas), dtype=np.uint8)
    ducks = np.frombuffer(ffi.buffer(p.ducks), dtype=np.uint16).reshape(MAX_EXPERTS, MAX_REPLICAS)
    for e, held in enumerate(ducks_of):  # once per layer load, not per forward
        held = list(held)
        if not 1 <= len(held) <= MAX_REPLICAS:
            raise BadInput(f"expert {e} is placed on {len(held)} ducks; give it 1..{MAX_REPLICAS}")
        if any(not 0 <= d < MAX_DUCKS for d in held):
            raise BadInput(f"expert {e} is placed on ducks {held}; ducks are 0..{MAX_DUCKS - 1}")
        replicas[e] = len(held)
        ducks[e, : len(held)] = held
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_placement_check(p, why, _WHY)
    if rc:
        raise _refused(rc, why, "placement")
    return p


def _duck_set(ducks: Iterable[int] | None) -> Any:
    if ducks is None:
        return ffi.NULL
    bits = ffi.new(f"uint64_t[{MAX_DUCKS // 64}]")
    for d in ducks:
        if not 0 <= d < MAX_DUCKS:
            raise BadInput(f"duck {d} is outside 0..{MAX_DUCKS - 1}")
        bits[d >> 6] |= 1 << (d & 63)
    return bits


def bank_slots(place: Any) -> tuple[Any, np.ndarray]:
    """Each placed expert's slot in its duck's bank (dp_routing_bank_slots: index
    ``e * MAX_REPLICAS + r``), for :func:`split`, and each duck's count of experts."""
    slots = ffi.new(f"uint16_t[{MAX_EXPERTS * MAX_REPLICAS}]")
    per_duck = ffi.new(f"uint16_t[{MAX_DUCKS}]")
    lib.dp_routing_bank_slots(place, slots, per_duck)
    return slots, np.frombuffer(ffi.buffer(per_duck), dtype=np.uint16).copy()


def split(
    table: Any,
    place: Any,
    ducks: Iterable[int] | None = None,
    *,
    slots: Any = None,
    shared: bool = False,
) -> tuple[np.ndarray, frozenset[int]]:
    """The wire table of a checked host table by a :func:`placement` for the ducks in
    ``ducks`` (one NIC's; None: every duck), by dp_routing_split, and the ducks that got a
    section. An empty table and set when none of ``ducks`` is routed (that NIC sends
    nothing), unless ``shared`` (the layer has a shared expert: a table that may have no
    section, flag SHARED). With ``slots`` (:func:`bank_slots`) entries name bank slots."""
    buf = _bytes_of(table)
    entries = 0
    if buf.size >= HEADER_DTYPE.itemsize:  # dp_routing_split refuses more than the maximums
        head = buf[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
        entries = min(int(head["tokens"][0]) * int(head["topk"][0]), MAX_TOKENS * MAX_TOPK)
    cap = _WH + _WE * (min(entries, MAX_DUCKS) + entries)  # a section per entry at most
    out = np.empty(cap, dtype=np.uint8)
    size = ffi.new("uint64_t *")
    targets = ffi.new(f"uint64_t[{MAX_DUCKS // 64}]")
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_split(
        ffi.from_buffer(buf),
        buf.size,
        place,
        ffi.NULL if slots is None else slots,
        schema.RoutingWireFlag.SHARED if shared else 0,
        _duck_set(ducks),
        ffi.from_buffer(out),
        cap,
        size,
        targets,
        why,
        _WHY,
    )
    if rc:
        raise _refused(rc, why, "routing split")
    hit = frozenset(d for d in range(MAX_DUCKS) if targets[d >> 6] >> (d & 63) & 1)
    return out[: size[0]], hit


def check_wire(wire: Any, rows: int, n_experts: int) -> None:
    """Raise :class:`RoutingRefused` unless ``wire`` is a wire routing table for an
    activation of ``rows`` rows on a layer of ``n_experts``: dp_routing_wire_check."""
    buf = _bytes_of(wire)
    _fits_u32("rows", rows)
    _fits_u32("n_experts", n_experts)
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_wire_check(ffi.from_buffer(buf), buf.size, rows, n_experts, why, _WHY)
    if rc:
        raise _refused(rc, why, "wire routing table")


class Section(NamedTuple):
    """One duck's entries of a wire table: entry i passes row ``row[i]`` through expert
    ``expert[i]`` and scales it by ``weight[i]``; the duck's reply holds ``n_rows`` rows,
    the distinct ``row`` ascending, each the sum of its entries."""

    n_rows: int
    row: np.ndarray  # uint16
    expert: np.ndarray  # uint16
    weight: np.ndarray  # float32


def sections(wire: Any, rows: int, n_experts: int) -> dict[int, Section]:
    """Every duck's section of a wire table, checked first (copies, by duck id)."""
    buf = _bytes_of(wire).copy()
    check_wire(buf, rows, n_experts)
    h = buf[:_WH].view(WIRE_HEADER_DTYPE)
    n_ducks, n_entries = int(h["n_ducks"][0]), int(h["entries"][0])
    first = _WH + _WD * n_ducks
    directory = buf[_WH:first].view(WIRE_DUCK_DTYPE)
    entries = buf[first : first + _WE * n_entries].view(WIRE_ENTRY_DTYPE)
    ends = np.cumsum(directory["n_entries"])
    out = {}
    for d, n_rows, lo, hi in zip(
        directory["duck"], directory["n_rows"], ends - directory["n_entries"], ends, strict=True
    ):
        e = entries[lo:hi]
        out[int(d)] = Section(int(n_rows), e["row"].copy(), e["expert"].copy(), e["weight"].copy())
    return out


def unicast(wire: Any, duck: int) -> tuple[np.ndarray, np.ndarray]:
    """Duck ``duck``'s section of a checked wire table as a table of its own, rows renumbered
    from 0 (dp_routing_wire_unicast), and the original row of each new row."""
    buf = _bytes_of(wire)
    if not 0 <= duck < MAX_DUCKS:
        raise BadInput(f"duck {duck} is outside 0..{MAX_DUCKS - 1}")
    out = np.empty(buf.size + 8, dtype=np.uint8)  # one section is never bigger than all
    row_map = np.empty(MAX_TOKENS, dtype=np.uint16)
    size = ffi.new("uint64_t *")
    why = ffi.new(f"char[{_WHY}]")
    rc = lib.dp_routing_wire_unicast(
        ffi.from_buffer(buf),
        buf.size,
        duck,
        ffi.from_buffer(out),
        out.size,
        ffi.from_buffer("uint16_t[]", row_map),
        row_map.size,
        size,
        why,
        _WHY,
    )
    if rc:
        raise _refused(rc, why, "unicast routing table")
    table = out[: size[0]]
    rows = int(table[:_WH].view(WIRE_HEADER_DTYPE)["rows"][0])
    return table, row_map[:rows].copy()
