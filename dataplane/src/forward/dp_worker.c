/* dp_worker.c: the NIC worker agent.
 *
 * One per NIC port. Each loop it takes what the dispatcher handed over (a forward
 * to dp_gather.c, a weight chunk to dp_weight.c), reads a burst of datagrams and
 * gives each that passes its filters (well formed, from a duck of this NIC, of this
 * session, for a context in flight here, of that context's epoch) to the module it
 * is for, then runs the timers: a forward's deadline and NACKs, weight datagrams
 * within a budget that keeps them behind forwards, PINGs. Every send goes through
 * the transmit batch (dp_tx.c). A module's call returns DP_STATUS_PENDING, or the
 * status its context's part on this NIC ended with; the worker then ends the part
 * (end_part, the one place: off the active list, and done once the port let go of the
 * slot), and the worker that ends the last NIC's part completes the forward: sums,
 * result slot, completion (dp_fwd_complete, dp_fwd.c).
 *
 * Who calls whom (an arrow is a call; none points back at the worker):
 *
 *   dp_worker.c --+--> dp_gather.c --+
 *                 +--> dp_weight.c --+--> dp_tx.c -----> backend ops (dp_backend.h)
 *                 +------------------+    (PINGs)            ^
 *                 +--> dp_release.c -------------------------+ (tx_reclaim)
 *                 +--> dp_fwd.c (dp_fwd_part_done; dp_fwd_complete: the last NIC out)
 *
 * dp_gather.c and dp_weight.c see the worker only through views it owns and passes
 * (struct dp_gather_view, struct dp_weight_view) and read contexts through dp_fwd.h;
 * the transmit batch (struct dp_tx_batch) and the release list (struct
 * dp_release_list) are their own structs, embedded in struct dp_worker.
 */
#include "dp_worker.h"

#include <arpa/inet.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_gather.h"
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

/* f is this worker's from here until its part ends: datagrams for it pass the filters. */
static void active_add(struct dp_worker *wk, struct dp_fwd *f)
{
	wk->owned[f->index] = f->wire_id;
	wk->active[wk->nactive++] = f;
}

/* --- the end of a part: here and nowhere else ----------------------------------------- */

/* The port let go of f's slot: the part is done, and the last NIC out completes f. */
static void part_done(struct dp_worker *wk, struct dp_fwd *f, uint32_t status)
{
	if (dp_fwd_part_done(f, wk->nic, status))
		dp_fwd_complete(wk->w, f, &wk->done, &wk->counters);
}

/* A module said f's part on this NIC is over with status: off the active list (its late
 * datagrams are dropped from now), and done now or once the port let go of the slot. */
static void end_part(struct dp_worker *wk, struct dp_fwd *f, uint32_t status, uint64_t now)
{
	for (uint32_t i = 0; i < wk->nactive; i++)
		if (wk->active[i] == f) {
			wk->active[i] = wk->active[--wk->nactive];
			break;
		}
	wk->owned[f->index] = 0;
	/* the last one out sees every other NIC's sums and statuses (dp_fwd_part_done) */
	if (dp_release_part(&wk->release, f, status, now))
		part_done(wk, f, status);
}

/* Parts the port let go of since they ended (dp_release.h): done now. */
static int release_poll(struct dp_worker *wk)
{
	uint32_t let_go = dp_release_poll(&wk->release);
	struct dp_fwd **parts = &wk->release.parts[wk->release.n];
	for (uint32_t k = let_go; k-- > 0;) /* in the order the poll found them */
		part_done(wk, parts[k], parts[k]->part[wk->nic].status);
	return (int)let_go;
}

/* --- receive ----------------------------------------------------------------------- */

static int sender_duck(struct dp_worker *wk, const struct dp_rx *rx, uint16_t claimed)
{
	if (claimed >= DP_MAX_DUCKS || !duck_on_nic(wk, claimed))
		return -1;
	const struct sockaddr_in *a = dp_duck_addr(wk->w, claimed);
	if (a->sin_addr.s_addr != rx->src.sin_addr.s_addr || a->sin_port != rx->src.sin_port)
		return -1;
	return claimed;
}

static struct dp_fwd *owned_fwd(struct dp_worker *wk, uint64_t wire_id)
{
	uint32_t index = (uint32_t)(wire_id & 0xFFFF);
	/* a failover message's replies carry its tag above the wire id (dp_moe_failover) */
	if (index >= wk->w->nfwds || wk->owned[index] != (wire_id & DP_FWD_ID_MASK))
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
		/* the header by copy, the payload in place: rx[i].buf may sit at any alignment */
		struct dp_wire_header hdr;
		const struct dp_wire_header *h = &hdr;
		dp_count(&wk->counters, DP_C_rx_packets, 1);
		dp_count(&wk->counters, DP_C_rx_bytes, rx[i].len);
		enum dp_wire_verdict verdict = dp_wire_read(rx[i].buf, rx[i].len, &hdr);
		if (verdict != DP_WIRE_OK) {
			if (dp_count_said(&wk->counters, DP_C_rx_malformed))
				DP_WARN("a datagram of %u bytes refused (rx_malformed): %s",
					rx[i].len, dp_wire_verdict_name(verdict));
			continue;
		}
		const uint8_t *payload = rx[i].buf + DP_WIRE_HDR_LEN;
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
		uint32_t status = DP_STATUS_PENDING;
		switch (h->op) {
		case DP_WIRE_OP_PARTIAL:
			/* a failover message's reply: its duck may be no target of the forward;
			 * gather checks it against the message (dp_gather_on_partial) */
			if (f->kind != DP_FWD_FORWARD ||
			    (!dp_targets_has(f->targets, (uint32_t)duck) &&
			     !(h->forward_id >> DP_WIRE_FORWARD_TAG_SHIFT))) {
				/* a routed forward's non-target: rows it was never routed */
				bool routed = f->kind == DP_FWD_FORWARD &&
					      f->desc.flags & DP_DESC_FLAG_ROUTED;
				dp_count(&wk->counters, routed ? DP_C_rx_unrouted : DP_C_rx_late, 1);
				break;
			}
			touched[ntouched++] = f->wire_id;
			status = dp_gather_on_partial(&wk->gather, f, h, payload, (uint32_t)duck,
						      rx[i].stamp_ns, now);
			break;
		case DP_WIRE_OP_NACK:
			status = dp_gather_on_nack(&wk->gather, f, h, payload, (uint32_t)duck, now);
			break;
		case DP_WIRE_OP_WEIGHT_ACK:
			status = dp_weight_on_ack(&wk->weight, f, h);
			break;
		default:
			if (dp_count_said(&wk->counters, DP_C_rx_malformed))
				DP_WARN("duck %d sent op %u, which a host is not sent (rx_malformed)",
					duck, h->op);
		}
		if (status != DP_STATUS_PENDING)
			end_part(wk, f, status, now);
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
	dp_tx_flush(&wk->tx);
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
	/* a link that went down fails the forwards in flight on it now, not at their
	 * deadline; weight chunks keep retransmitting until theirs (a flap costs no load) */
	bool link_down = dp_backend_link_down(&wk->be);
	for (uint32_t i = 0; i < wk->nactive;) {
		struct dp_fwd *f = wk->active[i];
		uint32_t before = wk->nactive;
		if (f->kind == DP_FWD_FORWARD) {
			if (link_down) {
				end_part(wk, f, dp_gather_link_down(&wk->gather, f, now), now);
				work++;
			} else if (now >= f->deadline_ns) {
				end_part(wk, f, dp_gather_timeout(&wk->gather, f, now), now);
				work++;
			} else if (!backlog && now >= wk->next_nack[f->index]) {
				/* a routed duck silent past its failover deadline first: its rows
				 * go to a replica, or the part ends DUCK_LOST (dp_gather_failover) */
				uint32_t st = dp_gather_failover(&wk->gather, f, now);
				if (st != DP_STATUS_PENDING)
					end_part(wk, f, st, now);
				else
					wk->next_nack[f->index] =
						dp_gather_send_nacks(&wk->gather, f, now);
				work++;
			}
		} else if (now >= f->deadline_ns) {
			end_part(wk, f, dp_weight_timeout(&wk->weight, f), now);
			work++;
		}
		if (wk->nactive == before)
			i++; /* else the last entry moved into i */
	}
	/* Weight chunks share the budget and the window round-robin: each loop starts after
	 * the last chunk that sent anything in the one before. An ending part moves the
	 * newest entry into its place, so a fixed start would let the newest chunks take
	 * the budget loop after loop while older ones wait past their deadline (a 700 MB
	 * load onto 8 ducks did: chunks never sent in 10 s). Moving on only when the budget
	 * ran out was not enough: acks free the window a receive burst (32) at a time, less
	 * than the budget, so the chunk at the start took every freed place until it was
	 * all sent, and a replacement moved into its place took them next. */
	uint32_t n = wk->nactive, served = n;
	for (uint32_t k = 0; k < n && budget; k++) {
		struct dp_fwd *f = wk->active[(wk->pump_next + k) % n];
		if (f->kind == DP_FWD_FORWARD)
			continue;
		uint32_t sent = dp_weight_pump(&wk->weight, f, now, budget, &room);
		budget -= sent < budget ? sent : budget;
		work += (int)sent;
		if (sent)
			served = k;
	}
	if (served < n)
		wk->pump_next = (wk->pump_next + served + 1) % n; /* the next loop starts there */
	if (now >= wk->next_ping_ns) {
		for (uint32_t i = 0; i < wk->nducks; i++) {
			struct dp_wire_header *h =
				dp_tx_ctl_header(&wk->tx, DP_WIRE_OP_PING,
						 dp_load_acquire_u64(&wk->w->epoch), NULL);
			h->duck = wk->ducks[i];
			dp_tx_one(&wk->tx, dp_duck_addr(wk->w, wk->ducks[i]), h, NULL, 0);
		}
		dp_count(&wk->counters, DP_C_pings, wk->nducks);
		wk->next_ping_ns = now + (uint64_t)wk->w->cfg.ping_ms * 1000000;
	}
	dp_tx_flush(&wk->tx);
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
		active_add(wk, in[i]);
		if (in[i]->kind == DP_FWD_FORWARD) /* link down: sends nothing, ends in timers */
			wk->next_nack[in[i]->index] = dp_gather_accept(&wk->gather, in[i]);
		else
			dp_weight_accept(&wk->weight, in[i]);
	}
	int work = (int)n;
	/* fresh clocks: sends above may have taken longer than the loop's `now` knows */
	bool full;
	work += receive(wk, n ? dp_now_ns() : now, &full);
	work += timers(wk, dp_now_ns(), full);
	work += release_poll(wk); /* parts waiting for the port to free (dp_release.c) */
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
	if (!dp_inbox_empty(&wk->in) || (ops->rx_ready && ops->rx_ready(&wk->be)) ||
	    (ops->rx_arm && ops->rx_arm(&wk->be)))
		return -1;
	bool told = (ops->wait_fd && ops->wait_fd(&wk->be) >= 0) || ops->rx_ready;
	uint64_t next = wk->next_ping_ns;
	if ((wk->release.n || !told) && now + DP_BACKEND_POLL_NS < next)
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

/* Only a plain wait_fd can be muted (dp_waker_mute): not an interrupt that must be
 * armed, not a backend that polls. Replies that fit in half the socket's buffer
 * only (a GRO receive costs its buffer little beyond its bytes; one datagram of 1472 bytes
 * about 1.6x), so that those that come early wait there rather than overflow it. */
int64_t dp_worker_expect(struct dp_world *w, void *self, uint64_t now, int *fd)
{
	struct dp_worker *wk = self;
	const struct dp_backend_ops *ops = wk->be.ops;
	if (!wk->nactive)
		return 0;
	if (!w->cfg.idle_expect || !ops->wait_fd || ops->rx_arm || wk->release.n ||
	    !dp_inbox_empty(&wk->in) || (ops->rx_ready && ops->rx_ready(&wk->be)))
		return -1;
	uint64_t first = UINT64_MAX, bytes = 0;
	for (uint32_t i = 0; i < wk->nactive; i++) {
		struct dp_fwd *f = wk->active[i];
		uint64_t due = f->kind == DP_FWD_FORWARD ? dp_gather_expected(&wk->gather, f, &bytes)
							 : 0; /* weights: acks any time */
		if (due <= now)
			return -1;
		first = due < first ? due : first;
	}
	*fd = ops->wait_fd(&wk->be);
	if (*fd < 0 || bytes > w->cfg.nics[wk->nic].rcvbuf / 2)
		return -1;
	return (int64_t)(first - now);
}

void dp_worker_unpark(struct dp_world *w, void *self)
{
	struct dp_worker *wk = self;
	(void)w;
	if (wk->be.ops->rx_disarm)
		wk->be.ops->rx_disarm(&wk->be);
}

/* The config's NACK timing as gather reads it: ns, copied once. */
static struct dp_gather_limits gather_limits(const struct dp_config *c)
{
	return (struct dp_gather_limits){ .nack_ns = (uint64_t)c->nack_us * 1000,
					  .nack_min_ns = (uint64_t)c->nack_min_us * 1000,
					  .nack_max_ns = (uint64_t)c->nack_max_us * 1000,
					  .failover_ns = (uint64_t)c->failover_ms * 1000000 };
}

int dp_worker_init(struct dp_worker *wk, struct dp_world *w, uint32_t nic)
{
	const struct dp_nic_cfg *cfg = &w->cfg.nics[nic];
	memset(wk, 0, sizeof(*wk));
	wk->nic = nic;
	wk->w = w;
	wk->lcore = wk->cpu = -1;
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
			wk->nic_ducks[id >> 6] |= 1ull << (id & 63);
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
	/* float32 sums of a 2-byte dtype, each context's a multiple of DP_SCRATCH_KEEP from the
	 * first (so page-aligned), as address space reserved, not memory: a forward's sums take pages as they are
	 * written, and what is past DP_SCRATCH_KEEP goes back when it completes */
	uint64_t per_ctx = ((uint64_t)w->cfg.max_forward_bytes * 2 + DP_SCRATCH_KEEP - 1) &
			   ~(DP_SCRATCH_KEEP - 1);
	wk->scratch_floats = (uint32_t)(per_ctx / sizeof(float));
	wk->scratch_len = nf * per_ctx;
	wk->owned = calloc(nf, sizeof(uint64_t));
	wk->hdrs = calloc(nf * wk->max_chunks, sizeof(struct dp_wire_header));
	wk->next_nack = calloc(nf, sizeof(uint64_t));
	wk->sent_ns = calloc(nf * wk->max_chunks, sizeof(uint64_t));
	void *sums = mmap(NULL, wk->scratch_len, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	wk->scratch = sums == MAP_FAILED ? NULL : sums;
	wk->summed = calloc(nf, sizeof(struct dp_reasm));
	wk->active = calloc(nf, sizeof(struct dp_fwd *));
	wk->release.parts = calloc(nf, sizeof(struct dp_fwd *));
	/* Routed (MoE) forwards send their rows from the slot in place (dp_moe.c); what
	 * they keep per context is the table(s) they sent, for resends: the NIC's wire table,
	 * or one table per routed duck, at most 24 bytes a duck and 8 an entry (one per
	 * (token, expert): MAX_TOKENS x MAX_TOPK), and the ducks' reply row maps, one u16 per
	 * entry at most; plus one wire table being built. With the defaults (64 contexts) that
	 * is 40 MiB of address space per worker, whatever max_forward_bytes, touched only by
	 * the routed forwards that use it. */
	uint64_t entries = (uint64_t)DP_MAX_TOKENS * DP_MAX_TOPK;
	uint64_t wire_cap = DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE * DP_MAX_DUCKS +
			    DP_ROUTING_WIRE_ENTRY_SIZE * entries;
	uint64_t table_cap = (DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE) *
				     DP_MAX_DUCKS + DP_ROUTING_WIRE_ENTRY_SIZE * entries;
	uint32_t map_cap = (uint32_t)entries;
	wk->moe_wire = calloc(1, wire_cap);
	wk->moe_tables = calloc(nf, table_cap);
	wk->moe_maps = calloc(nf * map_cap, sizeof(uint16_t));
	wk->moe_live = calloc(1, sizeof(*wk->moe_live));
	wk->moe_live_slots = calloc((size_t)DP_MAX_EXPERTS * DP_MAX_REPLICAS, sizeof(uint16_t));
	/* failover messages: address space like the tables', touched only when a duck fails */
	wk->fo = calloc(nf * DP_FO_MAX, sizeof(struct dp_duck_rx));
	wk->fo_tables = calloc(nf, table_cap);
	wk->fo_maps = calloc(nf * map_cap, sizeof(uint16_t));
	if (!wk->owned || !wk->hdrs || !wk->next_nack || !wk->sent_ns || !wk->scratch ||
	    !wk->summed || !wk->active || !wk->release.parts || !wk->moe_wire ||
	    !wk->moe_tables || !wk->moe_maps || !wk->moe_live || !wk->moe_live_slots ||
	    !wk->fo || !wk->fo_tables || !wk->fo_maps) {
		dp_set_error("nic %s: out of memory for %zu forward contexts", cfg->name, nf);
		return -1;
	}
	wk->release.be = &wk->be;
	wk->release.nic = nic;
	wk->release.counters = &wk->counters;
	wk->tx.be = &wk->be;
	wk->tx.session = w->session;
	wk->tx.payload = wk->payload;
	/* gather's view: of the world only what it reads, its limits copied (in ns) */
	wk->gather = (struct dp_gather_view){ .limits = gather_limits(&w->cfg),
					      .session = w->session,
					      .duck_index = w->duck_index,
					      .duck_cfg = w->cfg.ducks,
					      .nic_cfg = cfg,
					      .nic = nic,
					      .payload = wk->payload,
					      .nducks = wk->nducks,
					      .ducks = wk->ducks,
					      .rto = wk->rto,
					      .counters = &wk->counters,
					      .tx = &wk->tx,
					      .hdrs = wk->hdrs,
					      .max_chunks = wk->max_chunks,
					      .scratch = wk->scratch,
					      .summed = wk->summed,
					      .scratch_floats = wk->scratch_floats,
					      .nack_seen = &wk->nack_seen,
					      .nic_ducks = wk->nic_ducks,
					      .moe_wire = wk->moe_wire,
					      .moe_wire_cap = wire_cap,
					      .moe_tables = wk->moe_tables,
					      .moe_table_cap = table_cap,
					      .moe_maps = wk->moe_maps,
					      .moe_map_cap = map_cap,
					      .moe_live = wk->moe_live,
					      .moe_live_slots = wk->moe_live_slots,
					      .fo = wk->fo,
					      .fo_tables = wk->fo_tables,
					      .fo_maps = wk->fo_maps };
	wk->weight = (struct dp_weight_view){ .w = w,
					      .nic = nic,
					      .payload = wk->payload,
					      .counters = &wk->counters,
					      .tx = &wk->tx,
					      .hdrs = wk->hdrs,
					      .sent_ns = wk->sent_ns,
					      .max_chunks = wk->max_chunks };
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
	DP_INFO("nic %s: %s backend, %u ducks, %u-byte chunks, GSO %s, GRO %s, %s, inbox %s",
		cfg->name, wk->be.ops->name, wk->nducks, wk->payload, wk->be.gso ? "on" : "off",
		wk->be.gro ? "on" : "off", cfg->use_broadcast ? "broadcast" : "unicast fan-out", dp_inbox_kind_name(&wk->in));
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
	if (wk->scratch)
		munmap(wk->scratch, wk->scratch_len);
	free(wk->summed);
	free(wk->active);
	free(wk->release.parts);
	free(wk->moe_wire);
	free(wk->moe_tables);
	free(wk->moe_maps);
	free(wk->fo);
	free(wk->fo_tables);
	free(wk->fo_maps);
	free(wk->moe_live);
	free(wk->moe_live_slots);
}
