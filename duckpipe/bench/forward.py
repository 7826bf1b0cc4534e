"""``duckpipe bench forward``: the reference system's path and duckpipe, one table, same ducks.

For every configuration (ducks x activation) one ``duckpipe-ducks --compute echo``
process is started on CPU 1 and every row talks to it: the Python baselines, the
C floor (sendmmsg) and the C GSO loop, then duckpipe through the C dataplane
(socket backend, on CPU 0 with this process) once per wait mode. The bench puts a second
table after it (:mod:`.forward_veth`): the dpdk backend beside the socket backend over a veth
pair.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from ..launch.cluster import free_udp_ports
from ..launch.dataplane import DataplaneProcess
from ..launch.ducks import DucksProcess
from ..launch.topology import Duck, Nic, Topology
from . import baselines
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

__all__ = ["WAIT_MODES", "Config", "configs", "run", "run_duckpipe"]

#: duckpipe.connect(wait=...) modes measured (duckpipe/client/api.py)
WAIT_MODES = ("spin", "hybrid", "block")
FLOOR = "c_mmsg"
#: dataplane counters reported per forward (duckpipe rows; JSON, and scale's table)
COUNTERS = ("nacks_sent", "retransmits", "rx_duplicates", "rx_late", "rxq_overflows", "timeouts")

ROW_LABELS = {
    **baselines.PYTHON_BASELINES,
    "c_mmsg": "C sendmmsg/recvmmsg (the floor)",
    "c_gso": "C UDP GSO sends + recvmmsg",
    **{f"duckpipe_{m}": f"duckpipe, socket backend, wait={m}" for m in WAIT_MODES},
    "duckpipe_block_parked": "duckpipe, socket backend, wait=block, dataplane idle_spin_us=0",
}
#: the extra row's dataplane parks as soon as it is idle: the setting for a client that
#: shares its core with the dataplane (docs/api.md: which mode fits which machine)
PARKED = {"idle_spin_us": 0}

COLUMNS = [
    ("config", "config"),
    ("row", "row"),
    ("p50_us", "p50 µs"),
    ("p99_us", "p99 µs"),
    ("host_overhead_p50_us", "host overhead p50 µs"),
    ("send_spread_p50_us", "send spread p50 µs"),
    ("recv_window_p50_us", "receive window p50 µs"),
    ("duck_compute_sum_p50_us", "Σ duck compute p50 µs"),
    ("cpu_per_forward_us", "host CPU / fwd µs"),
    ("ratio_to_floor", "p50 / floor"),
    ("p99_ratio_to_floor", "p99 / floor p99"),
    ("lost", "lost"),
]

REFERENCE = Table(
    key="reference",
    title="The reference cluster (other hardware: real ducks on their own machines; not this run)",
    columns=[("what", "what"), ("value", "value")],
    rows=[
        {"what": "duck compute per MLP call", "value": "~110 µs"},
        {"what": "host, end to end, 24 ducks", "value": "~546 µs"},
        {"what": "send, large payloads", "value": "~0.48 ms"},
        {"what": "receive, large payloads", "value": "~0.48 ms"},
        # the MoE demo's scale (duckpipe.demo.moe_shape.REFERENCE_DECODE_TOKENS_PER_S)
        {"what": "DeepSeek-V3 decode, the whole model, 32 ducks", "value": "16.17 tokens/s"},
    ],
)


@dataclasses.dataclass(frozen=True)
class Config:
    ducks: int
    rows: int
    hidden: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.hidden * 4

    @property
    def label(self) -> str:
        return f"{self.ducks} ducks, {self.rows}x{self.hidden}"


def configs(size: Size) -> tuple[list[Config], int, int]:
    """(configurations, timed forwards for one-row configs, for large ones)."""
    small = size.pick([1, 4, 8, 16, 24, 32], [1, 4, 8], [1, 2])
    hidden = size.pick(1024, 1024, 256)
    big = size.pick([(8, 8, 7168), (24, 8, 7168)], [(8, 8, 7168)], [(2, 2, 1024)])
    out = [Config(n, 1, hidden) for n in small] + [Config(*b) for b in big]  # type: ignore[union-attr]
    return out, size.pick(400, 200, 5), size.pick(60, 20, 3)  # type: ignore[return-value]


def _topology(ducks: Sequence[tuple[int, int]], nbytes: int, **settings: object) -> Topology:
    return Topology(
        nics=[
            Nic(
                name="lo0",
                host_ip="127.0.0.1",
                host_port=free_udp_ports(1),
                ducks=[Duck(id=i, ip="127.0.0.1", port=p) for i, p in ducks],
                rcvbuf=64 << 20,  # 4 MiB partials from several ducks at once
            )
        ],
        max_forward_bytes=max(1 << 20, nbytes),
        **settings,  # type: ignore[arg-type]
    )


def run_duckpipe(
    ducks: Sequence[tuple[int, int]],
    hidden: int,
    rows: int,
    modes: Sequence[str],
    *,
    iters: int,
    warmup: int,
    timeout: float = 2.0,
    settings: dict[str, object] | None = None,
    suffix: str = "",
    topology: Topology | None = None,
    backend_args: Sequence[str] = (),
) -> dict[str, baselines.Samples]:
    """One C dataplane (socket backend on loopback with topology ``settings``, or the given
    ``topology`` and EAL ``backend_args``) on these ducks; a client per wait mode in turn.
    Rows are named ``duckpipe_<mode><suffix>``."""
    import duckpipe

    nbytes = rows * hidden * 4
    out: dict[str, baselines.Samples] = {}
    slot = max(1 << 16, 1 << (nbytes - 1).bit_length())
    topo = topology or _topology(ducks, nbytes, **(settings or {}))
    with DataplaneProcess(topo, backend_args=backend_args) as dp:
        mlp = duckpipe.SwiGluMlp.random(hidden, 4 * len(ducks), seed=1)
        x = np.random.default_rng(0).standard_normal((rows, hidden)).astype(np.float32)
        for mode in modes:
            with duckpipe.connect(dp.control, wait=mode, slots=4, slot_size=slot) as c:
                c.load_weights(1, mlp, progress=False)
                samples: list[baselines.Sample] = []
                cpu0 = dcpu0 = 0.0
                for k in range(warmup + iters):
                    if k == warmup:
                        cpu0, dcpu0 = cpu_seconds(), task_cpu_seconds(dp.pid)
                    t0 = time.perf_counter_ns()
                    with c.claim(x.shape, x.dtype) as s:
                        s.array[:] = x
                        fwd = c.submit(s, 1)
                    with fwd:
                        lost = 0
                        try:
                            fwd.result(timeout=timeout)
                        except duckpipe.errors.DuckpipeError:
                            lost = len(ducks) - len(fwd.answered)
                        t2 = time.perf_counter_ns()
                        ph = fwd.phases  # the slot header's: no ZeroMQ per forward
                    if k >= warmup:
                        samples.append(
                            baselines.Sample(
                                e2e=t2 - t0,
                                send=ph.send_ns,
                                recv_window=ph.spread_ns,
                                max_compute=ph.duck_compute_max_ns,
                                sum_compute=ph.duck_compute_sum_ns,
                                lost=lost,
                            )
                        )
                    if k == warmup - 1:
                        n0 = c.stats().counters
                cpu = cpu_seconds() - cpu0 + task_cpu_seconds(dp.pid) - dcpu0
                n1 = c.stats().counters
                c.unload_layer(1)
            diff = {k: n1.get(k, 0) - n0.get(k, 0) for k in COUNTERS}
            out[f"duckpipe_{mode}{suffix}"] = baselines.Samples(samples, cpu, iters, diff)
    return out


def summarise(cfg: Config, name: str, r: baselines.Samples) -> dict[str, object]:
    s = r.samples
    p50, p99 = percentiles_us([x.e2e for x in s])
    return {
        "config": cfg.label,
        "ducks": cfg.ducks,
        "rows": cfg.rows,
        "hidden": cfg.hidden,
        "bytes": cfg.nbytes,
        "row": ROW_LABELS[name],
        "name": name,
        "forwards": len(s),
        "p50_us": p50,
        "p99_us": p99,
        "host_overhead_p50_us": percentiles_us([x.e2e - x.max_compute for x in s])[0],
        "send_spread_p50_us": percentiles_us([x.send for x in s])[0],
        "recv_window_p50_us": percentiles_us([x.recv_window for x in s])[0],
        "duck_compute_max_p50_us": percentiles_us([x.max_compute for x in s])[0],
        "duck_compute_sum_p50_us": percentiles_us([x.sum_compute for x in s])[0],
        "cpu_per_forward_us": r.cpu_s / max(1, r.forwards) * 1e6,
        "lost": int(sum(x.lost for x in s)),
        **{f"{k}_per_forward": v / max(1, len(s)) for k, v in r.counters.items()},
    }


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    cfgs, iters_small, iters_big = configs(size)
    per_cfg = len(baselines.PYTHON_BASELINES) + 2 + 2
    prog = Progress("forward", len(cfgs) * per_cfg, quiet=quiet)
    table = Table(key="forward", title="forward: end to end through echo ducks", columns=COLUMNS)
    for cfg in cfgs:
        iters = iters_small if cfg.rows == 1 else iters_big
        warmup = max(2, iters // 10)
        with DucksProcess(
            ducks=cfg.ducks, base_port=free_udp_ports(cfg.ducks), args=["--compute", "echo"]
        ) as dk:
            pin(dk.pid, DUCKS_CPU)
            ducks = [(i, p) for i, _, p in dk.addresses]
            rows: dict[str, dict[str, object]] = {}
            for kind in baselines.PYTHON_BASELINES:
                prog.step(f"{cfg.label}: {ROW_LABELS[kind]} x{iters}")
                r = baselines.run_python(kind, ducks, cfg.nbytes, cfg.rows, iters=iters,
                                         warmup=warmup)  # fmt: skip
                rows[kind] = summarise(cfg, kind, r)
            for name, gso in (("c_mmsg", False), ("c_gso", True)):
                prog.step(f"{cfg.label}: {ROW_LABELS[name]} x{iters}")
                r = baselines.run_floor(ducks, cfg.nbytes, cfg.rows, iters=iters, warmup=warmup,
                                        gso=gso)  # fmt: skip
                rows[name] = summarise(cfg, name, r)
            prog.step(f"{cfg.label}: duckpipe, wait {'/'.join(WAIT_MODES)} x{iters}")
            dp = run_duckpipe(ducks, cfg.hidden, cfg.rows, WAIT_MODES, iters=iters, warmup=warmup)
            prog.step(f"{cfg.label}: {ROW_LABELS['duckpipe_block_parked']} x{iters}")
            dp |= run_duckpipe(ducks, cfg.hidden, cfg.rows, ("block",), iters=iters,
                               warmup=warmup, settings=PARKED, suffix="_parked")  # fmt: skip
            for name, r in dp.items():
                rows[name] = summarise(cfg, name, r)
        floor = rows[FLOOR]
        for row in rows.values():
            row["ratio_to_floor"] = row["p50_us"] / floor["p50_us"]  # type: ignore[operator]
            row["p99_ratio_to_floor"] = row["p99_us"] / floor["p99_us"]  # type: ignore[operator]
            table.rows.append(row)
    table.notes += [
        "Every row of one config talks to the same `duckpipe-ducks --compute echo` process "
        "(all its ducks are one thread on CPU 1: they answer one after another).",
        "host overhead = end to end - the slowest duck's reported compute_ns (reply headers "
        "for the baselines, the forward's phases from its slot header for duckpipe).",
        "send spread: first send → last send returned (duckpipe: the dataplane's send phase). "
        "receive window: first partial datagram in → last one in (duckpipe: its spread_ns, "
        "first duck's reply → last duck's reply).",
        "Σ duck compute: the ducks' own compute added up; the emulator's reply spread is at "
        "least this (one thread computes the ducks in turn); the wire protocol carries no "
        "send timestamps, so the spread itself is not observed.",
        "host CPU / fwd: user+system of this process (getrusage; for duckpipe rows with every "
        "thread of the dataplane, from /proc/<pid>/task/*/schedstat in ns; the floor's own "
        "getrusage for C rows) over the timed forwards.",
        "lost: ducks whose partial was not complete in time, over all forwards (baselines: "
        "0.5 s, no NACKs; duckpipe: the dataplane's 1 s deadline).",
    ]
    return [table, REFERENCE]  # the bench puts forward_veth's table between them
