/* dp_layers.c: the layer table as the control agent keeps it.
 *
 * A layer belongs to the client that loaded it. The control agent publishes it,
 * later unpublishes it (unload, reload, owner gone: a tombstone keeps the probe
 * chains whole) and frees it once two things hold: no forward or weight chunk
 * holds a reference (the dispatcher takes one, dp_layer_take; the control agent
 * drops it when the completion is sent), and the dispatcher finished a pass
 * that began after the unpublish, so no pointer it read from the table without
 * a reference is left.
 */
#include "dp_layers.h"

#include <stdlib.h>

#include "dp_ctl_gen.h"

struct dp_layer dp_layer_tombstone;

/* The attached client that loaded l, or NULL (it detached or died: nothing to count). */
static struct dp_client *owner_of(struct dp_world *w, const struct dp_layer *l)
{
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &w->clients[i];
		if (dp_load_acquire_u32(&cl->state) != DP_CLIENT_FREE && cl->id == l->owner)
			return cl;
	}
	return NULL;
}

void dp_layer_free(struct dp_layer *l)
{
	free(l->b_down_raw);
	free(l->b_down);
	free(l->moe);
	free(l);
}

/* l onto the retired list, counted on its owner's retired quota (the caller took it off
 * the held one, if it was there). */
static void retire(struct dp_world *w, struct dp_layer *l, struct dp_layer **retired)
{
	/* seq_cst: the dispatcher's pass that ends after this read cannot have missed the store */
	l->retired_pass = __atomic_load_n(&w->dispatch_passes, __ATOMIC_SEQ_CST);
	l->next_retired = *retired;
	*retired = l;
	struct dp_client *cl = owner_of(w, l);
	if (cl) {
		cl->retired_layers++;
		cl->retired_bytes += l->weight_bytes;
	}
}

void dp_layer_unpublish(struct dp_world *w, uint32_t slot, struct dp_layer **retired)
{
	struct dp_layer *l = w->layers[slot];
	dp_store_release_ptr((void **)&w->layers[slot], DP_LAYER_GONE);
	/* its memory stays until it is freed, so does its weight on the owner's quota: else
	 * reloads pipelined faster than forwards and passes let go of the old layers (one
	 * client, hidden 65536, 1 MiB quota: 430 MiB) outrun the quota */
	struct dp_client *cl = owner_of(w, l);
	if (cl) {
		cl->nlayers--;
		cl->weight_bytes -= l->weight_bytes;
	}
	retire(w, l, retired);
	/* a move still open goes with it: never published, held only by its chunks and
	 * forwards (it is no longer followed once l's pass is over) */
	if (l->moving)
		retire(w, l->moving, retired);
}

int dp_layer_settle_move(struct dp_world *w, uint32_t slot, struct dp_layer **retired)
{
	struct dp_layer *l = w->layers[slot];
	if (!l || l == DP_LAYER_GONE || !l->moving)
		return 1;
	struct dp_layer *m = l->moving;
	struct dp_client *cl = owner_of(w, l);
	if (dp_load_acquire_u32(&m->ready)) {
		/* the dispatcher switched already (dp_layer_take): the table follows. l keeps
		 * pointing at m for a dispatcher that read l before this store */
		dp_store_release_ptr((void **)&w->layers[slot], m);
		if (cl)
			cl->weight_bytes += m->weight_bytes - l->weight_bytes;
		retire(w, l, retired);
		return 0;
	}
	if (dp_load_acquire_u32(&m->failed)) {
		dp_store_release_ptr((void **)&l->moving, NULL); /* l serves on as it was */
		for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
			l->tainted[k] |= m->move_ducks[k];
		retire(w, m, retired);
		return 0;
	}
	return 1;
}

uint32_t dp_layers_free_retired(struct dp_world *w, struct dp_layer **retired, bool all)
{
	uint32_t n = 0;
	uint64_t passes = __atomic_load_n(&w->dispatch_passes, __ATOMIC_ACQUIRE);
	for (struct dp_layer **pl = retired; *pl;) {
		struct dp_layer *l = *pl;
		if (all || (passes > l->retired_pass &&
			    __atomic_load_n(&l->refs, __ATOMIC_ACQUIRE) == 0)) {
			*pl = l->next_retired;
			struct dp_client *cl = owner_of(w, l);
			if (cl) {
				cl->retired_layers--;
				cl->retired_bytes -= l->weight_bytes;
			}
			dp_layer_free(l);
			n++;
		} else {
			pl = &l->next_retired;
		}
	}
	return n;
}

int dp_layer_slot(const struct dp_world *w, uint32_t id)
{
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		uint32_t k = dp_layer_hash(id, i);
		const struct dp_layer *l = w->layers[k];
		if (!l)
			return -1;
		if (l != DP_LAYER_GONE && l->id == id)
			return (int)k;
	}
	return -1;
}

void dp_layers_unload_owner(struct dp_world *w, uint32_t owner, struct dp_layer **retired)
{
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		const struct dp_layer *l = w->layers[i];
		if (l && l != DP_LAYER_GONE && l->owner == owner)
			dp_layer_unpublish(w, i, retired);
	}
}

/* A MoE layer's placement and state are charged as DP_MOE_LAYER_STATE_BYTES
 * (dp_load_state_bytes), a number the mock dataplane charges too: it must not fall behind
 * what the layer really holds. */
_Static_assert(sizeof(struct dp_layer) + sizeof(struct dp_layer_moe) <= DP_MOE_LAYER_STATE_BYTES,
	       "raise MOE_LAYER_STATE_BYTES in duckpipe/schema/abi.py");

static struct dp_layer *build_refused(struct dp_layer *l, int *code, int rc)
{
	if (l)
		dp_layer_free(l);
	*code = rc;
	return NULL;
}

struct dp_layer *dp_layer_build(const struct dp_ctl_load_weights *m, int *code, char *why,
				size_t n)
{
	struct dp_layer *l = calloc(1, sizeof(*l));
	if (!l)
		return build_refused(l, code, dp_refuse(DP_ERROR_CODE_DATAPLANE_ERROR,
								  why, n, "out of memory"));
	dp_layer_fill(l, m);
	if (m->kind == DP_MLP_KIND_MOE && !(l->moe = malloc(sizeof(*l->moe))))
		return build_refused(l, code, dp_refuse(DP_ERROR_CODE_DATAPLANE_ERROR,
								  why, n, "out of memory"));
	int rc = dp_load_moe_plan(m, l->moe, why, n); /* dense: refuses MoE fields only */
	if (rc)
		return build_refused(l, code, rc);
	if (m->has_b_down) {
		l->b_down_raw = calloc(m->hidden, 4);
		l->b_down = calloc(m->hidden, sizeof(float));
		if (!l->b_down_raw || !l->b_down)
			return build_refused(l, code,
					     dp_refuse(DP_ERROR_CODE_DATAPLANE_ERROR, why,
							       n, "out of memory"));
	}
	return l;
}
