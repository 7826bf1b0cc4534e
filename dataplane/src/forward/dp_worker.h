/* dp_worker.h: one NIC worker: sends activations, gathers partials, NACKs, reduces,
 * and loads weights into its ducks.
 *
 * Who calls whom: the agent (dp_worker.c) calls its modules, which are leaves: dp_gather.c
 * (a forward's activation out, partials in) and dp_weight.c (reliable weight transfer)
 * see the worker only through the narrow views it owns and passes (struct
 * dp_gather_view, struct dp_weight_view), and send through its transmit batch (dp_tx.c,
 * struct dp_tx_batch); dp_release.c holds the parts waiting for the port (struct
 * dp_release_list). None of them includes this header: each call returns what happened
 * (a part over, with its status) and the worker ends parts in one place, the last NIC
 * out completing the forward (dp_fwd_complete, dp_fwd.c). Outside, main starts it, the
 * dispatcher fills its inbox, the control agent drains its done ring and reads its
 * counters and backend. */
#ifndef DP_WORKER_H
#define DP_WORKER_H

#include <stdint.h>

#include "dp_backend.h"
#include "dp_world.h"
#include "dp_fwd.h" /* what its rings carry */
#include "dp_gather.h"
#include "dp_inbox.h"
#include "dp_release.h"
#include "dp_tx.h"
#include "dp_weight.h"

struct dp_worker {
	uint32_t nic;
	struct dp_world *w;
	struct dp_backend be;
	struct dp_inbox in;  /* dispatcher -> me: struct dp_fwd * (an rte_ring on dpdk) */
	struct dp_spsc done; /* me -> control: finished contexts */
	struct dp_counters counters;
	int lcore;           /* the EAL lcore it runs on (dp_main.c), or -1 */
	int cpu;             /* the one CPU that lcore is pinned to, or -1 */
	uint32_t payload;    /* bytes per datagram after the header */
	uint32_t max_chunks; /* of one forward's activation */
	/* per forward context, by its index (worker-local) */
	uint64_t *owned;     /* wire id while on this worker, else 0 */
	struct dp_wire_header *hdrs; /* [nfwds][max_chunks] prepared FORWARD / WEIGHT headers */
	uint64_t *next_nack; /* no duck's NACK is due before this (a lower bound) */
	uint64_t *sent_ns;   /* weights: [nfwds][max_chunks] last send of each datagram */
	float *scratch;      /* [nfwds][scratch_floats] float32 sums when not in place (mmap) */
	size_t scratch_len;  /* bytes of address space it reserves */
	struct dp_reasm *summed; /* [nfwds]: the chunks of each dense sum written (dp_gather.c) */
	uint32_t scratch_floats;
	struct dp_fwd **active;
	uint32_t nactive;
	struct dp_release_list release; /* parts over, waiting for the port to free */
	/* ducks on this NIC */
	uint32_t nducks;
	uint16_t ducks[DP_MAX_DUCKS];
	struct dp_rto rto[DP_MAX_DUCKS]; /* by duck id, for the ducks on this NIC */
	uint64_t next_ping_ns;
	uint32_t pump_next;  /* where the next loop's weight pumping starts (round-robin) */
	struct dp_reasm nack_seen; /* chunks already resent for the NACK being answered */
	/* routed (MoE) forwards (dp_moe.c) */
	uint64_t nic_ducks[DP_MAX_DUCKS / 64]; /* the ducks above, as a set */
	uint8_t *moe_wire;   /* the wire table of the forward being sent */
	uint8_t *moe_tables; /* [nfwds][moe_table_cap]: the tables each context sent */
	uint16_t *moe_maps;  /* [nfwds][MAX_TOKENS x MAX_TOPK]: its ducks' reply row maps */
	/* the placement of the forward being split, less its known-lost ducks (dp_moe.c) */
	struct dp_routing_placement *moe_live;
	uint16_t *moe_live_slots; /* [MAX_EXPERTS x MAX_REPLICAS]: their bank slots */
	struct dp_duck_rx *fo;    /* [nfwds][DP_FO_MAX]: failover replies awaited (dp_moe.c) */
	uint8_t *fo_tables;       /* [nfwds][moe_table_cap]: the failover messages' tables */
	uint16_t *fo_maps;        /* [nfwds][MAX_TOKENS x MAX_TOPK]: their reply row maps */
	/* what the modules see of the above (set at init, never changed) */
	struct dp_gather_view gather;
	struct dp_weight_view weight;
	struct dp_tx_batch tx;
};

int dp_worker_init(struct dp_worker *wk, struct dp_world *w, uint32_t nic);
void dp_worker_fini(struct dp_worker *wk);
int dp_worker_do_work(struct dp_world *w, void *self, uint64_t now);
/* Parking (struct dp_agent): the backend's fd into the runner's waker; before a park,
 * -1 if work is waiting, else ns until the next NACK, deadline, retransmit or PING. */
int dp_worker_wait_on(struct dp_world *w, void *self, struct dp_waker *wk);
int64_t dp_worker_park(struct dp_world *w, void *self, uint64_t now);
void dp_worker_unpark(struct dp_world *w, void *self); /* the backend's rx_disarm */
/* dp_agent.h's expect: ns until the earliest forward in flight has its replies due, by
 * the ducks' measured reply times; 0: none in flight; -1: a reply may come any time. */
int64_t dp_worker_expect(struct dp_world *w, void *self, uint64_t now, int *fd);

#endif /* DP_WORKER_H */
