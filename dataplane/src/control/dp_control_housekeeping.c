/* dp_control_housekeeping.c: the control agent's chores. Each pass it faults in a step
 * of the segments being attached (answering Attached when one is in) and hands those
 * being let go to the reaper (dp_reaper.h), freeing their slots once it unmapped them;
 * every HOUSEKEEPING_NS it writes the dataplane's heartbeat into every
 * attached segment, reclaims clients whose process died or whose heartbeat stopped, frees
 * the retired layers nobody can still hold and wakes a parked dispatcher that someone
 * waits for. Called by the control agent's do_work (dp_control.c).
 */
#include "dp_control_internal.h"

#include <stdio.h>
#include <unistd.h>

#include "dp_client.h"
#include "dp_layers.h"
#include "dp_waker.h"

#define ATTACH_STEP (8u << 20) /* bytes faulted in per pass */

/* The segment is in: the client turns ACTIVE and hears Attached. */
static void attach_done(struct dp_control *c, struct dp_client *cl)
{
	cl->hdr->dataplane_pid = (uint32_t)getpid();
	cl->hdr->client_id = cl->id;
	dp_store_relaxed_u64(&cl->hdr->dataplane_heartbeat_ns, dp_now_ns());
	/* release: the dispatcher that sees ACTIVE sees the mapping */
	dp_store_release_u32(&cl->state, DP_CLIENT_ACTIVE);
	dp_count(c->counters, DP_C_clients_attached, 1);
	if (cl->mem.registered) {
		dp_count(c->counters, DP_C_extmem_registered, 1);
		dp_count(c->counters, DP_C_extmem_registered_bytes, cl->mem.len);
	}
	DP_INFO("client %u (pid %u uid %u, %s) attached %s, %zu MiB", cl->id, cl->pid, cl->uid,
		cl->name, cl->path, cl->size >> 20);
	PACK(c, attached, .req_id = cl->attach_rid, .client_id = cl->id,
	     .epoch = dp_load_acquire_u64(&c->w->epoch), .session = c->w->session,
	     .dataplane_pid = (uint64_t)getpid(), .mode = c->w->cfg.nics[0].backend,
	     .ducks = c->w->cfg.nducks, .default_timeout_us = c->w->cfg.default_timeout_us,
	     .max_forward_bytes = c->w->cfg.max_forward_bytes,
	     .max_timeout_us = c->w->cfg.max_timeout_us);
	dp_control_send_to(c, cl->identity, cl->identity_len);
	dp_waker_kick(c->w->dispatch_waker); /* a parked dispatcher arms the new ring too */
}

/* Segments are faulted in at attach ATTACH_STEP bytes per pass, so that a large one on
 * small pages (0.3 s per GiB) never stalls the dispatcher and workers sharing this thread
 * for longer than a step: about 2 ms on 4 KiB pages. After detach the reaper unmaps them:
 * there the unmap (0.2 s per GiB) and, for a client that closed its memfd first, the
 * kernel's free of its memory (40-70 ms per 512 MiB: no step bounds that one) stall
 * nobody. Returns the work done (none while the reaper has a segment: it kicks). */
int dp_control_attach_steps(struct dp_control *c)
{
	int work = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &c->w->clients[i];
		uint32_t state = dp_load_acquire_u32(&cl->state); /* only this agent moves these two */
		if (state == DP_CLIENT_ATTACHING) {
			work++;
			int rc = dp_client_populate(cl, ATTACH_STEP);
			if (rc > 0) {
				attach_done(c, cl);
			} else if (rc < 0) {
				struct dp_peer p = { .id = cl->identity, .idlen = cl->identity_len,
						     .rid = cl->attach_rid, .pid = cl->pid, .uid = cl->uid };
				dp_control_refuse(c, &p, DP_ERROR_CODE_BAD_SEGMENT, "%s",
				                  dp_error());
				dp_client_unmap(cl); /* by the reaper, whenever: nobody waits */
				dp_store_release_u32(&cl->state, DP_CLIENT_FREE);
			}
		} else if (state == DP_CLIENT_UNMAPPING && !dp_client_reaping(cl)) {
			work++;
			if (dp_client_let_go(cl, c->waker) > 0) {
				/* counted once the range is free: the next mapping may land there */
				if (cl->was_registered)
					dp_count(c->counters, DP_C_extmem_unregistered, 1);
				dp_client_close_doorbell(cl); /* the dispatcher let go of it */
				dp_layers_unload_owner(c->w, cl->id, &c->retired); /* its layers go with it */
				if (cl->dead)
					dp_count(c->counters, DP_C_clients_reclaimed, 1);
				dp_store_release_u32(&cl->state, DP_CLIENT_FREE);
			}
		}
	}
	return work;
}

/* The dataplane's heartbeat into every attached segment; a client whose process died or
 * whose heartbeat stopped is reclaimed (CLOSING), and one the dispatcher let go
 * (QUIESCED) is unmapped once none of its forwards is in flight. */
static void housekeeping_clients(struct dp_control *c, uint64_t now)
{
	struct dp_world *w = c->w;
	uint64_t stale = (uint64_t)w->cfg.client_timeout_ms * 1000000ull;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&cl->state);
		if (state == DP_CLIENT_ACTIVE) {
			dp_store_relaxed_u64(&cl->hdr->dataplane_heartbeat_ns, now);
			uint64_t beat = dp_load_relaxed_u64(&cl->hdr->client_heartbeat_ns);
			if (!dp_process_alive(cl->pid, cl->start_ticks) || (beat < now && now - beat > stale)) {
				DP_WARN("client %u (pid %u) is gone; reclaiming %s", cl->id, cl->pid,
					cl->path);
				cl->dead = true;
				dp_store_release_u32(&cl->state, DP_CLIENT_CLOSING);
			}
		} else if (state == DP_CLIENT_QUIESCED &&
			   __atomic_load_n(&cl->inflight, __ATOMIC_ACQUIRE) == 0) {
			/* a memfd needs no unlink: its memory goes with the last mapping, which
			 * dp_control_attach_steps hands to the reaper */
			dp_store_release_u32(&cl->state, DP_CLIENT_UNMAPPING);
		}
	}
}

static void housekeeping_layers(struct dp_control *c)
{
	dp_control_settle_moves(c);
	dp_count(c->counters, DP_C_layers_freed, dp_layers_free_retired(c->w, &c->retired, false));
}

/* A parked dispatcher makes no passes: wake it when a client waits for it to let go
 * (CLOSING) or a retired layer for its next pass (dp_layers_free_retired). */
static void nudge_dispatcher(struct dp_control *c)
{
	bool waits = c->retired != NULL;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && !waits; i++)
		waits = dp_load_acquire_u32(&c->w->clients[i].state) == DP_CLIENT_CLOSING;
	if (waits)
		dp_waker_kick(c->w->dispatch_waker);
}

void dp_control_housekeeping(struct dp_control *c, uint64_t now)
{
	housekeeping_clients(c, now);
	housekeeping_layers(c);
	nudge_dispatcher(c);
}
