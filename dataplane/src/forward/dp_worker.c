/* dp_worker.c: the NIC worker agent.
 *
 * One per NIC port. Each loop it takes what the dispatcher handed over (a forward
 * to dp_gather.c, a weight chunk to dp_weight.c), reads a burst of datagrams and
 * gives each that passes its filters (well formed, from a duck of this NIC, of this
 * session, for a context in flight here, of that context's epoch) to the module it
 * is for, then runs the timers: a forward's deadline and NACKs, weight datagrams
 * within a budget that keeps them behind forwards, PINGs. Every send goes through
 * the transmit batch (dp_tx.c). The worker that completes the last NIC's part
 * writes the result slot and publishes the completion (dp_worker_finalize; the
 * context's status, slot header and hand-over to the control agent: dp_fwd.c).
 */
#include "dp_worker.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_gather.h"
#include "dp_reduce.h"
#include "dp_release.h"
#include "dp_tx.h"
#include "dp_weight.h"
#include "dp_wire.h"

#define RX_BURST 64
/* Weight datagrams sent per loop while forwards are in flight (background class). */
#define WEIGHT_BUDGET_BUSY 4
#define WEIGHT_BUDGET_IDLE 64
/* Weight datagrams sent and not yet acknowledged, per worker: a window, so that a
 * slow duck sees a steady stream instead of a retransmission storm. */
#define WEIGHT_WINDOW 128

/* --- this worker's ducks and contexts --------------------------------------------- */

static bool duck_on_nic(struct dp_worker *wk, uint32_t duck)
{
	int16_t i = wk->w->duck_index[duck];
	return i >= 0 && wk->w->cfg.ducks[i].nic == wk->nic;
}

void dp_worker_active_remove(struct dp_worker *wk, struct dp_fwd *f)
{
	for (uint32_t i = 0; i < wk->nactive; i++)
		if (wk->active[i] == f) {
			wk->active[i] = wk->active[--wk->nactive];
			break;
		}
	wk->owned[f->index] = 0;
}

/* The last NIC out: sum the NICs' partial sums into the result slot and publish. */
void dp_worker_finalize(struct dp_worker *wk, struct dp_fwd *f)
{
	struct dp_layer *l = f->layer;
	uint32_t status = dp_fwd_final_status(wk->w, f, &wk->counters);
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
		dp_count(&wk->counters, DP_C_forwards_ok, 1);
	} else if (status == DP_STATUS_TIMEOUT) {
		dp_count(&wk->counters, DP_C_timeouts, 1);
	} else if (status == DP_STATUS_DUCK_LOST) {
		dp_count(&wk->counters, DP_C_duck_lost, 1);
	}
	dp_fwd_finish(wk->w, f, status, &wk->done, &wk->counters);
}

/* --- receive ----------------------------------------------------------------------- */

static int sender_duck(struct dp_worker *wk, const struct dp_rx *rx, uint16_t claimed)
{
	if (claimed >= DP_MAX_DUCKS || !duck_on_nic(wk, claimed))
		return -1;
	const struct sockaddr_in *a = dp_worker_duck_addr(wk, claimed);
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
			dp_gather_on_partial(wk, f, h, (uint32_t)duck, now);
			break;
		case DP_WIRE_OP_NACK:
			dp_gather_on_nack(wk, f, h, (uint32_t)duck, now);
			break;
		case DP_WIRE_OP_WEIGHT_ACK:
			dp_weight_on_ack(wk, f, h);
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
	dp_tx_flush(wk);
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
				dp_gather_finish(wk, f, DP_STATUS_TIMEOUT, now);
				work++;
			} else if (!backlog && now >= wk->next_nack[f->index]) {
				wk->next_nack[f->index] = dp_gather_send_nacks(wk, f, now);
				work++;
			}
		} else if (now >= f->deadline_ns) {
			dp_weight_finish(wk, f, DP_STATUS_DATAPLANE_ERROR);
			work++;
		} else if (budget) {
			uint32_t sent = dp_weight_pump(wk, f, now, budget, &room);
			budget -= sent < budget ? sent : budget;
			work += (int)sent;
		}
		if (wk->nactive == before)
			i++; /* else the last entry moved into i */
	}
	if (now >= wk->next_ping_ns) {
		for (uint32_t i = 0; i < wk->nducks; i++) {
			struct dp_wire_header *h =
				dp_tx_ctl_header(wk, DP_WIRE_OP_PING,
						 dp_load_acquire_u64(&wk->w->epoch), NULL);
			h->duck = wk->ducks[i];
			dp_tx_one(wk, dp_worker_duck_addr(wk, wk->ducks[i]), h, NULL, 0);
		}
		dp_count(&wk->counters, DP_C_pings, wk->nducks);
		wk->next_ping_ns = now + (uint64_t)wk->w->cfg.ping_ms * 1000000;
	}
	dp_tx_flush(wk);
	return work;
}

/* --- the agent ----------------------------------------------------------------------- */

int dp_worker_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_worker *wk = self;
	struct dp_fwd *in[DP_BURST];
	(void)w;
	uint32_t n = dp_inbox_pop(&wk->in, (void **)in, DP_BURST);
	for (uint32_t i = 0; i < n; i++) {
		if (in[i]->kind == DP_FWD_FORWARD)
			dp_gather_accept(wk, in[i]);
		else
			dp_weight_accept(wk, in[i]);
	}
	int work = (int)n;
	/* fresh clocks: sends above may have taken longer than the loop's `now` knows */
	bool full;
	work += receive(wk, n ? dp_now_ns() : now, &full);
	work += timers(wk, dp_now_ns(), full);
	work += dp_release_poll(wk); /* parts waiting for the port to free (dp_release.c) */
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
	if (!dp_inbox_empty(&wk->in) || (ops->rx_ready && ops->rx_ready(&wk->be)))
		return -1;
	uint64_t next = wk->next_ping_ns;
	if ((wk->nreleasing || (!ops->wait_fd && !ops->rx_ready)) && now + DP_BACKEND_POLL_NS < next)
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
	wk->releasing = calloc(nf, sizeof(struct dp_fwd *));
	if (!wk->owned || !wk->hdrs || !wk->next_nack || !wk->sent_ns || !wk->scratch ||
	    !wk->active || !wk->releasing) {
		dp_set_error("nic %s: out of memory for %zu forward contexts", cfg->name, nf);
		return -1;
	}
	if (dp_spsc_init(&wk->done, (uint32_t)nf) < 0)
		return -1;
	if (wk->be.ops->open(&wk->be) < 0) {
		dp_add_error_context("nic %s (%s backend)", cfg->name, wk->be.ops->name);
		return -1;
	}
	/* a dpdk NIC's inbox is an rte_ring, made once its open brought the EAL up */
	bool dpdk = strcmp(wk->be.ops->name, "dpdk") == 0;
	char ring[32];
	snprintf(ring, sizeof(ring), "dp_in_%u", nic);
	if (dp_inbox_init(&wk->in, dpdk ? DP_INBOX_RTE_RING : DP_INBOX_SPSC, (uint32_t)nf, ring) <
	    0) {
		dp_add_error_context("nic %s: its inbox", cfg->name);
		return -1;
	}
	DP_INFO("nic %s: %s backend, %u ducks, %u-byte chunks, GSO %s, %s, inbox %s", cfg->name,
		wk->be.ops->name, wk->nducks, wk->payload, wk->be.gso ? "on" : "off",
		cfg->use_broadcast ? "broadcast" : "unicast fan-out", dp_inbox_kind_name(&wk->in));
	return 0;
}

void dp_worker_fini(struct dp_worker *wk)
{
	dp_inbox_free(&wk->in); /* before the close: the last dpdk NIC's ends the EAL */
	if (wk->be.ops && wk->be.priv)
		wk->be.ops->close(&wk->be);
	dp_spsc_free(&wk->done);
	free(wk->owned);
	free(wk->hdrs);
	free(wk->next_nack);
	free(wk->sent_ns);
	free(wk->scratch);
	free(wk->active);
	free(wk->releasing);
}
