"""The dataplane's configuration: what ``duckpipe dataplane`` writes (msgpack) for
duckpipe-dataplane to read (dataplane/src/runtime/dp_config.c).

Every default lives here, once: topology.py takes its TOML defaults from these
Structs, and the C reader takes its own from the generated dp_config_gen.h.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .abi import LAYER_TABLE, MAX_CLIENTS, MAX_DUCKS, MAX_NICS

__all__ = ["DataplaneConfig", "DuckConfig", "NicConfig", "check_limits", "default"]

U32 = Annotated[int, Meta(ge=0, le=0xFFFF_FFFF)]
U64 = Annotated[int, Meta(ge=0)]
FilePath = Annotated[str, Meta(max_length=255)]


class DuckConfig(msgspec.Struct, kw_only=True, frozen=True):
    id: Annotated[int, Meta(ge=0, lt=MAX_DUCKS)]
    ip: str
    port: Annotated[int, Meta(ge=1, le=65535)]


class NicConfig(msgspec.Struct, kw_only=True, frozen=True):
    name: Annotated[str, Meta(max_length=31)]
    backend: Annotated[str, Meta(max_length=31)] = "socket"
    interface: Annotated[str, Meta(max_length=31)] = ""
    host_ip: str
    host_port: Annotated[int, Meta(ge=1, le=65535)] = 47000
    broadcast: str = ""
    broadcast_port: Annotated[int, Meta(ge=0, le=65535)] = 0  # every duck's port when broadcast
    mtu: Annotated[int, Meta(ge=576, le=65535)] = 1500
    gso: bool = True
    # socket backend: UDP GRO on receive (one recvmsg takes a duck's GSO reply whole; the
    # backend cuts it back into datagrams); a kernel without it gets plain receives
    gro: bool = True
    busy_poll_us: U32 = 0
    rcvbuf: U32 = 16 << 20
    ducks: list[DuckConfig]
    # dpdk: rte_flow rules steering the ducks' replies (IPv4 to host_ip, UDP to host_port)
    # and ARP to the worker's RX queue. auto: where the port validates them, else say so
    # once and go on; require: refuse to start without them; off: none
    flow_steering: Literal["auto", "off", "require"] = "auto"
    # dpdk: at startup, wait this long at most for the port's link to come up (an E810
    # negotiating takes seconds), then start anyway with a warning; 0: do not wait
    link_wait_ms: Annotated[int, Meta(ge=0, le=60_000)] = 5000
    # dpdk: the port's RX and TX descriptors and its pool's mbufs; 0: sized from the
    # topology at open (docs/dpdk.md "Settings"), a value is checked against the port
    rx_desc: Annotated[int, Meta(ge=0, le=32768)] = 0
    tx_desc: Annotated[int, Meta(ge=0, le=32768)] = 0
    mbufs: U32 = 0
    # dpdk, zero copy: how long the port may keep a finished part's buffers while nothing
    # else is sent before the worker sends a flush burst (a NIC that frees only on later
    # traffic: ice reports completions every tx_rs_thresh descriptors)
    zc_hold_max_us: Annotated[int, Meta(ge=1, le=1_000_000)] = 50


class DataplaneConfig(msgspec.Struct, kw_only=True, frozen=True):
    control: Annotated[str, Meta(min_length=1, max_length=255)]  # the ZeroMQ endpoint
    dedicated_threads: bool = False  # else every agent shares one thread
    cores: list[int] = []  # control, dispatcher, worker 0..: pin when >= 0
    idle: Literal["spin", "yield", "backoff"] = "backoff"
    # backoff: spin this long after the last work (by yielding, when `cores` did not pin
    # the runner: a client it woke there runs first), then yield as long again, then park
    # until a doorbell, a datagram or the next timer wakes it
    idle_spin_us: Annotated[int, Meta(ge=0, le=1_000_000)] = 50
    # backoff: after a send whose replies the ducks' measured reply times put further off
    # than idle_spin_us + 250 us, park until idle_spin_us before they are due, the NIC's
    # socket unheard (its early replies wait in the socket), instead of spinning or
    # waking for each (dp_main.c)
    idle_expect: bool = True
    # ZeroMQ completions wait up to this long to leave together (32 at most): each send
    # wakes both sides' ZeroMQ I/O threads, and result() needs nothing from them
    completion_flush_us: Annotated[int, Meta(ge=0, le=1_000_000)] = 500
    default_timeout_us: U32 = 1_000_000  # a forward's deadline unless the client sets one
    nack_us: U32 = 2000  # a duck's NACK timeout (RTO) until its reply time is measured
    nack_min_us: U32 = 200  # the measured RTO's floor (also RFC 6298's G)
    nack_max_us: U32 = 50_000  # the RTO's ceiling, backoff included
    weight_rto_us: U32 = 20_000  # weight datagram retransmit timeout
    weight_timeout_ms: U32 = 10_000  # a weight chunk not acked by then fails
    client_timeout_ms: U32 = 10_000  # client heartbeat age that counts as dead
    max_inflight: U32 = 64  # forward contexts, a power of two up to 4096
    # largest activation (and result) of one forward: a 4,096-token prefill of 7168 bf16
    # (58.7 MB) with its routing table; sums take memory as forwards use them (dp_worker.c)
    max_forward_bytes: U32 = 64 << 20
    ping_ms: U32 = 1000
    # a duck heard from neither reply, PONG nor ACK for max(this, 3 pings) is lost: its
    # stats say so, and routed forwards go around it (docs/architecture.md)
    duck_lost_ms: U32 = 3000
    # a routed duck silent this long (and 8 of its smoothed reply times) into a forward has
    # its rows resent to another live replica within the forward; rows with none wait for
    # the forward's deadline (docs/architecture.md, failover)
    failover_ms: U32 = 500
    # --- per-client quotas and bounds (issue 7) ---
    client_max_inflight: U32 = 64  # forwards in flight per client
    client_max_slots: U32 = 1024  # slots of one client's segment
    client_max_segment_bytes: U64 = 1 << 30  # size of one client's segment
    max_timeout_us: U32 = 10_000_000  # longest deadline a client may ask for
    client_max_layers: U32 = 128  # layers one client may hold (x MAX_CLIENTS <= LAYER_TABLE)
    client_max_weight_bytes: U64 = 8 << 30  # bytes of all one client's layers
    max_hidden: U32 = 65536  # LoadWeights.hidden bound
    max_ffn: U32 = 1 << 20  # LoadWeights.ffn bound
    client_max_per_pid: U32 = 4  # clients one process may attach (of MAX_CLIENTS)
    # clients one user other than the dataplane's own may attach, whatever its processes
    client_max_per_uid: U32 = 16
    # client slots only the dataplane's own user (the admin) may take: other users together
    # attach at most MAX_CLIENTS minus these, so the admin's clients always get in
    admin_reserved_clients: U32 = 4
    # control connections held at once: at the limit the endpoint is unbound until they
    # drop below 90% (attached clients keep theirs); must fit well under RLIMIT_NOFILE
    max_connections: U32 = 256
    # --- who may talk to the control socket ---
    control_group: Annotated[str, Meta(max_length=31)] = ""  # members are clients (not admins)
    curve_secret_key_file: FilePath = ""  # tcp:// needs these: z85 keys, one per file
    curve_public_key_file: FilePath = ""
    curve_clients_file: FilePath = ""  # z85 public keys admitted, one per line
    nics: Annotated[list[NicConfig], Meta(min_length=1, max_length=MAX_NICS)]


def default(name: str, cls: type[msgspec.Struct] = DataplaneConfig) -> object:
    """The default of one field, for the TOML topology's own Struct."""
    for f in msgspec.structs.fields(cls):
        if f.name == name:
            if f.default is not msgspec.NODEFAULT:
                return f.default
            break
    raise KeyError(f"{cls.__name__}.{name} has no default")


def check_limits(
    client_max_layers: int,
    client_max_per_pid: int,
    client_max_per_uid: int,
    admin_reserved_clients: int,
) -> str | None:
    """Why a config's table quotas cannot work (the C dataplane refuses them at start too),
    or None: every client at its layer quota must leave the layer table room, and the
    admin must keep at least one client slot."""
    if MAX_CLIENTS * client_max_layers > LAYER_TABLE:
        return (
            f"client_max_layers {client_max_layers} x {MAX_CLIENTS} clients passes the "
            f"layer table ({LAYER_TABLE}): at most {LAYER_TABLE // MAX_CLIENTS}"
        )
    if not 1 <= client_max_per_pid <= MAX_CLIENTS:
        return f"client_max_per_pid {client_max_per_pid} is outside [1, {MAX_CLIENTS}]"
    if not 1 <= client_max_per_uid <= MAX_CLIENTS:
        return f"client_max_per_uid {client_max_per_uid} is outside [1, {MAX_CLIENTS}]"
    if not 1 <= admin_reserved_clients < MAX_CLIENTS:
        return f"admin_reserved_clients {admin_reserved_clients} is outside [1, {MAX_CLIENTS - 1}]"
    return None
