/* dp_layers.h: the layer table's entries (struct dp_layer), how the dispatcher and the
 * workers look them up and hold them, and how the control agent owns, unpublishes and
 * frees them (dp_layers.c). */
#ifndef DP_LAYERS_H
#define DP_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_barrier.h"
#include "dp_client.h"
#include "dp_routing.h"
#include "dp_world.h"

struct dp_ctl_load_weights; /* dp_ctl_gen.h */

/* DP_LAYER_TABLE (8192, open addressing, a power of two) comes from the schema (dp_abi.h):
 * the config check DP_MAX_CLIENTS * client_max_layers <= DP_LAYER_TABLE (dp_config.c)
 * keeps clients at their quota from filling the table for the others. */
_Static_assert((DP_LAYER_TABLE & (DP_LAYER_TABLE - 1)) == 0, "DP_LAYER_TABLE: a power of two");

/* What a mixture-of-experts layer (kind MOE) adds to a layer: where its routed experts
 * are, and where each sits in its ducks' banks. Built once at LoadWeights from the
 * request (dp_layer_moe_build), checked there, never changed after: the dispatcher (its
 * targets) and the workers (the wire tables, dp_moe.c) only read it. About 34 KiB, so it
 * hangs off the layer instead of growing every dense one. */
struct dp_layer_moe {
	struct dp_routing_placement pl; /* checked with dp_routing_placement_check */
	/* slots[e * DP_MAX_REPLICAS + r]: expert e's index in the bank of its r-th duck */
	uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS];
	uint16_t experts_on[DP_MAX_DUCKS]; /* routed experts in each duck's bank, by duck id */
	uint32_t expert_ffn;               /* columns of each routed expert */
	bool has_shared;                   /* every duck holds >= 1 shared-expert column */
};

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
	/* ducks that answered a forward with NO_LAYER since the commit (they restarted): the
	 * layer is not ready on them until a reload (workers: atomic or; control reads) */
	uint64_t lost_ducks[DP_MAX_DUCKS / 64];
	uint64_t outstanding;    /* chunks dispatched and not yet completed (atomic) */
	/* bytes acknowledged per duck and tensor (atomic adds) */
	uint64_t acked[DP_MAX_DUCKS][DP_SHARD_TENSORS];
	uint8_t announced[DP_MAX_DUCKS];  /* LAYER acknowledged by the duck: its NIC's worker only */
	uint8_t *b_down_raw;     /* dispatcher: bytes of b_down as they arrive */
	uint64_t b_down_got;     /* dispatcher: b_down bytes so far (they arrive in order) */
	/* dispatcher: each tensor's next byte due */
	uint64_t next_offset[DP_MAX_DUCKS][DP_SHARD_TENSORS];
	float *b_down;           /* float32, set at commit */
	struct dp_layer_moe *moe; /* kind MOE only, else NULL */
};

/* Bytes of shard tensor t of ducks[i]: dp_shard_tensor_bytes (dp_desc_check.h), the
 * sizes the descriptor check holds weight chunks to. */
static inline uint64_t dp_tensor_bytes(const struct dp_layer *l, uint32_t i, uint32_t t)
{
	return dp_shard_tensor_bytes(l->kind, l->dtype, l->hidden, l->shard[i], t);
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

/* --- the control agent's side ------------------------------------------------------ */

void dp_layer_free(struct dp_layer *l);

/* The table slot holding layer id, or -1. */
int dp_layer_slot(const struct dp_world *w, uint32_t id);

/* Take the layer in table slot `slot` out of the table, onto the retired list; its
 * memory goes later, and until then it counts against its owner's quotas as retired
 * (struct dp_client's retired_layers and retired_bytes). */
void dp_layer_unpublish(struct dp_world *w, uint32_t slot, struct dp_layer **retired);

/* Every layer `owner` (a client id) holds leaves the table (it detached or died). */
void dp_layers_unload_owner(struct dp_world *w, uint32_t owner, struct dp_layer **retired);

/* Free the retired layers no forward holds and no dispatcher pass can still see (all of
 * them when every agent has stopped), each off its owner's retired counts; how many were
 * freed. */
uint32_t dp_layers_free_retired(struct dp_world *w, struct dp_layer **retired, bool all);

/* Kind MOE: check the request's placement and banks (the refusals of LoadWeights for a
 * mixture of experts) and hang l->moe off l, whose ducks, index and shards are filled
 * already; dense kinds: refuse any MoE field. 0, or -1 with why (an Error reply). */
int dp_layer_moe_build(struct dp_layer *l, const struct dp_ctl_load_weights *m, char *why,
		       size_t n);

/* "duck 5 (experts 40 41 ...)": the duck and the routed experts its bank holds in l, cut
 * with "..." to fit n bytes; "duck 5 (shared expert only)"; for a dense layer "duck 5".
 * Returns snprintf's. (What a failed forward's message says of a duck.) */
int dp_layer_describe_duck(const struct dp_layer *l, uint32_t duck, char *buf, size_t n);

/* Bytes a layer plan stands for, against its owner's client_max_weight_bytes: every
 * duck's shards, b_down (raw and float), and a MoE layer's placement and state
 * (dp_layer_state_bytes); UINT64_MAX when that does not fit (a config may raise
 * max_hidden and max_ffn to 2^32). */
uint64_t dp_layer_plan_bytes(const struct dp_ctl_load_weights *m);
/* Of those, what the dataplane holds besides the weights: DP_MOE_LAYER_STATE_BYTES for a
 * MoE layer (struct dp_layer_moe and struct dp_layer), else 0. */
uint64_t dp_layer_state_bytes(const struct dp_ctl_load_weights *m);

#endif /* DP_LAYERS_H */
