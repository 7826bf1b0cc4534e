/* dp_layer_moe.c: how a mixture-of-experts layer names a duck in a message (the routed
 * experts its bank holds) and lists its placement in a Layers reply. The layer's
 * placement and banks are built and checked at LoadWeights by dp_load_moe_plan
 * (dp_ctl_rules.h, through dp_layer_build), the rule the mock dataplane calls too.
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

/* Whether ducks[k]'s bank holds columns of the shared expert: more columns than its routed
 * experts take (the bank's layout, docs/protocols.md LoadWeights). */
static bool holds_shared(const struct dp_layer *l, uint32_t k)
{
	const struct dp_layer_moe *moe = l->moe;
	uint64_t routed = (uint64_t)moe->experts_on[l->ducks[k] % DP_MAX_DUCKS] * moe->expert_ffn;
	return l->shard[k] > routed;
}

size_t dp_layer_moe_list_words(const struct dp_layer *l)
{
	const struct dp_routing_placement *pl = &l->moe->pl;
	/* n_experts <= DP_MAX_EXPERTS, replicas <= DP_MAX_REPLICAS: dp_load_moe_plan checked */
	uint32_t nsets = l->moe->n_shared_sets;
	size_t words = (size_t)pl->n_experts + l->nducks + (nsets > 1 ? nsets : 0);
	for (uint32_t e = 0; e < pl->n_experts; e++)
		words += pl->replicas[e];
	return words;
}

void dp_layer_moe_list(const struct dp_layer *l, uint32_t *words, struct dp_moe_listing *out)
{
	const struct dp_routing_placement *pl = &l->moe->pl;
	uint32_t *replicas = words, *ducks = words + pl->n_experts, n_placed = 0, n_shared = 0;
	for (uint32_t e = 0; e < pl->n_experts; e++) {
		replicas[e] = pl->replicas[e];
		for (uint32_t r = 0; r < pl->replicas[e]; r++)
			ducks[n_placed++] = pl->ducks[e * DP_MAX_REPLICAS + r];
	}
	uint32_t *shared = ducks + n_placed;
	const struct dp_layer_moe *moe = l->moe;
	/* set by set (one set: the ducks holding shared columns), each in the layer's order */
	uint32_t nsets = moe->n_shared_sets > 1 ? moe->n_shared_sets : 0;
	uint32_t *sets = shared + l->nducks;
	for (uint32_t s = 0; s < (nsets ? nsets : 1); s++) {
		uint32_t before = n_shared;
		for (uint32_t k = 0; k < l->nducks; k++) {
			uint32_t d = l->ducks[k] % DP_MAX_DUCKS;
			if (nsets ? !(moe->shared_set[s * 4 + (d >> 6)] >> (d & 63) & 1)
				  : !holds_shared(l, k))
				continue;
			shared[n_shared++] = d;
		}
		if (nsets)
			sets[s] = n_shared - before;
	}
	*out = (struct dp_moe_listing){
		.n_experts = pl->n_experts,
		.n_placed = n_placed,
		.n_shared = n_shared,
		.n_sets = nsets,
		.replicas = replicas,
		.ducks = ducks,
		.shared = shared,
		.sets = sets,
	};
}
