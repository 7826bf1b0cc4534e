"""The mock dataplane's stats segment: the layout of duckpipe/schema/stats.py, from numpy.

One writer (the mock's one thread). Every store is an aligned 64-bit (or narrower) store
into a MAP_SHARED mapping, so a reader sees each value whole; the magic is stored last,
and the file is created under a temporary name and renamed into place, so a reader never
maps a half-built segment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import host
from ..errors import DuckpipeError
from ..observe.stats_reader import (
    PLAN,
    STALE_NS,
    _pid_alive,
    ring_pending,
    stats_path_for,
    views,
)
from ..schema import stats as S
from ..schema.abi import MAX_DUCKS
from ..schema.routing import MAX_EXPERTS, MAX_REPLICAS

__all__ = ["StatsWriter", "check_stats_path"]


def _put(arr: np.ndarray, i: int | tuple[()], text: str) -> None:
    arr[i] = text.encode()[: arr.dtype.itemsize - 1]


@dataclasses.dataclass(eq=False)
class _MoeSlotMem:
    """What the writer keeps of a MoE layer slot, as dp_stats_moe.c's moe_slot_mem: the
    totals at the window's start, and the plan whose placement the slot shows."""

    plan: Any = None
    forwards: int = 0
    tokens: int = 0
    expert: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(MAX_EXPERTS, np.uint64))
    duck: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(MAX_DUCKS, np.uint64))
    busy: bool = False
    shown: bool = False


def _placement(plan: Any) -> tuple[np.ndarray, np.ndarray]:
    """A MoePlan's placement as the segment holds it: replicas[e], ducks[e * R + r]."""
    replicas = np.zeros(MAX_EXPERTS, np.uint8)
    ducks = np.zeros((MAX_EXPERTS, MAX_REPLICAS), np.uint16)
    for e, held in enumerate(plan.ducks_of):
        replicas[e] = len(held)
        ducks[e, : len(held)] = held
    return replicas, ducks.reshape(-1)


def check_stats_path(control: str) -> None:
    """The checks StatsWriter makes of the stats path of ``control`` (its directory ours
    and closed to others; nothing there, or a regular file of ours), made before the
    control socket is bound, as the C dataplane makes them before it binds anything
    (dp_stats_check): a refusal for the run directory names it, whatever holds the
    address. DuckpipeError when refused."""
    path = stats_path_for(control)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    host.check_private_dir(path.parent)
    fd = host.open_own_file(path)
    if fd is not None:
        os.close(fd)


def remove_stale(path: Path) -> bool:
    """Remove the stats segment at ``path`` if its dataplane is gone; False if it lives.
    Anything but a regular file of ours there raises DuckpipeError (a planted FIFO, a
    symlink): never opened blocking, never followed."""
    fd = host.open_own_file(path)
    if fd is None:
        return True
    try:
        if os.fstat(fd).st_size >= PLAN["segment_size"]:
            m = mmap.mmap(fd, PLAN["segment_size"], mmap.MAP_SHARED, mmap.PROT_READ)
            try:
                h = views(m)["header"]
                pid, beat = int(h["pid"]), int(h["heartbeat_ns"])
                del h
            finally:
                m.close()
            if _pid_alive(pid) and pid != os.getpid() and (host.monotonic_ns() - beat <= STALE_NS):
                return False
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)
    return True


class StatsWriter:
    """Creates and writes the stats segment of a mock dataplane."""

    def __init__(self, control: str, nducks: int) -> None:
        self.path = stats_path_for(control)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        host.check_private_dir(self.path.parent)
        if not remove_stale(self.path):
            raise DuckpipeError(
                f"{self.path} belongs to a live dataplane; stop it first or use another endpoint"
            )
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, PLAN["segment_size"])
            self._map = mmap.mmap(
                fd, PLAN["segment_size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        finally:
            os.close(fd)
        self.v = views(self._map)
        self.names = S.COUNTER_NAMES  # the C dataplane's, in its order
        self.bounds = np.array(S.bucket_bounds(), np.uint64)
        v, h = self.v, self.v["header"]
        for i, n in enumerate(self.names):
            _put(v["names"]["name"], i, n)
        _put(v["agents"]["name"], 0, "mock")
        _put(v["nics"]["name"], 0, "mock")
        _put(v["nics"]["backend"], 0, "mock")
        v["nics"]["agent"][0] = 0
        v["nics"]["core"][0] = 0xFFFFFFFF
        v["nics"]["lcore"][0] = 0xFFFFFFFF
        for d in range(nducks):
            v["ducks"]["id"][d] = d
            v["ducks"]["state"][d] = S.DuckState.UP
            _put(v["ducks"]["address"], d, f"mock:{d}")
        v["bounds"]["bounds_ns"] = self.bounds
        h["version_major"] = S.STATS_VERSION_MAJOR
        h["version_minor"] = S.STATS_VERSION_MINOR
        h["header_size"] = S.StatsHeader.__c_size__
        h["segment_size"] = PLAN["segment_size"]
        h["pid"] = os.getpid()
        h["writer_kind"] = S.WriterKind.MOCK
        h["threads"] = S.Threads.SHARED
        h["start_ns"] = time.time_ns()
        h["start_mono_ns"] = host.monotonic_ns()
        for k, off in PLAN.items():
            if k.endswith("_offset"):
                h[k] = off
        h["ncounters"] = len(self.names)
        h["nagents"] = 1
        h["nclients"] = len(v["clients"])
        h["nnics"] = 1
        h["nducks"] = len(v["ducks"])
        h["buckets"] = S.STATS_BUCKETS
        h["nhists"] = S.STATS_NHISTS
        h["moe_layers"] = S.STATS_MOE_LAYERS
        moe = v["moe"]
        moe["layers"], moe["max_experts"] = S.STATS_MOE_LAYERS, MAX_EXPERTS
        moe["window_ns"] = S.STATS_MOE_WINDOW_NS
        h["heartbeat_ns"] = host.monotonic_ns()
        _put(self.v["header"]["control"], (), control)
        h["magic"] = S.STATS_MAGIC  # last: a reader that sees it sees the rest
        os.rename(tmp, self.path)
        self._slots: dict[int, int] = {}  # client id -> slot
        self._generation = 0
        self._moe_mem = [_MoeSlotMem() for _ in range(S.STATS_MOE_LAYERS)]
        self._moe_window_start = host.monotonic_ns()

    # --- the writer's hooks ----------------------------------------------------------

    def tick(self, counters: dict[str, int], epoch: int) -> None:
        """Heartbeat, epoch and the counters (the mock keeps them in a dict, by name)."""
        self.v["agents"]["v"][0, : len(self.names)] = [counters[n] for n in self.names]
        h = self.v["header"]
        h["epoch"] = epoch
        h["heartbeat_ns"] = host.monotonic_ns()

    def client_attached(
        self,
        cid: int,
        pid: int,
        name: str,
        segment: str,
        page_size: int,
        capacity: int,
        slot_count: int,
    ) -> None:
        c = self.v["clients"]
        free = np.flatnonzero(c["state"] == S.StatsClientState.FREE)
        if not len(free):
            return
        i = int(free[0])
        self._slots[cid] = i
        self._generation += 1
        for f in (
            "pending",
            "head",
            "tail",
            "inflight",
            "submits",
            "completions",
            "bytes_in",
            "bytes_out",
            "ring_full",
            "errors",
        ):
            c[f][i] = 0
        c["id"][i], c["pid"][i], c["page_size"][i] = cid, pid, page_size
        c["capacity"][i], c["slot_count"][i] = capacity, slot_count
        c["generation"][i] = self._generation
        _put(c["name"], i, name)
        _put(c["segment"], i, segment)
        c["state"][i] = S.StatsClientState.ATTACHED

    def client_gone(self, cid: int) -> None:
        i = self._slots.pop(cid, None)
        if i is not None:
            self.v["clients"]["state"][i] = S.StatsClientState.FREE

    def client_update(
        self, cid: int, *, head: int, tail: int, inflight: int, submits: int, completions: int
    ) -> None:
        i = self._slots.get(cid)
        if i is None:
            return
        c = self.v["clients"]
        c["head"][i], c["tail"][i], c["inflight"][i] = head, tail, inflight
        c["pending"][i] = ring_pending(head, tail, int(c["capacity"][i]))
        c["submits"][i], c["completions"][i] = submits, completions

    def client_bytes(self, cid: int, bytes_in: int, bytes_out: int, error: bool) -> None:
        i = self._slots.get(cid)
        if i is None:
            return
        c = self.v["clients"]
        c["bytes_in"][i] += bytes_in
        c["bytes_out"][i] += bytes_out
        if error:
            c["errors"][i] += 1

    def _bucket(self, ns: int) -> int:
        return int(np.searchsorted(self.bounds, max(0, ns)))

    def record(self, hist: str, ns: int) -> None:
        k = S.HIST_NAMES.index(hist)
        hs = self.v["hists"]
        hs["counts"][k, self._bucket(ns)] += 1
        hs["sum_ns"][k] += max(0, ns)

    def duck_reply(self, duck: int, ns: int) -> None:
        d = self.v["ducks"]
        d["reply"][duck, self._bucket(ns)] += 1
        d["reply_sum_ns"][duck] += max(0, ns)
        d["last_reply_ns"][duck] = max(0, ns)
        d["replies"][duck] += 1
        d["seen_ns"][duck] = host.monotonic_ns()
        d["state"][duck], d["reason"][duck] = S.DuckState.UP, S.DuckReason.NONE

    def duck_moe(self, duck: int, tokens: int, expert_rows: int) -> None:
        """A routed forward's rows (tokens) and (token, expert) pairs the duck computed."""
        d = self.v["ducks"]
        d["moe_tokens"][duck] += tokens
        d["moe_expert_rows"][duck] += expert_rows

    def duck_failed_over(self, duck: int) -> None:
        """A routed forward resent this silent duck's rows to other replicas (the C
        dataplane: a missed forward that completed, no timeout counted)."""
        d = self.v["ducks"]
        d["moe_failovers"][duck] += 1
        d["missing_chunks"][duck] += 1
        if d["replies"][duck]:
            d["state"][duck], d["reason"][duck] = S.DuckState.LATE, S.DuckReason.MISSED_FORWARD

    def duck_missed(self, duck: int, chunks: int) -> None:
        d = self.v["ducks"]
        d["timeouts"][duck] += 1
        d["missing_chunks"][duck] += chunks
        if d["replies"][duck]:
            d["state"][duck], d["reason"][duck] = S.DuckState.LATE, S.DuckReason.MISSED_FORWARD
        else:
            d["state"][duck], d["reason"][duck] = S.DuckState.LOST, S.DuckReason.NEVER_ANSWERED

    def ducks_dead(self, dead: set[int]) -> list[int]:
        """The ducks the mock was told never answer (``--dead-duck``, ``SetFaults``) are
        lost at once (the mock has no PING to wait on): NEVER_ANSWERED, or SILENT for one
        that replied before; the others are up again. Returns those that just turned lost."""
        d = self.v["ducks"]
        h = self.v["header"]
        newly = []
        for duck in range(int(h["nducks"])):
            if d["state"][duck] == S.DuckState.NONE:
                continue
            if duck in dead:
                reason = S.DuckReason.SILENT if d["replies"][duck] else S.DuckReason.NEVER_ANSWERED
                if d["state"][duck] != S.DuckState.LOST:
                    newly.append(duck)
                d["state"][duck], d["reason"][duck] = S.DuckState.LOST, reason
            elif d["reason"][duck] in (S.DuckReason.NEVER_ANSWERED, S.DuckReason.SILENT):
                d["state"][duck], d["reason"][duck] = S.DuckState.UP, S.DuckReason.NONE
        return newly

    def duck_layers(self, counts: dict[int, int]) -> None:
        d = self.v["ducks"]
        d["layers"][: len(d)] = 0
        for duck, n in counts.items():
            if 0 <= duck < len(d):
                d["layers"][duck] = n

    # --- the MoE region (dp_stats_moe.c's rules) ------------------------------------

    def _seq(self, i: int) -> None:
        """Odd before a rewrite of slot i's window, identity or placement; even after."""
        slots = self.v["moe_layers"]
        slots["seq"][i] = int(slots["seq"][i]) + 1

    def _take_moe_slot(self, i: int, layer: int, plan: Any) -> None:
        slot = self.v["moe_layers"][i : i + 1]
        self._seq(i)
        seq = int(slot["seq"][0])
        slot[0] = np.zeros((), slot.dtype)  # every count 0
        slot["seq"][0] = seq
        slot["layer"][0], slot["n_experts"][0] = layer, plan.n_experts
        slot["replicas"][0], slot["ducks"][0] = _placement(plan)
        slot["state"][0] = S.MoeLayerState.LOADED
        self._seq(i)
        self._moe_mem[i] = _MoeSlotMem(plan=plan)

    def _moe_slot_of(self, layer: int, plan: Any) -> int | None:
        """As dp_stats_moe.c's slot_of: the layer's slot, a free one, or one of a layer
        unloaded since; None when every slot holds a loaded layer."""
        slots = self.v["moe_layers"]
        free = gone = None
        for i in range(S.STATS_MOE_LAYERS):
            state = int(slots["state"][i])
            if state == S.MoeLayerState.FREE:
                free = i if free is None else free
                continue
            if int(slots["layer"][i]) == layer:
                if int(slots["n_experts"][i]) != plan.n_experts:
                    self._take_moe_slot(i, layer, plan)  # another layer under that id
                elif self._moe_mem[i].plan is not plan or state != S.MoeLayerState.LOADED:
                    self._seq(i)
                    slots["replicas"][i], slots["ducks"][i] = _placement(plan)
                    slots["state"][i] = S.MoeLayerState.LOADED
                    self._seq(i)
                    self._moe_mem[i].plan = plan
                return i
            if state == S.MoeLayerState.GONE and gone is None:
                gone = i
        i = free if free is not None else gone
        if i is not None:
            self._take_moe_slot(i, layer, plan)
        return i

    def moe_forward(
        self, layer: int, plan: Any, indices: np.ndarray, duck_entries: dict[int, int]
    ) -> None:
        """A routed forward that went out to ducks: each expert's tokens from its routing's
        ``indices`` [tokens, topk] (-1: no expert, not counted), each duck's (token,
        expert) entries, into the layer's slot (or the untracked counts)."""
        tokens = int(indices.shape[0])
        chosen = indices[indices >= 0]
        counts = np.bincount(chosen, minlength=plan.n_experts).astype(np.uint64)
        i = self._moe_slot_of(layer, plan)
        if i is None:
            moe = self.v["moe"]
            moe["untracked_forwards"] += 1
            moe["untracked_tokens"] += tokens
            moe["untracked_entries"] += len(chosen)
            return
        slots = self.v["moe_layers"]
        slots["expert_tokens"][i, : plan.n_experts] += counts
        slots["forwards"][i] += 1
        slots["tokens"][i] += tokens
        slots["entries"][i] += len(chosen)
        slots["no_expert"][i] += indices.size - len(chosen)
        for duck, n in duck_entries.items():
            slots["duck_rows"][i, duck] += n
        self._moe_mem[i].busy = True

    def moe_tick(self, loaded: dict[int, Any]) -> None:
        """Every stats tick: once STATS_MOE_WINDOW_NS passed, each slot's growth since the
        window began becomes its recent window, and its state and placement follow the
        layers ``loaded`` (layer id -> MoePlan, the ready ones)."""
        now = host.monotonic_ns()
        if now - self._moe_window_start < S.STATS_MOE_WINDOW_NS:
            return
        slots = self.v["moe_layers"]
        for i in np.flatnonzero(slots["state"] != S.MoeLayerState.FREE):
            i = int(i)
            p = self._moe_mem[i]
            n = int(slots["n_experts"][i])
            plan = loaded.get(int(slots["layer"][i]))
            if plan is not None and plan.n_experts != n:
                plan = None
            self._seq(i)
            if plan is not None:
                slots["replicas"][i], slots["ducks"][i] = _placement(plan)
            slots["state"][i] = S.MoeLayerState.LOADED if plan else S.MoeLayerState.GONE
            if p.busy or p.shown:
                now_e = slots["expert_tokens"][i, :n].copy()
                slots["expert_recent"][i, :n] = np.minimum(now_e - p.expert[:n], 0xFFFFFFFF)
                p.expert[:n] = now_e
                now_d = slots["duck_rows"][i].copy()
                slots["duck_recent"][i] = np.minimum(now_d - p.duck, 0xFFFFFFFF)
                p.duck[:] = now_d
            forwards, tokens = int(slots["forwards"][i]), int(slots["tokens"][i])
            slots["recent_forwards"][i] = forwards - p.forwards
            slots["recent_tokens"][i] = tokens - p.tokens
            slots["window_end_ns"][i] = now
            slots["window_ns"][i] = now - self._moe_window_start
            self._seq(i)
            p.forwards, p.tokens = forwards, tokens
            p.shown, p.busy = p.busy, False
            p.plan = plan
        self._moe_window_start = now

    def close(self) -> None:
        """Clean exit: the segment goes with the dataplane."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        del self.v
        self._map.close()
