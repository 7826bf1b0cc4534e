/* dp_config.h: the dataplane's configuration, read from a msgpack file that
 * `duckpipe dataplane` writes from the TOML topology (duckpipe/launch/topology.py). */
#ifndef DP_CONFIG_H
#define DP_CONFIG_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include "dp_abi.h" /* DP_MAX_NICS: the schema's MAX_NICS */
#include "dp_idle.h"

#define DP_MAX_CORES 16
#define DP_NAME_LEN 32

struct dp_duck_cfg {
	uint16_t id;
	uint16_t nic;         /* index into nics */
	struct sockaddr_in addr;
};

enum dp_flow_steering {
	DP_FLOW_AUTO,    /* where the port takes the rules; else logged, and on without */
	DP_FLOW_OFF,
	DP_FLOW_REQUIRE, /* open fails without them */
};

struct dp_nic_cfg {
	char name[DP_NAME_LEN];
	char backend[DP_NAME_LEN];   /* "socket" (or "dpdk") */
	char interface[DP_NAME_LEN]; /* SO_BINDTODEVICE when set */
	struct sockaddr_in host;     /* the dataplane's own address on this NIC */
	struct sockaddr_in broadcast;
	bool use_broadcast;          /* else unicast fan-out, each duck in turn */
	uint32_t mtu;
	bool gso;
	bool gro;                    /* socket: receive with UDP GRO (dp_gro.h) */
	uint32_t busy_poll_us;
	uint32_t rcvbuf;
	enum dp_flow_steering flow_steering; /* dpdk: rte_flow rules (dp_dpdk_flow.c) */
	uint32_t link_wait_ms;       /* dpdk: at open, wait for the link this long at most */
	/* dpdk: RX / TX descriptors and the pool's mbufs; 0: sized from the topology at
	 * open (dp_dpdk_size.c) */
	uint32_t rx_desc;
	uint32_t tx_desc;
	uint32_t mbufs;
	uint32_t zc_hold_max_us;     /* dpdk: flush burst after this long idle holding a slot */
};

struct dp_config {
	char control[256];
	bool dedicated_threads;      /* else every agent shares one thread */
	int cores[DP_MAX_CORES];     /* control, dispatcher, worker 0..: pin when >= 0 */
	uint32_t ncores;
	enum dp_idle_kind idle;
	uint32_t idle_spin_us;       /* backoff: spin, then yield as long, then park */
	bool idle_expect;            /* backoff: park until replies are due (dp_main.c) */
	uint32_t completion_flush_us; /* ZeroMQ completions wait this long to leave together */
	uint32_t default_timeout_us;
	uint32_t nack_us;            /* a duck's NACK timeout until its reply time is measured */
	uint32_t nack_min_us;        /* the measured NACK timeout's floor */
	uint32_t nack_max_us;        /* and its ceiling, backoff included */
	uint32_t weight_rto_us;      /* weight datagram retransmit timeout */
	uint32_t weight_timeout_ms;  /* a weight chunk not acked by then fails */
	uint32_t client_timeout_ms;  /* client heartbeat age that counts as dead */
	uint32_t max_inflight;       /* forward contexts, a power of two */
	uint32_t max_forward_bytes;  /* largest activation (and result) of one forward */
	uint32_t ping_ms;
	uint32_t duck_lost_ms;       /* silent for max(this, 3 pings): lost (dp_stats.c) */
	uint32_t failover_ms;        /* a routed duck silent this long: its rows to a replica */
	/* per-client quotas and bounds */
	uint32_t client_max_inflight;      /* forwards in flight per client */
	uint32_t client_max_slots;         /* slots of one segment */
	uint64_t client_max_segment_bytes;
	uint32_t max_timeout_us;           /* longest deadline a client may ask for */
	uint32_t client_max_layers;
	uint64_t client_max_weight_bytes;  /* shards + b_down of all one client's layers */
	uint32_t max_hidden;
	uint32_t max_ffn;
	uint32_t client_max_per_pid;       /* clients one process may attach */
	uint32_t client_max_per_uid;       /* clients one user but the dataplane's may attach */
	uint32_t admin_reserved_clients;   /* client slots only the dataplane's user may take */
	uint32_t max_connections;          /* control connections at once (dp_control_connections.c) */
	/* who may talk to the control socket */
	char control_group[32];            /* members are clients; "" = the dataplane's user only */
	char curve_secret_key_file[256];   /* tcp:// control needs CURVE keys */
	char curve_public_key_file[256];
	char curve_clients_file[256];
	uint32_t nnics;
	struct dp_nic_cfg nics[DP_MAX_NICS];
	uint32_t nducks;
	struct dp_duck_cfg ducks[256];
};

/* 0 on success; -1 with dp_error() naming the key that is wrong. */
int dp_config_load(const char *path, struct dp_config *cfg);

#endif /* DP_CONFIG_H */
