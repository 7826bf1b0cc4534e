"""The duck emulator's compute rate beside numpy's float32 matmul, on the same machine.

What the ducks cost when duckpipe is measured against emulated ducks: the emulator's
expert kernel (``dp_mlp_expert_rows``, run by ``duckpipe-ducks --bench``) and numpy's
float32 matmul doing the same work, one duck's bank of 8 experts (hidden x cols each:
gate, up, down) on ``rows`` rows, GFLOP/s counted alike (2 x 3 x hidden x cols per row and
expert). The emulator runs with each kernel instance (``portable``: the build's baseline;
``avx2``: AVX2 + FMA + F16C) and 1 or more threads, each thread with 8 experts of its own
(as a duck per thread would); numpy runs on one bank with whatever threads its BLAS uses.

    from duckpipe.bench.emulator import compute_rates
    for r in compute_rates(rows=(1, 8)):
        print(r)

:func:`run` makes it a ``duckpipe bench emulator`` section.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

from ..errors import DuckpipeError
from ..launch.binaries import find_binary
from .common import Progress, Size, Table

__all__ = ["EXPERTS", "compute_rates", "emulator_rate", "numpy_rate", "run"]

EXPERTS = 8  # one DeepSeek-V3 duck's routed experts (256 on 32 ducks), as the C bench holds
_LINE = re.compile(r"duckpipe-ducks bench: (.*)$", re.M)


def emulator_rate(
    hidden: int, cols: int, rows: int, *, isa: str = "auto", threads: int = 1, ms: int = 300
) -> dict[str, float | int | str]:
    """``duckpipe-ducks --bench``'s line as a dict: isa, threads, gflops,
    weight_gbytes_per_s, ...; DuckpipeError (its message) when it cannot run, e.g. an
    ``isa`` this CPU lacks."""
    argv = [str(find_binary("duckpipe-ducks")), "--bench", f"{hidden},{cols},{rows},{ms}"]
    argv += ["--isa", isa, "--threads", str(threads)]
    p = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60 + ms / 100,
        check=False,
        preexec_fn=_every_cpu,  # not the one CPU `duckpipe bench` pins itself to
    )
    m = _LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise DuckpipeError(p.stderr.strip() or f"duckpipe-ducks --bench exited {p.returncode}")
    out: dict[str, float | int | str] = {}
    for pair in m.group(1).split():
        k, v = pair.split("=", 1)
        out[k] = v if k == "isa" else float(v) if "." in v else int(v)
    return out


def _every_cpu() -> None:
    """In the child: every CPU of the machine, so that ``threads`` threads can run at once."""
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def numpy_rate(
    hidden: int, cols: int, rows: int, *, threads: int | None = None, ms: int = 300
) -> float:
    """GFLOP/s of numpy float32 doing the bench's work: per expert ``x @ w_gate``,
    ``x @ w_up``, SiLU, ``h @ w_down`` added into y; its BLAS on ``threads`` threads
    (None: its default). In a child on every CPU, as the emulator: BLAS threads squeezed
    onto the one CPU `duckpipe bench` pins itself to, or more of them than free CPUs on a
    shared machine, wait for each other (0.2 GFLOP/s against 5 at one thread, measured
    here), which would measure that, not numpy."""
    env = dict(os.environ)
    if threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    code = (
        "from duckpipe.bench.emulator import _numpy_rate_here as f; "
        f"print(f({hidden}, {cols}, {rows}, {ms}))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120 + ms / 100,
        check=False,
        preexec_fn=_every_cpu,
        env=env,
    )
    if p.returncode != 0:
        raise DuckpipeError(f"the numpy measurement failed: {p.stderr.strip()[-500:]}")
    return float(p.stdout.split()[-1])


def _numpy_rate_here(hidden: int, cols: int, rows: int, ms: int) -> float:
    """numpy_rate's measurement, in this process."""
    rng = np.random.default_rng(0)
    shapes = ((hidden, cols), (hidden, cols), (cols, hidden))
    w = [
        [rng.standard_normal(s, dtype=np.float32) / np.float32(np.sqrt(s[0])) for s in shapes]
        for _ in range(EXPERTS)
    ]
    x = rng.standard_normal((rows, hidden), dtype=np.float32)
    y = np.zeros((rows, hidden), np.float32)

    def bank() -> None:
        for wg, wu, wd in w:
            g = x @ wg
            h = g / (1 + np.exp(-g)) * (x @ wu)
            y[:] += h @ wd

    bank()  # untimed: BLAS's threads start, the first calls' buffers are made
    calls = 0
    t0 = time.perf_counter()
    until = t0 + ms / 1000
    while True:
        bank()
        calls += EXPERTS
        t = time.perf_counter()
        if t >= until:
            break
    return calls * 6.0 * hidden * cols * rows / (t - t0) * 1e-9


def compute_rates(
    hidden: int = 7168,
    cols: int = 128,
    rows: Sequence[int] = (1, 8, 32),
    *,
    isas: Sequence[str] = ("portable", "avx2"),
    threads: Sequence[int] | None = None,
    ms: int = 300,
) -> list[dict[str, object]]:
    """One dict per (rows, isa, threads): the emulator's GFLOP/s and weight GB/s, numpy's
    GFLOP/s at those rows on as many BLAS threads, and the ratio; an isa this CPU lacks
    gives ``skipped`` instead. ``threads`` defaults to 1 and every CPU of the machine
    (both run on all of them)."""
    cpus = os.cpu_count() or 1
    threads = threads or sorted({1, cpus})
    out: list[dict[str, object]] = []
    for r in rows:
        np_gflops = {t: numpy_rate(hidden, cols, r, threads=t, ms=ms) for t in threads}
        for isa in isas:
            for t in threads:
                row: dict[str, object] = {
                    "hidden": hidden, "cols": cols, "rows": r, "isa": isa, "threads": t,
                    "numpy_gflops": round(np_gflops[t], 2),
                }  # fmt: skip
                try:
                    e = emulator_rate(hidden, cols, r, isa=isa, threads=t, ms=ms)
                except DuckpipeError as err:
                    row["skipped"] = str(err)
                else:
                    row["gflops"] = round(float(e["gflops"]), 2)
                    row["weight_gbytes_per_s"] = round(float(e["weight_gbytes_per_s"]), 2)
                    row["vs_numpy"] = round(float(e["gflops"]) / np_gflops[t], 2)
                out.append(row)
    return out


def run(size: Size, *, quiet: bool = False) -> list[Table]:
    """The ``emulator`` section: DeepSeek-V3's hidden and the demo's 128-wide experts."""
    rows = size.pick((1, 8, 32), (1, 8, 32), (1,))
    ms = size.pick(500, 300, 50)
    Progress("emulator", 1, quiet=quiet).step(f"expert kernel at rows {rows}, {ms} ms each")
    t = Table(
        key="emulator",
        title="the duck emulator's expert kernel against numpy float32 (GFLOP/s)",
        columns=[
            ("rows", "rows"),
            ("isa", "kernels"),
            ("threads", "threads"),
            ("gflops", "emulator GFLOP/s"),
            ("weight_gbytes_per_s", "weights GB/s"),
            ("numpy_gflops", "numpy GFLOP/s"),
            ("vs_numpy", "emulator / numpy"),
        ],
    )
    for r in compute_rates(rows=rows, ms=ms):
        if "skipped" in r:
            t.notes.append(f"{r['isa']} skipped: {r['skipped']}")
            continue
        t.rows.append(r)
    t.notes.append(
        f"{EXPERTS} experts of hidden 7168 x 128 columns per emulator thread (each its own "
        "weights), dp_mlp_expert_rows; numpy: one such bank, its BLAS on as many threads; both "
        "on every CPU (not the one `duckpipe bench` pins itself to); GFLOP/s "
        "= 2 x 3 x hidden x cols per row and expert over wall time. The emulator's threads "
        "share the CPUs with whatever else runs: compare within one run."
    )
    return [t]
