/* dp_weight.c: reliable weight transfer to one duck.
 *
 * A weight chunk (part of one tensor of one layer, for one duck) goes by reliable
 * unicast: LAYER first, announcing the layer's shape (one context per layer and duck
 * announces it; the others wait for its ack), then WEIGHT datagrams, each sent again
 * weight_rto after it went out until the duck acknowledges it. It is background
 * traffic that never delays a forward: the worker's timers (dp_worker.c) give it a
 * budget per loop and a window of datagrams in flight, and end it at its deadline. The
 * last ack, or the deadline, settles the layer's books here (bytes acknowledged, or the
 * duck failed); the call returns the part's status and the worker ends the part. All
 * this file sees of the worker is its view (dp_weight.h).
 */
#include "dp_weight.h"

#include <stdio.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_tx.h"
#include "dp_wire.h"

static uint64_t *weight_sent(const struct dp_weight_view *v, const struct dp_fwd *f)
{
	return &v->sent_ns[(size_t)f->index * v->max_chunks];
}

static struct dp_wire_header *weight_headers(const struct dp_weight_view *v,
					     const struct dp_fwd *f)
{
	return &v->hdrs[(size_t)f->index * v->max_chunks];
}

void dp_weight_accept(const struct dp_weight_view *v, struct dp_fwd *f)
{
	uint32_t chunks = dp_wire_chunk_count(f->desc.nbytes, v->payload);
	dp_reasm_reset(&f->w_acks, chunks);
	f->w_announcer = false;
	f->w_layer_sent_ns = 0;
	f->w_sent = 0;
	memset(weight_sent(v, f), 0, chunks * sizeof(uint64_t));
	struct dp_wire_header *hdrs = weight_headers(v, f);
	struct dp_layer *l = f->layer;
	for (uint32_t c = 0; c < chunks; c++) {
		struct dp_wire_header *h = &hdrs[c];
		dp_wire_init(h, DP_WIRE_OP_WEIGHT, v->w->session, f->desc.epoch);
		h->dtype = l->dtype;
		h->forward_id = f->wire_id;
		h->layer = l->id;
		h->duck = f->w_duck;
		h->tensor = f->w_tensor;
		h->chunk = c;
		h->chunks = chunks;
		h->offset = f->desc.offset + (uint64_t)c * v->payload;
		h->total = dp_tensor_bytes(l, f->w_index, f->w_tensor);
		h->length = dp_wire_chunk_len(f->desc.nbytes, v->payload, c);
	}
	f->part[v->nic].owner.mem = &f->client->mem; /* sent in place from its slot */
}

static void send_layer(const struct dp_weight_view *v, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	void *payload;
	struct dp_wire_header *h =
		dp_tx_ctl_header(v->tx, DP_WIRE_OP_LAYER, f->desc.epoch, &payload);
	struct dp_wire_layer *m = payload;
	memset(m, 0, sizeof(*m));
	m->kind = l->kind;
	m->dtype = l->dtype;
	m->hidden = l->hidden;
	m->ffn = l->shard[f->w_index];
	m->weight_dtype = l->weight_dtype;
	m->bank = l->bank; /* a move's new bank goes beside the duck's old one */
	if (l->moe) { /* the duck's bank: its experts, each expert_ffn columns, then shared */
		m->experts = l->moe->experts_on[f->w_duck];
		m->expert_ffn = l->moe->expert_ffn;
	}
	h->forward_id = f->wire_id;
	h->layer = l->id;
	h->duck = f->w_duck;
	h->dtype = l->dtype;
	h->tensor = DP_WIRE_LAYER_TENSOR;
	h->length = sizeof(*m);
	dp_tx_one(v->tx, dp_duck_addr(v->w, f->w_duck), h, m, sizeof(*m));
	dp_count(v->counters, DP_C_weight_datagrams, 1);
}

/* Send what is due: retransmissions within `budget`, new datagrams within `*room` too. */
uint32_t dp_weight_pump(const struct dp_weight_view *v, struct dp_fwd *f, uint64_t now,
			uint32_t budget, uint32_t *room)
{
	struct dp_layer *l = f->layer;
	uint8_t *ann = &l->announced[f->w_index];
	uint64_t rto = (uint64_t)v->w->cfg.weight_rto_us * 1000;
	uint64_t *sent = weight_sent(v, f);
	if (*ann != 2) {
		/* one context announces the layer to the duck; the others wait for its ack */
		if (*ann == 0) {
			*ann = 1;
			f->w_announcer = true;
		}
		if (f->w_announcer && f->w_layer_sent_ns + rto <= now) {
			send_layer(v, f);
			f->w_layer_sent_ns = now;
			return 1;
		}
		return 0;
	}
	struct dp_reasm *acks = &f->w_acks;
	const struct dp_wire_header *hdrs = weight_headers(v, f);
	const struct sockaddr_in *dst = dp_duck_addr(v->w, f->w_duck);
	struct dp_tx_owner *owner = &f->part[v->nic].owner;
	uint32_t n = 0;
	for (uint32_t c = 0; c < acks->chunks && n < budget; c++) {
		if (acks->bits[c >> 6] & (1ull << (c & 63)))
			continue;
		if (sent[c] && sent[c] + rto > now)
			continue;
		if (sent[c]) {
			dp_count(v->counters, DP_C_weight_retransmits, 1);
		} else {
			if (*room == 0)
				break; /* the window is full of datagrams in flight */
			(*room)--;
			f->w_sent++;
		}
		const struct dp_wire_header *h = &hdrs[c];
		dp_tx_owned(v->tx, dst, h,
			    f->client->act +
				    (uint64_t)f->desc.slot * f->client->layout.act_slot_size +
				    (h->offset - f->desc.offset),
			    h->length, owner);
		sent[c] = now;
		n++;
	}
	dp_count(v->counters, DP_C_weight_datagrams, n);
	return n;
}

/* The part is over with status: settle the layer's books; returns status for the
 * worker, which ends the part. */
static uint32_t part_over(const struct dp_weight_view *v, struct dp_fwd *f, uint32_t status)
{
	struct dp_layer *l = f->layer;
	/* a committed layer's chunks are a repair's (RepairLayer): its failure is the
	 * repaired duck's alone, the layer serves on the others (dp_dispatch.c's commit) */
	bool repair = dp_load_acquire_u32(&l->ready);
	if (status == DP_STATUS_OK) {
		dp_fetch_add_u64(&l->acked[f->w_index][f->w_tensor], (int64_t)f->desc.nbytes);
		dp_count(v->counters, DP_C_weight_chunks, 1);
		dp_count(v->counters, DP_C_weight_bytes, f->desc.nbytes);
		if (repair)
			dp_count(v->counters, DP_C_repair_bytes, f->desc.nbytes);
		else if (l->is_move)
			dp_count(v->counters, DP_C_move_bytes, f->desc.nbytes);
	} else {
		/* the duck first, then failed (release): who sees failed sees the duck */
		__atomic_fetch_or(&l->failed_ducks[f->w_duck >> 6], 1ull << (f->w_duck & 63),
				  __ATOMIC_RELAXED);
		if (!repair)
			dp_store_release_u32(&l->failed, 1);
		snprintf(f->message, sizeof(f->message),
			 "duck %u did not acknowledge layer %u tensor %u within %u ms", f->w_duck,
			 l->id, f->w_tensor, v->w->cfg.weight_timeout_ms);
	}
	/* release: the dispatcher's commit reads acked[] after seeing outstanding drop. The
	 * last chunk out wakes a parked dispatcher: its commit may be waiting (the RMW, then
	 * the kick's fence, pairs with dp_dispatch_park's look at outstanding) */
	if (dp_fetch_add_u64(&l->outstanding, -1) == 1)
		dp_waker_kick(v->w->dispatch_waker);
	return status;
}

uint32_t dp_weight_timeout(const struct dp_weight_view *v, struct dp_fwd *f)
{
	return part_over(v, f, DP_STATUS_DATAPLANE_ERROR);
}

uint32_t dp_weight_on_ack(const struct dp_weight_view *v, struct dp_fwd *f,
			  const struct dp_wire_header *h)
{
	if (f->kind != DP_FWD_WEIGHT || h->duck != f->w_duck)
		return DP_STATUS_PENDING;
	if (h->tensor == DP_WIRE_LAYER_TENSOR) {
		f->layer->announced[f->w_index] = 2;
		return DP_STATUS_PENDING;
	}
	if (h->tensor != f->w_tensor || dp_reasm_mark(&f->w_acks, h->chunk) < 0)
		return DP_STATUS_PENDING;
	if (!dp_reasm_complete(&f->w_acks))
		return DP_STATUS_PENDING;
	return part_over(v, f, DP_STATUS_OK);
}
