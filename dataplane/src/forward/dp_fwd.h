/* dp_fwd.h: a forward context's whole life.
 *
 * A context (struct dp_fwd) carries one descriptor through the dataplane, a forward or
 * a weight chunk, and then goes back to be used again:
 *
 *   dispatcher  dp_fwd_alloc: from its pool, initialised for the descriptor; what
 *               needs no network it completes itself (dp_fwd_finish)
 *   worker xN   one part per NIC the forward's ducks are on (dp_fwd_part_done, once
 *               the port let go of the slot: dp_release.h); the last NIC out
 *               completes it (dp_fwd_complete: the NICs' sums added, bias, store,
 *               dp_fwd_finish)
 *   control     dp_fwd_summarize: the ZeroMQ Completion's numbers; dp_fwd_release:
 *               back to the dispatcher through the free ring (dp_fwd_pool_refill)
 *
 * dp_fwd_finish measures the context once (dp_fwd_measure: the phase times and duck
 * counts its slot header and its Completion both carry), publishes the result into the
 * client's slot header (dp_fwd_publish, through dp_slot_publish, dp_ring.h: the one
 * function that writes a slot header) and queues the context on the finishing agent's
 * completion ring. The rings are the
 * SPSC rings of struct dp_world and of the workers (dp_world.h, dp_spsc.h); this
 * module says what crosses them and when. Each agent keeps its own work: the
 * dispatcher decides what a descriptor asks for, the workers send, gather and reduce,
 * the control agent encodes and sends the Completion.
 */
#ifndef DP_FWD_H
#define DP_FWD_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_backend.h"
#include "dp_client.h"
#include "dp_counters.h"
#include "dp_desc.h" /* dp_targets_has: a forward's targets */
#include "dp_layers.h"
#include "dp_reasm.h"
#include "dp_spsc.h"
#include "dp_world.h"

/* Each forward context's float32 sums (a worker's scratch) keep this much resident; a
 * forward that summed more gives the rest back as it completes (dp_fwd_complete), so the
 * dataplane holds the sums of its big forwards in flight, not of every context that ever
 * had one. A multiple of the page size (dp_worker_init aligns each context's to it). */
#define DP_SCRATCH_KEEP (2ull << 20)

/* Failover messages (dp_moe_failover) of one forward on one NIC: at most this many
 * (silent duck, replacement) pairs; their wire forward_id is the forward's wire_id with
 * the pair's tag (1..DP_FO_MAX) in its top byte (a wire_id is gen << 16 | index, 48 bits) */
#define DP_FO_MAX 8
#define DP_FWD_ID_MASK ((1ull << DP_WIRE_FORWARD_TAG_SHIFT) - 1)

#define DP_MSG_LEN 160 /* a context's message: why it failed, sent in its Completion */

/* --- the context --------------------------------------------------------------------- */

enum dp_fwd_kind { DP_FWD_FORWARD, DP_FWD_WEIGHT, DP_FWD_DONE_AT_DISPATCH };

struct dp_duck_rx {
	struct dp_reasm reasm;
	uint32_t chunk_bytes; /* implied by this duck's first datagram (dp_wire_chunk_size) */
	uint64_t compute_ns;
	uint64_t done_ns;
	uint64_t resent_ns; /* last activation resend on this duck's NACK (NACK flood guard) */
	uint64_t progress_ns; /* last datagram from this duck for the forward (0: none yet) */
	uint32_t nacks;       /* NACKs sent to it for this forward (Karn: then no RTT sample) */
	/* 0 waiting, 1 answered, 2 holds no such layer; routed (dp_moe_failover): 3 silent
	 * past its failover deadline, its rows handed to other replicas (its late partial is
	 * discarded: the generation rule), 4 silent with rows no other live replica holds */
	uint8_t state;
	uint64_t heard_ns; /* its last datagram for this forward (a partial or a NACK; 0: none) */
	/* 0: the forward's own message to this duck; k: the k-th failover message of its
	 * NIC part, whose FORWARD headers and replies carry forward_id | k << DP_WIRE_FORWARD_TAG_SHIFT */
	uint8_t fo_tag;
	/* silent past its failover deadline with rows no other replica could take: it is
	 * waited for until the forward's deadline, as without failover (dp_gather.c) */
	bool fo_stuck;
	/* routed (MoE) forwards, set by its NIC's worker at the send (dp_moe.c) */
	uint32_t moe_rows;      /* rows its reply must have */
	uint32_t moe_entries;   /* (row, expert) pairs it was routed */
	const uint16_t *moe_map; /* reply row i -> result row moe_map[i]; NULL: i itself */
	/* its message, for NACK INPUT resends (dp_moe_resend): the table, in the context's
	 * table area (NULL: nothing was sent to it), then the slot's rows, all of them in
	 * order or (moe_gather) moe_map's */
	const uint8_t *moe_table;
	uint32_t moe_tsize;
	bool moe_gather;
	uint16_t moe_to; /* its FORWARD headers' duck: it, or DP_WIRE_ANY_DUCK (a broadcast) */
	/* a failover message's: the silent duck's reply it stands in for, when part of that
	 * was summed before it went silent (its reply then adds only the rest:
	 * dp_moe_accumulate_rest); NULL when none was */
	const struct dp_duck_rx *fo_of;
};

/* One NIC's share of a forward; written by that NIC's worker only. */
struct dp_nic_part {
	uint32_t status;
	uint64_t send_ns;    /* duration of the sends */
	uint64_t send_start; /* when the first send began */
	uint64_t wait_start; /* when the sends ended: NACK and RTO timers count from here */
	/* first send -> last partial complete (or give-up), as Timings.wait_ns is defined:
	 * it overlaps send_ns, since ducks answer while later chunks still go out */
	uint64_t wait_ns;
	uint64_t fetch_ns;   /* handling the partials' datagrams */
	uint64_t first_ns;   /* first duck complete */
	uint64_t last_ns;    /* last duck complete */
	/* zero copy: what the port still holds of the client's slot (dp_backend.h); the part
	 * ends (dp_fwd_part_done) only once owner.held is 0 (dp_release.c) */
	struct dp_tx_owner owner;
	uint64_t release_ns; /* when the part ended and began to wait for the port */
	bool release_logged; /* waited more than a second: said so once */
	bool moe_unicast;    /* routed: each duck got its rows alone (else the broadcast) */
	/* routed failover (dp_moe_failover): the messages sent (their dp_duck_rx are the
	 * worker's fo area), and what they use of its table and row map areas */
	uint8_t fo_n;
	uint64_t fo_table_used;
	uint32_t fo_map_used;
	bool link_down;      /* failed at once: the NIC's link was down (dp_backend.h) */
	/* dense: the sum is not zeroed first; each chunk's first contribution is stored
	 * (dp_gather.c), which chunks have one is the worker's `summed` bitmap */
	bool sum_by_chunk;
	/* acc (f->acc[nic]) is this NIC's scratch and holds scratch_bytes of sums: what past
	 * DP_SCRATCH_KEEP of it is given back when the forward completes (dp_fwd_complete) */
	bool acc_scratch;
	uint64_t scratch_bytes;
};

/* What a finished context measured: its slot header's line 1 and answered/missing, and
 * the scalars of its Completion's Timings (dp_fwd_measure, by the agent that finishes it). */
struct dp_fwd_phases {
	uint64_t prepare_ns; /* submit -> pickup: the client's clock (client_prepare_ns) */
	uint64_t send_ns;    /* the slowest NIC's sends */
	uint64_t wait_ns;    /* the longest NIC's wait for its partials */
	uint64_t fetch_ns;   /* every NIC's handling of the partials' datagrams */
	uint64_t reduce_ns;
	uint64_t spread_ns;  /* first duck complete -> last duck complete */
	uint64_t compute_max_ns; /* over the ducks that answered */
	uint64_t compute_sum_ns;
	uint32_t answered;
	uint32_t missing;
};

struct dp_fwd {
	uint64_t wire_id;    /* gen << 16 | index: what ducks see as forward_id */
	uint32_t index;
	uint32_t gen;
	uint8_t kind;        /* enum dp_fwd_kind */
	uint32_t status;     /* final status (finisher) */
	char message[DP_MSG_LEN];
	struct dp_client *client;
	struct dp_desc desc; /* copied out of the client's ring */
	struct dp_layer *layer;
	uint64_t pickup_ns;
	/* the client's submit stamp -> pickup, or 0 when the stamp could not be an honest
	 * one's (dp_fwd_client_prepare): the client's own Timings.prepare_ns, nobody else's */
	uint64_t client_prepare_ns;
	uint64_t deadline_ns;
	uint64_t reduce_ns;
	struct dp_fwd_phases phases; /* dp_fwd_finish's, before the slot is published */
	/* forwards */
	uint32_t rows;
	uint64_t bytes;            /* activation bytes (= result bytes) */
	const uint8_t *act;
	uint8_t *res;
	float *acc[DP_MAX_NICS];   /* per NIC: float32 sums of its ducks */
	uint64_t targets[4];       /* duck id bitmap */
	uint32_t repairs;          /* the layer's repairs at dispatch (dp_layer.repaired_at) */
	uint32_t nic_mask;
	uint32_t nics_pending;     /* atomic: the worker that takes it to 0 finishes */
	struct dp_nic_part part[DP_MAX_NICS];
	struct dp_duck_rx *rx;     /* [nducks in topology], by topology index */
	/* routed (MoE) forwards: the host routing table, the dispatcher's checked copy
	 * (dp_desc_routing_copy); the workers split it, nobody writes it after */
	uint8_t *route;            /* route_cap bytes, the context's own (dp_fwd_pool_init) */
	uint64_t route_bytes;
	/* routed: the layer's ducks known lost when it was dispatched (dp_world.h lost_ducks,
	 * the layer's lost_ducks), read once by the dispatcher; the dispatcher's targets and
	 * every NIC's split follow this one copy, so they agree on each token's replica even
	 * while the control agent marks ducks lost or back (all zero: the placement as is) */
	uint64_t lost[DP_MAX_DUCKS / 64];
	/* routed, with a shared expert: the ducks of the shared set it uses (the dispatcher's
	 * choice, dp_dispatch.c): each is sent and answers every row; the layer's other sets
	 * compute only their routed rows for it */
	uint64_t shared[DP_MAX_DUCKS / 64];
	/* weight chunks */
	uint16_t w_duck;
	uint16_t w_tensor;
	uint32_t w_index;          /* the duck's index in the layer */
	bool w_announcer;          /* this context sends the LAYER datagram */
	uint32_t w_sent;           /* distinct WEIGHT datagrams sent at least once */
	uint64_t w_layer_sent_ns;
	struct dp_reasm w_acks;    /* which WEIGHT datagrams the duck acknowledged */
};

/* --- the pool: the dispatcher's, the only allocator ------------------------------------ */

struct dp_fwd_pool {
	struct dp_world *w;
	struct dp_fwd **free;
	uint32_t nfree;
	uint8_t *routes;    /* every context's routing table copy, route_cap bytes each */
	uint64_t route_cap;
};

/* Every context of w free; -1 when out of memory. */
int dp_fwd_pool_init(struct dp_fwd_pool *p, struct dp_world *w);
void dp_fwd_pool_fini(struct dp_fwd_pool *p);
/* Take back the contexts the control agent released (the free ring). */
void dp_fwd_pool_refill(struct dp_fwd_pool *p);
/* A free context (the caller made sure of one: p->nfree) for client c's descriptor,
 * counted in flight for c until dp_fwd_release. */
struct dp_fwd *dp_fwd_alloc(struct dp_fwd_pool *p, struct dp_client *c,
			    const struct dp_desc *desc, uint64_t now);
/* The dispatcher, at pickup: f's client_prepare_ns from the client's submit stamp. A
 * stamp after pickup (the client stamps before it pushes, on the same CLOCK_MONOTONIC)
 * or before the client's Attach arrived cannot be an honest one: 0, and false (the
 * caller counts client_clock_implausible). A stamp of 0 is none given: 0, true. */
bool dp_fwd_client_prepare(struct dp_fwd *f);
/* Picked up -> a NIC worker began sending it, on the dataplane's own clock (0 when
 * nothing was sent): what the shared `prepare` histogram records (dp_stats.c). */
uint64_t dp_fwd_own_prepare_ns(const struct dp_fwd *f);
/* Control: f's completion is packed; back to the dispatcher's pool (a completion its
 * client's full socket refuses still counts in flight for it: dp_control_outbox.c). */
void dp_fwd_release(struct dp_world *w, struct dp_fwd *f);

/* --- finishing ------------------------------------------------------------------------- */

/* A NIC worker ended its part of f with this status; true for the last NIC to finish. */
bool dp_fwd_part_done(struct dp_fwd *f, uint32_t nic, uint32_t status);
/* The last NIC out (dp_fwd_part_done said true): f's status from its NICs' parts (the
 * worst, or stale epoch), and for a forward that went well the NICs' float32 sums added
 * into the first NIC's, the bias, the result stored into the slot in its dtype (timed:
 * reduce_ns); counted (forwards_ok, timeouts, duck_lost) in the worker's counters, then
 * dp_fwd_finish onto its done ring. */
void dp_fwd_complete(struct dp_world *w, struct dp_fwd *f, struct dp_spsc *done,
		     struct dp_counters *counters);
/* f is done: measure it (f->phases), publish it into the client's slot and queue it on done
 * for the control agent. */
/* DUCK_LOST's message into f->message: the ducks of `gone` (a DP_MAX_DUCKS bitmap) hold
 * no layer f->layer (each with its experts on a MoE layer), and what to do about it. */
void dp_fwd_lost_message(struct dp_fwd *f, const uint64_t *gone);

void dp_fwd_finish(struct dp_world *w, struct dp_fwd *f, uint32_t status, struct dp_spsc *done,
		   struct dp_counters *counters);
/* Publish f->phases and the slot's done word (the result is in the slot already). */
void dp_fwd_publish(struct dp_fwd *f, struct dp_counters *counters);
/* f's phase times and duck counts (weight chunks and what the dispatcher completed:
 * prepare_ns alone), as the slot header and the Completion carry them. */
void dp_fwd_measure(const struct dp_world *w, const struct dp_fwd *f, struct dp_fwd_phases *p);

/* --- the completion -------------------------------------------------------------------- */

/* What the ZeroMQ Completion says of a finished context (dp_fwd_summarize): f->phases,
 * the numbers its slot header got, and the duck lists. */
struct dp_fwd_summary {
	uint32_t answered[DP_MAX_DUCKS];   /* duck ids */
	uint64_t compute_ns[DP_MAX_DUCKS]; /* answered[i]'s own compute time */
	uint32_t nanswered;
	uint32_t missing[DP_MAX_DUCKS];
	uint32_t nmissing;
	struct dp_fwd_phases phases; /* f->phases: what its slot header got */
};

void dp_fwd_summarize(const struct dp_world *w, const struct dp_fwd *f,
		      struct dp_fwd_summary *s);

#endif /* DP_FWD_H */
