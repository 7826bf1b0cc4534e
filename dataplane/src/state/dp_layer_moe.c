/* dp_layer_moe.c: how a mixture-of-experts layer names a duck in a message: the routed
 * experts its bank holds. The layer's placement and banks are built and checked at
 * LoadWeights by dp_load_moe_plan (dp_ctl_rules.h, through dp_layer_build), the rule the
 * mock dataplane calls too.
 */
#include <stdio.h>

#include "dp_layers.h"

int dp_layer_describe_duck(const struct dp_layer *l, uint32_t duck, char *buf, size_t n)
{
	const struct dp_layer_moe *moe = l->moe;
	if (!moe || duck >= DP_MAX_DUCKS)
		return snprintf(buf, n, "duck %u", duck);
	if (!moe->experts_on[duck])
		return snprintf(buf, n, "duck %u (shared expert only)", duck);
	int used = snprintf(buf, n, "duck %u (experts", duck);
	for (uint32_t e = 0; e < moe->pl.n_experts && used >= 0 && (size_t)used < n; e++)
		for (uint32_t r = 0; r < moe->pl.replicas[e]; r++) {
			if (moe->pl.ducks[e * DP_MAX_REPLICAS + r] != duck)
				continue;
			/* room for this id and the closing " ...)" */
			if ((size_t)used + 12 >= n) {
				used += snprintf(buf + used, n - (size_t)used, " ...");
				goto close;
			}
			used += snprintf(buf + used, n - (size_t)used, " %u", e);
		}
close:
	if (used >= 0 && (size_t)used < n)
		used += snprintf(buf + used, n - (size_t)used, ")");
	return used;
}
