/* dp_backend.h: how a NIC worker moves datagrams, as an ops table (l3fwd's lookup
 * modes are the model). `socket` is kernel UDP; `null` answers for the ducks itself,
 * with no network (dp_backend_null.c); `dpdk` (dp_backend_dpdk.c, only in a build
 * that found libdpdk: DP_HAVE_DPDK) drives a DPDK port. dp_backend.c looks them up. */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dp_abi.h"
#include "dp_config.h"
#include "dp_counters.h"
#include "dp_mem.h"

/* Who a message belongs to: a forward's (or weight chunk's) part on one NIC. A backend
 * that sends a payload piece in place (an external buffer the port frees later) counts
 * it in held until the port lets go of it; the worker completes the part, and with it
 * releases the client's slot, only once held is 0 (dp_release.h). Control datagrams
 * (NACK, PING, LAYER: the worker's own memory) have none and are always copied. */
struct dp_tx_owner {
	const struct dp_mem *mem; /* the memory the payloads lie in */
	uint32_t held;            /* pieces the port still holds (relaxed atomic: the free
				   * callbacks run on the sending worker's thread) */
};

/* One message to one destination: iov holds [header|payload]... pieces. With
 * gso_size set, the backend sends them as datagrams of gso_size bytes (the last
 * may be short); else iov is exactly one datagram. */
struct dp_tx {
	const struct sockaddr_in *dst;
	struct iovec *iov;
	uint32_t iovcnt;
	uint32_t gso_size;
	uint32_t datagrams;
	struct dp_tx_owner *owner; /* NULL: nothing may be sent in place */
};

struct dp_rx {
	uint8_t *buf;
	uint32_t len;
	struct sockaddr_in src;
	/* when the kernel took it in, CLOCK_MONOTONIC ns (the socket backend's
	 * SO_TIMESTAMPNS); 0: unknown, take the time it was read */
	uint64_t stamp_ns;
};

/* One of a port's extended statistics (DPDK xstats), for Stats. */
struct dp_xstat {
	char name[DP_XSTAT_NAME_MAX + 1];
	uint64_t value;
};

struct dp_backend;

struct dp_backend_ops {
	const char *name;
	int (*open)(struct dp_backend *b);
	void (*close)(struct dp_backend *b);
	/* Returns how many of n messages went out; the rest are counted as tx_errors. */
	uint32_t (*tx_burst)(struct dp_backend *b, struct dp_tx *tx, uint32_t n);
	/* Fills up to n rx entries (buffers owned by the backend until the next call). */
	uint32_t (*rx_burst)(struct dp_backend *b, struct dp_rx *rx, uint32_t n);
	/* Parking (dp_waker.h): the fd that turns readable when datagrams arrive, or -1.
	 * A backend without one says with rx_ready whether rx_burst has something now
	 * (one with a wait_fd may have one too: datagrams it read and holds, socket GRO);
	 * one with neither (poll-mode DPDK) is polled every DP_BACKEND_POLL_NS instead. */
	int (*wait_fd)(struct dp_backend *b);
	bool (*rx_ready)(struct dp_backend *b);
	/* A wait_fd that must be armed to fire (a NIC's RX interrupt): rx_arm before the
	 * worker parks, true if a datagram may have come meanwhile (then it does not park);
	 * rx_disarm after every park, armed or not. NULL: the fd needs no arming. */
	bool (*rx_arm)(struct dp_backend *b);
	void (*rx_disarm)(struct dp_backend *b);
	/* Zero copy: ask the port to free what it has sent (rte_eth_tx_done_cleanup), so that
	 * held counts drop; the worker calls it while a part waits for its buffers. NULL for
	 * backends that never hold a payload after tx_burst returns. */
	void (*tx_reclaim)(struct dp_backend *b);
	/* The port's own counters, for Stats (NULL: the backend has none, as socket and
	 * null). Runs on the control agent's thread while the worker runs: call it only
	 * through dp_backend_xstats, which keeps it out of close's way. Writes up to max
	 * non-zero ones, returns how many, and counts in *left_out those that did not fit. */
	uint32_t (*xstats)(struct dp_backend *b, struct dp_xstat *out, uint32_t max,
			   uint64_t *left_out);
};

#define DP_BACKEND_POLL_NS 100000ull

struct dp_backend {
	const struct dp_backend_ops *ops;
	const struct dp_nic_cfg *cfg;
	const struct dp_config *config; /* all of it: the ducks, and which NIC each is on */
	uint32_t nic;                   /* cfg's index in config->nics */
	struct dp_counters *counters;
	bool gso;           /* the backend can cut one send into datagrams */
	bool gro;           /* receives may hold several datagrams (socket: UDP GRO) */
	uint32_t max_gso_segments;
	void *priv;
	/* ops->xstats against close (dp_backend_xstats_live/_dead): the control agent's
	 * calls in flight, and whether the backend takes them (set by the backend) */
	uint32_t xstats_readers;
	uint32_t xstats_live;
	/* The link as the backend last saw it (enum dp_link_state): UNKNOWN (0) for a
	 * backend that does not tell (socket, null), which counts as up. Written by the
	 * worker's thread (dpdk: dp_dpdk_link.c), read by the worker, which fails the NIC's
	 * forwards at once while it is DOWN, and by the control agent (Stats). */
	uint32_t link;
	uint32_t link_speed_mbps;
};

static inline bool dp_backend_link_down(const struct dp_backend *b)
{
	return dp_load_acquire_u32(&b->link) == DP_LINK_STATE_DOWN;
}

extern const struct dp_backend_ops dp_backend_socket;
extern const struct dp_backend_ops dp_backend_null;
#ifdef DP_HAVE_DPDK
extern const struct dp_backend_ops dp_backend_dpdk; /* dp_backend_dpdk.c, built with libdpdk */
#endif

/* The command line's options after "--" (EAL options for dpdk), set by main before
 * any backend opens; argv does not include a program name. */
struct dp_backend_args {
	int argc;
	char **argv;
};
extern struct dp_backend_args dp_backend_args;

/* Register a client's segment [va, va + len) (page_sz pages) for zero-copy transmit
 * with every backend that wants it (DPDK, once a dpdk NIC opened the EAL); fills m.
 * Never fails the attach: m->registered says whether a DMA-ing port may send from it.
 * Called by the control agent before the client turns ACTIVE, so before any worker
 * can send from it. unregister: at detach, once nothing references the memory. */
void dp_backend_mem_register(struct dp_mem *m, void *va, size_t len, size_t page_sz);
void dp_backend_mem_unregister(struct dp_mem *m);
#ifdef DP_HAVE_DPDK
void dp_dpdk_mem_register(struct dp_mem *m); /* dp_dpdk_mem.c */
void dp_dpdk_mem_unregister(struct dp_mem *m);
#endif

/* The port's xstats from any thread (the control agent's, for Stats): 0 and nothing
 * written where the backend has none, or is not open, or is closing. */
uint32_t dp_backend_xstats(struct dp_backend *b, struct dp_xstat *out, uint32_t max,
			   uint64_t *left_out);
/* A backend with ops->xstats calls _live at the end of open, once xstats may run, and
 * _dead first thing in close: it returns when no xstats call is in flight, and none
 * starts after. */
void dp_backend_xstats_live(struct dp_backend *b);
void dp_backend_xstats_dead(struct dp_backend *b);

/* The backends this build has, space-separated ("socket null dpdk"). */
const char *dp_backend_names(void);

/* The ops table for a backend name, or NULL (with dp_error naming the choices). */
const struct dp_backend_ops *dp_backend_lookup(const char *name);

#endif /* DP_BACKEND_H */
