/* dp_layers.h: owning, unpublishing and freeing layers (the control agent's side). */
#ifndef DP_LAYERS_H
#define DP_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_ctl_gen.h"
#include "dp_dataplane.h"

void dp_layer_free(struct dp_layer *l);

/* The table slot holding layer id, or -1. */
int dp_layer_slot(const struct dp_world *w, uint32_t id);

/* Take the layer in table slot `slot` out of the table, onto the retired list; its
 * owner's layer count and weight bytes drop now, its memory goes later. */
void dp_layer_unpublish(struct dp_world *w, uint32_t slot, struct dp_layer **retired);

/* Every layer `owner` (a client id) holds leaves the table (it detached or died). */
void dp_layers_unload_owner(struct dp_world *w, uint32_t owner, struct dp_layer **retired);

/* Free the retired layers no forward holds and no dispatcher pass can still see (all of
 * them when every agent has stopped); how many were freed. */
uint32_t dp_layers_free_retired(struct dp_world *w, struct dp_layer **retired, bool all);

/* Bytes a layer plan stands for: every duck's shards and b_down (raw and float);
 * UINT64_MAX when that does not fit (a config may raise max_hidden and max_ffn to 2^32). */
uint64_t dp_layer_plan_bytes(const struct dp_ctl_load_weights *m);

#endif /* DP_LAYERS_H */
