"""The mock dataplane's mixture-of-experts layers: load checks, routed descriptors, compute.

What the C dataplane does with a MOE layer (docs/protocols.md, LoadWeights; the MoE
design), done in numpy on the banks the client sent, so that a wrong bank (an expert's
columns in the wrong place) gives a wrong result here as it would on real ducks:

- ``plan_of``: the LoadWeights refusals (placement against the layer's ducks, bank
  widths, shared columns on the ducks of shared_ducks and no other, no bias) and the
  placement with each duck's bank slots, by the C rule itself (dp_load_moe_plan through cffi);
- ``check_desc`` and ``read_routing``: a descriptor's ROUTED flag against the layer's
  kind, its mode bits and target set, then the host routing table copied out of the
  slot once (its header first, topk bounded by MAX_TOPK) and checked, the copy and
  never the slot, with dp_routing_check (no bound on the rows beyond any forward's:
  the C dataplane sends them from the slot in place, no staging area);
- ``route`` and ``duck_rows``: each (token, expert) pair's duck by dp_routing_duck_of's
  rule (replica ``t % replicas[e]``) over the expert's replicas that are not known lost
  (``live[t % nlive]``, dp_routing_live: with none lost, the placement as loaded; an
  expert, or the shared expert, with no live duck fails the forward at once,
  ``NoLiveReplica``, in the C dispatcher's words), and what one duck computes from its bank:
  ``y[t] += w * expert_slot(x[t])`` for its entries, plus its shared-expert columns for
  every row when it is in the shared expert's set, in float32; the targets are the routed
  ducks and that set;
- ``send_mode``: broadcast or unicast by the design's byte rule, for a NIC without a
  broadcast address (the mock has one NIC and no network, like loopback): a broadcast
  costs one copy of table and activation per target.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._abi import check, ffi, lib, rules
from ..client import routing
from ..client.models import silu
from ..errors import DuckpipeError
from ..schema import control as ctl
from ..schema.abi import DescFlag
from ..schema.routing import MAX_REPLICAS, MAX_TOPK

__all__ = [
    "MoePlan",
    "NoLiveReplica",
    "Routed",
    "copy_routing",
    "duck_rows",
    "plan_of",
    "read_routing",
    "send_mode",
]

ROUTED = int(DescFlag.ROUTED)
MODE_BITS = int(DescFlag.MOE_BROADCAST | DescFlag.MOE_UNICAST)
ALIGN = 64  # the table's offset in the slot: the activation's bytes rounded up to this
_HEADER = routing.HEADER_DTYPE.itemsize
_WIRE_HEADER = 16  # dp_routing_wire_header
_WIRE_ITEM = 8  # a directory entry or a wire entry
MSG_LEN = 160  # a C context's message (DP_MSG_LEN), its NUL included


class NoLiveReplica(Exception):
    """A routed forward needs an expert (or the shared expert) whose every duck is known
    lost: it completes DUCK_LOST at once, with this message (the C dispatcher's)."""


@dataclasses.dataclass(eq=False)
class MoePlan:
    """A MOE layer as the dataplane keeps it: placement, bank slots, shared columns."""

    layer: int
    n_experts: int
    expert_ffn: int
    has_shared: bool
    shared_ducks: frozenset[int]  # the shared expert's ducks, every set's
    ducks: tuple[int, ...]
    ducks_of: tuple[tuple[int, ...], ...]  # expert e -> its replicas' ducks
    bank_slot: dict[tuple[int, int], int]  # (expert, duck) -> the expert's slot in the bank
    n_local: dict[int, int]  # duck -> routed experts in its bank
    placement: object  # struct dp_routing_placement *, checked: state's
    state: object  # struct dp_layer_moe * (dp_load_moe_plan's), kept alive here
    # the shared expert's sets (its replicas, LoadWeights.shared_sets): a forward sends
    # every row to each duck of one of them; () without a shared expert
    shared_sets: tuple[frozenset[int], ...] = ()

    def experts_on(self, duck: int) -> list[int]:
        return [e for e, held in enumerate(self.ducks_of) if duck in held]

    def listing(self, shard_sizes) -> dict[str, Any]:
        """The LayerInfo fields of the placement, as the C dataplane lists them
        (dp_layer_moe_list): a shared-expert duck's bank is wider than its experts."""
        return {
            "expert_ffn": self.expert_ffn,
            "expert_replicas": [len(held) for held in self.ducks_of],
            "expert_ducks": [d for held in self.ducks_of for d in held],
            # set by set, each in the layer's order (dp_layer_moe_list)
            "shared_ducks": [
                d
                for group in (self.shared_sets if len(self.shared_sets) > 1 else [None])
                for d, cols in zip(self.ducks, shard_sizes, strict=True)
                if (d in group if group is not None else cols > self.n_local[d] * self.expert_ffn)
            ],
            "shared_sets": [len(x) for x in self.shared_sets] if len(self.shared_sets) > 1 else [],
        }

    def describe(self, duck: int) -> str:
        """'duck 5 (experts 40 41)', as the C dataplane names a duck that did not answer."""
        held = self.experts_on(duck)
        if not held:
            return f"duck {duck} (shared expert only)"
        shown = " ".join(str(e) for e in held[:16])
        return f"duck {duck} (experts {shown}{' ...' if len(held) > 16 else ''})"


def plan_of(msg: ctl.LoadWeights, req: Any) -> MoePlan | None:
    """The MoE plan of a LoadWeights (None for a dense kind), by the C dataplane's own
    dp_load_moe_plan on its request ``req`` (``rules.load_request``), or DuckpipeError
    with the reason it is refused."""
    moe, refused = rules.moe_plan(req)
    if refused is not None:
        raise DuckpipeError(refused.message)
    if moe is None:
        return None
    pl = moe.pl
    ducks_of = tuple(
        tuple(int(pl.ducks[e * MAX_REPLICAS + r]) for r in range(pl.replicas[e]))
        for e in range(pl.n_experts)
    )
    bank_slot = {
        (e, d): int(moe.slots[e * MAX_REPLICAS + r])
        for e, held in enumerate(ducks_of)
        for r, d in enumerate(held)
    }
    return MoePlan(
        layer=msg.layer,
        n_experts=int(pl.n_experts),
        expert_ffn=int(moe.expert_ffn),
        has_shared=bool(moe.has_shared),
        shared_ducks=frozenset(
            d for d in range(len(moe.shared_ducks) * 64) if moe.shared_ducks[d >> 6] >> (d & 63) & 1
        ),
        ducks=tuple(msg.ducks),
        ducks_of=ducks_of,
        bank_slot=bank_slot,
        n_local={d: int(moe.experts_on[d]) for d in msg.ducks},
        placement=ffi.addressof(moe, "pl"),
        state=moe,
        shared_sets=tuple(
            frozenset(d for d in range(256) if moe.shared_set[s * 4 + (d >> 6)] >> (d & 63) & 1)
            for s in range(int(moe.n_shared_sets))
        ),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Routed:
    """A routed forward's checked routing: indices, weights [tokens, topk], the duck of
    each (token, choice), and the ducks to ask."""

    indices: np.ndarray  # int32
    weights: np.ndarray  # float32
    duck: np.ndarray  # int32, dp_routing_duck_of of each pair (over the live replicas)
    targets: list[int]  # ascending
    rerouted: int = 0  # pairs whose t % r duck was known lost, sent to a live one instead
    shared: frozenset[int] = frozenset()  # the shared set it uses: every row to each


def _choose_shared(
    plan: MoePlan, lost: frozenset[int], forward_id: int, restarted: frozenset[int] = frozenset()
) -> frozenset[int]:
    """The C dispatcher's choose_shared_set: of the shared sets with no duck lost, the
    (forward id mod their count)-th; NoLiveReplica, in its words, when none is whole."""
    if not plan.has_shared:
        return frozenset()
    live = [s for s in plan.shared_sets if not s & lost]
    if live:
        return live[forward_id % len(live)]
    gone = sorted(plan.shared_ducks & lost)
    shown = "".join(f" {d}" for d in gone)
    many = len(gone) > 1
    if set(gone) & restarted:  # said NO_LAYER: a repair, not time, brings it back
        until = f"repair it, client.repair({plan.layer})"
    else:
        until = "a set is" if len(plan.shared_sets) > 1 else "they are" if many else "it is"
        until = f"no forward on this layer completes until {until} back"
    if len(plan.shared_sets) > 1:
        why = (
            f"layer {plan.layer}: the shared expert's ducks{shown} are lost, a duck of each "
            f"of its {len(plan.shared_sets)} sets: {until}"
        )
    else:
        why = (
            f"layer {plan.layer}: the shared expert's duck{'s' if many else ''}{shown} "
            f"{'are' if many else 'is'} lost, and with one shared-expert set there is no "
            f"replica: {until}"
        )
    raise NoLiveReplica(why[: MSG_LEN - 1])


def _no_live_message(plan: MoePlan, dead: list[int], restarted: frozenset[int]) -> str:
    """The C dispatcher's no_live_replica: the experts without a live duck, then the lost
    ducks that held them, each as a timeout names it."""
    shown = " ".join(str(e) for e in dead[:8]) + (" ..." if len(dead) > 8 else "")
    ducks = sorted({d for e in dead for d in plan.ducks_of[e]})
    many = len(dead) > 1
    head = (
        f"layer {plan.layer}: expert{'s' if many else ''} {shown} "
        f"{'have' if many else 'has'} no live replica; lost:"
    )
    hint = f" (restarted: repair it, client.repair({plan.layer}))"
    hint = hint if set(ducks) & restarted else ""
    listed = (head + " " + "; ".join(plan.describe(d) for d in ducks))[: MSG_LEN - 1 - len(hint)]
    return listed + hint


def copy_routing(layout, limits, desc_plan, slot: np.ndarray, plan: MoePlan) -> np.ndarray:
    """The host routing table of a forward that passed dp_desc_check, out of its activation
    slot (bytes the client may still be writing), by the C dispatcher's own
    dp_desc_routing_copy: copied once, bounded, checked on the copy. DuckpipeError with
    its words when refused."""
    cap = routing.table_size(int(desc_plan.rows), MAX_TOPK)
    copy = np.empty(cap, dtype=np.uint8)
    # the C dataplane's copy holds max_forward_bytes at most (dp_fwd_pool_init)
    if limits.max_forward_bytes:
        cap = min(cap, int(limits.max_forward_bytes))
    size = ffi.new("uint64_t *")
    why = ffi.new("char[]", lib.DP_DESC_WHY_LEN)
    rc = lib.dp_desc_routing_copy(
        layout, limits, desc_plan, ffi.from_buffer(slot), plan.n_experts,
        ffi.from_buffer(copy), cap, size, why, len(why),
    )  # fmt: skip
    check(rc, why)
    return copy[: size[0]]


def read_routing(
    copy: np.ndarray,
    tokens: int,
    plan: MoePlan,
    lost: frozenset[int] = frozenset(),
    forward_id: int = 0,
    restarted: frozenset[int] = frozenset(),
) -> Routed:
    """A checked table's routing: indices, weights, each (token, choice)'s duck, targets.
    ``lost``: the layer's ducks known lost (``restarted``: those of them that said
    NO_LAYER, which the messages tell to repair); each pair goes to live[t % nlive] of its
    expert's replicas, and every row to a whole shared set (NoLiveReplica when an expert
    it names, or the shared expert, has no live one)."""
    lost = lost & frozenset(plan.ducks)
    shared = _choose_shared(plan, lost, forward_id, restarted)
    topk = int(copy[:_HEADER].view(routing.HEADER_DTYPE)["topk"][0])
    entries = copy[_HEADER:].view(routing.ENTRY_DTYPE).reshape(tokens, topk)
    indices = entries["expert"].astype(np.int32)  # ROUTING_NO_EXPERT reads as -1
    weights = entries["weight"].copy()
    duck = np.full_like(indices, -1)  # -1: no expert, no duck (dp_routing_split skips it)
    rows = np.arange(tokens)
    named = np.unique(indices[indices >= 0]).tolist()
    live = _live_replicas(plan, lost, named)
    dead = [e for e in named if not live[e]]
    if dead:
        raise NoLiveReplica(_no_live_message(plan, dead, restarted))
    rerouted = 0
    for e in named:
        t, k = np.nonzero(indices == e)
        held = plan.ducks_of[e]
        duck[t, k] = np.asarray(live[e], np.int32)[rows[t] % len(live[e])]
        if len(live[e]) < len(held):  # as loaded, t % r: those on a lost duck moved
            first = np.asarray(held, np.int32)[rows[t] % len(held)]
            rerouted += int(np.isin(first, list(lost)).sum())
    targets = set(np.unique(duck[duck >= 0]).tolist())
    targets.update(shared)  # each computes its shared columns for every row
    return Routed(indices, weights, duck, sorted(targets), rerouted, shared)


def _live_replicas(plan: MoePlan, lost: frozenset[int], experts: list[int]) -> dict:
    """Each of ``experts``' replicas that are not ``lost``, in placement order: the C
    dispatcher's dp_routing_live (its rule, replica t % r, then picks live[t % nlive])."""
    if not lost:
        return {e: plan.ducks_of[e] for e in experts}
    bits = ffi.new("uint64_t[4]")
    for d in lost:
        bits[d >> 6] |= 1 << (d & 63)
    out = ffi.new("struct dp_routing_placement *")
    lib.dp_routing_live(plan.placement, ffi.NULL, bits, out, ffi.NULL)
    return {
        e: tuple(int(out.ducks[e * MAX_REPLICAS + r]) for r in range(out.replicas[e]))
        for e in experts
    }


def failover(
    plan: MoePlan,
    routed: Routed,
    silent: frozenset[int],
    lost: frozenset[int],
    shard_sizes: tuple[int, ...] | list[int] = (),
) -> tuple[Routed, list[int], list[int]]:
    """The C worker's dp_moe_failover over the forward's silent targets: each pair on a
    silent duck goes to the next replica of its expert after that duck (cyclically) that
    is neither known lost nor silent; a duck of the forward's shared set also has its
    shared columns computed by the duck of another set holding the same ones
    (dp_load_moe_shared_stand_in, the C rule itself; ``shard_sizes``: the layer's bank
    widths in its duck order). Returns the routing the ducks then compute, the silent
    ducks failed over, and those with a pair no replica could take, or shared columns no
    stand-in could: the forward then waits for its deadline, as the C's does, and times
    out naming them."""
    duck = routed.duck.copy()
    shared = set(routed.shared)
    moved: list[int] = []
    stuck: list[int] = []
    for d in routed.targets:
        if d not in silent:
            continue
        ok = True
        if d in routed.shared:
            to = _shared_stand_in(plan, shard_sizes, d, silent | lost | set(stuck))
            if to is None:
                stuck.append(d)
                continue
            shared = (shared - {d}) | {to}
        for t, k in np.argwhere(routed.duck == d):
            held = plan.ducks_of[int(routed.indices[t, k])]
            i = held.index(d)
            nxt = [held[(i + j) % len(held)] for j in range(1, len(held))]
            to = next((x for x in nxt if x not in silent and x not in lost), None)
            if to is None:
                ok = False
                break
            duck[t, k] = to
        (moved if ok else stuck).append(d)
    if stuck:
        return routed, moved, stuck
    return dataclasses.replace(routed, duck=duck, shared=frozenset(shared)), moved, stuck


def _shared_stand_in(
    plan: MoePlan, shard_sizes, silent: int, gone: set[int] | frozenset[int]
) -> int | None:
    """The duck that computes ``silent``'s shared columns in its stead (the C rule,
    dp_load_moe_shared_stand_in), among the layer's ducks not ``gone``; None if none."""
    n = len(plan.ducks)
    if len(shard_sizes) != n or silent not in plan.ducks:
        return None
    ducks = ffi.new("uint16_t[]", list(plan.ducks))
    shard = ffi.new("uint32_t[]", [int(x) for x in shard_sizes])
    can = ffi.new("uint64_t[4]")
    for d in plan.ducks:
        if d not in gone:
            can[d >> 6] |= 1 << (d & 63)
    to = lib.dp_load_moe_shared_stand_in(plan.state, ducks, shard, n, plan.ducks.index(silent), can)
    return None if to >= lib.DP_MAX_DUCKS else int(to)


def duck_rows(plan: MoePlan, routed: Routed, duck: int) -> tuple[int, int]:
    """(n_rows, n_entries) of ``duck``'s reply: the rows it computed (every row on a duck
    of the shared set, else its distinct routed tokens), and its (token, expert) pairs."""
    mine = routed.duck == duck
    shared = duck in routed.shared
    rows = mine.shape[0] if shared else int(np.count_nonzero(mine.any(axis=1)))
    return rows, int(np.count_nonzero(mine))


def duck_partial(
    plan: MoePlan, routed: Routed, duck: int, bank: list[np.ndarray], x: np.ndarray
) -> np.ndarray:
    """What ``duck`` adds to the result, float32 [tokens, hidden], from its bank (float32
    w_gate, w_up, w_down): its entries' weighted experts, and its shared columns."""
    w_gate, w_up, w_down = bank
    e_ffn = plan.expert_ffn
    xf = x.astype(np.float32, copy=False)
    out = np.zeros(xf.shape, np.float32)
    mine = routed.duck == duck
    for e in np.unique(routed.indices[mine]):
        t, k = np.nonzero(mine & (routed.indices == e))
        s = plan.bank_slot[int(e), duck]
        cols = slice(s * e_ffn, (s + 1) * e_ffn)
        xr = xf[t]
        h = silu(xr @ w_gate[:, cols]) * (xr @ w_up[:, cols])
        out[t] += routed.weights[t, k, None] * (h @ w_down[cols, :])
    if duck in routed.shared:
        cols = slice(plan.n_local[duck] * e_ffn, w_gate.shape[1])
        out += (silu(xf @ w_gate[:, cols]) * (xf @ w_up[:, cols])) @ w_down[cols, :]
    return out


def send_mode(
    flags: int, plan: MoePlan, routed: Routed, nbytes: int, row_bytes: int
) -> tuple[str, int]:
    """('broadcast' | 'unicast', bytes of the first sends) of the forward's one NIC part,
    by the design's rule for a NIC without a broadcast address: a broadcast sends the
    wire table and every row to each target; a unicast sends each routed duck its own
    section (renumbered) and rows, and each duck of the shared set its section (if any)
    and every row. Auto takes the unicast when it is smaller; a mode bit forces one
    (dp_moe_choose). No size decides it: the C dataplane sends both from the slot in
    place."""
    tokens = routed.indices.shape[0]
    sections = [(d, *duck_rows(plan, routed, d)) for d in routed.targets]
    routed_ducks = [(d, r, n) for d, r, n in sections if n]
    entries = sum(n for _, _, n in routed_ducks)
    wire = _WIRE_HEADER + _WIRE_ITEM * (len(routed_ducks) + entries)
    broadcast = (wire + nbytes) * len(routed.targets)
    # a shared-set duck needs every row: its unicast carries them all, and without a
    # section it gets a bare header (dp_moe.c shared_unicast_table); the others their rows
    unicast = sum(
        _WIRE_HEADER + (_WIRE_ITEM * (1 + n) if n else 0) + tokens * row_bytes
        if d in routed.shared
        else _WIRE_HEADER + _WIRE_ITEM * (1 + n) + r * row_bytes
        for d, r, n in sections
    )
    if len(plan.shared_sets) > 1:  # one table to all: every set would compute the shared
        return "unicast", unicast
    if flags & DescFlag.MOE_BROADCAST:
        return "broadcast", broadcast
    if flags & DescFlag.MOE_UNICAST:
        return "unicast", unicast
    if unicast < broadcast:
        return "unicast", unicast
    return "broadcast", broadcast
