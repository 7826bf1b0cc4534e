/* dp_control_outbox.c: completions, from the rings the dispatcher and the NIC workers
 * fill (struct dp_world's dispatch_done, each worker's done) to the clients' sockets.
 * Each finished context is summarised (dp_fwd_summarize, recorded in the stats segment),
 * packed into a Completion, released to the dispatcher (dp_fwd_release) and held in the
 * outbox until completion_flush_us has passed or the outbox is full, then sent with the
 * others in one burst. Called by the control agent's do_work and park (dp_control.c).
 *
 * No completion is lost without being counted. The socket is ROUTER_MANDATORY: a client
 * with ROUTER_SNDHWM messages unread (one that does not read, or whose reading a loaded
 * machine delays: a 60 s soak lost 60 of 128 this way while completions_sent counted
 * them) refuses the send, and its completion is held (completions_held) in this agent's
 * memory, its forward still counted in flight, until the socket takes it: the client's
 * quota bounds what it can hold, and its later forwards wait in its ring meanwhile. A
 * completion is dropped (completions_dropped) only when its client's connection is gone
 * or the client has left; its done word had told the client anyway.
 */
#include "dp_control_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "dp_client.h"
#include "dp_fwd.h"
#include "dp_spsc.h"
#include "dp_stats.h"
#include "dp_waker.h"
#include "dp_worker.h"

/* After an offer of the held completions that sent nothing, the next comes this much later,
 * doubled each time up to HELD_RETRY_MAX_NS; a wake-up by ZeroMQ's fd (a client read:
 * dp_control_unpark) offers them at once. A client that never reads costs a send attempt
 * every 20 ms, not a spinning agent. */
#define HELD_RETRY_MIN_NS 100000ull    /* 100 us */
#define HELD_RETRY_MAX_NS 20000000ull  /* 20 ms */

static uint32_t client_index(const struct dp_control *c, const struct dp_client *cl)
{
	return (uint32_t)(cl - c->w->clients);
}

/* Still the client the completion was packed for, and still attached? A client that
 * detached or died is owed nothing more on its socket (and its segment waits for its
 * in-flight count to reach 0). */
static bool still_there(const struct dp_client *cl, const uint8_t *id, size_t idlen)
{
	return dp_load_acquire_u32(&cl->state) == DP_CLIENT_ACTIVE &&
	       cl->identity_len == idlen && memcmp(cl->identity, id, idlen) == 0;
}

static void count_dropped(struct dp_control *c, uint32_t n, const char *why)
{
	DP_DEBUG("%u completions dropped: %s", n, why);
	dp_count(c->counters, DP_C_completions_dropped, n);
}

/* Keep msg for cl until its socket takes it, or drop it (counted) when that cannot be. */
static void hold(struct dp_control *c, struct dp_client *cl, const uint8_t *id, size_t idlen,
		 const void *msg, size_t len)
{
	if (!still_there(cl, id, idlen)) {
		count_dropped(c, 1, "the client left");
		return;
	}
	struct dp_held *m = malloc(sizeof(*m) + len);
	if (!m) {
		count_dropped(c, 1, "out of memory");
		return;
	}
	m->next = NULL;
	m->len = len;
	memcpy(m->data, msg, len);
	struct dp_held_list *h = &c->held[client_index(c, cl)];
	if (h->tail)
		h->tail->next = m;
	else
		h->head = m;
	h->tail = m;
	h->n++;
	if (c->nheld++ == 0) {
		c->held_backoff = HELD_RETRY_MIN_NS;
		c->held_retry = dp_now_ns() + c->held_backoff;
	}
	/* its forward stays in flight until the completion leaves: the dispatcher's quota
	 * (which reads inflight) bounds what one client can have held */
	dp_fetch_add_u64(&cl->inflight, 1);
	dp_count(c->counters, DP_C_completions_held, 1);
}

/* One completion to its client: sent, held while its socket is full, or dropped (counted)
 * when its peer is gone. Behind completions already held for it, it waits its turn. */
static void deliver(struct dp_control *c, struct dp_client *cl, const uint8_t *id,
		    size_t idlen, const void *msg, size_t len)
{
	if (c->held[client_index(c, cl)].head) {
		hold(c, cl, id, idlen, msg, len);
		return;
	}
	if (dp_control_send_msg(c, id, idlen, msg, len) == 0)
		dp_count(c->counters, DP_C_completions_sent, 1);
	else if (errno == EAGAIN)
		hold(c, cl, id, idlen, msg, len);
	else
		count_dropped(c, 1, zmq_strerror(errno));
}

/* Send every completion in the outbox, oldest first, in one burst: ZeroMQ wakes its I/O
 * thread (and the client's) once for the burst, not once a message. On a shared core those
 * wake-ups cost a forward more than everything else the handoff does (README). */
void dp_control_flush_outbox(struct dp_control *c)
{
	for (uint32_t i = 0; i < c->noutbox; i++) {
		const struct dp_outbox_entry *e = &c->outbox[i];
		deliver(c, e->client, e->identity, e->identity_len, c->outbox_buf + e->off, e->len);
	}
	if (c->noutbox)
		dp_count(c->counters, DP_C_completion_flushes, 1);
	c->noutbox = 0;
	c->outbox_used = 0;
}

/* Forget cl's held completions, each counted as dropped, and its forwards with them. */
static void drop_held(struct dp_control *c, struct dp_client *cl, const char *why)
{
	struct dp_held_list *h = &c->held[client_index(c, cl)];
	if (!h->n)
		return;
	count_dropped(c, h->n, why);
	for (struct dp_held *m = h->head, *next; m; m = next) {
		next = m->next;
		free(m);
	}
	dp_fetch_add_u64(&cl->inflight, -(int64_t)h->n);
	c->nheld -= h->n;
	*h = (struct dp_held_list){ 0 };
	/* its forwards are done with: a client that was at its quota may have descriptors
	 * waiting in its ring, which a parked dispatcher looks at again only when woken */
	dp_waker_kick(c->w->dispatch_waker);
}

/* Offer cl's held completions, oldest first, until its socket refuses one; how many left. */
static int retry_client(struct dp_control *c, struct dp_client *cl)
{
	struct dp_held_list *h = &c->held[client_index(c, cl)];
	int sent = 0;
	if (dp_load_acquire_u32(&cl->state) != DP_CLIENT_ACTIVE) {
		drop_held(c, cl, "the client left");
		return 0;
	}
	while (h->head) {
		struct dp_held *m = h->head;
		if (dp_control_send_msg(c, cl->identity, cl->identity_len, m->data, m->len) < 0) {
			if (errno != EAGAIN)
				drop_held(c, cl, zmq_strerror(errno)); /* its connection is gone */
			break;
		}
		h->head = m->next;
		if (!h->head)
			h->tail = NULL;
		h->n--;
		c->nheld--;
		free(m);
		dp_fetch_add_u64(&cl->inflight, -1); /* now its forward is done with */
		sent++;
	}
	if (sent)
		dp_count(c->counters, DP_C_completions_sent, (uint64_t)sent);
	return sent;
}

int dp_control_retry_held(struct dp_control *c, uint64_t now)
{
	int sent = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && c->nheld; i++)
		if (c->held[i].head)
			sent += retry_client(c, &c->w->clients[i]);
	/* nothing taken: the clients still do not read; ask less often */
	c->held_backoff = sent ? HELD_RETRY_MIN_NS
			       : (c->held_backoff * 2 < HELD_RETRY_MAX_NS ? c->held_backoff * 2
									  : HELD_RETRY_MAX_NS);
	c->held_retry = now + c->held_backoff;
	/* a client at its quota has descriptors waiting in its ring, which a parked dispatcher
	 * looks at again only when woken: no context came back to its free ring to kick it */
	if (sent)
		dp_waker_kick(c->w->dispatch_waker);
	return sent;
}

uint64_t dp_control_held_due(const struct dp_control *c)
{
	return c->nheld ? c->held_retry : UINT64_MAX;
}

void dp_control_free_held(struct dp_control *c)
{
	if (c->nheld)
		dp_control_retry_held(c, dp_now_ns());
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && c->nheld; i++)
		drop_held(c, &c->w->clients[i], "the dataplane stops");
}

/* Does a client with a completion in the outbox wait for it (completions_wanted, set by
 * dp_completions_want in dp_wake.h)? A hint read from the client's own line: a wrong one
 * costs a burst sent early or late, nothing else. Only an attached client's segment is
 * read: this agent alone unmaps them, so it is mapped for the whole pass. */
static bool client_wants(const struct dp_client *cl)
{
	return dp_load_acquire_u32(&cl->state) == DP_CLIENT_ACTIVE &&
	       __atomic_load_n(&cl->hdr->completions_wanted, __ATOMIC_RELAXED) != 0;
}

/* The completion just packed into c->sbuf, for client cl: into the outbox. The slot's done
 * word already told the client; this carries the timings and duck lists, a little later. */
static void queue_completion(struct dp_control *c, struct dp_client *cl)
{
	if (c->noutbox == OUTBOX_MAX || c->outbox_used + c->sbuf.size > OUTBOX_BYTES)
		dp_control_flush_outbox(c);
	if (c->sbuf.size > OUTBOX_BYTES || c->w->cfg.completion_flush_us == 0) {
		/* no waiting asked for */
		deliver(c, cl, cl->identity, cl->identity_len, c->sbuf.data, c->sbuf.size);
		return;
	}
	struct dp_outbox_entry *e = &c->outbox[c->noutbox++];
	e->client = cl;
	memcpy(e->identity, cl->identity, cl->identity_len);
	e->identity_len = cl->identity_len;
	e->off = c->outbox_used;
	e->len = c->sbuf.size;
	memcpy(c->outbox_buf + e->off, c->sbuf.data, e->len);
	c->outbox_used += e->len;
	if (c->noutbox == 1)
		c->outbox_since = dp_now_ns();
	/* a client waiting for it (client_wants) gets it at the end of this pass's drain, in
	 * one burst with the rest (dp_control_do_work), not one burst per completion */
}

bool dp_control_outbox_wanted(const struct dp_control *c)
{
	for (uint32_t i = 0; i < c->noutbox; i++)
		if (client_wants(c->outbox[i].client))
			return true;
	return false;
}

/* When the outbox must be flushed (UINT64_MAX: it is empty). */
uint64_t dp_control_outbox_due(const struct dp_control *c)
{
	return c->noutbox ? c->outbox_since + (uint64_t)c->w->cfg.completion_flush_us * 1000
			  : UINT64_MAX;
}

static void send_completion(struct dp_control *c, struct dp_fwd *f)
{
	struct dp_world *w = c->w;
	struct dp_client *cl = f->client;
	struct dp_fwd_summary s;
	dp_fwd_summarize(w, f, &s);
	dp_stats_completion(c->stats, f, &s, dp_now_ns());
	PACK(c, completion, .forward_id = f->desc.forward_id, .slot = f->desc.slot,
	     .generation = f->desc.generation, .epoch = f->desc.epoch, .status = f->status,
	     .answered = s.answered, .answered_len = s.nanswered, .missing = s.missing,
	     .missing_len = s.nmissing,
	     .timings = {
		     .prepare_ns = s.phases.prepare_ns,
		     .send_ns = s.phases.send_ns,
		     .wait_ns = s.phases.wait_ns,
		     .fetch_ns = s.phases.fetch_ns,
		     .reduce_ns = s.phases.reduce_ns,
		     .spread_ns = s.phases.spread_ns,
		     .duck_compute_ns = s.compute_ns,
		     .duck_compute_ns_len = s.nanswered,
	     },
	     .message = f->message, .current_epoch = dp_load_acquire_u64(&w->epoch));
	queue_completion(c, cl);
	dp_fwd_release(w, f);
}

int dp_control_drain_completions(struct dp_control *c)
{
	struct dp_world *w = c->w;
	void *done[DP_BURST];
	int work = 0;
	uint32_t n;
	while ((n = dp_spsc_pop(&w->dispatch_done, done, DP_BURST)) > 0) {
		for (uint32_t i = 0; i < n; i++)
			send_completion(c, done[i]);
		work += (int)n;
	}
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		while ((n = dp_spsc_pop(&w->workers[k]->done, done, DP_BURST)) > 0) {
			for (uint32_t i = 0; i < n; i++)
				send_completion(c, done[i]);
			work += (int)n;
		}
	return work;
}
