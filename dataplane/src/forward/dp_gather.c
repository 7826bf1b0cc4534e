/* dp_gather.c: a forward on one NIC, from its activation out to its partials in.
 *
 * For every forward handed over by the dispatcher it sends the activation to
 * the ducks of its NIC (broadcast, or unicast fan-out one duck after another),
 * then takes their partials chunk by chunk, adding each new chunk straight into
 * a float32 sum (a bitmap per duck refuses duplicates; the first duck's chunk is stored,
 * not added to zeros: no memset of the sum ahead, no read of it), NACKs a duck whose
 * partial has made no progress for that duck's RTO (RFC 6298's estimator over
 * its measured reply times, so that a slow duck is not taken for a lossy one),
 * resends the activation chunks a duck asks for, and
 * gives up at the forward's deadline naming the ducks that did not answer. The
 * NIC's part is then over: the call that saw it returns the part's status, and the
 * worker ends the part (dp_worker.c); the last NIC out sums and publishes
 * (dp_fwd_complete). The worker hands each datagram over once it has checked who sent
 * it and for which forward, and runs the deadline and NACK timers; sends go through the
 * transmit batch (dp_tx.c). All this file sees of the worker is its view (dp_gather.h).
 */
#include "dp_gather.h"

#include <stdio.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_moe.h"
#include "dp_partial.h"
#include "dp_reasm.h"
#include "dp_reduce.h"
#include "dp_tx.h"
#include "dp_wire.h"

/* --- NACK timeouts ---------------------------------------------------------------- */

static uint64_t clamp_rto(const struct dp_gather_view *v, uint64_t rto)
{
	uint64_t lo = v->limits.nack_min_ns;
	uint64_t hi = v->limits.nack_max_ns;
	return rto < lo ? lo : rto > hi ? hi : rto;
}

/* RFC 6298 (2.2, 2.3) with K = 4 and G = nack_min_us (RTTVAR's fall slowed, below): one reply time R of a duck that
 * was never NACKed nor sent an activation again for this forward (Karn's rule). */
static void rto_sample(const struct dp_gather_view *v, uint32_t duck, uint64_t r)
{
	struct dp_rto *e = &v->rto[duck];
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
	uint64_t g = v->limits.nack_min_ns;
	e->rto = clamp_rto(v, e->srtt + (4 * e->rttvar > g ? 4 * e->rttvar : g));
	dp_count(v->counters, DP_C_rto_samples, 1);
}

/* A NACK timeout fired (5.5): back off, until a fresh sample says otherwise. */
static void rto_backoff(const struct dp_gather_view *v, uint32_t duck)
{
	struct dp_rto *e = &v->rto[duck];
	uint64_t hi = v->limits.nack_max_ns;
	if (e->rto < hi) {
		e->rto = 2 * e->rto < hi ? 2 * e->rto : hi;
		dp_count(v->counters, DP_C_rto_backoffs, 1);
	}
}

/* --- forwards ---------------------------------------------------------------------- */

/* A silent routed duck fails over after this many of its smoothed reply times (at least
 * failover_ms): beyond the RTO's backoff (a lost datagram is NACKed first and answered
 * within an RTO or two), far enough past a slow reply not to take it for silence. */
#define DP_FAILOVER_SRTTS 8

static struct dp_duck_rx *duck_rx(const struct dp_gather_view *v, struct dp_fwd *f,
				  uint32_t duck)
{
	return &f->rx[v->duck_index[duck]];
}

/* The reply a datagram of duck's about f belongs to: f's own message to it (tag 0), or
 * the failover message its forward_id's tag names, if that went to this duck (else
 * NULL: a tag nobody was sent, or another duck's). */
static struct dp_duck_rx *reply_rx(const struct dp_gather_view *v, struct dp_fwd *f,
				   const struct dp_wire_header *h, uint32_t duck)
{
	uint32_t tag = (uint32_t)(h->forward_id >> DP_WIRE_FORWARD_TAG_SHIFT);
	if (!tag)
		return duck_rx(v, f, duck);
	if (tag > f->part[v->nic].fo_n)
		return NULL;
	struct dp_duck_rx *rx = dp_moe_fo_rx(v, f, tag);
	return rx->moe_to == duck ? rx : NULL;
}

/* --- the sum ------------------------------------------------------------------------ */

/* A dense forward's sum is made chunk by chunk on the activation's grid (v->payload bytes
 * a chunk): the first contribution to a chunk is stored, later ones added. Zero what no
 * duck wrote yet and add from then on: a chunk off the grid (a duck that cuts its reply
 * otherwise), or a part over with chunks nobody sent. */
static void sum_zero_rest(const struct dp_gather_view *v, struct dp_fwd *f)
{
	struct dp_nic_part *p = &f->part[v->nic];
	struct dp_reasm *done = &v->summed[f->index];
	uint32_t item = dp_dtype_size(f->layer->dtype);
	for (uint32_t c = 0; c < done->chunks && done->have < done->chunks; c++)
		if (dp_reasm_mark(done, c) == 1)
			memset(f->acc[v->nic] + (uint64_t)c * v->payload / item, 0,
			       dp_wire_chunk_len(f->bytes, v->payload, c) / item * sizeof(float));
	p->sum_by_chunk = false;
}

static void sum_chunk(const struct dp_gather_view *v, struct dp_fwd *f,
		      const struct dp_wire_header *h, const uint8_t *payload, uint32_t item)
{
	float *acc = f->acc[v->nic];
	uint8_t dtype = f->layer->dtype;
	if (f->part[v->nic].sum_by_chunk) {
		bool on_grid = h->offset % v->payload == 0 &&
			       (h->length == v->payload ||
				(h->length < v->payload && h->offset + h->length == f->bytes));
		if (on_grid && dp_reasm_mark(&v->summed[f->index], h->offset / v->payload) == 1) {
			dp_reduce_first(acc, h->offset / item, payload, h->length / item, dtype);
			return;
		}
		if (!on_grid)
			sum_zero_rest(v, f);
	}
	dp_accumulate(acc, h->offset / item, payload, h->length / item, dtype);
}

/* The NIC's part of f is over with status: its wait ends (at its last duck's answer, or
 * now); the worker ends the part with the status returned. */
static uint32_t part_over(const struct dp_gather_view *v, struct dp_fwd *f, uint32_t status,
			  uint64_t now)
{
	struct dp_nic_part *p = &f->part[v->nic];
	if (p->sum_by_chunk && status == DP_STATUS_OK)
		sum_zero_rest(v, f); /* every chunk has its sum unless no duck here was asked */
	uint64_t end = p->last_ns ? p->last_ns : now;
	/* from the first send, not the last: partials read during a long send (they are
	 * taken in after it) gave wait_ns 380 against send_ns 154,262 */
	p->wait_ns = end > p->send_start ? end - p->send_start : 0;
	return status;
}

uint32_t dp_gather_timeout(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now)
{
	return part_over(v, f, DP_STATUS_TIMEOUT, now);
}

uint32_t dp_gather_link_down(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now)
{
	f->part[v->nic].link_down = true; /* the last NIC out names it (dp_fwd.c) */
	dp_count(v->counters, DP_C_link_down_forwards, 1);
	return part_over(v, f, DP_STATUS_DATAPLANE_ERROR, now);
}

/* DP_STATUS_PENDING while a duck of f on this NIC has not answered, else the part is
 * over: OK, or DUCK_LOST if one holds no such layer. */
static uint32_t check_forward_done(const struct dp_gather_view *v, struct dp_fwd *f,
				   uint64_t now)
{
	bool lost = false;
	for (uint32_t i = 0; i < v->nducks; i++) {
		uint32_t d = v->ducks[i];
		if (!dp_targets_has(f->targets, d))
			continue;
		uint8_t st = duck_rx(v, f, d)->state;
		if (st == 0)
			return DP_STATUS_PENDING;
		lost |= st == 2; /* 3: failed over, its rows are the fo replies' */
	}
	for (uint32_t k = 1; k <= f->part[v->nic].fo_n; k++) {
		uint8_t st = dp_moe_fo_rx(v, f, k)->state;
		if (st == 0)
			return DP_STATUS_PENDING;
		lost |= st == 2;
	}
	return part_over(v, f, lost ? DP_STATUS_DUCK_LOST : DP_STATUS_OK, now);
}

uint64_t dp_gather_accept(const struct dp_gather_view *v, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	uint32_t chunks = dp_wire_chunk_count(f->bytes, v->payload);
	struct dp_wire_header *hdrs = &v->hdrs[(size_t)f->index * v->max_chunks];
	struct dp_nic_part *p = &f->part[v->nic];
	bool routed = f->desc.flags & DP_DESC_FLAG_ROUTED;
	for (uint32_t c = 0; c < chunks && !routed; c++) { /* routed: dp_moe_send writes them */
		struct dp_wire_header *h = &hdrs[c];
		dp_wire_init(h, DP_WIRE_OP_FORWARD, v->session, f->desc.epoch);
		h->dtype = l->dtype;
		h->forward_id = f->wire_id;
		h->layer = l->id;
		h->tensor = l->bank; /* its banks' generation (0 but for a moved MoE layer) */
		h->duck = DP_WIRE_ANY_DUCK;
		h->chunk = c;
		h->chunks = chunks;
		h->offset = (uint64_t)c * v->payload;
		h->total = f->bytes;
		h->length = dp_wire_chunk_len(f->bytes, v->payload, c);
		h->rows = f->rows;
	}
	/* Sum in place in the result slot when we can (float32, first NIC); else scratch. */
	int first = __builtin_ctz(f->nic_mask);
	uint32_t item = dp_dtype_size(l->dtype);
	p->acc_scratch = !(l->dtype == DP_DTYPE_F32 && (int)v->nic == first);
	p->scratch_bytes = p->acc_scratch ? f->bytes / item * sizeof(float) : 0;
	if (!p->acc_scratch)
		f->acc[v->nic] = (float *)f->res;
	else
		f->acc[v->nic] = v->scratch + (size_t)f->index * v->scratch_floats;
	/* dense, and chunks of whole values: no zeroing ahead (sum_chunk); routed replies are
	 * added row by row wherever the routing puts them, onto zeros */
	p->sum_by_chunk = !routed && v->payload % item == 0;
	if (p->sum_by_chunk)
		dp_reasm_reset(&v->summed[f->index], chunks);
	else
		memset(f->acc[v->nic], 0, f->bytes / item * sizeof(float));
	for (uint32_t i = 0; i < v->nducks; i++)
		if (dp_targets_has(f->targets, v->ducks[i])) {
			struct dp_duck_rx *rx = duck_rx(v, f, v->ducks[i]);
			rx->reasm.chunks = 0; /* the first chunk says how many */
			rx->reasm.have = 0;
			rx->state = 0;
			rx->compute_ns = rx->done_ns = rx->resent_ns = rx->progress_ns = 0;
			rx->nacks = 0;
			rx->heard_ns = 0;
			rx->fo_tag = 0;
			rx->fo_stuck = false;
			rx->moe_rows = rx->moe_entries = rx->moe_tsize = 0;
			rx->moe_map = NULL;
			rx->moe_table = NULL;
			rx->moe_gather = false;
		}
	p->first_ns = p->last_ns = p->fetch_ns = 0;
	p->link_down = false;
	p->fo_n = 0;
	p->fo_table_used = 0;
	p->fo_map_used = 0;
	p->owner.mem = &f->client->mem; /* chunks may go out in place from its slot */
	uint64_t start = dp_now_ns();
	p->send_start = start;
	const struct dp_nic_cfg *nic = v->nic_cfg;
	if (routed) {
		dp_moe_send(v, f); /* a failure is logged; the part then times out */
	} else if (nic->use_broadcast) {
		dp_tx_activation(v->tx, &nic->broadcast, hdrs, f->act, &p->owner, 0, chunks);
	} else {
		for (uint32_t i = 0; i < v->nducks; i++)
			if (dp_targets_has(f->targets, v->ducks[i]))
				dp_tx_activation(v->tx, dp_gather_duck_addr(v, v->ducks[i]), hdrs,
						 f->act, &p->owner, 0, chunks);
	}
	dp_tx_flush(v->tx);
	p->wait_start = dp_now_ns();
	p->send_ns = p->wait_start - start;
	uint64_t rto = UINT64_MAX;
	for (uint32_t i = 0; i < v->nducks; i++)
		if (dp_targets_has(f->targets, v->ducks[i]) && v->rto[v->ducks[i]].rto < rto)
			rto = v->rto[v->ducks[i]].rto;
	return p->wait_start + rto;
}

/* NACK the ducks of f whose partial made no progress for their RTO; returns when the
 * next one is due (UINT64_MAX: none is waited for). */
/* NACK duck d about rx (f's message to it, or a failover message) if its partial made no
 * progress for its RTO; returns when its next NACK is due. */
static uint64_t nack_one(const struct dp_gather_view *v, struct dp_fwd *f, struct dp_duck_rx *rx,
			 uint32_t d, uint64_t now)
{
	uint64_t sent_end = f->part[v->nic].wait_start;
	uint64_t due = (rx->progress_ns ? rx->progress_ns : sent_end) + v->rto[d].rto;
	if (due > now)
		return due;
	rto_backoff(v, d);
	rx->nacks++;
	rx->progress_ns = now; /* the next NACK one (backed-off) RTO from now */
	{
		void *list;
		struct dp_wire_header *h =
			dp_tx_ctl_header(v->tx, DP_WIRE_OP_NACK, f->desc.epoch, &list);
		/* nothing yet: an empty list asks for everything */
		uint32_t n = rx->reasm.chunks ? dp_reasm_missing(&rx->reasm, list,
								 DP_TX_CTL_PAYLOAD / 4)
					      : 0;
		h->forward_id = f->wire_id | (uint64_t)rx->fo_tag << DP_WIRE_FORWARD_TAG_SHIFT;
		h->layer = f->layer->id;
		h->duck = (uint16_t)d;
		h->length = n * (uint32_t)sizeof(uint32_t);
		dp_tx_one(v->tx, dp_gather_duck_addr(v, d), h, list, h->length);
		dp_count(v->counters, DP_C_nacks_sent, 1);
	}
	return now + v->rto[d].rto;
}

/* When routed duck d of f, awaited, is due to be failed over: silent (no datagram for f)
 * for max(DP_FAILOVER_SRTTS x its smoothed reply time, failover_ms) since the send or
 * since it was last heard. The floor keeps a duck busy with a long prefill, never
 * measured at that size, from being taken for silent; the srtt term keeps a duck whose
 * usual reply takes longer than the floor from being. UINT64_MAX: never (a dense
 * forward, or nothing was sent to it). */
static uint64_t failover_due(const struct dp_gather_view *v, const struct dp_fwd *f,
			     const struct dp_duck_rx *rx, uint32_t d)
{
	/* fo_stuck: no replica could take its rows, and the forward's own deadline (the
	 * client's timeout) decides, as it did before failover: a duck that is only slow (a
	 * prefill bigger than any it was measured on) must not be declared lost sooner */
	if (!(f->desc.flags & DP_DESC_FLAG_ROUTED) || !rx->moe_table || rx->fo_stuck)
		return UINT64_MAX;
	const struct dp_rto *e = &v->rto[d];
	uint64_t span = DP_FAILOVER_SRTTS * (e->sampled ? e->srtt : v->limits.nack_ns);
	if (span < v->limits.failover_ns)
		span = v->limits.failover_ns;
	uint64_t from = f->part[v->nic].wait_start;
	return (rx->heard_ns > from ? rx->heard_ns : from) + span;
}

uint64_t dp_gather_send_nacks(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	for (uint32_t i = 0; i < v->nducks; i++) {
		uint32_t d = v->ducks[i];
		if (!dp_targets_has(f->targets, d) || duck_rx(v, f, d)->state != 0)
			continue;
		struct dp_duck_rx *rx = duck_rx(v, f, d);
		uint64_t due = nack_one(v, f, rx, d, now), fo = failover_due(v, f, rx, d);
		due = fo < due ? fo : due; /* the timer must wake for the failover too */
		next = due < next ? due : next;
	}
	for (uint32_t k = 1; k <= f->part[v->nic].fo_n; k++) {
		struct dp_duck_rx *rx = dp_moe_fo_rx(v, f, k);
		if (rx->state == 0) {
			uint64_t due = nack_one(v, f, rx, rx->moe_to, now);
			next = due < next ? due : next;
		}
	}
	return next;
}

uint32_t dp_gather_failover(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now)
{
	bool changed = false;
	if (!(f->desc.flags & DP_DESC_FLAG_ROUTED))
		return DP_STATUS_PENDING; /* a dense forward has no replicas to fail over to */
	/* every duck due first: none of them may take another's rows (or shared columns) in
	 * this pass, whatever the order they are handled in */
	uint64_t going[DP_MAX_DUCKS / 64] = { 0 };
	bool any = false;
	for (uint32_t i = 0; i < v->nducks; i++) {
		uint32_t d = v->ducks[i];
		if (!dp_targets_has(f->targets, d))
			continue;
		struct dp_duck_rx *rx = duck_rx(v, f, d);
		if (rx->state == 0 && now >= failover_due(v, f, rx, d)) {
			going[d >> 6] |= 1ull << (d & 63);
			any = true;
		}
	}
	for (uint32_t i = 0; any && i < v->nducks; i++) {
		uint32_t d = v->ducks[i];
		if (!(going[d >> 6] >> (d & 63) & 1))
			continue;
		struct dp_duck_rx *rx = duck_rx(v, f, d);
		if (dp_moe_failover(v, f, rx, (uint16_t)d, going, now) == 0) {
			rx->state = 3; /* its rows are the failover messages' now */
			changed = true;
		} else {
			rx->fo_stuck = true; /* none can take its rows: up to the forward's deadline */
		}
	}
	if (!changed)
		return DP_STATUS_PENDING;
	dp_tx_flush(v->tx);
	return check_forward_done(v, f, now);
}

uint64_t dp_gather_expected(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t *bytes)
{
	bool routed = f->desc.flags & DP_DESC_FLAG_ROUTED;
	uint64_t row = (uint64_t)f->layer->hidden * dp_dtype_size(f->layer->dtype);
	uint64_t last = 0;
	if (f->part[v->nic].fo_n)
		return 0; /* replacements answer when they answer: not measured for this */
	for (uint32_t i = 0; i < v->nducks; i++) {
		uint32_t d = v->ducks[i];
		const struct dp_duck_rx *rx = duck_rx(v, f, d);
		if (!dp_targets_has(f->targets, d) || rx->state != 0)
			continue;
		if (!v->rto[d].sampled || rx->progress_ns || rx->nacks || rx->resent_ns)
			return 0;
		uint64_t due = f->part[v->nic].wait_start + v->rto[d].srtt;
		last = due > last ? due : last;
		*bytes += routed ? rx->moe_rows * row : f->bytes;
	}
	return last;
}

/* --- receive ----------------------------------------------------------------------- */

uint32_t dp_gather_on_partial(const struct dp_gather_view *v, struct dp_fwd *f,
			      const struct dp_wire_header *h, const uint8_t *payload,
			      uint32_t duck, uint64_t arrived, uint64_t now)
{
	struct dp_layer *l = f->layer;
	struct dp_duck_rx *rx = reply_rx(v, f, h, duck);
	uint32_t item = dp_dtype_size(l->dtype);
	if (!rx) { /* a failover tag this duck was not sent */
		dp_count(v->counters, DP_C_rx_unrouted, 1);
		return DP_STATUS_PENDING;
	}
	if (rx->state == 3) {
		/* the generation rule: its rows were handed to other replicas (tagged
		 * messages), so its own reply, late, would count them twice */
		dp_count(v->counters, DP_C_moe_failover_late, 1);
		return DP_STATUS_PENDING;
	}
	if (rx->state != 0) {
		dp_count(v->counters, DP_C_rx_duplicates, 1);
		return DP_STATUS_PENDING;
	}
	/* A repair of this duck began after f was dispatched (f went out before the duck was
	 * known lost): its partial may come from a bank half streamed, so f has it as lost,
	 * as its NO_LAYER would have been. Forwards dispatched later never ask a duck until
	 * its repair committed (the dispatcher's lost check). Relaxed: this worker sent the
	 * duck its LAYER after the dispatcher, after the control agent's stamp. */
	int16_t li = l->index[duck % DP_MAX_DUCKS];
	if (li >= 0 && (int32_t)(__atomic_load_n(&l->repaired_at[li], __ATOMIC_RELAXED) -
				 f->repairs) > 0) {
		rx->state = 2;
		return check_forward_done(v, f, now);
	}
	/* routed: the reply holds the rows this duck was routed, no more and no fewer */
	bool routed = f->desc.flags & DP_DESC_FLAG_ROUTED;
	uint64_t total = routed ? (uint64_t)rx->moe_rows * l->hidden * item : f->bytes;
	if (routed && (!(h->flags & DP_WIRE_FLAG_ROUTED) || h->rows != rx->moe_rows ||
		       h->total != total)) {
		DP_DEBUG("duck %u: routed partial of %u rows, %lu bytes refused: it was routed %u "
			 "rows (%lu bytes)",
			 duck, h->rows, (unsigned long)h->total, rx->moe_rows, (unsigned long)total);
		dp_count(v->counters, DP_C_rx_unrouted, 1);
		return DP_STATUS_PENDING;
	}
	enum dp_partial_verdict verdict = dp_partial_admit(h, total, l->dtype, &rx->reasm,
							   &rx->chunk_bytes);
	if (verdict == DP_PARTIAL_DUPLICATE) {
		DP_DEBUG("duck %u: partial chunk %u/%u at %lu+%u of %lu: a duplicate", duck,
			 h->chunk, h->chunks, (unsigned long)h->offset, h->length,
			 (unsigned long)h->total);
		dp_count(v->counters, DP_C_rx_duplicates, 1);
		return DP_STATUS_PENDING;
	}
	if (verdict != DP_PARTIAL_ADD) {
		if (dp_count_said(v->counters, DP_C_rx_malformed))
			DP_WARN("duck %u: partial chunk %u/%u at %lu+%u of %lu refused (rx_malformed): "
				"expected %u chunks of %u bytes, %lu bytes in all, dtype %u",
				duck, h->chunk, h->chunks, (unsigned long)h->offset, h->length,
				(unsigned long)h->total, rx->reasm.chunks, rx->chunk_bytes,
				(unsigned long)total, l->dtype);
		return DP_STATUS_PENDING;
	}
	if (routed && rx->fo_of) /* standing in for a duck part of whose reply is summed */
		dp_moe_accumulate_rest(f->acc[v->nic], l->hidden, rx->moe_map, h->offset / item,
				       payload, h->length / item, l->dtype, rx->fo_of->moe_map,
				       rx->fo_of->moe_rows, &rx->fo_of->reasm,
				       rx->fo_of->chunk_bytes);
	else if (routed)
		dp_moe_accumulate(f->acc[v->nic], l->hidden, rx->moe_map, h->offset / item,
				  payload, h->length / item, l->dtype);
	else
		sum_chunk(v, f, h, payload, item);
	/* NACK only once this duck's stream stalls for its RTO: next_nack stays a lower bound */
	rx->progress_ns = now;
	rx->heard_ns = now;
	if (h->compute_ns > rx->compute_ns)
		rx->compute_ns = h->compute_ns;
	if (!dp_reasm_complete(&rx->reasm))
		return DP_STATUS_PENDING;
	struct dp_nic_part *p = &f->part[v->nic];
	rx->state = 1;
	rx->done_ns = now;
	/* Karn: a reply to a NACK or to a resent activation says nothing of the RTT */
	/* and by when it came, not when it was read: read late (parked until the replies
	 * were due, dp_main.c), the time would grow the estimate that parking follows */
	uint64_t at = arrived > p->wait_start && arrived <= now ? arrived : now;
	if (!rx->nacks && !rx->resent_ns && !rx->fo_tag && at > p->wait_start) {
		rto_sample(v, duck, at - p->wait_start);
		if (at - p->wait_start > v->limits.nack_ns)
			dp_count(v->counters, DP_C_nacks_avoided, 1);
	}
	if (!p->first_ns)
		p->first_ns = now;
	p->last_ns = now;
	return check_forward_done(v, f, now);
}

/* Chunks [first, first + n) of f's activation to dst again: a dense forward's from its
 * prepared headers, a routed one's from the duck's own message (dp_moe_resend). */
static void resend(const struct dp_gather_view *v, struct dp_fwd *f, const struct dp_duck_rx *rx,
		   const struct sockaddr_in *dst, const struct dp_wire_header *hdrs, bool routed,
		   uint32_t first, uint32_t n)
{
	if (routed)
		dp_moe_resend(v, f, rx, dst, first, n);
	else
		dp_tx_activation(v->tx, dst, hdrs, f->act, &f->part[v->nic].owner, first, n);
}

uint32_t dp_gather_on_nack(const struct dp_gather_view *v, struct dp_fwd *f,
			   const struct dp_wire_header *h, const uint8_t *payload, uint32_t duck,
			   uint64_t now)
{
	dp_count(v->counters, DP_C_nacks_received, 1);
	if (h->flags & DP_WIRE_FLAG_NO_LAYER) {
		dp_count(v->counters, DP_C_no_layer_replies, 1);
		/* a duck the forward does not ask (a broadcast reached it, or it lies) has no
		 * say in it: its dp_duck_rx is another forward's, and its words must not
		 * replace the message naming the ducks that were asked and did not answer */
		if (f->kind == DP_FWD_FORWARD) {
			struct dp_duck_rx *rx = reply_rx(v, f, h, duck);
			if (rx && (rx->fo_tag || dp_targets_has(f->targets, duck)) && rx->state == 0) {
				/* the layer is gone from it for good: Layers says so from now on */
				__atomic_fetch_or(&f->layer->lost_ducks[duck >> 6], 1ull << (duck & 63),
						  __ATOMIC_RELAXED);
				/* a routed duck's rows go to live replicas, as a silent duck's do:
				 * a duck that came back without its bank costs no forward */
				if (!rx->fo_tag && f->desc.flags & DP_DESC_FLAG_ROUTED &&
				    rx->moe_table &&
				    dp_moe_failover(v, f, rx, (uint16_t)duck, NULL, now) == 0) {
					rx->state = 3;
					dp_tx_flush(v->tx);
					return check_forward_done(v, f, now);
				}
				/* else the message naming every such duck is written at
				 * completion (dp_fwd_lost_message), once every NIC's part is over */
				rx->state = 2;
				return check_forward_done(v, f, now);
			}
		} else {
			f->layer->announced[f->w_index] = 0; /* announce again, then resend */
			f->w_announcer = false;
			f->w_layer_sent_ns = 0;
		}
		return DP_STATUS_PENDING;
	}
	if (f->kind != DP_FWD_FORWARD || !(h->flags & DP_WIRE_FLAG_INPUT))
		return DP_STATUS_PENDING;
	/* the duck is missing activation chunks: resend what it lists (or everything), at most
	 * once per NACK interval per duck, and each chunk of one NACK once: a NACK is a
	 * datagram anyone on the path could repeat, and 8 KB of one chunk index must not
	 * become 2,000 sends */
	uint32_t chunks = dp_wire_chunk_count(f->bytes, v->payload);
	const uint8_t *list = payload; /* u32 chunk indices, at any alignment */
	uint32_t n = h->length / sizeof(uint32_t);
	struct dp_duck_rx *rx = reply_rx(v, f, h, duck);
	const struct dp_wire_header *hdrs = &v->hdrs[(size_t)f->index * v->max_chunks];
	bool routed = f->desc.flags & DP_DESC_FLAG_ROUTED;
	if (!rx || rx->state == 3) /* a tag it was not sent; its rows are another's now */
		return DP_STATUS_PENDING;
	if (routed) {
		/* the duck's own message, from its table and the slot (dp_moe_resend); a duck
		 * the forward does not route to has none (its dp_duck_rx is another forward's) */
		if ((!rx->fo_tag && !dp_targets_has(f->targets, duck)) || !rx->moe_table)
			return DP_STATUS_PENDING; /* nothing was sent to it */
		chunks = dp_moe_chunks(v, f, rx);
		/* at most max_forward_bytes (dp_desc_routed_bytes), so within nack_seen; kept
		 * as a check: a bitmap reset past it would write past the worker's own */
		if (chunks > DP_REASM_MAX_CHUNKS)
			return DP_STATUS_PENDING;
	}
	uint64_t interval = v->limits.nack_ns;
	rx->progress_ns = now; /* it is alive and waits for input: one RTO from now */
	rx->heard_ns = now;    /* and not silent: no failover yet */
	if (rx->resent_ns && now < rx->resent_ns + interval) {
		dp_count(v->counters, DP_C_nack_resends_suppressed, n ? n : chunks);
		return DP_STATUS_PENDING;
	}
	rx->resent_ns = now;
	const struct sockaddr_in *dst = dp_gather_duck_addr(v, duck);
	if (n == 0) {
		resend(v, f, rx, dst, hdrs, routed, 0, chunks);
		dp_count(v->counters, DP_C_retransmits, chunks);
		return DP_STATUS_PENDING;
	}
	dp_reasm_reset(v->nack_seen, chunks);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c;
		memcpy(&c, list + (size_t)i * sizeof(c), sizeof(c));
		int fresh = dp_reasm_mark(v->nack_seen, c); /* -1: no such chunk */
		if (fresh > 0) {
			resend(v, f, rx, dst, hdrs, routed, c, 1);
			dp_count(v->counters, DP_C_retransmits, 1);
		} else if (fresh == 0) {
			dp_count(v->counters, DP_C_nack_resends_suppressed, 1);
		}
	}
	return DP_STATUS_PENDING;
}
