/* test_moe.c: the dataplane's side of a routed (MoE) forward, piece by piece: a MOE
 * layer's load (placement, bank slots, the refusals), the descriptor's routed rules and
 * the routing table's copy out of the slot, the mode rule, a duck's reply row map, the
 * row-mapped sum (chunks cut anywhere in a row, float32 and float16), the message
 * naming a duck's experts, and the placement a Layers reply lists. Exit 0 pass, 1 fail. */
#include <stdlib.h>
#include <string.h>

#include "dp_ctl_gen.h"
#include "dp_desc.h"
#include "dp_f16.h"
#include "dp_layers.h"
#include "dp_moe.h"
#include "dp_reasm.h"
#include "test_check.h"

#define HIDDEN 8u
#define EFFN 4u

/* --- a MOE layer's load ---------------------------------------------------------------- */

/* Ducks 2, 4, 6; experts 0..5: e -> duck 2 (0, 1), 4 (2, 3), 6 (4, 5); expert 5 also on
 * duck 2 (a second replica). Banks: duck 2 holds 0 1 5, duck 4 holds 2 3, duck 6 4 5;
 * with shared_cols, each also that many shared-expert columns (shared_ducks 2 4 6). */
static struct dp_ctl_load_weights *moe_request(uint32_t shared_cols)
{
	static const uint32_t ducks[3] = { 2, 4, 6 };
	static const uint32_t experts_on[3] = { 3, 2, 2 };
	static const uint32_t replicas[6] = { 1, 1, 1, 1, 1, 2 };
	static const uint32_t placed[7] = { 2, 2, 4, 4, 6, 6, 2 };
	struct dp_ctl_load_weights *m = calloc(1, sizeof(*m));
	m->layer = 9;
	m->kind = DP_MLP_KIND_MOE;
	m->dtype = DP_DTYPE_F32;
	m->hidden = HIDDEN;
	m->ducks_len = m->shard_sizes_len = 3;
	for (uint32_t i = 0; i < 3; i++) {
		m->ducks[i] = ducks[i];
		m->shard_sizes[i] = experts_on[i] * EFFN + shared_cols;
		m->ffn += m->shard_sizes[i];
		if (shared_cols) /* the shared expert on every duck: each is in the set */
			m->shared_ducks[m->shared_ducks_len++] = ducks[i];
	}
	m->expert_ffn = EFFN;
	m->expert_replicas_len = 6;
	memcpy(m->expert_replicas, replicas, sizeof(replicas));
	m->expert_ducks_len = 7;
	memcpy(m->expert_ducks, placed, sizeof(placed));
	return m;
}

/* The layer as on_load_weights builds it (dp_layer_build), committed: 0, or -1 with why. */
static int build(const struct dp_ctl_load_weights *m, char *why, struct dp_layer **out)
{
	int code;
	struct dp_layer *l = dp_layer_build(m, &code, why, DP_DESC_WHY_LEN);
	if (l)
		l->ready = 1;
	if (out)
		*out = l;
	else if (l)
		dp_layer_free(l);
	return l ? 0 : -1;
}

static void test_a_moe_load_keeps_its_placement_and_banks(void)
{
	struct dp_ctl_load_weights *m = moe_request(0);
	struct dp_layer *l;
	char why[DP_DESC_WHY_LEN] = "";
	CHECK(build(m, why, &l) == 0, "a good MOE load refused: %s", why);
	const struct dp_layer_moe *moe = l->moe;
	CHECK(moe && moe->pl.n_experts == 6 && moe->expert_ffn == EFFN && !moe->has_shared,
	      "layer's MoE");
	CHECK(moe->experts_on[2] == 3 && moe->experts_on[4] == 2 && moe->experts_on[6] == 2,
	      "experts per duck %u %u %u", moe->experts_on[2], moe->experts_on[4],
	      moe->experts_on[6]);
	/* expert 5: slot 1 on duck 6 (after 4), slot 2 on duck 2 (after 0 and 1) */
	CHECK(moe->pl.ducks[5 * DP_MAX_REPLICAS] == 6 && moe->pl.ducks[5 * DP_MAX_REPLICAS + 1] == 2,
	      "expert 5's ducks");
	CHECK(moe->slots[5 * DP_MAX_REPLICAS] == 1 && moe->slots[5 * DP_MAX_REPLICAS + 1] == 2,
	      "expert 5's slots %u %u", moe->slots[5 * DP_MAX_REPLICAS],
	      moe->slots[5 * DP_MAX_REPLICAS + 1]);
	CHECK(moe->slots[3 * DP_MAX_REPLICAS] == 1, "expert 3 is duck 4's slot 1");
	dp_layer_free(l);
	m->shard_sizes[0] += 2; /* a shared expert: every duck 2 columns */
	m->shard_sizes[1] += 2;
	m->shard_sizes[2] += 2;
	m->shared_ducks_len = 3;
	m->shared_ducks[0] = 6; /* any order */
	m->shared_ducks[1] = 2;
	m->shared_ducks[2] = 4;
	CHECK(build(m, why, &l) == 0 && l->moe->has_shared && l->moe->shared_ducks[0] == 0x54,
	      "shared: %s", why);
	dp_layer_free(l);
	m->shard_sizes[0] -= 2; /* the shared expert on duck 6 alone */
	m->shard_sizes[1] -= 2;
	m->shared_ducks_len = 1;
	m->shared_ducks[0] = 6;
	CHECK(build(m, why, &l) == 0 && l->moe->has_shared && l->moe->shared_ducks[0] == 0x40,
	      "shared on one duck: %s", why);
	dp_layer_free(l);
	free(m);
}

static void test_a_bad_moe_load_is_refused_saying_why(void)
{
	char why[DP_DESC_WHY_LEN];
	struct dp_ctl_load_weights *m = moe_request(0);
	m->expert_ducks_len = 6;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "expert_ducks lists 6"), "lengths: %s", why);
	free(m);
	m = moe_request(0);
	m->expert_ducks[3] = 7; /* not a duck of the layer */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "expert 3 is placed on duck 7"), "%s", why);
	free(m);
	m = moe_request(0);
	m->expert_ducks[6] = 6; /* expert 5 on duck 6 twice */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "twice"), "replica twice: %s", why);
	free(m);
	m = moe_request(0);
	m->shard_sizes[1] = 2 * EFFN - 1;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "duck 4's bank has 7 columns"), "%s", why);
	free(m);
	m = moe_request(0);
	m->shard_sizes[2] += 3; /* shared columns on duck 6, no shared set */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "duck 6's bank holds 3 shared-expert columns "
						   "but shared_ducks is empty"),
	      "%s", why);
	m->shared_ducks_len = 2; /* the set names a duck with none */
	m->shared_ducks[0] = 6;
	m->shared_ducks[1] = 4;
	CHECK(build(m, why, NULL) < 0 &&
		      strstr(why, "duck 4 is in shared_ducks but its bank holds no shared"),
	      "%s", why);
	m->shared_ducks[1] = 7; /* not the layer's */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "shared_ducks names duck 7, which is not"),
	      "%s", why);
	m->shared_ducks[1] = 6;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "shared_ducks names duck 6 twice"), "%s", why);
	free(m);
	m = moe_request(0);
	m->expert_ducks[4] = m->expert_ducks[5] = 2; /* experts 4, 5: duck 6 holds none */
	m->expert_ducks[6] = 4;
	m->shard_sizes[0] = 4 * EFFN; /* duck 2: 0 1 4 5; duck 4: 2 3 5; duck 6: nothing */
	m->shard_sizes[1] = 3 * EFFN;
	m->shard_sizes[2] = 0;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "duck 6 holds no expert"), "%s", why);
	free(m);
	m = moe_request(0);
	m->has_b_down = true;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "no b_down"), "%s", why);
	free(m);
	m = moe_request(0);
	m->expert_ffn = 0;
	CHECK(build(m, why, NULL) < 0 && strstr(why, "expert_ffn"), "%s", why);
	free(m);
	m = moe_request(0);
	m->kind = DP_MLP_KIND_SWIGLU; /* dense, with MoE fields */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "is dense"), "%s", why);
	m->expert_ffn = 0;
	m->expert_replicas_len = m->expert_ducks_len = 0;
	struct dp_layer *l;
	CHECK(build(m, why, &l) == 0 && !l->moe, "a dense load: %s", why);
	dp_layer_free(l);
	free(m);
}

/* --- the descriptor and the table ------------------------------------------------------- */

static const struct dp_client_layout layout = {
	.slot_count = 2, .ring_capacity = 8, .act_slot_size = 4096, .res_slot_size = 4096
};
static const struct dp_limits limits = {
	.max_forward_bytes = 1 << 16, .default_timeout_us = 1000000, .max_timeout_us = 10000000
};

static struct dp_desc routed(uint32_t rows, uint32_t flags)
{
	struct dp_desc d;
	memset(&d, 0, sizeof(d));
	d.op = DP_OP_FORWARD;
	d.layer = 9;
	d.dtype = DP_DTYPE_F32;
	d.ndim = 2;
	d.shape[0] = rows;
	d.shape[1] = HIDDEN;
	d.nbytes = (uint64_t)rows * HIDDEN * 4;
	d.flags = flags;
	return d;
}

static int check_desc(const struct dp_layer *l, const struct dp_desc *d, struct dp_desc_plan *p,
		      char *why)
{
	struct dp_desc_layer view;
	return dp_desc_check(&layout, dp_desc_layer_of(l, &view), d, &limits, p, why,
			     DP_DESC_WHY_LEN);
}

static void test_routed_descriptor_rules(void)
{
	struct dp_ctl_load_weights *m = moe_request(0);
	struct dp_layer *l;
	char why[DP_DESC_WHY_LEN] = "";
	struct dp_desc_plan p;
	CHECK(build(m, why, &l) == 0, "%s", why);
	struct dp_desc d = routed(3, DP_DESC_FLAG_ROUTED);
	CHECK(check_desc(l, &d, &p, why) == 0 && p.rows == 3, "a routed forward: %s", why);
	d = routed(3, DP_DESC_FLAG_ROUTED | DP_DESC_FLAG_MOE_UNICAST);
	CHECK(check_desc(l, &d, &p, why) == 0, "forced unicast: %s", why);
	d = routed(3, 0);
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "needs its routing"), "%s", why);
	d = routed(3, DP_DESC_FLAG_ROUTED | DP_DESC_FLAG_MOE_UNICAST | DP_DESC_FLAG_MOE_BROADCAST);
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "together"), "%s", why);
	d = routed(3, DP_DESC_FLAG_ROUTED);
	d.ducks[0] = 1u << 2;
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "takes no target set"), "%s", why);
	d = routed(3, DP_DESC_FLAG_ROUTED | 64);
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "flags 0x41"), "%s", why);
	d = routed(DP_MAX_TOKENS + 1, DP_DESC_FLAG_ROUTED);
	d.ndim = 3; /* 4097 rows in few bytes: 4097 x 1 x hidden */
	d.shape[0] = DP_MAX_TOKENS + 1;
	d.shape[1] = 1;
	d.shape[2] = HIDDEN;
	CHECK(check_desc(l, &d, &p, why) < 0, "4097 rows passed");
	l->kind = DP_MLP_KIND_SWIGLU;
	d = routed(3, DP_DESC_FLAG_ROUTED);
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "is dense"), "%s", why);
	d = routed(3, DP_DESC_FLAG_MOE_BROADCAST);
	CHECK(check_desc(l, &d, &p, why) < 0 && strstr(why, "routed forwards only"), "%s", why);
	d = routed(3, 0);
	CHECK(check_desc(l, &d, &p, why) == 0, "a dense forward: %s", why);
	dp_layer_free(l);
	free(m);
}

/* A host table for tokens x topk written into a slot at its offset. */
static void put_table(uint8_t *slot, uint64_t nbytes, uint32_t tokens, uint16_t topk,
		      const uint32_t *experts, const float *weights)
{
	uint8_t *t = slot + dp_desc_routing_offset(nbytes);
	struct dp_routing_header h = { DP_ROUTING_MAGIC, DP_ROUTING_VERSION, 0, topk, tokens, 6 };
	memcpy(t, &h, sizeof(h));
	for (uint32_t i = 0; i < tokens * topk; i++) {
		struct dp_routing_entry e = { experts[i], weights[i] };
		memcpy(t + 16 + 8 * (uint64_t)i, &e, sizeof(e));
	}
}

static void test_the_table_is_copied_once_and_checked(void)
{
	static const uint32_t EXP[6] = { 0, 5, 2, 3, 1, 4 }; /* ascending per token */
	static const float WT[6] = { 0.5f, 0.5f, 1, 2, -1, 0.25f };
	uint8_t *slot = calloc(1, layout.act_slot_size);
	uint8_t copy[4096];
	uint64_t size = 0;
	char why[DP_DESC_WHY_LEN] = "";
	struct dp_desc_plan p = { .bytes = 3 * HIDDEN * 4, .rows = 3 };
	put_table(slot, p.bytes, 3, 2, EXP, WT);
	CHECK(dp_desc_routing_copy(&layout, &limits, &p, slot, 6, copy, sizeof(copy), &size, why,
				   sizeof(why)) == 0 &&
		      size == 16 + 6 * 8,
	      "a good table: %s", why);
	CHECK(memcmp(copy, slot + dp_desc_routing_offset(p.bytes), size) == 0, "copied");
	/* the same table checked against a 4-expert layer: expert 5 is past it */
	CHECK(dp_desc_routing_copy(&layout, &limits, &p, slot, 4, copy, sizeof(copy), &size, why,
				   sizeof(why)) < 0 &&
		      strstr(why, "routing:"),
	      "n_experts: %s", why);
	/* an activation that leaves no room for the table: the message says connect(slot_size=) */
	struct dp_desc_plan big = { .bytes = layout.act_slot_size - 32, .rows = 1 };
	CHECK(dp_desc_routing_copy(&layout, &limits, &big, slot, 6, copy, sizeof(copy), &size, why,
				   sizeof(why)) < 0 &&
		      strstr(why, "slot_size"),
	      "no room: %s", why);
	/* one duck's message (the worst wire table and every row) is held to
	 * max_forward_bytes: what a duck reassembles and a NACK names chunks of */
	struct dp_limits tight = limits;
	tight.max_forward_bytes = 16 + 8 * (DP_MAX_DUCKS + 6) + p.bytes - 1;
	CHECK(dp_desc_routing_copy(&layout, &tight, &p, slot, 6, copy, sizeof(copy), &size, why,
				   sizeof(why)) < 0 &&
		      strstr(why, "in one message") && strstr(why, "max_forward_bytes"),
	      "bound: %s", why);
	tight.max_forward_bytes++;
	CHECK(dp_desc_routing_copy(&layout, &tight, &p, slot, 6, copy, sizeof(copy), &size, why,
				   sizeof(why)) == 0,
	      "at the bound: %s", why);
	/* the table is copied into the context's copy_cap bytes: one fewer is refused */
	CHECK(dp_desc_routing_copy(&layout, &limits, &p, slot, 6, copy, 16 + 6 * 8 - 1, &size,
				   why, sizeof(why)) < 0,
	      "copy_cap");
	/* a duplicate expert for token 1 */
	uint32_t dup[6] = { 0, 5, 3, 3, 1, 4 };
	put_table(slot, p.bytes, 3, 2, dup, WT);
	CHECK(dp_desc_routing_copy(&layout, &limits, &p, slot, 6, copy, sizeof(copy), &size, why,
				   sizeof(why)) < 0 &&
		      strstr(why, "twice"),
	      "duplicate: %s", why);
	free(slot);
}

/* --- the mode, the row maps, the sum ------------------------------------------------------ */

static void test_the_mode_rule(void)
{
	CHECK(dp_moe_choose(0, 1000, 999) == DP_MOE_MODE_UNICAST, "fewer bytes");
	CHECK(dp_moe_choose(0, 1000, 1000) == DP_MOE_MODE_BROADCAST, "a tie");
	CHECK(dp_moe_choose(DP_DESC_FLAG_MOE_UNICAST, 10, 1000) == DP_MOE_MODE_UNICAST,
	      "forced unicast");
	/* no staging area: a forced unicast of any size stays one (issue 28.6) */
	CHECK(dp_moe_choose(DP_DESC_FLAG_MOE_UNICAST, 10, 1ull << 40) == DP_MOE_MODE_UNICAST,
	      "forced unicast of many bytes");
	CHECK(dp_moe_choose(DP_DESC_FLAG_MOE_BROADCAST, 1000, 10) ==
		      DP_MOE_MODE_BROADCAST,
	      "forced broadcast");
}

static void test_row_maps_from_a_split(void)
{
	struct dp_ctl_load_weights *m = moe_request(0);
	struct dp_layer *l;
	char why[DP_DESC_WHY_LEN] = "";
	CHECK(build(m, why, &l) == 0, "%s", why);
	/* tokens 0..3, top-2: 0 {0, 5}, 1 {2, 3}, 2 {1, 4}, 3 {0, 5}
	 * expert 5 has replicas (6, 2): token t uses ducks[t % 2]: t0 -> 6, t3 -> 2 */
	static const uint32_t EXP[8] = { 0, 5, 2, 3, 1, 4, 0, 5 };
	static const float WT[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint8_t host[16 + 64];
	struct dp_routing_header h = { DP_ROUTING_MAGIC, DP_ROUTING_VERSION, 0, 2, 4, 6 };
	memcpy(host, &h, 16);
	for (uint32_t i = 0; i < 8; i++) {
		struct dp_routing_entry e = { EXP[i], WT[i] };
		memcpy(host + 16 + 8 * i, &e, 8);
	}
	uint8_t wire[512];
	uint64_t wsize, targets[4], nic[4] = { (1u << 2) | (1u << 4) | (1u << 6) }; /* as a worker */
	CHECK(dp_routing_split(host, sizeof(host), &l->moe->pl, l->moe->slots, 0, nic, wire,
			       sizeof(wire), &wsize, targets, why, sizeof(why)) == 0,
	      "split: %s", why);
	CHECK(dp_routing_wire_check(wire, wsize, 4, 3, why, sizeof(why)) == 0, "wire: %s", why);
	struct dp_routing_section s;
	uint16_t map[8];
	/* duck 2: rows 0 (e0), 2 (e1), 3 (e0, e5) -> rows 0 2 3 */
	CHECK(dp_routing_wire_section(wire, wsize, 2, &s) == 0, "duck 2's section");
	CHECK(dp_moe_row_map(wire, &s, map) == 3 && map[0] == 0 && map[1] == 2 && map[2] == 3,
	      "duck 2's map %u %u %u", map[0], map[1], map[2]);
	/* duck 4: row 1 (e3, e2) */
	CHECK(dp_routing_wire_section(wire, wsize, 4, &s) == 0, "duck 4's section");
	CHECK(dp_moe_row_map(wire, &s, map) == 1 && map[0] == 1 && s.n_entries == 2, "duck 4's map");
	/* duck 6: rows 0 (e5), 2 (e4) */
	CHECK(dp_routing_wire_section(wire, wsize, 6, &s) == 0, "duck 6's section");
	CHECK(dp_moe_row_map(wire, &s, map) == 2 && map[0] == 0 && map[1] == 2, "duck 6's map");
	dp_layer_free(l);
	free(m);
}

static void sum_in_chunks(float *acc, const uint16_t *map, const uint8_t *reply, uint32_t rows,
			  uint8_t dtype, uint32_t chunk_items)
{
	uint32_t item = dp_dtype_size(dtype), n = rows * HIDDEN;
	for (uint32_t first = 0; first < n; first += chunk_items) {
		uint32_t k = n - first < chunk_items ? n - first : chunk_items;
		dp_moe_accumulate(acc, HIDDEN, map, first, reply + (size_t)first * item, k, dtype);
	}
}

static void test_the_row_mapped_sum(void)
{
	enum { ROWS = 5, REPLY = 3 };
	static const uint16_t map[REPLY] = { 4, 0, 2 };
	float reply[REPLY * HIDDEN], want[ROWS * HIDDEN];
	uint16_t reply16[REPLY * HIDDEN];
	for (uint32_t i = 0; i < REPLY * HIDDEN; i++) {
		reply[i] = (float)(int)(frand() * 64) / 8; /* exact in float16 */
		reply16[i] = dp_f32_to_f16(reply[i]);
	}
	/* chunks of 1, 3, 5, 8, 13 values: boundaries inside rows, on rows, across rows */
	static const uint32_t sizes[] = { 1, 3, 5, 8, 13, REPLY * HIDDEN };
	for (uint32_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		float acc[ROWS * HIDDEN], acc16[ROWS * HIDDEN];
		for (uint32_t i = 0; i < ROWS * HIDDEN; i++)
			acc[i] = acc16[i] = want[i] = (float)i;
		for (uint32_t r = 0; r < REPLY; r++)
			for (uint32_t c = 0; c < HIDDEN; c++)
				want[map[r] * HIDDEN + c] += reply[r * HIDDEN + c];
		sum_in_chunks(acc, map, (const uint8_t *)reply, REPLY, DP_DTYPE_F32, sizes[k]);
		sum_in_chunks(acc16, map, (const uint8_t *)reply16, REPLY, DP_DTYPE_F16, sizes[k]);
		CHECK(memcmp(acc, want, sizeof(acc)) == 0, "float32, chunks of %u", sizes[k]);
		CHECK(memcmp(acc16, want, sizeof(acc16)) == 0, "float16, chunks of %u", sizes[k]);
	}
	/* identity (the shared expert's replies: every row) */
	float acc[REPLY * HIDDEN] = { 0 };
	sum_in_chunks(acc, NULL, (const uint8_t *)reply, REPLY, DP_DTYPE_F32, 7);
	CHECK(memcmp(acc, reply, sizeof(acc)) == 0, "identity map");
}

/* A duck went silent with part of its reply summed; two failover replies stand in for
 * it (A: its rows 0 and 3, B: rows 0, 2 and 3, as replacements of two of its experts),
 * delivered in chunks of any size: each (row, column) of its share is in the sum once. */
static void test_a_failover_reply_adds_only_what_the_silent_duck_did_not(void)
{
	enum { ROWS = 5, S_ROWS = 3 };
	static const uint16_t s_map[S_ROWS] = { 0, 2, 3 }, a_map[2] = { 0, 3 }, b_map[3] = { 0, 2, 3 };
	float s[S_ROWS * HIDDEN], a[2 * HIDDEN], b[3 * HIDDEN];
	for (uint32_t i = 0; i < S_ROWS * HIDDEN; i++)
		s[i] = (float)(int)(frand() * 64) / 8; /* exact sums below */
	for (uint32_t i = 0; i < 2 * HIDDEN; i++)
		a[i] = (float)(int)(frand() * 64) / 8;
	for (uint32_t r = 0; r < 3; r++) /* B = S - A where A has the row: A + B = S */
		for (uint32_t c = 0; c < HIDDEN; c++) {
			uint32_t ar = b_map[r] == 0 ? 0 : b_map[r] == 3 ? 1 : 2;
			b[r * HIDDEN + c] = s[r * HIDDEN + c] - (ar < 2 ? a[ar * HIDDEN + c] : 0);
		}
	static const uint32_t chunk_items[] = { 1, 3, 5, 8, 13, S_ROWS * HIDDEN };
	for (uint32_t k = 0; k < sizeof(chunk_items) / sizeof(chunk_items[0]); k++) {
		uint32_t per = chunk_items[k], n = S_ROWS * HIDDEN;
		struct dp_reasm got;
		dp_reasm_reset(&got, (n + per - 1) / per);
		float acc[ROWS * HIDDEN], want[ROWS * HIDDEN];
		for (uint32_t i = 0; i < ROWS * HIDDEN; i++)
			acc[i] = want[i] = (float)i;
		for (uint32_t r = 0; r < S_ROWS; r++)
			for (uint32_t c = 0; c < HIDDEN; c++)
				want[s_map[r] * HIDDEN + c] += s[r * HIDDEN + c];
		/* the silent duck delivered every other chunk (the first included) */
		for (uint32_t c = 0; c < got.chunks; c += 2) {
			uint32_t first = c * per, m = n - first < per ? n - first : per;
			dp_moe_accumulate(acc, HIDDEN, s_map, first, s + first, m, DP_DTYPE_F32);
			dp_reasm_mark(&got, c);
		}
		/* the stand-ins' replies, in chunks of another size */
		uint32_t theirs = chunk_items[(k + 1) % (sizeof(chunk_items) / sizeof(chunk_items[0]))];
		for (uint32_t first = 0; first < 2 * HIDDEN; first += theirs) {
			uint32_t m = 2 * HIDDEN - first < theirs ? 2 * HIDDEN - first : theirs;
			dp_moe_accumulate_rest(acc, HIDDEN, a_map, first, a + first, m, DP_DTYPE_F32,
					       s_map, S_ROWS, &got, per * 4);
		}
		for (uint32_t first = 0; first < 3 * HIDDEN; first += theirs) {
			uint32_t m = 3 * HIDDEN - first < theirs ? 3 * HIDDEN - first : theirs;
			dp_moe_accumulate_rest(acc, HIDDEN, b_map, first, b + first, m, DP_DTYPE_F32,
					       s_map, S_ROWS, &got, per * 4);
		}
		uint32_t bad = 0;
		for (uint32_t i = 0; i < ROWS * HIDDEN; i++)
			bad += acc[i] != want[i];
		CHECK(bad == 0, "silent chunks of %u values, stand-ins' of %u: %u values wrong", per,
		      theirs, bad);
	}
}

/* The same for a duck of the shared set (every row, no map on it or on its shared
 * columns' stand-in B; A takes its rows 1 and 3), in float16: replies of 2-byte items. */
static void test_a_shared_stand_in_adds_only_what_the_silent_duck_did_not_in_float16(void)
{
	enum { ROWS = 4 };
	static const uint16_t a_map[2] = { 1, 3 };
	float s[ROWS * HIDDEN], a[2 * HIDDEN], b[ROWS * HIDDEN];
	uint16_t a16[2 * HIDDEN], b16[ROWS * HIDDEN], s16[ROWS * HIDDEN];
	for (uint32_t i = 0; i < 2 * HIDDEN; i++) {
		a[i] = (float)(int)(frand() * 64) / 8;
		a16[i] = dp_f32_to_f16(a[i]);
	}
	for (uint32_t r = 0; r < ROWS; r++)
		for (uint32_t c = 0; c < HIDDEN; c++) {
			uint32_t i = r * HIDDEN + c;
			s[i] = (float)(int)(frand() * 64) / 8;
			b[i] = s[i] - (r == 1 ? a[c] : r == 3 ? a[HIDDEN + c] : 0);
			s16[i] = dp_f32_to_f16(s[i]);
			b16[i] = dp_f32_to_f16(b[i]);
		}
	static const uint32_t chunk_items[] = { 1, 3, 6, 8, 13, ROWS * HIDDEN };
	enum { NK = sizeof(chunk_items) / sizeof(chunk_items[0]) };
	for (uint32_t k = 0; k < NK; k++) {
		uint32_t per = chunk_items[k], n = ROWS * HIDDEN, theirs = chunk_items[(k + 2) % NK];
		struct dp_reasm got;
		dp_reasm_reset(&got, (n + per - 1) / per);
		float acc[ROWS * HIDDEN], want[ROWS * HIDDEN];
		for (uint32_t i = 0; i < n; i++) {
			acc[i] = (float)i;
			want[i] = (float)i + s[i];
		}
		for (uint32_t c = 1; c < got.chunks; c += 2) { /* every other, from the second */
			uint32_t first = c * per, m = n - first < per ? n - first : per;
			dp_moe_accumulate(acc, HIDDEN, NULL, first, s16 + first, m, DP_DTYPE_F16);
			dp_reasm_mark(&got, c);
		}
		for (uint32_t first = 0; first < 2 * HIDDEN; first += theirs)
			dp_moe_accumulate_rest(acc, HIDDEN, a_map, first, a16 + first,
					       2 * HIDDEN - first < theirs ? 2 * HIDDEN - first : theirs,
					       DP_DTYPE_F16, NULL, ROWS, &got, per * 2);
		for (uint32_t first = 0; first < n; first += theirs)
			dp_moe_accumulate_rest(acc, HIDDEN, NULL, first, b16 + first,
					       n - first < theirs ? n - first : theirs, DP_DTYPE_F16,
					       NULL, ROWS, &got, per * 2);
		uint32_t bad = 0;
		for (uint32_t i = 0; i < n; i++)
			bad += acc[i] != want[i];
		CHECK(bad == 0, "float16, silent chunks of %u values, stand-ins' of %u: %u wrong", per,
		      theirs, bad);
	}
}

/* Whose shared columns stand in for whose: ducks 0-5, one 4-column expert each, the
 * shared expert (8 columns) in sets {1, 3}, {0, 2}, {4, 5}, each duck half of it (lo 0 or
 * 4 by the layer's duck order). */
static void test_the_shared_stand_in_rule(void)
{
	struct dp_layer_moe *moe = calloc(1, sizeof(*moe));
	static const uint16_t ducks[6] = { 0, 1, 2, 3, 4, 5 };
	uint32_t shard[6] = { 8, 8, 8, 8, 8, 8 };
	moe->expert_ffn = 4;
	for (uint32_t d = 0; d < 6; d++)
		moe->experts_on[d] = 1;
	moe->has_shared = true;
	moe->n_shared_sets = 3;
	moe->shared_set[0] = 0x0a; /* set 0: ducks 1, 3 */
	moe->shared_set[4] = 0x05; /* set 1: ducks 0, 2 */
	moe->shared_set[8] = 0x30; /* set 2: ducks 4, 5 */
	uint64_t can[4] = { 0x3f };
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 3, can) == 2,
	      "duck 3 (set 0, columns 4-7): duck 2 of the next set");
	can[0] = 0x3f & ~(1ull << 2);
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 3, can) == 5,
	      "duck 2 cannot: duck 5 of the set after");
	can[0] = 0x3f & ~(1ull << 2) & ~(1ull << 5);
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 3, can) == DP_MAX_DUCKS,
	      "neither can: none");
	can[0] = 0x3f & ~(1ull << 5);
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 2, can) == 3,
	      "duck 2 (set 1): duck 5 cannot, then set 0 (cyclically): duck 3");
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 1, can) == 0,
	      "duck 1 (set 0, columns 0-3): duck 0");
	/* set 2 as one duck with all 8 columns (duck 5 holds none): cut otherwise */
	moe->shared_set[8] = 0x10;
	shard[4] = 12;
	shard[5] = 4;
	can[0] = 0x3f & ~(1ull << 2);
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 3, can) == DP_MAX_DUCKS,
	      "duck 4 holds columns 0-7, not 4-7: no stand-in");
	CHECK(dp_load_moe_shared_stand_in(moe, ducks, shard, 6, 5, can) == DP_MAX_DUCKS,
	      "duck 5 holds no shared columns");
	free(moe);
}

static void test_a_missing_duck_is_named_with_its_experts(void)
{
	struct dp_ctl_load_weights *m = moe_request(0);
	struct dp_layer *l;
	char why[DP_DESC_WHY_LEN] = "", buf[DP_DESC_WHY_LEN];
	CHECK(build(m, why, &l) == 0, "%s", why);
	dp_layer_describe_duck(l, 2, buf, sizeof(buf));
	CHECK(strcmp(buf, "duck 2 (experts 0 1 5)") == 0, "got '%s'", buf);
	dp_layer_describe_duck(l, 6, buf, 20); /* cut: ends with ...) inside the room */
	CHECK(strlen(buf) < 20, "cut to '%s'", buf);
	dp_layer_free(l);
	free(m);
	/* 300 experts on one duck: the list is cut with "..." */
	m = moe_request(0);
	m->ducks_len = m->shard_sizes_len = 1;
	m->expert_replicas_len = m->expert_ducks_len = 300;
	for (uint32_t e = 0; e < 300; e++) {
		m->expert_replicas[e] = 1;
		m->expert_ducks[e] = 2;
	}
	m->shard_sizes[0] = 300 * EFFN;
	CHECK(build(m, why, &l) == 0, "%s", why);
	dp_layer_describe_duck(l, 2, buf, sizeof(buf));
	CHECK(strlen(buf) < sizeof(buf) && strstr(buf, " ...)") && strstr(buf, "experts 0 1 2"),
	      "got '%s'", buf);
	dp_layer_free(l);
	free(m);
}

/* LayerInfo's expert_replicas, expert_ducks and shared_ducks, as a Layers reply lists
 * them: the placement as LoadWeights gave it, and the ducks with shared columns. */
static void test_the_placement_is_listed_for_layer_info(void)
{
	static const uint32_t replicas[6] = { 1, 1, 1, 1, 1, 2 };
	static const uint32_t placed[7] = { 2, 2, 4, 4, 6, 6, 2 };
	static const uint32_t all[3] = { 2, 4, 6 };
	for (uint32_t shared_cols = 0; shared_cols <= 2; shared_cols += 2) {
		struct dp_ctl_load_weights *m = moe_request(shared_cols);
		struct dp_layer *l;
		char why[DP_DESC_WHY_LEN] = "";
		CHECK(build(m, why, &l) == 0, "%s", why);
		size_t n = dp_layer_moe_list_words(l);
		CHECK(n == 6 + 7 + 3, "words %zu", n);
		uint32_t words[16];
		struct dp_moe_listing ls;
		dp_layer_moe_list(l, words, &ls);
		CHECK(ls.n_experts == 6 && !memcmp(ls.replicas, replicas, sizeof(replicas)),
		      "replicas");
		CHECK(ls.n_placed == 7 && !memcmp(ls.ducks, placed, sizeof(placed)), "ducks");
		CHECK(ls.n_shared == (shared_cols ? 3u : 0u), "shared ducks %u", ls.n_shared);
		CHECK(!shared_cols || !memcmp(ls.shared, all, sizeof(all)), "shared ducks 2 4 6");
		dp_layer_free(l);
		free(m);
	}
}

/* The shared expert's replicas (LoadWeights.shared_sets, issue 30.1): shared_ducks cut
 * into sets that each hold the whole shared expert, listed set by set; refused when the
 * sizes do not add up or a set holds another width. */
static void test_shared_sets_are_kept_checked_and_listed(void)
{
	struct dp_ctl_load_weights *m = moe_request(2); /* 2 shared columns on ducks 2, 4, 6 */
	struct dp_layer *l;
	char why[DP_DESC_WHY_LEN] = "";
	/* sets {6} and {2, 4}: duck 6 holds all 4 columns, ducks 2 and 4 2 each */
	m->shard_sizes[2] += 2;
	m->ffn += 2;
	m->shared_ducks[0] = 6;
	m->shared_ducks[1] = 2;
	m->shared_ducks[2] = 4;
	m->shared_sets_len = 2;
	m->shared_sets[0] = 1;
	m->shared_sets[1] = 2;
	CHECK(build(m, why, &l) == 0, "two sets refused: %s", why);
	const struct dp_layer_moe *moe = l->moe;
	CHECK(moe->n_shared_sets == 2 && moe->shared_set[0] == 0x40 && moe->shared_set[4] == 0x14,
	      "sets %u: %llx %llx", moe->n_shared_sets, (unsigned long long)moe->shared_set[0],
	      (unsigned long long)moe->shared_set[4]);
	uint32_t words[32];
	struct dp_moe_listing ls;
	CHECK(dp_layer_moe_list_words(l) == 6 + 7 + 3 + 2, "words");
	dp_layer_moe_list(l, words, &ls);
	static const uint32_t shared[3] = { 6, 2, 4 }, sizes[2] = { 1, 2 };
	CHECK(ls.n_shared == 3 && !memcmp(ls.shared, shared, sizeof(shared)) && ls.n_sets == 2 &&
		      !memcmp(ls.sets, sizes, sizeof(sizes)),
	      "listed set by set");
	dp_layer_free(l);
	m->shared_sets[1] = 1; /* 1 + 1 of 3 */
	CHECK(build(m, why, NULL) < 0 && strstr(why, "shared_sets cut 2 ducks into 2 sets"),
	      "sizes: %s", why);
	m->shared_sets[1] = 2;
	m->shard_sizes[2] -= 1; /* set 0: 3 columns, set 1: 4 */
	m->ffn -= 1;
	CHECK(build(m, why, NULL) < 0 &&
		      strstr(why, "shared set 1 holds 4 shared-expert columns, set 0 3"),
	      "widths: %s", why);
	free(m);
}

int main(void)
{
	test_a_moe_load_keeps_its_placement_and_banks();
	test_a_bad_moe_load_is_refused_saying_why();
	test_routed_descriptor_rules();
	test_the_table_is_copied_once_and_checked();
	test_the_mode_rule();
	test_row_maps_from_a_split();
	test_the_row_mapped_sum();
	test_a_failover_reply_adds_only_what_the_silent_duck_did_not();
	test_a_shared_stand_in_adds_only_what_the_silent_duck_did_not_in_float16();
	test_the_shared_stand_in_rule();
	test_a_missing_duck_is_named_with_its_experts();
	test_the_placement_is_listed_for_layer_info();
	test_shared_sets_are_kept_checked_and_listed();
	return test_result("test_moe");
}
