/* dp_dispatch.c: the dispatcher agent.
 *
 * Polls every attached client's submission ring, round-robin with a share of
 * the burst each and at most client_max_inflight descriptors in flight per
 * client (the rest wait in that client's ring), checks each descriptor with
 * dp_desc_check() against the private copy of the client's layout and the
 * layer it names, and hands forwards and
 * weight chunks to the NIC workers through their inboxes (dp_inbox.h: an SPSC ring, an
 * rte_ring on a dpdk NIC), a burst per worker after each client's burst. What it refuses,
 * and what needs no network (b_down, commits), it completes itself. It is the
 * only allocator of forward contexts (its pool, dp_fwd.c); the control agent
 * returns them through the free ring once their ZeroMQ completion is out.
 */
#include "dp_dispatch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "dp_desc.h"
#include "dp_f16.h"
#include "dp_fair_share.h"
#include "dp_fwd.h"
#include "dp_reduce.h"
#include "dp_ring.h"
#include "dp_tsan.h"
#include "dp_worker.h"

#define MAX_PENDING_COMMITS 64
#define DOORBELL_POLL_NS 1000000 /* a parked dispatcher's look at a client it cannot hear */
#define DOORBELL_READ 4096       /* a read's worth, where a pipe cannot be spliced */
#define DOORBELL_SPLICE (1u << 20) /* a splice's worth: fs.pipe-max-size's default */
#define DOORBELL_DRAIN_TRIES 4   /* calls a drain makes at most: the client may refill */
/* Rings heard that brought nothing new, less one for each that did, before the client's
 * doorbell is muted: a well-behaved client rings only when need_wakeup says we sleep,
 * after moving its head or to have a completion it waits for sent (dp_wake.h) */
#define DOORBELL_IDLE_RINGS 8
#define DOORBELL_MUTE_MIN_NS 1000000ull   /* the first quiet time */
#define DOORBELL_MUTE_MAX_NS 128000000ull /* doubling, while the client rings for nothing */

/* What the dispatcher knows of one client slot's doorbell (only this agent touches it). */
struct dp_bell {
	uint64_t head;        /* the client's ring head when a ring last brought descriptors */
	uint64_t completed;   /* its completions (struct dp_client) when we last heard it ring */
	uint64_t quiet_until; /* muted: not listened to before this (dp_now_ns) */
	uint64_t mute_ns;     /* the next quiet time: doubles while it rings for nothing */
	uint32_t idle;        /* rings with nothing new, less one for each with something */
	bool warned;          /* the log said so once for this client */
};

struct dp_dispatcher {
	struct dp_world *w;
	struct dp_fwd_pool pool;
	struct dp_fwd *commits[MAX_PENDING_COMMITS];
	uint32_t ncommits;
	struct dp_desc burst[DP_BURST];
	/* contexts for each NIC worker from the client burst being dispatched: a descriptor
	 * adds at most one per NIC, a client burst is at most DP_BURST descriptors */
	struct dp_fwd *out[DP_MAX_NICS][DP_BURST];
	uint32_t nout[DP_MAX_NICS];
	struct dp_counters *counters;
	struct dp_limits limits;
	uint32_t next_client; /* round-robin: the pass starts after the last client served */
	uint32_t nactive;     /* clients polled in the last pass: each one's share of a burst */
	int doorbells;        /* an epoll set of the clients' doorbell pipes (dp_client.c) */
	uint64_t listening;   /* client slots whose pipe is in it: only this agent adds or drops */
	uint64_t deaf;        /* client slots whose pipe lost its last writer: never watched */
	uint64_t muted;       /* client slots whose pipe is out of the set for a quiet time */
	uint64_t known;       /* client slots whose bells[] entry is their current client's */
	struct dp_bell bells[DP_MAX_CLIENTS];
	int devnull;          /* doorbells are drained into it (splice); -1: read instead */
	uint8_t rung[DOORBELL_READ]; /* what the doorbells carried, read and dropped */
	bool armed;           /* need_wakeup is set in the clients' headers */
	const struct dp_waker *waker; /* its runner's: did a doorbell wake it? */
	uint32_t null_nics;   /* NICs on the null backend: no routed forwards there */
	struct dp_routing_plan plan; /* a routed forward's placement, worked out (32 KiB) */
	/* a routed forward's placement less its known-lost ducks (dp_routing_live, 17 KiB) */
	struct dp_routing_placement live;
};

/* Complete here, now: publish the slot and queue the ZeroMQ completion. */
static void complete(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t status, const char *fmt,
		     ...) __attribute__((format(printf, 4, 5)));
static void complete(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t status, const char *fmt,
		     ...)
{
	f->kind = DP_FWD_DONE_AT_DISPATCH;
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(f->message, sizeof(f->message), fmt, ap);
		va_end(ap);
	}
	if (status == DP_STATUS_BAD_REQUEST)
		dp_count(d->counters, DP_C_bad_requests, 1);
	else if (status == DP_STATUS_STALE_EPOCH)
		dp_count(d->counters, DP_C_stale_epoch, 1);
	dp_fwd_finish(d->w, f, status, &d->w->dispatch_done, d->counters);
}

/* The contexts queued for each worker go out as one burst per worker (one kick each). */
static void flush(struct dp_dispatcher *d)
{
	for (uint32_t nic = 0; nic < d->w->cfg.nnics; nic++) {
		uint32_t n = d->nout[nic];
		if (!n)
			continue;
		d->nout[nic] = 0;
		/* capacity is the context count: never full */
		if (dp_inbox_push(&d->w->workers[nic]->in, (void **)d->out[nic], n) != n)
			DP_ERROR("nic %u: dispatch ring full; this is a bug", nic);
	}
}

static void hand_to(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t nic)
{
	if (d->nout[nic] == DP_BURST) /* not with bursts of DP_BURST; in case they grow */
		flush(d);
	d->out[nic][d->nout[nic]++] = f;
}

/* --- routing around the ducks known lost (issue 30.1) ---------------------------------- */

/* The layer's ducks (layer_ducks) known lost now into f->lost: the stats tick's LOST
 * ducks and those that answered NO_LAYER (they restarted). Read once, here, word by word
 * with relaxed loads (a word may be a tick newer than the one before: each duck in the
 * copy was lost at some moment, which is all routing around it needs); the workers split
 * by this copy, never by the live bitmaps. True when any is. */
static bool snapshot_lost(const struct dp_world *w, const struct dp_layer *l,
			  const uint64_t *layer_ducks, uint64_t *lost)
{
	uint64_t any = 0;
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++) {
		lost[k] = (__atomic_load_n(&w->lost_ducks[k], __ATOMIC_RELAXED) |
			   /* acquire: pairs with a repair commit's release of the bits it
			    * clears (its duck's bank is all in before it is routed to) */
			   __atomic_load_n(&l->lost_ducks[k], __ATOMIC_ACQUIRE)) &
			  layer_ducks[k];
		any |= lost[k];
	}
	return any != 0;
}

/* Append " %u" for each duck of `set` (DP_MAX_DUCKS bits) to m at *used (n bytes). */
static uint32_t list_ducks(const uint64_t *set, char *m, size_t n, size_t *used)
{
	uint32_t listed = 0;
	for (uint32_t k = 0; k < DP_MAX_DUCKS && *used < n; k++) {
		if (!dp_targets_has(set, k))
			continue;
		int c = snprintf(m + *used, n - *used, " %u", k);
		*used += c > 0 ? (size_t)c : 0;
		listed++;
	}
	return listed;
}

/* The shared expert's set this forward uses (f->shared): every row needs each of its
 * ducks. Of the layer's sets (its replicas, LoadWeights.shared_sets) those with no duck
 * known lost, the (forward id mod their count)-th: forwards take turns on them, and a set
 * with a lost duck gets none. With none whole, no forward on the layer can complete: -1
 * with f completed DUCK_LOST now (not at its deadline), saying so plainly; else 0. */
static int choose_shared_set(struct dp_dispatcher *d, struct dp_fwd *f, const struct dp_layer *l)
{
	const struct dp_layer_moe *moe = l->moe;
	uint32_t live[DP_MAX_REPLICAS], nlive = 0, nsets = moe->n_shared_sets;
	memset(f->shared, 0, sizeof(f->shared));
	if (!moe->has_shared)
		return 0;
	for (uint32_t s = 0; s < nsets && s < DP_MAX_REPLICAS; s++) {
		uint64_t hit = 0;
		for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
			hit |= moe->shared_set[s * 4 + k] & f->lost[k];
		if (!hit)
			live[nlive++] = s;
	}
	if (nlive) {
		memcpy(f->shared, &moe->shared_set[live[f->desc.forward_id % nlive] * 4],
		       sizeof(f->shared));
		return 0;
	}
	uint64_t gone[DP_MAX_DUCKS / 64];
	bool restarted = false; /* said NO_LAYER: a repair, not time, brings it back */
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++) {
		gone[k] = moe->shared_ducks[k] & f->lost[k];
		restarted |= (gone[k] & __atomic_load_n(&l->lost_ducks[k], __ATOMIC_RELAXED)) != 0;
	}
	char list[72] = "", until[80];
	size_t used = 0;
	bool many = list_ducks(gone, list, sizeof(list), &used) > 1;
	if (restarted)
		snprintf(until, sizeof(until), "repair it, client.repair(%u)", l->id);
	else
		snprintf(until, sizeof(until), "no forward on this layer completes until %s back",
			 nsets > 1 ? "a set is" : many ? "they are" : "it is");
	char *m = f->message;
	size_t n = sizeof(f->message);
	int c = nsets > 1 ? snprintf(m, n,
				     "layer %u: the shared expert's ducks%s are lost, a duck of "
				     "each of its %u sets: ",
				     l->id, list, nsets)
			  : snprintf(m, n,
				     "layer %u: the shared expert's duck%s%s %s lost, and with one "
				     "shared-expert set there is no replica: ",
				     l->id, many ? "s" : "", list, many ? "are" : "is");
	used = c > 0 ? (size_t)c : 0;
	if (used < n)
		snprintf(m + used, n - used, "%s", until);
	dp_count(d->counters, DP_C_moe_no_live_replica, 1);
	complete(d, f, DP_STATUS_DUCK_LOST, NULL);
	return -1;
}

/* A token names an expert every replica of which is known lost (live has none for it):
 * f completes DUCK_LOST now, naming those experts and the lost ducks that held them. */
static void no_live_replica(struct dp_dispatcher *d, struct dp_fwd *f, const struct dp_layer *l,
			    uint32_t tokens, uint32_t topk)
{
	const struct dp_routing_placement *pl = &l->moe->pl, *live = &d->live;
	uint64_t dead[DP_MAX_EXPERTS / 64] = { 0 }, ducks[DP_MAX_DUCKS / 64] = { 0 };
	const uint8_t *e0 = f->route + DP_ROUTING_HEADER_SIZE;
	uint32_t ndead = 0;
	for (uint64_t j = 0; j < (uint64_t)tokens * topk; j++) {
		uint32_t e;
		memcpy(&e, e0 + j * DP_ROUTING_ENTRY_SIZE, 4);
		if (e >= live->n_experts || live->replicas[e] || dead[e >> 6] >> (e & 63) & 1)
			continue;
		dead[e >> 6] |= 1ull << (e & 63);
		ndead++;
		for (uint32_t i = 0; i < pl->replicas[e]; i++) { /* each of them lost */
			uint16_t dk = pl->ducks[e * DP_MAX_REPLICAS + i];
			ducks[dk >> 6] |= 1ull << (dk & 63);
		}
	}
	/* a duck that answered NO_LAYER restarted: it answers PINGs, and only a reload of
	 * the layer brings it back (the message keeps room to say so) */
	bool restarted = false;
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
		restarted |= (ducks[k] & __atomic_load_n(&l->lost_ducks[k], __ATOMIC_RELAXED)) != 0;
	char hint[64];
	snprintf(hint, sizeof(hint), " (restarted: repair it, client.repair(%u))", l->id);
	const size_t TAIL = restarted ? strlen(hint) + 1 : 8;
	char *m = f->message;
	size_t n = sizeof(f->message), used = 0;
	int c = snprintf(m, n, "layer %u: expert%s", l->id, ndead > 1 ? "s" : "");
	used += c > 0 ? (size_t)c : 0;
	uint32_t shown = 0;
	for (uint32_t e = 0; e < DP_MAX_EXPERTS && shown < ndead; e++) {
		if (!(dead[e >> 6] >> (e & 63) & 1))
			continue;
		if (shown++ == 8) { /* the ducks say the rest */
			c = snprintf(m + used, n - used, " ...");
			used += c > 0 ? (size_t)c : 0;
			break;
		}
		c = snprintf(m + used, n - used, " %u", e);
		used += c > 0 ? (size_t)c : 0;
	}
	c = used < n ? snprintf(m + used, n - used, " %s no live replica; lost:",
				ndead > 1 ? "have" : "has")
		     : 0;
	used += c > 0 ? (size_t)c : 0;
	for (uint32_t k = 0, listed = 0; k < DP_MAX_DUCKS && used + TAIL < n; k++) {
		if (!dp_targets_has(ducks, k))
			continue;
		c = snprintf(m + used, n - used, "%s", listed++ ? "; " : " ");
		used += c > 0 ? (size_t)c : 0;
		c = used + TAIL < n ? dp_layer_describe_duck(l, k, m + used, n - TAIL - used) : 0;
		used += c > 0 ? (size_t)c : 0;
		if (used >= n - TAIL) /* describe cut it: end where it ended */
			used = n - TAIL - 1;
	}
	if (restarted && used < n)
		snprintf(m + used, n - used, "%s", hint);
	dp_count(d->counters, DP_C_moe_no_live_replica, 1);
	complete(d, f, DP_STATUS_DUCK_LOST, NULL);
}

/* The (token, expert) pairs whose replica t % r is a known-lost duck, each of which the
 * live placement sent to a live replica instead: what moe_rows_rerouted counts. Counted
 * by the placement as loaded, once more (only forwards that route around a duck pay it). */
static uint64_t rerouted(struct dp_dispatcher *d, const struct dp_fwd *f,
			 const struct dp_layer *l, uint32_t tokens, uint32_t topk)
{
	uint32_t count[DP_MAX_DUCKS];
	char why[8];
	uint64_t n = 0;
	dp_routing_plan(&d->plan, &l->moe->pl, NULL, NULL);
	if (dp_routing_count(&d->plan, f->route + DP_ROUTING_HEADER_SIZE, tokens, topk, count,
			     why, sizeof(why)) < 0)
		return 0; /* the checked placement has a duck for every expert */
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++)
		n += dp_targets_has(f->lost, k) ? count[k] : 0;
	return n;
}

/* A routed (MoE) forward: its host table copied out of the slot and checked, once
 * (dp_desc_routing_copy); its targets narrowed from every duck of the layer to the ducks
 * some (token, expert) routes to, and with a shared expert the ducks of its set (each
 * computes its shared columns for every row; a duck outside the set that no token routes
 * to hears nothing). 0, or -1 with f completed. */
static int route_forward(struct dp_dispatcher *d, struct dp_fwd *f, const struct dp_layer *l,
			 const struct dp_desc_plan *p)
{
	struct dp_client *c = f->client;
	const struct dp_layer_moe *moe = l->moe;
	const uint8_t *slot = c->act + (uint64_t)f->desc.slot * c->layout.act_slot_size;
	if (dp_desc_routing_copy(&c->layout, &d->limits, p, slot, moe->pl.n_experts, f->route,
				 d->pool.route_cap, &f->route_bytes, f->message,
				 sizeof(f->message)) < 0) {
		complete(d, f, DP_STATUS_BAD_REQUEST, NULL);
		return -1;
	}
	struct dp_routing_header h;
	memcpy(&h, f->route, sizeof(h)); /* the checked copy */
	/* the ducks known lost, once (snapshot_lost): with none, the placement as loaded;
	 * else each token's replica among its expert's live ones (dp_routing_live), and a
	 * forward that needs a duck with no live replica fails now, not at its deadline */
	const struct dp_routing_placement *pl = &moe->pl;
	bool lost = snapshot_lost(d->w, l, p->targets, f->lost);
	if (choose_shared_set(d, f, l) < 0)
		return -1;
	if (lost) {
		dp_routing_live(&moe->pl, NULL, f->lost, &d->live, NULL);
		pl = &d->live;
	}
	/* the shared set it uses, within the forward's ducks (p->targets: the layer's) */
	for (uint32_t w = 0; w < DP_MAX_DUCKS / 64; w++)
		f->targets[w] = f->shared[w] & p->targets[w];
	/* and every duck a (token, expert) goes to: the count the split starts with, over
	 * every duck (the placement was checked at load, the table just now: the live
	 * placement's refusal is an expert with no live replica) */
	uint32_t count[DP_MAX_DUCKS];
	dp_routing_plan(&d->plan, pl, NULL, NULL);
	if (dp_routing_count(&d->plan, f->route + DP_ROUTING_HEADER_SIZE, h.tokens, h.topk, count,
			     f->message, sizeof(f->message)) < 0) {
		if (lost)
			no_live_replica(d, f, l, h.tokens, h.topk);
		else
			complete(d, f, DP_STATUS_BAD_REQUEST, NULL);
		return -1;
	}
	if (lost)
		dp_count(d->counters, DP_C_moe_rows_rerouted, rerouted(d, f, l, h.tokens, h.topk));
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++)
		if (count[k])
			f->targets[k >> 6] |= 1ull << (k & 63);
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++)
		if (dp_targets_has(f->targets, k) &&
		    d->null_nics >> d->w->cfg.ducks[d->w->duck_index[k]].nic & 1) {
			complete(d, f, DP_STATUS_BAD_REQUEST,
				 "layer %u: duck %u is on a null-backend NIC, which computes nothing: "
				 "routed (MoE) forwards need ducks that compute their experts",
				 l->id, k);
			return -1;
		}
	dp_count(d->counters, DP_C_moe_forwards, 1);
	return 0;
}

/* A routed forward whose every choice is -1 (no expert) on a layer without a shared
 * expert: no duck has anything to compute, so no worker would ever complete it. Its
 * result is what the replies would have been added onto, zeros (a MoE layer has no
 * b_down; zero is all-zero bits in every dtype), and it completes here, sending nothing. */
static void no_duck_forward(struct dp_dispatcher *d, struct dp_fwd *f)
{
	memset(f->res, 0, f->bytes); /* the result slot holds the activation's bytes */
	dp_count(d->counters, DP_C_forwards, 1);
	dp_count(d->counters, DP_C_moe_no_duck_forwards, 1);
	dp_count(d->counters, DP_C_forwards_ok, 1);
	complete(d, f, DP_STATUS_OK, NULL);
}

/* A forward that needs a duck known to have lost the layer (it said NO_LAYER since the
 * commit, and no repair has committed since) fails DUCK_LOST here, sent to nobody: asked
 * again, the duck would say NO_LAYER again, or, once a repair announced the layer to it,
 * compute on a half-streamed bank. 1 when it did. */
static int needs_lost_duck(struct dp_dispatcher *d, struct dp_fwd *f, const struct dp_layer *l)
{
	uint64_t gone[DP_MAX_DUCKS / 64], any = 0;
	/* acquire: pairs with the repair commit's release of the bits it clears */
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
		any |= gone[k] = f->targets[k] & __atomic_load_n(&l->lost_ducks[k], __ATOMIC_ACQUIRE);
	if (!any)
		return 0;
	dp_fwd_lost_message(f, gone);
	dp_count(d->counters, DP_C_duck_lost, 1);
	complete(d, f, DP_STATUS_DUCK_LOST, NULL);
	return 1;
}

static void dispatch_forward(struct dp_dispatcher *d, struct dp_fwd *f, struct dp_layer *l,
			     const struct dp_desc_plan *p, uint64_t now)
{
	struct dp_world *w = d->w;
	struct dp_client *c = f->client;
	/* before the lost bits are read: a repair begun after this load is one whose
	 * duck's partials this forward must not take (dp_gather_on_partial) */
	f->repairs = __atomic_load_n(&l->repairs, __ATOMIC_ACQUIRE);
	if (f->desc.flags & DP_DESC_FLAG_ROUTED) {
		if (route_forward(d, f, l, p) < 0)
			return;
	} else {
		memcpy(f->targets, p->targets, sizeof(f->targets));
	}
	if (needs_lost_duck(d, f, l))
		return;
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++)
		if (dp_targets_has(f->targets, k)) /* a layer's ducks are in the topology */
			f->nic_mask |= 1u << w->cfg.ducks[w->duck_index[k]].nic;
	f->kind = DP_FWD_FORWARD;
	f->layer = l;
	f->bytes = p->bytes;
	f->rows = p->rows;
	f->act = c->act + (uint64_t)f->desc.slot * c->layout.act_slot_size;
	f->res = c->res + (uint64_t)f->desc.slot * c->layout.res_slot_size;
	if (!f->nic_mask) {
		no_duck_forward(d, f);
		return;
	}
	f->deadline_ns = now + p->timeout_us * 1000;
	f->nics_pending = (uint32_t)__builtin_popcount(f->nic_mask);
	dp_count(d->counters, DP_C_forwards, 1);
	for (uint32_t n = 0; n < w->cfg.nnics; n++)
		if (f->nic_mask & (1u << n))
			hand_to(d, f, n);
}

static void dispatch_weight(struct dp_dispatcher *d, struct dp_fwd *f, struct dp_layer *l,
			    const struct dp_desc_plan *p, uint64_t now)
{
	struct dp_world *w = d->w;
	const struct dp_desc *desc = &f->desc;
	struct dp_client *c = f->client;
	const uint8_t *src = c->act + (uint64_t)desc->slot * c->layout.act_slot_size;
	/* Each tensor's bytes arrive once, in order: a commit that counts bytes then proves
	 * every byte was written by this load (a chunk sent twice must not stand in for one
	 * never sent, which would leave a duck computing with an earlier owner's weights). */
	uint64_t *next = p->duck_index < 0 ? &l->b_down_got
					   : &l->next_offset[p->duck_index][desc->tensor];
	if (desc->offset != *next) {
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 "layer %u duck %u tensor %u: chunk at byte %lu, but the next byte due is %lu "
			 "(send each tensor once, in order)",
			 l->id, desc->duck, desc->tensor, (unsigned long)desc->offset,
			 (unsigned long)*next);
		return;
	}
	if (p->duck_index >= 0)
		*next += desc->nbytes; /* b_down_got moves below */
	if (p->duck_index < 0) {
		/* b_down stays here: it is added once, after the reduce */
		memcpy(l->b_down_raw + desc->offset, src, desc->nbytes);
		l->b_down_got += desc->nbytes;
		complete(d, f, DP_STATUS_OK, NULL);
		return;
	}
	f->kind = DP_FWD_WEIGHT;
	f->layer = l;
	f->w_duck = desc->duck;
	f->w_tensor = desc->tensor;
	f->w_index = (uint32_t)p->duck_index;
	f->deadline_ns = now + (uint64_t)w->cfg.weight_timeout_ms * 1000000;
	uint32_t nic = w->cfg.ducks[w->duck_index[desc->duck]].nic;
	f->nic_mask = 1u << nic;
	f->nics_pending = 1;
	dp_fetch_add_u64(&l->outstanding, 1);
	hand_to(d, f, nic);
}

/* A repair's duck whose bank is not all in: its id, its tensor in *t and the bytes
 * acknowledged of it in *got (UINT64_MAX: a chunk was not acknowledged); -1 for none. */
static int32_t repair_short(const struct dp_layer *l, uint32_t *t, uint64_t *got)
{
	for (uint32_t i = 0; i < l->nducks; i++) {
		uint32_t dk = l->ducks[i];
		if (!dp_targets_has(l->repair_ducks, dk))
			continue;
		if (__atomic_load_n(&l->failed_ducks[dk >> 6], __ATOMIC_RELAXED) >> (dk & 63) & 1) {
			*t = 0;
			*got = UINT64_MAX;
			return (int32_t)dk;
		}
		for (*t = 0; *t < DP_SHARD_TENSORS; (*t)++) {
			*got = __atomic_load_n(&l->acked[i][*t], __ATOMIC_ACQUIRE);
			if (*got != dp_tensor_bytes(l, i, *t))
				return (int32_t)dk;
		}
	}
	return -1;
}

/* A commit on a layer committed already closes a repair (RepairLayer) once every chunk
 * before it is in. Whole, the repaired ducks leave lost_ducks (release: a dispatcher
 * that no longer sees a duck's bit sends it forwards only after every byte of its bank
 * was acknowledged); else they stay lost and the layer serves on the others as before.
 * Either way the repair closes: repairing drops last (release), after its ducks' books. */
static int try_repair_commit(struct dp_dispatcher *d, struct dp_fwd *f, struct dp_layer *l)
{
	if (!dp_load_acquire_u32(&l->repairing)) {
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 "layer %u is loaded and no repair of it is open: nothing to commit", l->id);
		return 1;
	}
	/* acquire: the workers' acked[] adds happen before their outstanding decrement */
	if (__atomic_load_n(&l->outstanding, __ATOMIC_ACQUIRE) != 0)
		return 0;
	uint32_t t = 0;
	uint64_t got = 0;
	int32_t bad = repair_short(l, &t, &got);
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++) {
		uint64_t mine = l->repair_ducks[k];
		if (bad < 0)
			__atomic_fetch_and(&l->lost_ducks[k], ~mine, __ATOMIC_RELEASE);
		__atomic_fetch_and(&l->failed_ducks[k], ~mine, __ATOMIC_RELAXED);
		l->repair_ducks[k] = 0;
	}
	dp_store_release_u32(&l->repairing, 0);
	if (bad < 0) {
		dp_count(d->counters, DP_C_layers_repaired, 1);
		complete(d, f, DP_STATUS_OK, NULL);
	} else if (got == UINT64_MAX) {
		complete(d, f, DP_STATUS_DATAPLANE_ERROR,
			 "repair of layer %u failed: duck %d did not acknowledge its bank within %u "
			 "ms; it stays lost (repair again once it answers)",
			 l->id, bad, d->w->cfg.weight_timeout_ms);
	} else {
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 "repair of layer %u incomplete: duck %d tensor %u got %lu of %lu bytes; it "
			 "stays lost", l->id, bad, t, (unsigned long)got,
			 (unsigned long)dp_tensor_bytes(l, (uint32_t)l->index[bad], t));
	}
	return 1;
}

/* A commit completes once every chunk before it has; 1 when it did. */
static int try_commit(struct dp_dispatcher *d, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer; /* taken at dispatch */
	if (!l) {
		/* another client's: the words its chunks and forwards are refused with */
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 dp_layer_find(d->w, f->desc.layer) ? "layer %u belongs to another client"
							    : "layer %u is not being loaded",
			 f->desc.layer);
		return 1;
	}
	if (dp_load_acquire_u32(&l->ready)) /* only this thread sets it */
		return try_repair_commit(d, f, l);
	/* acquire: the workers' acked[] adds happen before their outstanding decrement */
	if (__atomic_load_n(&l->outstanding, __ATOMIC_ACQUIRE) != 0)
		return 0;
	if (dp_load_acquire_u32(&l->failed)) {
		/* name the ducks, in the log too: a load onto ducks that do not run is a
		 * user's likely first mistake, and the log is where an operator looks */
		char list[160];
		size_t used = 0;
		for (uint32_t i = 0; i < l->nducks && used + 16 < sizeof(list); i++) {
			uint32_t dk = l->ducks[i];
			if (!(__atomic_load_n(&l->failed_ducks[dk >> 6], __ATOMIC_RELAXED) >> (dk & 63) & 1))
				continue;
			int k = snprintf(list + used, sizeof(list) - used, "%s%u", used ? ", " : "", dk);
			used += k > 0 ? (size_t)k : 0;
		}
		DP_WARN("layer %u failed to load: ducks [%s] did not acknowledge their weights "
			"within %u ms; are they running, on the port and address the topology "
			"gives them?",
			l->id, list, d->w->cfg.weight_timeout_ms);
		if (l->is_move) /* the old layer serves on: dp_layer_settle_move drops this one */
			complete(d, f, DP_STATUS_BAD_REQUEST,
				 "move of layer %u failed: ducks [%s] did not acknowledge their new "
				 "banks; it serves on its old placement", l->id, list);
		else
			complete(d, f, DP_STATUS_BAD_REQUEST,
				 "layer %u failed: ducks [%s] did not acknowledge their weights; "
				 "load it again", l->id, list);
		return 1;
	}
	for (uint32_t i = 0; i < l->nducks; i++)
		for (uint32_t t = 0; t < DP_SHARD_TENSORS; t++) {
			/* a move's: the ducks it changed; the others keep their banks */
			if (l->is_move && !dp_targets_has(l->move_ducks, l->ducks[i]))
				break;
			uint64_t want = dp_tensor_bytes(l, i, t);
			uint64_t got = __atomic_load_n(&l->acked[i][t], __ATOMIC_ACQUIRE);
			if (got != want) {
				/* failed, not loading for ever: Layers says so until a reload */
				dp_store_release_u32(&l->failed, 1);
				complete(d, f, DP_STATUS_BAD_REQUEST,
					 "layer %u incomplete: duck %u tensor %u got %lu of %lu bytes",
					 l->id, l->ducks[i], t, got, want);
				return 1;
			}
		}
	if (l->has_b_down) {
		uint64_t want = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
		if (l->b_down_got != want) {
			dp_store_release_u32(&l->failed, 1);
			complete(d, f, DP_STATUS_BAD_REQUEST, "layer %u incomplete: b_down got %lu of %lu",
				 l->id, l->b_down_got, want);
			return 1;
		}
		for (uint32_t c = 0; c < l->hidden; c++) {
			if (l->dtype == DP_DTYPE_F32) {
				memcpy(&l->b_down[c], l->b_down_raw + 4 * (size_t)c, 4);
			} else {
				uint16_t v;
				memcpy(&v, l->b_down_raw + 2 * (size_t)c, 2);
				l->b_down[c] = dp_half_to_f32(v, l->dtype);
			}
		}
	}
	/* release: a dispatcher that sees ready sees b_down. A move's: the switch, since this
	 * thread alone takes layers for forwards (dp_layer_take), every forward dispatched
	 * from here on is planned on the new placement */
	dp_store_release_u32(&l->ready, 1);
	dp_count(d->counters, l->is_move ? DP_C_layers_moved : DP_C_layers_loaded, 1);
	complete(d, f, DP_STATUS_OK, NULL);
	return 1;
}

/* desc is the dispatcher's own copy: nothing below reads the client's ring again. */
static void dispatch(struct dp_dispatcher *d, struct dp_client *c, const struct dp_desc *desc,
		     uint64_t now)
{
	struct dp_fwd *f = dp_fwd_alloc(&d->pool, c, desc, now);
	dp_count(d->counters, DP_C_descriptors, 1);
	if (!dp_fwd_client_prepare(f))
		dp_count(d->counters, DP_C_client_clock_implausible, 1);
	if (desc->slot >= c->layout.slot_count) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "slot %u is out of range", desc->slot);
		return;
	}
	DP_TSAN_ACQUIRE(&c->slots[desc->slot]);
	uint64_t epoch = dp_load_acquire_u64(&d->w->epoch);
	if (desc->epoch != epoch) {
		complete(d, f, DP_STATUS_STALE_EPOCH, "epoch %lu is stale; now %lu",
			 (unsigned long)desc->epoch, (unsigned long)epoch);
		return;
	}
	/* the layer, if this client may use it (its own, or shared to forward on), with a
	 * reference the control agent drops when the completion is sent */
	struct dp_layer *l = f->layer = dp_layer_take(d->w, desc->layer, c, desc->op != DP_OP_FORWARD);
	struct dp_desc_layer view;
	const struct dp_desc_layer *seen = dp_desc_layer_of(l, &view);
	/* there, but another client's: say so, as LoadWeights does, not "not loaded" (the
	 * view says only that: the layer is not this client's to read) */
	static const struct dp_desc_layer foreign = { .foreign = true };
	if (!l && dp_layer_find(d->w, desc->layer))
		seen = &foreign;
	struct dp_desc_plan plan;
	if (dp_desc_check(&c->layout, seen, desc, &d->limits, &plan, f->message,
			  sizeof(f->message)) < 0) {
		complete(d, f, DP_STATUS_BAD_REQUEST, NULL);
		return;
	}
	switch (desc->op) {
	case DP_OP_FORWARD:
		dispatch_forward(d, f, l, &plan, now);
		break;
	case DP_OP_WEIGHT_CHUNK:
		dispatch_weight(d, f, l, &plan, now);
		break;
	default: /* DP_OP_WEIGHT_COMMIT: dp_desc_check knows no other op */
		f->kind = DP_FWD_DONE_AT_DISPATCH;
		if (d->ncommits == MAX_PENDING_COMMITS) {
			complete(d, f, DP_STATUS_BAD_REQUEST, "too many layer commits at once");
			break;
		}
		d->commits[d->ncommits++] = f;
	}
}

/* The client broke its ring: stop reading it, say why in its header, and let the control
 * agent unmap it once its forwards in flight are done. Nobody else notices. */
static void evict(struct dp_dispatcher *d, struct dp_client *c, uint32_t reason, const char *what)
{
	uint32_t active = DP_CLIENT_ACTIVE;
	/* release: a client that sees the reason sees that we stopped */
	dp_store_release_u32(&c->hdr->detach_reason, reason);
	if (__atomic_compare_exchange_n(&c->state, &active, DP_CLIENT_CLOSING, false,
					__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		dp_count(d->counters, DP_C_clients_evicted, 1);
		DP_WARN("client %u (pid %u) detached: %s", c->id, c->pid, what);
	}
}

/* Take up to room descriptors from c's ring into d->burst; -1 when it is broken. */
static int32_t take(struct dp_dispatcher *d, struct dp_client *c, uint32_t room)
{
	int32_t n = dp_ring_consume(c->ring, c->descs, c->layout.ring_capacity, &c->ring_tail,
				    &c->ring_head_seen, d->burst, room);
	if (n < 0)
		evict(d, c, DP_DETACH_REASON_RING_BROKEN,
		      "its ring head moved back or ran more than the ring's capacity ahead");
	return n;
}

/* --- doorbells: each client's pipe, in the set the dispatcher sleeps on ------------- */

/* Empty a ready doorbell whole: its bytes say only that its client rang, the ring says
 * the rest. A well-behaved client rang a byte or a few: one read takes them. More than a
 * read's worth goes into /dev/null by splice, which drops the pipe's pages without copying
 * them, so a pipe enlarged to 1 MiB (F_SETPIPE_SZ) and kept full with tee(2), page
 * references and no copy, costs us about what filling it cost the client; one read a
 * wake-up left such a pipe readable for 256 wake-ups. Bounded: a client that refills it
 * as we drain is heard again on the next wake-up. The bytes taken; 0 at end of file
 * (every write end closed); -1 when it was empty. */
static ssize_t drain(struct dp_dispatcher *d, int fd)
{
	ssize_t got = read(fd, d->rung, sizeof(d->rung));
	if (got < (ssize_t)sizeof(d->rung))
		return got; /* all there was (a short read: the pipe is empty now), or none */
	ssize_t total = got;
	for (int k = 0; k < DOORBELL_DRAIN_TRIES; k++) {
		size_t want = d->devnull >= 0 ? DOORBELL_SPLICE : sizeof(d->rung);
		got = d->devnull >= 0 ? splice(fd, NULL, d->devnull, NULL, want, SPLICE_F_NONBLOCK)
				      : read(fd, d->rung, want);
		if (got < 0 && errno != EAGAIN && d->devnull >= 0) {
			DP_WARN("doorbells: splice into /dev/null failed (%s): read instead",
				strerror(errno));
			close(d->devnull);
			d->devnull = -1;
			continue;
		}
		if (got > 0)
			total += got;
		if (got < (ssize_t)want)
			break; /* drained (or at end of file: the next look says so) */
	}
	return total;
}

/* Did c ring for something new? Descriptors: its head, read once, moved past the last
 * ring's that brought some, by no more than the ring holds (further is the client's own
 * breakage: the next take evicts it), so a client at its quota cannot pass for busy by
 * moving its head back and forth: at most a ring's worth of rings count. Or, waiting for
 * a completion (completions_wanted: dp_completions_want rings for the outbox to leave),
 * one of its forwards completed since it last rang (however many did, that ring counts as
 * work; the next one needs another completion). `completed` moves when the control agent
 * packs the completion, after the done word: a ring made between the two counts as idle,
 * which costs a well-behaved client at most a muted spell's latency, never a forward. */
static bool rang_with_work(struct dp_bell *b, const struct dp_client *c)
{
	uint64_t head = dp_load_acquire_u64(&c->ring->head);
	uint64_t completed = __atomic_load_n(&c->completed, __ATOMIC_RELAXED);
	bool fresh = completed != b->completed;
	b->completed = completed;
	if ((int64_t)(head - b->head) > 0 && head - c->ring_tail <= c->layout.ring_capacity) {
		b->head = head;
		return true;
	}
	return fresh && __atomic_load_n(&c->hdr->completions_wanted, __ATOMIC_RELAXED);
}

/* Not listened to until its quiet time ends (the wake-ups it cost were its own, nobody
 * else's): its ring is still taken on every pass, and park() wakes us when the quiet time
 * ends, so nothing it submits is lost, only later. The next quiet time is twice as long,
 * and one more ring for nothing then mutes it again at once. */
static void mute(struct dp_dispatcher *d, uint32_t i)
{
	struct dp_bell *b = &d->bells[i];
	const struct dp_client *c = &d->w->clients[i];
	if (d->listening & (1ull << i))
		epoll_ctl(d->doorbells, EPOLL_CTL_DEL, c->doorbell_fd, NULL);
	d->listening &= ~(1ull << i);
	d->muted |= 1ull << i;
	b->quiet_until = dp_now_ns() + b->mute_ns;
	b->idle = DOORBELL_IDLE_RINGS - 1;
	if (!b->warned) {
		b->warned = true;
		DP_WARN("client %u (pid %u) rings its doorbell with no new descriptor: it is not "
			"listened to for %llu ms at a time, doubling while it goes on "
			"(doorbell_rate_limited)",
			c->id, c->pid, (unsigned long long)(b->mute_ns / 1000000));
	}
	if (b->mute_ns < DOORBELL_MUTE_MAX_NS)
		b->mute_ns *= 2;
	dp_count(d->counters, DP_C_doorbell_rate_limited, 1);
}

/* A ring heard from client i (its pipe drained): one that brought descriptors pays back
 * one that did not; DOORBELL_IDLE_RINGS that did not, net, mute the doorbell. */
static void heard(struct dp_dispatcher *d, uint32_t i)
{
	struct dp_bell *b = &d->bells[i];
	if (rang_with_work(b, &d->w->clients[i])) {
		if (b->idle)
			b->idle--;
		b->mute_ns = DOORBELL_MUTE_MIN_NS;
		return;
	}
	dp_count(d->counters, DP_C_doorbells_idle, 1);
	if (++b->idle >= DOORBELL_IDLE_RINGS)
		mute(d, i);
}

/* The pipe lost its last writer (its process died, or it closed them). A pipe at end of
 * file stays readable: watched, it would wake us forever */
static void go_deaf(struct dp_dispatcher *d, uint32_t i)
{
	if (d->listening & (1ull << i))
		epoll_ctl(d->doorbells, EPOLL_CTL_DEL, d->w->clients[i].doorbell_fd, NULL);
	d->listening &= ~(1ull << i);
	d->deaf |= 1ull << i;
	dp_count(d->counters, DP_C_doorbell_unwatched, 1);
}

/* A muted client whose quiet time is over: what it rang meanwhile is drained and judged
 * as one ring (a client that went on ringing for nothing is muted again, unheard). True
 * when it may be listened to again. */
static bool unmute(struct dp_dispatcher *d, uint32_t i)
{
	d->muted &= ~(1ull << i);
	ssize_t got = drain(d, d->w->clients[i].doorbell_fd);
	if (got == 0) {
		go_deaf(d, i);
		return false;
	}
	if (got > 0) {
		dp_count(d->counters, DP_C_doorbells, (uint64_t)got);
		heard(d, i);
	}
	return !(d->muted & (1ull << i));
}

/* Before a client is told to ring (need_wakeup), its pipe is in the set we sleep on.
 * False when it cannot be (ENOMEM, the user's epoll watch limit): then we poll. A muted
 * one is not, until its quiet time ends: *wake_at says when. */
static bool listen_to(struct dp_dispatcher *d, uint32_t i, const struct dp_client *c,
		      uint64_t now, uint64_t *wake_at)
{
	uint64_t bit = 1ull << i;
	if ((d->listening | d->deaf) & bit)
		return true; /* a deaf one has nothing left to say: it is its own loss */
	struct dp_bell *b = &d->bells[i];
	if (!(d->known & bit)) {
		/* the slot's client is new: its ring starts where it starts */
		*b = (struct dp_bell){ .head = c->ring_tail,
				       .completed = __atomic_load_n(&c->completed, __ATOMIC_RELAXED),
				       .mute_ns = DOORBELL_MUTE_MIN_NS };
		d->known |= bit;
	}
	if ((d->muted & bit) && (now < b->quiet_until || !unmute(d, i))) {
		if ((d->muted & bit) && b->quiet_until < *wake_at)
			*wake_at = b->quiet_until;
		return true;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = i };
	if (c->doorbell_fd < 0 || epoll_ctl(d->doorbells, EPOLL_CTL_ADD, c->doorbell_fd, &ev) < 0) {
		dp_count(d->counters, DP_C_doorbell_unwatched, 1);
		return false;
	}
	d->listening |= 1ull << i;
	return true;
}

static void stop_listening(struct dp_dispatcher *d, uint32_t i)
{
	/* the slot's next client starts afresh */
	d->deaf &= ~(1ull << i);
	d->muted &= ~(1ull << i);
	d->known &= ~(1ull << i);
	if (!(d->listening & (1ull << i)))
		return;
	epoll_ctl(d->doorbells, EPOLL_CTL_DEL, d->w->clients[i].doorbell_fd, NULL);
	d->listening &= ~(1ull << i);
}

/* The quota each client has in a pass, and that parking checks against: its fair share
 * of the forward contexts among the clients the last pass polled. */
static uint64_t client_quota(const struct dp_dispatcher *d)
{
	return dp_client_quota(d->w->nfwds, d->nactive, d->w->cfg.client_max_inflight);
}

int dp_dispatch_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_dispatcher *d = self;
	int work = 0;
	(void)now; /* each burst takes a fresh clock: the loop's may predate the submit */
	dp_fwd_pool_refill(&d->pool);
	for (uint32_t i = 0; i < d->ncommits;) {
		if (try_commit(d, d->commits[i])) {
			d->commits[i] = d->commits[--d->ncommits];
			work++;
		} else {
			i++;
		}
	}
	/* each client's share of this pass; a client with less to do leaves the rest unused
	 * rather than letting one client take a whole burst while others wait */
	uint32_t credit = DP_BURST / (d->nactive ? d->nactive : 1);
	uint32_t nactive = 0, start = d->next_client;
	uint64_t quota = client_quota(d); /* a fair share of the contexts (dp_fair_share.h) */
	for (uint32_t k = 0; k < DP_MAX_CLIENTS; k++) {
		uint32_t i = (start + k) % DP_MAX_CLIENTS;
		struct dp_client *c = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&c->state);
		if (state == DP_CLIENT_CLOSING) {
			stop_listening(d, i); /* the control agent closes the pipe after QUIESCED */
			dp_store_release_u32(&c->state, DP_CLIENT_QUIESCED); /* I stopped reading it */
			continue;
		}
		if (state != DP_CLIENT_ACTIVE)
			continue;
		nactive++;
		/* acquire: the control agent's decrement follows its last use of the context */
		uint64_t inflight = __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE);
		uint32_t room = credit ? credit : 1;
		if (room > d->pool.nfree)
			room = d->pool.nfree; /* all in flight: descriptors wait in the rings */
		if (inflight >= quota) {
			/* at its quota: its descriptors wait in its ring; nobody else waits for it */
			if (dp_load_relaxed_u64(&c->ring->head) != c->ring_tail)
				dp_count(d->counters, DP_C_client_quota_waits, 1);
			continue;
		}
		if (room > quota - inflight)
			room = (uint32_t)(quota - inflight);
		if (room == 0)
			continue;
		int32_t got = take(d, c, room);
		if (got <= 0)
			continue;
		d->next_client = (i + 1) % DP_MAX_CLIENTS;
		uint64_t pickup = dp_now_ns(); /* the loop's clock may predate the submit */
		for (int32_t j = 0; j < got; j++)
			dispatch(d, c, &d->burst[j], pickup);
		flush(d);
		work += got;
	}
	d->nactive = nactive;
	/* a layer pointer read in this pass is now held by a reference, or not at all:
	 * the control agent may free what it unpublished before this pass (seq_cst: store
	 * then later table loads) */
	__atomic_fetch_add(&w->dispatch_passes, 1, __ATOMIC_SEQ_CST);
	return work;
}

/* --- parking ------------------------------------------------------------------------- */


/* False when some client could not be listened to: its ringing would wake nobody. With
 * v, *wake_at is when the first muted client's quiet time ends (else left alone). */
static bool set_need_wakeup(struct dp_dispatcher *d, uint32_t v, uint64_t now, uint64_t *wake_at)
{
	bool all = true;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *c = &d->w->clients[i];
		if (dp_load_acquire_u32(&c->state) == DP_CLIENT_ACTIVE) {
			if (v && !listen_to(d, i, c, now, wake_at))
				all = false;
			__atomic_store_n(&c->hdr->need_wakeup, v, __ATOMIC_RELAXED);
		}
	}
	return all;
}

int64_t dp_dispatch_park(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_dispatcher *d = self;
	if (!dp_spsc_empty(&w->free_ring))
		return -1;
	uint64_t wake_at = UINT64_MAX;
	bool all_listened = set_need_wakeup(d, 1, now, &wake_at);
	d->armed = true;
	/* seq_cst: need_wakeup's stores before the heads' loads; pairs with dp_doorbell_ring */
	dp_fence_seq_cst();
	uint64_t quota = client_quota(d);
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *c = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&c->state);
		if (state == DP_CLIENT_CLOSING)
			return -1; /* a pass acknowledges it (QUIESCED) */
		if (state != DP_CLIENT_ACTIVE || dp_load_acquire_u64(&c->ring->head) == c->ring_tail)
			continue;
		/* descriptors wait: take them now, unless the client is at its quota or every
		 * context is out (then the control agent's push into the free ring kicks us) */
		if (d->pool.nfree && __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE) < quota)
			return -1;
	}
	/* a layer commit waits for its chunks: the worker that completes the last one kicks
	 * us (dp_weight_finish); one whose chunks are all done is ours to complete now */
	for (uint32_t i = 0; i < d->ncommits; i++) {
		const struct dp_layer *l = d->commits[i]->layer;
		if (!l || __atomic_load_n(&l->outstanding, __ATOMIC_ACQUIRE) == 0)
			return -1;
	}
	/* a client whose doorbell we cannot watch is polled, every millisecond; a muted one
	 * when its quiet time ends */
	int64_t timeout = all_listened ? DP_PARK_FOREVER : DOORBELL_POLL_NS;
	if (wake_at != UINT64_MAX && (int64_t)(wake_at > now ? wake_at - now : 0) < timeout)
		timeout = (int64_t)(wake_at > now ? wake_at - now : 0);
	return timeout;
}

void dp_dispatch_unpark(struct dp_world *w, void *self)
{
	struct dp_dispatcher *d = self;
	(void)w;
	if (d->armed) {
		set_need_wakeup(d, 0, 0, NULL); /* awake: clients need not ring */
		d->armed = false;
	}
	/* slept and woken by something else (a reply, ZeroMQ, a kick): no pipe to drain.
	 * One that rang meanwhile stays readable and wakes the next park at once */
	if (d->waker->waited && !dp_waker_fired(d->waker, d->doorbells)) /* waker: wait_on's */
		return;
	/* what a doorbell carried is only that its client rang: the rings say the rest. Each
	 * ready pipe is drained whole, so a wake-up costs one epoll_wait and a drain per
	 * client that rang, and a client whose rings bring no descriptors is muted (heard) */
	struct epoll_event ev[DP_MAX_CLIENTS];
	int n = epoll_wait(d->doorbells, ev, DP_MAX_CLIENTS, 0);
	uint64_t rang = 0;
	for (int k = 0; k < n; k++) {
		uint32_t i = ev[k].data.u32;
		if (i >= DP_MAX_CLIENTS || !(d->listening & (1ull << i)))
			continue;
		ssize_t got = drain(d, d->w->clients[i].doorbell_fd);
		if (got > 0) {
			rang += (uint64_t)got;
			heard(d, i);
		} else if (got == 0) {
			go_deaf(d, i);
		}
	}
	dp_count(d->counters, DP_C_doorbells, rang);
}

int dp_dispatch_wait_on(struct dp_world *w, void *self, struct dp_waker *wk)
{
	struct dp_dispatcher *d = self;
	(void)w;
	d->waker = wk;
	return dp_waker_add(wk, d->doorbells);
}

/* The set of the clients' doorbells (each client's own pipe, dp_client_open_doorbell),
 * itself an fd in the runner's waker: readable when any client rang. */
static int open_doorbells(struct dp_dispatcher *d)
{
	d->doorbells = epoll_create1(EPOLL_CLOEXEC);
	if (d->doorbells < 0) {
		dp_set_error("epoll_create1 (the clients' doorbells): %s", strerror(errno));
		return -1;
	}
	return 0;
}

struct dp_dispatcher *dp_dispatch_new(struct dp_world *w)
{
	struct dp_dispatcher *d = calloc(1, sizeof(*d));
	if (!d || dp_fwd_pool_init(&d->pool, w) < 0) {
		free(d);
		dp_set_error("out of memory for the dispatcher");
		return NULL;
	}
	d->w = w;
	/* none (a chroot without /dev): the doorbells are read instead */
	d->devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (open_doorbells(d) < 0) {
		if (d->devnull >= 0)
			close(d->devnull);
		dp_fwd_pool_fini(&d->pool);
		free(d);
		return NULL;
	}
	d->counters = &w->dispatch_counters;
	for (uint32_t n = 0; n < w->cfg.nnics; n++)
		if (strcmp(w->cfg.nics[n].backend, "null") == 0)
			d->null_nics |= 1u << n;
	d->limits = (struct dp_limits){ .max_forward_bytes = w->cfg.max_forward_bytes,
					.default_timeout_us = w->cfg.default_timeout_us,
					.max_timeout_us = w->cfg.max_timeout_us };
	return d;
}

void dp_dispatch_free(struct dp_dispatcher *d)
{
	if (d) {
		close(d->doorbells);
		if (d->devnull >= 0)
			close(d->devnull);
		dp_fwd_pool_fini(&d->pool);
	}
	free(d);
}
