/* dp_fwd.c: a forward context's whole life (the cycle: dp_fwd.h).
 *
 * The dispatcher's pool of free contexts and their initialisation for a descriptor;
 * the end of each NIC's part and the completion by the last NIC to finish (the NICs'
 * sums added, bias, stored into the result slot); publishing into the client's slot
 * header; the Completion's roll-up of what the NICs and ducks measured; the return to
 * the pool through the free ring. Whichever agent runs a function here owns the
 * context at that moment: a context is on one agent at a time, but for the NIC workers
 * that share a forward, and they touch only their own part until the last one out.
 */
#include "dp_fwd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dp_reduce.h"
#include "dp_ring.h"
#include "dp_tsan.h"

/* --- the pool ----------------------------------------------------------------------- */

int dp_fwd_pool_init(struct dp_fwd_pool *p, struct dp_world *w)
{
	p->w = w;
	p->nfree = 0;
	p->free = calloc(w->nfwds, sizeof(struct dp_fwd *));
	if (!p->free)
		return -1;
	/* A routed forward's host table is copied here once and checked (dp_desc_routing_copy);
	 * it is at most 16 + 8 * MAX_TOKENS * MAX_TOPK bytes (512 KiB) and, by the bound that
	 * check holds it to, under max_forward_bytes: 64 contexts x 512 KiB = 32 MiB of address
	 * space, touched only by routed forwards */
	uint64_t most = DP_ROUTING_HEADER_SIZE +
			DP_ROUTING_ENTRY_SIZE * (uint64_t)DP_MAX_TOKENS * DP_MAX_TOPK;
	p->route_cap = w->cfg.max_forward_bytes < most ? w->cfg.max_forward_bytes : most;
	p->routes = calloc(w->nfwds, p->route_cap);
	if (!p->routes) {
		free(p->free);
		p->free = NULL;
		return -1;
	}
	for (uint32_t i = w->nfwds; i-- > 0;) {
		p->free[p->nfree++] = &w->fwds[i];
		w->fwds[i].route = p->routes + (uint64_t)i * p->route_cap;
	}
	return 0;
}

void dp_fwd_pool_fini(struct dp_fwd_pool *p)
{
	for (uint32_t i = 0; p->routes && i < p->w->nfwds; i++)
		p->w->fwds[i].route = NULL;
	free(p->routes);
	p->routes = NULL;
	free(p->free);
	p->free = NULL;
	p->nfree = 0;
}

void dp_fwd_pool_refill(struct dp_fwd_pool *p)
{
	void *back[DP_BURST];
	uint32_t n;
	while ((n = dp_spsc_pop(&p->w->free_ring, back, DP_BURST)) > 0)
		for (uint32_t i = 0; i < n; i++)
			p->free[p->nfree++] = back[i];
}

struct dp_fwd *dp_fwd_alloc(struct dp_fwd_pool *p, struct dp_client *c,
			    const struct dp_desc *desc, uint64_t now)
{
	struct dp_fwd *f = p->free[--p->nfree];
	if (++f->gen == 0) /* wire id 0 would never match */
		f->gen = 1;
	f->wire_id = ((uint64_t)f->gen << 16) | f->index;
	f->client = c;
	f->desc = *desc;
	f->layer = NULL;
	f->status = DP_STATUS_PENDING;
	f->message[0] = '\0';
	f->pickup_ns = now;
	f->client_prepare_ns = 0;
	f->reduce_ns = 0;
	f->bytes = 0;
	f->nic_mask = 0;
	f->route_bytes = 0;
	memset(f->targets, 0, sizeof(f->targets));
	memset(f->part, 0, sizeof(f->part));
	dp_fetch_add_u64(&c->inflight, 1);
	dp_store_relaxed_u64(&c->submitted, c->submitted + 1);
	return f;
}

/* No upper bound from max_timeout_us: a descriptor may wait in its ring far longer than
 * any timeout (a client at its inflight quota with many slots), so only the attach time
 * bounds an honest stamp from below. */
bool dp_fwd_client_prepare(struct dp_fwd *f)
{
	uint64_t submit = f->desc.submit_ns;
	f->client_prepare_ns = 0;
	if (!submit)
		return true;
	if (submit > f->pickup_ns || submit < f->client->attach_ns)
		return false;
	f->client_prepare_ns = f->pickup_ns - submit;
	return true;
}

uint64_t dp_fwd_own_prepare_ns(const struct dp_fwd *f)
{
	uint64_t first = 0;
	for (uint32_t n = 0; n < DP_MAX_NICS; n++) {
		uint64_t t = f->part[n].send_start;
		if ((f->nic_mask & (1u << n)) && t && (!first || t < first))
			first = t;
	}
	return first > f->pickup_ns ? first - f->pickup_ns : 0;
}

/* Drops the layer reference the dispatcher took and counts f off its client (the
 * dispatcher's quota and the unmapping of a closing client read inflight), then hands f
 * back through the free ring. */
void dp_fwd_release(struct dp_world *w, struct dp_fwd *f)
{
	struct dp_client *cl = f->client;
	if (f->layer) {
		dp_layer_put(f->layer); /* taken by the dispatcher */
		f->layer = NULL;
	}
	dp_store_relaxed_u64(&cl->completed, cl->completed + 1);
	dp_fetch_add_u64(&cl->inflight, -1);
	dp_spsc_push(&w->free_ring, (void **)&f, 1);
}

/* --- finishing ------------------------------------------------------------------------ */

/* acq_rel: the last one out sees every other NIC's sums and statuses. */
bool dp_fwd_part_done(struct dp_fwd *f, uint32_t nic, uint32_t status)
{
	f->part[nic].status = status;
	return dp_fetch_sub_u32(&f->nics_pending, 1) == 1;
}

static uint32_t status_rank(uint32_t s)
{
	return s == DP_STATUS_OK ? 0 : s == DP_STATUS_TIMEOUT ? 1 : 2;
}

/* A routed forward that timed out: its message names the ducks that did not answer and
 * their experts, as many as fit. */
static void routed_missing_message(const struct dp_world *w, struct dp_fwd *f)
{
	size_t n = sizeof(f->message), used = 0;
	uint32_t listed = 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS && used + 24 < n; d++) {
		if (!dp_targets_has(f->targets, d) || f->rx[w->duck_index[d]].state == 1)
			continue;
		int k = snprintf(f->message + used, n - used, "%s", listed ? "; " : "");
		used += k > 0 ? (size_t)k : 0;
		k = dp_layer_describe_duck(f->layer, d, f->message + used, n - used);
		used += k > 0 ? (size_t)k : 0;
		listed++;
	}
	if (used < n)
		snprintf(f->message + used, n - used, " did not answer");
}

/* DUCK_LOST: every duck that answered it holds no such layer, in one message, written by
 * the last NIC out (the workers only mark them: two NICs' parts must not share a buffer,
 * and the first duck's NO_LAYER must not speak for all eight that restarted). */
static void lost_message(const struct dp_world *w, struct dp_fwd *f)
{
	uint64_t gone[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		if (dp_targets_has(f->targets, d) && f->rx[w->duck_index[d]].state == 2)
			gone[d >> 6] |= 1ull << (d & 63);
	dp_fwd_lost_message(f, gone);
}

void dp_fwd_lost_message(struct dp_fwd *f, const uint64_t *gone)
{
	enum { TAIL = 96 }; /* room kept for " ... N more" and the sentence's end */
	char *m = f->message;
	size_t n = sizeof(f->message), used = 0;
	uint32_t lost = 0, listed = 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		lost += dp_targets_has(gone, d);
	bool moe = f->layer && f->layer->moe;
	int k = moe || lost == 1 ? 0 : snprintf(m, n, "ducks [");
	used += k > 0 ? (size_t)k : 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS && used + TAIL < n; d++) {
		if (!dp_targets_has(gone, d))
			continue;
		k = snprintf(m + used, n - used, "%s", !listed ? "" : moe ? "; " : ", ");
		used += k > 0 ? (size_t)k : 0;
		if (moe || lost == 1) /* dense: "duck 5"; MoE: with the experts it held */
			k = dp_layer_describe_duck(f->layer, d, m + used, n - TAIL - used);
		else
			k = snprintf(m + used, n - used, "%u", d);
		used += k > 0 ? (size_t)k : 0;
		if (used >= n - TAIL) /* describe truncated: keep the tail's room */
			used = n - TAIL - 1;
		listed++;
	}
	if (listed < lost) {
		k = snprintf(m + used, n - used, " ... %u more", lost - listed);
		used += k > 0 ? (size_t)k : 0;
	}
	/* a repair restreams only the lost banks: the client that loaded the layer keeps its
	 * model (Client.repair), so it need not send the whole layer again */
	uint32_t id = f->layer ? f->layer->id : f->desc.layer;
	if (used < n)
		snprintf(m + used, n - used, "%s no layer %u (restarted?); repair it: client.repair(%u)",
			 moe || lost == 1 ? (lost == 1 ? " holds" : " hold") : "] hold", id, id);
}

/* DATAPLANE_ERROR from NICs whose link was down (dp_gather_link_down): their names. */
static void link_down_message(const struct dp_world *w, struct dp_fwd *f)
{
	size_t n = sizeof(f->message), used = 0;
	uint32_t listed = 0;
	for (uint32_t k = 0; k < DP_MAX_NICS && used < n; k++) {
		if (!(f->nic_mask & (1u << k)) || !f->part[k].link_down)
			continue;
		int c = snprintf(f->message + used, n - used, "%snic %s", listed ? ", " : "",
				 w->cfg.nics[k].name);
		used += c > 0 ? (size_t)c : 0;
		listed++;
	}
	if (listed && used < n)
		snprintf(f->message + used, n - used,
			 ": link down; its ducks were not sent this forward (the forward fails at "
			 "once until the link is up again)");
}

/* The last NIC out: the worst of the NICs' statuses, and the message that goes with it;
 * counters are the finishing worker's. */
static uint32_t final_status(struct dp_world *w, struct dp_fwd *f, struct dp_counters *counters)
{
	uint32_t status = DP_STATUS_OK;
	for (uint32_t n = 0; n < DP_MAX_NICS; n++)
		if (f->nic_mask & (1u << n) && status_rank(f->part[n].status) > status_rank(status))
			status = f->part[n].status;
	/* the epoch moved while the forward was in flight: its result is not committed */
	if (f->kind == DP_FWD_FORWARD && status == DP_STATUS_OK &&
	    f->desc.epoch != dp_load_acquire_u64(&w->epoch)) {
		status = DP_STATUS_STALE_EPOCH;
		dp_count(counters, DP_C_stale_epoch, 1);
		snprintf(f->message, sizeof(f->message), "the epoch moved to %lu while in flight",
			 (unsigned long)dp_load_acquire_u64(&w->epoch));
	}
	/* routed: name the ducks that did not answer and the experts they hold */
	if (status == DP_STATUS_TIMEOUT && f->kind == DP_FWD_FORWARD &&
	    f->desc.flags & DP_DESC_FLAG_ROUTED && !f->message[0])
		routed_missing_message(w, f);
	if (status == DP_STATUS_DUCK_LOST && f->kind == DP_FWD_FORWARD && !f->message[0])
		lost_message(w, f);
	if (status == DP_STATUS_DATAPLANE_ERROR && f->kind == DP_FWD_FORWARD && !f->message[0])
		link_down_message(w, f);
	if (!f->message[0] && status == DP_STATUS_TIMEOUT)
		snprintf(f->message, sizeof(f->message), "no complete partial within the deadline");
	return status;
}

/* Nothing may touch f after: the control agent owns it from the push. */
void dp_fwd_finish(struct dp_world *w, struct dp_fwd *f, uint32_t status, struct dp_spsc *done,
		   struct dp_counters *counters)
{
	f->status = status;
	dp_fwd_measure(w, f, &f->phases);
	dp_fwd_publish(f, counters);
	dp_spsc_push(done, (void **)&f, 1);
}

/* Give back what f's sums took of each NIC's scratch past DP_SCRATCH_KEEP (the pages
 * read as zeros when touched again); f's parts are over, nothing reads the sums after. */
static void scratch_release(struct dp_fwd *f)
{
	for (uint32_t k = 0; k < DP_MAX_NICS; k++) {
		struct dp_nic_part *p = &f->part[k];
		if (!p->acc_scratch)
			continue;
		uint64_t used = (p->scratch_bytes + 4095) & ~(uint64_t)4095;
		if (used > DP_SCRATCH_KEEP)
			(void)madvise((char *)f->acc[k] + DP_SCRATCH_KEEP, used - DP_SCRATCH_KEEP,
				      MADV_DONTNEED); /* advice: a failure only keeps the pages */
		p->acc_scratch = false;
	}
}

void dp_fwd_complete(struct dp_world *w, struct dp_fwd *f, struct dp_spsc *done,
		     struct dp_counters *counters)
{
	struct dp_layer *l = f->layer;
	uint32_t status = final_status(w, f, counters);
	if (f->kind == DP_FWD_FORWARD && status == DP_STATUS_OK) {
		uint64_t t0 = dp_now_ns();
		uint64_t n = f->bytes / dp_dtype_size(l->dtype);
		/* the first NIC: it summed in place when it could (dp_gather_accept) */
		int primary = __builtin_ctz(f->nic_mask);
		float *acc = f->acc[primary];
		for (uint32_t k = (uint32_t)primary + 1; k < DP_MAX_NICS; k++)
			if (f->nic_mask & (1u << k))
				dp_accumulate_f32(acc, f->acc[k], n);
		dp_reduce_store(f->res, acc, l->has_b_down ? l->b_down : NULL, f->rows, l->hidden,
				l->dtype);
		f->reduce_ns = dp_now_ns() - t0;
		dp_count(counters, DP_C_forwards_ok, 1);
	} else if (status == DP_STATUS_TIMEOUT) {
		dp_count(counters, DP_C_timeouts, 1);
	} else if (status == DP_STATUS_DUCK_LOST) {
		dp_count(counters, DP_C_duck_lost, 1);
	}
	scratch_release(f);
	dp_fwd_finish(w, f, status, done, counters);
}

/* send and wait: the longest NIC's; fetch: every NIC's added up; spread: from the first
 * duck complete to the last, over every NIC; compute: over the ducks that answered (the
 * per-duck list is the Completion's, dp_fwd_summarize). Weight chunks and what the
 * dispatcher completed report prepare_ns alone. */
void dp_fwd_measure(const struct dp_world *w, const struct dp_fwd *f, struct dp_fwd_phases *p)
{
	*p = (struct dp_fwd_phases){
		.prepare_ns = f->client_prepare_ns,
		.reduce_ns = f->reduce_ns,
	};
	if (f->kind != DP_FWD_FORWARD)
		return;
	uint64_t first = UINT64_MAX, last = 0;
	for (uint32_t n = 0; n < DP_MAX_NICS; n++)
		if (f->nic_mask & (1u << n)) {
			const struct dp_nic_part *part = &f->part[n];
			p->send_ns = part->send_ns > p->send_ns ? part->send_ns : p->send_ns;
			p->wait_ns = part->wait_ns > p->wait_ns ? part->wait_ns : p->wait_ns;
			p->fetch_ns += part->fetch_ns;
			if (part->first_ns && part->first_ns < first)
				first = part->first_ns;
			if (part->last_ns > last)
				last = part->last_ns;
		}
	p->spread_ns = last > first && first != UINT64_MAX ? last - first : 0;
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
		for (uint64_t bits = f->targets[k]; bits; bits &= bits - 1) {
			const struct dp_duck_rx *rx =
				&f->rx[w->duck_index[k * 64 + (uint32_t)__builtin_ctzll(bits)]];
			if (rx->state != 1) {
				p->missing++;
				continue;
			}
			p->answered++;
			p->compute_sum_ns += rx->compute_ns;
			if (rx->compute_ns > p->compute_max_ns)
				p->compute_max_ns = rx->compute_ns;
		}
}

void dp_fwd_publish(struct dp_fwd *f, struct dp_counters *counters)
{
	struct dp_client *c = f->client;
	if (f->desc.slot >= c->layout.slot_count)
		return; /* a refused descriptor with a bad slot completes over ZeroMQ only */
	const struct dp_fwd_phases *p = &f->phases;
	const struct dp_slot_header v = {
		.forward_id = f->desc.forward_id,
		.epoch = f->desc.epoch,
		.nbytes = f->bytes,
		.answered = p->answered,
		.missing = p->missing,
		.prepare_ns = p->prepare_ns,
		.send_ns = p->send_ns,
		.wait_ns = p->wait_ns,
		.fetch_ns = p->fetch_ns,
		.reduce_ns = p->reduce_ns,
		.spread_ns = p->spread_ns,
		.duck_compute_max_ns = p->compute_max_ns,
		.duck_compute_sum_ns = p->compute_sum_ns,
	};
	DP_TSAN_RELEASE(&c->slots[f->desc.slot]); /* the client hands the slot back: dp_tsan.h */
	if (dp_slot_publish(&c->slots[f->desc.slot], &v, f->desc.generation, f->status))
		dp_count(counters, DP_C_futex_wakes, 1); /* a client slept on it: dp_wake.h */
}

/* --- the completion ------------------------------------------------------------------- */

/* The duck lists and each answering duck's compute, with the phase times dp_fwd_finish
 * measured and published into the slot header (f->phases): the client reads the same
 * numbers from either. */
void dp_fwd_summarize(const struct dp_world *w, const struct dp_fwd *f,
		      struct dp_fwd_summary *s)
{
	uint32_t nok = 0, nbad = 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS && f->kind == DP_FWD_FORWARD; d++) {
		if (!dp_targets_has(f->targets, d))
			continue;
		const struct dp_duck_rx *rx = &f->rx[w->duck_index[d]];
		if (rx->state == 1) {
			s->compute_ns[nok] = rx->compute_ns;
			s->answered[nok++] = d;
		} else {
			s->missing[nbad++] = d;
		}
	}
	s->nanswered = nok;
	s->nmissing = nbad;
	s->phases = f->phases;
}
