"""The control plane's rules, the C dataplane's own (``dataplane/include/dp_ctl_rules.h``):
who may take a client slot, what a LoadWeights may ask, what it weighs and the quota it
is held to. The mock dataplane decides with these, so a client hears the same refusal,
word for word, from either dataplane (``tests/hostile/test_control_verdicts.py``).

Each check returns None, or the ``Refusal`` (the Error reply's code and message) the C
control agent would send.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..schema import control as ctl
from ..schema.abi import MAX_DUCKS
from ..schema.control import ErrorCode
from . import ffi, lib, text

__all__ = [
    "Refusal",
    "attach_refusal",
    "load_refusal",
    "load_request",
    "moe_plan",
    "plan_bytes",
    "quota_refusal",
    "state_bytes",
    "topology",
]


@dataclasses.dataclass(frozen=True)
class Refusal:
    """An Error reply: its code and message; ``quota`` when it counts as quota_refused."""

    code: ErrorCode
    message: str
    quota: bool = False


def _why() -> Any:
    return ffi.new("char[]", lib.DP_CTL_WHY_LEN)


def _refusal(code: int, why: Any, quota: bool = False) -> Refusal | None:
    return Refusal(ErrorCode(code), text(why), quota) if code else None


def attach_refusal(
    *,
    pid: int,
    uid: int,
    admin: bool,
    taken: int,
    of_pid: int,
    of_uid: int,
    not_admin: int,
    client_max_per_pid: int,
    client_max_per_uid: int,
    admin_reserved_clients: int,
) -> Refusal | None:
    """Why this peer may not take a client slot (dp_attach_admit), or None. The counts are
    the client table's: slots taken, this pid's, this uid's, and users' other than the
    admin's."""
    census = ffi.new(
        "struct dp_attach_census *",
        {
            "pid": pid,
            "uid": uid,
            "admin": admin,
            "taken": taken,
            "of_pid": of_pid,
            "of_uid": of_uid,
            "not_admin": not_admin,
        },
    )
    lim = ffi.new(
        "struct dp_attach_limits *",
        {
            "client_max_per_pid": client_max_per_pid,
            "client_max_per_uid": client_max_per_uid,
            "admin_reserved_clients": admin_reserved_clients,
        },
    )
    quota, why = ffi.new("bool *"), _why()
    code = lib.dp_attach_admit(census, lim, quota, why, lib.DP_CTL_WHY_LEN)
    return _refusal(code, why, bool(quota[0]))


def load_request(msg: ctl.LoadWeights) -> Any:
    """The request as the C decoder hands it to the rules (``struct dp_ctl_load_weights *``).
    The schema bounds every list; a longer one (a message msgspec let through unchecked)
    is cut to the C struct's room, as no such message reaches the C rules."""
    m = ffi.new("struct dp_ctl_load_weights *")
    m.req_id = msg.req_id
    m.layer = msg.layer
    m.kind = int(msg.kind)
    m.dtype = int(msg.dtype)
    m.hidden = msg.hidden
    m.ffn = msg.ffn
    m.has_b_down = msg.has_b_down
    m.shared = msg.shared
    m.expert_ffn = msg.expert_ffn
    m.weight_dtype = msg.weight_dtype
    for name in (
        "ducks",
        "shard_sizes",
        "expert_replicas",
        "expert_ducks",
        "shared_ducks",
        "shared_sets",
    ):
        values = list(getattr(msg, name))[: len(getattr(m, name))]
        getattr(m, name)[0 : len(values)] = values
        setattr(m, f"{name}_len", len(values))
    return m


def topology(ducks: int) -> Any:
    """The duck index (``int16_t[MAX_DUCKS]``, -1: no such duck) of ducks 0..ducks-1."""
    index = ffi.new(f"int16_t[{MAX_DUCKS}]", [-1] * MAX_DUCKS)
    for d in range(min(ducks, MAX_DUCKS)):
        index[d] = d
    return index


def load_refusal(req: Any, *, max_hidden: int, max_ffn: int, topology: Any) -> Refusal | None:
    """A LoadWeights' bounds, shards and ducks (dp_load_check), before anything is made."""
    lim = ffi.new("struct dp_load_limits *", {"max_hidden": max_hidden, "max_ffn": max_ffn})
    why = _why()
    return _refusal(lib.dp_load_check(req, lim, topology, why, lib.DP_CTL_WHY_LEN), why)


def moe_plan(req: Any) -> tuple[Any, Refusal | None]:
    """A layer's MoE fields (dp_load_moe_plan): for a MOE layer its placement and banks,
    checked, as ``struct dp_layer_moe *``; None for a dense one; and the Refusal, if any."""
    moe = ffi.new("struct dp_layer_moe *") if req.kind == lib.DP_MLP_KIND_MOE else None
    why = _why()
    code = lib.dp_load_moe_plan(req, moe if moe is not None else ffi.NULL, why, lib.DP_CTL_WHY_LEN)
    return (None, _refusal(code, why)) if code else (moe, None)


def plan_bytes(req: Any) -> int:
    """What the layer weighs against its owner's client_max_weight_bytes (dp_load_plan_bytes)."""
    return int(lib.dp_load_plan_bytes(req))


def state_bytes(req: Any) -> int:
    """Of those, what the dataplane holds besides the weights (MoE placement and state)."""
    return int(lib.dp_load_state_bytes(req))


def quota_refusal(
    req: Any,
    *,
    nlayers: int,
    held: int,
    retired: int,
    max_layers: int,
    max_bytes: int,
    weight_bytes: int,
) -> Refusal | None:
    """The owner's quota with this load added (dp_load_quota_check): ``nlayers`` and
    ``held`` bytes it holds besides the layer this one replaces, ``retired`` of them not
    freed yet."""
    h = ffi.new(
        "struct dp_load_holding *",
        {
            "nlayers": nlayers,
            "bytes": held,
            "retired": retired,
            "max_layers": max_layers,
            "max_bytes": max_bytes,
        },
    )
    why = _why()
    code = lib.dp_load_quota_check(req, h, weight_bytes, why, lib.DP_CTL_WHY_LEN)
    return _refusal(code, why, quota=True)
