/* dp_gather.c: a forward on one NIC, from its activation out to its partials in.
 *
 * For every forward handed over by the dispatcher it sends the activation to
 * the ducks of its NIC (broadcast, or unicast fan-out one duck after another),
 * then takes their partials chunk by chunk, adding each new chunk straight into
 * a float32 sum (a bitmap per duck refuses duplicates), NACKs a duck whose
 * partial has made no progress for that duck's RTO (RFC 6298's estimator over
 * its measured reply times, so that a slow duck is not taken for a lossy one),
 * resends the activation chunks a duck asks for, and
 * gives up at the forward's deadline naming the ducks that did not answer. The
 * NIC's part then ends; the last NIC out sums and publishes (dp_worker_finalize).
 * The worker (dp_worker.c) hands each datagram over once it has checked who sent it
 * and for which forward, and runs the deadline and NACK timers; sends go through the
 * transmit batch (dp_tx.c).
 */
#include "dp_gather.h"

#include <stdio.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_partial.h"
#include "dp_reduce.h"
#include "dp_release.h"
#include "dp_tx.h"
#include "dp_wire.h"
#include "dp_worker.h"

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

static struct dp_duck_rx *duck_rx(struct dp_worker *wk, struct dp_fwd *f, uint32_t duck)
{
	return &f->rx[wk->w->duck_index[duck]];
}

void dp_gather_finish(struct dp_worker *wk, struct dp_fwd *f, uint32_t status, uint64_t now)
{
	struct dp_nic_part *p = &f->part[wk->nic];
	uint64_t end = p->last_ns ? p->last_ns : now;
	p->wait_ns = end > p->wait_start ? end - p->wait_start : 0;
	dp_worker_active_remove(wk, f);
	/* once the port let go of the slot; the last one out sees every other NIC's sums and
	 * statuses */
	dp_release_part(wk, f, status, now);
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
	dp_gather_finish(wk, f, lost ? DP_STATUS_DUCK_LOST : DP_STATUS_OK, now);
}

void dp_gather_accept(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	uint32_t chunks = dp_wire_chunk_count(f->bytes, wk->payload);
	struct dp_wire_header *hdrs = dp_worker_fwd_headers(wk, f);
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
	p->owner.mem = &f->client->mem; /* chunks may go out in place from its slot */
	uint64_t start = dp_now_ns();
	const struct dp_nic_cfg *nic = &wk->w->cfg.nics[wk->nic];
	if (nic->use_broadcast) {
		dp_tx_activation(wk, f, &nic->broadcast, 0, chunks);
	} else {
		for (uint32_t i = 0; i < wk->nducks; i++)
			if (dp_targets_has(f->targets, wk->ducks[i]))
				dp_tx_activation(wk, f, dp_worker_duck_addr(wk, wk->ducks[i]), 0,
						 chunks);
	}
	dp_tx_flush(wk);
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
uint64_t dp_gather_send_nacks(struct dp_worker *wk, struct dp_fwd *f, uint64_t now)
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
		struct dp_wire_header *h =
			dp_tx_ctl_header(wk, DP_WIRE_OP_NACK, f->desc.epoch, &list);
		/* nothing yet: an empty list asks for everything */
		uint32_t n = rx->reasm.chunks ? dp_reasm_missing(&rx->reasm, list,
								 DP_WORKER_CTL_PAYLOAD / 4)
					      : 0;
		h->forward_id = f->wire_id;
		h->layer = f->layer->id;
		h->duck = (uint16_t)d;
		h->length = n * (uint32_t)sizeof(uint32_t);
		dp_tx_one(wk, dp_worker_duck_addr(wk, d), h, list, h->length);
		dp_count(&wk->counters, DP_C_nacks_sent, 1);
	}
	return next;
}

/* --- receive ----------------------------------------------------------------------- */

void dp_gather_on_partial(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
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

void dp_gather_on_nack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
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
		dp_tx_activation(wk, f, dp_worker_duck_addr(wk, duck), 0, chunks);
		dp_count(&wk->counters, DP_C_retransmits, chunks);
		return;
	}
	dp_reasm_reset(&wk->nack_seen, chunks);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c;
		memcpy(&c, &list[i], sizeof(c));
		int fresh = dp_reasm_mark(&wk->nack_seen, c); /* -1: no such chunk */
		if (fresh > 0) {
			dp_tx_activation(wk, f, dp_worker_duck_addr(wk, duck), c, 1);
			dp_count(&wk->counters, DP_C_retransmits, 1);
		} else if (fresh == 0) {
			dp_count(&wk->counters, DP_C_nack_resends_suppressed, 1);
		}
	}
}
