"""Mixture of experts on the host: the gate, the routing check, and a numpy reference.

A routed layer is a list of experts (SwiGLU MLPs of one shape and dtype) plus an
optional shared expert that every token passes through. The model computes the
gate on the host and hands duckpipe each token's routing: ``indices[t, k]`` names
the experts, ``weights[t, k]`` scales their outputs, and

    y[t] = sum_k weights[t, k] * experts[indices[t, k]](x[t]) + shared(x[t])

:class:`Gate` follows DeepSeek-V3's inference ``Gate`` (inference/model.py) rule
for rule; the reference cluster runs it with 256 experts in 8 groups, 4 groups
kept, 8 experts per token, sigmoid scores with a selection bias, route scale 2.5.
:func:`check_routing` is the one check a routing passes before it is used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .._abi import ffi
from ..errors import BadInput
from ..schema.routing import MAX_REPLICAS
from . import routing as routing_table
from .models import SwiGluMlp, dtype_code, is_float_dtype

__all__ = ["SCORES", "Gate", "MoeMlp", "Routing", "check_routing"]

#: The gate's scoring functions, as DeepSeek-V3's ``score_func`` names them.
SCORES = ("softmax", "sigmoid")


class _RoutingFields(NamedTuple):
    indices: np.ndarray  # int32 expert ids, best first
    weights: np.ndarray  # float32, each row's expert weights


class Routing(_RoutingFields):
    """A gate's choice for each token, both ``[tokens, topk]``: what ``Gate`` returns and
    what ``submit(..., routing=)`` and ``forward(..., routing=)`` take as they are.

    In the order ``routing=`` has always taken, ``(indices, weights)``: unpack it by name
    (``r.indices``, ``r.weights``) or in that order."""

    # A gate's routing also holds its arrays' C pointers, made when the gate made them
    # (``Routing.of_gate``): a routed submit then hands them to C as they are, where the
    # arrays would need two ffi.from_buffer and their dtype, shape and layout checked
    # (issue 29: that was most of a one-token routed submit's cost over a dense one).
    # A tuple's fields never change, so the pointers stay the arrays'; _replace and
    # _make give a Routing without them. (No __slots__: a tuple subclass can't add any.)
    _c: tuple | None = None  # (shape, indices' pointer, weights' pointer)

    @classmethod
    def of_gate(cls, indices: np.ndarray, weights: np.ndarray) -> Routing:
        """A routing of ``indices`` and ``weights`` in a gate's form (int32 and float32,
        ``[tokens, topk]``, C-contiguous), holding their C pointers; BadInput for arrays
        in any other form (the pointers would be read as that form)."""
        if not (
            type(indices) is type(weights) is np.ndarray
            and indices.dtype == np.int32
            and weights.dtype == np.float32
            and indices.ndim == 2
            and indices.shape == weights.shape
            and indices.flags.c_contiguous
            and weights.flags.c_contiguous
        ):
            raise BadInput(
                "Routing.of_gate takes C-contiguous int32 indices and float32 weights of "
                "one [tokens, topk] shape; Routing(indices, weights) takes any routing"
            )
        r = cls(indices, weights)
        r._c = (indices.shape, ffi.from_buffer(indices), ffi.from_buffer(weights))
        return r

    def __reduce__(self):  # pickled and copied as its two arrays: C pointers are not data
        return (Routing, (self.indices, self.weights))


def check_routing(x: np.ndarray, indices: np.ndarray, weights: np.ndarray, n_experts: int) -> None:
    """Raise :class:`BadInput` unless ``indices``/``weights`` route the rows of ``x``
    to ``n_experts`` experts: ``x`` is ``[tokens, hidden]``; ``indices`` (integers)
    and ``weights`` (floats) are both ``[tokens, topk]``; every index names an
    expert or is -1 (DeepEP's "no expert": the slot contributes nothing, its weight is
    not read), no token names one expert twice, and every other weight is finite.

    The arguments' types and shapes are checked here, with messages naming the argument;
    the entries by the dataplane's own rule (``dp_routing_pack`` through cffi), so this
    accepts exactly the routings the dataplane accepts."""
    check_routing_arguments(x, indices, weights, n_experts)
    if x.shape[0]:  # an empty batch has no entries to judge (and no table: forward skips it)
        routing_table.pack(indices, weights, n_experts)  # the dataplane's rule (dp_routing_pack)


def check_routing_arguments(
    x: np.ndarray, indices: np.ndarray, weights: np.ndarray, n_experts: int
) -> None:
    """The part of :func:`check_routing` that is about the arguments, not their entries:
    what a routed submit checks before it packs the table into the slot by the C rule."""
    if not isinstance(x, np.ndarray) or x.ndim != 2:
        got = x.shape if isinstance(x, np.ndarray) else type(x).__name__
        raise BadInput(
            f"x must be a [tokens, hidden] numpy array, got {got}; reshape it to (-1, hidden)"
        )
    tokens = x.shape[0]
    if not isinstance(n_experts, int | np.integer) or n_experts < 1:
        raise BadInput(f"n_experts must be a positive integer, got {n_experts!r}")
    # dtype.kind "iu": np.issubdtype(dtype, np.integer), without its cost on every submit
    if not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu":
        what = indices.dtype if isinstance(indices, np.ndarray) else type(indices).__name__
        raise BadInput(
            f"routing indices must be a numpy array of integers, got {what}; "
            "pass the expert ids the gate returned (int32 or int64)"
        )
    if not isinstance(weights, np.ndarray) or not is_float_dtype(weights.dtype):
        what = weights.dtype if isinstance(weights, np.ndarray) else type(weights).__name__
        raise BadInput(
            f"routing weights must be a numpy array of floats, got {what}; "
            "pass the weights the gate returned (float32)"
        )
    if indices.ndim != 2 or indices.shape[0] != tokens or indices.shape[1] < 1:
        raise BadInput(
            f"routing indices have shape {indices.shape} but x has {tokens} tokens: "
            f"pass one row of expert ids per row of x, shape ({tokens}, topk) with topk >= 1"
        )
    if weights.shape != indices.shape:
        raise BadInput(
            f"routing weights have shape {weights.shape} but indices have {indices.shape}: "
            "pass one weight per expert id"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Gate:
    """DeepSeek-V3's router: ``gate(x)`` gives a :class:`Routing` ``(indices, weights)``,
    both ``[tokens, topk]``, which ``routing=`` takes as it is.

    - scores: ``softmax`` or ``sigmoid`` of ``x @ weight.T``;
    - ``bias`` (``[n_experts]``) is added to the scores to choose experts, never to weigh them;
    - with ``groups > 1`` the experts are cut into ``groups`` equal runs; a group's score is
      the sum of its two best (biased) scores when there is a bias, else its best score;
      only the ``topk_groups`` best groups may be chosen from;
    - the ``topk`` best remaining experts are chosen, best first;
    - their weights are their unbiased scores, normalised to sum 1 for ``sigmoid``, times
      ``route_scale``.

    Scores are computed in float64 from float32 logits and returned as float32 weights
    and int32 indices. Equal scores are chosen lowest expert id first (torch.topk leaves
    the order of ties unspecified). The weight is converted to float32 once, when the
    gate is made (a float16 or bf16 gate costs what a float32 one does per call): change
    a gate's weight by making a new gate (``dataclasses.replace``), not in place.
    """

    weight: np.ndarray  # [n_experts, hidden]
    bias: np.ndarray | None = None  # [n_experts]
    _: dataclasses.KW_ONLY
    score: str = "softmax"
    groups: int = 1
    topk_groups: int = 1
    topk: int
    route_scale: float = 1.0

    def __post_init__(self) -> None:
        w = self.weight
        if not isinstance(w, np.ndarray) or w.ndim != 2 or min(w.shape) < 1:
            got = w.shape if isinstance(w, np.ndarray) else type(w).__name__
            raise BadInput(f"Gate.weight must be a [n_experts, hidden] numpy array, got {got}")
        if not is_float_dtype(w.dtype):  # bfloat16 too, as DeepSeek-V3's checkpoint holds it
            raise BadInput(f"Gate.weight must hold floats, got {w.dtype}")
        # the float32 weight the logits are computed with, converted once here: a bf16 or
        # float16 weight converted per call cost 3.3-4.3 ms at DeepSeek-V3's shape, 10-15x
        # the matmul itself (issue 29); a float32 weight is used as it is, not copied
        object.__setattr__(self, "_weight32", np.ascontiguousarray(w, dtype=np.float32))
        n = w.shape[0]
        if self.bias is not None:
            b = self.bias
            if not isinstance(b, np.ndarray) or b.shape != (n,):
                got = b.shape if isinstance(b, np.ndarray) else type(b).__name__
                raise BadInput(f"Gate.bias must have shape ({n},), one per expert, got {got}")
            if not is_float_dtype(b.dtype):
                raise BadInput(f"Gate.bias must hold floats, got {b.dtype}")
            object.__setattr__(self, "_bias64", b.astype(np.float64))  # once, as the weight
        if self.score not in SCORES:
            raise BadInput(f"Gate.score must be one of {SCORES}, got {self.score!r}")
        for name in ("groups", "topk_groups", "topk"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise BadInput(f"Gate.{name} must be a positive integer, got {v!r}")
        if n % self.groups:
            raise BadInput(
                f"Gate.groups={self.groups} does not divide the {n} experts into equal groups"
            )
        if self.topk_groups > self.groups:
            raise BadInput(f"Gate.topk_groups={self.topk_groups} exceeds Gate.groups={self.groups}")
        per_group = n // self.groups
        if self.groups > 1 and self.bias is not None and per_group < 2:
            raise BadInput(
                f"with a bias a group scores its two best experts, but groups={self.groups} "
                f"leaves {per_group} expert per group; use fewer groups"
            )
        reachable = self.topk_groups * per_group
        if self.topk > reachable:
            raise BadInput(
                f"Gate.topk={self.topk} exceeds the {reachable} experts of the "
                f"{self.topk_groups} kept group(s) of {per_group}; lower topk or keep more groups"
            )
        scale = self.route_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float | np.integer | np.floating)
            or not (math.isfinite(scale) and scale > 0)
        ):
            raise BadInput(f"Gate.route_scale must be a positive finite number, got {scale!r}")

    @property
    def n_experts(self) -> int:
        return int(self.weight.shape[0])

    @property
    def hidden(self) -> int:
        return int(self.weight.shape[1])

    def __call__(self, x: np.ndarray) -> Routing:
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != self.hidden:
            got = x.shape if isinstance(x, np.ndarray) else type(x).__name__
            raise BadInput(
                f"the gate takes x of shape (tokens, {self.hidden}), got {got}; "
                f"reshape it to (-1, {self.hidden})"
            )
        tokens, n = x.shape[0], self.n_experts
        logits = x.astype(np.float32, copy=False) @ self._weight32.T
        logits = logits.astype(np.float64)
        if self.score == "softmax":
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = e / e.sum(axis=1, keepdims=True)
        else:
            with np.errstate(over="ignore"):  # exp(-logit) -> inf gives the right 0
                scores = 1.0 / (1.0 + np.exp(-logits))
        chooser = scores if self.bias is None else scores + self._bias64
        if self.groups > 1:
            by_group = chooser.reshape(tokens, self.groups, n // self.groups)
            if self.bias is None:
                group_scores = by_group.max(axis=2)
            else:
                group_scores = np.sort(by_group, axis=2)[:, :, -2:].sum(axis=2)
            kept = _top(group_scores, self.topk_groups)
            dropped = np.ones((tokens, self.groups), dtype=bool)
            np.put_along_axis(dropped, kept, False, axis=1)
            # DeepSeek-V3 masks in place, and without a bias its scores and original scores
            # are one tensor; no weight is read from a dropped group, so a copy is the same
            chooser = np.where(dropped[:, :, None], -np.inf, by_group).reshape(tokens, n)
        indices = _top(chooser, self.topk)
        weights = np.take_along_axis(scores, indices, axis=1)
        if self.score == "sigmoid":
            weights = weights / weights.sum(axis=1, keepdims=True)
        weights = weights * self.route_scale
        return Routing.of_gate(
            indices.astype(np.int32, order="C"), weights.astype(np.float32, order="C")
        )

    @classmethod
    def random(
        cls,
        n_experts: int,
        hidden: int,
        *,
        topk: int,
        score: str = "softmax",
        groups: int = 1,
        topk_groups: int = 1,
        route_scale: float = 1.0,
        bias: bool = False,
        dtype=np.float32,
        seed: int = 0,
    ) -> Gate:
        """A gate with random parameters. ``x @ weight.T`` has unit variance for unit
        inputs; the bias is a tenth of that, enough to change which experts win."""
        rng = np.random.default_rng(seed)
        return cls(
            (rng.standard_normal((n_experts, hidden)) / math.sqrt(hidden)).astype(dtype),
            (rng.standard_normal(n_experts) * 0.1).astype(np.float32) if bias else None,
            score=score,
            groups=groups,
            topk_groups=topk_groups,
            topk=topk,
            route_scale=route_scale,
        )

    @classmethod
    def deepseek_v3(cls, hidden: int = 7168, *, seed: int = 0) -> Gate:
        """A random gate of DeepSeek-V3's shape (configs/config_671B.json): 256 experts,
        8 groups, 4 kept, 8 per token, sigmoid with a bias, route scale 2.5."""
        return cls.random(
            256,
            hidden,
            topk=8,
            score="sigmoid",
            groups=8,
            topk_groups=4,
            route_scale=2.5,
            bias=True,
            seed=seed,
        )


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the column indices of the ``k`` largest values, largest first; equal
    values lowest column first (a stable sort of the negated values)."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k]


@dataclasses.dataclass(frozen=True, eq=False)
class MoeMlp:
    """A routed layer: ``experts`` (SwiGLU MLPs of one shape and dtype, as DeepSeek-V3's)
    and an optional ``shared`` expert every token passes through. The shared expert
    has the experts' hidden size and dtype; its FFN width may differ (DeepSeek-V3's is
    ``n_shared_experts * moe_inter_dim``).

    ``shared_ducks``: the ducks the shared expert is sharded over (distinct ids, each a
    duck of the layer; checked at load). A token goes to its routed ducks and these, no
    other. None: as few ducks as its bytes and the bank limit need, one per NIC
    (``load_weights``' default, :func:`duckpipe.client.weights.default_shared_ducks`).
    A sequence of sets (``[[0, 1], [2, 3]]``: up to 8) replicates the shared expert: each
    set holds all of it, a forward uses one whose ducks are all live (the dataplane takes
    them in turn), so losing a duck of one set still serves."""

    experts: Sequence[SwiGluMlp]
    shared: SwiGluMlp | None = None
    shared_ducks: Sequence[int] | Sequence[Sequence[int]] | None = None

    def __post_init__(self) -> None:
        experts = self.experts
        if isinstance(experts, SwiGluMlp) or not isinstance(experts, Sequence):
            raise BadInput(
                f"MoeMlp.experts must be a sequence of SwiGluMlp, got {type(experts).__name__}; "
                "wrap a single expert in a list"
            )
        experts = tuple(experts)
        object.__setattr__(self, "experts", experts)  # frozen: nobody swaps an expert later
        if not experts:
            raise BadInput("MoeMlp needs at least one expert")
        for i, e in enumerate(experts):
            if not isinstance(e, SwiGluMlp):
                raise BadInput(
                    f"MoeMlp expert {i} is a {type(e).__name__}; every expert must be a "
                    "SwiGluMlp (DeepSeek-V3's experts are SwiGLU)"
                )
        first = experts[0]
        for i, e in enumerate(experts[1:], start=1):
            if (e.hidden, e.ffn) != (first.hidden, first.ffn):
                raise BadInput(
                    f"MoeMlp expert {i} has hidden {e.hidden}, ffn {e.ffn} but expert 0 has "
                    f"hidden {first.hidden}, ffn {first.ffn}: all experts must share one shape"
                )
            if e.dtype != first.dtype or e.weight_dtype != first.weight_dtype:
                raise BadInput(
                    f"MoeMlp expert {i} holds {e.dtype} but expert 0 holds {first.dtype}: "
                    "all experts must share one dtype; convert them before building the layer"
                )
        s = self.shared
        if s is not None:
            if not isinstance(s, SwiGluMlp):
                raise BadInput(
                    f"MoeMlp.shared is a {type(s).__name__}; the shared expert must be a SwiGluMlp"
                )
            if s.hidden != first.hidden:
                raise BadInput(
                    f"MoeMlp.shared has hidden {s.hidden} but the experts have {first.hidden}"
                )
            if s.dtype != first.dtype or s.weight_dtype != first.weight_dtype:
                raise BadInput(
                    f"MoeMlp.shared holds {s.dtype} but the experts hold {first.dtype}: "
                    "the layer has one dtype"
                )
        self._check_shared_ducks()

    def _check_shared_ducks(self) -> None:
        """shared_ducks, if given: a non-empty sequence of distinct duck ids, with a shared
        expert to shard (whether the ducks exist is the load's question)."""
        sd = self.shared_ducks
        if sd is None:
            return
        if self.shared is None:
            raise BadInput(
                "MoeMlp.shared_ducks places the shared expert, but the layer has none: "
                "pass shared= too, or leave shared_ducks out"
            )
        if isinstance(sd, str | bytes) or not isinstance(sd, Sequence | np.ndarray):
            raise BadInput(
                f"MoeMlp.shared_ducks must be a sequence of duck ids, not {type(sd).__name__}"
            )
        nested = len(sd) > 0 and all(
            isinstance(x, Sequence | np.ndarray) and not isinstance(x, str | bytes) for x in sd
        )
        sets = [list(x) for x in sd] if nested else [list(sd)]
        if len(sets) > MAX_REPLICAS:
            raise BadInput(
                f"MoeMlp.shared_ducks gives {len(sets)} sets: the shared expert has 1.."
                f"{MAX_REPLICAS} replicas"
            )
        flat = [d for ds in sets for d in ds]
        if any(isinstance(d, bool) or not isinstance(d, int | np.integer) for d in flat):
            raise BadInput(f"MoeMlp.shared_ducks is {list(sd)!r}: duck ids are integers")
        ids = tuple(int(d) for d in flat)
        if not ids or not all(sets):
            raise BadInput(
                "MoeMlp.shared_ducks is empty: name at least one duck to hold the shared "
                "expert (in each set), or leave it out (None) for the default set"
            )
        if len(set(ids)) != len(ids):
            twice = sorted({d for d in ids if ids.count(d) > 1})
            raise BadInput(
                f"MoeMlp.shared_ducks names ducks {twice} more than once: list each duck once"
            )
        value = tuple(tuple(int(d) for d in ds) for ds in sets) if nested else ids
        object.__setattr__(self, "shared_ducks", value)

    @property
    def shared_sets(self) -> list[list[int]] | None:
        """shared_ducks as its sets (one set when it is a plain list); None: the default."""
        sd = self.shared_ducks
        if sd is None:
            return None
        if sd and isinstance(sd[0], tuple):
            return [list(ds) for ds in sd]  # type: ignore[arg-type]
        return [list(sd)]  # type: ignore[arg-type]

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    @property
    def hidden(self) -> int:
        return self.experts[0].hidden

    @property
    def ffn(self) -> int:
        """One routed expert's FFN width."""
        return self.experts[0].ffn

    @property
    def dtype(self) -> np.dtype:
        return self.experts[0].dtype

    def reference(self, x: np.ndarray, indices: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The whole layer on the host, float32 accumulation, in x's dtype."""
        check_routing(x, indices, weights, self.n_experts)
        if x.shape[1] != self.hidden:
            raise BadInput(f"x has hidden {x.shape[1]} but the layer's experts have {self.hidden}")
        dtype_code(x.dtype)
        xf = x.astype(np.float32)
        wf = weights.astype(np.float32)
        out = np.zeros_like(xf)
        for e in np.unique(indices[indices >= 0]):  # -1: no expert, the slot adds nothing
            # each token names an expert at most once (check_routing), so rows are distinct
            rows, slots = np.nonzero(indices == e)
            out[rows] += self.experts[e].reference(xf[rows]) * wf[rows, slots, None]
        if self.shared is not None:
            out += self.shared.reference(xf)
        return out.astype(x.dtype)

    @classmethod
    def random(
        cls,
        n_experts: int,
        hidden: int,
        intermediate: int,
        *,
        shared: bool = True,
        dtype=np.float32,
        seed: int = 0,
    ) -> MoeMlp:
        """``n_experts`` random SwiGLU experts ``[hidden -> intermediate -> hidden]`` and,
        with ``shared``, a shared expert of the same shape; every one has its own seed."""
        seeds = np.random.default_rng(seed).integers(2**63, size=n_experts + 1)
        mlps = [SwiGluMlp.random(hidden, intermediate, dtype, int(s)) for s in seeds]
        return cls(experts=mlps[:n_experts], shared=mlps[n_experts] if shared else None)
