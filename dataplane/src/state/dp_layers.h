/* dp_layers.h: the layer table's entries (struct dp_layer), how the dispatcher and the
 * workers look them up and hold them, and how the control agent owns, unpublishes and
 * frees them (dp_layers.c). */
#ifndef DP_LAYERS_H
#define DP_LAYERS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_barrier.h"
#include "dp_client.h"
#include "dp_ctl_gen.h"
#include "dp_ctl_rules.h" /* struct dp_layer_moe; the LoadWeights rules */
#include "dp_routing.h"
#include "dp_world.h"

/* DP_LAYER_TABLE (8192, open addressing, a power of two) comes from the schema (dp_abi.h):
 * the config check DP_MAX_CLIENTS * client_max_layers <= DP_LAYER_TABLE (dp_config.c)
 * keeps clients at their quota from filling the table for the others. */
_Static_assert((DP_LAYER_TABLE & (DP_LAYER_TABLE - 1)) == 0, "DP_LAYER_TABLE: a power of two");

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
	uint8_t weight_dtype;    /* 0, or DP_DTYPE_F8E4M3: e4m3 weights with block scales */
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
	 * layer is not ready on them until a repair's commit or a reload (workers: atomic or;
	 * control reads; the dispatcher clears a repaired duck's bit: atomic and, release) */
	uint64_t lost_ducks[DP_MAX_DUCKS / 64];
	/* A repair (RepairLayer) restreams the banks of lost ducks into the committed layer.
	 * The control agent resets those ducks' books (next_offset, acked, announced,
	 * failed_ducks; nothing is in flight for them), sets repair_ducks and repaired_at,
	 * bumps repairs, then sets repairing (release); the dispatcher takes weight chunks for
	 * repair_ducks only while it sees repairing (acquire), and its repair commit clears
	 * the lost bits, then repair_ducks, then repairing (release). */
	uint64_t repair_ducks[DP_MAX_DUCKS / 64];
	uint32_t repairing;
	/* Repairs begun (control, release); a forward keeps the count it saw at dispatch
	 * (dp_fwd.repairs) and a partial from a duck whose latest repair began after it
	 * (repaired_at, by index) is refused as NO_LAYER would be: it may have been computed
	 * on a half-streamed bank (dp_gather_on_partial). */
	uint32_t repairs;
	uint32_t repaired_at[DP_MAX_DUCKS];
	/* A move (MoveLayer) to a new placement builds the layer as it will be beside this
	 * one, unpublished: `moving` (control sets it, release; clears it when the move
	 * failed). Its bank generation is this one's + 1 (`bank`: the ducks keep its new
	 * banks beside the old ones, and each FORWARD names the generation it was planned
	 * for); `move_ducks` are the ducks whose experts changed, the only ones it takes
	 * chunks for and checks at its commit. The dispatcher's commit sets its ready: from
	 * then on dp_layer_take gives it for this one (the switch; only the dispatcher takes
	 * layers), and the control agent later puts it in this one's table slot and retires
	 * this one (dp_layer_settle_move), whose forwards in flight finish on the old banks. */
	struct dp_layer *moving;
	uint64_t move_ducks[DP_MAX_DUCKS / 64];
	/* ducks a failed move gave a bank of generation bank + 1 (control): stale, it would
	 * answer the next move's forwards, so the next move sends them a bank too */
	uint64_t tainted[DP_MAX_DUCKS / 64];
	uint16_t bank;
	bool is_move;            /* this is a move's layer: its chunks count move_bytes */
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
	if (l->weight_dtype == DP_DTYPE_F8E4M3) /* e4m3 bytes and block scales (dp_fp8.h) */
		return dp_fp8_tensor_bytes(l->hidden, l->shard[i],
					   l->moe ? l->moe->experts_on[l->ducks[i]] : 0,
					   l->moe ? l->moe->expert_ffn : 0);
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
	/* a move open: its chunks and commit go to the layer as it will be; once its commit
	 * made that ready, forwards do too (acquire, both: control built it whole before it
	 * published it, and the commit publishes ready after its books) */
	struct dp_layer *m = dp_load_acquire_ptr((void *const *)&l->moving);
	if (m && (write || dp_load_acquire_u32(&m->ready)))
		l = m;
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

/* An open move of the layer in table slot `slot`, once its commit is in: done (its layer
 * ready), it takes the slot and the old layer is retired; failed, it is retired and the
 * old layer serves on. 1 while it is still open (or none), else 0. */
int dp_layer_settle_move(struct dp_world *w, uint32_t slot, struct dp_layer **retired);

/* Every layer `owner` (a client id) holds leaves the table (it detached or died). */
void dp_layers_unload_owner(struct dp_world *w, uint32_t owner, struct dp_layer **retired);

/* Free the retired layers no forward holds and no dispatcher pass can still see (all of
 * them when every agent has stopped), each off its owner's retired counts; how many were
 * freed. */
uint32_t dp_layers_free_retired(struct dp_world *w, struct dp_layer **retired, bool all);

/* The layer a LoadWeights describes, as the dispatcher and workers will read it: ducks,
 * shards and index, shape, a MoE layer's placement (dp_load_moe_plan) and the down bias
 * buffers; owner, shared and weight_bytes are the caller's. The request passed
 * dp_load_check. NULL with the enum dp_error_code in *code and the reason in why. The
 * one builder: the control agent, the C unit tests and the fuzz harnesses use it (the
 * harness of descriptors, which links no state, its dp_layer_fill). */
struct dp_layer *dp_layer_build(const struct dp_ctl_load_weights *m, int *code, char *why,
				size_t n);

/* dp_layer_build's part that allocates nothing: id, kind, dtype, hidden, ffn, b_down's
 * presence, and the ducks with their shards and index (each listed once: dp_load_check). */
static inline void dp_layer_fill(struct dp_layer *l, const struct dp_ctl_load_weights *m)
{
	memset(l->index, 0xff, sizeof(l->index));
	l->nducks = 0;
	for (uint32_t i = 0; i < m->ducks_len && i < DP_MAX_DUCKS; i++) {
		uint32_t duck = m->ducks[i];
		l->ducks[i] = (uint16_t)duck;
		l->shard[i] = m->shard_sizes[i];
		l->index[duck % DP_MAX_DUCKS] = (int16_t)i;
		l->nducks++;
	}
	l->id = m->layer;
	l->kind = (uint8_t)m->kind;
	l->dtype = (uint8_t)m->dtype;
	l->weight_dtype = (uint8_t)m->weight_dtype;
	l->hidden = m->hidden;
	l->ffn = m->ffn;
	l->has_b_down = m->has_b_down;
}

/* "duck 5 (experts 40 41 ...)": the duck and the routed experts its bank holds in l, cut
 * with "..." to fit n bytes; "duck 5 (shared expert only)"; for a dense layer "duck 5".
 * Returns snprintf's. (What a failed forward's message says of a duck.) */
int dp_layer_describe_duck(const struct dp_layer *l, uint32_t duck, char *buf, size_t n);

/* A MOE layer's placement as a Layers reply lists it (LayerInfo's expert_replicas,
 * expert_ducks and shared_ducks), so that every client, not only the loader, learns where
 * the experts are. Flattened per reply into the caller's words, never kept: a layer's
 * state stays what DP_MOE_LAYER_STATE_BYTES charges (DeepSeek-V3's 256 experts on 32
 * ducks are ~2 KiB). */
struct dp_moe_listing {
	uint32_t n_experts;  /* replicas: each expert's replica count */
	uint32_t n_placed;   /* ducks: every expert's ducks, expert by expert */
	uint32_t n_shared;   /* shared: the ducks whose bank holds shared-expert columns */
	uint32_t n_sets;     /* sets: with several shared sets, their sizes (shared by set) */
	const uint32_t *replicas, *ducks, *shared, *sets;
};

/* The words dp_layer_moe_list writes for MOE layer l: at most
 * DP_MAX_EXPERTS * (1 + DP_MAX_REPLICAS) + DP_MAX_DUCKS + DP_MAX_REPLICAS. */
size_t dp_layer_moe_list_words(const struct dp_layer *l);

/* l's placement into words (dp_layer_moe_list_words of them), described by *out. */
void dp_layer_moe_list(const struct dp_layer *l, uint32_t *words, struct dp_moe_listing *out);

#endif /* DP_LAYERS_H */
