"""Weight loading: shard an MLP over ducks and stream the shards through slots.

The dataplane is told the plan (``LoadWeights``: kind, sizes, which duck holds
which rows), then every shard tensor is cut into slot-sized chunks, each one a
``WEIGHT_CHUNK`` descriptor on the client's submission ring, and a final
``WEIGHT_COMMIT`` makes the layer usable once every chunk has landed. Weights
thus travel through shared memory like activations, never over ZeroMQ.

A mixture of experts (``MoeMlp``) goes the same way as kind MOE: each duck's shard
is its *bank*, SwiGLU tensors whose columns are its routed experts' (ascending by
expert id, ``expert_ffn`` each), then its columns of the shared expert, which is cut
like a dense shard over the shared expert's set (``shared_ducks``: a token is sent to
its routed ducks and that set only). ``LoadWeights`` also carries the placement
(``expert_replicas``, ``expert_ducks``, ``shared_ducks``), and the client keeps it
(:class:`MoeLayer`) to check routings and to say which experts a lost duck held. A
client that did not load a (shared) MOE layer builds the same view from its LayerInfo
(:func:`moe_view`), which carries the placement too.

A duck that restarts loses its bank (it answers NO_LAYER; the dataplane lists it in
LayerInfo.lost). The client keeps a reference to each model it loaded (:class:`Loaded`),
so :func:`repair` cuts again only the banks of the ducks that lost the layer and streams
them the same way after a ``RepairLayer``; the commit puts them back.

``load_weights`` with ``placement=`` of a committed MoE layer this client loaded, with the
same model, *moves* it (:func:`move`): a ``MoveLayer`` names the new placement, and only
the banks of the ducks whose set of experts changed are cut and streamed; the commit
switches the layer to the new placement for every forward dispatched after it
(docs/architecture.md, "Moving a live layer").

FP8 weights (``SwiGluMlp.from_fp8``, duckpipe/client/fp8.py) go as ``weight_dtype``
F8E4M3: each shard tensor is its e4m3 bytes then its float32 scale grid (its blocks'
grids side by side for a bank); a dense layer and the shared expert are cut between
128-column blocks (``fp8.block_shard_sizes``) so every duck holds whole blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from ..errors import (
    BadInput,
    DataplaneFault,
    LayerFailed,
    NotPermitted,
    UnknownLayer,
    WaitTimeout,
)
from ..progress import Progress
from ..schema import control as ctl
from ..schema.abi import B_DOWN_TENSOR, DType, MlpKind, Op, Status
from ..schema.control import ErrorCode
from ..schema.routing import MAX_EXPERTS, MAX_REPLICAS
from . import fp8, routing
from .models import (
    GeluMlp,
    Mlp,
    SwiGluMlp,
    dtype_code,
    numpy_dtype,
    shard_bounds,
    shard_sizes,
)
from .moe import MoeMlp

#: How long a move waits for the forwards of the placement before the last move to finish
#: (the dataplane refuses it until they did): forwards take milliseconds.
DRAIN_WAIT_S = 2.0

#: A chunk unacknowledged this long names its duck on the progress bar ("waiting for
#: ducks [...]"): a healthy duck acknowledges within milliseconds.
STALL_S = 1.0

if TYPE_CHECKING:
    from .session import Inflight, Session

__all__ = [
    "BANK_MAX_BYTES",
    "Loaded",
    "MoeLayer",
    "default_placement",
    "default_shared_ducks",
    "load_weights",
    "moe_layer",
    "moe_view",
    "move",
    "repair",
]

#: The most a duck's bank may take, in the float32 a duck keeps its weights in: the duck
#: emulator's DUCK_MAX_FLOATS (1 GiB of floats a duck, dataplane/duck/dp_duck.c). The
#: default shared set is as few ducks as keep each one's bank within it.
BANK_MAX_BYTES = 1 << 30

#: what a placement item may be: one duck id, or the ducks of its replicas
PlacementItem = int | Sequence[int]


@dataclasses.dataclass(frozen=True, eq=False)
class MoeLayer:
    """What the client knows of a mixture-of-experts layer it loaded: enough to check
    a routing before it is sent and to name the experts of a duck that did not answer."""

    layer: int
    n_experts: int
    hidden: int
    dtype: np.dtype
    expert_ffn: int
    shared_ffn: int  # 0: no shared expert
    ducks: tuple[int, ...]  # the layer's ducks, in LoadWeights order
    placement: tuple[tuple[int, ...], ...]  # placement[e]: the ducks of expert e's replicas
    bank_sizes: tuple[int, ...]  # columns of each duck's bank, in ``ducks`` order
    shared_ducks: tuple[int, ...] = ()  # the shared expert's set (empty: no shared expert)
    # with several sets (the shared expert's replicas): shared_ducks cut into runs of
    # these sizes, each set in ``ducks`` order (LoadWeights.shared_sets); (): one set
    shared_sets: tuple[int, ...] = ()
    # the LayerInfo this view was built from (moe_view), None for the loader's own plan:
    # a newer LayerInfo of the layer (reloaded) makes the view stale
    info: ctl.LayerInfo | None = None

    def experts_on(self, duck: int) -> list[int]:
        """The experts ``duck`` holds, ascending: its bank slots 0, 1, ..."""
        return [e for e, held in enumerate(self.placement) if duck in held]

    def describe(self, ducks: Iterable[int]) -> str:
        """Each duck with the experts it holds, as "duck 5 (experts 40 41)", for errors."""
        parts = []
        for d in ducks:
            held = self.experts_on(d)
            if not held:
                what = "the shared expert only" if d in self.shared_ducks else "no experts"
            else:
                shown = " ".join(str(e) for e in held[:16])
                what = f"experts {shown}{' ...' if len(held) > 16 else ''}"
            parts.append(f"duck {d} ({what})")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True, eq=False)
class Loaded:
    """A layer as this client loaded it, kept so that :func:`repair` can cut any duck's
    bank again: a reference to the caller's model, not a copy (no memory is held twice;
    a model changed in place after the load would repair with the changed weights, so
    load it again instead), and how it was cut."""

    mlp: Mlp | MoeMlp
    ducks: tuple[int, ...]  # in LoadWeights order
    sizes: tuple[int, ...]  # FFN columns of each duck's shard or bank
    plan: MoeLayer | None  # a MoE layer's placement; None for a dense one
    # ducks a failed move sent a bank: the next move sends them one again (MoveLayer.ducks)
    tainted: frozenset[int] = frozenset()


def default_placement(n_experts: int, ducks: Sequence[int]) -> list[list[int]]:
    """Experts spread evenly over ``ducks`` in contiguous blocks, one replica each:
    expert ``e`` on ``ducks[e * len(ducks) // n_experts]`` (DeepSeek-V3's 256 experts on
    32 ducks: 8 each, 0-7 on the first)."""
    n = len(ducks)
    return [[ducks[e * n // n_experts]] for e in range(n_experts)]


def default_shared_ducks(
    moe: MoeMlp,
    ducks: Sequence[int],
    ducks_of: Sequence[Sequence[int]],
    nic_of: Mapping[int, str] | None = None,
) -> list[int]:
    """The shared expert's default set on a layer of ``ducks`` (placement ``ducks_of``):
    as few ducks as its bytes need, each bank (its routed experts' columns and its shard
    of the shared expert, in float32 as a duck keeps them) within :data:`BANK_MAX_BYTES`,
    and at least one; spread one per NIC (``nic_of``: duck -> NIC name), taking in turn
    each NIC's next duck in ``ducks`` order, so that no NIC carries every token's row
    for the shared expert alone. With one duck a token routed nowhere else costs one row
    on the wire, the least there is."""
    assert moe.shared is not None
    ffn = moe.shared.ffn
    per_col = 3 * moe.hidden * 4  # w_gate, w_up, w_down columns, float32 on the duck
    routed = {d: sum(d in held for held in ducks_of) * moe.ffn for d in ducks}
    widest = max(routed.values(), default=0)
    k = 1
    while k < min(len(ducks), ffn) and (widest + -(-ffn // k)) * per_col > BANK_MAX_BYTES:
        k += 1
    by_nic: dict[str, list[int]] = {}
    for d in ducks:
        by_nic.setdefault((nic_of or {}).get(d, ""), []).append(d)
    queues = list(by_nic.values())
    chosen: list[int] = []
    while len(chosen) < k:
        for q in queues:
            if q and len(chosen) < k:
                chosen.append(q.pop(0))
    return sorted(chosen)


def _shared_sets(
    moe: MoeMlp,
    chosen: list[int],
    ducks_of: list[list[int]],
    all_ducks: Sequence[int],
    nic_of: Mapping[int, str] | None,
) -> list[list[int]]:
    """The layer's shared sets (the shared expert's replicas): MoeMlp.shared_ducks checked
    against the layer's ducks, or the default set; [] without a shared expert."""
    if moe.shared is None:
        return []
    sets = moe.shared_sets
    if sets is None:
        return [default_shared_ducks(moe, chosen, ducks_of, nic_of)]
    for given in sets:
        _shared_set_check(moe, given, chosen, all_ducks)
    return sets


def _shared_set_check(
    moe: MoeMlp, given: list[int], chosen: list[int], all_ducks: Sequence[int]
) -> None:
    """One set of MoeMlp.shared_ducks against the layer's ducks."""
    assert moe.shared is not None
    unknown = [d for d in given if d not in all_ducks]
    if unknown:
        raise BadInput(
            f"MoeMlp.shared_ducks names ducks {unknown}, which the dataplane does not have "
            f"(its ducks: {list(all_ducks)})"
        )
    outside = [d for d in given if d not in chosen]
    if outside:
        raise BadInput(
            f"MoeMlp.shared_ducks names ducks {outside}, which are not among the layer's "
            f"ducks {chosen}: add them to ducks= or pick the shared set among those"
        )
    if moe.shared.ffn < len(given):
        raise BadInput(
            f"the shared expert has {moe.shared.ffn} columns but shared_ducks names "
            f"{len(given)} ducks: each needs at least one column; name fewer ducks"
        )


def _placement_of(
    placement: Sequence[PlacementItem] | None,
    n_experts: int,
    ducks: Sequence[int] | None,
    all_ducks: Sequence[int],
) -> tuple[list[int], list[list[int]]]:
    """(the layer's ducks, each expert's ducks) from what the caller gave, checked; every
    problem a BadInput naming the expert. Without ``ducks`` the layer lives on the
    ducks the placement names (every duck of the topology for the default placement)."""
    if placement is None:
        chosen = list(all_ducks if ducks is None else ducks)
        _check_ducks(chosen, all_ducks)
        return chosen, default_placement(n_experts, chosen)
    if isinstance(placement, str | bytes) or not isinstance(placement, Sequence | np.ndarray):
        raise BadInput(
            f"placement must be a sequence of {n_experts} items (one per expert), each a duck "
            f"id or a sequence of duck ids (replicas), not {type(placement).__name__}"
        )
    if len(placement) != n_experts:
        raise BadInput(
            f"placement places {len(placement)} experts but the layer has {n_experts}: give "
            "one item per expert, a duck id or a sequence of duck ids (replicas)"
        )
    ducks_of: list[list[int]] = []
    for e, item in enumerate(placement):
        held = [item] if isinstance(item, int | np.integer) else item
        if isinstance(held, str | bytes) or not isinstance(held, Sequence | np.ndarray):
            raise BadInput(
                f"placement of expert {e} is {item!r}: give a duck id or a sequence of duck ids"
            )
        if any(isinstance(d, bool) or not isinstance(d, int | np.integer) for d in held):
            raise BadInput(f"placement of expert {e} is {item!r}: duck ids are integers")
        held = [int(d) for d in held]
        if not 1 <= len(held) <= MAX_REPLICAS:
            raise BadInput(
                f"expert {e} is placed on {len(held)} ducks; give it 1..{MAX_REPLICAS} replicas"
            )
        if len(set(held)) != len(held):
            raise BadInput(
                f"expert {e} is placed on ducks {held}: its replicas must be distinct ducks"
            )
        unknown = [d for d in held if d not in all_ducks]
        if unknown:
            raise BadInput(
                f"expert {e} is placed on ducks {unknown}, which the dataplane does not have "
                f"(its ducks: {list(all_ducks)})"
            )
        if ducks is not None:
            outside = [d for d in held if d not in ducks]
            if outside:
                raise BadInput(
                    f"expert {e} is placed on ducks {outside}, which are not among the layer's "
                    f"ducks {list(ducks)}: add them to ducks= or place the expert elsewhere"
                )
        ducks_of.append(held)
    if ducks is None:
        chosen = sorted({d for held in ducks_of for d in held})
    else:
        chosen = list(ducks)
        _check_ducks(chosen, all_ducks)
    return chosen, ducks_of


def _check_ducks(chosen: list[int], all_ducks: Sequence[int]) -> None:
    if not chosen or len(set(chosen)) != len(chosen) or not set(chosen) <= set(all_ducks):
        raise BadInput(f"ducks {chosen} must be distinct ids among {list(all_ducks)}")


def moe_layer(
    layer: int,
    moe: MoeMlp,
    all_ducks: Sequence[int],
    *,
    ducks: Sequence[int] | None = None,
    placement: Sequence[PlacementItem] | None = None,
    nic_of: Mapping[int, str] | None = None,
) -> MoeLayer:
    """The plan of loading ``moe`` as ``layer`` on the dataplane's ``all_ducks``: where
    each expert goes, which ducks hold the shared expert (``moe.shared_ducks``, or the
    default set over ``nic_of``'s NICs) and how wide each duck's bank is. BadInput for
    what the dataplane would refuse, before anything is sent."""
    n_experts = moe.n_experts
    if n_experts > MAX_EXPERTS:
        raise BadInput(f"a MoE layer has 1..{MAX_EXPERTS} experts, this one {n_experts}")
    chosen, ducks_of = _placement_of(placement, n_experts, ducks, all_ducks)
    routing.placement(ducks_of)  # the dataplane's own rule (dp_routing_placement_check)
    shared_ffn = moe.shared.ffn if moe.shared is not None else 0
    sets = _shared_sets(moe, chosen, ducks_of, all_ducks, nic_of)
    cutter = fp8.block_shard_sizes if _is_fp8(moe) else shard_sizes  # FP8: whole 128-blocks
    cut: dict[int, int] = {}
    in_sets = []
    for given in sets:  # each set holds all of the shared expert, in ducks order
        in_set = [d for d in chosen if d in given]
        in_sets.append(in_set)
        cut.update(zip(in_set, cutter(shared_ffn, len(in_set)), strict=True))
    # one set: as given (LoadWeights takes them in any order); several: set by set
    shared_set = list(sets[0]) if len(sets) == 1 else [d for x in in_sets for d in x]
    local = {d: sum(d in held for held in ducks_of) for d in chosen}
    if ducks is None and shared_ffn:
        # the layer's ducks are those with work, experts or shared columns: before the
        # shared set a shared expert gave every duck some, and a duck with none idles
        chosen = [d for d in chosen if local[d] or d in cut]
    idle = [d for d in chosen if not local[d] and d not in cut]
    if idle:
        why = "is not in the shared set" if shared_ffn else "has no shared expert"
        raise BadInput(
            f"ducks {idle} would hold no expert and the layer {why}: load it on fewer "
            "ducks (ducks=), place experts on them (placement=) or add them to shared_ducks"
        )
    return MoeLayer(
        layer=layer,
        n_experts=n_experts,
        hidden=moe.hidden,
        dtype=np.dtype(moe.dtype),
        expert_ffn=moe.ffn,
        shared_ffn=shared_ffn,
        ducks=tuple(chosen),
        placement=tuple(tuple(held) for held in ducks_of),
        bank_sizes=tuple(local[d] * moe.ffn + cut.get(d, 0) for d in chosen),
        shared_ducks=tuple(shared_set),
        shared_sets=tuple(len(x) for x in in_sets) if len(in_sets) > 1 else (),
    )


def moe_view(info: ctl.LayerInfo) -> MoeLayer | None:
    """What a client that did not load MOE layer ``info`` knows of it, from the
    placement its LayerInfo carries (dp_layer_moe_list); None when it carries none (a
    dataplane that predates it) or an inconsistent one."""
    replicas, placed = info.expert_replicas, info.expert_ducks
    if not replicas or info.expert_ffn < 1 or sum(replicas) != len(placed):
        return None
    starts = itertools.accumulate(replicas, initial=0)
    placement = tuple(tuple(placed[a:b]) for a, b in itertools.pairwise(starts))
    try:
        dtype = numpy_dtype(info.dtype)
    except BadInput:
        return None
    return MoeLayer(
        layer=info.layer,
        n_experts=len(replicas),
        hidden=info.hidden,
        dtype=dtype,
        expert_ffn=info.expert_ffn,
        shared_ffn=max(0, info.ffn - len(placed) * info.expert_ffn)
        // max(1, len(info.shared_sets)),
        ducks=tuple(info.ducks),
        placement=placement,
        bank_sizes=tuple(info.shard_sizes),
        shared_ducks=tuple(info.shared_ducks),
        shared_sets=tuple(info.shared_sets),
        info=info,
    )


def _banks(
    moe: MoeMlp, plan: MoeLayer, only: Iterable[int] | None = None
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(duck, tensor, array) of every duck's bank (of those in ``only``, when given): its
    experts' columns ascending by expert id, then its shard of the shared expert. Built
    one duck at a time, so that only one bank is copied out of the model at once."""
    e_ffn = plan.expert_ffn
    wanted = None if only is None else set(only)
    set_of, at = {}, 0  # each set holds all of the shared expert: its own columns from 0
    for s, size in enumerate(plan.shared_sets or (len(plan.shared_ducks),)):
        set_of.update(dict.fromkeys(plan.shared_ducks[at : at + size], s))
        at += size
    lo = dict.fromkeys(set(set_of.values()), 0)
    for duck, width in zip(plan.ducks, plan.bank_sizes, strict=True):
        experts = [moe.experts[e] for e in plan.experts_on(duck)]
        cols = width - len(experts) * e_ffn  # its shared-expert columns (0: none)
        a = lo[set_of[duck]] if cols else 0
        cut = [(p, 0, p.ffn) for p in experts] + ([(moe.shared, a, a + cols)] if cols else [])
        if cols:
            lo[set_of[duck]] += cols
        if wanted is not None and duck not in wanted:
            continue
        w_gate = np.concatenate([p.w_gate[:, a:b] for p, a, b in cut], axis=1)
        w_up = np.concatenate([p.w_up[:, a:b] for p, a, b in cut], axis=1)
        w_down = np.concatenate([p.w_down[a:b, :] for p, a, b in cut], axis=0)
        if not _is_fp8(moe):
            for t, arr in enumerate((w_gate, w_up, w_down)):
                yield duck, t, np.ascontiguousarray(arr)
            continue
        # each block's own scale grid, side by side (fp8.bank_scales; dp_fp8.h)
        grids = [p.shard_scales(a, b) for p, a, b in cut]
        s_gate, s_down = fp8.bank_scales([g[0] for g in grids], [g[2] for g in grids])
        s_up, _ = fp8.bank_scales([g[1] for g in grids], [g[2] for g in grids])
        for t, (w, sc) in enumerate(((w_gate, s_gate), (w_up, s_up), (w_down, s_down))):
            yield duck, t, _fp8_bytes(w, sc)


def _is_fp8(mlp: object) -> bool:
    if isinstance(mlp, MoeMlp):
        return mlp.experts[0].is_fp8
    return isinstance(mlp, SwiGluMlp) and mlp.is_fp8


def _fp8_bytes(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """An FP8 tensor as it travels: its e4m3 bytes, then its float32 scale grid (LE)."""
    return np.concatenate(
        [
            np.ascontiguousarray(w).reshape(-1).view(np.uint8),
            np.ascontiguousarray(scale, dtype="<f4").reshape(-1).view(np.uint8),
        ]
    )


def _check_model(mlp: object) -> None:
    """BadInput unless ``mlp`` is a model: a bare array would otherwise fail on its dtype
    (float64 "not supported") before anything said that a layer is a model object."""
    if isinstance(mlp, (GeluMlp, SwiGluMlp, MoeMlp)):
        return
    what = (
        f"a numpy array of shape {mlp.shape} and dtype {mlp.dtype}"
        if isinstance(mlp, np.ndarray)
        else f"a {type(mlp).__name__}"
    )
    raise BadInput(
        f"load_weights takes a layer's model, not {what}: duckpipe.GeluMlp(w_up=[hidden, ffn], "
        "b_up=[ffn], w_down=[ffn, hidden], b_down=[hidden] or None), duckpipe.SwiGluMlp("
        "w_gate=[hidden, ffn], w_up=[hidden, ffn], w_down=[ffn, hidden]) or duckpipe.MoeMlp; "
        "every tensor float32, float16 or bfloat16 (ml_dtypes.bfloat16)"
    )


def load_weights(
    session: Session,
    layer: int,
    mlp: Mlp | MoeMlp,
    *,
    ducks: Sequence[int] | None,
    progress: bool | Callable[[int, int], None] | None,
    timeout: float,
    shared: bool,
    placement: Sequence[PlacementItem] | None = None,
) -> ctl.LayerInfo:
    """Load ``mlp`` as ``layer`` through ``session``; see ``Client.load_weights``.

    Progress counts the bytes the ducks have acknowledged (a chunk's completion comes
    back once every duck it went to has acked it), not the bytes copied into the
    segment. ``progress`` may be a callable ``(acked_bytes, total_bytes)``, called as
    acknowledgements arrive, instead of the bar."""
    session.check_usable()
    if not isinstance(layer, int) or not 0 <= layer <= 0xFFFF_FFFF:
        raise BadInput(f"layer must be an integer in [0, 2**32), not {layer!r}")
    _check_model(mlp)
    is_moe = isinstance(mlp, MoeMlp)
    if placement is not None and not is_moe:
        raise BadInput(
            f"placement= places the experts of a MoeMlp; a {type(mlp).__name__} is sharded "
            "over ducks= instead"
        )
    if isinstance(mlp, MoeMlp) and placement is not None:
        moved = move(
            session,
            layer,
            mlp,
            ducks=ducks,
            placement=placement,
            progress=progress,
            timeout=timeout,
            shared=shared,
        )
        if moved is not None:
            return moved
    dt = mlp.dtype  # the activations' (an FP8 layer's weights are weight_dtype)
    code = dtype_code(dt)
    weight_dtype = int(DType.F8E4M3) if _is_fp8(mlp) else 0
    topology = session.request(lambda rid: ctl.GetTopology(req_id=rid))
    assert isinstance(topology, ctl.Topology)
    all_ducks = [d.id for d in topology.ducks]
    plan: MoeLayer | None = None
    pieces: Iterable[tuple[int, int, np.ndarray]]
    if isinstance(mlp, MoeMlp):
        nic_of = {d.id: d.nic for d in topology.ducks}
        plan = moe_layer(layer, mlp, all_ducks, ducks=ducks, placement=placement, nic_of=nic_of)
        chosen, sizes = list(plan.ducks), list(plan.bank_sizes)
        request = ctl.LoadWeights(
            req_id=0,
            layer=layer,
            kind=int(MlpKind.MOE),
            dtype=int(code),
            hidden=mlp.hidden,
            ffn=sum(sizes),
            ducks=chosen,
            shard_sizes=sizes,
            shared=shared,
            expert_ffn=plan.expert_ffn,
            expert_replicas=[len(held) for held in plan.placement],
            expert_ducks=[d for held in plan.placement for d in held],
            shared_ducks=list(plan.shared_ducks),
            shared_sets=list(plan.shared_sets),
            weight_dtype=weight_dtype,
        )
        item = np.dtype(dt).itemsize
        total = sum(3 * mlp.hidden * f * item for f in sizes)  # w_gate, w_up, w_down
        if weight_dtype:  # e4m3 bytes and each duck's scale grids
            total = sum(_fp8_bank_bytes(plan, d, f) for d, f in zip(chosen, sizes, strict=True))
        pieces = _banks(mlp, plan)
    else:
        chosen = list(all_ducks if ducks is None else ducks)
        _check_ducks(chosen, all_ducks)
        cut = fp8.block_shard_sizes if weight_dtype else shard_sizes  # FP8: whole blocks
        sizes = cut(mlp.ffn, len(chosen))
        request = ctl.LoadWeights(
            req_id=0,
            layer=layer,
            kind=int(mlp.kind),
            dtype=int(code),
            hidden=mlp.hidden,
            ffn=mlp.ffn,
            ducks=chosen,
            shard_sizes=sizes,
            has_b_down=mlp.b_down is not None,
            shared=shared,
            weight_dtype=weight_dtype,
        )
    # the layer's MoE facts and model, if any, are the old layer's from here on
    session.moe.pop(layer, None)
    session.loaded.pop(layer, None)
    try:
        session.request(lambda rid: msgspec.structs.replace(request, req_id=rid))
    except NotPermitted as e:
        if placement is None or "belongs to another client" not in str(e):
            raise
        raise _refused_move(layer) from e
    session.layers.pop(layer, None)  # the remembered LayerInfo, if any, is the old layer's
    if plan is None:  # the shards are cut once the dataplane took the plan
        pieces = _pieces(mlp, chosen, sizes)
        total = sum(a.nbytes for _, _, a in pieces)
    recs, commit = _stream(session, layer, pieces, total, progress, timeout, "weights")
    failed = _stream_failure(session, recs, commit)
    if failed:
        session.layers.pop(layer, None)
        first, why, missing = failed
        who = f"ducks {missing} did not acknowledge their weights ({why})" if missing else why
        raise LayerFailed(
            f"loading layer {layer} failed: {who}. The layer is marked failed; "
            f"once the ducks answer (Client.topology() shows which are alive), call "
            f"load_weights({layer}, ...) again",
            status=first.status or 0,
            missing=tuple(missing),
        )
    info = session.layer_info(layer)
    if plan is not None:
        session.moe[layer] = plan
    session.loaded[layer] = Loaded(mlp, tuple(chosen), tuple(sizes), plan)
    return info


def repair(
    session: Session,
    layer: int,
    *,
    progress: bool | Callable[[int, int], None] | None,
    timeout: float,
) -> ctl.LayerInfo:
    """Give the ducks that lost ``layer`` (LayerInfo.lost: they restarted) their banks
    again; see ``Client.repair``. Only those banks are cut from the model this session
    loaded (:class:`Loaded`) and streamed, after a ``RepairLayer`` opened the repair; the
    commit brings them back. Returns the layer's LayerInfo (nothing is sent when no duck
    lost it)."""
    session.check_usable()
    loaded = session.loaded.get(layer)
    info = next((li for li in session.refresh_layers() if li.layer == layer), None)
    if info is None:
        raise UnknownLayer(
            f"layer {layer} is not loaded in the dataplane: load it with "
            "Client.load_weights(), there is nothing to repair"
        )
    if loaded is None:
        raise BadInput(
            f"layer {layer} was not loaded by this client, which holds no model to cut its "
            "banks from: its loader repairs it (Client.repair), or load it anew"
        )
    if info.failed:
        raise LayerFailed(
            f"layer {layer} failed to load (ducks {info.missing} did not acknowledge): a "
            f"repair restores a committed layer's lost ducks; call load_weights({layer}, ...)",
            status=int(Status.BAD_REQUEST),
            missing=tuple(info.missing),
        )
    if not info.lost:
        return info  # every duck holds it: nothing to send
    lost = list(info.lost)
    session.request(lambda rid: ctl.RepairLayer(req_id=rid, layer=layer, ducks=lost))
    session.layers.pop(layer, None)
    mlp, plan = loaded.mlp, loaded.plan
    pieces: list[tuple[int, int, np.ndarray]]
    if isinstance(mlp, MoeMlp):
        assert plan is not None
        pieces = list(_banks(mlp, plan, only=lost))
    else:
        pieces = _pieces(mlp, list(loaded.ducks), list(loaded.sizes), only=lost)
    total = sum(a.nbytes for _, _, a in pieces)
    recs, commit = _stream(session, layer, pieces, total, progress, timeout, "repair")
    failed = _stream_failure(session, recs, commit)
    if failed:
        first, why, missing = failed
        raise DataplaneFault(
            f"repairing layer {layer} failed: {why}. It still serves on its other ducks; "
            f"ducks {lost} stay lost: call repair({layer}) again once they answer "
            "(Client.topology() shows which are alive)",
            status=first.status or 0,
            missing=tuple(missing or lost),
        )
    return session.layer_info(layer)


def _refused_move(layer: int) -> NotPermitted:
    """A placement for another client's layer: it is not this client's to move."""
    return NotPermitted(
        ErrorCode.NOT_PERMITTED,
        f"layer {layer} belongs to another client: only the client that loaded it moves it "
        "to a new placement (load_weights with placement= on a live layer it loaded); load "
        "your own layer under another id",
    )


def move(
    session: Session,
    layer: int,
    moe: MoeMlp,
    *,
    ducks: Sequence[int] | None,
    placement: Sequence[PlacementItem],
    progress: bool | Callable[[int, int], None] | None,
    timeout: float,
    shared: bool,
) -> ctl.LayerInfo | None:
    """Move committed MoE layer ``layer``, which this session loaded from ``moe`` (the
    same object), to ``placement`` while it serves; None when it is not such a layer (the
    caller loads it whole). Only the banks of the ducks whose set of experts changes are
    cut and streamed, after a ``MoveLayer``; the commit switches the layer. The layer keeps
    its ducks and its shared expert's set. (Another client's layer: _refused_move.)"""
    loaded = session.loaded.get(layer)
    if loaded is None or loaded.plan is None or loaded.mlp is not moe:
        return None  # not a MoE layer this session loaded from moe: a load (another
        # client's layer: the dataplane refuses it, _refused_move says why)
    info = next((li for li in session.refresh_layers() if li.layer == layer), None)
    if info is None or info.failed or bool(info.shared) != bool(shared):
        return None  # nothing serves, or its sharing changes: a load places it
    old = loaded.plan
    if ducks is not None and list(ducks) != list(old.ducks):
        raise BadInput(
            f"layer {layer} is loaded on ducks {list(old.ducks)}: a move keeps its ducks "
            f"(ducks={list(ducks)} differs); unload it and load it anew to change them"
        )
    # the shared set stays: given, it is the model's; the default one (sized by the widest
    # routed bank) is pinned, since the new placement's widths could pick another
    keep = moe
    if moe.shared is not None and moe.shared_ducks is None:
        keep = dataclasses.replace(moe, shared_ducks=list(old.shared_ducks))
    topology = session.request(lambda rid: ctl.GetTopology(req_id=rid))
    assert isinstance(topology, ctl.Topology)
    new = moe_layer(
        layer, keep, [d.id for d in topology.ducks], ducks=old.ducks, placement=placement
    )
    changed = [
        d for d in old.ducks if new.experts_on(d) != old.experts_on(d) or d in loaded.tainted
    ]
    if not changed:
        return info  # every duck keeps its experts: nothing to send
    request = ctl.MoveLayer(
        req_id=0,
        layer=layer,
        shard_sizes=list(new.bank_sizes),
        expert_replicas=[len(held) for held in new.placement],
        expert_ducks=[d for held in new.placement for d in held],
        ducks=changed,
    )
    # right after a move, the forwards of the placement before it may still be in flight
    # (the ducks keep two banks a layer: this move would free theirs): a moment's wait
    drained = time.monotonic() + min(timeout, DRAIN_WAIT_S)
    while True:
        try:
            session.request(lambda rid: msgspec.structs.replace(request, req_id=rid))
            break
        except BadInput as e:
            if "still in flight" not in str(e) or time.monotonic() > drained:
                raise
            time.sleep(0.005)
    session.layers.pop(layer, None)
    pieces = list(_banks(moe, new, only=changed))
    total = sum(a.nbytes for _, _, a in pieces)
    recs, commit = _stream(session, layer, pieces, total, progress, timeout, "move")
    failed = _stream_failure(session, recs, commit)
    if failed:
        # the ducks it reached may hold a stale bank now: the next move sends them one
        session.loaded[layer] = dataclasses.replace(loaded, tainted=loaded.tainted | set(changed))
        first, why, missing = failed
        raise DataplaneFault(
            f"moving layer {layer} failed: {why}. It still serves on its old placement; "
            f"call load_weights({layer}, ..., placement=...) again once ducks "
            f"{missing or changed} answer",
            status=first.status or 0,
            missing=tuple(missing),
        )
    session.moe[layer] = new
    session.loaded[layer] = Loaded(moe, new.ducks, new.bank_sizes, new)
    return session.layer_info(layer)


def _stream_failure(
    session: Session, recs: list[tuple[int, Inflight]], commit: Inflight
) -> tuple[Inflight, str, list[int]] | None:
    """None when every chunk of a stream (a load, repair or move) and its commit went
    through; else the first failure, its reason, and the ducks whose chunks failed (the
    replies that carry the reasons awaited first)."""
    bad = _failed(recs)
    if not bad and commit.status == Status.OK:
        return None
    for _, rec in bad:
        session.await_zmq(rec, 1.0)  # it carries the reason
    first = bad[0][1] if bad else commit
    session.await_zmq(first, 1.0)
    missing = sorted({d for d, _ in bad if d != ctl.HOST_TENSOR_DUCK})
    return first, first.message or Status(first.status).name, missing


def _stream(
    session: Session,
    layer: int,
    pieces: Iterable[tuple[int, int, np.ndarray]],
    total: int,
    progress: bool | Callable[[int, int], None] | None,
    timeout: float,
    what: str,
) -> tuple[list[tuple[int, Inflight]], Inflight]:
    """Every piece (duck, tensor, array) cut into slot-sized WEIGHT_CHUNKs through the
    ring, then the WEIGHT_COMMIT; waits for them all. Returns each chunk with its duck, and
    the commit, for the caller to judge. A load and a repair stream alike."""
    chunk = session.max_bytes
    recs: list[tuple[int, Inflight]] = []  # (duck, its chunk)
    report = progress if callable(progress) else None
    # chunks whose completion is not in yet: (chunk, bytes, duck, when it was pushed)
    unacked: list[tuple[Inflight, int, int, float]] = []
    acked = 0
    refused: set[int] = set()  # ducks with a chunk that failed: not acknowledged

    def count_acks() -> None:
        """Progress is what the ducks acknowledged: a chunk that failed (its duck never
        acknowledged it) moves nothing; it used to draw the bar to 100% before failing."""
        nonlocal unacked, acked
        if any(rec.status is not None for rec, *_ in unacked):
            done = [(rec, size, duck) for rec, size, duck, _ in unacked if rec.status is not None]
            unacked = [u for u in unacked if u[0].status is None]
            n = sum(size for rec, size, _ in done if rec.status == Status.OK)
            refused.update(duck for rec, _, duck in done if rec.status != Status.OK)
            if n:
                acked += n
                bar.advance(n)
                if report is not None:
                    report(acked, total)
        now = time.monotonic()
        stalled = {duck for _, _, duck, t in unacked if now - t > STALL_S} - refused
        stalled.discard(ctl.HOST_TENSOR_DUCK)
        notes = [f"waiting for ducks {sorted(stalled)}"] if stalled else []
        if refused - {ctl.HOST_TENSOR_DUCK}:
            notes.append(f"ducks {sorted(refused - {ctl.HOST_TENSOR_DUCK})} did not acknowledge")
        bar.note("; ".join(notes))

    def wait_for_slot(left: float) -> None:
        session.wait_for_slot(left)  # takes completions in, a slice at a time
        count_acks()

    def wait_done(rec: Inflight) -> None:
        """session.wait_done in slices: the bar says what it waits on meanwhile."""
        deadline = time.monotonic() + timeout
        while rec.status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"{_DOING.get(what, 'loading')} layer {layer}: a weight "
                    f"chunk was not completed within "
                    f"{timeout:g} s ({bar.waiting or 'the dataplane is slow'})"
                )
            with contextlib.suppress(WaitTimeout):
                session.wait_done(rec, min(STALL_S / 4, left), "block")
            count_acks()

    enabled = False if report is not None else progress
    with Progress(total, f"layer {layer} {what}", enabled=enabled) as bar:
        for duck, tensor, arr in pieces:
            raw = arr.reshape(-1).view(np.uint8)
            for off in range(0, raw.size, chunk):
                part = raw[off : off + chunk]
                i = session.slots.take(timeout, wait_for_slot)
                session.segment.act_bytes(i)[: part.size] = part
                rec = session.push_weight(i, Op.WEIGHT_CHUNK, layer, duck, tensor, off, part.size)
                recs.append((duck, rec))
                unacked.append((rec, part.size, duck, time.monotonic()))
                session.pump(0)  # take completions already in; frees their slots
                count_acks()
            if _failed(recs):
                break  # the layer is failed already: say so now, not after every chunk
        i = session.slots.take(timeout, wait_for_slot)
        commit = session.push_weight(i, Op.WEIGHT_COMMIT, layer, 0, 0, 0, 0)
        # the bar follows the acknowledgements still to come; a commit that completes
        # first (a failed load) ends the wait for them
        while unacked and commit.status is None:
            wait_done(unacked[0][0])
            count_acks()
        wait_done(commit)
        for rec, *_ in unacked:
            if rec.status is None:
                wait_done(rec)
        count_acks()
    return recs, commit


_DOING = {"repair": "repairing", "move": "moving"}


def _failed(recs: list[tuple[int, Inflight]]) -> list[tuple[int, Inflight]]:
    return [(d, r) for d, r in recs if r.status is not None and r.status != Status.OK]


def _pieces(
    mlp: Mlp, ducks: list[int], sizes: list[int], only: Iterable[int] | None = None
) -> list[tuple[int, int, np.ndarray]]:
    """(duck, tensor index, array) for every tensor to send: each duck's shard, then
    b_down (tensor B_DOWN_TENSOR), which the dataplane keeps and adds once, after the
    reduce. With ``only`` (a repair): those ducks' shards alone, b_down never left."""
    pieces: list[tuple[int, int, np.ndarray]] = []
    wanted = None if only is None else set(only)
    for duck, (lo, hi) in zip(ducks, shard_bounds(sizes), strict=True):
        if wanted is not None and duck not in wanted:
            continue
        arrays = mlp.shard(lo, hi)
        if _is_fp8(mlp):  # each with its blocks' scales (fp8.shard_fp8)
            assert isinstance(mlp, SwiGluMlp)
            arrays = tuple(map(_fp8_bytes, arrays, mlp.shard_scales(lo, hi)))
        pieces += [(duck, t, arr) for t, arr in enumerate(arrays)]
    if mlp.b_down is not None and wanted is None:
        pieces.append((ctl.HOST_TENSOR_DUCK, B_DOWN_TENSOR, np.ascontiguousarray(mlp.b_down)))
    return pieces


def _fp8_bank_bytes(plan: MoeLayer, duck: int, f: int) -> int:
    """Bytes of a duck's three FP8 bank tensors (dp_fp8_tensor_bytes): e4m3 weights and
    the scale grids of its experts and its shared columns."""
    experts = len(plan.experts_on(duck))
    rest = f - experts * plan.expert_ffn
    blocks = -(-plan.hidden // fp8.BLOCK)
    cb = experts * -(-plan.expert_ffn // fp8.BLOCK) + -(-rest // fp8.BLOCK)
    return 3 * (plan.hidden * f + 4 * blocks * cb)
