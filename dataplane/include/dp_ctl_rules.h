/* dp_ctl_rules.h: the control plane's rules, as pure functions of what a request asks and
 * what the dataplane holds.
 *
 *   dp_attach_admit       may this peer take a client slot (per pid, per uid, reserved)
 *   dp_load_check         a LoadWeights' bounds, shards and ducks, before any allocation
 *   dp_load_moe_plan      a MoE layer's placement and banks (dense: no MoE field)
 *   dp_load_plan_bytes    what a layer weighs against its owner's client_max_weight_bytes
 *   dp_load_quota_check   that quota (layers, weight bytes)
 *
 * The C control agent (dp_control_requests.c; dp_layer_build in dp_layers.c) and the mock
 * dataplane (duckpipe/mock/, through cffi) both call these, so a client hears the same
 * refusal, word for word, from either (tests/hostile/test_control_verdicts.py). Each
 * returns 0 or the enum dp_error_code of the Error reply, with its message in why. What
 * the caller counts (quota_refused) and what it then does stay the caller's.
 *
 * The structs below are parsed by cffi (duckpipe/_native_build.py takes the @cdef
 * section): keep them plain, with literal sizes.
 */
#ifndef DP_CTL_RULES_H
#define DP_CTL_RULES_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_ctl_gen.h"
#include "dp_fp8.h"
#include "dp_routing.h"
#include "dp_why.h"

/* @cdef-begin: cffi parses from here */

/* Room for a refusal's message: what dp_control_refuse sends at most. */
#define DP_CTL_WHY_LEN 256

/* The client table as one Attach sees it, counted by the caller. */
struct dp_attach_census {
    uint32_t pid;       /* the peer's, from its credentials */
    uint32_t uid;
    bool admin;         /* the dataplane's own user: never held to the per-uid rules */
    uint32_t taken;     /* slots not free (a slot being let go is not free yet) */
    uint32_t of_pid;    /* clients of this pid attached or attaching */
    uint32_t of_uid;    /* slots not free held by this uid */
    uint32_t not_admin; /* slots not free held by users other than the admin */
};

struct dp_attach_limits {
    uint32_t client_max_per_pid;
    uint32_t client_max_per_uid;
    uint32_t admin_reserved_clients;
};

struct dp_load_limits {
    uint32_t max_hidden;
    uint32_t max_ffn;
};

/* What a mixture-of-experts layer (kind MOE) adds to a layer: where its routed experts
 * are, and where each sits in its ducks' banks. Built once at LoadWeights from the
 * request (dp_load_moe_plan), checked there, never changed after: the dispatcher (its
 * targets) and the workers (the wire tables, dp_moe.c) only read it. About 34 KiB, so it
 * hangs off the layer instead of growing every dense one. */
struct dp_layer_moe {
    struct dp_routing_placement pl; /* checked with dp_routing_placement_check */
    /* slots[e * DP_MAX_REPLICAS + r]: expert e's index in the bank of its r-th duck */
    uint16_t slots[8192];       /* DP_MAX_EXPERTS * DP_MAX_REPLICAS */
    uint16_t experts_on[256];   /* DP_MAX_DUCKS: routed experts in each duck's bank */
    /* the shared expert's ducks (DP_MAX_DUCKS bits): each holds >= 1 of its columns and
     * computes them for every row; a token reaches its routed ducks and these, no other */
    uint64_t shared_ducks[4];
    uint32_t expert_ffn;        /* columns of each routed expert */
    bool has_shared;            /* the layer has a shared expert: shared_ducks is not empty */
    /* the shared expert's replicas (LoadWeights.shared_sets): n_shared_sets sets of
     * shared_ducks (1 with a shared expert and none given, 0 without one), set s's ducks
     * at shared_set[s * 4 .. s * 4 + 3] (DP_MAX_DUCKS bits), each holding the whole
     * shared expert; a forward uses one whose ducks are all live (dp_dispatch.c) */
    uint32_t n_shared_sets;
    uint64_t shared_set[32];    /* DP_MAX_REPLICAS x DP_MAX_DUCKS / 64 */
};

/* What one client holds when it loads a layer, the layer it replaces left out. */
struct dp_load_holding {
    uint32_t nlayers;    /* layers held, the retired ones included */
    uint64_t bytes;      /* their weight bytes */
    uint32_t retired;    /* of those, replaced or unloaded but not freed yet */
    uint32_t max_layers; /* client_max_layers */
    uint64_t max_bytes;  /* client_max_weight_bytes */
};

/* @cdef-end */

_Static_assert(sizeof(((struct dp_layer_moe *)0)->slots) ==
		       sizeof(uint16_t) * DP_MAX_EXPERTS * DP_MAX_REPLICAS,
	       "dp_layer_moe.slots: a slot per expert and replica");
_Static_assert(sizeof(((struct dp_layer_moe *)0)->experts_on) == sizeof(uint16_t) * DP_MAX_DUCKS,
	       "dp_layer_moe.experts_on: a count per duck");

/* --- Attach ---------------------------------------------------------------------------- */

/* Whether the peer may take a client slot: one process holds at most client_max_per_pid
 * (it cannot take every slot); quotas count users, not only processes: one user other
 * than the admin holds at most client_max_per_uid however many processes it forks, and
 * all of them together leave admin_reserved_clients free for the admin, whose clients
 * always get in while a slot is free. *quota: the refusal counts as quota_refused. */
static inline int dp_attach_admit(const struct dp_attach_census *c,
				  const struct dp_attach_limits *lim, bool *quota, char *why,
				  size_t n)
{
	*quota = true;
	if (c->of_pid >= lim->client_max_per_pid)
		return dp_refuse(DP_ERROR_CODE_QUOTA_EXCEEDED, why, n,
					 "pid %u has %u clients attached, client_max_per_pid is "
					 "%u: close one first",
					 c->pid, c->of_pid, lim->client_max_per_pid);
	if (!c->admin && c->of_uid >= lim->client_max_per_uid)
		return dp_refuse(DP_ERROR_CODE_QUOTA_EXCEEDED, why, n,
					 "uid %u has %u clients attached, client_max_per_uid is "
					 "%u: close one first",
					 c->uid, c->of_uid, lim->client_max_per_uid);
	if (!c->admin && c->not_admin >= DP_MAX_CLIENTS - lim->admin_reserved_clients)
		return dp_refuse(DP_ERROR_CODE_TOO_MANY_CLIENTS, why, n,
					 "every client slot open to other users is taken (%u); "
					 "admin_reserved_clients %u are kept for the dataplane's "
					 "own user",
					 c->not_admin, lim->admin_reserved_clients);
	*quota = false;
	if (c->taken >= DP_MAX_CLIENTS)
		return dp_refuse(DP_ERROR_CODE_TOO_MANY_CLIENTS, why, n,
					 "every client slot is taken");
	return 0;
}

/* --- LoadWeights ----------------------------------------------------------------------- */

/* A LoadWeights' weight_dtype: 0 (the weights in dtype) or F8E4M3 for the SwiGLU kinds;
 * an FP8 dense layer is cut between 128-column blocks (dp_fp8.h: a duck holds whole
 * blocks and their scales), only the last duck's shard may end in a partial block. */
static inline int dp_load_fp8_check(const struct dp_ctl_load_weights *m, char *why, size_t n)
{
	if (m->weight_dtype == 0)
		return 0;
	if (m->weight_dtype != DP_DTYPE_F8E4M3 || m->kind == DP_MLP_KIND_GELU)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "layer %u: weight_dtype %u; give 0 (the layer's dtype) "
					 "or %u (float8 e4m3 with block scales, SWIGLU and MOE "
					 "only)",
					 m->layer, m->weight_dtype, DP_DTYPE_F8E4M3);
	if (m->kind != DP_MLP_KIND_SWIGLU)
		return 0; /* a MOE bank's shared columns: dp_load_moe_banks */
	for (uint32_t i = 0; i + 1 < m->shard_sizes_len && i < DP_MAX_DUCKS; i++)
		if (m->shard_sizes[i] % DP_FP8_BLOCK)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "FP8 layer %u: duck %u's shard has %u columns; "
						 "an FP8 layer is cut between %u-column blocks "
						 "(only the last shard may end in a partial one)",
						 m->layer, m->ducks[i], m->shard_sizes[i],
						 DP_FP8_BLOCK);
	return 0;
}

/* Every bound of a LoadWeights before anything is allocated (hidden 2^32-1 once reserved
 * two 16 GiB buffers): hidden and ffn within the config's, one shard size per duck
 * summing to ffn, each duck in the topology (topology[id] >= 0: DP_MAX_DUCKS entries)
 * and listed once. 0 or DP_ERROR_CODE_BAD_REQUEST. */
static inline int dp_load_check(const struct dp_ctl_load_weights *m,
				const struct dp_load_limits *lim, const int16_t *topology,
				char *why, size_t n)
{
	if (m->hidden > lim->max_hidden || m->ffn > lim->max_ffn)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "hidden %u / ffn %u exceed this dataplane's max_hidden "
					 "%u / max_ffn %u",
					 m->hidden, m->ffn, lim->max_hidden, lim->max_ffn);
	uint64_t total = 0;
	for (uint32_t i = 0; i < m->shard_sizes_len && i < DP_MAX_DUCKS; i++)
		total += m->shard_sizes[i];
	if (m->ducks_len != m->shard_sizes_len || m->ducks_len > DP_MAX_DUCKS || total != m->ffn)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "LoadWeights needs one shard size per duck, summing to "
					 "ffn");
	uint64_t seen[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		uint32_t d = m->ducks[i];
		if (d >= DP_MAX_DUCKS || topology[d] < 0 || (seen[d >> 6] >> (d & 63) & 1))
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "duck %u is not in the topology or is listed "
						 "twice",
						 d);
		seen[d >> 6] |= 1ull << (d & 63);
	}
	return dp_load_fp8_check(m, why, n);
}

/* The placement out of the request's flattened lists; ducks[] holds the layer's ducks. */
static inline int dp_load_moe_placement(const struct dp_ctl_load_weights *m,
					struct dp_layer_moe *moe, const uint64_t *ducks,
					char *why, size_t n)
{
	uint64_t sum = 0;
	for (uint32_t e = 0; e < m->expert_replicas_len; e++)
		sum += m->expert_replicas[e];
	if (sum != m->expert_ducks_len)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u: expert_replicas add up to %llu ducks, "
					 "expert_ducks lists %u",
					 m->layer, (unsigned long long)sum, m->expert_ducks_len);
	if (m->expert_replicas_len > DP_MAX_EXPERTS)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u: %u experts, at most %u",
					 m->layer, m->expert_replicas_len, DP_MAX_EXPERTS);
	moe->pl.n_experts = m->expert_replicas_len;
	uint32_t k = 0;
	for (uint32_t e = 0; e < m->expert_replicas_len; e++) {
		uint32_t replicas = m->expert_replicas[e];
		if (replicas < 1 || replicas > DP_MAX_REPLICAS) /* the decoder's bounds, again */
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: expert %u has %u replicas, give "
						 "it 1..%u",
						 m->layer, e, replicas, DP_MAX_REPLICAS);
		moe->pl.replicas[e] = (uint8_t)replicas;
		for (uint32_t r = 0; r < replicas; r++, k++) {
			uint32_t d = m->expert_ducks[k];
			if (d >= DP_MAX_DUCKS || !(ducks[d >> 6] >> (d & 63) & 1))
				return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
							 "MOE layer %u: expert %u is placed on "
							 "duck %u, which is not one of the "
							 "layer's ducks",
							 m->layer, e, d);
			moe->pl.ducks[e * DP_MAX_REPLICAS + r] = (uint16_t)d;
		}
	}
	char pwhy[DP_CTL_WHY_LEN];
	if (dp_routing_placement_check(&moe->pl, pwhy, sizeof(pwhy)) < 0)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n, "MOE layer %u: %s",
					 m->layer, pwhy);
	return 0;
}

/* The shared expert's sets out of the request: shared_ducks cut into consecutive runs
 * of the shared_sets sizes (none given: one set of them all), into moe->shared_set.
 * 0 or DP_ERROR_CODE_BAD_REQUEST. */
static inline int dp_load_moe_shared_sets(const struct dp_ctl_load_weights *m,
					  struct dp_layer_moe *moe, char *why, size_t n)
{
	uint32_t nsets = m->shared_sets_len, at = 0, sum = 0;
	if (!m->shared_ducks_len) {
		if (nsets)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: shared_sets without shared_ducks: "
						 "the layer has no shared expert to replicate",
						 m->layer);
		return 0;
	}
	for (uint32_t s = 0; s < nsets && s < DP_MAX_REPLICAS; s++)
		sum += m->shared_sets[s] <= DP_MAX_DUCKS ? m->shared_sets[s] : DP_MAX_DUCKS + 1;
	if (nsets > DP_MAX_REPLICAS || (nsets && sum != m->shared_ducks_len))
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u: shared_sets cut %u ducks into %u sets, but "
					 "shared_ducks names %u (give 1..%u sets that add up to them)",
					 m->layer, sum, nsets, m->shared_ducks_len, DP_MAX_REPLICAS);
	moe->n_shared_sets = nsets ? nsets : 1;
	for (uint32_t s = 0; s < moe->n_shared_sets; s++) {
		uint32_t size = nsets ? m->shared_sets[s] : m->shared_ducks_len;
		if (size < 1)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: shared set %u is empty", m->layer, s);
		for (uint32_t j = 0; j < size; j++, at++) {
			uint32_t d = m->shared_ducks[at]; /* checked below DP_MAX_DUCKS */
			moe->shared_set[s * 4 + (d >> 6)] |= 1ull << (d & 63);
		}
	}
	return 0;
}

/* Which shared set duck d is in, or -1. */
static inline int32_t dp_load_moe_set_of(const struct dp_layer_moe *moe, uint32_t d)
{
	for (uint32_t s = 0; s < moe->n_shared_sets && s < DP_MAX_REPLICAS; s++)
		if (moe->shared_set[s * 4 + (d >> 6)] >> (d & 63) & 1)
			return (int32_t)s;
	return -1;
}

/* The duck that computes the shared-expert columns of duck ducks[i] in its stead, when
 * it fails within a forward (dp_moe.c failover): the duck of another set, the next in
 * set order after its own (cyclically), that holds exactly those columns and that `can`
 * names (DP_MAX_DUCKS bits: reachable and not itself gone); DP_MAX_DUCKS when there is
 * none (one set, sets cut otherwise, or their ducks gone too). A duck's bank is its
 * experts' columns, then its shared ones (shard[j] minus the experts'), and a set's
 * ducks take consecutive columns of the shared expert in the layer's duck order
 * (weights.py moe_layer): sets of one size are cut alike. */
static inline uint32_t dp_load_moe_shared_stand_in(const struct dp_layer_moe *moe,
						   const uint16_t *ducks, const uint32_t *shard,
						   uint32_t nducks, uint32_t i, const uint64_t *can)
{
	uint32_t next[DP_MAX_REPLICAS] = { 0 }; /* each set's next column */
	uint32_t lo[DP_MAX_DUCKS], cols[DP_MAX_DUCKS];
	int32_t set[DP_MAX_DUCKS];
	for (uint32_t j = 0; j < nducks && j < DP_MAX_DUCKS; j++) {
		uint32_t d = ducks[j] % DP_MAX_DUCKS;
		set[j] = dp_load_moe_set_of(moe, d);
		cols[j] = set[j] < 0 ? 0 : shard[j] - moe->experts_on[d] * moe->expert_ffn;
		lo[j] = set[j] < 0 ? 0 : next[set[j]];
		if (set[j] >= 0)
			next[set[j]] += cols[j];
	}
	if (i >= nducks || i >= DP_MAX_DUCKS || set[i] < 0 || !cols[i])
		return DP_MAX_DUCKS;
	for (uint32_t k = 1; k < moe->n_shared_sets; k++) {
		int32_t other = (int32_t)((set[i] + k) % moe->n_shared_sets);
		for (uint32_t j = 0; j < nducks && j < DP_MAX_DUCKS; j++) {
			uint32_t d = ducks[j] % DP_MAX_DUCKS;
			if (set[j] != other || lo[j] != lo[i] || cols[j] != cols[i])
				continue;
			if (can[d >> 6] >> (d & 63) & 1)
				return d;
			break; /* the one duck of that set with these columns cannot */
		}
	}
	return DP_MAX_DUCKS;
}

/* The shared expert's set out of the request: distinct ducks of the layer (ducks[]: its
 * bits), written to moe->shared_ducks. 0 or DP_ERROR_CODE_BAD_REQUEST. */
static inline int dp_load_moe_shared(const struct dp_ctl_load_weights *m,
				     struct dp_layer_moe *moe, const uint64_t *ducks, char *why,
				     size_t n)
{
	for (uint32_t i = 0; i < m->shared_ducks_len && i < DP_MAX_DUCKS; i++) {
		uint32_t d = m->shared_ducks[i];
		if (d >= DP_MAX_DUCKS || !(ducks[d >> 6] >> (d & 63) & 1))
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: shared_ducks names duck %u, which is "
						 "not one of the layer's ducks",
						 m->layer, d);
		if (moe->shared_ducks[d >> 6] >> (d & 63) & 1)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: shared_ducks names duck %u twice",
						 m->layer, d);
		moe->shared_ducks[d >> 6] |= 1ull << (d & 63);
	}
	moe->has_shared = m->shared_ducks_len != 0;
	return dp_load_moe_shared_sets(m, moe, why, n);
}

/* Each duck's bank against its experts: wide enough for them, and the shared expert's
 * columns (what is left) on the ducks of shared_ducks and on no other (a duck computes
 * its shared columns for every row exactly when it is in the set, and is sent every row
 * for it: a bank that disagrees would add a shared shard twice or leave one out). */
static inline int dp_load_moe_banks(const struct dp_ctl_load_weights *m,
				    struct dp_layer_moe *moe, char *why, size_t n)
{
	/* FP8: the last duck of each set, in ducks order, may hold a partial 128-block; each
	 * set holds the whole shared expert: as many columns as the first */
	uint32_t last_shared[DP_MAX_REPLICAS];
	uint64_t set_cols[DP_MAX_REPLICAS] = { 0 };
	for (uint32_t s = 0; s < DP_MAX_REPLICAS; s++)
		last_shared[s] = UINT32_MAX;
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		int32_t s = dp_load_moe_set_of(moe, m->ducks[i] % DP_MAX_DUCKS);
		if (s >= 0) {
			last_shared[s] = i;
			if (m->shard_sizes[i] > (uint64_t)moe->experts_on[m->ducks[i] % DP_MAX_DUCKS] *
							m->expert_ffn)
				set_cols[s] += m->shard_sizes[i] -
					       (uint64_t)moe->experts_on[m->ducks[i] % DP_MAX_DUCKS] *
						       m->expert_ffn;
		}
	}
	for (uint32_t s = 1; s < moe->n_shared_sets && s < DP_MAX_REPLICAS; s++)
		if (set_cols[s] != set_cols[0])
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: shared set %u holds %llu shared-expert "
						 "columns, set 0 %llu: each set holds the whole shared "
						 "expert",
						 m->layer, s, (unsigned long long)set_cols[s],
						 (unsigned long long)set_cols[0]);
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		uint32_t d = m->ducks[i];
		uint64_t routed = (uint64_t)moe->experts_on[d] * m->expert_ffn;
		bool in_set = moe->shared_ducks[d >> 6] >> (d & 63) & 1;
		if (m->shard_sizes[i] < routed)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: duck %u's bank has %u columns, "
						 "fewer than its %u experts x expert_ffn %u",
						 m->layer, d, m->shard_sizes[i],
						 moe->experts_on[d], m->expert_ffn);
		if (in_set && m->shard_sizes[i] == routed)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: duck %u is in shared_ducks but its "
						 "bank holds no shared-expert column",
						 m->layer, d);
		if (!in_set && m->shard_sizes[i] > routed)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: duck %u's bank holds %llu "
						 "shared-expert columns but shared_ducks %s",
						 m->layer, d,
						 (unsigned long long)(m->shard_sizes[i] - routed),
						 moe->has_shared ? "does not name it"
								 : "is empty: name the ducks "
								   "that hold the shared expert");
		if (!moe->has_shared && !moe->experts_on[d])
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "MOE layer %u: duck %u holds no expert "
						 "and the layer has no shared expert: it "
						 "would compute nothing",
						 m->layer, d);
		int32_t set = dp_load_moe_set_of(moe, d % DP_MAX_DUCKS);
		if (m->weight_dtype && in_set && set >= 0 && i != last_shared[set] &&
		    (m->shard_sizes[i] - routed) % DP_FP8_BLOCK)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "FP8 MOE layer %u: duck %u holds %llu "
						 "shared-expert columns; the shared expert is cut "
						 "between %u-column blocks (only the last duck's "
						 "may end in a partial one)",
						 m->layer, d,
						 (unsigned long long)(m->shard_sizes[i] - routed),
						 DP_FP8_BLOCK);
	}
	return 0;
}

/* A LoadWeights' MoE fields, after dp_load_check passed: for kind MOE, the placement and
 * banks checked (a message that says which number is wrong: the workers split routing
 * tables by this placement and write bank slots into what ducks read, and a duck computes
 * with its bank's columns, so a placement that disagrees with the banks would make ducks
 * compute the wrong experts, silently) and written to *moe (zeroed first); for a dense
 * kind, a refusal of any MoE field and *moe untouched. 0 or DP_ERROR_CODE_BAD_REQUEST. */
static inline int dp_load_moe_plan(const struct dp_ctl_load_weights *m, struct dp_layer_moe *moe,
				   char *why, size_t n)
{
	if (m->kind != DP_MLP_KIND_MOE) {
		if (m->expert_ffn || m->expert_replicas_len || m->expert_ducks_len ||
		    m->shared_ducks_len)
			return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
						 "layer %u is dense (kind %u): expert_ffn, "
						 "expert_replicas, expert_ducks and shared_ducks are "
						 "for MOE layers (kind %u) only",
						 m->layer, m->kind, DP_MLP_KIND_MOE);
		return 0;
	}
	if (m->expert_ffn < 1)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u needs expert_ffn >= 1", m->layer);
	if (m->expert_replicas_len < 1)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u needs expert_replicas: one entry per "
					 "routed expert (1..%u)",
					 m->layer, DP_MAX_EXPERTS);
	if (m->has_b_down)
		return dp_refuse(DP_ERROR_CODE_BAD_REQUEST, why, n,
					 "MOE layer %u: a mixture of experts has no b_down",
					 m->layer);
	memset(moe, 0, sizeof(*moe));
	moe->expert_ffn = m->expert_ffn;
	uint64_t ducks[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t i = 0; i < m->ducks_len && i < DP_MAX_DUCKS; i++)
		if (m->ducks[i] < DP_MAX_DUCKS)
			ducks[m->ducks[i] >> 6] |= 1ull << (m->ducks[i] & 63);
	int rc = dp_load_moe_placement(m, moe, ducks, why, n);
	if (rc)
		return rc;
	rc = dp_load_moe_shared(m, moe, ducks, why, n);
	if (rc)
		return rc;
	dp_routing_bank_slots(&moe->pl, moe->slots, moe->experts_on);
	return dp_load_moe_banks(m, moe, why, n);
}

/* Of a layer's bytes, what the dataplane holds besides the weights: DP_MOE_LAYER_STATE_BYTES
 * for a MoE layer (struct dp_layer_moe and struct dp_layer; dp_layers.c asserts they fit),
 * else 0. */
static inline uint64_t dp_load_state_bytes(const struct dp_ctl_load_weights *m)
{
	return m->kind == DP_MLP_KIND_MOE ? DP_MOE_LAYER_STATE_BYTES : 0;
}

/* Routed experts on duck d: its entries in expert_ducks (the bank dp_load_moe_plan builds). */
static inline uint32_t dp_load_experts_on(const struct dp_ctl_load_weights *m, uint32_t d)
{
	uint32_t k = 0;
	for (uint32_t j = 0; j < m->expert_ducks_len && j < DP_MAX_EXPERTS * DP_MAX_REPLICAS; j++)
		k += m->expert_ducks[j] == d;
	return k;
}

/* dp_load_plan_bytes of an FP8 layer: every duck's three tensors of e4m3 bytes and
 * float32 block scales (dp_fp8_tensor_bytes), and the MoE state. */
static inline uint64_t dp_load_fp8_plan_bytes(const struct dp_ctl_load_weights *m)
{
	uint64_t total = 0, b;
	bool moe = m->kind == DP_MLP_KIND_MOE;
	for (uint32_t i = 0; i < m->shard_sizes_len && i < DP_MAX_DUCKS; i++) {
		uint32_t experts = moe && i < m->ducks_len ? dp_load_experts_on(m, m->ducks[i]) : 0;
		b = dp_fp8_tensor_bytes(m->hidden, m->shard_sizes[i], experts,
					moe ? m->expert_ffn : 0);
		if (b == UINT64_MAX || __builtin_mul_overflow(b, (uint64_t)DP_SHARD_TENSORS, &b) ||
		    __builtin_add_overflow(total, b, &total))
			return UINT64_MAX;
	}
	return __builtin_add_overflow(total, dp_load_state_bytes(m), &total) ? UINT64_MAX : total;
}

/* Bytes a LoadWeights stands for, against its owner's client_max_weight_bytes: every
 * duck's shard tensors (dp_shard_tensor_bytes' sizes: the schema's TENSOR_SHAPES and
 * DTYPE_SIZES), b_down (raw and float: 8 bytes a column), and a MoE layer's placement and
 * state (dp_load_state_bytes); UINT64_MAX when that does not fit (a config may raise
 * max_hidden and max_ffn to 2^32). */
static inline uint64_t dp_load_plan_bytes(const struct dp_ctl_load_weights *m)
{
	uint64_t total = 0, item = dp_dtype_size((uint8_t)m->dtype), b;
	if (m->weight_dtype == DP_DTYPE_F8E4M3)
		return dp_load_fp8_plan_bytes(m);
	for (uint32_t i = 0; i < m->shard_sizes_len && i < DP_MAX_DUCKS; i++)
		for (uint32_t t = 0; t < DP_SHARD_TENSORS; t++)
			if (__builtin_mul_overflow(dp_tensor_elems((uint8_t)m->kind, m->hidden,
								   m->shard_sizes[i], t),
						   item, &b) ||
			    __builtin_add_overflow(total, b, &total))
				return UINT64_MAX;
	if (m->has_b_down && __builtin_add_overflow(total, (uint64_t)m->hidden * 8, &total))
		return UINT64_MAX;
	return __builtin_add_overflow(total, dp_load_state_bytes(m), &total) ? UINT64_MAX : total;
}

/* The client's quota (layers, weight bytes) with this load's `bytes` (dp_load_plan_bytes)
 * added. 0 or DP_ERROR_CODE_QUOTA_EXCEEDED. */
static inline int dp_load_quota_check(const struct dp_ctl_load_weights *m,
				      const struct dp_load_holding *h, uint64_t bytes, char *why,
				      size_t n)
{
	if (h->nlayers + 1 <= h->max_layers && h->bytes <= h->max_bytes &&
	    bytes <= h->max_bytes - h->bytes)
		return 0;
	if (h->retired) /* 256 characters: say what is new, not the whole quota */
		return dp_refuse(DP_ERROR_CODE_QUOTA_EXCEEDED, why, n,
					 "layer %u (%llu bytes) would pass this client's quota: "
					 "%llu of %llu weight bytes and %u of %u layers held, %u of "
					 "them replaced but not freed yet: read the replies and "
					 "retry",
					 m->layer, (unsigned long long)bytes,
					 (unsigned long long)h->bytes,
					 (unsigned long long)h->max_bytes, h->nlayers, h->max_layers,
					 h->retired);
	if (dp_load_state_bytes(m))
		return dp_refuse(DP_ERROR_CODE_QUOTA_EXCEEDED, why, n,
					 "layer %u (%llu bytes: its weights and %llu of MoE "
					 "placement and state) would pass this client's quota: %u "
					 "of %u layers, %llu of %llu weight bytes held; unload "
					 "layers first",
					 m->layer, (unsigned long long)bytes,
					 (unsigned long long)dp_load_state_bytes(m), h->nlayers,
					 h->max_layers, (unsigned long long)h->bytes,
					 (unsigned long long)h->max_bytes);
	return dp_refuse(DP_ERROR_CODE_QUOTA_EXCEEDED, why, n,
				 "layer %u (%llu bytes) would pass this client's quota: %u of %u "
				 "layers, %llu of %llu weight bytes held; unload layers first",
				 m->layer, (unsigned long long)bytes, h->nlayers, h->max_layers,
				 (unsigned long long)h->bytes, (unsigned long long)h->max_bytes);
}

#endif /* DP_CTL_RULES_H */
