/* dp_layer_moe.c: how a mixture-of-experts layer names a duck in a message (the routed
 * experts its bank holds) and lists its placement in LayerInfo. The layer's placement and banks are built and checked at
 * LoadWeights by dp_load_moe_plan (dp_ctl_rules.h, through dp_layer_build), the rule the
 * mock dataplane calls too.
 */
#include <stdio.h>
#include <stdlib.h>

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

/* Whether ducks[k]'s bank holds columns of the shared expert: more columns than its routed
 * experts take (the bank's layout, docs/protocols.md LoadWeights). */
static bool holds_shared(const struct dp_layer *l, uint32_t k)
{
	const struct dp_layer_moe *moe = l->moe;
	uint64_t routed = (uint64_t)moe->experts_on[l->ducks[k] % DP_MAX_DUCKS] * moe->expert_ffn;
	return l->shard[k] > routed;
}

struct dp_moe_listing *dp_layer_moe_listing(const struct dp_layer *l)
{
	const struct dp_routing_placement *pl = &l->moe->pl;
	uint32_t n_experts = pl->n_experts, n_placed = 0;
	for (uint32_t e = 0; e < n_experts; e++)
		n_placed += pl->replicas[e];
	/* n_experts <= DP_MAX_EXPERTS, replicas <= DP_MAX_REPLICAS: dp_load_moe_plan checked */
	size_t words = (size_t)n_experts + n_placed + l->nducks;
	struct dp_moe_listing *ls = malloc(sizeof(*ls) + words * sizeof(uint32_t));
	if (!ls)
		return NULL;
	ls->n_experts = n_experts;
	ls->n_placed = n_placed;
	ls->n_shared = 0;
	ls->replicas = ls->words;
	ls->ducks = ls->replicas + n_experts;
	ls->shared = ls->ducks + n_placed;
	uint32_t at = 0;
	for (uint32_t e = 0; e < n_experts; e++) {
		ls->replicas[e] = pl->replicas[e];
		for (uint32_t r = 0; r < pl->replicas[e]; r++)
			ls->ducks[at++] = pl->ducks[e * DP_MAX_REPLICAS + r];
	}
	for (uint32_t k = 0; k < l->nducks; k++)
		if (holds_shared(l, k))
			ls->shared[ls->n_shared++] = l->ducks[k];
	return ls;
}
