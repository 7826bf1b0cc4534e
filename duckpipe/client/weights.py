"""Weight loading: shard an MLP over ducks and stream the shards through slots.

The dataplane is told the plan (``LoadWeights``: kind, sizes, which duck holds
which rows), then every shard tensor is cut into slot-sized chunks, each one a
``WEIGHT_CHUNK`` descriptor on the client's submission ring, and a final
``WEIGHT_COMMIT`` makes the layer usable once every chunk has landed. Weights
thus travel through shared memory like activations, never over ZeroMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BadInput, LayerFailed
from ..progress import Progress
from ..schema import control as ctl
from ..schema.abi import B_DOWN_TENSOR, Op, Status
from .models import Mlp, dtype_code, shard_bounds, shard_sizes

if TYPE_CHECKING:
    from .session import Inflight, Session

__all__ = ["load_weights"]


def load_weights(
    session: Session,
    layer: int,
    mlp: Mlp,
    *,
    ducks: Sequence[int] | None,
    progress: bool | Callable[[int, int], None] | None,
    timeout: float,
    shared: bool,
) -> ctl.LayerInfo:
    """Load ``mlp`` as ``layer`` through ``session``; see ``Client.load_weights``.

    Progress counts the bytes the ducks have acknowledged (a chunk's completion comes
    back once every duck it went to has acked it), not the bytes copied into the
    segment. ``progress`` may be a callable ``(acked_bytes, total_bytes)``, called as
    acknowledgements arrive, instead of the bar."""
    session.check_usable()
    if not isinstance(layer, int) or not 0 <= layer <= 0xFFFF_FFFF:
        raise BadInput(f"layer must be an integer in [0, 2**32), not {layer!r}")
    kind = mlp.kind
    dt = mlp.dtype
    code = dtype_code(dt)
    topology = session.request(lambda rid: ctl.GetTopology(req_id=rid))
    assert isinstance(topology, ctl.Topology)
    all_ducks = [d.id for d in topology.ducks]
    chosen = list(all_ducks if ducks is None else ducks)
    if len(set(chosen)) != len(chosen) or not set(chosen) <= set(all_ducks):
        raise BadInput(f"ducks {chosen} must be distinct ids among {all_ducks}")
    sizes = shard_sizes(mlp.ffn, len(chosen))
    session.request(
        lambda rid: ctl.LoadWeights(
            req_id=rid,
            layer=layer,
            kind=int(kind),
            dtype=int(code),
            hidden=mlp.hidden,
            ffn=mlp.ffn,
            ducks=chosen,
            shard_sizes=sizes,
            has_b_down=mlp.b_down is not None,
            shared=shared,
        )
    )
    session.layers.pop(layer, None)  # the remembered LayerInfo, if any, is the old layer's
    pieces = _pieces(mlp, chosen, sizes)
    total = sum(a.nbytes for _, _, a in pieces)
    chunk = session.max_bytes
    recs: list[tuple[int, Inflight]] = []  # (duck, its chunk)
    report = progress if callable(progress) else None
    unacked: list[tuple[Inflight, int]] = []  # chunks whose completion is not in yet
    acked = 0

    def count_acks() -> None:
        nonlocal unacked, acked
        n = sum(size for rec, size in unacked if rec.status is not None)
        if n:
            unacked = [(rec, size) for rec, size in unacked if rec.status is None]
            acked += n
            bar.advance(n)
            if report is not None:
                report(acked, total)

    enabled = False if report is not None else progress
    with Progress(total, f"layer {layer} weights", enabled=enabled) as bar:
        for duck, tensor, arr in pieces:
            raw = arr.reshape(-1).view(np.uint8)
            for off in range(0, raw.size, chunk):
                part = raw[off : off + chunk]
                i = session.take_slot(timeout)
                session.segment.act_bytes(i)[: part.size] = part
                rec = session.push_weight(i, Op.WEIGHT_CHUNK, layer, duck, tensor, off, part.size)
                recs.append((duck, rec))
                unacked.append((rec, part.size))
                session.pump(0)  # take completions already in; frees their slots
                count_acks()
            if _failed(recs):
                break  # the layer is failed already: say so now, not after every chunk
        i = session.take_slot(timeout)
        commit = session.push_weight(i, Op.WEIGHT_COMMIT, layer, 0, 0, 0, 0)
        # the bar follows the acknowledgements still to come; a commit that completes
        # first (a failed load) ends the wait for them
        while unacked and commit.status is None:
            session.wait_done(unacked[0][0], timeout, "block")
            count_acks()
        session.wait_done(commit, timeout, "block")
        for rec, _ in unacked:
            if rec.status is None:
                session.wait_done(rec, timeout, "block")
        count_acks()
    bad = _failed(recs)
    if bad or commit.status != Status.OK:
        session.layers.pop(layer, None)
        for _, rec in bad:
            session.await_zmq(rec, 1.0)  # it carries the reason
        missing = sorted({d for d, _ in bad if d != ctl.HOST_TENSOR_DUCK})
        first = bad[0][1] if bad else commit
        why = first.message or Status(first.status).name
        who = f"ducks {missing} did not acknowledge their weights ({why})" if missing else why
        raise LayerFailed(
            f"loading layer {layer} failed: {who}. The layer is marked failed; "
            f"once the ducks answer (Client.topology() shows which are alive), call "
            f"load_weights({layer}, ...) again",
            status=first.status or 0,
            missing=tuple(missing),
        )
    return session.layer_info(layer)


def _failed(recs: list[tuple[int, Inflight]]) -> list[tuple[int, Inflight]]:
    return [(d, r) for d, r in recs if r.status is not None and r.status != Status.OK]


def _pieces(mlp: Mlp, ducks: list[int], sizes: list[int]) -> list[tuple[int, int, np.ndarray]]:
    """(duck, tensor index, array) for every tensor to send: each duck's shard, then
    b_down (tensor B_DOWN_TENSOR), which the dataplane keeps and adds once, after the
    reduce."""
    pieces: list[tuple[int, int, np.ndarray]] = []
    for duck, (lo, hi) in zip(ducks, shard_bounds(sizes), strict=True):
        pieces += [(duck, t, arr) for t, arr in enumerate(mlp.shard(lo, hi))]
    if mlp.b_down is not None:
        pieces.append((ctl.HOST_TENSOR_DUCK, B_DOWN_TENSOR, np.ascontiguousarray(mlp.b_down)))
    return pieces
