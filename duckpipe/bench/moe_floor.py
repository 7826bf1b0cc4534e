"""``duckpipe bench moe``'s floor table: duckpipe's routed modes against ``duckpipe-floor
--moe`` (issue 29), in one run, on the same echo ducks and the same routing tables.

Per duck count, one ``duckpipe-ducks --compute echo`` process on CPU 1 and one C dataplane
(socket backend, loopback, on CPU 0 with this process). A layer of DeepSeek-V3's routing
(256 experts, 8 a token, ``Gate.deepseek_v3`` on seeded float16 activations of hidden
7168), the client's default placement (contiguous blocks), no shared expert, experts one
column wide (echo ducks read no weights: what is measured is the host and the wire). Per
batch size, the same ``TABLES`` routings in the same order go through:

- ``floor``: ``duckpipe-floor --moe`` (dataplane/bench/dp_floor_moe.c): pack, split and
  cut each routed duck's table with dp_routing.h, one sendmmsg of UDP GSO messages from
  the activation by iovec, recvmmsg and float32 sums by row map; its getrusage;
- ``broadcast`` / ``unicast`` / ``auto``: ``client.submit(slot, layer, routing=...,
  moe_send=mode)`` from claim to ``result()``; the CPU of this process (getrusage, every
  thread) plus the dataplane's (schedstat), as ``duckpipe bench forward`` counts it.

Per row: p50 and p99 end to end, host CPU per call, wire bytes per token (the floor's own
count; the dataplane's ``moe_bytes`` counter: tables and rows of first sends) against the
minimum (each token's row once to each of its routed ducks, no tables), the ratios to the
floor's row of the same run and size (the issue's targets: p50 <= 1.1x at 1-8 tokens and
<= 1.0x from 64, p99 <= 1.5x, CPU <= 1.5x, wire <= 1.05x the minimum), and where the time
went (a second table: the floor's route and send, the dataplane's phases).
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import DuckpipeError
from ..launch.binaries import find_binary
from ..launch.cluster import free_udp_ports
from ..launch.ducks import DucksProcess
from .common import (
    DUCKS_CPU,
    Progress,
    Size,
    Table,
    cpu_seconds,
    percentiles_us,
    pin,
    task_cpu_seconds,
)

__all__ = ["COLUMNS", "MODES", "PHASE_COLUMNS", "FloorConfig", "floor_config", "ratios", "run"]

N_EXPERTS, TOPK = 256, 8
MODES = ("broadcast", "unicast", "auto")
FLOOR = "floor"
LAYER = 29
TABLES = 8  # routings per batch size, used in turn by both sides
TIMEOUT_S = 5  # a forward's deadline, both sides
ROW_LABELS = {
    FLOOR: "C floor (duckpipe-floor --moe)",
    **{m: f"duckpipe, moe_send={m}" for m in MODES},
}
#: the issue's targets, as ratios to the floor (p50's is 1.0 from 64 tokens)
TARGETS = {"p50_small": 1.1, "p50_large": 1.0, "p99": 1.5, "cpu": 1.5, "wire": 1.05}

COLUMNS = [
    ("config", "config"),
    ("tokens", "tokens"),
    ("row", "row"),
    ("p50_us", "p50 µs"),
    ("p99_us", "p99 µs"),
    ("cpu_per_call_us", "host CPU / call µs"),
    ("wire_bytes_per_token", "wire bytes / token"),
    ("min_bytes_per_token", "minimum / token"),
    ("p50_vs_floor", "p50 / floor"),
    ("p99_vs_floor", "p99 / floor p99"),
    ("cpu_vs_floor", "CPU / floor"),
    ("wire_vs_min", "wire / minimum"),
    ("duck_compute_sum_p50_us", "Σ duck compute p50 µs"),
    ("lost", "lost"),
    ("max_rel_diff", "rel. diff"),
]

PHASE_COLUMNS = [
    ("config", "config"),
    ("tokens", "tokens"),
    ("row", "row"),
    ("submit_p50_us", "claim→submitted p50 µs"),
    ("prepare_p50_us", "prepare p50 µs"),
    ("send_p50_us", "send p50 µs"),
    ("wait_p50_us", "wait p50 µs"),
    ("fetch_p50_us", "fetch p50 µs"),
    ("reduce_p50_us", "reduce p50 µs"),
    ("spread_p50_us", "reply spread p50 µs"),
    ("duck_compute_max_p50_us", "slowest duck p50 µs"),
]
COUNTERS = ("moe_bytes", "moe_broadcasts", "moe_unicasts", "tx_bytes", "tx_packets",
            "nacks_sent", "retransmits", "timeouts")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class FloorConfig:
    ducks: tuple[int, ...]
    tokens: tuple[int, ...]
    hidden: int
    iters: dict[int, int]  # timed calls by batch size, over every round
    rounds: int = 1  # the rows take turns this many times (the load drifts: a ratio of
    # two rows measured minutes apart measures the drift too)

    def per_round(self, tokens: int) -> int:
        return max(1, self.iters[tokens] // self.rounds)

    def label(self, ducks: int) -> str:
        return f"{ducks} ducks, hidden {self.hidden}, top-{TOPK} of {N_EXPERTS}"

    def warmup(self, tokens: int) -> int:
        return max(2, self.per_round(tokens) // 10)


def floor_config(size: Size) -> FloorConfig:
    """Full: the issue's grid; quick: 8 ducks at 1 and 64 tokens (CI: a few seconds);
    smoke: 4 ducks, a narrow row."""
    iters = size.pick({1: 600, 8: 300, 64: 90, 256: 30}, {1: 60, 64: 12}, {1: 3, 8: 3})
    return FloorConfig(
        ducks=size.pick((8, 32), (8,), (4,)),  # type: ignore[arg-type]
        tokens=tuple(iters),  # type: ignore[arg-type]
        hidden=size.pick(7168, 7168, 256),  # type: ignore[arg-type]
        iters=iters,  # type: ignore[arg-type]
        rounds=size.pick(3, 2, 1),  # type: ignore[arg-type]
    )


@dataclasses.dataclass
class Calls:
    """One row's calls: per call end to end and phases (ns), and totals over them."""

    e2e: list[int] = dataclasses.field(default_factory=list)
    phases: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cpu_s: float = 0.0
    wire_bytes: int = 0
    lost: int = 0
    counters: dict[str, int] = dataclasses.field(default_factory=dict)
    max_rel_diff: float = float("nan")

    def add(self, **phases: int) -> None:
        for k, v in phases.items():
            self.phases.setdefault(k, []).append(v)

    def merge(self, o: Calls) -> None:
        """Another round of the same row: its calls after these."""
        self.e2e += o.e2e
        for k, v in o.phases.items():
            self.phases.setdefault(k, []).extend(v)
        self.cpu_s += o.cpu_s
        self.wire_bytes += o.wire_bytes
        self.lost += o.lost
        for k, v in o.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v
        if not self.max_rel_diff >= o.max_rel_diff:  # the worst round's; NaN: none yet
            self.max_rel_diff = o.max_rel_diff


def summarise(label: str, ducks: int, tokens: int, name: str, c: Calls, min_bytes: float):
    """One row of each table (ratios to the floor's row are added by :func:`ratios`)."""
    n = max(1, len(c.e2e))
    p50, p99 = percentiles_us(c.e2e)
    ph = {f"{k}_p50_us": percentiles_us(v)[0] for k, v in c.phases.items()}
    wire = c.wire_bytes / (n * tokens)
    least = min_bytes / (n * tokens)
    return {
        "config": label,
        "ducks": ducks,
        "tokens": tokens,
        "row": ROW_LABELS[name],
        "name": name,
        "calls": len(c.e2e),
        "p50_us": p50,
        "p99_us": p99,
        "cpu_per_call_us": c.cpu_s / n * 1e6,
        "wire_bytes_per_token": wire,
        "min_bytes_per_token": least,
        "wire_vs_min": wire / least if least else float("nan"),
        "lost": c.lost,
        "max_rel_diff": c.max_rel_diff,
        **{k: ph.get(k, float("nan")) for k, _ in PHASE_COLUMNS[3:]},
        "duck_compute_sum_p50_us": ph.get("duck_compute_sum_p50_us", float("nan")),
        **{f"{k}_per_call": v / n for k, v in c.counters.items()},
    }


def ratios(rows: list[dict[str, object]]) -> None:
    """Each row's p50, p99 and CPU over the floor row's of its duck count and batch size."""

    def over(a: object, b: object) -> float:
        return float(a) / float(b) if b else float("nan")  # type: ignore[arg-type]

    floor = {(r["ducks"], r["tokens"]): r for r in rows if r["name"] == FLOOR}
    for r in rows:
        f = floor.get((r["ducks"], r["tokens"]))
        for key, col in (("p50_vs_floor", "p50_us"), ("p99_vs_floor", "p99_us"),
                         ("cpu_vs_floor", "cpu_per_call_us")):  # fmt: skip
            r[key] = over(r[col], f[col]) if f else float("nan")


def minimum_bytes(indices: np.ndarray, placement: np.ndarray, row_bytes: int) -> int:
    """Each token's row once to each distinct duck its experts live on (no tables)."""
    where = placement[indices]  # [tokens, topk]
    s = np.sort(where, axis=1)
    distinct = 1 + (np.diff(s, axis=1) != 0).sum(axis=1)
    return int(distinct.sum()) * row_bytes


def echo_reference(x: np.ndarray, indices: np.ndarray, weights: np.ndarray,
                   placement: np.ndarray) -> np.ndarray:  # fmt: skip
    """What echo ducks make of a routed forward: sum_k w * (duck id + 1) * x, per token."""
    scale = (weights * (placement[indices] + 1)).sum(axis=1, dtype=np.float64)
    return scale[:, None] * x.astype(np.float64)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))


# ----------------------------------------------------------------------- the sides


def run_floor(ports: list[int], hidden: int, tokens: int, routing: Path, iters: int,
              warmup: int) -> Calls:  # fmt: skip
    """``duckpipe-floor --moe`` on the ducks at ``ports`` (ids 0..n-1), float16."""
    cmd = [
        str(find_binary("duckpipe-floor")), "--moe",
        "--ducks", str(len(ports)), "--base-port", str(ports[0]),
        "--hidden", str(hidden), "--tokens", str(tokens),
        "--experts", str(N_EXPERTS), "--topk", str(TOPK), "--dtype", "f16",
        "--routing", str(routing), "--iters", str(iters), "--warmup", str(warmup),
        "--timeout-ms", str(TIMEOUT_S * 1000),
        "--session", str(random.getrandbits(62) | 1),
    ]  # fmt: skip
    budget = 60 + (iters + warmup) * TIMEOUT_S
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, check=False)
    if p.returncode != 0:
        raise DuckpipeError(f"duckpipe-floor --moe failed (exit {p.returncode}): {p.stderr}")
    c = Calls()
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "fwd":
            e2e, send, window, cmax, csum, lost, route = (int(v) for v in f[1:8])
            c.e2e.append(e2e)
            c.lost += lost
            c.add(submit=route, send=send, wait=e2e - route - send, spread=window,
                  duck_compute_max=cmax, duck_compute_sum=csum)  # fmt: skip
        elif f[0] == "bytes":
            c.wire_bytes = int(f[1])
        elif f[0] == "cpu":
            c.cpu_s = int(f[1]) / 1e9
        elif f[0] == "check":
            c.max_rel_diff = float(f[1])
    return c


def run_duckpipe(client, dp_pid: int, mode: str, batches, placement: np.ndarray,
                 iters: int, warmup: int) -> Calls:  # fmt: skip
    """``warmup + iters`` routed calls, call k on batch k % len(batches), as the floor."""
    import duckpipe

    c = Calls()
    n0: dict[str, int] = {}
    cpu0 = dcpu0 = 0.0
    first = None
    for k in range(warmup + iters):
        if k == warmup:
            n0 = client.stats().counters
            cpu0, dcpu0 = cpu_seconds(), task_cpu_seconds(dp_pid)
        x, indices, weights = batches[k % len(batches)]
        t0 = time.perf_counter_ns()
        with client.claim(x.shape, x.dtype) as slot:
            slot.array[:] = x
            fwd = client.submit(slot, LAYER, routing=(indices, weights), moe_send=mode)
        t1 = time.perf_counter_ns()
        with fwd:
            try:
                y = fwd.result(timeout=TIMEOUT_S + 5)
            except duckpipe.errors.DuckpipeError as e:
                raise duckpipe.errors.DuckpipeError(f"bench moe floor, {mode}: {e}") from e
            t2 = time.perf_counter_ns()
            ph = fwd.phases
            if k == warmup:
                first = (y.copy(), k)
        if k >= warmup:
            c.e2e.append(t2 - t0)
            c.add(submit=t1 - t0, prepare=ph.prepare_ns, send=ph.send_ns, wait=ph.wait_ns,
                  fetch=ph.fetch_ns, reduce=ph.reduce_ns, spread=ph.spread_ns,
                  duck_compute_max=ph.duck_compute_max_ns,
                  duck_compute_sum=ph.duck_compute_sum_ns)  # fmt: skip
    c.cpu_s = cpu_seconds() - cpu0 + task_cpu_seconds(dp_pid) - dcpu0
    n1 = client.stats().counters
    c.counters = {k: n1.get(k, 0) - n0.get(k, 0) for k in COUNTERS}
    c.wire_bytes = c.counters["moe_bytes"]
    if first is not None:
        y, k = first
        x, indices, weights = batches[k % len(batches)]
        c.max_rel_diff = _relative(y, echo_reference(x, indices, weights, placement))
    return c


# --------------------------------------------------------------------------- the run


def _batches(hidden: int, tokens: int, gate, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(TABLES):
        x = rng.standard_normal((tokens, hidden), np.float32).astype(np.float16)
        indices, weights = gate(x.astype(np.float32))
        out.append((x, np.ascontiguousarray(indices, np.int32),
                    np.ascontiguousarray(weights, np.float32)))  # fmt: skip
    return out


def _routing_file(path: Path, batches) -> None:
    """int32 ids [R][T][K], then float32 weights [R][T][K]: duckpipe-floor --routing."""
    ids = np.stack([b[1] for b in batches]).astype("<i4")
    ws = np.stack([b[2] for b in batches]).astype("<f4")
    path.write_bytes(ids.tobytes() + ws.tobytes())


def _topology(ports: list[int], nbytes: int):
    from ..launch.topology import Duck, Nic, Topology

    return Topology(
        nics=[
            Nic(
                name="lo0",
                host_ip="127.0.0.1",
                host_port=free_udp_ports(1),
                ducks=[Duck(id=i, ip="127.0.0.1", port=p) for i, p in enumerate(ports)],
                rcvbuf=64 << 20,
            )
        ],
        max_forward_bytes=max(1 << 20, nbytes),
        # a broadcast of 256 tokens to 32 ducks is 117 MB for one emulator thread: the
        # forward after it can wait out the 1 s default on the backlog
        default_timeout_ms=TIMEOUT_S * 1000,
    )


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    import duckpipe
    from duckpipe.moe import Gate, MoeMlp

    from ..launch.dataplane import DataplaneProcess

    cfg = floor_config(size)
    steps = len(cfg.ducks) * (1 + len(cfg.tokens) * cfg.rounds * (1 + len(MODES)))
    prog = Progress("moe floor", steps, quiet=quiet)
    table = Table(key="moe_floor", title="moe_floor: routed forwards against the C floor, "
                  "same echo ducks, same routing", columns=COLUMNS)  # fmt: skip
    phases = Table(key="moe_floor_phases", title="moe_floor_phases: where the time goes "
                   "(p50 of each phase)", columns=PHASE_COLUMNS)  # fmt: skip
    gate = Gate.deepseek_v3(cfg.hidden, seed=2)
    row_bytes = cfg.hidden * 2
    most = max(cfg.tokens)
    # the largest message: a broadcast's table and every row
    nbytes = most * row_bytes + 16 + 8 * (256 + most * TOPK)  # the client's bound: 256 ducks
    slot = 1 << (nbytes + 4096 - 1).bit_length()
    with tempfile.TemporaryDirectory(prefix="duckpipe-bench-moe-") as tmp:
        for ducks in cfg.ducks:
            label = cfg.label(ducks)
            placement = np.array([e * ducks // N_EXPERTS for e in range(N_EXPERTS)])
            moe = MoeMlp.random(N_EXPERTS, cfg.hidden, 1, shared=False, dtype=np.float16,
                                seed=1)  # fmt: skip
            prog.step(f"{label}: echo ducks, a dataplane, the layer")
            with DucksProcess(ducks=ducks, base_port=free_udp_ports(ducks),
                              args=["--compute", "echo"]) as dk:  # fmt: skip
                pin(dk.pid, DUCKS_CPU)
                ports = [p for _, _, p in dk.addresses]
                with (
                    DataplaneProcess(_topology(ports, nbytes)) as dp,
                    duckpipe.connect(
                        dp.control, name="bench-moe-floor", slots=4, slot_size=slot
                    ) as client,
                ):
                    client.load_weights(LAYER, moe, placement=placement.tolist(),
                                        progress=False)  # fmt: skip
                    rows = []
                    for tokens in cfg.tokens:
                        iters, warmup = cfg.per_round(tokens), cfg.warmup(tokens)
                        batches = _batches(cfg.hidden, tokens, gate, seed=tokens)
                        routing = Path(tmp) / f"routing-{ducks}-{tokens}.bin"
                        _routing_file(routing, batches)
                        least = cfg.rounds * sum(
                            minimum_bytes(batches[k % TABLES][1], placement, row_bytes)
                            for k in range(warmup, warmup + iters)
                        )
                        got = {name: Calls() for name in (FLOOR, *MODES)}
                        # untimed, first: the floor measured on ducks that only it had
                        # talked to ran 2-3x slower at 8 tokens x 8 ducks (1 ms to the
                        # first partial) until duckpipe's calls had gone through them
                        run_duckpipe(client, dp.pid, "unicast", batches, placement, 1, warmup)
                        for r in range(cfg.rounds):
                            turn = f"{tokens} token(s), round {r + 1}/{cfg.rounds}"
                            prog.step(f"{label}: {turn}, the floor x{iters}")
                            got[FLOOR].merge(run_floor(ports, cfg.hidden, tokens, routing,
                                                       iters, warmup))  # fmt: skip
                            for mode in MODES:
                                prog.step(f"{label}: {turn}, {mode} x{iters}")
                                got[mode].merge(run_duckpipe(client, dp.pid, mode, batches,
                                                             placement, iters, warmup))  # fmt: skip
                        rows += [summarise(label, ducks, tokens, n, c, least)
                                 for n, c in got.items()]  # fmt: skip
                    ratios(rows)
                    table.rows += rows
                    phases.rows += rows
    table.notes += [
        f"The rows of a size take turns, {cfg.rounds} round(s) of a share of the calls each, "
        "so that the machine's load drifting shows in every row alike.",
        "Every row of a duck count talks to the same `duckpipe-ducks --compute echo` process "
        "on CPU 1 (one thread: its ducks answer one after another, and its echo of a routed "
        "row is a float32 pass per expert: at 64 tokens and more the emulator's Σ compute "
        "sets most of end to end, for the floor and duckpipe alike).",
        "The floor (dataplane/bench/dp_floor_moe.c): the same routing tables in the same "
        "order, dp_routing_pack + dp_routing_split + dp_routing_wire_unicast per call, each "
        "routed duck its table and its rows by iovec in one sendmmsg of UDP GSO messages, "
        "recvmmsg (poll when idle) and float32 sums by row map; no NACKs. duckpipe: claim, "
        "copy the float16 activation in, submit with the routing, result().",
        "host CPU / call: the floor's getrusage; duckpipe: this process (getrusage, every "
        "thread) plus the dataplane's threads (/proc/<pid>/task/*/schedstat).",
        "wire bytes / token: the floor's table and row bytes; duckpipe's moe_bytes counter "
        "(tables and rows of first sends); headers not counted. minimum: each token's "
        "float16 row once to each distinct duck of its experts, no table; broadcast on "
        "loopback has no broadcast address: every routed duck gets every row.",
        f"targets (issue 29): p50 <= {TARGETS['p50_small']}x the floor at 1-8 tokens, <= "
        f"{TARGETS['p50_large']}x from 64; p99 <= {TARGETS['p99']}x; CPU <= {TARGETS['cpu']}x; "
        f"wire <= {TARGETS['wire']}x the minimum.",
        "rel. diff: the first timed call's result against the echo ducks' sum, "
        "max |difference| / max |reference| (the floor: its own check of its last call).",
    ]
    phases.notes += [
        "floor: claim→submitted is its route step (pack, split, per-duck tables, datagram "
        "headers and iovecs); send its sendmmsg; wait from there to the last partial added "
        "(receive and sum inline: no prepare, fetch or reduce of its own). duckpipe: "
        "claim→submitted is the client's claim, copy and submit (routing packed and "
        "checked); prepare, send, wait, fetch, reduce and reply spread are the "
        "dataplane's phases from the slot header.",
    ]
    return [table, phases]
