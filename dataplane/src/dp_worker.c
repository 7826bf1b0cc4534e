/* dp_worker.c: the NIC worker agent.
 *
 * For every forward handed over by the dispatcher it sends the activation to
 * the ducks of its NIC (broadcast, or unicast fan-out one duck after another),
 * then takes their partials chunk by chunk, adding each new chunk straight into
 * a float32 sum (a bitmap per duck refuses duplicates), NACKs a duck whose
 * partial has made no progress for that duck's RTO (RFC 6298's estimator over
 * its measured reply times, so that a slow duck is not taken for a lossy one),
 * resends the activation chunks a duck asks for, and
 * gives up at the forward's deadline naming the ducks that did not answer. The
 * worker that completes the last NIC's part writes the result slot and
 * publishes the completion (the context's status, slot header and hand-over to
 * the control agent: dp_fwd.c). Weight chunks go to one duck by reliable unicast
 * (LAYER first, then WEIGHT datagrams, each acknowledged), as background
 * traffic that never delays a forward.
 */
#include "dp_worker.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_partial.h"
#include "dp_reduce.h"
#include "dp_wire.h"

#define RX_BURST 64
#define GSO_MAX_BYTES 65000u
/* Weight datagrams sent per loop while forwards are in flight (background class). */
#define WEIGHT_BUDGET_BUSY 4
#define WEIGHT_BUDGET_IDLE 64
/* Weight datagrams sent and not yet acknowledged, per worker: a window, so that a
 * slow duck sees a steady stream instead of a retransmission storm. */
#define WEIGHT_WINDOW 128

/* --- transmit scratch ------------------------------------------------------------- */

static void tx_flush(struct dp_worker *wk)
{
	if (wk->ntx)
		wk->be.ops->tx_burst(&wk->be, wk->tx, wk->ntx);
	wk->ntx = wk->niov = wk->nctl = 0;
}

/* Room for `datagrams` more single-datagram messages; flushes first if needed. */
static void tx_reserve(struct dp_worker *wk, uint32_t datagrams)
{
	if (wk->ntx + datagrams > DP_WORKER_TX || wk->niov + 2 * datagrams > DP_WORKER_IOV ||
	    wk->nctl + datagrams > DP_WORKER_TX)
		tx_flush(wk);
}

/* A header (and DP_WORKER_CTL_PAYLOAD bytes behind *payload) that live until the flush. */
static struct dp_wire_header *ctl_header(struct dp_worker *wk, uint8_t op, uint64_t epoch,
					 void **payload)
{
	tx_reserve(wk, 1);
	uint32_t i = wk->nctl++;
	struct dp_wire_header *h = &wk->ctl[i];
	dp_wire_init(h, op, wk->w->session, epoch);
	if (payload)
		*payload = wk->ctl_payload[i];
	return h;
}

/* One datagram: header + len payload bytes (ctl headers reserved their room already). */
static void tx_one(struct dp_worker *wk, const struct sockaddr_in *dst,
		   const struct dp_wire_header *h, const void *payload, uint32_t len)
{
	if (wk->ntx + 1 > DP_WORKER_TX || wk->niov + 2 > DP_WORKER_IOV)
		tx_flush(wk);
	struct iovec *iov = &wk->iov[wk->niov];
	iov[0].iov_base = (void *)h;
	iov[0].iov_len = DP_WIRE_HDR_LEN;
	iov[1].iov_base = (void *)payload;
	iov[1].iov_len = len;
	wk->tx[wk->ntx++] = (struct dp_tx){ .dst = dst, .iov = iov, .iovcnt = len ? 2 : 1,
					   .gso_size = 0, .datagrams = 1 };
	wk->niov += 2;
}

static const struct sockaddr_in *duck_addr(struct dp_worker *wk, uint32_t duck)
{
	return &wk->w->cfg.ducks[wk->w->duck_index[duck]].addr;
}

static struct dp_wire_header *fwd_headers(struct dp_worker *wk, const struct dp_fwd *f)
{
	return &wk->hdrs[(size_t)f->index * wk->max_chunks];
}

/* Chunks [first, first + n) of f's activation to dst, cut by the kernel where it can. */
static void send_activation(struct dp_worker *wk, struct dp_fwd *f, const struct sockaddr_in *dst,
			    uint32_t first, uint32_t n)
{
	struct dp_wire_header *hdrs = fwd_headers(wk, f);
	uint32_t per = wk->payload + DP_WIRE_HDR_LEN;
	uint32_t group = 1;
	if (wk->be.gso) {
		group = GSO_MAX_BYTES / per;
		if (group > wk->be.max_gso_segments)
			group = wk->be.max_gso_segments;
	}
	for (uint32_t c = first; c < first + n; c += group) {
		uint32_t k = first + n - c < group ? first + n - c : group;
		if (wk->ntx + 1 > DP_WORKER_TX || wk->niov + 2 * k > DP_WORKER_IOV)
			tx_flush(wk);
		struct iovec *iov = &wk->iov[wk->niov];
		for (uint32_t j = 0; j < k; j++) {
			const struct dp_wire_header *h = &hdrs[c + j];
			iov[2 * j].iov_base = (void *)h;
			iov[2 * j].iov_len = DP_WIRE_HDR_LEN;
			iov[2 * j + 1].iov_base = (void *)(f->act + h->offset);
			iov[2 * j + 1].iov_len = h->length;
		}
		wk->tx[wk->ntx++] = (struct dp_tx){ .dst = dst, .iov = iov, .iovcnt = 2 * k,
						   .gso_size = k > 1 ? per : 0, .datagrams = k };
		wk->niov += 2 * k;
	}
}

/* --- NACK timeouts ---------------------------------------------------------------- */

static uint64_t clamp_rto(const struct dp_worker *wk, uint64_t rto)
{
	uint64_t lo = (uint64_t)wk->w->cfg.nack_min_us * 1000;
	uint64_t hi = (uint64_t)wk->w->cfg.nack_max_us * 1000;
	return rto < lo ? lo : rto > hi ? hi : rto;
}

/* RFC 6298 (2.2, 2.3) with K = 4 and G = nack_min_us (RTTVAR's fall slowed, below): one reply time R of a duck that
 * was never NACKed nor sent an activation again for this forward (Karn's rule). */
static void rto_sample(struct dp_worker *wk, uint32_t duck, uint64_t r)
{
	struct dp_rto *e = &wk->rto[duck];
	if (!e->sampled) {
		e->srtt = r;
		e->rttvar = r / 2;
		e->sampled = true;
	} else {
		uint64_t delta = e->srtt > r ? e->srtt - r : r - e->srtt;
		/* RTTVAR rises as RFC 6298 says but falls 8x slower (Linux keeps the recent
		 * maximum deviation too): on a shared core one calm stretch must not shrink the
		 * RTO to srtt + G and make the next scheduling hiccup look like a loss */
		if (delta >= e->rttvar)
			e->rttvar = (3 * e->rttvar + delta) / 4;
		else
			e->rttvar -= (e->rttvar - delta) / 32;
		e->srtt = (7 * e->srtt + r) / 8;
	}
	uint64_t g = (uint64_t)wk->w->cfg.nack_min_us * 1000;
	e->rto = clamp_rto(wk, e->srtt + (4 * e->rttvar > g ? 4 * e->rttvar : g));
	dp_count(&wk->counters, DP_C_rto_samples, 1);
}

/* A NACK timeout fired (5.5): back off, until a fresh sample says otherwise. */
static void rto_backoff(struct dp_worker *wk, uint32_t duck)
{
	struct dp_rto *e = &wk->rto[duck];
	uint64_t hi = (uint64_t)wk->w->cfg.nack_max_us * 1000;
	if (e->rto < hi) {
		e->rto = 2 * e->rto < hi ? 2 * e->rto : hi;
		dp_count(&wk->counters, DP_C_rto_backoffs, 1);
	}
}

/* --- forwards ---------------------------------------------------------------------- */

static bool duck_on_nic(struct dp_worker *wk, uint32_t duck)
{
	int16_t i = wk->w->duck_index[duck];
	return i >= 0 && wk->w->cfg.ducks[i].nic == wk->nic;
}

static struct dp_duck_rx *duck_rx(struct dp_worker *wk, struct dp_fwd *f, uint32_t duck)
{
	return &f->rx[wk->w->duck_index[duck]];
}

static void active_remove(struct dp_worker *wk, struct dp_fwd *f)
{
	for (uint32_t i = 0; i < wk->nactive; i++)
		if (wk->active[i] == f) {
			wk->active[i] = wk->active[--wk->nactive];
			break;
		}
	wk->owned[f->index] = 0;
}

/* The last NIC out: sum the NICs' partial sums into the result slot and publish. */
static void finalize(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	uint32_t status = dp_fwd_final_status(wk->w, f, &wk->counters);
	if (f->kind == DP_FWD_FORWARD && status == DP_STATUS_OK) {
		uint64_t t0 = dp_now_ns();
		uint64_t n = f->bytes / dp_dtype_size(l->dtype);
		/* the first NIC: it summed in place when it could (accept_forward) */
		int primary = __builtin_ctz(f->nic_mask);
		float *acc = f->acc[primary];
		for (uint32_t k = (uint32_t)primary + 1; k < DP_MAX_NICS; k++)
			if (f->nic_mask & (1u << k))
				dp_accumulate_f32(acc, f->acc[k], n);
		dp_reduce_store(f->res, acc, l->has_b_down ? l->b_down : NULL, f->rows, l->hidden,
				l->dtype);
		f->reduce_ns = dp_now_ns() - t0;
		dp_count(&wk->counters, DP_C_forwards_ok, 1);
	} else if (status == DP_STATUS_TIMEOUT) {
		dp_count(&wk->counters, DP_C_timeouts, 1);
	} else if (status == DP_STATUS_DUCK_LOST) {
		dp_count(&wk->counters, DP_C_duck_lost, 1);
	}
	dp_fwd_finish(wk->w, f, status, &wk->done, &wk->counters);
}

static void finish_part(struct dp_worker *wk, struct dp_fwd *f, uint32_t status, uint64_t now)
{
	struct dp_nic_part *p = &f->part[wk->nic];
	uint64_t end = p->last_ns ? p->last_ns : now;
	p->wait_ns = end > p->wait_start ? end - p->wait_start : 0;
	active_remove(wk, f);
	/* the last one out sees every other NIC's sums and statuses */
	if (dp_fwd_part_done(f, wk->nic, status))
		finalize(wk, f);
}

static void check_forward_done(struct dp_worker *wk, struct dp_fwd *f, uint64_t now)
{
	bool lost = false;
	for (uint32_t i = 0; i < wk->nducks; i++) {
		uint32_t d = wk->ducks[i];
		if (!dp_targets_has(f->targets, d))
			continue;
		uint8_t st = duck_rx(wk, f, d)->state;
		if (st == 0)
			return;
		lost |= st == 2;
	}
	finish_part(wk, f, lost ? DP_STATUS_DUCK_LOST : DP_STATUS_OK, now);
}

static void accept_forward(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	uint32_t chunks = dp_wire_chunk_count(f->bytes, wk->payload);
	struct dp_wire_header *hdrs = fwd_headers(wk, f);
	struct dp_nic_part *p = &f->part[wk->nic];
	for (uint32_t c = 0; c < chunks; c++) {
		struct dp_wire_header *h = &hdrs[c];
		dp_wire_init(h, DP_WIRE_OP_FORWARD, wk->w->session, f->desc.epoch);
		h->dtype = l->dtype;
		h->forward_id = f->wire_id;
		h->layer = l->id;
		h->duck = DP_WIRE_ANY_DUCK;
		h->chunk = c;
		h->chunks = chunks;
		h->offset = (uint64_t)c * wk->payload;
		h->total = f->bytes;
		h->length = dp_wire_chunk_len(f->bytes, wk->payload, c);
		h->rows = f->rows;
	}
	/* Sum in place in the result slot when we can (float32, first NIC); else scratch. */
	int first = __builtin_ctz(f->nic_mask);
	if (l->dtype == DP_DTYPE_F32 && (int)wk->nic == first)
		f->acc[wk->nic] = (float *)f->res;
	else
		f->acc[wk->nic] = wk->scratch + (size_t)f->index * wk->scratch_floats;
	memset(f->acc[wk->nic], 0, f->bytes / dp_dtype_size(l->dtype) * sizeof(float));
	for (uint32_t i = 0; i < wk->nducks; i++)
		if (dp_targets_has(f->targets, wk->ducks[i])) {
			struct dp_duck_rx *rx = duck_rx(wk, f, wk->ducks[i]);
			rx->reasm.chunks = 0; /* the first chunk says how many */
			rx->reasm.have = 0;
			rx->state = 0;
			rx->compute_ns = rx->done_ns = rx->resent_ns = rx->progress_ns = 0;
			rx->nacks = 0;
		}
	wk->owned[f->index] = f->wire_id;
	wk->active[wk->nactive++] = f;
	p->first_ns = p->last_ns = p->fetch_ns = 0;
	uint64_t start = dp_now_ns();
	const struct dp_nic_cfg *nic = &wk->w->cfg.nics[wk->nic];
	if (nic->use_broadcast) {
		send_activation(wk, f, &nic->broadcast, 0, chunks);
	} else {
		for (uint32_t i = 0; i < wk->nducks; i++)
			if (dp_targets_has(f->targets, wk->ducks[i]))
				send_activation(wk, f, duck_addr(wk, wk->ducks[i]), 0, chunks);
	}
	tx_flush(wk);
	p->wait_start = dp_now_ns();
	p->send_ns = p->wait_start - start;
	uint64_t rto = UINT64_MAX;
	for (uint32_t i = 0; i < wk->nducks; i++)
		if (dp_targets_has(f->targets, wk->ducks[i]) && wk->rto[wk->ducks[i]].rto < rto)
			rto = wk->rto[wk->ducks[i]].rto;
	wk->next_nack[f->index] = p->wait_start + rto;
}

/* NACK the ducks of f whose partial made no progress for their RTO; returns when the
 * next one is due (UINT64_MAX: none is waited for). */
static uint64_t nack_forward(struct dp_worker *wk, struct dp_fwd *f, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	uint64_t sent_end = f->part[wk->nic].wait_start;
	for (uint32_t i = 0; i < wk->nducks; i++) {
		uint32_t d = wk->ducks[i];
		if (!dp_targets_has(f->targets, d) || duck_rx(wk, f, d)->state != 0)
			continue;
		struct dp_duck_rx *rx = duck_rx(wk, f, d);
		uint64_t due = (rx->progress_ns ? rx->progress_ns : sent_end) + wk->rto[d].rto;
		if (due > now) {
			next = due < next ? due : next;
			continue;
		}
		rto_backoff(wk, d);
		rx->nacks++;
		rx->progress_ns = now; /* the next NACK one (backed-off) RTO from now */
		next = now + wk->rto[d].rto < next ? now + wk->rto[d].rto : next;
		void *list;
		struct dp_wire_header *h = ctl_header(wk, DP_WIRE_OP_NACK, f->desc.epoch, &list);
		/* nothing yet: an empty list asks for everything */
		uint32_t n = rx->reasm.chunks ? dp_reasm_missing(&rx->reasm, list,
								 DP_WORKER_CTL_PAYLOAD / 4)
					      : 0;
		h->forward_id = f->wire_id;
		h->layer = f->layer->id;
		h->duck = (uint16_t)d;
		h->length = n * (uint32_t)sizeof(uint32_t);
		tx_one(wk, duck_addr(wk, d), h, list, h->length);
		dp_count(&wk->counters, DP_C_nacks_sent, 1);
	}
	return next;
}

/* --- weights ----------------------------------------------------------------------- */

static uint64_t *weight_sent(struct dp_worker *wk, const struct dp_fwd *f)
{
	return &wk->sent_ns[(size_t)f->index * wk->max_chunks];
}

static void accept_weight(struct dp_worker *wk, struct dp_fwd *f)
{
	uint32_t chunks = dp_wire_chunk_count(f->desc.nbytes, wk->payload);
	dp_reasm_reset(&f->w_acks, chunks);
	f->w_announcer = false;
	f->w_layer_sent_ns = 0;
	f->w_sent = 0;
	memset(weight_sent(wk, f), 0, chunks * sizeof(uint64_t));
	struct dp_wire_header *hdrs = fwd_headers(wk, f);
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
	wk->owned[f->index] = f->wire_id;
	wk->active[wk->nactive++] = f;
}

static void send_layer(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	void *payload;
	struct dp_wire_header *h = ctl_header(wk, DP_WIRE_OP_LAYER, f->desc.epoch, &payload);
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
	tx_one(wk, duck_addr(wk, f->w_duck), h, m, sizeof(*m));
	dp_count(&wk->counters, DP_C_weight_datagrams, 1);
}

/* Send what is due: retransmissions within `budget`, new datagrams within `*room` too. */
static uint32_t pump_weight(struct dp_worker *wk, struct dp_fwd *f, uint64_t now, uint32_t budget,
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
		const struct dp_wire_header *h = &fwd_headers(wk, f)[c];
		tx_one(wk, duck_addr(wk, f->w_duck), h,
		       f->client->act + (uint64_t)f->desc.slot * f->client->layout.act_slot_size +
			       (h->offset - f->desc.offset),
		       h->length);
		sent[c] = now;
		n++;
	}
	dp_count(&wk->counters, DP_C_weight_datagrams, n);
	return n;
}

static void finish_weight(struct dp_worker *wk, struct dp_fwd *f, uint32_t status)
{
	struct dp_layer *l = f->layer;
	if (status == DP_STATUS_OK) {
		dp_fetch_add_u64(&l->acked[f->w_index][f->w_tensor], (int64_t)f->desc.nbytes);
		dp_count(&wk->counters, DP_C_weight_chunks, 1);
		dp_count(&wk->counters, DP_C_weight_bytes, f->desc.nbytes);
	} else {
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
	active_remove(wk, f);
	if (dp_fwd_part_done(f, wk->nic, status))
		finalize(wk, f);
}

/* --- receive ----------------------------------------------------------------------- */

static int sender_duck(struct dp_worker *wk, const struct dp_rx *rx, uint16_t claimed)
{
	if (claimed >= DP_MAX_DUCKS || !duck_on_nic(wk, claimed))
		return -1;
	const struct sockaddr_in *a = duck_addr(wk, claimed);
	if (a->sin_addr.s_addr != rx->src.sin_addr.s_addr || a->sin_port != rx->src.sin_port)
		return -1;
	return claimed;
}

static struct dp_fwd *owned_fwd(struct dp_worker *wk, uint64_t wire_id)
{
	uint32_t index = (uint32_t)(wire_id & 0xFFFF);
	if (index >= wk->w->nfwds || wk->owned[index] != wire_id)
		return NULL;
	return &wk->w->fwds[index];
}

static void on_partial(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
		       uint32_t duck, uint64_t now)
{
	struct dp_layer *l = f->layer;
	struct dp_duck_rx *rx = duck_rx(wk, f, duck);
	uint32_t item = dp_dtype_size(l->dtype);
	if (rx->state != 0) {
		dp_count(&wk->counters, DP_C_rx_duplicates, 1);
		return;
	}
	enum dp_partial_verdict v = dp_partial_admit(h, f->bytes, l->dtype, &rx->reasm,
						     &rx->chunk_bytes);
	if (v != DP_PARTIAL_ADD) {
		DP_DEBUG("duck %u: partial chunk %u/%u at %lu+%u of %lu refused (%s, expected %u/%u)",
			 duck, h->chunk, h->chunks, (unsigned long)h->offset, h->length,
			 (unsigned long)h->total, v == DP_PARTIAL_DUPLICATE ? "duplicate" : "malformed",
			 rx->reasm.chunks, rx->chunk_bytes);
		dp_count(&wk->counters,
			 v == DP_PARTIAL_DUPLICATE ? DP_C_rx_duplicates : DP_C_rx_malformed, 1);
		return;
	}
	dp_accumulate(f->acc[wk->nic], h->offset / item, dp_wire_payload(h), h->length / item,
		      l->dtype);
	/* NACK only once this duck's stream stalls for its RTO: next_nack stays a lower bound */
	rx->progress_ns = now;
	if (h->compute_ns > rx->compute_ns)
		rx->compute_ns = h->compute_ns;
	if (dp_reasm_complete(&rx->reasm)) {
		struct dp_nic_part *p = &f->part[wk->nic];
		rx->state = 1;
		rx->done_ns = now;
		/* Karn: a reply to a NACK or to a resent activation says nothing of the RTT */
		if (!rx->nacks && !rx->resent_ns && now > p->wait_start) {
			rto_sample(wk, duck, now - p->wait_start);
			if (now - p->wait_start > (uint64_t)wk->w->cfg.nack_us * 1000)
				dp_count(&wk->counters, DP_C_nacks_avoided, 1);
		}
		if (!p->first_ns)
			p->first_ns = now;
		p->last_ns = now;
		check_forward_done(wk, f, now);
	}
}

static void on_nack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
		    uint32_t duck, uint64_t now)
{
	dp_count(&wk->counters, DP_C_nacks_received, 1);
	if (h->flags & DP_WIRE_FLAG_NO_LAYER) {
		dp_count(&wk->counters, DP_C_no_layer_replies, 1);
		if (f->kind == DP_FWD_FORWARD) {
			struct dp_duck_rx *rx = duck_rx(wk, f, duck);
			if (rx->state == 0) {
				rx->state = 2;
				snprintf(f->message, sizeof(f->message),
					 "duck %u holds no layer %u (restarted?); load it again", duck,
					 f->layer->id);
				check_forward_done(wk, f, now);
			}
		} else {
			f->layer->announced[f->w_index] = 0; /* announce again, then resend */
			f->w_announcer = false;
			f->w_layer_sent_ns = 0;
		}
		return;
	}
	if (f->kind != DP_FWD_FORWARD || !(h->flags & DP_WIRE_FLAG_INPUT))
		return;
	/* the duck is missing activation chunks: resend what it lists (or everything), at most
	 * once per NACK interval per duck, and each chunk of one NACK once: a NACK is a
	 * datagram anyone on the path could repeat, and 8 KB of one chunk index must not
	 * become 2,000 sends */
	uint32_t chunks = dp_wire_chunk_count(f->bytes, wk->payload);
	const uint32_t *list = dp_wire_payload(h);
	uint32_t n = h->length / sizeof(uint32_t);
	struct dp_duck_rx *rx = duck_rx(wk, f, duck);
	uint64_t interval = (uint64_t)wk->w->cfg.nack_us * 1000;
	rx->progress_ns = now; /* it is alive and waits for input: one RTO from now */
	if (rx->resent_ns && now < rx->resent_ns + interval) {
		dp_count(&wk->counters, DP_C_nack_resends_suppressed, n ? n : chunks);
		return;
	}
	rx->resent_ns = now;
	if (n == 0) {
		send_activation(wk, f, duck_addr(wk, duck), 0, chunks);
		dp_count(&wk->counters, DP_C_retransmits, chunks);
		return;
	}
	dp_reasm_reset(&wk->nack_seen, chunks);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c;
		memcpy(&c, &list[i], sizeof(c));
		int fresh = dp_reasm_mark(&wk->nack_seen, c); /* -1: no such chunk */
		if (fresh > 0) {
			send_activation(wk, f, duck_addr(wk, duck), c, 1);
			dp_count(&wk->counters, DP_C_retransmits, 1);
		} else if (fresh == 0) {
			dp_count(&wk->counters, DP_C_nack_resends_suppressed, 1);
		}
	}
}

static void on_weight_ack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h)
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
		finish_weight(wk, f, DP_STATUS_OK);
}

/* Returns how many datagrams reached a forward or weight chunk of ours: the work. What
 * was dropped (malformed, unknown sender, bad session, late, PONG) is none, so a parked
 * runner that junk woke parks again at once (dp_idle.h). *full: the burst was full. */
static int receive(struct dp_worker *wk, uint64_t now, bool *full)
{
	struct dp_rx rx[RX_BURST];
	uint64_t touched[RX_BURST]; /* wire ids of the forwards partials went to */
	uint32_t ntouched = 0;
	int useful = 0;
	uint32_t n = wk->be.ops->rx_burst(&wk->be, rx, RX_BURST);
	*full = n == RX_BURST;
	if (!n)
		return 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct dp_wire_header *h = (const void *)rx[i].buf;
		dp_count(&wk->counters, DP_C_rx_packets, 1);
		dp_count(&wk->counters, DP_C_rx_bytes, rx[i].len);
		enum dp_wire_verdict verdict = dp_wire_check(rx[i].buf, rx[i].len);
		if (verdict != DP_WIRE_OK) {
			DP_DEBUG("datagram of %u bytes refused: %s", rx[i].len,
				 dp_wire_verdict_name(verdict));
			dp_count(&wk->counters, DP_C_rx_malformed, 1);
			continue;
		}
		int duck = sender_duck(wk, &rx[i], h->duck);
		if (duck < 0) {
			dp_count(&wk->counters, DP_C_rx_unknown_sender, 1);
			continue;
		}
		if (h->session != wk->w->session) {
			dp_count(&wk->counters, DP_C_rx_bad_session, 1);
			continue;
		}
		dp_store_relaxed_u64(&wk->w->duck_seen_ns[duck], now);
		if (h->op == DP_WIRE_OP_PONG) {
			dp_count(&wk->counters, DP_C_pongs, 1);
			continue;
		}
		struct dp_fwd *f = owned_fwd(wk, h->forward_id);
		if (!f) {
			dp_count(&wk->counters, DP_C_rx_late, 1);
			continue;
		}
		if (h->epoch != f->desc.epoch) {
			dp_count(&wk->counters, DP_C_rx_stale_epoch, 1);
			continue;
		}
		useful++;
		switch (h->op) {
		case DP_WIRE_OP_PARTIAL:
			if (f->kind != DP_FWD_FORWARD || !dp_targets_has(f->targets, (uint32_t)duck)) {
				dp_count(&wk->counters, DP_C_rx_late, 1);
				break;
			}
			touched[ntouched++] = f->wire_id;
			on_partial(wk, f, h, (uint32_t)duck, now);
			break;
		case DP_WIRE_OP_NACK:
			on_nack(wk, f, h, (uint32_t)duck, now);
			break;
		case DP_WIRE_OP_WEIGHT_ACK:
			on_weight_ack(wk, f, h);
			break;
		default:
			dp_count(&wk->counters, DP_C_rx_malformed, 1);
		}
	}
	/* fetch time: this burst's handling, shared among the partials in it */
	if (ntouched) {
		uint64_t share = (dp_now_ns() - now) / ntouched;
		for (uint32_t i = 0; i < ntouched; i++) {
			/* not a forward this burst finished: that one is the control agent's now */
			uint64_t id = touched[i];
			if (wk->owned[id & 0xFFFF] == id)
				wk->w->fwds[id & 0xFFFF].part[wk->nic].fetch_ns += share;
		}
	}
	tx_flush(wk);
	return useful;
}

/* --- timers ------------------------------------------------------------------------- */

/* backlog: the last receive filled its burst, so replies may be waiting unread (this
 * thread was descheduled, say): NACK nobody until they are read. */
static int timers(struct dp_worker *wk, uint64_t now, bool backlog)
{
	int work = 0;
	uint32_t forwards = 0, unacked = 0;
	for (uint32_t i = 0; i < wk->nactive; i++) {
		const struct dp_fwd *f = wk->active[i];
		if (f->kind == DP_FWD_FORWARD)
			forwards++;
		else
			unacked += f->w_sent - f->w_acks.have;
	}
	uint32_t budget = forwards ? WEIGHT_BUDGET_BUSY : WEIGHT_BUDGET_IDLE;
	uint32_t room = unacked < WEIGHT_WINDOW ? WEIGHT_WINDOW - unacked : 0;
	for (uint32_t i = 0; i < wk->nactive;) {
		struct dp_fwd *f = wk->active[i];
		uint32_t before = wk->nactive;
		if (f->kind == DP_FWD_FORWARD) {
			if (now >= f->deadline_ns) {
				finish_part(wk, f, DP_STATUS_TIMEOUT, now);
				work++;
			} else if (!backlog && now >= wk->next_nack[f->index]) {
				wk->next_nack[f->index] = nack_forward(wk, f, now);
				work++;
			}
		} else if (now >= f->deadline_ns) {
			finish_weight(wk, f, DP_STATUS_DATAPLANE_ERROR);
			work++;
		} else if (budget) {
			uint32_t sent = pump_weight(wk, f, now, budget, &room);
			budget -= sent < budget ? sent : budget;
			work += (int)sent;
		}
		if (wk->nactive == before)
			i++; /* else the last entry moved into i */
	}
	if (now >= wk->next_ping_ns) {
		for (uint32_t i = 0; i < wk->nducks; i++) {
			struct dp_wire_header *h =
				ctl_header(wk, DP_WIRE_OP_PING, dp_load_acquire_u64(&wk->w->epoch), NULL);
			h->duck = wk->ducks[i];
			tx_one(wk, duck_addr(wk, wk->ducks[i]), h, NULL, 0);
		}
		dp_count(&wk->counters, DP_C_pings, wk->nducks);
		wk->next_ping_ns = now + (uint64_t)wk->w->cfg.ping_ms * 1000000;
	}
	tx_flush(wk);
	return work;
}

/* --- the agent ----------------------------------------------------------------------- */

int dp_worker_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_worker *wk = self;
	struct dp_fwd *in[DP_BURST];
	(void)w;
	uint32_t n = dp_spsc_pop(&wk->in, (void **)in, DP_BURST);
	for (uint32_t i = 0; i < n; i++) {
		if (in[i]->kind == DP_FWD_FORWARD)
			accept_forward(wk, in[i]);
		else
			accept_weight(wk, in[i]);
	}
	int work = (int)n;
	/* fresh clocks: sends above may have taken longer than the loop's `now` knows */
	bool full;
	work += receive(wk, n ? dp_now_ns() : now, &full);
	work += timers(wk, dp_now_ns(), full);
	return work;
}

int dp_worker_wait_on(struct dp_world *w, void *self, struct dp_waker *wk)
{
	struct dp_worker *me = self;
	(void)w;
	int fd = me->be.ops->wait_fd ? me->be.ops->wait_fd(&me->be) : -1;
	return fd >= 0 ? dp_waker_add(wk, fd) : 0;
}

int64_t dp_worker_park(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_worker *wk = self;
	const struct dp_backend_ops *ops = wk->be.ops;
	if (!dp_spsc_empty(&wk->in) || (ops->rx_ready && ops->rx_ready(&wk->be)))
		return -1;
	uint64_t next = wk->next_ping_ns;
	if (!ops->wait_fd && !ops->rx_ready && now + DP_BACKEND_POLL_NS < next)
		next = now + DP_BACKEND_POLL_NS; /* nothing tells us a datagram came: poll */
	/* a weight datagram is resent weight_rto after it went out: wake an eighth of it
	 * late at most (the per-datagram times are not worth a scan; weights are background) */
	uint64_t weight_tick = (uint64_t)w->cfg.weight_rto_us * 1000 / 8;
	for (uint32_t i = 0; i < wk->nactive; i++) {
		const struct dp_fwd *f = wk->active[i];
		uint64_t due = f->deadline_ns;
		if (f->kind == DP_FWD_FORWARD) {
			if (wk->next_nack[f->index] < due)
				due = wk->next_nack[f->index];
		} else if (now + weight_tick < due) {
			due = now + weight_tick;
		}
		if (due < next)
			next = due;
	}
	return next <= now ? 0 : (int64_t)(next - now);
}

int dp_worker_init(struct dp_worker *wk, struct dp_world *w, uint32_t nic)
{
	const struct dp_nic_cfg *cfg = &w->cfg.nics[nic];
	memset(wk, 0, sizeof(*wk));
	wk->nic = nic;
	wk->w = w;
	wk->payload = dp_wire_payload_max(cfg->mtu);
	wk->max_chunks = dp_wire_chunk_count(w->cfg.max_forward_bytes, wk->payload);
	if (wk->max_chunks > DP_REASM_MAX_CHUNKS) {
		dp_set_error("nic %s: max_forward_bytes %u needs %u chunks at mtu %u (max %u)",
			     cfg->name, w->cfg.max_forward_bytes, wk->max_chunks, cfg->mtu,
			     DP_REASM_MAX_CHUNKS);
		return -1;
	}
	for (uint32_t i = 0; i < w->cfg.nducks; i++)
		if (w->cfg.ducks[i].nic == nic) {
			uint16_t id = w->cfg.ducks[i].id;
			wk->ducks[wk->nducks++] = id;
			uint32_t init = w->cfg.nack_us > w->cfg.nack_min_us ? w->cfg.nack_us
									    : w->cfg.nack_min_us;
			wk->rto[id] = (struct dp_rto){ .rto = (uint64_t)init * 1000 };
		}
	wk->be.ops = dp_backend_lookup(cfg->backend);
	wk->be.cfg = cfg;
	wk->be.config = &w->cfg;
	wk->be.nic = nic;
	wk->be.counters = &wk->counters;
	if (!wk->be.ops)
		return -1;
	size_t nf = w->nfwds;
	wk->scratch_floats = w->cfg.max_forward_bytes / 2;
	wk->owned = calloc(nf, sizeof(uint64_t));
	wk->hdrs = calloc(nf * wk->max_chunks, sizeof(struct dp_wire_header));
	wk->next_nack = calloc(nf, sizeof(uint64_t));
	wk->sent_ns = calloc(nf * wk->max_chunks, sizeof(uint64_t));
	wk->scratch = calloc(nf * wk->scratch_floats, sizeof(float)); /* touched only when used */
	wk->active = calloc(nf, sizeof(struct dp_fwd *));
	if (!wk->owned || !wk->hdrs || !wk->next_nack || !wk->sent_ns || !wk->scratch ||
	    !wk->active) {
		dp_set_error("nic %s: out of memory for %zu forward contexts", cfg->name, nf);
		return -1;
	}
	if (dp_spsc_init(&wk->in, (uint32_t)nf) < 0 || dp_spsc_init(&wk->done, (uint32_t)nf) < 0)
		return -1;
	if (wk->be.ops->open(&wk->be) < 0) {
		dp_add_error_context("nic %s (%s backend)", cfg->name, wk->be.ops->name);
		return -1;
	}
	DP_INFO("nic %s: %s backend, %u ducks, %u-byte chunks, GSO %s, %s", cfg->name,
		wk->be.ops->name, wk->nducks, wk->payload, wk->be.gso ? "on" : "off",
		cfg->use_broadcast ? "broadcast" : "unicast fan-out");
	return 0;
}

void dp_worker_fini(struct dp_worker *wk)
{
	if (wk->be.ops && wk->be.priv)
		wk->be.ops->close(&wk->be);
	dp_spsc_free(&wk->in);
	dp_spsc_free(&wk->done);
	free(wk->owned);
	free(wk->hdrs);
	free(wk->next_nack);
	free(wk->sent_ns);
	free(wk->scratch);
	free(wk->active);
}
