/* dp_world.h: the state the agents share, and who writes what.
 *
 *   control agent   ZeroMQ ROUTER: attach/detach, layers, epochs, stats,
 *                   completions; heartbeats and dead-client reclamation
 *   dispatcher      polls every client's ring, validates, hands forwards to
 *                   the NIC workers through one SPSC ring each
 *   NIC worker xN   sends, receives, reassembles, NACKs, reduces, loads weights
 *
 * Agents (struct dp_agent, dp_agent.h) talk only through SPSC rings of pointers
 * (dp_spsc.h) and atomics: no locks. Forward contexts (struct dp_fwd, dp_fwd.{c,h}:
 * their whole life) cycle
 *   dispatcher (dp_fwd_alloc) -> worker(s) (dp_fwd_part_done; the last NIC
 *   out dp_fwd_finish, or the dispatcher itself) -> agent completion ring ->
 *   control (dp_fwd_summarize: ZeroMQ completion; dp_fwd_release) -> free ring
 *   -> dispatcher (dp_fwd_pool_refill).
 * The clients it holds: dp_client.h; the layer table's entries: dp_layers.h.
 */
#ifndef DP_WORLD_H
#define DP_WORLD_H

#include <stdint.h>

#include "dp_abi.h"
#include "dp_barrier.h"
#include "dp_client.h"
#include "dp_config.h"
#include "dp_counters.h"
#include "dp_spsc.h"
#include "dp_waker.h"

/* Pointers an agent takes off one of the rings below at a time. */
#define DP_BURST 32

struct dp_fwd;    /* dp_fwd.h */
struct dp_layer;  /* dp_layers.h */
struct dp_worker; /* dp_worker.h */

struct dp_world {
	struct dp_config cfg;
	int backend_argc;               /* options after "--" (EAL's, for dpdk) */
	char **backend_argv;
	uint64_t session;
	uint64_t epoch;                 /* control writes (release); others acquire */
	uint32_t running;
	struct dp_client clients[DP_MAX_CLIENTS];
	struct dp_layer *layers[DP_LAYER_TABLE]; /* control inserts; dispatcher reads */
	uint64_t dispatch_passes;       /* dispatcher: passes over the clients finished */
	int16_t duck_index[DP_MAX_DUCKS]; /* duck id -> topology index, or -1 */
	/* forward contexts */
	struct dp_fwd *fwds;
	uint32_t nfwds;
	struct dp_spsc free_ring;       /* control -> dispatcher: released contexts */
	struct dp_spsc dispatch_done;   /* dispatcher -> control: completions */
	struct dp_worker *workers[DP_MAX_NICS];
	struct dp_counters dispatch_counters;
	struct dp_counters control_counters;
	uint64_t duck_seen_ns[DP_MAX_DUCKS]; /* last PONG or reply; worker writes */
	/* ducks known lost: the stats tick's DuckState LOST (nothing heard for
	 * max(duck_lost_ms, 3 pings)), set and cleared by the control agent (relaxed stores,
	 * a word at a time), read by the dispatcher once per routed forward (relaxed loads:
	 * any mix of two ticks is a set of ducks each lost at some moment, and the forward
	 * keeps its one copy, dp_fwd.h lost) */
	uint64_t lost_ducks[DP_MAX_DUCKS / 64];
	struct dp_waker *wakers[DP_MAX_NICS + 2]; /* one per runner thread: Stats reads them */
	uint32_t nwakers;
	struct dp_waker *dispatch_waker; /* its runner's, for the control agent to kick; NULL
					  * when they share a thread */
};

/* Stop every runner: clear running, wake the parked (async-signal-safe). */
static inline void dp_world_stop(struct dp_world *w)
{
	dp_store_release_u32(&w->running, 0);
	for (uint32_t i = 0; i < w->nwakers; i++)
		dp_waker_stop(w->wakers[i]);
}

/* The address of duck `id`, one of the topology's (duck_index[id] >= 0). */
static inline const struct sockaddr_in *dp_duck_addr(const struct dp_world *w, uint32_t id)
{
	return &w->cfg.ducks[w->duck_index[id]].addr;
}

#endif /* DP_WORLD_H */
