/* test_routing.c: dp_routing.h accepts the tables a client and the dataplane write,
 * refuses every hostile variant with the right code, and splits a host table into the
 * per-duck wire sections a hand count expects. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_routing.h"
#include "test_check.h"

#define EXPERTS 8u
#define TOKENS 4u
#define TOPK 2u

/* A host table in a heap buffer of exactly its size, so that ASan (make SANITIZE=1)
 * sees a read one byte past it. */
struct host {
	uint8_t *buf;
	uint64_t len;
};

static struct host host_table(uint32_t tokens, uint32_t topk, uint32_t n_experts,
			      const uint32_t *experts, const float *weights)
{
	struct host t;
	CHECK(dp_routing_size(tokens, topk, &t.len) == 0, "size");
	t.buf = malloc(t.len);
	struct dp_routing_header h = { DP_ROUTING_MAGIC, DP_ROUTING_VERSION, 0, (uint16_t)topk,
				       tokens, n_experts };
	memcpy(t.buf, &h, sizeof(h));
	for (uint32_t i = 0; i < tokens * topk; i++) {
		struct dp_routing_entry e = { experts[i], weights[i] };
		memcpy(t.buf + 16 + 8 * (uint64_t)i, &e, sizeof(e));
	}
	return t;
}

/* token t -> experts, ascending as a host table lists them: 0 {1, 5}, 1 {2, 5}, 2 {0, 7},
 * 3 {1, 2} */
static const uint32_t EXP[TOKENS * TOPK] = { 1, 5, 2, 5, 0, 7, 1, 2 };
static const float W[TOKENS * TOPK] = { 0.5f, 0.25f, 1.0f, 2.0f, -0.5f, 0.125f, 3.0f, 0.0f };

static struct host good(void)
{
	return host_table(TOKENS, TOPK, EXPERTS, EXP, W);
}

static int check(const struct host *t)
{
	char why[200];
	return dp_routing_check(t->buf, t->len, TOKENS, EXPERTS, why, sizeof(why));
}

static void set_u32(struct host *t, uint64_t off, uint32_t v)
{
	memcpy(t->buf + off, &v, 4);
}

static void test_accepts_the_table_a_client_packs(void)
{
	struct host t = good();
	char why[200] = "";
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	CHECK(t.len == 16 + 8 * TOKENS * TOPK, "len %lu", (unsigned long)t.len);
	free(t.buf);
}

static void test_refuses_a_header_that_disagrees_with_the_forward_or_layer(void)
{
	char why[200];
	struct host t = good();
	CHECK(dp_routing_check(t.buf, t.len, TOKENS + 1, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_TOKENS,
	      "tokens");
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS + 1, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_N_EXPERTS,
	      "n_experts");
	CHECK(strstr(why, "routes over 8 experts, the layer has 9"), "why: %s", why);
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, 0, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_N_EXPERTS,
	      "layer of 0 experts");
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, DP_MAX_EXPERTS + 1, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_N_EXPERTS,
	      "layer past MAX_EXPERTS");
	t.buf[0] ^= 1;
	CHECK(check(&t) == DP_ROUTING_ERROR_BAD_MAGIC, "magic");
	t.buf[0] ^= 1;
	t.buf[4] = 2;
	CHECK(check(&t) == DP_ROUTING_ERROR_BAD_VERSION, "version");
	t.buf[4] = DP_ROUTING_VERSION;
	t.buf[5] = 0x80;
	CHECK(check(&t) == DP_ROUTING_ERROR_BAD_FLAGS, "flags");
	t.buf[5] = 0;
	t.buf[6] = 0;
	CHECK(check(&t) == DP_ROUTING_ERROR_TOPK, "topk 0");
	t.buf[6] = 9; /* more than the layer's 8 experts */
	CHECK(check(&t) == DP_ROUTING_ERROR_TOPK, "topk 9");
	t.buf[6] = TOPK;
	CHECK(check(&t) == 0, "restored");
	free(t.buf);
}

static void test_refuses_truncated_tables_and_reads_nothing_past_len(void)
{
	struct host t = good();
	for (uint64_t len = 0; len < t.len; len++) {
		/* the first len bytes at the end of a buffer of len: ASan catches a read past */
		uint8_t *cut = malloc(len ? len : 1);
		memcpy(cut, t.buf, len);
		char why[200];
		int rc = dp_routing_check(cut, len, TOKENS, EXPERTS, why, sizeof(why));
		CHECK(rc == DP_ROUTING_ERROR_TRUNCATED, "len %lu: %d", (unsigned long)len, rc);
		free(cut);
	}
	free(t.buf);
}

static void test_refuses_counts_whose_size_would_overflow(void)
{
	/* 2^32-1 tokens by 2^16-1: 2^51 bytes; refused on the maximums, never multiplied */
	uint8_t buf[16];
	struct dp_routing_header h = { DP_ROUTING_MAGIC, DP_ROUTING_VERSION, 0, 0xffff,
				       0xffffffffu, EXPERTS };
	memcpy(buf, &h, sizeof(h));
	char why[200];
	CHECK(dp_routing_check(buf, sizeof(buf), 0xffffffffu, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_TOKENS,
	      "tokens 2^32-1");
	h.tokens = DP_MAX_TOKENS;
	memcpy(buf, &h, sizeof(h));
	CHECK(dp_routing_check(buf, sizeof(buf), DP_MAX_TOKENS, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_TOPK,
	      "topk 2^16-1");
	/* at the maximums: needs 512 KiB, has 16 bytes */
	h.topk = DP_MAX_TOPK;
	memcpy(buf, &h, sizeof(h));
	CHECK(dp_routing_check(buf, sizeof(buf), DP_MAX_TOKENS, DP_MAX_EXPERTS, why,
			       sizeof(why)) == DP_ROUTING_ERROR_N_EXPERTS,
	      "n_experts mismatch first");
	h.n_experts = DP_MAX_EXPERTS;
	memcpy(buf, &h, sizeof(h));
	CHECK(dp_routing_check(buf, sizeof(buf), DP_MAX_TOKENS, DP_MAX_EXPERTS, why,
			       sizeof(why)) == DP_ROUTING_ERROR_TRUNCATED,
	      "at the maximums");
	CHECK(strstr(why, "need 524304 bytes, the table has 16"), "why: %s", why);
	uint64_t size;
	CHECK(dp_routing_size(1ull << 62, 4, &size) < 0, "size wraps");
	CHECK(dp_routing_size(UINT64_MAX / 8, 1, &size) < 0, "header add wraps");
	CHECK(dp_routing_wire_size(UINT64_MAX, 1, &size) < 0, "wire size wraps");
}

static void test_refuses_an_expert_past_the_layer(void)
{
	struct host t = good();
	set_u32(&t, 16 + 8 * 5, EXPERTS); /* token 2, choice 1 */
	char why[200];
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_EXPERT,
	      "expert 8");
	CHECK(strstr(why, "token 2, choice 1 names expert 8"), "why: %s", why);
	set_u32(&t, 16 + 8 * 5, 0xfffffffeu); /* 2^32-1 is DP_ROUTING_NO_EXPERT */
	CHECK(check(&t) == DP_ROUTING_ERROR_EXPERT, "expert 2^32-2");
	free(t.buf);
}

static void test_refuses_a_token_that_names_an_expert_twice(void)
{
	struct host t = good();
	set_u32(&t, 16 + 8 * 6, 2); /* token 3: {2, 2} */
	char why[200];
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_DUPLICATE,
	      "duplicate");
	CHECK(strstr(why, "token 3 names expert 2 twice"), "why: %s", why);
	free(t.buf);
	/* the same expert in different tokens is fine: each token's order is its own */
	static const uint32_t same[4] = { 3, 4, 3, 4 };
	static const float w[4] = { 1, 1, 1, 1 };
	t = host_table(2, 2, EXPERTS, same, w);
	CHECK(dp_routing_check(t.buf, t.len, 2, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	free(t.buf);
}

/* A token's experts ascend: distinct, and already in the order a duck's section needs
 * (the split writes each entry where its duck's next one goes, with no sort); -1 last. */
static void test_refuses_a_token_whose_experts_do_not_ascend(void)
{
	struct host t = good();
	set_u32(&t, 16 + 8 * 2, 5); /* token 1: {5, 2} */
	set_u32(&t, 16 + 8 * 3, 2);
	char why[200];
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_ORDER,
	      "descending");
	CHECK(strstr(why, "token 1, choice 1 names expert 2 after expert 5"), "why: %s", why);
	set_u32(&t, 16 + 8 * 2, DP_ROUTING_NO_EXPERT); /* token 1: {-1, 2} */
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_ORDER,
	      "an expert after -1");
	CHECK(strstr(why, "token 1, choice 1 names expert 2 after a -1"), "why: %s", why);
	set_u32(&t, 16 + 8 * 2, 2); /* token 1: {2, -1}, then {-1, -1}: -1 last, as often */
	set_u32(&t, 16 + 8 * 3, DP_ROUTING_NO_EXPERT);
	CHECK(check(&t) == 0, "-1 last");
	set_u32(&t, 16 + 8 * 2, DP_ROUTING_NO_EXPERT);
	CHECK(check(&t) == 0, "only -1");
	free(t.buf);
}

static void test_refuses_nan_and_infinite_weights(void)
{
	const float bad[] = { NAN, -NAN, INFINITY, -INFINITY };
	for (unsigned i = 0; i < 4; i++) {
		struct host t = good();
		memcpy(t.buf + 16 + 8 * 6 + 4, &bad[i], 4); /* token 3, choice 0 */
		char why[200];
		CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) ==
			      DP_ROUTING_ERROR_WEIGHT,
		      "weight %u", i);
		CHECK(strstr(why, "token 3, choice 0 (expert 1)"), "why: %s", why);
		free(t.buf);
	}
	/* the largest finite float and a subnormal are weights */
	struct host t = good();
	float big = 3.4028235e38f, tiny = 1e-45f;
	memcpy(t.buf + 16 + 4, &big, 4);
	memcpy(t.buf + 16 + 12, &tiny, 4);
	CHECK(check(&t) == 0, "finite extremes");
	free(t.buf);
}

static void test_why_may_be_null(void)
{
	struct host t = good();
	t.buf[0] = 0;
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, NULL, 0) ==
		      DP_ROUTING_ERROR_BAD_MAGIC,
	      "NULL why");
	free(t.buf);
}

/* --- placement and split ------------------------------------------------------------ */

/* experts 0..7 on ducks: e -> duck e / 2 + 10 (ducks 10..13), expert 5 also on duck 70 */
static struct dp_routing_placement *placement(void)
{
	struct dp_routing_placement *p = calloc(1, sizeof(*p));
	p->n_experts = EXPERTS;
	for (uint32_t e = 0; e < EXPERTS; e++) {
		p->replicas[e] = 1;
		p->ducks[e * DP_MAX_REPLICAS] = (uint16_t)(e / 2 + 10);
	}
	p->replicas[5] = 2;
	p->ducks[5 * DP_MAX_REPLICAS + 1] = 70;
	return p;
}

static void test_placement_check_refuses_what_split_cannot_follow(void)
{
	struct dp_routing_placement *p = placement();
	char why[200] = "";
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == 0, "%s", why);
	p->replicas[3] = 0;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT, "0");
	CHECK(strstr(why, "expert 3 is on 0 ducks"), "why: %s", why);
	p->replicas[3] = DP_MAX_REPLICAS + 1;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT, "9");
	p->replicas[3] = 1;
	p->ducks[3 * DP_MAX_REPLICAS] = DP_MAX_DUCKS;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "duck 256");
	p->ducks[3 * DP_MAX_REPLICAS] = 11;
	p->ducks[5 * DP_MAX_REPLICAS + 1] = 12;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "twice");
	CHECK(strstr(why, "expert 5 is placed on duck 12 twice"), "why: %s", why);
	p->ducks[5 * DP_MAX_REPLICAS + 1] = 70;
	p->n_experts = 0;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "no experts");
	p->n_experts = DP_MAX_EXPERTS + 1;
	CHECK(dp_routing_placement_check(p, why, sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "too many experts");
	free(p);
}

static struct dp_routing_wire_entry wire_entry(const uint8_t *w, uint64_t i)
{
	struct dp_routing_wire_entry e;
	memcpy(&e, w + 16 + i * 8, sizeof(e));
	return e;
}

static void test_split_gives_each_duck_its_rows_in_order(void)
{
	struct host t = good();
	struct dp_routing_placement *p = placement();
	uint8_t out[512];
	uint64_t size, targets[4];
	char why[200] = "";
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, sizeof(out), &size, targets, why,
			       sizeof(why)) == 0,
	      "%s", why);
	/* by hand: token 0 {1->10, 5->12 (replica 0)}, 1 {2->11, 5->70 (replica 1)},
	 * 2 {0->10, 7->13}, 3 {1->10, 2->11} */
	struct dp_routing_wire_header h;
	memcpy(&h, out, sizeof(h));
	CHECK(h.magic == DP_ROUTING_WIRE_MAGIC && h.n_ducks == 5 && h.rows == TOKENS &&
		      h.entries == TOKENS * TOPK,
	      "header %u ducks %u entries", h.n_ducks, h.entries);
	CHECK(size == 16 + 8 * 5 + 8 * 8, "size %lu", (unsigned long)size);
	static const struct dp_routing_wire_duck dir[5] = {
		{ 10, 3, 3 }, { 11, 2, 2 }, { 12, 1, 1 }, { 13, 1, 1 }, { 70, 1, 1 }
	};
	CHECK(!memcmp(out + 16, dir, sizeof(dir)), "directory");
	/* entries after the directory (16 + 40 bytes = 7 entries of 8 in) */
	static const uint16_t want[8][2] = { { 0, 1 }, { 2, 0 }, { 3, 1 }, { 1, 2 },
					     { 3, 2 }, { 0, 5 }, { 2, 7 }, { 1, 5 } };
	static const float want_w[8] = { 0.5f, -0.5f, 3.0f, 1.0f, 0.0f, 0.25f, 0.125f, 2.0f };
	for (unsigned i = 0; i < 8; i++) {
		struct dp_routing_wire_entry e = wire_entry(out, 5 + i);
		CHECK(e.row == want[i][0] && e.expert == want[i][1] && e.weight == want_w[i],
		      "entry %u: row %u expert %u weight %g", i, e.row, e.expert, e.weight);
	}
	CHECK(targets[0] == (1ull << 10 | 1ull << 11 | 1ull << 12 | 1ull << 13) &&
		      targets[1] == 1ull << 6 && !targets[2] && !targets[3],
	      "targets");
	CHECK(dp_routing_wire_check(out, size, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	free(p);
	free(t.buf);
}

static void test_split_keeps_one_nics_ducks_and_says_when_none_is_routed(void)
{
	struct host t = good();
	struct dp_routing_placement *p = placement();
	uint8_t out[512];
	uint64_t size, targets[4];
	uint64_t nic[4] = { 1ull << 11, 1ull << 6, 0, 0 }; /* ducks 11 and 70 */
	char why[200] = "";
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, nic, out, sizeof(out), &size, targets, why,
			       sizeof(why)) == 0,
	      "%s", why);
	struct dp_routing_wire_header h;
	memcpy(&h, out, sizeof(h));
	CHECK(h.n_ducks == 2 && h.entries == 3 && size == 16 + 16 + 24, "%u ducks %u entries",
	      h.n_ducks, h.entries);
	CHECK(targets[0] == 1ull << 11 && targets[1] == 1ull << 6, "targets");
	CHECK(dp_routing_wire_check(out, size, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	uint64_t none[4] = { 1, 0, 0, 0 }; /* duck 0 holds nothing */
	memset(out, 0x77, sizeof(out));
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, none, out, sizeof(out), &size, targets, why,
			       sizeof(why)) == 0 &&
		      size == 0 && !targets[0] && !targets[1] && out[0] == 0x77,
	      "no duck routed: size %lu", (unsigned long)size);
	free(p);
	free(t.buf);
}

static void test_split_refuses_a_small_buffer_and_a_foreign_placement(void)
{
	struct host t = good();
	struct dp_routing_placement *p = placement();
	uint8_t out[512];
	uint64_t size;
	char why[200];
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, 16 + 40 + 63, &size, NULL, why,
			       sizeof(why)) == DP_ROUTING_ERROR_NO_ROOM,
	      "one byte short");
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, 16 + 40 + 64, &size, NULL, why,
			       sizeof(why)) == 0,
	      "exact room");
	p->n_experts = EXPERTS - 1;
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, sizeof(out), &size, NULL, why,
			       sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "7-expert placement");
	p->n_experts = EXPERTS;
	p->replicas[7] = 0; /* unchecked: split must not divide by it */
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, sizeof(out), &size, NULL, why,
			       sizeof(why)) == DP_ROUTING_ERROR_PLACEMENT,
	      "no replicas");
	CHECK(strstr(why, "no duck for expert 7"), "why: %s", why);
	free(p);
	free(t.buf);
}

static void test_split_names_bank_slots_and_a_shared_table_may_have_no_section(void)
{
	struct host t = good();
	struct dp_routing_placement *p = placement();
	uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS], per_duck[DP_MAX_DUCKS];
	uint8_t out[512];
	uint64_t size, targets[4];
	char why[200] = "";
	memset(slots, 0xff, sizeof(slots));
	dp_routing_bank_slots(p, slots, per_duck);
	/* ducks 10..13 hold two experts each (slots 0, 1 by id); duck 70 holds expert 5 alone */
	CHECK(per_duck[10] == 2 && per_duck[13] == 2 && per_duck[70] == 1 && per_duck[0] == 0,
	      "per duck %u %u %u", per_duck[10], per_duck[13], per_duck[70]);
	CHECK(slots[0] == 0 && slots[1 * DP_MAX_REPLICAS] == 1 && slots[4 * DP_MAX_REPLICAS] == 0 &&
		      slots[5 * DP_MAX_REPLICAS] == 1 && slots[5 * DP_MAX_REPLICAS + 1] == 0,
	      "slots");
	CHECK(dp_routing_split(t.buf, t.len, p, slots, 0, NULL, out, sizeof(out), &size, targets,
			       why, sizeof(why)) == 0,
	      "%s", why);
	/* the by-hand split above, experts as slots: duck 11's experts 2 -> 0; 12's 5 -> 1;
	 * 13's 7 -> 1; 70's 5 -> 0 */
	static const uint16_t want[8][2] = { { 0, 1 }, { 2, 0 }, { 3, 1 }, { 1, 0 },
					     { 3, 0 }, { 0, 1 }, { 2, 1 }, { 1, 0 } };
	for (unsigned i = 0; i < 8; i++) {
		struct dp_routing_wire_entry e = wire_entry(out, 5 + i);
		CHECK(e.row == want[i][0] && e.expert == want[i][1], "entry %u: row %u slot %u", i,
		      e.row, e.expert);
	}
	/* a duck checks its table against its own bank: 2 experts here */
	CHECK(dp_routing_wire_check(out, size, TOKENS, 2, why, sizeof(why)) == 0, "%s", why);
	CHECK(dp_routing_wire_check(out, size, TOKENS, 1, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_EXPERT,
	      "slot 1 in a bank of 1");
	/* SHARED: the header says so, and a NIC none of whose ducks is routed still gets a
	 * table (its ducks compute the shared expert for every row) */
	uint64_t none[4] = { 1, 0, 0, 0 };
	CHECK(dp_routing_split(t.buf, t.len, p, slots, DP_ROUTING_WIRE_FLAG_SHARED, none, out,
			       sizeof(out), &size, targets, why, sizeof(why)) == 0 &&
		      size == 16 && !targets[0] && !targets[1],
	      "shared, none routed: size %lu", (unsigned long)size);
	struct dp_routing_wire_header h;
	memcpy(&h, out, sizeof(h));
	CHECK(h.flags == DP_ROUTING_WIRE_FLAG_SHARED && h.n_ducks == 0 && h.entries == 0 &&
		      h.rows == TOKENS,
	      "shared header");
	CHECK(dp_routing_wire_check(out, size, TOKENS, 2, why, sizeof(why)) == 0, "%s", why);
	struct dp_routing_section sec;
	CHECK(dp_routing_wire_section(out, size, 10, &sec) == DP_ROUTING_ERROR_NO_SUCH_DUCK,
	      "no section");
	h.flags = 0; /* no section is only allowed where the shared expert gives work */
	memcpy(out, &h, sizeof(h));
	CHECK(dp_routing_wire_check(out, size, TOKENS, 2, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_DUCKS,
	      "no section, no SHARED");
	free(p);
	free(t.buf);
}

/* --- "no expert" (the gate's -1, DeepEP's padded or dropped slot) ----------------------- */

/* token t -> experts: 0 {1, none}, 1 {none, none}, 2 {0, none}, 3 {1, 2}; the none slots'
 * weights NaN, inf, junk: never read */
#define NONE DP_ROUTING_NO_EXPERT
static const uint32_t HOLES[TOKENS * TOPK] = { 1, NONE, NONE, NONE, 0, NONE, 1, 2 };

static struct host with_holes(void)
{
	float w[TOKENS * TOPK];
	memcpy(w, W, sizeof(w));
	w[1] = NAN, w[2] = INFINITY, w[3] = -INFINITY, w[5] = 1e30f;
	return host_table(TOKENS, TOPK, EXPERTS, HOLES, w);
}

static void test_no_expert_passes_any_number_of_times_with_any_weight(void)
{
	struct host t = with_holes();
	char why[200] = "";
	CHECK(dp_routing_check(t.buf, t.len, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	/* only 2^32-1 is the sentinel: the id below it is an expert past the layer */
	set_u32(&t, 16 + 8 * 1, NONE - 1);
	CHECK(check(&t) == DP_ROUTING_ERROR_EXPERT, "2^32-2");
	/* a real expert's weight must still be finite beside a none */
	set_u32(&t, 16 + 8 * 1, NONE);
	float nan = NAN;
	memcpy(t.buf + 16 + 8 * 4 + 4, &nan, 4);
	CHECK(check(&t) == DP_ROUTING_ERROR_WEIGHT, "NaN on expert 0");
	free(t.buf);
}

/* ... and sorts a token's choices: -1 after the experts, the experts ascending */
static void test_pack_writes_minus_one_as_no_expert_with_weight_zero(void)
{
	int32_t ids[TOKENS * TOPK] = { 1, -1, -1, -1, -1, 0, 2, 1 };
	float w[TOKENS * TOPK];
	memcpy(w, W, sizeof(w));
	w[1] = NAN, w[2] = INFINITY;
	struct host want = host_table(TOKENS, TOPK, EXPERTS, HOLES, (const float[]){
		0.5f, 0, 0, 0, 0.125f, 0, 0.0f, 3.0f });
	uint8_t *out = malloc(want.len);
	char why[200] = "";
	CHECK(dp_routing_pack(ids, 4, w, TOKENS, TOPK, EXPERTS, out, want.len, why, sizeof(why)) ==
		      0,
	      "%s", why);
	CHECK(memcmp(out, want.buf, want.len) == 0, "pack of -1 wrote other bytes");
	CHECK(dp_routing_check(out, want.len, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	free(out);
	free(want.buf);
}

static void test_split_leaves_no_expert_out_and_a_table_of_none_reaches_no_duck(void)
{
	struct host t = with_holes();
	struct dp_routing_placement *p = placement();
	uint8_t out[512];
	uint64_t size, targets[4];
	char why[200] = "";
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, sizeof(out), &size, targets, why,
			       sizeof(why)) == 0,
	      "%s", why);
	/* (0, 1) -> 10, (2, 0) -> 10, (3, 2) -> 11, (3, 1) -> 10: token 1 reaches no duck */
	struct dp_routing_wire_header h;
	memcpy(&h, out, sizeof(h));
	CHECK(h.n_ducks == 2 && h.entries == 4 && size == 16 + 16 + 32, "%u ducks %u entries",
	      h.n_ducks, h.entries);
	CHECK(targets[0] == (1ull << 10 | 1ull << 11) && !targets[1], "targets");
	CHECK(dp_routing_wire_check(out, size, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	static const uint16_t want[4][2] = { { 0, 1 }, { 2, 0 }, { 3, 1 }, { 3, 2 } };
	for (unsigned i = 0; i < 4; i++) {
		struct dp_routing_wire_entry e = wire_entry(out, 2 + i);
		CHECK(e.row == want[i][0] && e.expert == want[i][1], "entry %u: row %u expert %u",
		      i, e.row, e.expert);
	}
	/* every slot none: nothing to send, and with SHARED a header alone */
	for (uint32_t i = 0; i < TOKENS * TOPK; i++)
		set_u32(&t, 16 + 8 * (uint64_t)i, NONE);
	CHECK(check(&t) == 0, "all none");
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, sizeof(out), &size, targets, why,
			       sizeof(why)) == 0 &&
		      size == 0 && !targets[0] && !targets[1],
	      "all none: size %lu", (unsigned long)size);
	CHECK(dp_routing_split(t.buf, t.len, p, NULL, DP_ROUTING_WIRE_FLAG_SHARED, NULL, out,
			       sizeof(out), &size, targets, why, sizeof(why)) == 0 &&
		      size == 16 && !targets[0],
	      "all none, shared: size %lu", (unsigned long)size);
	CHECK(dp_routing_wire_check(out, size, TOKENS, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	free(p);
	free(t.buf);
}

/* --- wire tables ----------------------------------------------------------------------- */

static uint64_t split_all(uint8_t *out, uint64_t cap)
{
	struct host t = good();
	struct dp_routing_placement *p = placement();
	uint64_t size = 0;
	dp_routing_split(t.buf, t.len, p, NULL, 0, NULL, out, cap, &size, NULL, NULL, 0);
	free(p);
	free(t.buf);
	return size;
}

static int wire_check(const uint8_t *w, uint64_t len)
{
	char why[200];
	return dp_routing_wire_check(w, len, TOKENS, EXPERTS, why, sizeof(why));
}

static void test_wire_check_refuses_every_broken_directory_and_section(void)
{
	uint8_t good_w[512], w[512];
	uint64_t size = split_all(good_w, sizeof(good_w));
	CHECK(size == 120 && wire_check(good_w, size) == 0, "split");
	struct {
		uint64_t off;
		uint16_t value;
		int rc;
		const char *what;
	} cases[] = {
		{ 2, 0x5452, DP_ROUTING_ERROR_BAD_MAGIC, "a host table's magic, DPRT" },
		{ 4, 0x0002, DP_ROUTING_ERROR_BAD_VERSION, "version 2" },
		{ 4, 0x0201, DP_ROUTING_ERROR_BAD_FLAGS, "flags 2 (only SHARED, 1, is defined)" },
		{ 4, 0x0301, DP_ROUTING_ERROR_BAD_FLAGS, "flags 3" },
		{ 6, 0, DP_ROUTING_ERROR_DUCKS, "no ducks" },
		{ 6, 257, DP_ROUTING_ERROR_DUCKS, "257 ducks" },
		{ 8, 3, DP_ROUTING_ERROR_TOKENS, "rows not the activation's" },
		{ 12, 4, DP_ROUTING_ERROR_ENTRIES, "entries below ducks" },
		{ 12, 9, DP_ROUTING_ERROR_TRUNCATED, "one entry more than the bytes" },
		{ 16, 11, DP_ROUTING_ERROR_DUCKS, "ducks 11, 11" },
		{ 16 + 32, 256, DP_ROUTING_ERROR_DUCKS, "duck 256" },
		{ 16 + 2, 2, DP_ROUTING_ERROR_ROWS, "duck 10 says 2 rows of 3" },
		{ 16 + 4, 0, DP_ROUTING_ERROR_ENTRIES, "a section of 0" },
		{ 16 + 4, 9, DP_ROUTING_ERROR_ENTRIES, "a section past the table" },
		{ 16 + 4, 2, DP_ROUTING_ERROR_ROWS, "duck 10's section cut short" },
		{ 56 + 16, 1, DP_ROUTING_ERROR_ORDER, "duck 10's rows 0, 2, 1" },
		{ 56 + 8, 0, DP_ROUTING_ERROR_ORDER, "duck 10's row 0: expert 1, then 0" },
		{ 56, 4, DP_ROUTING_ERROR_ROWS, "row 4 of 4" },
		{ 56 + 2, 8, DP_ROUTING_ERROR_EXPERT, "expert 8" },
		{ 56 + 6, 0x7fc0, DP_ROUTING_ERROR_WEIGHT, "NaN" },
		{ 56 + 6, 0xff80, DP_ROUTING_ERROR_WEIGHT, "-inf" },
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(w, good_w, size);
		memcpy(w + cases[i].off, &cases[i].value, 2);
		int rc = wire_check(w, size);
		CHECK(rc == cases[i].rc, "%s: %d, want %d", cases[i].what, rc, cases[i].rc);
	}
	/* the sections add up to fewer entries than the header says (and the bytes hold) */
	memcpy(w, good_w, size);
	uint32_t entries = 9;
	memcpy(w + 12, &entries, 4);
	CHECK(wire_check(w, size + 8) == DP_ROUTING_ERROR_ENTRIES, "sum");
	for (uint64_t len = 0; len < size; len++) {
		uint8_t *cut = malloc(len ? len : 1);
		memcpy(cut, good_w, len);
		CHECK(wire_check(cut, len) == DP_ROUTING_ERROR_TRUNCATED, "len %lu",
		      (unsigned long)len);
		free(cut);
	}
}

static void test_a_duck_finds_its_section_and_a_unicast_renumbers_rows(void)
{
	uint8_t w[512], u[512];
	uint64_t size = split_all(w, sizeof(w)), usize;
	struct dp_routing_section s;
	CHECK(dp_routing_wire_section(w, size, 11, &s) == 0, "duck 11");
	CHECK(s.offset == 56 + 3 * 8 && s.n_entries == 2 && s.n_rows == 2, "section");
	CHECK(dp_routing_wire_section(w, size, 12, &s) == 0 && s.n_entries == 1, "duck 12");
	CHECK(dp_routing_wire_section(w, size, 9, &s) == DP_ROUTING_ERROR_NO_SUCH_DUCK, "duck 9");
	CHECK(dp_routing_wire_section(w, 40, 70, &s) == DP_ROUTING_ERROR_TRUNCATED, "cut");
	uint16_t map[4] = { 0xffff, 0xffff, 0xffff, 0xffff };
	char why[200] = "";
	/* duck 10: rows 0, 2, 3 (experts 1, 0, 1) -> rows 0, 1, 2 */
	CHECK(dp_routing_wire_unicast(w, size, 10, u, sizeof(u), map, 4, &usize, why,
				      sizeof(why)) == 0,
	      "%s", why);
	CHECK(usize == 16 + 8 + 3 * 8, "usize %lu", (unsigned long)usize);
	CHECK(map[0] == 0 && map[1] == 2 && map[2] == 3 && map[3] == 0xffff, "map %u %u %u",
	      map[0], map[1], map[2]);
	struct dp_routing_wire_entry e = wire_entry(u, 1 + 1);
	CHECK(e.row == 1 && e.expert == 0 && e.weight == -0.5f, "renumbered entry");
	CHECK(dp_routing_wire_check(u, usize, 3, EXPERTS, why, sizeof(why)) == 0, "%s", why);
	CHECK(dp_routing_wire_unicast(w, size, 10, u, sizeof(u), map, 2, &usize, why,
				      sizeof(why)) == DP_ROUTING_ERROR_NO_ROOM,
	      "map of 2 for 3 rows");
	CHECK(dp_routing_wire_unicast(w, size, 10, u, 47, map, 4, &usize, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_NO_ROOM,
	      "out one byte short");
	CHECK(dp_routing_wire_unicast(w, size, 9, u, sizeof(u), map, 4, &usize, why,
				      sizeof(why)) == DP_ROUTING_ERROR_NO_SUCH_DUCK,
	      "duck 9");
}

/* dp_routing_pack writes the bytes a hand-built table has, from int32 and int64 ids
 * alike, and refuses a gate's negative id, a repeat and a NaN by the check's own rule. */
static void test_pack_writes_the_table_the_check_reads(void)
{
	struct host want = good();
	int32_t i32[TOKENS * TOPK];
	int64_t i64[TOKENS * TOPK];
	for (uint32_t i = 0; i < TOKENS * TOPK; i++)
		i32[i] = (int32_t)EXP[i], i64[i] = EXP[i];
	uint8_t *out = malloc(want.len);
	char why[200];
	CHECK(dp_routing_pack(i32, 4, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == 0, "pack int32: %s", why);
	CHECK(memcmp(out, want.buf, want.len) == 0, "pack int32 wrote other bytes");
	memset(out, 0xa5, want.len);
	CHECK(dp_routing_pack(i64, 8, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == 0, "pack int64: %s", why);
	CHECK(memcmp(out, want.buf, want.len) == 0, "pack int64 wrote other bytes");
	CHECK(dp_routing_check(out, want.len, TOKENS, EXPERTS, why, sizeof(why)) == 0,
	      "check refused a packed table: %s", why);
	/* a gate's choices come by score, not by id: the pack sorts each token's, with its
	 * weights; the same table */
	int32_t by_score[TOKENS * TOPK];
	float w_by_score[TOKENS * TOPK];
	for (uint32_t i = 0; i < TOKENS * TOPK; i++) /* every token's pair swapped */
		by_score[i] = i32[i ^ 1], w_by_score[i] = W[i ^ 1];
	memset(out, 0xa5, want.len);
	CHECK(dp_routing_pack(by_score, 4, w_by_score, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == 0, "pack by score: %s", why);
	CHECK(memcmp(out, want.buf, want.len) == 0, "pack by score wrote other bytes");

	CHECK(dp_routing_pack(i32, 4, W, TOKENS, TOPK, EXPERTS, out, want.len - 1, why,
			      sizeof(why)) == DP_ROUTING_ERROR_TRUNCATED, "short out");
	CHECK(dp_routing_pack(i32, 2, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) < 0, "2-byte ids");
	CHECK(dp_routing_pack(i32, 4, W, TOKENS, 0x10001, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_TOPK, "topk past 16 bits");
	i64[3] = -2; /* -1 is "no expert"; no other negative id means anything */
	CHECK(dp_routing_pack(i64, 8, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_EXPERT, "negative id");
	CHECK(strstr(why, "token 1, choice 1 names expert -2") != NULL, "why: %s", why);
	i64[3] = DP_ROUTING_NO_EXPERT; /* the table's sentinel is not a gate's id */
	CHECK(dp_routing_pack(i64, 8, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_EXPERT, "id 2^32-1");
	i64[3] = (int64_t)1 << 40; /* would be expert 0 if cut to 32 bits */
	CHECK(dp_routing_pack(i64, 8, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_EXPERT, "id past 32 bits");
	i32[3] = 2; /* token 1 is {2, 2} */
	CHECK(dp_routing_pack(i32, 4, W, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_DUPLICATE, "repeat");
	CHECK(strstr(why, "token 1 names expert 2 twice (again at choice 1)") != NULL, "why: %s",
	      why);
	i32[3] = 5;
	float w[TOKENS * TOPK];
	memcpy(w, W, sizeof(w));
	w[6] = NAN;
	CHECK(dp_routing_pack(i32, 4, w, TOKENS, TOPK, EXPERTS, out, want.len, why,
			      sizeof(why)) == DP_ROUTING_ERROR_WEIGHT, "NaN");
	free(out);
	free(want.buf);
}

/* The split by its definition, done the plain way: for each duck of the set in order,
 * every (row, expert) routed to it, rows ascending, a row's experts by id. The split
 * proper is written for speed (issue 28.6); this is what it must still write. */
static uint64_t reference_split(const uint32_t *experts, const float *weights, uint32_t tokens,
				uint32_t topk, const struct dp_routing_placement *pl,
				const uint16_t *slots, const uint64_t *ducks, uint8_t *out)
{
	uint32_t n_ducks = 0, entries = 0;
	uint8_t *w = out + 16 + 8 * DP_MAX_DUCKS; /* entries after the largest directory */
	uint8_t *dir = out + 16;
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++) {
		if (ducks && !(ducks[d >> 6] >> (d & 63) & 1))
			continue;
		uint32_t count = 0, rows = 0;
		for (uint32_t t = 0; t < tokens; t++) {
			uint32_t had = 0;
			for (uint32_t e = 0; e < pl->n_experts; e++)
				for (uint32_t k = 0; k < topk; k++) {
					if (experts[t * topk + k] != e)
						continue;
					uint32_t r = pl->replicas[e] == 1 ? 0 : t % pl->replicas[e];
					if (pl->ducks[e * DP_MAX_REPLICAS + r] != d)
						continue;
					uint16_t id = slots ? slots[e * DP_MAX_REPLICAS + r] : (uint16_t)e;
					struct dp_routing_wire_entry we = { (uint16_t)t, id, weights[t * topk + k] };
					memcpy(w + 8 * (uint64_t)(entries + count++), &we, 8);
					had = 1;
				}
			rows += had;
		}
		if (!count)
			continue;
		struct dp_routing_wire_duck wd = { (uint16_t)d, (uint16_t)rows, count };
		memcpy(dir + 8 * (uint64_t)n_ducks++, &wd, 8);
		entries += count;
	}
	struct dp_routing_wire_header wh = { .magic = DP_ROUTING_WIRE_MAGIC,
					     .version = DP_ROUTING_VERSION,
					     .n_ducks = (uint16_t)n_ducks,
					     .rows = tokens,
					     .entries = entries };
	memcpy(out, &wh, 16);
	memmove(dir + 8 * (uint64_t)n_ducks, w, 8 * (uint64_t)entries);
	return n_ducks ? 16 + 8 * (uint64_t)(n_ducks + entries) : 0;
}

static void test_split_matches_its_definition_on_random_gates(void)
{
	enum { T = 64, K = 8, E = 32 };
	static uint32_t ex[T * K];
	static float wt[T * K];
	static struct dp_routing_placement pl;
	static uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS];
	static uint8_t got[16 + 8 * DP_MAX_DUCKS + 8 * T * K], want[sizeof(got)];
	static struct dp_routing_plan plan;
	char why[160];
	int by_phase = 0, by_tmod = 0;
	srand(286);
	for (int round = 0; round < 200; round++) {
		uint32_t nducks = 1 + (uint32_t)rand() % 12, topk = 1 + (uint32_t)rand() % K;
		/* up to 3 replicas: a plan of phases; every fourth round up to 8, whose least
		 * common multiple (840) has too many phases for a plan: t % r by counting */
		uint32_t most = round % 4 ? 3 : 8;
		memset(&pl, 0, sizeof(pl));
		pl.n_experts = E;
		for (uint32_t e = 0; e < E; e++) {
			uint32_t r = 1 + (uint32_t)rand() % (nducks < most ? nducks : most);
			pl.replicas[e] = (uint8_t)r;
			uint32_t d0 = (uint32_t)rand() % nducks;
			for (uint32_t i = 0; i < r; i++) /* distinct: consecutive ducks mod nducks */
				pl.ducks[e * DP_MAX_REPLICAS + i] = (uint16_t)(5 * ((d0 + i) % nducks));
		}
		CHECK(dp_routing_placement_check(&pl, why, sizeof(why)) == 0, "placement: %s", why);
		dp_routing_bank_slots(&pl, slots, NULL);
		dp_routing_plan(&plan, &pl, NULL, NULL);
		by_phase += plan.phases != 0;
		by_tmod += plan.phases == 0;
		for (uint32_t t = 0; t < T; t++)
			for (uint32_t k = 0; k < topk; k++) {
				uint32_t e;
			again:
				e = rand() % 9 == 0 ? DP_ROUTING_NO_EXPERT : (uint32_t)rand() % E;
				for (uint32_t j = 0; j < k && e != DP_ROUTING_NO_EXPERT; j++)
					if (ex[t * topk + j] == e)
						goto again;
				ex[t * topk + k] = e;
				wt[t * topk + k] = e == DP_ROUTING_NO_EXPERT ? 0.0f : (float)rand() / 7.0f;
				/* as a host table lists them: ascending, none last (insertion) */
				for (uint32_t j = k; j > 0 && ex[t * topk + j - 1] > ex[t * topk + j]; j--) {
					uint32_t x = ex[t * topk + j];
					float y = wt[t * topk + j];
					ex[t * topk + j] = ex[t * topk + j - 1];
					wt[t * topk + j] = wt[t * topk + j - 1];
					ex[t * topk + j - 1] = x;
					wt[t * topk + j - 1] = y;
				}
			}
		struct host h = host_table(T, topk, E, ex, wt);
		uint64_t set[DP_MAX_DUCKS / 64] = { 0 };
		for (uint32_t d = 0; d < 5 * nducks; d++)
			if (rand() % 3)
				set[d >> 6] |= 1ull << (d & 63);
		const uint64_t *ducks = round % 2 ? set : NULL;
		const uint16_t *sl = round % 3 ? slots : NULL;
		uint64_t size = 1, targets[DP_MAX_DUCKS / 64];
		CHECK(dp_routing_split(h.buf, h.len, &pl, sl, 0, ducks, got, sizeof(got), &size,
				       targets, why, sizeof(why)) == 0,
		      "round %d: %s", round, why);
		uint64_t want_size = reference_split(ex, wt, T, topk, &pl, sl, ducks, want);
		CHECK(size == want_size, "round %d: %lu bytes, want %lu", round,
		      (unsigned long)size, (unsigned long)want_size);
		CHECK(size == 0 || memcmp(got, want, size) == 0, "round %d: the tables differ", round);
		free(h.buf);
	}
	CHECK(by_phase > 100 && by_tmod > 10, "%d rounds by phases, %d by t %% r", by_phase,
	      by_tmod);
}

/* dp_routing_live (issue 30.1): each expert keeps its live replicas in order with their
 * bank slots, so the split sends (t, e) to live[t % nlive] and no entry to a lost duck;
 * with none lost it is the placement as loaded (the same bytes); an expert with no live
 * replica is refused by the count, the dispatcher's fail-fast. */
static void test_the_live_placement_routes_around_lost_ducks(void)
{
	enum { T = 24, E = 12 };
	static struct dp_routing_placement pl, live;
	static uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS], live_slots[sizeof(slots) / 2];
	static uint8_t got[16 + 8 * DP_MAX_DUCKS + 8 * T * 2], want[sizeof(got)];
	static struct dp_routing_plan plan;
	uint32_t ex[T * 2], count[DP_MAX_DUCKS];
	float wt[T * 2];
	char why[160];
	/* expert e on ducks e % 4, 4 + e % 4, 8 + e % 4 (1 to 3 replicas: e % 3 + 1) */
	pl.n_experts = E;
	for (uint32_t e = 0; e < E; e++) {
		pl.replicas[e] = (uint8_t)(e % 3 + 1);
		for (uint32_t i = 0; i < pl.replicas[e]; i++)
			pl.ducks[e * DP_MAX_REPLICAS + i] = (uint16_t)(4 * i + e % 4);
	}
	dp_routing_bank_slots(&pl, slots, NULL);
	for (uint32_t t = 0; t < T; t++) { /* experts t % 6 and 6 + t % 5: ascending */
		ex[2 * t] = t % 6;
		ex[2 * t + 1] = 6 + t % 5;
		wt[2 * t] = 0.5f + (float)t;
		wt[2 * t + 1] = -1.0f - (float)t;
	}
	struct host h = host_table(T, 2, E, ex, wt);
	uint64_t none[DP_MAX_DUCKS / 64] = { 0 }, size = 0, size2 = 0, targets[DP_MAX_DUCKS / 64];
	/* none lost: the same placement, the same wire table */
	CHECK(dp_routing_live(&pl, slots, none, &live, live_slots) == 0, "no expert lost");
	CHECK(memcmp(live.replicas, pl.replicas, E) == 0 &&
		      memcmp(live.ducks, pl.ducks, sizeof(pl.ducks[0]) * E * DP_MAX_REPLICAS) == 0,
	      "all live: the placement as loaded");
	CHECK(dp_routing_split(h.buf, h.len, &pl, slots, 0, NULL, want, sizeof(want), &size,
			       NULL, why, sizeof(why)) == 0, "%s", why);
	CHECK(dp_routing_split(h.buf, h.len, &live, live_slots, 0, NULL, got, sizeof(got), &size2,
			       NULL, why, sizeof(why)) == 0, "%s", why);
	CHECK(size == size2 && memcmp(got, want, size) == 0, "all live: the same wire table");
	/* duck 4 lost (replica 1 of experts 0, 4, 8 and of 1 ...: those with e % 4 == 0) */
	uint64_t lost[DP_MAX_DUCKS / 64] = { 1ull << 4 };
	CHECK(dp_routing_live(&pl, slots, lost, &live, live_slots) == 0, "each has a replica");
	for (uint32_t e = 0; e < E; e++) {
		uint32_t want_r = pl.replicas[e] - (e % 4 == 0 && pl.replicas[e] >= 2);
		CHECK(live.replicas[e] == want_r, "expert %u: %u live, want %u", e, live.replicas[e],
		      want_r);
		for (uint32_t i = 0, j = 0; i < pl.replicas[e]; i++) {
			uint16_t d = pl.ducks[e * DP_MAX_REPLICAS + i];
			if (d == 4)
				continue;
			CHECK(live.ducks[e * DP_MAX_REPLICAS + j] == d &&
				      live_slots[e * DP_MAX_REPLICAS + j] == slots[e * DP_MAX_REPLICAS + i],
			      "expert %u: live replica %u is duck %u with its slot", e, j, d);
			j++;
		}
	}
	/* the split follows live[t % nlive] (the reference, by the live placement), and duck
	 * 4 gets no section */
	CHECK(dp_routing_split(h.buf, h.len, &live, live_slots, 0, NULL, got, sizeof(got), &size,
			       targets, why, sizeof(why)) == 0, "%s", why);
	CHECK(!(targets[0] >> 4 & 1), "duck 4 is lost: no section");
	size2 = reference_split(ex, wt, T, 2, &live, live_slots, NULL, want);
	CHECK(size == size2 && memcmp(got, want, size) == 0, "lost: live[t %% nlive]");
	/* an expert untouched by the loss goes where it went: expert 6 (6 % 4 = 2) */
	for (uint32_t t = 0; t < T; t++)
		CHECK(dp_routing_duck_of(&live, t, 6) == dp_routing_duck_of(&pl, t, 6), "token %u", t);
	/* ducks 0 and 4 lost: expert 4 (ducks 0, 4) has none; expert 0 (duck 0) none */
	lost[0] = 1ull << 0 | 1ull << 4;
	CHECK(dp_routing_live(&pl, slots, lost, &live, live_slots) == 2, "experts 0 and 4");
	dp_routing_plan(&plan, &live, NULL, NULL);
	CHECK(dp_routing_count(&plan, h.buf + 16, T, 2, count, why, sizeof(why)) ==
		      DP_ROUTING_ERROR_PLACEMENT, "a table naming them is refused");
	CHECK(strstr(why, "no duck for expert 0"), "why: %s", why);
	free(h.buf);
}

int main(void)
{
	test_accepts_the_table_a_client_packs();
	test_pack_writes_the_table_the_check_reads();
	test_refuses_a_header_that_disagrees_with_the_forward_or_layer();
	test_refuses_truncated_tables_and_reads_nothing_past_len();
	test_refuses_counts_whose_size_would_overflow();
	test_refuses_an_expert_past_the_layer();
	test_refuses_a_token_that_names_an_expert_twice();
	test_refuses_a_token_whose_experts_do_not_ascend();
	test_refuses_nan_and_infinite_weights();
	test_why_may_be_null();
	test_no_expert_passes_any_number_of_times_with_any_weight();
	test_pack_writes_minus_one_as_no_expert_with_weight_zero();
	test_split_leaves_no_expert_out_and_a_table_of_none_reaches_no_duck();
	test_placement_check_refuses_what_split_cannot_follow();
	test_split_gives_each_duck_its_rows_in_order();
	test_split_keeps_one_nics_ducks_and_says_when_none_is_routed();
	test_split_refuses_a_small_buffer_and_a_foreign_placement();
	test_split_names_bank_slots_and_a_shared_table_may_have_no_section();
	test_wire_check_refuses_every_broken_directory_and_section();
	test_a_duck_finds_its_section_and_a_unicast_renumbers_rows();
	test_split_matches_its_definition_on_random_gates();
	test_the_live_placement_routes_around_lost_ducks();
	return test_result("test_routing");
}
