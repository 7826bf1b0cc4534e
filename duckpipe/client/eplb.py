"""Expert placement from observed load: DeepSeek's expert-parallelism load balancer
(EPLB) in numpy, and :func:`plan_placement`, which turns its plan into a duckpipe
placement (``client.load_weights(layer, moe, placement=plan.placement)``).

Source: https://github.com/deepseek-ai/EPLB, ``eplb.py`` at commit
d52c72d5b2f2fb4c41afbf8eb21366820239913d (MIT licence, DeepSeek). :func:`rebalance_experts`,
:func:`balanced_packing` and :func:`replicate_experts` follow that file step by step,
with numpy instead of torch (``tests/client/test_eplb.py`` against outputs of the
published code, ``tests/client/data/eplb_cases.json``, made by
``tools/make_eplb_cases.py``). Where ``balanced_packing`` sorts equal weights, torch's
sort (not stable above 16 items) leaves their order to its implementation; here ties
keep ascending index order. Equal weights are interchangeable for the greedy packing, so
``logcnt`` and every GPU's load are the same as the published code's; ``phy2log`` is the
same where no two different experts tie, and ``log2phy`` then holds the same slots per
expert, its replica ranks (two replicas of one expert always tie) in either order. (Two
expert *groups* of equal load would let torch pick which goes to which node; the stored
cases have none.)

The algorithm (the published README's words, shortened):

1. *Hierarchical* (``nodes`` divides ``groups``): pack the expert groups onto nodes so the
   nodes' loads even out (groups stay whole: DeepSeek-V3 routes each token to a few
   groups, so its rows then reach few nodes); replicate the heaviest experts inside each
   node (:func:`replicate_experts`: each redundant slot goes to the expert whose load per
   replica is highest); pack the replicas onto the node's GPUs
   (:func:`balanced_packing`: heaviest first, each to the lightest GPU with a free slot,
   every GPU the same number of slots).
2. *Global* (otherwise): the same with one group and one node.

Loads are float32 as in the published code. Integer token counts sum exactly up to
2**24 per expert group; beyond that, or with fractional loads, numpy and torch may add
a group's loads in different orders and round differently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BadInput
from ..schema.abi import MAX_DUCKS
from ..schema.routing import MAX_EXPERTS, MAX_REPLICAS

__all__ = [
    "Plan",
    "balanced_packing",
    "plan_placement",
    "rebalance_experts",
    "replicate_experts",
    "rows_per_duck",
]

EPLB_COMMIT = "d52c72d5b2f2fb4c41afbf8eb21366820239913d"


def balanced_packing(
    weight: np.ndarray, num_packs: int, apart: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pack the ``n`` items of each row of ``weight`` ([X, n]) into ``num_packs`` packs of
    exactly ``n / num_packs`` items each, as evenly by weight as the greedy rule gets:
    heaviest first, each into the lightest pack that has room (the first such on ties).
    Returns (pack_index, rank_in_pack), both [X, n]: the pack of each item and its place
    in the pack (the order it arrived in).

    ``apart`` ([X, n], not in the published code; None there): items of equal ``apart``
    go to different packs where a pack with room allows it (duckpipe: replicas of one
    expert on distinct ducks). Where the published rule never puts two such items
    together the result is the same."""
    weight = np.asarray(weight, dtype=np.float32)
    num_layers, n = weight.shape
    if num_packs < 1 or n % num_packs:
        raise BadInput(f"{n} items do not pack evenly into {num_packs} packs")
    per_pack = n // num_packs
    if per_pack == 1:
        return np.broadcast_to(np.arange(n), weight.shape).copy(), np.zeros(weight.shape, np.int64)
    # descending; ties by ascending index (torch's unstable sort: see the module's doc)
    order = np.argsort(-weight, axis=-1, kind="stable")
    pack_index = np.full(weight.shape, -1, dtype=np.int64)
    rank_in_pack = np.full(weight.shape, -1, dtype=np.int64)
    for i in range(num_layers):
        loads = np.zeros(num_packs, dtype=np.float32)  # float32 sums, as torch adds them
        items = np.zeros(num_packs, dtype=np.int64)
        held: list[set[int]] = [set() for _ in range(num_packs)]
        for g in order[i]:
            room = np.flatnonzero(items < per_pack)
            if apart is not None:
                key = int(apart[i, g])
                free = [q for q in room if key not in held[q]]
                room = np.array(free) if free else room  # else: _separate_replicas
            p = room[np.argmin(loads[room])]  # argmin: the first lightest, as min() takes
            if apart is not None:
                held[p].add(int(apart[i, g]))
            pack_index[i, g] = p
            rank_in_pack[i, g] = items[p]
            loads[p] += weight[i, g]
            items[p] += 1
    return pack_index, rank_in_pack


def replicate_experts(
    weight: np.ndarray, num_phy: int, max_replicas: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give ``weight``'s ``num_log`` experts (each row [X, num_log]) ``num_phy`` replicas in
    all, so that the largest load per replica is as small as the greedy rule gets: each
    extra replica goes to the expert with the highest load per replica (the first on
    ties). ``max_replicas`` (not in the published code; None there) leaves an expert
    that has that many out of the choice. Returns (phy2log [X, num_phy]: the expert of
    each replica, rank [X, num_phy]: its replica number, logcnt [X, num_log])."""
    weight = np.asarray(weight, dtype=np.float32)
    n, num_log = weight.shape
    if num_phy < num_log:
        raise BadInput(f"{num_log} experts need at least {num_log} replicas, got {num_phy}")
    phy2log = np.tile(np.arange(num_phy, dtype=np.int64), (n, 1))
    rank = np.zeros((n, num_phy), dtype=np.int64)
    logcnt = np.ones((n, num_log), dtype=np.int64)
    rows = np.arange(n)
    for i in range(num_log, num_phy):
        per_replica = weight / logcnt.astype(np.float32)  # torch divides in float32 too
        if max_replicas is not None:
            per_replica = np.where(logcnt >= max_replicas, -np.inf, per_replica)
        chosen = per_replica.argmax(axis=-1)
        phy2log[:, i] = chosen
        rank[:, i] = logcnt[rows, chosen]
        logcnt[rows, chosen] += 1
    return phy2log, rank, logcnt


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _hierarchical(
    weight: np.ndarray,
    num_physical: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    max_replicas: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rebalance_experts_hierarchical``: (phy2log, phyrank, logcnt)."""
    num_layers, num_log = weight.shape
    if num_log % num_groups:
        raise BadInput(f"{num_log} experts do not split into {num_groups} equal groups")
    if num_gpus % num_nodes:
        raise BadInput(f"{num_gpus} ducks do not split into {num_nodes} equal nodes")
    if num_physical % num_gpus:
        raise BadInput(f"{num_physical} replicas do not split evenly over {num_gpus} ducks")
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_physical // num_gpus

    # 1: groups onto nodes
    tokens_per_group = weight.reshape(num_layers, num_groups, group_size).sum(-1, dtype=np.float32)
    group_pack, group_rank = balanced_packing(tokens_per_group, num_nodes)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size)[..., None]
        + np.arange(group_size, dtype=np.int64)
    ).reshape(num_layers, num_log)
    mlog2log = _inverse(log2mlog)

    # 2: replicas inside each node; [num_layers * num_nodes, num_log // num_nodes]
    tokens_per_mlog = np.take_along_axis(weight, mlog2log, -1).reshape(-1, num_log // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate_experts(
        tokens_per_mlog, num_physical // num_nodes, max_replicas
    )

    # 3: replicas onto each node's GPUs
    tokens_per_phy = np.take_along_axis(tokens_per_mlog / mlogcnt.astype(np.float32), phy2mlog, -1)
    apart = None if max_replicas is None else phy2mlog  # duckpipe: replicas on distinct GPUs
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, num_gpus // num_nodes, apart)
    phy2pphy = pack_index * per_gpu + rank_in_pack
    pphy2phy = _inverse(phy2pphy)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, -1)
    node_base = np.arange(0, num_log, num_log // num_nodes, dtype=np.int64).reshape(1, -1, 1)
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1) + node_base).reshape(num_layers, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, -1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, -1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, -1)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(
    weight: Any,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    max_replicas: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EPLB's entry point, on numpy arrays: ``weight`` [layers, experts] is each expert's
    load; ``num_replicas`` physical experts in all (a multiple of ``num_gpus``); the
    hierarchical policy when ``num_nodes`` divides ``num_groups``, the global one
    otherwise. Returns (phy2log [layers, num_replicas]: the expert in each physical slot,
    GPU ``g`` holding slots ``g * num_replicas // num_gpus`` onwards; log2phy [layers,
    experts, max replicas]: each expert's slots by replica rank, -1 padded; logcnt
    [layers, experts]: replicas per expert). ``max_replicas`` is duckpipe's: None gives
    the published behaviour."""
    w = _loads_2d(weight)
    num_layers, num_log = w.shape
    if num_replicas < num_log:
        raise BadInput(
            f"{num_replicas} replicas for {num_log} experts: every expert needs one; give "
            f"at least {num_log}"
        )
    if num_gpus < 1 or num_nodes < 1 or num_groups < 1:
        raise BadInput("num_groups, num_nodes and num_gpus are at least 1")
    if num_groups % num_nodes == 0:
        phy2log, phyrank, logcnt = _hierarchical(
            w, num_replicas, num_groups, num_nodes, num_gpus, max_replicas
        )
    else:
        phy2log, phyrank, logcnt = _hierarchical(w, num_replicas, 1, 1, num_gpus, max_replicas)
    most = int(logcnt.max())
    log2phy = np.full((num_layers, num_log, most), -1, dtype=np.int64)
    flat = log2phy.reshape(num_layers, -1)
    np.put_along_axis(
        flat,
        phy2log * most + phyrank,
        np.broadcast_to(np.arange(num_replicas, dtype=np.int64), phy2log.shape),
        axis=1,
    )
    return phy2log, log2phy, logcnt


def _loads_2d(weight: Any) -> np.ndarray:
    try:
        w = np.asarray(weight)
    except (TypeError, ValueError) as e:
        raise BadInput(f"loads must be an array of numbers: {e}") from None
    if w.ndim != 2 or w.shape[1] < 1:
        raise BadInput(f"loads are [layers, experts], got shape {w.shape}")
    return _check_loads(w)


def _check_loads(w: np.ndarray) -> np.ndarray:
    if w.dtype == bool or not (
        np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating)
    ):
        raise BadInput(f"loads are numbers (token counts per expert), got dtype {w.dtype}")
    bad = np.flatnonzero(~np.isfinite(w.astype(np.float64)).ravel())
    if bad.size:
        raise BadInput(
            f"loads must be finite: expert {int(bad[0]) % w.shape[-1]} has {w.ravel()[bad[0]]}"
        )
    neg = np.flatnonzero(w.ravel() < 0)
    if neg.size:
        raise BadInput(
            f"loads are token counts, never negative: expert {int(neg[0]) % w.shape[-1]} has "
            f"{w.ravel()[neg[0]]}"
        )
    if w.astype(np.float64).sum() > np.finfo(np.float32).max:  # EPLB sums in float32
        raise BadInput("loads sum past float32's range: scale them down (only ratios matter)")
    return w.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A placement planned from load (:func:`plan_placement`).

    ``placement[e]``: the ducks of expert ``e``'s replicas, distinct, 1..8 of them: what
    ``client.load_weights(layer, moe, placement=...)`` takes. ``slots[i]``: the experts
    in ``ducks[i]``'s slots (EPLB's ``phy2log`` for that GPU, after duckpipe's fix-ups;
    -1 for a slot left empty). ``duck_load[i]``: the load ``ducks[i]`` is expected to
    carry, ``load[e] / replicas(e)`` summed over its experts (token ``t`` reaches expert
    ``e`` through replica ``t % replicas(e)``: an even share each)."""

    ducks: tuple[int, ...]
    placement: tuple[tuple[int, ...], ...]
    slots: np.ndarray
    duck_load: np.ndarray
    policy: str  # "hierarchical" (groups kept on nodes) or "global" (one node, or the fallback)
    separated: int  # replica pairs on one duck moved apart by a swap
    merged: int  # replica pairs on one duck made one (no swap was possible): empty slots

    @property
    def replicas(self) -> np.ndarray:
        """Replicas per expert."""
        return np.array([len(p) for p in self.placement], dtype=np.int64)

    @property
    def imbalance(self) -> float:
        """The expected max / mean duck load (1.0: even; 1.0 for no load at all)."""
        mean = float(self.duck_load.mean())
        return float(self.duck_load.max()) / mean if mean > 0 else 1.0


def plan_placement(
    load: Any,
    ducks: Sequence[int],
    *,
    redundant: int = 0,
    groups: int = 1,
    nodes: int = 1,
) -> Plan:
    """Place a MoE layer's experts on ``ducks`` so their loads even out, by DeepSeek's EPLB.

    ``load[e]``: expert ``e``'s load, e.g. the tokens routed to it over a recent window
    (numbers, finite, >= 0; only ratios matter). ``redundant``: extra replicas in all, on
    top of one per expert; the hottest experts get them. EPLB gives every duck the same
    number of slots, so ``len(load) + redundant`` must be a multiple of ``len(ducks)``
    (256 experts on 32 ducks: redundant 0, 32, 64, ...). ``groups``: expert groups
    (DeepSeek-V3: 8) and ``nodes``: sets of ducks (listed node after node in ``ducks``, e.g.
    by NIC); when ``nodes`` divides ``groups`` the hierarchical policy keeps each group
    on one node, otherwise the global one places freely.

    What duckpipe adds to the published algorithm, to make the plan loadable:

    - at most 8 replicas per expert (``MAX_REPLICAS``), and no more than a node has ducks:
      ``replicate_experts`` passes over an expert that has that many;
    - a duck never holds two replicas of one expert (a bank holds an expert once, and
      ``load_weights`` refuses a duck twice for one expert). EPLB's packing can put two
      replicas of one expert on one GPU (equal weights, the lightest GPU still lightest);
      here the packing passes over a duck that holds the expert while another duck with
      room does not (``balanced_packing``'s ``apart``), which changes nothing where the
      published packing never paired them. A pair that is left (the last free slots
      only on such ducks) is swapped apart with a slot of another duck of the same node
      (neither duck then holding an expert twice), the swap that leaves the heavier of
      the two ducks lightest (counted in ``separated``); where no such swap exists the
      two become one replica (the expert's tokens then split evenly over the ducks it is
      on; counted in ``merged``, the slot left empty).

    Returns a :class:`Plan`: ``plan.placement`` goes to ``load_weights(placement=...)``;
    ``plan.duck_load`` and ``plan.imbalance`` are what the load predicts. BadInput names
    what is wrong with the input.
    """
    w = _loads_1d(load)
    duck_list = _duck_list(ducks)
    n_experts, n_ducks = len(w), len(duck_list)
    for name, v in (("redundant", redundant), ("groups", groups), ("nodes", nodes)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise BadInput(f"{name} is an integer, got {v!r}")
    if redundant < 0:
        raise BadInput(
            f"redundant={redundant}: it counts extra replicas, 0 or more (fewer replicas than "
            f"experts would leave an expert on no duck)"
        )
    if groups < 1 or n_experts % groups:
        raise BadInput(f"groups={groups} must divide the {n_experts} experts into equal groups")
    if nodes < 1 or (groups % nodes == 0 and n_ducks % nodes):
        raise BadInput(f"nodes={nodes} must divide the {n_ducks} ducks into equal nodes")
    slots = n_experts + redundant
    if slots % n_ducks:
        fit = [k for k in range(redundant - n_ducks, redundant + n_ducks + 1)
               if k >= 0 and (n_experts + k) % n_ducks == 0]  # fmt: skip
        raise BadInput(
            f"{n_experts} experts + {redundant} redundant = {slots} slots do not split evenly "
            f"over {n_ducks} ducks (EPLB gives every duck as many slots): use redundant="
            + " or ".join(str(k) for k in fit)
        )
    hierarchical = groups % nodes == 0  # EPLB's rule; otherwise its global policy
    per_node = n_ducks // nodes if hierarchical else n_ducks
    cap = min(MAX_REPLICAS, per_node)
    experts_per_node = n_experts // nodes if hierarchical else n_experts
    slots_per_node = slots // nodes if hierarchical else slots
    if experts_per_node * cap < slots_per_node:
        raise BadInput(
            f"redundant={redundant} gives {slots_per_node} slots to {experts_per_node} experts"
            f"{' per node' if hierarchical else ''}, more than {cap} replicas each (an expert "
            f"has at most {MAX_REPLICAS} replicas, on distinct ducks of "
            f"{'its node' if hierarchical else 'the layer'}): use redundant <= "
            f"{(experts_per_node * cap - experts_per_node) * (nodes if hierarchical else 1)}"
        )
    phy2log, _, logcnt = rebalance_experts(w[None], slots, groups, nodes, n_ducks, max_replicas=cap)
    table = phy2log[0].reshape(n_ducks, slots // n_ducks).copy()
    share = w.astype(np.float64) / logcnt[0]
    separated, merged = _separate_replicas(table, share, per_node)
    placement = _placement_of(table, n_experts, duck_list)
    duck_load = np.zeros(n_ducks)
    for e, held in enumerate(placement):
        for d in held:
            duck_load[duck_list.index(d)] += w[e] / len(held)
    return Plan(
        ducks=tuple(duck_list),
        placement=placement,
        slots=table,
        duck_load=duck_load,
        policy="hierarchical" if hierarchical and nodes > 1 else "global",
        separated=separated,
        merged=merged,
    )


def _separate_replicas(table: np.ndarray, share: np.ndarray, per_node: int) -> tuple[int, int]:
    """Undo two replicas of one expert on one duck, in place in ``table`` [duck, slot]:
    swap the second with a slot of another duck of the same node such that neither duck
    then holds an expert twice, choosing the swap that leaves the heavier of the two
    ducks lightest (``share``: load per replica of each expert); if there is none, empty
    the slot (-1). Returns (swapped, emptied)."""
    swapped = emptied = 0
    n_ducks, per_duck = table.shape
    loads = share[np.maximum(table, 0)].sum(-1)
    for d in range(n_ducks):
        lo = d // per_node * per_node
        for j in range(per_duck):
            e = table[d, j]
            if e < 0 or e not in table[d, :j]:
                continue
            best = None
            for d2 in range(lo, lo + per_node):
                if d2 == d or e in table[d2]:
                    continue
                for j2 in range(per_duck):
                    b = table[d2, j2]
                    if b < 0 or b in table[d]:
                        continue
                    moved = share[b] - share[e]  # d gains it, d2 loses it
                    peak = max(loads[d] + moved, loads[d2] - moved)
                    if best is None or peak < best[0]:
                        best = (peak, d2, j2)
            if best is None:
                table[d, j] = -1
                loads[d] -= share[e]
                emptied += 1
            else:
                _, d2, j2 = best
                moved = share[table[d2, j2]] - share[e]
                table[d, j], table[d2, j2] = table[d2, j2], e
                loads[d] += moved
                loads[d2] -= moved
                swapped += 1
    return swapped, emptied


def _placement_of(
    table: np.ndarray, n_experts: int, ducks: list[int]
) -> tuple[tuple[int, ...], ...]:
    held: list[list[int]] = [[] for _ in range(n_experts)]
    for i, row in enumerate(table):
        for e in row:
            if e >= 0 and ducks[i] not in held[e]:
                held[e].append(ducks[i])
    return tuple(tuple(h) for h in held)


def _loads_1d(load: Any) -> np.ndarray:
    try:
        w = np.asarray(load)
    except (TypeError, ValueError) as e:
        raise BadInput(f"load must be an array of numbers, one per expert: {e}") from None
    if w.ndim != 1 or not 1 <= len(w) <= MAX_EXPERTS:
        raise BadInput(
            f"load has one number per expert (1..{MAX_EXPERTS} experts), got shape {w.shape}"
        )
    return _check_loads(w)


def _duck_list(ducks: Sequence[int]) -> list[int]:
    if isinstance(ducks, str | bytes) or not isinstance(ducks, Sequence | np.ndarray):
        raise BadInput(f"ducks is a sequence of duck ids, got {type(ducks).__name__}")
    out = []
    for d in ducks:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or not 0 <= d < MAX_DUCKS:
            raise BadInput(f"ducks are ids 0..{MAX_DUCKS - 1}, got {d!r}")
        out.append(int(d))
    if not out:
        raise BadInput("ducks is empty: place the experts on at least one duck")
    if len(set(out)) != len(out):
        raise BadInput(f"ducks {out} names a duck twice: give each duck once")
    return out


def rows_per_duck(
    indices: np.ndarray, placement: Sequence[Sequence[int]], ducks: Sequence[int]
) -> np.ndarray:
    """The rows each of ``ducks`` computes for a routing ``indices`` [tokens, topk] (-1:
    no expert) on ``placement`` (``placement[e]``: expert ``e``'s ducks), by the
    dataplane's rule: token ``t`` reaches expert ``e`` through replica ``t % replicas``.
    One row per (token, expert) pair, in ``ducks`` order."""
    idx = np.asarray(indices, dtype=np.int64)
    held = [[p] if isinstance(p, int | np.integer) else list(p) for p in placement]
    replicas = np.array([len(h) for h in held], dtype=np.int64)
    where = np.full((len(held), MAX_REPLICAS), -1, dtype=np.int64)
    column = {d: i for i, d in enumerate(ducks)}
    for e, h in enumerate(held):
        where[e, : len(h)] = [column[d] for d in h]
    tokens = np.arange(idx.shape[0])[:, None]
    routed = idx >= 0
    e = np.where(routed, idx, 0)
    duck = where[e, tokens % replicas[e]][routed]
    return np.bincount(duck, minlength=len(ducks))
