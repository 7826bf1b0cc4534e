#!/usr/bin/env python3
"""Dataplane variants against the C floor, interleaved round by round (issue 19's measure).

    tools/forward_ab.py --ducks 1 8 --rounds 7 --iters 400 \\
        spin50:idle_spin_us=50 park:idle_spin_us=0 base@/path/to/duckpipe-dataplane:

    tools/forward_ab.py --ducks 8 16 24 32 --c-gso gro_off:gro=false gro_on:gro=true

Each variant is ``NAME[@DATAPLANE_BINARY]:key=value,...``: settings for the C dataplane
(``duckpipe bench forward``'s loopback topology; a key of its one NIC, such as ``gro``,
goes to the NIC) and, after ``@``, another build's dataplane (a worktree at the base
commit, built with meson). For each duck count, one ``duckpipe-ducks --compute echo``
process on CPU 1 and, in each round, the C floor (``duckpipe-floor``), with ``--c-gso`` its
UDP GSO loop too, and every variant, in an order that turns round by round; the bench's
loop (claim, fill, submit, ``result()``, then the per-phase times), one row of
``--hidden`` float32, ``wait=block``, client and dataplane on CPU 0. Printed per variant: the
medians over rounds of p50 / floor p50, p99 / floor p99 and host CPU per forward / the
floor's (every thread of the client and the dataplane, as the bench counts), with min..max
of the p50 ratio, the median p50, p99 and CPU, NACKs sent per forward and ducks lost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import msgspec

import duckpipe.bench.forward as bench_forward
from duckpipe.bench import baselines
from duckpipe.bench.common import DUCKS_CPU, percentiles_us, pin, pin_self
from duckpipe.launch.cluster import free_udp_ports
from duckpipe.launch.ducks import DucksProcess
from duckpipe.launch.topology import Nic


def _variant(spec: str) -> tuple[str, Path | None, dict[str, object]]:
    head, _, body = spec.partition(":")
    name, _, binary = head.partition("@")
    settings: dict[str, object] = {}
    for kv in filter(None, body.split(",")):
        k, _, v = kv.partition("=")
        words = {"true": True, "false": False}
        settings[k] = int(v) if v.lstrip("-").isdigit() else words.get(v, v)
    return name, Path(binary) if binary else None, settings


def _run(ducks, hidden, iters, binary, settings) -> baselines.Samples:  # type: ignore[no-untyped-def]
    nic = {k: v for k, v in settings.items() if k in Nic.__struct_fields__}
    rest = {k: v for k, v in settings.items() if k not in nic}
    topo = bench_forward._topology(ducks, hidden * 4, **rest)
    topo = msgspec.structs.replace(topo, nics=[msgspec.structs.replace(topo.nics[0], **nic)])
    real = bench_forward.DataplaneProcess
    if binary is not None:  # the same loop, another build's dataplane
        bench_forward.DataplaneProcess = lambda t, **kw: real(t, binary=binary, **kw)  # type: ignore[assignment,misc]
    try:
        r = bench_forward.run_duckpipe(ducks, hidden, 1, ("block",), iters=iters,
                                       warmup=iters // 10, topology=topo)  # fmt: skip
    finally:
        bench_forward.DataplaneProcess = real  # type: ignore[misc]
    return r["duckpipe_block"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME[@DATAPLANE_BINARY]:key=value,...")
    ap.add_argument("--ducks", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--c-gso", action="store_true", help="the C floor's UDP GSO loop too")
    ap.add_argument("--duck-args", nargs="*", default=[], help="more duckpipe-ducks options")
    a = ap.parse_args(argv)
    variants = [_variant(s) for s in a.variants]
    names = ["floor", *(["c_gso"] if a.c_gso else []), *(v[0] for v in variants)]
    if len(set(names)) != len(names):
        ap.error(f"variant names must differ from each other and from floor, c_gso: {names}")
    _, pinning = pin_self()
    print(f"# forward A/B: {pinning}; load average {os.getloadavg()}", file=sys.stderr)
    print("| ducks | variant | p50 / floor | min..max | p99 / floor p99 | CPU / floor CPU | "
          "p50 µs | p99 µs | host CPU / fwd µs | NACKs / fwd | lost |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.ducks:
        got: dict[str, dict[str, list[float]]] = {
            v: {"p50": [], "p99": [], "cpu": [], "r50": [], "r99": [], "rcpu": [], "nacks": []}
            for v in names
        }
        lost = dict.fromkeys(names, 0)
        with DucksProcess(ducks=n, base_port=free_udp_ports(n),
                          args=["--compute", "echo", *a.duck_args]) as dk:  # fmt: skip
            pin(dk.pid, DUCKS_CPU)
            ducks = [(i, p) for i, _, p in dk.addresses]
            for rnd in range(a.rounds):
                k = rnd % len(names)
                this: dict[str, tuple[float, float, float]] = {}
                for v in names[k:] + names[:k]:  # each variant goes first in turn
                    if v in ("floor", "c_gso"):
                        s = baselines.run_floor(ducks, a.hidden * 4, 1, iters=a.iters,
                                                warmup=a.iters // 10, gso=v == "c_gso")  # fmt: skip
                    else:
                        _, binary, settings = next(x for x in variants if x[0] == v)
                        s = _run(ducks, a.hidden, a.iters, binary, settings)
                    p50, p99 = percentiles_us([x.e2e for x in s.samples])
                    this[v] = (p50, p99, s.cpu_s / max(1, s.forwards) * 1e6)
                    lost[v] += sum(x.lost for x in s.samples)
                    sent = (s.counters or {}).get("nacks_sent", 0)
                    got[v]["nacks"].append(sent / max(1, s.forwards))
                f = this["floor"]
                for v, (p50, p99, cpu) in this.items():
                    g = got[v]
                    g["p50"].append(p50), g["p99"].append(p99), g["cpu"].append(cpu)
                    g["r50"].append(p50 / f[0]), g["r99"].append(p99 / f[1])
                    g["rcpu"].append(cpu / f[2])
                line = ", ".join(f"{v} {this[v][0]:.0f}/{this[v][1]:.0f}/{this[v][2]:.0f}"
                                 for v in names)  # fmt: skip
                print(f"# {n} ducks round {rnd} (p50/p99/cpu): {line}; "
                      f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)  # fmt: skip
        med = statistics.median
        for v in names:
            g = got[v]
            print(f"| {n} | {v} | {med(g['r50']):.2f} | {min(g['r50']):.2f}..{max(g['r50']):.2f} "
                  f"| {med(g['r99']):.2f} | {med(g['rcpu']):.2f} | {med(g['p50']):.0f} | "
                  f"{med(g['p99']):.0f} | {med(g['cpu']):.0f} | {med(g['nacks']):.2f} | "
                  f"{lost[v]} |", flush=True)  # fmt: skip
    print(f"# done; load average {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    rc = main()
    print(f"# {time.monotonic() - t0:.0f} s", file=sys.stderr)
    sys.exit(rc)
