/* dp_dpdk_size.h: how big a dpdk port's rings, mbuf pool and pool cache are, and whether
 * its worker runs on the port's NUMA socket: arithmetic on numbers the backend gathers
 * at open (dp_dpdk_size.c; test_dpdk_size.c checks it without a port). */
#ifndef DP_DPDK_SIZE_H
#define DP_DPDK_SIZE_H

#include <stdbool.h>
#include <stdint.h>

#define DP_DPDK_RX_DESC_MIN 1024u  /* what the backend had before it sized from the topology */
#define DP_DPDK_RX_DESC_MAX 32768u /* the largest power of two in a uint16 ring size */
#define DP_DPDK_TX_DESC 1024u      /* the worker paces TX itself: bursts, retries */
#define DP_DPDK_CACHE 256u         /* per-lcore mempool cache: 8 bursts (l2fwd's 256) */
#define DP_DPDK_BURST 32u
/* net_af_xdp posts this many mbufs to its XSK fill ring at queue setup and one more per
 * frame it hands out (ETH_AF_XDP_DFLT_NUM_DESCS = libxdp's XSK_RING_CONS__DEFAULT_NUM_DESCS,
 * no devarg in DPDK 22.11 to 25.x): the most frames that can wait for the worker, whatever
 * the RX ring. Its XSK RX and TX rings are both rx_desc big (a power of two). */
#define DP_DPDK_AF_XDP_FILL 2048u

/* A port's descriptor limits (rte_eth_desc_lim's first three). */
struct dp_dpdk_desc_lim {
	uint16_t nb_max, nb_min, nb_align;
};

/* RX descriptors that hold one forward's replies from every duck of the NIC at once
 * (ducks x frames of a max_forward_bytes reply: the incast), as a power of two within
 * [DP_DPDK_RX_DESC_MIN, DP_DPDK_RX_DESC_MAX]. */
uint32_t dp_dpdk_rx_want(uint32_t ducks, uint32_t reply_frames);

/* Zero-copy chunks in flight the pool makes room for: every context's chunks of a
 * max_forward_bytes forward, up to DP_DPDK_ZC_BYTES of them. Past that a chunk waits for
 * an mbuf (tx_errors, resent): with max_forward_bytes at 64 MiB (a prefill in one forward)
 * room for all 64 contexts' would be 3 million mbufs, ~7 GiB, for what two such forwards
 * in flight use; the old default (64 contexts of 1 MiB) stays whole. */
#define DP_DPDK_ZC_BYTES (128ull << 20)
uint64_t dp_dpdk_zc_chunks(uint32_t max_inflight, uint32_t max_forward_bytes, uint32_t payload);

/* A configured descriptor count (rx_desc, tx_desc) against the port's limits: 0, or -1
 * with dp_error naming the setting, the value and what the port takes. */
int dp_dpdk_desc_check(const char *what, uint32_t n, const struct dp_dpdk_desc_lim *lim);

struct dp_dpdk_pool_in {
	uint32_t nrx, ntx;       /* the port's rings, as set up */
	uint32_t lcores;         /* EAL lcores: each may strand a cache's worth */
	uint64_t zc_chunks;      /* header mbufs of zero-copy chunks in flight */
	uint32_t elt_bytes;      /* one mbuf with its data room */
	uint64_t budget_bytes;   /* hugepage memory the pool may take (0: no bound known) */
	uint32_t mbufs_cfg;      /* the NIC's `mbufs`, 0: sized here */
};

struct dp_dpdk_pool_plan {
	uint32_t mbufs;  /* rte_pktmbuf_pool_create's n */
	uint32_t cache;  /* and its cache_size: <= RTE_MEMPOOL_CACHE_MAX_SIZE, 1.5 x <= n */
	uint32_t want;   /* what the rings, caches and zero-copy chunks call for */
	bool capped;     /* the budget cut zero-copy room from want */
};

/* The pool for a port: 0, or -1 with dp_error where `mbufs` cannot fill the rings. */
int dp_dpdk_pool_plan(const struct dp_dpdk_pool_in *in, struct dp_dpdk_pool_plan *out);

/* The pool cache for n mbufs: DP_DPDK_CACHE, within what rte_mempool takes. */
uint32_t dp_dpdk_cache_size(uint32_t n);

/* Free hugepage memory on a NUMA socket (all sockets when socket < 0), from sysfs. */
uint64_t dp_dpdk_hugepages_free(int socket);

/* The worker's CPUs against the port's socket (l2fwd and l3fwd warn on a remote one). */
enum dp_dpdk_numa {
	DP_DPDK_NUMA_LOCAL,   /* every CPU of the worker on the port's socket */
	DP_DPDK_NUMA_UNKNOWN, /* the port has no socket (a vdev, SOCKET_ID_ANY) or no CPUs */
	DP_DPDK_NUMA_REMOTE,  /* every CPU on another socket: each frame crosses the link */
	DP_DPDK_NUMA_SPANS,   /* unpinned over CPUs of several sockets */
};
enum dp_dpdk_numa dp_dpdk_numa_verdict(int port_socket, const int *cpu_sockets, unsigned n);
/* A CPU's NUMA node from sysfs (its nodeN entry), -1 when it has none. */
int dp_dpdk_cpu_socket(unsigned cpu);

#endif /* DP_DPDK_SIZE_H */
