/* dp_layer_moe.c: a mixture-of-experts layer's placement and banks, from its LoadWeights.
 *
 * The request says where each routed expert lives (expert_replicas, expert_ducks) and
 * how wide each duck's bank is (shard_sizes). Everything the forward path later trusts
 * is checked here, once, with a message that says which number is wrong: the workers
 * split routing tables by this placement and write bank slots into what ducks read, and
 * a duck computes with its bank's columns, so a placement that disagrees with the banks
 * would make ducks compute the wrong experts, silently.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dp_ctl_gen.h"
#include "dp_layers.h"

static int refuse(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
	return -1;
}

/* The placement out of the request's flattened lists; l's index says who is in ducks. */
static int fill_placement(struct dp_layer_moe *moe, const struct dp_layer *l,
			  const struct dp_ctl_load_weights *m, char *why, size_t n)
{
	uint64_t sum = 0;
	for (uint32_t e = 0; e < m->expert_replicas_len; e++)
		sum += m->expert_replicas[e];
	if (sum != m->expert_ducks_len)
		return refuse(why, n,
			      "MOE layer %u: expert_replicas add up to %llu ducks, expert_ducks "
			      "lists %u",
			      m->layer, (unsigned long long)sum, m->expert_ducks_len);
	moe->pl.n_experts = m->expert_replicas_len;
	uint32_t k = 0;
	for (uint32_t e = 0; e < m->expert_replicas_len; e++) {
		moe->pl.replicas[e] = (uint8_t)m->expert_replicas[e]; /* 1..8: the decoder */
		for (uint32_t r = 0; r < m->expert_replicas[e]; r++, k++) {
			uint32_t d = m->expert_ducks[k]; /* < 256: the decoder */
			if (l->index[d] < 0)
				return refuse(why, n,
					      "MOE layer %u: expert %u is placed on duck %u, which is "
					      "not one of the layer's ducks",
					      m->layer, e, d);
			moe->pl.ducks[e * DP_MAX_REPLICAS + r] = (uint16_t)d;
		}
	}
	char pwhy[DP_DESC_WHY_LEN];
	if (dp_routing_placement_check(&moe->pl, pwhy, sizeof(pwhy)) < 0)
		return refuse(why, n, "MOE layer %u: %s", m->layer, pwhy);
	return 0;
}

/* Each duck's bank against its experts: wide enough for them, and the shared expert's
 * columns (what is left) on every duck or on none. */
static int check_banks(struct dp_layer_moe *moe, const struct dp_layer *l,
		       const struct dp_ctl_load_weights *m, char *why, size_t n)
{
	uint32_t with_shared = 0;
	for (uint32_t i = 0; i < l->nducks; i++) {
		uint32_t d = l->ducks[i];
		uint64_t routed = (uint64_t)moe->experts_on[d] * m->expert_ffn;
		if (l->shard[i] < routed)
			return refuse(why, n,
				      "MOE layer %u: duck %u's bank has %u columns, fewer than its "
				      "%u experts x expert_ffn %u",
				      m->layer, d, l->shard[i], moe->experts_on[d], m->expert_ffn);
		with_shared += l->shard[i] > routed;
	}
	if (with_shared && with_shared != l->nducks) {
		for (uint32_t i = 0; i < l->nducks; i++) {
			uint32_t d = l->ducks[i];
			if (l->shard[i] == (uint64_t)moe->experts_on[d] * m->expert_ffn)
				return refuse(why, n,
					      "MOE layer %u: %u of %u ducks hold shared-expert "
					      "columns but duck %u holds none: every duck or none",
					      m->layer, with_shared, l->nducks, d);
		}
	}
	moe->has_shared = with_shared != 0;
	if (!moe->has_shared)
		for (uint32_t i = 0; i < l->nducks; i++)
			if (!moe->experts_on[l->ducks[i]])
				return refuse(why, n,
					      "MOE layer %u: duck %u holds no expert and the layer "
					      "has no shared expert: it would compute nothing",
					      m->layer, l->ducks[i]);
	return 0;
}

int dp_layer_moe_build(struct dp_layer *l, const struct dp_ctl_load_weights *m, char *why,
		       size_t n)
{
	l->moe = NULL;
	if (m->kind != DP_MLP_KIND_MOE) {
		if (m->expert_ffn || m->expert_replicas_len || m->expert_ducks_len)
			return refuse(why, n,
				      "layer %u is dense (kind %u): expert_ffn, expert_replicas "
				      "and expert_ducks are for MOE layers (kind %u) only",
				      m->layer, m->kind, DP_MLP_KIND_MOE);
		return 0;
	}
	if (m->expert_ffn < 1)
		return refuse(why, n, "MOE layer %u needs expert_ffn >= 1", m->layer);
	if (m->expert_replicas_len < 1)
		return refuse(why, n,
			      "MOE layer %u needs expert_replicas: one entry per routed expert "
			      "(1..%u)",
			      m->layer, DP_MAX_EXPERTS);
	if (m->has_b_down)
		return refuse(why, n, "MOE layer %u: a mixture of experts has no b_down", m->layer);
	struct dp_layer_moe *moe = calloc(1, sizeof(*moe));
	if (!moe)
		return refuse(why, n, "out of memory");
	moe->expert_ffn = m->expert_ffn;
	if (fill_placement(moe, l, m, why, n) < 0) {
		free(moe);
		return -1;
	}
	dp_routing_bank_slots(&moe->pl, moe->slots, moe->experts_on);
	if (check_banks(moe, l, m, why, n) < 0) {
		free(moe);
		return -1;
	}
	l->moe = moe;
	return 0;
}

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
