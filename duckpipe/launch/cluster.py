"""A whole emulated cluster on this host: duck emulators plus the C dataplane.

``with Cluster(ducks=24) as cl: duckpipe.connect(cl.control)``. Ports are picked
free on loopback, so several clusters (and tests) can run side by side.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping, Sequence

from ..errors import DuckpipeError
from .dataplane import DataplaneProcess
from .ducks import DucksProcess
from .topology import Duck, Nic, Topology

__all__ = ["Cluster", "free_udp_ports"]


def free_udp_ports(count: int, *, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A base port such that base .. base+count-1 are free for UDP on host right now."""
    for _ in range(attempts):
        base = random.randrange(20000, 60000 - count)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise DuckpipeError(f"found no {count} consecutive free UDP ports on {host}")


class Cluster:
    """Duck emulators and a dataplane on loopback.

    ``groups`` splits the ducks over several emulator processes, each with its
    own extra arguments (fault knobs): e.g. ``[(3, []), (1, ["--stop-after", "0"])]``.
    ``nics`` > 1 spreads the ducks over that many loopback "NICs" (one host port each).
    ``emulators`` > 1 splits the ducks over that many emulator processes; one emulator
    already computes its ducks on every CPU it may use (``--threads``), so several share
    those CPUs out: each gets ``--threads`` CPUs // ``emulators`` (at least 1) unless
    ``duck_args`` names its own. ``mtu`` is every loopback
    NIC's (the ducks' partials are cut to it too: pass ``duck_args=["--mtu", ...]``).
    ``nic_settings`` go to every NIC (e.g. ``{"gro": False}``); ``settings`` to the topology.
    """

    def __init__(
        self,
        ducks: int = 8,
        *,
        groups: Sequence[tuple[int, Sequence[str]]] | None = None,
        nics: int = 1,
        duck_args: Sequence[str] = (),
        emulators: int = 1,
        mtu: int = 1500,
        nic_settings: Mapping[str, object] | None = None,
        **settings: object,
    ) -> None:
        if groups is None:  # split evenly over `emulators` processes
            share = [ducks // emulators + (i < ducks % emulators) for i in range(emulators)]
            args = list(duck_args)
            if emulators > 1 and "--threads" not in args:  # not emulators x CPUs threads
                args += ["--threads", str(max(1, len(os.sched_getaffinity(0)) // emulators))]
            groups = [(n, args) for n in share if n]
        self.groups = list(groups)
        self.ducks = sum(n for n, _ in self.groups)
        base = free_udp_ports(self.ducks + nics)
        self.host_ports = [base + i for i in range(nics)]
        self.duck_base = base + nics
        per_nic = [[] for _ in range(nics)]
        for i in range(self.ducks):
            per_nic[i % nics].append(Duck(id=i, ip="127.0.0.1", port=self.duck_base + i))
        self.topology = Topology(
            nics=[
                Nic(
                    name=f"lo{k}",
                    host_ip="127.0.0.1",
                    host_port=self.host_ports[k],
                    mtu=mtu,
                    ducks=per_nic[k],
                    **(nic_settings or {}),  # type: ignore[arg-type]
                )
                for k in range(nics)
            ],
            **settings,  # type: ignore[arg-type]
        )
        self.emulators: list[DucksProcess] = []
        self.dataplane: DataplaneProcess | None = None
        self.exit_code: int | None = None

    @property
    def control(self) -> str:
        assert self.dataplane is not None
        return self.dataplane.control

    def start(self) -> Cluster:
        try:
            first = 0
            for n, args in self.groups:
                proc = DucksProcess(
                    ducks=n, base_port=self.duck_base + first, first_id=first, args=args
                )
                self.emulators.append(proc.start())
                first += n
            self.dataplane = DataplaneProcess(self.topology).start()
        except BaseException:
            self.stop()
            raise
        return self

    def output(self) -> str:
        """What the dataplane printed (its log, and any sanitizer report)."""
        return self.dataplane.output() if self.dataplane else ""

    def stop(self) -> int | None:
        """Stop everything; returns the dataplane's exit code."""
        if self.dataplane is not None and self.dataplane.proc is not None:
            self.exit_code = self.dataplane.stop()
        for d in self.emulators:
            d.stop()
        self.emulators.clear()
        return self.exit_code

    def __enter__(self) -> Cluster:
        return self.start()

    def close(self) -> None:
        if self.dataplane is not None:
            self.dataplane.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close()
