/* dp_dataplane.h: the state the agents share, and who writes what.
 *
 *   control agent   ZeroMQ ROUTER: attach/detach, layers, epochs, stats,
 *                   completions; heartbeats and dead-client reclamation
 *   dispatcher      polls every client's ring, validates, hands forwards to
 *                   the NIC workers through one SPSC ring each
 *   NIC worker xN   sends, receives, reassembles, NACKs, reduces, loads weights
 *
 * Agents talk only through SPSC rings of pointers (dp_spsc.h) and atomics:
 * no locks. Forward contexts (struct dp_fwd, dp_fwd.{c,h}: their whole life) cycle
 *   dispatcher (dp_fwd_alloc) -> worker(s) (dp_fwd_part_done; the last NIC
 *   out dp_fwd_finish, or the dispatcher itself) -> agent completion ring ->
 *   control (dp_fwd_summarize: ZeroMQ completion; dp_fwd_release) -> free ring
 *   -> dispatcher (dp_fwd_pool_refill).
 */
#ifndef DP_DATAPLANE_H
#define DP_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_common.h"
#include "dp_mem.h"
#include "dp_config.h"
#include "dp_counters.h"
#include "dp_desc_check.h" /* struct dp_client_layout, dp_shard_tensor_bytes, dp_targets_has */
#include "dp_idle.h"
#include "dp_spsc.h"

/* DP_MAX_CLIENTS and DP_LAYER_TABLE (8192, open addressing, a power of two) come from the
 * schema (dp_abi.h): the config check DP_MAX_CLIENTS * client_max_layers <= DP_LAYER_TABLE
 * (dp_config.c) keeps clients at their quota from filling the table for the others. */
_Static_assert((DP_LAYER_TABLE & (DP_LAYER_TABLE - 1)) == 0, "DP_LAYER_TABLE: a power of two");
#define DP_BURST 32
#define DP_MSG_LEN 160

struct dp_backend;

/* --- clients -------------------------------------------------------------------- */

enum dp_client_state {
	DP_CLIENT_FREE = 0,
	DP_CLIENT_ACTIVE,    /* control -> ACTIVE after mapping; the dispatcher polls it */
	DP_CLIENT_CLOSING,   /* control: stop polling */
	DP_CLIENT_QUIESCED,  /* dispatcher: I stopped; control unmaps once inflight is 0 */
	DP_CLIENT_ATTACHING, /* control only: mapped, being faulted in a step at a time */
	DP_CLIENT_UNMAPPING, /* control only: being unmapped a step at a time */
};

struct dp_client {
	uint32_t state; /* enum dp_client_state, release/acquire */
	uint32_t id;
	uint32_t pid;
	uint32_t uid;   /* the peer's, from the control socket */
	bool dead;      /* its process died (counted as reclaimed) rather than detached */
	uint64_t start_ticks; /* the process's start, from /proc/<pid>/stat at attach */
	uint8_t identity[256];
	size_t identity_len;
	char name[64];
	char path[256]; /* the memfd's name, for people */
	uint64_t st_dev, st_ino; /* the memfd itself: one file is attached once */
	uint8_t *base;
	size_t size;
	size_t stepped;     /* control: bytes faulted in (ATTACHING) or unmapped (UNMAPPING) */
	uint64_t attach_rid; /* control: the Attach request answered once faulted in */
	struct dp_mem mem; /* the segment, registered for zero copy (dp_backend_mem_register) */
	struct dp_client_layout layout;
	/* Pointers below were computed at attach from the private plan. Through hdr the
	 * dataplane only writes its own line and reads the client's heartbeat. */
	struct dp_seg_header *hdr;
	struct dp_ring_header *ring;
	struct dp_desc *descs;
	struct dp_slot_header *slots;
	uint8_t *act;
	uint8_t *res;
	uint64_t ring_tail;      /* dispatcher: the consumer index; shm's tail is only a copy */
	uint64_t ring_head_seen; /* dispatcher: head never moves back */
	uint32_t nlayers;        /* control: layers it owns */
	uint64_t weight_bytes;   /* control: their weight_bytes */
	uint64_t inflight dp_cache_aligned;  /* dispatcher adds, control subtracts */
	uint64_t submitted dp_cache_aligned; /* dispatcher */
	uint64_t completed dp_cache_aligned; /* control */
};

/* --- layers ----------------------------------------------------------------------- */

/* A layer belongs to the client that loaded it (shared ones: loaded by the admin, usable
 * by all). The control agent publishes it in the table and later unpublishes it (unload,
 * reload, owner gone); it frees it only once no forward holds a reference (refs) and the
 * dispatcher finished a pass since (dispatch_passes): a pointer it read then is gone. */
struct dp_layer {
	uint32_t id;
	uint32_t owner;          /* client id of the loader */
	bool shared;             /* every client may use it */
	uint64_t weight_bytes;   /* counted against the owner's client_max_weight_bytes */
	uint64_t refs;           /* forwards and weight chunks holding it (dispatcher +, control -) */
	uint64_t retired_pass;   /* control: dispatch_passes when it was unpublished */
	struct dp_layer *next_retired; /* control's list of unpublished layers */
	uint8_t kind;
	uint8_t dtype;
	bool has_b_down;
	uint32_t hidden;
	uint32_t ffn;
	uint32_t nducks;
	uint16_t ducks[DP_MAX_DUCKS];
	uint32_t shard[DP_MAX_DUCKS]; /* FFN columns of ducks[i] */
	int16_t index[DP_MAX_DUCKS];  /* duck id -> i, or -1 */
	uint32_t ready;          /* control/dispatcher -> 1 at commit (release) */
	uint32_t failed;         /* a chunk failed, or the commit did: the load failed (release) */
	uint64_t failed_ducks[DP_MAX_DUCKS / 64]; /* ducks that did not acknowledge (atomic or) */
	uint64_t outstanding;    /* chunks dispatched and not yet completed (atomic) */
	/* bytes acknowledged per duck and tensor (atomic adds) */
	uint64_t acked[DP_MAX_DUCKS][DP_SHARD_TENSORS];
	uint8_t announced[DP_MAX_DUCKS];  /* LAYER acknowledged by the duck: its NIC's worker only */
	uint8_t *b_down_raw;     /* dispatcher: bytes of b_down as they arrive */
	uint64_t b_down_got;     /* dispatcher: b_down bytes so far (they arrive in order) */
	/* dispatcher: each tensor's next byte due */
	uint64_t next_offset[DP_MAX_DUCKS][DP_SHARD_TENSORS];
	float *b_down;           /* float32, set at commit */
};

/* Bytes of shard tensor t of ducks[i]: dp_shard_tensor_bytes (dp_desc_check.h), the
 * sizes the descriptor check holds weight chunks to. */
static inline uint64_t dp_tensor_bytes(const struct dp_layer *l, uint32_t i, uint32_t t)
{
	return dp_shard_tensor_bytes(l->kind, l->dtype, l->hidden, l->shard[i], t);
}

/* --- forward contexts ---------------------------------------------------------------- */

/* The contexts themselves, struct dp_fwd, and their cycle: dp_fwd.h. */

/* --- agents ----------------------------------------------------------------------------- */

struct dp_world;

/* An agent (Aeron's shape): do_work returns how much it did. The parking hooks let
 * the runner sleep when every agent on it is idle (dp_waker.h); each may be NULL. */
struct dp_agent {
	const char *name;
	int (*do_work)(struct dp_world *w, void *self, uint64_t now);
	/* at start: add the fds whose readiness means work to the runner's waker */
	int (*wait_on)(struct dp_world *w, void *self, struct dp_waker *wk);
	/* the runner armed its waker: -1 if work came after all, else ns until the agent's
	 * next timer (DP_PARK_FOREVER: none) */
	int64_t (*park)(struct dp_world *w, void *self, uint64_t now);
	void (*unpark)(struct dp_world *w, void *self); /* the runner woke up */
	void *self;
};

struct dp_fwd;    /* dp_fwd.h */
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
	char doorbell[64];              /* the dispatcher's doorbell address, '@' for abstract */
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

/* A table slot whose layer was removed: lookups probe on past it, inserts reuse it. */
extern struct dp_layer dp_layer_tombstone;
#define DP_LAYER_GONE (&dp_layer_tombstone)

static inline uint32_t dp_layer_hash(uint32_t id, uint32_t i)
{
	return (id * 2654435761u + i) & (DP_LAYER_TABLE - 1);
}

/* The layer with this id, or NULL (acquire: the control agent publishes). */
static inline struct dp_layer *dp_layer_find(struct dp_world *w, uint32_t id)
{
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		struct dp_layer *l =
			dp_load_acquire_ptr((void *const *)&w->layers[dp_layer_hash(id, i)]);
		if (!l)
			return NULL;
		if (l != DP_LAYER_GONE && l->id == id)
			return l;
	}
	return NULL;
}

/* Dispatcher: the layer `id` if client c may use it (its own, or a shared one to forward
 * on; weights only its owner writes), with a reference the control agent drops when the
 * completion is sent (dp_layer_put). */
static inline struct dp_layer *dp_layer_take(struct dp_world *w, uint32_t id,
					     const struct dp_client *c, bool write)
{
	struct dp_layer *l = dp_layer_find(w, id);
	if (!l || (l->owner != c->id && (write || !l->shared)))
		return NULL;
	__atomic_fetch_add(&l->refs, 1, __ATOMIC_RELAXED); /* published by the pass's end */
	return l;
}

static inline void dp_layer_put(struct dp_layer *l)
{
	/* release: everything done with the layer happens before its free */
	__atomic_fetch_sub(&l->refs, 1, __ATOMIC_RELEASE);
}

#endif /* DP_DATAPLANE_H */
