"""The ``duckpipe`` command: run a mock dataplane, inspect and clean segments, try it out."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pwd
import sys
import time
from pathlib import Path

import numpy as np

from . import host
from .errors import DataplaneUnavailable, DuckpipeError
from .observe.printable import PrintableFormatter, printable
from .schema.config import default as config_default

__all__ = ["dataplane_main", "ducks_main", "main", "program_main"]

#: Settings the mock shares with the C dataplane's config (duckpipe/schema/config.py).
MOCK_CONFIG_FIELDS = (
    "client_max_inflight",
    "max_inflight",
    "max_forward_bytes",
    "client_max_slots",
    "client_max_segment_bytes",
    "max_timeout_us",
    "client_max_layers",
    "client_max_weight_bytes",
    "max_hidden",
    "max_ffn",
    "client_max_per_pid",
    "client_max_per_uid",
    "admin_reserved_clients",
    "max_connections",
    "control_group",
    "curve_secret_key_file",
    "curve_public_key_file",
    "curve_clients_file",
)


def _mock_dataplane(args: argparse.Namespace) -> int:
    from .mock.dataplane import MockConfig, main_loop

    cfg = MockConfig(
        control=args.control or host.default_control(),
        ducks=args.ducks,
        idle=args.idle,
        default_timeout_ms=args.timeout_ms,
        client_timeout_s=args.client_timeout,
        delay_ms=args.delay_ms,
        dead_ducks=frozenset(args.dead_duck),
        crash_after=args.crash_after,
        **{name: getattr(args, name) for name in MOCK_CONFIG_FIELDS},
    )
    return main_loop(cfg)


def _loopback_topology(args: argparse.Namespace):
    """``duckpipe dataplane`` without --config: --ducks on 127.0.0.1 at this user's ports."""
    from .launch.cluster import free_udp_ports
    from .launch.topology import loopback

    host_port, duck, why = host.default_ports()
    if args.host_port is not None:
        host_port, why = args.host_port, "from --host-port"
    if args.duck_port is not None:
        duck = args.duck_port
        why = "from --duck-port" if args.host_port is None else "from --host-port/--duck-port"
    note = ""
    if not args.check and args.backend == "socket" and not host.udp_port_free(host_port):
        # only the dataplane binds it (the ducks answer whatever port asked): take another
        busy, host_port = host_port, free_udp_ports(1)
        note = f"; port {busy} is in use, so host port {host_port} instead"
    topo = loopback(args.ducks, backend=args.backend, host_port=host_port, duck_port=duck)
    print(
        f"duckpipe dataplane: loopback topology: host 127.0.0.1:{host_port}, {args.ducks} ducks at "
        f"127.0.0.1:{duck}..{duck + args.ducks - 1} ({why}{note})",
        file=sys.stderr,
        flush=True,
    )
    return topo


def _check_topology(topo, control: str) -> list[str]:
    """What would stop this topology from starting, short of binding (``--check``): its
    own rules, then what this host has (interfaces, CPUs, addresses: launch/hostcheck.py)."""
    import subprocess

    from .launch.binaries import find_binary
    from .launch.hostcheck import host_problems

    topo.to_config(control)  # encodes with the C dataplane's schema
    problems = host_problems(topo)
    addrs: dict[tuple[str, int], str] = {}
    for nic in topo.nics:
        for d in nic.ducks:
            if not nic.broadcast and (d.ip, d.port) in addrs:
                problems.append(f"duck {d.id} and {addrs[d.ip, d.port]} share {d.ip}:{d.port}")
            addrs[d.ip, d.port] = f"duck {d.id}"
    try:
        binary = find_binary("duckpipe-dataplane")
    except DuckpipeError as e:
        return [*problems, str(e)]
    r = subprocess.run([str(binary), "--backends"], capture_output=True, text=True, timeout=10)
    have = set(r.stdout.split())
    for nic in topo.nics:
        if r.returncode == 0 and have and nic.backend not in have:
            problems.append(
                f"NIC {nic.name!r} uses the {nic.backend} backend, which {binary} was built "
                f"without (it has: {', '.join(sorted(have))})"
            )
    return problems


def _dataplane(args: argparse.Namespace) -> int:
    from .launch.binaries import find_binary
    from .launch.dataplane import run_foreground
    from .launch.topology import load

    if args.backends:
        binary = find_binary("duckpipe-dataplane")
        os.execv(binary, [str(binary), "--backends"])
    topo = load(args.config) if args.config else _loopback_topology(args)
    control = args.control or topo.control or host.default_control()
    if args.check:
        problems = _check_topology(topo, control)
        what = args.config or "the loopback topology"
        for p in problems:
            print(f"duckpipe dataplane: {what}: {p}", file=sys.stderr)
        if problems:
            print(f"duckpipe dataplane: {what}: check failed", file=sys.stderr)
            return 1
        print(
            f"{what} is valid: {len(topo.nics)} NIC(s), {len(topo.ducks)} ducks, "
            f"{topo.threads} threads, control {control} (nothing started)"
        )
        return 0
    extra = args.backend_args[1:] if args.backend_args[:1] == ["--"] else args.backend_args
    return run_foreground(topo, control, args.verbose, extra)


def _shm_ls(args: argparse.Namespace) -> int:
    from ._abi.shm import list_segments

    segs = list_segments()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "path": str(s.path),
                        "name": s.name,
                        "kind": s.kind,
                        "size": s.size,
                        "backing": s.backing,
                        "creator_pid": s.creator_pid,
                        "creator_alive": s.creator_alive,
                        "dataplane_pid": s.dataplane_pid,
                        "client_id": s.client_id,
                        "age_s": round(s.age_s, 3),
                        "readable": s.readable,
                    }
                    for s in segs
                ],
                indent=2,
            )
        )
        return 0
    if not segs:
        print("no duckpipe segments")
        return 0
    print(
        f"{'SEGMENT':<52} {'KIND':<6} {'BACKING':<10} {'SIZE':>10} {'PID':>8} {'ALIVE':<6} "
        f"{'AGE':>8}  HELD AT"
    )
    for s in segs:
        alive = "yes" if s.creator_alive else ("?" if not s.readable else "DEAD")
        print(
            f"{printable(s.name):<52} {s.kind:<6} {s.backing:<10} {s.size / 2**20:9.1f}M "
            f"{s.creator_pid:>8} {alive:<6} {s.age_s:7.0f}s  {printable(str(s.path))}"
        )
    return 0


def _shm_clean(args: argparse.Namespace) -> int:
    from ._abi.shm import clean_segments

    removed = clean_segments(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for s in removed:
        print(f"{verb} {s.path} (creator pid {s.creator_pid}, {s.size / 2**20:.1f} MiB)")
    # "1.1" is the segment ABI's version (duckpipe.schema.abi), not the package's
    print(
        f"{verb} {len(removed)} segment file(s) of dead processes (the hugetlbfs or "
        "/dev/shm files of segment ABI 1.0; since ABI 1.1 segments are memfds)"
    )
    print(
        "memfd segments need no cleaning: nothing names them in a file system, and their "
        "memory goes with the last process that maps them"
    )
    return 0


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def _stats(args: argparse.Namespace) -> int:
    """The stats segment (no lock, no message); --control-query asks over ZeroMQ."""
    if args.control_query:
        return _stats_query(args)
    import msgspec

    from .observe import stats_reader as st

    try:
        path = Path(args.stats) if args.stats else st.find_stats(args.control)
        snap = st.read_snapshot(path)
    except st.NoDataplane as e:
        print(e, file=sys.stderr)
        return 1
    except PermissionError as e:  # another user's run directory
        print(
            f"duckpipe stats: cannot read {e.filename}: permission denied (you are uid "
            f"{os.geteuid()}); pass --control or --stats for a dataplane of your own",
            file=sys.stderr,
        )
        return 1
    info = snap.dataplane
    stale = ""
    if not info.alive:
        gone = not st._pid_alive(info.pid)
        stale = (
            f"dataplane pid {info.pid} not responding since "
            f"{st.heartbeat_age_ns(snap) / 1e9:.1f} s ago"
            + (" (the process is gone: this segment is stale)" if gone else "")
        )
    if args.json:
        print(msgspec.json.encode(snap).decode())
    elif args.experts is not None:
        _print_experts(snap, args.experts)
    else:
        age = st.heartbeat_age_ns(snap) / 1e6
        print(
            f"dataplane {info.kind} pid {info.pid}, {info.threads} threads, epoch {info.epoch}, "
            f"control {printable(info.control)}, heartbeat {age:.0f} ms ago "
            f"({printable(info.stats_path)})"
        )
        moe = st.moe_active(snap.counters, snap.ducks)
        for k, v in snap.counters.items():
            if moe or k not in st.MOE_COUNTERS:  # a dense run: no MoE lines of zeros
                print(f"  {k:<24} {v}")
        for c in snap.clients:
            page = "2 MiB pages" if c.page_size == 2 * 1024 * 1024 else f"{c.page_size} B pages"
            print(
                f"  client {c.id} pid {c.pid} {c.name!r} ({printable(c.segment)}, {page}): ring "
                f"{c.pending}/{c.capacity}, {c.inflight} in flight, {c.submits} submitted, "
                f"{c.completions} completed, {c.bytes_in} B in, {c.bytes_out} B out, "
                f"{c.errors} errors"
            )
        for n in snap.nics:
            core = "unpinned" if n.core < 0 else f"core {n.core}"
            if n.lcore >= 0:  # a dpdk worker on an EAL lcore, pinned by the EAL
                core = f"EAL lcore {n.lcore}, " + (
                    f"core {n.core}" if n.core >= 0 else "several CPUs"
                )
            if n.link:
                speed = f" {n.link_speed_mbps} Mb/s" if n.link == "up" and n.link_speed_mbps else ""
                core += f", link {n.link}{speed}"
            nz = ", ".join(
                f"{k}={v}"
                for k, v in n.counters.items()
                if v and k.startswith(("tx_", "rx_", "nack", "retransmits", "gso", "moe_"))
            )
            nic = printable(f"{n.name} ({n.backend} {n.interface or '-'}, {core})")
            print(f"  nic {nic}: {nz}")
        for d in snap.ducks:
            print(
                f"  duck {d.id} {printable(d.address)} nic {printable(d.nic)}: {d.state}"
                + (f" ({printable(d.why)})" if d.why else "")
                + f", {d.layers} layer(s), "
                f"last {_us(d.last_reply_ns or None)} us, p99 {_us(d.reply.quantile(0.99))} us, "
                f"{d.timeouts} timeouts, {d.missing_chunks} missing chunks"
                + (
                    f", MoE {d.moe_tokens} tokens, {d.moe_expert_rows} (token, expert) rows, "
                    f"{d.moe_failovers} failovers"
                    if moe
                    else ""
                )
            )
        print("  latency (us, since start)        n      p50      p99    p99.9")
        for name, h in snap.latency.items():
            print(
                f"    {name:<24} {h.total():>9} {_us(h.quantile(0.5)):>8} "
                f"{_us(h.quantile(0.99)):>8} {_us(h.quantile(0.999)):>8}"
            )
    if stale:
        print(stale, file=sys.stderr)
        return 1
    return 0


def _stats_query(args: argparse.Namespace) -> int:
    """GetStats over ZeroMQ: the dataplane's own answer (with each DPDK port's xstats)."""
    from .launch.process import ping
    from .schema.control import MAX_XSTATS

    control = args.control or host.default_control()
    stats = ping(control, 2.0)
    if stats is None:
        print(f"no dataplane answered at {control}", file=sys.stderr)
        return 1
    if args.json:
        import msgspec

        print(msgspec.json.encode(stats).decode())
        return 0
    from .observe.stats_reader import MOE_COUNTERS, moe_active

    print(f"dataplane {stats.mode}, epoch {stats.epoch}, {len(stats.clients)} client(s)")
    moe = moe_active(stats.counters)
    for k, v in stats.counters.items():
        if moe or k not in MOE_COUNTERS:  # a dense run: no MoE lines of zeros
            print(f"  {k:<24} {v}")
    for c in stats.clients:
        print(
            f"  client {c.client_id} pid {c.pid} {c.name!r}: {c.submitted} submitted, "
            f"{c.completed} completed"
        )
    # the DPDK port's own counters (the dataplane sends the non-zero ones); none for a
    # socket or null NIC
    for nic in stats.nics:
        if not nic.xstats and not nic.xstats_left_out:
            continue
        print(printable(f"  nic {nic.name} ({nic.backend}) port xstats:"))
        for k, v in nic.xstats.items():
            print(f"    {printable(k):<40} {v}")
        if nic.xstats_left_out:
            print(f"    (and {nic.xstats_left_out} more: a reply carries {MAX_XSTATS} at most)")
    return 0


def _exporter(args: argparse.Namespace) -> int:
    from .observe.exporter import serve

    return serve(args.port, args.address, stats=args.stats, control=args.control)


def _shutdown_refused(control: str, reply) -> DuckpipeError:
    """The dataplane's refusal of Shutdown, saying who may stop it: the admin, the user
    that started it, who owns an ipc:// socket (a control_group member is a client)."""
    from .errors import NotPermitted, refused
    from .schema.control import ErrorCode

    if reply.code != ErrorCode.NOT_PERMITTED:
        return refused(reply.code, f"the dataplane at {control} refused shutdown: {reply.message}")
    who = "the user who started it (the admin)"
    with contextlib.suppress(OSError, ValueError):
        if control.startswith("ipc://"):
            uid = os.stat(control.removeprefix("ipc://")).st_uid
            with contextlib.suppress(KeyError):
                who = f"{who}, {pwd.getpwuid(uid).pw_name} (uid {uid})"
            if who.endswith("(the admin)"):
                who = f"{who}, uid {uid}"
    return NotPermitted(
        reply.code,
        f"the dataplane at {control} refused shutdown: {reply.message}; only {who} may stop "
        f"it, and you (uid {os.getuid()}) are a client of it",
    )


def _shutdown(args: argparse.Namespace) -> int:
    from .launch.process import control_request
    from .schema import control as ctl

    control = args.control or host.default_control()
    reply = control_request(control, ctl.Shutdown(req_id=1), 2.0)
    if isinstance(reply, ctl.Error):  # it is there and said no: not "nobody answered"
        raise _shutdown_refused(control, reply)
    if not isinstance(reply, ctl.Ack):
        print(f"no dataplane acknowledged shutdown at {control}", file=sys.stderr)
        return 1
    print("shutdown acknowledged")
    return 0


def _example(args: argparse.Namespace) -> int:
    """Load two MLP kinds into a dataplane, run forwards, check them against numpy."""
    import duckpipe

    from .mock.process import MockDataplaneProcess

    def run(control: str) -> None:
        with duckpipe.connect(control, name="example") as client:
            print(
                f"attached to a {client.mode} dataplane with {len(client.topology().ducks)} "
                f"ducks; segment {client.segment} ({client.backing})"
            )
            layers = {
                0: duckpipe.GeluMlp.random(384, 1536, seed=1),
                1: duckpipe.SwiGluMlp.random(1024, 3072, seed=2),
            }
            for layer, mlp in layers.items():
                client.load_weights(layer, mlp, progress=True)
            rng = np.random.default_rng(0)
            for layer, mlp in layers.items():
                xs = [
                    rng.standard_normal((args.rows, mlp.hidden)).astype(np.float32)
                    for _ in range(args.forwards)
                ]
                ys, e2e, waits = [], [], []
                for x in xs:
                    t0 = time.perf_counter_ns()
                    with client.claim(x.shape, x.dtype) as slot:
                        slot.array[:] = x
                        fwd = client.submit(slot, layer)
                    with fwd:
                        ys.append(fwd.result().copy())
                        e2e.append(time.perf_counter_ns() - t0)
                        waits.append(fwd.phases.wait_ns)  # from the slot header
                # checked after the timed loop: numpy's BLAS threads would steal the cores
                worst = max(
                    float(np.abs(y - mlp.reference(x)).max()) for x, y in zip(xs, ys, strict=True)
                )
                e2e_us = np.array(e2e) / 1e3
                print(
                    f"layer {layer} {type(mlp).__name__} hidden {mlp.hidden} ffn {mlp.ffn}: "
                    f"{args.forwards} forwards of {args.rows} rows, max |y - numpy| = {worst:.2e}, "
                    f"end to end p50 {np.percentile(e2e_us, 50):.0f} us p99 "
                    f"{np.percentile(e2e_us, 99):.0f} us (wait for the ducks p50 "
                    f"{np.percentile(waits, 50) / 1e3:.0f} us)"
                )

    if args.mock:
        with MockDataplaneProcess(ducks=args.ducks) as dp:
            print(
                f"started a mock dataplane (pid {dp.pid}) with {args.ducks} ducks at {dp.control}"
            )
            run(dp.control)
    elif args.standalone:
        from .launch.cluster import Cluster

        with Cluster(args.ducks) as cl:
            print(
                f"started {args.ducks} emulated ducks and the C dataplane (pid "
                f"{cl.dataplane.pid}, socket backend) on loopback at {cl.control}"
            )
            run(cl.control)
    else:  # like stats, shutdown and connect(): the dataplane already running
        control = args.control or host.default_control()
        try:
            run(control)
        except DataplaneUnavailable as e:
            raise DataplaneUnavailable(
                f"{e}; or run `duckpipe example --standalone`, which starts its own"
            ) from None
    return 0


def _add_mock_dataplane(sub) -> None:
    m = sub.add_parser("mock-dataplane", help="run the shm-only mock dataplane (no network)")
    m.add_argument("--control", help="ZeroMQ endpoint (default: $DUCKPIPE_CONTROL or the run dir)")
    m.add_argument("--ducks", type=int, default=8, help="emulated ducks (default 8)")
    m.add_argument(
        "--idle",
        choices=("spin", "yield", "backoff"),
        default="backoff",
        help="how the loop waits for work (default backoff)",
    )
    m.add_argument("--timeout-ms", type=float, default=1000.0, help="default forward deadline")
    m.add_argument(
        "--client-timeout",
        type=float,
        default=10.0,
        help="seconds without a client heartbeat before its segment is reclaimed",
    )
    m.add_argument("--delay-ms", type=float, default=0.0, help="fault: delay every completion")
    m.add_argument(
        "--dead-duck",
        type=int,
        action="append",
        default=[],
        help="fault: this duck never answers (repeatable)",
    )
    m.add_argument("--crash-after", type=int, help="fault: SIGKILL itself on the forward after N")
    for name in MOCK_CONFIG_FIELDS:  # the C dataplane's config names and defaults
        dflt = config_default(name)
        m.add_argument(
            "--" + name.replace("_", "-"), type=type(dflt), default=dflt, help=f"(default {dflt!r})"
        )
    m.set_defaults(func=_mock_dataplane)


def _add_dataplane(sub) -> None:
    d = sub.add_parser("dataplane", help="run the C dataplane (kernel UDP or DPDK)")
    d.add_argument("--config", help="TOML topology (default: --ducks ducks on loopback)")
    d.add_argument("--ducks", type=int, default=8, help="loopback ducks without --config")
    d.add_argument(
        "--backend",
        choices=["socket", "null"],
        default="socket",
        help="without --config: null answers for the ducks itself (no network: "
        "docs/architecture.md)",
    )
    d.add_argument("--control", help="ZeroMQ endpoint (default: $DUCKPIPE_CONTROL or the run dir)")
    d.add_argument(
        "--host-port",
        type=int,
        help="without --config: the dataplane's UDP port (default: this user's; "
        "docs/walkthrough.md)",
    )
    d.add_argument(
        "--duck-port",
        type=int,
        help="without --config: duck i listens on P + i (default: this user's; "
        "docs/walkthrough.md)",
    )
    d.add_argument(
        "--check",
        action="store_true",
        help="validate the topology and the build, start nothing, exit 0 or 1 (like nginx -t)",
    )
    d.add_argument(
        "--backends",
        action="store_true",
        help="print the backends the C dataplane was built with, start nothing",
    )
    d.add_argument(
        "backend_args",
        nargs=argparse.REMAINDER,
        help="after --: options for the backend (EAL options for dpdk)",
    )
    d.set_defaults(func=_dataplane)


def _add_shm(sub) -> None:
    s = sub.add_parser("shm", help="list or reclaim shared-memory segments")
    ssub = s.add_subparsers(dest="shm_command", required=True, metavar="ACTION")
    ls = ssub.add_parser("ls", help="list this user's segments")
    ls.add_argument("--json", action="store_true", help="one JSON list, nothing else")
    ls.set_defaults(func=_shm_ls)
    cl = ssub.add_parser(
        "clean", help="remove segment files of dead processes (memfd segments need none)"
    )
    cl.add_argument("--dry-run", action="store_true", help="only say what would go")
    cl.set_defaults(func=_shm_clean)


def _imbalance(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _print_experts(snap, top: int) -> None:
    """`duckpipe stats --experts`: each MoE layer's hottest experts, their ducks, and how
    unevenly its ducks are loaded (max / mean of their routed rows)."""
    info = snap.dataplane
    print(f"dataplane {info.kind} pid {info.pid}: expert load ({printable(info.stats_path)})")
    if not snap.moe_layers:
        print("  no MoE layer has run a routed forward")
    for la in snap.moe_layers:
        window = la.window_ns / 1e9
        state = "loaded" if la.loaded else "unloaded"
        print(
            f"  MoE layer {la.layer} ({la.n_experts} experts, {len(la.duck_rows)} ducks, "
            f"{state}): {la.forwards} forwards, {la.tokens} tokens, {la.entries} (token, "
            f"expert) rows, {la.no_expert} without an expert; last {window:.2f} s: "
            f"{la.recent_forwards} forwards, {la.recent_tokens} tokens"
        )
        print(
            f"    imbalance (max/mean duck rows): {_imbalance(la.imbalance())} total, "
            f"{_imbalance(la.imbalance(recent=True))} recent"
        )
        hot = la.hottest(top)
        if not hot:
            continue
        print(f"    {'hottest experts':<18} {'tokens':>10} {'recent':>8}  ducks (rows)")
        for x in hot:
            ducks = ", ".join(f"{d} ({la.duck_rows.get(d, 0)})" for d in x.ducks)
            print(f"    expert {x.expert:<11} {x.tokens:>10} {x.recent:>8}  {ducks}")
    u = snap.moe_untracked
    if u.forwards:
        print(
            f"  untracked (every one of the {len(snap.moe_layers)} MoE layer slots taken): "
            f"{u.forwards} forwards, {u.tokens} tokens, {u.entries} (token, expert) rows"
        )


def _add_stats(sub) -> None:
    st = sub.add_parser(
        "stats",
        help="print a dataplane's counters and latency histograms from its stats segment",
        description="Reads the dataplane's stats segment (next to its control socket) "
        "without a lock or a message. --control-query asks the dataplane over ZeroMQ "
        "(GetStats) instead, which also carries each DPDK port's non-zero xstats. Exits 1 "
        "when no dataplane runs, or when the segment's dataplane stopped responding.",
    )
    st.add_argument("--control", help="the dataplane's control endpoint (default: this user's)")
    st.add_argument("--stats", metavar="PATH", help="the stats segment to read")
    st.add_argument(
        "--json", action="store_true", help="one JSON document (fields: docs/walkthrough.md)"
    )
    st.add_argument(
        "--control-query",
        action="store_true",
        help="ask the dataplane over ZeroMQ (GetStats; DPDK ports' xstats) instead",
    )
    st.add_argument(
        "--experts",
        nargs="?",
        type=int,
        const=5,
        metavar="N",
        help="each MoE layer's N hottest experts (default 5): tokens in all and in the "
        "last second, their ducks, and the ducks' imbalance (max/mean routed rows)",
    )
    st.set_defaults(func=_stats)


def _add_exporter(sub) -> None:
    ex = sub.add_parser(
        "exporter",
        help="serve the stats segment's counters and histograms to Prometheus",
        description="Serves http://HOST:PORT/metrics in the Prometheus text format; every "
        "scrape reads the stats segment once (no lock, no message to the dataplane).",
    )
    ex.add_argument("--port", type=int, default=9464, help="TCP port to listen on (default 9464)")
    ex.add_argument("--address", default="127.0.0.1", help="address to listen on")
    ex.add_argument("--control", help="the dataplane's control endpoint (default: this user's)")
    ex.add_argument("--stats", metavar="PATH", help="the stats segment to read")
    ex.set_defaults(func=_exporter)


def _add_shutdown(sub) -> None:
    sd = sub.add_parser("shutdown", help="ask a running dataplane to stop")
    sd.add_argument("--control", help="the dataplane's control endpoint (default: this user's)")
    sd.set_defaults(func=_shutdown)


def _add_example(sub) -> None:
    ex = sub.add_parser(
        "example",
        help="run checked forwards against the running dataplane (or --standalone)",
        description="Loads a random GELU and a SwiGLU layer, runs forwards and compares each "
        "result with numpy. Like stats, shutdown and duckpipe.connect(), it talks to the "
        "dataplane at --control (default: $DUCKPIPE_CONTROL or this user's run directory); "
        "--standalone starts its own ducks and C dataplane, --mock its own mock.",
    )
    ex.add_argument("--control", help="the dataplane's control endpoint (default: this user's)")
    ex.add_argument(
        "--standalone",
        action="store_true",
        help="start its own emulated ducks and C dataplane on free loopback ports",
    )
    ex.add_argument(
        "--mock", action="store_true", help="start its own mock dataplane (implies --standalone)"
    )
    ex.add_argument(
        "--ducks", type=int, default=8, help="--standalone/--mock: ducks to start (default 8)"
    )
    ex.add_argument("--forwards", type=int, default=200, help="forwards per layer (default 200)")
    ex.add_argument("--rows", type=int, default=1, help="rows per forward (default 1)")
    ex.set_defaults(func=_example)


def _add_doctor(sub) -> None:
    dr = sub.add_parser(
        "doctor",
        help="check this host: hugepages, ports, DPDK, kernel features; say how to fix",
        description="Reports what duckpipe's backends use on this host, each with the command "
        "that fixes it when it is missing. Exits 1 if something duckpipe needs is missing.",
    )
    dr.add_argument("--json", action="store_true", help="one JSON document, nothing else")
    dr.set_defaults(func=_doctor)


def _parser() -> argparse.ArgumentParser:
    """The ``duckpipe`` command line: the global flags, then each command's own builder
    (in the order ``--help`` lists them)."""
    p = argparse.ArgumentParser(prog="duckpipe", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    p.add_argument("--version", action="version", version=f"duckpipe {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from .bench import add_parser as add_bench_parser
    from .demo.run import add_parser as add_demo_parser
    from .launch.ducks import add_parser as add_ducks_parser

    for add in (
        _add_mock_dataplane,
        _add_dataplane,
        add_ducks_parser,
        add_demo_parser,
        add_bench_parser,
        _add_shm,
        _add_stats,
        _add_exporter,
        _add_shutdown,
        _add_example,
        _add_doctor,
    ):
        add(sub)
    _accept_global_flags_after_commands(p)
    return p


def _version() -> str:
    from . import __version__

    return __version__


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run

    return run(json_output=args.json)


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser, recursively (``shm ls`` too)."""
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in dict.fromkeys(action.choices.values()):  # aliases map to one parser
                out += [sp, *_subparsers(sp)]
    return out


def _accept_global_flags_after_commands(p: argparse.ArgumentParser) -> None:
    """``duckpipe dataplane -v`` as well as ``duckpipe -v dataplane``: each subcommand takes
    -v too; SUPPRESS keeps the top level's value when the subcommand does not see it."""
    for sp in _subparsers(p):
        if "-v" not in sp._option_string_actions:
            sp.add_argument(
                "-v",
                "--verbose",
                action="store_true",
                default=argparse.SUPPRESS,
                help="log debug messages (also accepted before the command)",
            )


def configure_logging(verbose: bool) -> None:
    """Log lines to stderr, every one escaped (PrintableFormatter): a client's name or a
    path in a message stays text on the terminal, and cannot start a line of its own."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler])


def _main(argv: list[str] | None, parser: argparse.ArgumentParser | None) -> int:
    args = (parser or _parser()).parse_args(argv)
    configure_logging(args.verbose)
    try:
        return args.func(args)
    except DuckpipeError as e:
        print(f"duckpipe: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def program_main(command: str, prog: str, argv: list[str] | None = None) -> int:
    """``duckpipe <command>`` as a program of its own name on PATH (``duckpipe-ducks`` is
    ``duckpipe ducks``): the same options, defaults and messages, and ``--version``."""
    parser = next(sp for sp in _subparsers(_parser()) if sp.prog == f"duckpipe {command}")
    parser.prog = prog  # argparse reads it when it prints usage and errors
    # its -v defaults to SUPPRESS (to keep the top level's value): here there is none
    parser.set_defaults(verbose=False)
    parser.add_argument("--version", action="version", version=f"{prog} (duckpipe {_version()})")
    return main(argv, parser=parser)


def main(argv: list[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """The ``duckpipe`` command. A reader that goes away (``duckpipe ... | head``) ends it
    quietly with 141 (128 + SIGPIPE, what a shell reports for a C tool), no traceback;
    whatever it started is stopped on the way out like on any other error.
    ``parser``: one subcommand's, for a program of its own (:func:`program_main`)."""
    try:
        try:
            rc = _main(argv, parser)
        except SystemExit as e:  # argparse: --help, --version, usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        sys.stdout.flush()  # here, not at exit, where a broken pipe would only be reported
        return rc
    except BrokenPipeError:
        # stdout's buffer still holds what the reader will never take: point fd 1 at
        # /dev/null so that the interpreter's last flush has somewhere to go
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


# ------------------------------------------- the C programs' names on PATH (pyproject.toml)


def _exec(name: str, argv: list[str]) -> None:
    """Replace this process with the C program."""
    from .launch.binaries import find_binary

    try:
        path = find_binary(name)
    except DuckpipeError as e:
        sys.exit(f"{name}: {e}")
    os.execv(path, [str(path), *argv])


def _names_a_msgpack_config(argv: list[str]) -> bool:
    """Whether ``--config FILE`` names the C program's own msgpack configuration (what
    ``duckpipe dataplane`` and the launchers write) rather than a TOML topology. A msgpack
    map starts with 0x80..0x8f, 0xde or 0xdf; a TOML file with text (ASCII, or a BOM)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg in ("--config", "-c") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            continue
        try:
            with open(path, "rb") as f:
                first = f.read(1)
        except OSError:
            return False  # the TOML path says what is wrong with it
        return bool(first) and (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF))
    return False


def dataplane_main() -> int:
    """``duckpipe-dataplane`` on PATH: ``duckpipe dataplane`` under its own name (a TOML
    topology or --ducks on loopback, this user's ports, --check, --backends, --version).
    A msgpack configuration is handed to the C program as it is: launchers that find the
    program on PATH keep working."""
    argv = sys.argv[1:]
    if _names_a_msgpack_config(argv):
        _exec("duckpipe-dataplane", argv)
    return program_main("dataplane", "duckpipe-dataplane", argv)


def ducks_main() -> int:
    """``duckpipe-ducks`` on PATH: ``duckpipe ducks`` under its own name (this user's
    ports by default, the counters as a table, --version)."""
    return program_main("ducks", "duckpipe-ducks", sys.argv[1:])
