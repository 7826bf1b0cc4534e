"""The cluster's topology and the dataplane's settings: a TOML file decoded with msgspec.

::

    threads = "shared"            # or "dedicated": one thread per agent, pinned to `cores`
                                  # (a dpdk NIC's worker: an EAL worker lcore, from -l/--lcores)
    idle = "backoff"              # spin | yield | backoff (spin, yield, then park on wake-ups)
    idle_spin_us = 50             # backoff: spin this long after the last work (by yielding
                                  # when `cores` did not pin the runner), yield as long, park
    idle_expect = true            # backoff: park (no spin) until idle_spin_us before the
                                  # ducks' replies are due by their measured reply times
    completion_flush_us = 500     # ZeroMQ completions leave together, at most this late
    default_timeout_ms = 1000     # a forward's deadline unless the client sets one
    client_max_inflight = 64      # per client: forwards in flight (more wait in its ring)
    client_max_slots = 1024       # per client: slots in its segment
    client_max_segment_bytes = 1073741824
    max_timeout_us = 10000000     # the longest deadline a client may ask for
    control_group = ""            # members may be clients (not admins) of the dataplane
    client_max_layers = 128       # every setting and its default: duckpipe/schema/config.py
    client_max_weight_bytes = 8589934592
    client_max_per_pid = 4        # clients one process may attach
    client_max_per_uid = 16       # clients one user may attach (not the dataplane's own)
    admin_reserved_clients = 4    # client slots only the dataplane's own user may take
    max_connections = 256         # control connections at once (the endpoint pauses past it)

    [[nics]]
    name = "lo"
    backend = "socket"            # kernel UDP; "null": no network, the ducks answer at once
                                  # (docs/architecture.md); "dpdk": docs/dpdk.md
    interface = ""                # SO_BINDTODEVICE when set; dpdk: the port (net_af_packet0)
    host_ip = "127.0.0.1"         # the dataplane's address on this NIC
    host_port = 47000
    broadcast = ""                # the subnet's broadcast address; empty: unicast fan-out
    prefix = 24                   # host_ip's subnet (/24); default: the one broadcast names,
                                  # else 8 on loopback, else 24. Every duck must be inside it
    mtu = 1500
    flow_steering = "auto"        # dpdk: rte_flow rules for duck replies (auto|off|require)
    link_wait_ms = 5000           # dpdk: wait for the link at startup at most this long
    rx_desc = 0                   # dpdk: RX descriptors, tx_desc, mbufs; 0: from the topology
    zc_hold_max_us = 50           # dpdk: flush a port idle this long that holds a slot

    [[nics.ducks]]
    id = 0
    ip = "127.0.0.1"
    port = 47100

Without a file, :func:`loopback` puts N ducks on 127.0.0.1, which needs no root.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta

from ..errors import BadInput
from ..schema import config as cfgschema
from ..schema.abi import MAX_DUCKS, MAX_NICS
from ..schema.config import default

__all__ = ["DEFAULT_DUCK_PORT", "DEFAULT_HOST_PORT", "Duck", "Nic", "Topology", "load", "loopback"]

DEFAULT_HOST_PORT = 47000
DEFAULT_DUCK_PORT = 47100

Port = Annotated[int, Meta(ge=1, le=65535)]
IPv4 = Annotated[str, Meta(pattern=r"^\d{1,3}(\.\d{1,3}){3}$")]


class Duck(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    id: Annotated[int, Meta(ge=0, lt=MAX_DUCKS)]
    ip: IPv4
    port: Port


class Nic(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=15)]
    backend: Literal["socket", "null", "dpdk"] = "socket"
    interface: Annotated[str, Meta(max_length=15)] = ""
    host_ip: IPv4
    host_port: Port = DEFAULT_HOST_PORT
    broadcast: str = ""
    # the subnet's prefix length: every duck's ip must lie in host_ip/prefix. None: the
    # prefix whose broadcast address `broadcast` is, else 8 on loopback, else 24
    prefix: Annotated[int, Meta(ge=0, le=32)] | None = None
    mtu: Annotated[int, Meta(ge=576, le=65535)] = 1500
    gso: bool = True
    # socket backend: receive with UDP GRO where the kernel has it (docs/walkthrough.md)
    gro: bool = default("gro", cfgschema.NicConfig)
    busy_poll_us: Annotated[int, Meta(ge=0)] = 0
    rcvbuf: Annotated[int, Meta(ge=65536)] = 16 << 20
    ducks: list[Duck]
    # dpdk: rte_flow steering of duck replies and ARP to the worker's queue (docs/dpdk.md)
    flow_steering: Literal["auto", "off", "require"] = default("flow_steering", cfgschema.NicConfig)
    # dpdk: wait at most this long at startup for the link to come up (docs/dpdk.md)
    link_wait_ms: Annotated[int, Meta(ge=0, le=60_000)] = default(
        "link_wait_ms", cfgschema.NicConfig
    )
    # dpdk: RX/TX descriptors and mbufs of the port; 0: sized from the topology (docs/dpdk.md)
    rx_desc: Annotated[int, Meta(ge=0, le=32768)] = default("rx_desc", cfgschema.NicConfig)
    tx_desc: Annotated[int, Meta(ge=0, le=32768)] = default("tx_desc", cfgschema.NicConfig)
    mbufs: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default("mbufs", cfgschema.NicConfig)
    # dpdk, zero copy: a flush burst after this long idle while the port holds a slot
    zc_hold_max_us: Annotated[int, Meta(ge=1, le=1_000_000)] = default(
        "zc_hold_max_us", cfgschema.NicConfig
    )


class Topology(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    control: str = ""
    threads: Literal["shared", "dedicated"] = "shared"
    cores: list[Annotated[int, Meta(ge=0)]] = []
    idle: Literal["spin", "yield", "backoff"] = "backoff"
    idle_spin_us: Annotated[int, Meta(ge=0, le=1_000_000)] = default("idle_spin_us")
    idle_expect: bool = default("idle_expect")
    completion_flush_us: Annotated[int, Meta(ge=0, le=1_000_000)] = default("completion_flush_us")
    default_timeout_ms: Annotated[float, Meta(gt=0)] = default("default_timeout_us") / 1000
    nack_us: Annotated[int, Meta(ge=100)] = default("nack_us")
    nack_min_us: Annotated[int, Meta(ge=10, le=0xFFFF_FFFF)] = default("nack_min_us")
    nack_max_us: Annotated[int, Meta(ge=100, le=0xFFFF_FFFF)] = default("nack_max_us")
    weight_rto_us: Annotated[int, Meta(ge=100)] = default("weight_rto_us")
    weight_timeout_ms: Annotated[int, Meta(ge=1)] = default("weight_timeout_ms")
    client_timeout_ms: Annotated[int, Meta(ge=100)] = default("client_timeout_ms")
    max_inflight: Annotated[int, Meta(ge=1, le=4096)] = default("max_inflight")
    max_forward_bytes: Annotated[int, Meta(ge=4096)] = default("max_forward_bytes")
    ping_ms: Annotated[int, Meta(ge=10)] = default("ping_ms")
    duck_lost_ms: Annotated[int, Meta(ge=100, le=0xFFFF_FFFF)] = default("duck_lost_ms")
    failover_ms: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)] = default("failover_ms")
    client_max_inflight: Annotated[int, Meta(ge=1)] = default("client_max_inflight")
    client_max_slots: Annotated[int, Meta(ge=1)] = default("client_max_slots")
    client_max_segment_bytes: Annotated[int, Meta(ge=4096)] = default("client_max_segment_bytes")
    max_timeout_us: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)] = default("max_timeout_us")
    client_max_layers: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default("client_max_layers")
    client_max_weight_bytes: Annotated[int, Meta(ge=0)] = default("client_max_weight_bytes")
    max_hidden: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)] = default("max_hidden")
    max_ffn: Annotated[int, Meta(ge=1, le=0xFFFF_FFFF)] = default("max_ffn")
    client_max_per_pid: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default("client_max_per_pid")
    client_max_per_uid: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default("client_max_per_uid")
    admin_reserved_clients: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default(
        "admin_reserved_clients"
    )
    max_connections: Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)] = default("max_connections")
    control_group: Annotated[str, Meta(max_length=31)] = default("control_group")
    curve_secret_key_file: str = default("curve_secret_key_file")
    curve_public_key_file: str = default("curve_public_key_file")
    curve_clients_file: str = default("curve_clients_file")
    nics: Annotated[list[Nic], Meta(min_length=1, max_length=MAX_NICS)]

    def __post_init__(self) -> None:
        if self.max_inflight & (self.max_inflight - 1):
            raise ValueError(f"max_inflight ({self.max_inflight}) must be a power of two")
        if self.max_timeout_us < self.default_timeout_ms * 1000:
            raise ValueError(
                f"max_timeout_us ({self.max_timeout_us}) is below default_timeout_ms "
                f"({self.default_timeout_ms:g})"
            )
        if self.nack_min_us > self.nack_max_us:
            raise ValueError(
                f"nack_min_us ({self.nack_min_us}) is above nack_max_us ({self.nack_max_us})"
            )
        seen: set[int] = set()
        for nic in self.nics:
            if nic.broadcast and len({d.port for d in nic.ducks}) > 1:
                raise ValueError(
                    f"NIC {nic.name!r} broadcasts, so its ducks must all listen on one port"
                )
            ips = [nic.host_ip, *(d.ip for d in nic.ducks)]
            if nic.broadcast:
                ips.append(nic.broadcast)
            for ip in ips:
                try:
                    ipaddress.IPv4Address(ip)
                except ValueError:
                    raise ValueError(f"NIC {nic.name!r}: {ip!r} is not an IPv4 address") from None
            subnet = _subnet(nic)
            for d in nic.ducks:
                if ipaddress.IPv4Address(d.ip) not in subnet:
                    raise ValueError(
                        f"duck {d.id}'s address {d.ip} is outside the subnet {subnet} of NIC "
                        f"{nic.name!r} (host_ip {nic.host_ip}): the NIC cannot reach it. Fix the "
                        "duck's ip, or set the NIC's prefix (its subnet's prefix length)"
                    )
                if d.id in seen:
                    raise ValueError(f"duck id {d.id} appears twice")
                seen.add(d.id)
        if not seen:
            raise ValueError("the topology has no ducks")

    @property
    def ducks(self) -> list[Duck]:
        return [d for nic in self.nics for d in nic.ducks]

    def to_config(self, control: str) -> bytes:
        """The msgpack configuration duckpipe-dataplane reads (src/runtime/dp_config.c)."""
        return msgspec.msgpack.encode(self.dataplane_config(control))

    def dataplane_config(self, control: str) -> cfgschema.DataplaneConfig:
        own = {f: getattr(self, f) for f in self.__struct_fields__}
        shared = {f: own[f] for f in cfgschema.DataplaneConfig.__struct_fields__ if f in own}
        shared.update(
            control=control,
            dedicated_threads=self.threads == "dedicated",
            default_timeout_us=int(self.default_timeout_ms * 1000),
            nics=[_nic_config(n) for n in self.nics],
        )
        return cfgschema.DataplaneConfig(**shared)


def _subnet(nic: Nic) -> ipaddress.IPv4Network:
    """The NIC's subnet: host_ip/prefix, the prefix given, or the one its broadcast address
    implies, or 8 on loopback, or 24."""
    host = ipaddress.IPv4Address(nic.host_ip)
    prefix = nic.prefix
    if prefix is None and nic.broadcast:
        bcast = ipaddress.IPv4Address(nic.broadcast)
        for p in range(32, -1, -1):
            net = ipaddress.IPv4Network((host, p), strict=False)
            if net.broadcast_address == bcast:
                prefix = p
                break
            if net.broadcast_address > bcast:
                break
    if prefix is None:
        prefix = 8 if host.is_loopback else 24
    net = ipaddress.IPv4Network((host, prefix), strict=False)
    if (
        nic.broadcast
        and nic.prefix is not None
        and net.broadcast_address != ipaddress.IPv4Address(nic.broadcast)
    ):
        raise ValueError(
            f"NIC {nic.name!r}: broadcast {nic.broadcast} is not the broadcast address of "
            f"its subnet {net} ({net.broadcast_address})"
        )
    return net


def _nic_config(nic: Nic) -> cfgschema.NicConfig:
    fields = msgspec.structs.asdict(nic)
    del fields["prefix"]  # checked here; the dataplane does not need it
    fields["ducks"] = [cfgschema.DuckConfig(**msgspec.structs.asdict(d)) for d in nic.ducks]
    # one datagram to the subnet reaches every duck: they share a port (checked above)
    fields["broadcast_port"] = nic.ducks[0].port if nic.broadcast and nic.ducks else 0
    return cfgschema.NicConfig(**fields)


def _choices_at(keys: list[str]) -> tuple[str, ...]:
    """The values a ``Literal`` field takes, found by its keys from Topology down
    (``["nics", "0", "backend"]``); empty when the keys do not end at one."""
    hint: object = Topology
    for key in keys:
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            hint = get_type_hints(hint, include_extras=True).get(key)
        elif get_origin(hint) is list and key.isdigit():
            (hint,) = get_args(hint)
        else:
            return ()
        while get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
    return tuple(str(a) for a in get_args(hint)) if get_origin(hint) is Literal else ()


def _valid_choices(error: str) -> str:
    """For msgspec's "Invalid enum value 'sockit' - at `$.nics[0].backend`": the values
    that field takes, and the one the bad value was probably meant to be."""
    m = re.match(r"Invalid enum value '(.*)' - at `\$\.(.+)`$", error)
    if not m:
        return ""
    choices = _choices_at(re.findall(r"[^.\[\]]+", m.group(2)))
    if not choices:
        return ""
    close = difflib.get_close_matches(m.group(1), choices, n=1)
    return f" (valid: {', '.join(choices)}" + (f"; did you mean {close[0]!r}?)" if close else ")")


def load(path: str | Path) -> Topology:
    """Decode a TOML topology; errors name the key, the value and why."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"cannot read topology {path}: {e.strerror}") from e
    try:
        return msgspec.toml.decode(raw, type=Topology)
    except msgspec.ValidationError as e:
        raise BadInput(f"topology {path}: {e}{_valid_choices(str(e))}") from None
    except msgspec.DecodeError as e:
        raise BadInput(f"topology {path} is not valid TOML: {e}") from None


def loopback(
    ducks: int = 8,
    *,
    host_port: int = DEFAULT_HOST_PORT,
    duck_port: int = DEFAULT_DUCK_PORT,
    backend: str = "socket",
    **settings: object,
) -> Topology:
    """N ducks on 127.0.0.1 ports duck_port.., unicast fan-out (loopback has no broadcast).

    ``backend="null"``: no ducks need to run; the dataplane answers for them."""
    if not 1 <= ducks <= MAX_DUCKS:
        raise BadInput(f"ducks must be between 1 and {MAX_DUCKS}, not {ducks}")
    if backend not in ("socket", "null", "dpdk"):
        raise BadInput(f"backend must be socket, null or dpdk, not {backend!r}")
    nic = Nic(
        name="lo",
        host_ip="127.0.0.1",
        host_port=host_port,
        ducks=[Duck(id=i, ip="127.0.0.1", port=duck_port + i) for i in range(ducks)],
        backend=backend,  # type: ignore[arg-type]
    )
    try:
        return Topology(nics=[nic], **settings)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise BadInput(str(e)) from None
