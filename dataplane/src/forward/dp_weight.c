/* dp_weight.c: reliable weight transfer to one duck.
 *
 * A weight chunk (part of one tensor of one layer, for one duck) goes by reliable
 * unicast: LAYER first, announcing the layer's shape (one context per layer and duck
 * announces it; the others wait for its ack), then WEIGHT datagrams, each sent again
 * weight_rto after it went out until the duck acknowledges it. It is background
 * traffic that never delays a forward: the worker's timers (dp_worker.c) give it a
 * budget per loop and a window of datagrams in flight, and end it at its deadline.
 */
#include "dp_weight.h"

#include <stdio.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_release.h"
#include "dp_tx.h"
#include "dp_wire.h"
#include "dp_worker.h"

static uint64_t *weight_sent(struct dp_worker *wk, const struct dp_fwd *f)
{
	return &wk->sent_ns[(size_t)f->index * wk->max_chunks];
}

void dp_weight_accept(struct dp_worker *wk, struct dp_fwd *f)
{
	uint32_t chunks = dp_wire_chunk_count(f->desc.nbytes, wk->payload);
	dp_reasm_reset(&f->w_acks, chunks);
	f->w_announcer = false;
	f->w_layer_sent_ns = 0;
	f->w_sent = 0;
	memset(weight_sent(wk, f), 0, chunks * sizeof(uint64_t));
	struct dp_wire_header *hdrs = dp_worker_fwd_headers(wk, f);
	struct dp_layer *l = f->layer;
	for (uint32_t c = 0; c < chunks; c++) {
		struct dp_wire_header *h = &hdrs[c];
		dp_wire_init(h, DP_WIRE_OP_WEIGHT, wk->w->session, f->desc.epoch);
		h->dtype = l->dtype;
		h->forward_id = f->wire_id;
		h->layer = l->id;
		h->duck = f->w_duck;
		h->tensor = f->w_tensor;
		h->chunk = c;
		h->chunks = chunks;
		h->offset = f->desc.offset + (uint64_t)c * wk->payload;
		h->total = dp_tensor_bytes(l, f->w_index, f->w_tensor);
		h->length = dp_wire_chunk_len(f->desc.nbytes, wk->payload, c);
	}
	f->part[wk->nic].owner.mem = &f->client->mem; /* sent in place from its slot */
	wk->owned[f->index] = f->wire_id;
	wk->active[wk->nactive++] = f;
}

static void send_layer(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	void *payload;
	struct dp_wire_header *h = dp_tx_ctl_header(wk, DP_WIRE_OP_LAYER, f->desc.epoch, &payload);
	struct dp_wire_layer *m = payload;
	memset(m, 0, sizeof(*m));
	m->kind = l->kind;
	m->dtype = l->dtype;
	m->hidden = l->hidden;
	m->ffn = l->shard[f->w_index];
	h->forward_id = f->wire_id;
	h->layer = l->id;
	h->duck = f->w_duck;
	h->dtype = l->dtype;
	h->tensor = DP_WIRE_LAYER_TENSOR;
	h->length = sizeof(*m);
	dp_tx_one(wk, dp_worker_duck_addr(wk, f->w_duck), h, m, sizeof(*m));
	dp_count(&wk->counters, DP_C_weight_datagrams, 1);
}

/* Send what is due: retransmissions within `budget`, new datagrams within `*room` too. */
uint32_t dp_weight_pump(struct dp_worker *wk, struct dp_fwd *f, uint64_t now, uint32_t budget,
			uint32_t *room)
{
	struct dp_layer *l = f->layer;
	uint8_t *ann = &l->announced[f->w_index];
	uint64_t rto = (uint64_t)wk->w->cfg.weight_rto_us * 1000;
	uint64_t *sent = weight_sent(wk, f);
	if (*ann != 2) {
		/* one context announces the layer to the duck; the others wait for its ack */
		if (*ann == 0) {
			*ann = 1;
			f->w_announcer = true;
		}
		if (f->w_announcer && f->w_layer_sent_ns + rto <= now) {
			send_layer(wk, f);
			f->w_layer_sent_ns = now;
			return 1;
		}
		return 0;
	}
	struct dp_reasm *acks = &f->w_acks;
	uint32_t n = 0;
	for (uint32_t c = 0; c < acks->chunks && n < budget; c++) {
		if (acks->bits[c >> 6] & (1ull << (c & 63)))
			continue;
		if (sent[c] && sent[c] + rto > now)
			continue;
		if (sent[c]) {
			dp_count(&wk->counters, DP_C_weight_retransmits, 1);
		} else {
			if (*room == 0)
				break; /* the window is full of datagrams in flight */
			(*room)--;
			f->w_sent++;
		}
		const struct dp_wire_header *h = &dp_worker_fwd_headers(wk, f)[c];
		dp_tx_owned(wk, dp_worker_duck_addr(wk, f->w_duck), h,
			    f->client->act +
				    (uint64_t)f->desc.slot * f->client->layout.act_slot_size +
				    (h->offset - f->desc.offset),
			    h->length, &f->part[wk->nic].owner);
		sent[c] = now;
		n++;
	}
	dp_count(&wk->counters, DP_C_weight_datagrams, n);
	return n;
}

void dp_weight_finish(struct dp_worker *wk, struct dp_fwd *f, uint32_t status)
{
	struct dp_layer *l = f->layer;
	if (status == DP_STATUS_OK) {
		dp_fetch_add_u64(&l->acked[f->w_index][f->w_tensor], (int64_t)f->desc.nbytes);
		dp_count(&wk->counters, DP_C_weight_chunks, 1);
		dp_count(&wk->counters, DP_C_weight_bytes, f->desc.nbytes);
	} else {
		/* the duck first, then failed (release): who sees failed sees the duck */
		__atomic_fetch_or(&l->failed_ducks[f->w_duck >> 6], 1ull << (f->w_duck & 63),
				  __ATOMIC_RELAXED);
		dp_store_release_u32(&l->failed, 1);
		snprintf(f->message, sizeof(f->message),
			 "duck %u did not acknowledge layer %u tensor %u within %u ms", f->w_duck,
			 l->id, f->w_tensor, wk->w->cfg.weight_timeout_ms);
	}
	/* release: the dispatcher's commit reads acked[] after seeing outstanding drop. The
	 * last chunk out wakes a parked dispatcher: its commit may be waiting (the RMW, then
	 * the kick's fence, pairs with dp_dispatch_park's look at outstanding) */
	if (dp_fetch_add_u64(&l->outstanding, -1) == 1)
		dp_waker_kick(wk->w->dispatch_waker);
	dp_worker_active_remove(wk, f);
	dp_release_part(wk, f, status, dp_now_ns()); /* once the port let go of the slot */
}

void dp_weight_on_ack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h)
{
	if (f->kind != DP_FWD_WEIGHT || h->duck != f->w_duck)
		return;
	if (h->tensor == DP_WIRE_LAYER_TENSOR) {
		f->layer->announced[f->w_index] = 2;
		return;
	}
	if (h->tensor != f->w_tensor || dp_reasm_mark(&f->w_acks, h->chunk) < 0)
		return;
	if (dp_reasm_complete(&f->w_acks))
		dp_weight_finish(wk, f, DP_STATUS_OK);
}
