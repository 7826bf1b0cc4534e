#!/usr/bin/env python3
"""UDP GRO on the socket backend's receive, A/B against the C floor in one run.

    tools/gro_ab.py [--ducks 8 16 24 32] [--rounds 5] [--iters 150] [--base-binary PATH]

For each duck count one ``duckpipe-ducks --compute echo`` process (on CPU 1, as ``duckpipe
bench forward``) and, in each round, in an order that turns round by round: the C floor
(``duckpipe-floor``: sendmmsg/recvmmsg), the C GSO loop, duckpipe with ``gro = false``,
duckpipe with ``gro = true`` (the default), and with ``--base-binary`` the dataplane of
another build (the base commit's). One row, 1 x hidden float32, ``wait=block``. Printed:
per variant the median over rounds of its p50 / that round's floor p50 (the ratio the
issue sets its goal in), the median p50, and the median host CPU per forward.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from duckpipe.bench import baselines
from duckpipe.bench.common import DUCKS_CPU, percentiles_us, pin, pin_self
from duckpipe.bench.forward import run_duckpipe
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.ducks import DucksProcess
from duckpipe.launch.topology import Duck, Nic, Topology


def _topology(ducks: list[tuple[int, int]], gro: bool) -> Topology:
    return Topology(
        nics=[
            Nic(
                name="lo0",
                host_ip="127.0.0.1",
                host_port=free_udp_ports(1),
                ducks=[Duck(id=i, ip="127.0.0.1", port=p) for i, p in ducks],
                rcvbuf=64 << 20,  # as duckpipe bench forward
                gro=gro,
            )
        ],
        max_forward_bytes=1 << 20,
    )


def _duckpipe(
    ducks: list[tuple[int, int]], hidden: int, iters: int, gro: bool, binary: Path | None
) -> baselines.Samples:
    topo = _topology(ducks, gro)
    if binary is None:
        r = run_duckpipe(ducks, hidden, 1, ("block",), iters=iters, warmup=iters // 10,
                         topology=topo)  # fmt: skip
        return r["duckpipe_block"]
    # another build's dataplane: DataplaneProcess(binary=...) through the same loop
    import duckpipe.bench.forward as fwd

    real = fwd.DataplaneProcess
    fwd.DataplaneProcess = lambda t, **kw: real(t, binary=binary, **kw)  # type: ignore[assignment,misc]
    try:
        r = run_duckpipe(ducks, hidden, 1, ("block",), iters=iters, warmup=iters // 10,
                         topology=topo)  # fmt: skip
    finally:
        fwd.DataplaneProcess = real  # type: ignore[misc]
    return r["duckpipe_block"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ducks", type=int, nargs="+", default=[8, 16, 24, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--base-binary", type=Path, default=None)
    ap.add_argument("--duck-args", nargs="*", default=[], help="more duckpipe-ducks options")
    a = ap.parse_args(argv)
    _, pinning = pin_self()
    print(f"# gro A/B: {pinning}; ducks {a.duck_args}; load average {os.getloadavg()}",
          file=sys.stderr)  # fmt: skip
    variants = ["c_gso", "gro_off", "gro_on"] + (["base"] if a.base_binary else [])
    print("| ducks | variant | p50 / floor p50 (median of rounds) | min..max | p50 µs | "
          "host CPU / fwd µs | NACKs / fwd | lost |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in a.ducks:
        ratios: dict[str, list[float]] = {v: [] for v in variants}
        p50s: dict[str, list[float]] = {v: [] for v in ["floor", *variants]}
        cpus: dict[str, list[float]] = {v: [] for v in ["floor", *variants]}
        lost: dict[str, int] = {v: 0 for v in ["floor", *variants]}
        nacks: dict[str, list[float]] = {v: [0.0] for v in ["floor", *variants]}
        args = ["--compute", "echo", *a.duck_args]
        with DucksProcess(ducks=n, base_port=free_udp_ports(n), args=args) as dk:
            pin(dk.pid, DUCKS_CPU)
            ducks = [(i, p) for i, _, p in dk.addresses]
            for rnd in range(a.rounds):
                order = ["floor", *variants]
                k = rnd % len(order)
                order = order[k:] + order[:k]  # each variant goes first in turn
                got: dict[str, float] = {}
                for v in order:
                    if v in ("floor", "c_gso"):
                        s = baselines.run_floor(ducks, a.hidden * 4, 1, iters=a.iters,
                                                warmup=a.iters // 10, gso=v == "c_gso")  # fmt: skip
                    else:
                        s = _duckpipe(ducks, a.hidden, a.iters, v == "gro_on",
                                      a.base_binary if v == "base" else None)  # fmt: skip
                    got[v] = percentiles_us([x.e2e for x in s.samples])[0]
                    cpus[v].append(s.cpu_s / max(1, s.forwards) * 1e6)
                    lost[v] += sum(x.lost for x in s.samples)
                    if s.counters:
                        nacks[v].append(s.counters.get("nacks_sent", 0) / max(1, s.forwards))
                for v in variants:
                    ratios[v].append(got[v] / got["floor"])
                for v, p in got.items():
                    p50s[v].append(p)
                line = ", ".join(f"{v} {got[v]:.0f}" for v in ["floor", *variants])
                load = os.getloadavg()[0]
                print(f"# {n} ducks round {rnd}: {line}; load {load:.2f}", file=sys.stderr,
                      flush=True)  # fmt: skip
        for v in ["floor", *variants]:
            r = ratios.get(v, [1.0] * a.rounds)
            print(f"| {n} | {v} | {statistics.median(r):.2f} | {min(r):.2f}..{max(r):.2f} | "
                  f"{statistics.median(p50s[v]):.0f} | {statistics.median(cpus[v]):.0f} | "
                  f"{statistics.median(nacks[v][1:] or [0.0]):.2f} | {lost[v]} |",
                  flush=True)  # fmt: skip
    print(f"# done; load average {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    rc = main()
    print(f"# {time.monotonic() - t0:.0f} s", file=sys.stderr)
    sys.exit(rc)
