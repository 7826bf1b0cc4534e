/* dp_worker.h: one NIC worker: sends activations, gathers partials, NACKs, reduces,
 * and loads weights into its ducks. The agent is dp_worker.c; the work is done by
 * dp_tx.c (transmit batch), dp_gather.c (a forward's activation out, partials in)
 * and dp_weight.c (reliable weight transfer), which take struct dp_worker, the
 * worker's state, as their first argument. */
#ifndef DP_WORKER_H
#define DP_WORKER_H

#include <stdint.h>

#include "dp_backend.h"
#include "dp_world.h"
#include "dp_fwd.h" /* what its rings carry */
#include "dp_inbox.h"

#define DP_WORKER_TX 1024
#define DP_WORKER_IOV 4096
#define DP_WORKER_CTL_PAYLOAD 256 /* a NACK lists up to 64 chunks; the next NACK the rest */

/* A duck's NACK timeout, RFC 6298's estimator over its reply times (ns). */
struct dp_rto {
	uint64_t srtt;
	uint64_t rttvar;
	uint64_t rto;     /* cfg.nack_us until the first sample */
	bool sampled;
};

struct dp_worker {
	uint32_t nic;
	struct dp_world *w;
	struct dp_backend be;
	struct dp_inbox in;  /* dispatcher -> me: struct dp_fwd * (an rte_ring on dpdk) */
	struct dp_spsc done; /* me -> control: finished contexts */
	struct dp_counters counters;
	uint32_t payload;    /* bytes per datagram after the header */
	uint32_t max_chunks; /* of one forward's activation */
	/* per forward context, by its index (worker-local) */
	uint64_t *owned;     /* wire id while on this worker, else 0 */
	struct dp_wire_header *hdrs; /* [nfwds][max_chunks] prepared FORWARD / WEIGHT headers */
	uint64_t *next_nack; /* no duck's NACK is due before this (a lower bound) */
	uint64_t *sent_ns;   /* weights: [nfwds][max_chunks] last send of each datagram */
	float *scratch;      /* [nfwds][max_forward_bytes / 2] float32 sums when not in place */
	uint32_t scratch_floats;
	struct dp_fwd **active;
	uint32_t nactive;
	struct dp_fwd **releasing; /* parts over, waiting for the port to free (dp_release.h) */
	uint32_t nreleasing;
	/* ducks on this NIC */
	uint32_t nducks;
	uint16_t ducks[DP_MAX_DUCKS];
	struct dp_rto rto[DP_MAX_DUCKS]; /* by duck id, for the ducks on this NIC */
	uint64_t next_ping_ns;
	struct dp_reasm nack_seen; /* chunks already resent for the NACK being answered */
	/* tx scratch */
	struct dp_tx tx[DP_WORKER_TX];
	struct iovec iov[DP_WORKER_IOV];
	uint32_t ntx, niov;
	struct dp_wire_header ctl[DP_WORKER_TX]; /* headers of NACK, PING and LAYER datagrams */
	uint8_t ctl_payload[DP_WORKER_TX][DP_WORKER_CTL_PAYLOAD];
	uint32_t nctl;
};

/* For the modules: a duck's address, f's prepared FORWARD or WEIGHT headers (one per
 * chunk), f leaving this worker, and the last NIC out summing the NICs' partial sums
 * into the result slot and publishing (dp_fwd_finish). */
static inline const struct sockaddr_in *dp_worker_duck_addr(struct dp_worker *wk, uint32_t duck)
{
	return &wk->w->cfg.ducks[wk->w->duck_index[duck]].addr;
}

static inline struct dp_wire_header *dp_worker_fwd_headers(struct dp_worker *wk,
							   const struct dp_fwd *f)
{
	return &wk->hdrs[(size_t)f->index * wk->max_chunks];
}

void dp_worker_active_remove(struct dp_worker *wk, struct dp_fwd *f);
void dp_worker_finalize(struct dp_worker *wk, struct dp_fwd *f);

int dp_worker_init(struct dp_worker *wk, struct dp_world *w, uint32_t nic);
void dp_worker_fini(struct dp_worker *wk);
int dp_worker_do_work(struct dp_world *w, void *self, uint64_t now);
/* Parking (struct dp_agent): the backend's fd into the runner's waker; before a park,
 * -1 if work is waiting, else ns until the next NACK, deadline, retransmit or PING. */
int dp_worker_wait_on(struct dp_world *w, void *self, struct dp_waker *wk);
int64_t dp_worker_park(struct dp_world *w, void *self, uint64_t now);

#endif /* DP_WORKER_H */
