/* dp_control_outbox.c: completions, from the rings the dispatcher and the NIC workers
 * fill (struct dp_world's dispatch_done, each worker's done) to the clients' sockets.
 * Each finished context is summarised (dp_fwd_summarize, recorded in the stats segment),
 * packed into a Completion, released to the dispatcher (dp_fwd_release) and held in the
 * outbox until completion_flush_us has passed or the outbox is full, then sent with the
 * others in one burst. Called by the control agent's do_work and park (dp_control.c).
 */
#include "dp_control_internal.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "dp_client.h"
#include "dp_fwd.h"
#include "dp_spsc.h"
#include "dp_stats.h"
#include "dp_worker.h"

/* Send every completion in the outbox, oldest first, in one burst: ZeroMQ wakes its I/O
 * thread (and the client's) once for the burst, not once a message. On a shared core those
 * wake-ups cost a forward more than everything else the handoff does (README). */
void dp_control_flush_outbox(struct dp_control *c)
{
	for (uint32_t i = 0; i < c->noutbox; i++) {
		const struct dp_outbox_entry *e = &c->outbox[i];
		if (zmq_send(c->router, e->identity, e->identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
		    zmq_send(c->router, c->outbox_buf + e->off, e->len, ZMQ_DONTWAIT) < 0)
			DP_DEBUG("completion dropped: %s", zmq_strerror(errno));
	}
	dp_count(c->counters, DP_C_completions_sent, c->noutbox);
	if (c->noutbox) {
		dp_count(c->counters, DP_C_completion_flushes, 1);
		dp_control_router_sent(c);
	}
	c->noutbox = 0;
	c->outbox_used = 0;
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
static void queue_completion(struct dp_control *c, const struct dp_client *cl)
{
	if (c->noutbox == OUTBOX_MAX || c->outbox_used + c->sbuf.size > OUTBOX_BYTES)
		dp_control_flush_outbox(c);
	if (c->sbuf.size > OUTBOX_BYTES || c->w->cfg.completion_flush_us == 0) {
		dp_control_send_to(c, cl->identity, cl->identity_len); /* no waiting asked for */
		dp_count(c->counters, DP_C_completions_sent, 1);
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
