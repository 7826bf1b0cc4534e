/* dp_desc.c: dp_desc_layer_of(), what the descriptor check reads of a layer (dp_desc.h).
 *
 * The check (dp_desc_check.h) is shared with the mock dataplane, which has no struct
 * dp_layer: it reads a layer through struct dp_desc_layer, filled here once per
 * descriptor. The shard tables are pointed at, not copied.
 */
#include "dp_desc.h"
#include "dp_fwd.h" /* DP_MSG_LEN */

_Static_assert(DP_MSG_LEN == DP_DESC_WHY_LEN,
	       "a refusal's reason fills a completion's message, the mock's as the dataplane's");

const struct dp_desc_layer *dp_desc_layer_of(const struct dp_layer *l, struct dp_desc_layer *view)
{
	if (!l)
		return NULL;
	*view = (struct dp_desc_layer){
		.id = l->id,
		.hidden = l->hidden,
		.kind = l->kind,
		.dtype = l->dtype,
		.has_b_down = l->has_b_down,
		/* acquire: the NIC workers and the commit (failed) and the commit (ready)
		 * publish them with release, after what they vouch for */
		/* a move's layer takes chunks as a repair does: its changed ducks' alone */
		.ready = l->is_move || dp_load_acquire_u32(&l->ready) != 0,
		.failed = dp_load_acquire_u32(&l->failed) != 0,
		.index = l->index,
		.shard = l->shard,
		.weight_dtype = l->weight_dtype,
		.expert_ffn = l->moe ? l->moe->expert_ffn : 0,
		.experts_on = l->moe ? l->moe->experts_on : NULL,
		/* acquire: the control agent reset the ducks' books before it set repairing */
		.repair = l->is_move && !dp_load_acquire_u32(&l->ready) ? l->move_ducks
			  : dp_load_acquire_u32(&l->repairing) ? l->repair_ducks : NULL,
	};
	return view;
}
