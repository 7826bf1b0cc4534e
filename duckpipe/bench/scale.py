"""``duckpipe bench scale``: duckpipe's host overhead as the ducks double and the payload doubles.

Host overhead = end to end - the slowest duck's reported compute, through the C
dataplane (socket backend, default ``hybrid`` wait) and echo ducks on CPU 1.
Series 1: hidden 1024, one row, ducks 1, 2, 4, ... 32. Series 2: a fixed number of
ducks, activation (= partial) 4 KiB, 8 KiB, ... 4 MiB (rows x 1024 float32). A
least-squares line through each gives µs per duck and µs per MiB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..launch.cluster import free_udp_ports
from ..launch.ducks import DucksProcess
from .common import DUCKS_CPU, Progress, Size, Table, percentiles_us, pin
from .forward import run_duckpipe
from .report import plot

__all__ = ["fit", "run"]

WAIT = "block"  # the client's default
HIDDEN = 1024


def fit(x: list[float], y: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line; NaN with fewer than two points."""
    if len(x) < 2:
        return float("nan"), float("nan")
    slope, icpt = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(slope), float(icpt)


def _measure(ducks: int, rows: int, iters: int) -> dict[str, object]:
    with DucksProcess(
        ducks=ducks, base_port=free_udp_ports(ducks), args=["--compute", "echo"]
    ) as dk:
        pin(dk.pid, DUCKS_CPU)
        addrs = [(i, p) for i, _, p in dk.addresses]
        r = run_duckpipe(addrs, HIDDEN, rows, (WAIT,), iters=iters, warmup=max(2, iters // 10))
    s = r[f"duckpipe_{WAIT}"].samples
    ho50, ho99 = percentiles_us([x.e2e - x.max_compute for x in s])
    p50, _ = percentiles_us([x.e2e for x in s])
    return {
        "p50_us": p50,
        "host_overhead_p50_us": ho50,
        "host_overhead_p99_us": ho99,
        "lost": int(sum(x.lost for x in s)),
        "nacks_per_forward": r[f"duckpipe_{WAIT}"].counters.get("nacks_sent", 0) / max(1, len(s)),
        "duplicates_per_forward": r[f"duckpipe_{WAIT}"].counters.get("rx_duplicates", 0)
        / max(1, len(s)),
    }


def run(size: Size, out: Path, *, quiet: bool = False) -> tuple[list[Table], list[str]]:
    duck_pts: list[int] = size.pick([1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16], [1, 2])  # type: ignore[assignment]
    kib: list[int] = size.pick([4 << k for k in range(11)], [4, 16, 64, 256, 1024], [4, 16])  # type: ignore[assignment]
    payload_ducks = 1  # 4 ducks x 4 MiB timed out every forward here (docs/benchmarks.md)
    iters_small: int = size.pick(300, 100, 5)  # type: ignore[assignment]
    prog = Progress("scale", len(duck_pts) + len(kib), quiet=quiet)
    cols = [
        ("series", "series"),
        ("ducks", "ducks"),
        ("kib", "payload KiB"),
        ("p50_us", "p50 µs"),
        ("host_overhead_p50_us", "host overhead p50 µs"),
        ("host_overhead_p99_us", "host overhead p99 µs"),
        ("nacks_per_forward", "NACKs / fwd"),
        ("duplicates_per_forward", "duplicates / fwd"),
        ("lost", "lost"),
    ]
    t = Table(key="scale", title=f"scale: duckpipe host overhead (wait={WAIT})", columns=cols)
    for n in duck_pts:
        prog.step(f"{n} ducks, 4 KiB x{iters_small}")
        t.rows.append({"series": "ducks", "ducks": n, "kib": 4, **_measure(n, 1, iters_small)})
    for k in kib:
        rows = k * 1024 // (HIDDEN * 4)
        iters = max(3, min(iters_small, int(iters_small * 64 / k)))
        prog.step(f"{payload_ducks} ducks, {k} KiB x{iters}")
        t.rows.append(
            {"series": "payload", "ducks": payload_ducks, "kib": k,
             **_measure(payload_ducks, rows, iters)}
        )  # fmt: skip
    dx = [float(r["ducks"]) for r in t.rows if r["series"] == "ducks"]  # type: ignore[arg-type]
    dy = [float(r["host_overhead_p50_us"]) for r in t.rows if r["series"] == "ducks"]  # type: ignore[arg-type]
    px = [float(r["kib"]) / 1024 for r in t.rows if r["series"] == "payload"]  # type: ignore[arg-type]
    py = [float(r["host_overhead_p50_us"]) for r in t.rows if r["series"] == "payload"]  # type: ignore[arg-type]
    per_duck, duck_icpt = fit(dx, dy)
    per_mib, mib_icpt = fit(px, py)
    # the same without the points where NACK recovery, not the bytes, set the time
    clean = [
        (float(r["kib"]) / 1024, float(r["host_overhead_p50_us"]))  # type: ignore[arg-type]
        for r in t.rows
        if r["series"] == "payload" and float(r["nacks_per_forward"]) < 0.5  # type: ignore[arg-type]
    ]
    clean_mib, clean_icpt = fit([x for x, _ in clean], [y for _, y in clean])
    fits = Table(
        key="scale_fit",
        title="scale: least-squares slopes of the host overhead p50",
        columns=[("fit", "fit"), ("slope", "slope"), ("intercept_us", "intercept µs")],
        rows=[
            {"fit": "µs per duck (4 KiB, 1 row)", "slope": per_duck, "intercept_us": duck_icpt},
            {
                "fit": f"µs per MiB ({payload_ducks} ducks)",
                "slope": per_mib,
                "intercept_us": mib_icpt,
            },
        ],
    )
    if len(clean) >= 2:
        fits.rows.append(
            {
                "fit": f"µs per MiB ({payload_ducks} ducks, points with < 0.5 NACKs / fwd)",
                "slope": clean_mib,
                "intercept_us": clean_icpt,
            }
        )
    else:
        fits.notes.append(
            f"Only {len(clean)} payload point(s) had fewer than 0.5 NACKs per forward: "
            "no fit without NACK recovery."
        )
    t.notes.append(
        f"Payload series: {payload_ducks} duck(s), rows x {HIDDEN} float32; each duck's "
        "partial is as large as the activation, so the bytes moved are ducks x 2 x payload."
    )
    pngs = []
    if plot(out / "scale_ducks.png", "host overhead vs ducks (4 KiB)", {"p50": (dx, dy)},
            "ducks", "host overhead p50 (µs)", fits={"p50": (per_duck, duck_icpt)}):  # fmt: skip
        pngs.append("scale_ducks.png")
    if plot(out / "scale_payload.png", f"host overhead vs payload ({payload_ducks} ducks)",
            {"p50": (px, py)}, "payload (MiB)", "host overhead p50 (µs)",
            fits={"p50": (per_mib, mib_icpt)}):  # fmt: skip
        pngs.append("scale_payload.png")
    return [t, fits], pngs
