/* dp_config.h: the dataplane's configuration, read from a msgpack file that
 * `duckpipe dataplane` writes from the TOML topology (duckpipe/topology.py). */
#ifndef DP_CONFIG_H
#define DP_CONFIG_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_idle.h"

#define DP_MAX_NICS 8
#define DP_MAX_CORES 16
#define DP_NAME_LEN 32

struct dp_duck_cfg {
	uint16_t id;
	uint16_t nic;         /* index into nics */
	struct sockaddr_in addr;
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
	uint32_t busy_poll_us;
	uint32_t rcvbuf;
};

struct dp_config {
	char control[256];
	bool dedicated_threads;      /* else every agent shares one thread */
	int cores[DP_MAX_CORES];     /* control, dispatcher, worker 0..: pin when >= 0 */
	uint32_t ncores;
	enum dp_idle_kind idle;
	uint32_t default_timeout_us;
	uint32_t nack_us;            /* first NACK after this, then every this */
	uint32_t weight_rto_us;      /* weight datagram retransmit timeout */
	uint32_t weight_timeout_ms;  /* a weight chunk not acked by then fails */
	uint32_t client_timeout_ms;  /* client heartbeat age that counts as dead */
	uint32_t max_inflight;       /* forward contexts, a power of two */
	uint32_t max_forward_bytes;  /* largest activation (and result) of one forward */
	uint32_t ping_ms;
	/* per-client limits (issue 7): one client costs at most this much of the dataplane */
	uint32_t client_max_inflight;      /* descriptors in flight; more wait in its ring */
	uint32_t client_max_slots;         /* slot_count of a segment at attach */
	uint64_t client_max_segment_bytes; /* size of a segment at attach */
	uint32_t max_timeout_us;           /* largest deadline a descriptor may ask for */
	uint32_t nnics;
	struct dp_nic_cfg nics[DP_MAX_NICS];
	uint32_t nducks;
	struct dp_duck_cfg ducks[DP_MAX_DUCKS];
};

/* 0 on success; -1 with dp_error() naming the key that is wrong. */
int dp_config_load(const char *path, struct dp_config *cfg);

#endif /* DP_CONFIG_H */
