/* dp_dispatch.c: the dispatcher agent.
 *
 * Polls every attached client's submission ring, checks each descriptor
 * against the client's segment and the layer it names, and hands forwards and
 * weight chunks to the NIC workers through their SPSC rings. What it refuses,
 * and what needs no network (b_down, commits), it completes itself. It is the
 * only allocator of forward contexts; the control agent returns them through
 * the free ring once their ZeroMQ completion is out.
 */
#include "dp_dispatch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_f16.h"
#include "dp_reduce.h"
#include "dp_ring.h"
#include "dp_worker.h"

#define MAX_PENDING_COMMITS 64

struct dp_dispatcher {
	struct dp_world *w;
	struct dp_fwd **free;
	uint32_t nfree;
	struct dp_fwd *commits[MAX_PENDING_COMMITS];
	uint32_t ncommits;
	struct dp_desc burst[DP_BURST];
	struct dp_counters *counters;
};

void dp_fwd_counts(const struct dp_world *w, const struct dp_fwd *f, uint32_t *answered,
		   uint32_t *missing)
{
	*answered = *missing = 0;
	if (f->kind != DP_FWD_FORWARD)
		return;
	for (uint32_t d = 0; d < 256; d++)
		if (dp_targets_has(f->targets, d)) {
			if (f->rx[w->duck_index[d]].state == 1)
				(*answered)++;
			else
				(*missing)++;
		}
}

void dp_fwd_publish(struct dp_world *w, struct dp_fwd *f)
{
	struct dp_client *c = f->client;
	if (f->desc.slot >= c->hdr->slot_count)
		return; /* a refused descriptor with a bad slot completes over ZeroMQ only */
	uint32_t answered, missing;
	dp_fwd_counts(w, f, &answered, &missing);
	dp_slot_publish(&c->slots[f->desc.slot], f->desc.forward_id, f->desc.epoch, f->bytes,
			answered, missing, f->desc.generation, f->status);
}

/* Complete here, now: publish the slot and queue the ZeroMQ completion. */
static void complete(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t status, const char *fmt,
		     ...) __attribute__((format(printf, 4, 5)));
static void complete(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t status, const char *fmt,
		     ...)
{
	f->kind = DP_FWD_DONE_AT_DISPATCH;
	f->status = status;
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
	dp_fwd_publish(d->w, f);
	dp_spsc_push(&d->w->dispatch_done, (void **)&f, 1);
}

static struct dp_fwd *fwd_alloc(struct dp_dispatcher *d, struct dp_client *c,
				const struct dp_desc *desc, uint64_t now)
{
	struct dp_fwd *f = d->free[--d->nfree];
	if (++f->gen == 0) /* wire id 0 would never match */
		f->gen = 1;
	f->wire_id = ((uint64_t)f->gen << 16) | f->index;
	f->client = c;
	f->desc = *desc;
	f->layer = NULL;
	f->status = DP_STATUS_PENDING;
	f->message[0] = '\0';
	f->pickup_ns = now;
	f->reduce_ns = 0;
	f->bytes = 0;
	f->nic_mask = 0;
	memset(f->targets, 0, sizeof(f->targets));
	memset(f->part, 0, sizeof(f->part));
	dp_fetch_add_u64(&c->inflight, 1);
	dp_store_relaxed_u64(&c->submitted, c->submitted + 1);
	dp_count(d->counters, DP_C_descriptors, 1);
	return f;
}

static void hand_to(struct dp_dispatcher *d, struct dp_fwd *f, uint32_t nic)
{
	struct dp_worker *wk = d->w->workers[nic];
	if (dp_spsc_push(&wk->in, (void **)&f, 1) != 1) /* capacity is the context count */
		DP_ERROR("nic %u: dispatch ring full; this is a bug", nic);
}

static void dispatch_forward(struct dp_dispatcher *d, struct dp_fwd *f, uint64_t now)
{
	struct dp_world *w = d->w;
	struct dp_client *c = f->client;
	const struct dp_desc *desc = &f->desc;
	struct dp_layer *l = f->layer = dp_layer_take(w, desc->layer, c, false);
	if (!l || !dp_load_acquire_u32(&l->ready)) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "layer %u is not loaded", desc->layer);
		return;
	}
	uint32_t item = dp_dtype_size(desc->dtype);
	if (desc->dtype != l->dtype) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "dtype %u does not match layer %u's (%u)",
			 desc->dtype, l->id, l->dtype);
		return;
	}
	if (desc->ndim < 1 || desc->ndim > DP_MAX_DIMS || desc->shape[desc->ndim - 1] != l->hidden) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "shape does not end in layer %u's hidden %u",
			 l->id, l->hidden);
		return;
	}
	uint64_t elems = 1;
	for (uint32_t k = 0; k < desc->ndim; k++)
		elems *= desc->shape[k];
	if (elems == 0 || elems * item != desc->nbytes || desc->nbytes > c->hdr->act_slot_size ||
	    desc->nbytes > c->hdr->res_slot_size || desc->nbytes > w->cfg.max_forward_bytes) {
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 "%lu bytes do not match the shape or exceed the slots or max_forward_bytes %u",
			 (unsigned long)desc->nbytes, w->cfg.max_forward_bytes);
		return;
	}
	bool any = desc->ducks[0] | desc->ducks[1] | desc->ducks[2] | desc->ducks[3];
	for (uint32_t d_ = 0; d_ < 256; d_++) {
		bool wanted = any ? dp_targets_has(desc->ducks, d_) : l->index[d_] >= 0;
		if (!wanted)
			continue;
		if (l->index[d_] < 0) {
			complete(d, f, DP_STATUS_BAD_REQUEST, "duck %u holds no shard of layer %u", d_,
				 l->id);
			return;
		}
		f->targets[d_ >> 6] |= 1ull << (d_ & 63);
		f->nic_mask |= 1u << w->cfg.ducks[w->duck_index[d_]].nic;
	}
	f->kind = DP_FWD_FORWARD;
	f->layer = l;
	f->bytes = desc->nbytes;
	f->rows = (uint32_t)(elems / l->hidden);
	f->act = c->act + (uint64_t)desc->slot * c->hdr->act_slot_size;
	f->res = c->res + (uint64_t)desc->slot * c->hdr->res_slot_size;
	uint64_t timeout_us = desc->timeout_us ? desc->timeout_us : w->cfg.default_timeout_us;
	f->deadline_ns = now + timeout_us * 1000;
	f->nics_pending = (uint32_t)__builtin_popcount(f->nic_mask);
	dp_count(d->counters, DP_C_forwards, 1);
	for (uint32_t n = 0; n < w->cfg.nnics; n++)
		if (f->nic_mask & (1u << n))
			hand_to(d, f, n);
}

static void dispatch_weight(struct dp_dispatcher *d, struct dp_fwd *f, uint64_t now)
{
	struct dp_world *w = d->w;
	const struct dp_desc *desc = &f->desc;
	struct dp_layer *l = f->layer = dp_layer_take(w, desc->layer, f->client, true);
	if (!l || dp_load_acquire_u32(&l->ready)) {
		complete(d, f, DP_STATUS_BAD_REQUEST,
			 "layer %u is not being loaded (send LoadWeights first)", desc->layer);
		return;
	}
	if (desc->nbytes == 0 || desc->nbytes > f->client->hdr->act_slot_size ||
	    desc->nbytes > w->cfg.max_forward_bytes) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "weight chunk of %lu bytes", desc->nbytes);
		return;
	}
	const uint8_t *src = f->client->act + (uint64_t)desc->slot * f->client->hdr->act_slot_size;
	if (desc->duck == DP_HOST_TENSOR_DUCK) {
		/* b_down stays here: it is added once, after the reduce */
		uint64_t size = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
		if (!l->has_b_down || desc->tensor != 3 || desc->offset + desc->nbytes > size) {
			complete(d, f, DP_STATUS_BAD_REQUEST, "bad b_down chunk for layer %u", l->id);
			return;
		}
		memcpy(l->b_down_raw + desc->offset, src, desc->nbytes);
		l->b_down_got += desc->nbytes;
		complete(d, f, DP_STATUS_OK, NULL);
		return;
	}
	int16_t i = l->index[desc->duck];
	if (i < 0 || desc->tensor > 2 ||
	    desc->offset + desc->nbytes > dp_tensor_bytes(l, (uint32_t)i, desc->tensor)) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "duck %u tensor %u [%lu, +%lu) is not in layer %u",
			 desc->duck, desc->tensor, desc->offset, desc->nbytes, l->id);
		return;
	}
	f->kind = DP_FWD_WEIGHT;
	f->layer = l;
	f->w_duck = desc->duck;
	f->w_tensor = desc->tensor;
	f->w_index = (uint32_t)i;
	f->deadline_ns = now + (uint64_t)w->cfg.weight_timeout_ms * 1000000;
	uint32_t nic = w->cfg.ducks[w->duck_index[desc->duck]].nic;
	f->nic_mask = 1u << nic;
	f->nics_pending = 1;
	dp_fetch_add_u64(&l->outstanding, 1);
	hand_to(d, f, nic);
}

/* A commit completes once every chunk before it has; 1 when it did. */
static int try_commit(struct dp_dispatcher *d, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer; /* taken at dispatch */
	if (!l) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "layer %u is not being loaded", f->desc.layer);
		return 1;
	}
	/* acquire: the workers' acked[] adds happen before their outstanding decrement */
	if (__atomic_load_n(&l->outstanding, __ATOMIC_ACQUIRE) != 0)
		return 0;
	if (dp_load_acquire_u32(&l->failed)) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "layer %u: a weight chunk failed; load it again",
			 l->id);
		return 1;
	}
	for (uint32_t i = 0; i < l->nducks; i++)
		for (uint32_t t = 0; t < 3; t++) {
			uint64_t want = dp_tensor_bytes(l, i, t);
			uint64_t got = __atomic_load_n(&l->acked[i][t], __ATOMIC_ACQUIRE);
			if (got != want) {
				complete(d, f, DP_STATUS_BAD_REQUEST,
					 "layer %u incomplete: duck %u tensor %u got %lu of %lu bytes",
					 l->id, l->ducks[i], t, got, want);
				return 1;
			}
		}
	if (l->has_b_down) {
		uint64_t want = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
		if (l->b_down_got != want) {
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
				l->b_down[c] = dp_f16_to_f32(v);
			}
		}
	}
	/* release: a dispatcher that sees ready sees b_down */
	dp_store_release_u32(&l->ready, 1);
	dp_count(d->counters, DP_C_layers_loaded, 1);
	complete(d, f, DP_STATUS_OK, NULL);
	return 1;
}

static void dispatch(struct dp_dispatcher *d, struct dp_client *c, const struct dp_desc *desc,
		     uint64_t now)
{
	struct dp_fwd *f = fwd_alloc(d, c, desc, now);
	if (desc->slot >= c->hdr->slot_count) {
		complete(d, f, DP_STATUS_BAD_REQUEST, "slot %u is out of range", desc->slot);
		return;
	}
	uint64_t epoch = dp_load_acquire_u64(&d->w->epoch);
	if (desc->epoch != epoch) {
		complete(d, f, DP_STATUS_STALE_EPOCH, "epoch %lu is stale; now %lu",
			 (unsigned long)desc->epoch, (unsigned long)epoch);
		return;
	}
	switch (desc->op) {
	case DP_OP_FORWARD:
		dispatch_forward(d, f, now);
		break;
	case DP_OP_WEIGHT_CHUNK:
		dispatch_weight(d, f, now);
		break;
	case DP_OP_WEIGHT_COMMIT:
		f->kind = DP_FWD_DONE_AT_DISPATCH;
		f->layer = dp_layer_take(d->w, desc->layer, c, true);
		if (d->ncommits == MAX_PENDING_COMMITS) {
			complete(d, f, DP_STATUS_BAD_REQUEST, "too many layer commits at once");
			break;
		}
		d->commits[d->ncommits++] = f;
		break;
	default:
		complete(d, f, DP_STATUS_BAD_REQUEST, "unknown op %u", desc->op);
	}
}

int dp_dispatch_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_dispatcher *d = self;
	int work = 0;
	void *back[DP_BURST];
	uint32_t n;
	while ((n = dp_spsc_pop(&w->free_ring, back, DP_BURST)) > 0)
		for (uint32_t i = 0; i < n; i++)
			d->free[d->nfree++] = back[i];
	for (uint32_t i = 0; i < d->ncommits;) {
		if (try_commit(d, d->commits[i])) {
			d->commits[i] = d->commits[--d->ncommits];
			work++;
		} else {
			i++;
		}
	}
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *c = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&c->state);
		if (state == DP_CLIENT_CLOSING) {
			dp_store_release_u32(&c->state, DP_CLIENT_QUIESCED); /* I stopped reading it */
			continue;
		}
		if (state != DP_CLIENT_ACTIVE)
			continue;
		uint32_t room = d->nfree < DP_BURST ? d->nfree : DP_BURST;
		if (room == 0)
			break; /* every context is in flight: descriptors wait in the rings */
		n = dp_ring_pop_burst(c->ring, c->descs, c->hdr->ring_capacity, d->burst, room);
		uint64_t pickup = n ? dp_now_ns() : now; /* the loop's clock may predate the submit */
		for (uint32_t k = 0; k < n; k++)
			dispatch(d, c, &d->burst[k], pickup);
		work += (int)n;
	}
	/* a layer pointer read in this pass is now held by a reference, or not at all:
	 * the control agent may free what it unpublished before this pass (seq_cst: store
	 * then later table loads) */
	__atomic_fetch_add(&w->dispatch_passes, 1, __ATOMIC_SEQ_CST);
	return work;
}

struct dp_dispatcher *dp_dispatch_new(struct dp_world *w)
{
	struct dp_dispatcher *d = calloc(1, sizeof(*d));
	if (!d || !(d->free = calloc(w->nfwds, sizeof(struct dp_fwd *)))) {
		free(d);
		dp_set_error("out of memory for the dispatcher");
		return NULL;
	}
	d->w = w;
	d->counters = &w->dispatch_counters;
	for (uint32_t i = w->nfwds; i-- > 0;)
		d->free[d->nfree++] = &w->fwds[i];
	return d;
}

void dp_dispatch_free(struct dp_dispatcher *d)
{
	if (d)
		free(d->free);
	free(d);
}
