/* dp_routing.h: the one check of a routing table, and the split into per-duck sections.
 *
 * The layouts are drawn at the top of gen/dp_routing_abi.h (duckpipe/schema/routing.py).
 * A host table is written by a client into shared memory; a wire table arrives at a duck
 * in a datagram: both are input from someone else, like a descriptor. Header-only, so
 * that the dataplane, the duck emulator, the cffi module (the client's pack, the mock
 * dataplane) and fuzz/fuzz_routing.c run this code and no copy of it.
 *
 * Rules every function here keeps, whatever the bytes:
 *   - every length is checked against the bytes given before anything past it is read;
 *     fields are read with memcpy (no alignment is assumed of the buffer);
 *   - counts are bounded by the schema's maximums before they are multiplied, and the
 *     sizes are computed with __builtin_*_overflow all the same;
 *   - an id indexes nothing before it is checked (experts against n_experts, ducks
 *     against DP_MAX_DUCKS, replicas against DP_MAX_REPLICAS);
 *   - outputs go to caller-provided buffers of a given size, never past it;
 *   - refusals return a negative enum dp_routing_error and say where in `why`.
 * The check functions decide whether a table is valid; the others (split, section,
 * unicast) are only memory-safe on tables the checks refused, and promise a valid
 * output only for tables they accepted.
 *
 * dp_routing_check          host table: header against the forward and the layer, each
 *                           token's experts < n_experts and ascending (so distinct),
 *                           NO_EXPERT last, finite weights (a NO_EXPERT's is not read)
 * dp_routing_pack           a gate's int32/int64 ids and float32 weights, in any order ->
 *                           host table, each token's choices sorted, checked by the same
 *                           rule in the same pass (the client's submit); a -1 id (DeepEP's
 *                           "no expert") becomes NO_EXPERT with weight 0
 * dp_routing_placement_check  expert -> ducks (1..MAX_REPLICAS distinct ducks each)
 * dp_routing_live           placement (+ bank slots) less the ducks known lost: each
 *                           expert's live replicas, so t % r picks live[t % nlive]
 * dp_routing_plan           placement (+ bank slots, + a set of ducks) -> where each choice
 *                           goes, worked out once per call
 * dp_routing_count          host table + plan -> each duck's entries (the dispatcher's
 *                           targets, the split's first step)
 * dp_routing_split          host table + placement (+ the NIC's ducks) -> wire table
 * dp_routing_wire_check     wire table: directory, sections, entries
 * dp_routing_wire_section   where one duck's section is
 * dp_routing_wire_unicast   one duck's section alone, rows renumbered, with their map
 */
#ifndef DP_ROUTING_H
#define DP_ROUTING_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_routing_abi.h"
#include "dp_why.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "routing tables are little-endian; dp_routing.h reads them in place"
#endif

/* @cdef-begin: cffi parses from here */

/* Where one duck's entries are in a wire table (dp_routing_wire_section). */
struct dp_routing_section {
    uint64_t offset;     /* bytes from the table's start to its first dp_routing_wire_entry */
    uint32_t n_entries;
    uint32_t n_rows;     /* distinct rows: its reply's rows */
};

/* @cdef-end */

#define DP_ROUTING_HEADER_SIZE ((uint64_t)sizeof(struct dp_routing_header))
#define DP_ROUTING_ENTRY_SIZE ((uint64_t)sizeof(struct dp_routing_entry))
#define DP_ROUTING_WIRE_HEADER_SIZE ((uint64_t)sizeof(struct dp_routing_wire_header))
#define DP_ROUTING_WIRE_DUCK_SIZE ((uint64_t)sizeof(struct dp_routing_wire_duck))
#define DP_ROUTING_WIRE_ENTRY_SIZE ((uint64_t)sizeof(struct dp_routing_wire_entry))
#define DP_ROUTING_F32_EXP 0x7f800000u

/* A float32 given by its bits is finite when its exponent is not all ones (inf, NaN).
 * Bits, not a float compare: -ffast-math would fold isfinite() to true. */
static inline int dp_routing_finite(uint32_t bits)
{
	return (bits & DP_ROUTING_F32_EXP) != DP_ROUTING_F32_EXP;
}

static inline int dp_routing_has_duck(const uint64_t *ducks, uint32_t d)
{
	return !ducks || (ducks[d >> 6] >> (d & 63) & 1);
}

/* Bytes of a host table of `tokens` tokens by `topk`: 0 and *out, or -1 when they
 * overflow 64 bits (they cannot within the maximums; the check is for callers past them). */
static inline int dp_routing_size(uint64_t tokens, uint64_t topk, uint64_t *out)
{
	uint64_t n;
	if (__builtin_mul_overflow(tokens, topk, &n) ||
	    __builtin_mul_overflow(n, DP_ROUTING_ENTRY_SIZE, &n) ||
	    __builtin_add_overflow(n, DP_ROUTING_HEADER_SIZE, &n))
		return -1;
	*out = n;
	return 0;
}

/* Bytes of a wire table of n_ducks sections holding `entries` entries; 0 or -1 as above. */
static inline int dp_routing_wire_size(uint64_t n_ducks, uint64_t entries, uint64_t *out)
{
	uint64_t n;
	if (__builtin_add_overflow(n_ducks, entries, &n) ||
	    __builtin_mul_overflow(n, DP_ROUTING_WIRE_ENTRY_SIZE, &n) ||
	    __builtin_add_overflow(n, DP_ROUTING_WIRE_HEADER_SIZE, &n))
		return -1;
	*out = n;
	return 0;
}

static inline int dp_routing_check_n_experts(uint32_t n_experts, char *why, size_t n)
{
	if (n_experts < 1 || n_experts > DP_MAX_EXPERTS)
		return dp_refuse(DP_ROUTING_ERROR_N_EXPERTS, why, n,
					 "the layer's %u experts are outside 1..%u", n_experts,
					 DP_MAX_EXPERTS);
	return 0;
}

/* The header of a host table against the forward of `tokens` rows on a layer of n_experts
 * routed experts and the len bytes given: 0 and *size (the table's bytes), or a negative
 * enum dp_routing_error with why. n_experts was checked by the caller. */
static inline int dp_routing_check_header(const struct dp_routing_header *h, uint64_t len,
					  uint32_t tokens, uint32_t n_experts, uint64_t *size,
					  char *why, size_t n)
{
	if (h->magic != DP_ROUTING_MAGIC)
		return dp_refuse(DP_ROUTING_ERROR_BAD_MAGIC, why, n,
					 "magic 0x%08x is not a host routing table's (0x%08x)",
					 h->magic, DP_ROUTING_MAGIC);
	if (h->version != DP_ROUTING_VERSION)
		return dp_refuse(DP_ROUTING_ERROR_BAD_VERSION, why, n,
					 "routing table version %u, this build reads %u", h->version,
					 DP_ROUTING_VERSION);
	if (h->flags)
		return dp_refuse(DP_ROUTING_ERROR_BAD_FLAGS, why, n,
					 "routing flags 0x%02x: none are defined", h->flags);
	if (h->n_experts != n_experts)
		return dp_refuse(DP_ROUTING_ERROR_N_EXPERTS, why, n,
					 "the table routes over %u experts, the layer has %u",
					 h->n_experts, n_experts);
	if (h->tokens < 1 || h->tokens > DP_MAX_TOKENS || h->tokens != tokens)
		return dp_refuse(DP_ROUTING_ERROR_TOKENS, why, n,
					 "the table has %u tokens, the forward %u rows (1..%u)",
					 h->tokens, tokens, DP_MAX_TOKENS);
	if (h->topk < 1 || h->topk > DP_MAX_TOPK || h->topk > n_experts)
		return dp_refuse(DP_ROUTING_ERROR_TOPK, why, n,
					 "topk %u is outside 1..%u (and the layer's %u experts)",
					 h->topk, DP_MAX_TOPK, n_experts);
	if (dp_routing_size(h->tokens, h->topk, size) < 0 || *size > len)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n,
					 "%u tokens by %u need %llu bytes, the table has %llu",
					 h->tokens, h->topk, (unsigned long long)*size,
					 (unsigned long long)len);
	return 0;
}

/* A host entry's expert as dp_routing_check_entry takes it: NO_EXPERT is -1. */
static inline int64_t dp_routing_entry_expert(uint32_t expert)
{
	return expert == DP_ROUTING_NO_EXPERT ? -1 : (int64_t)expert;
}

/* The rule of one entry of a token's list, entry (t, k), given the entry before it (prev;
 * not read at k = 0). A token lists its experts in ascending order: so they are distinct,
 * and a duck's share of a token comes out of the split already in the order its section
 * needs, without a sort per token in the dataplane (dp_routing_pack sorts a gate's choices,
 * which come by score). NO_EXPERT (0xffffffff, DeepEP's -1 for a padded or dropped slot:
 * the largest id, so it comes last, as often as the token likes) is not looked at further:
 * its weight is never read, so any bits pass, as DeepEP leaves those weights unspecified.
 * Any other entry names an existing expert, above prev (-1 for a token's first entry),
 * with a finite weight (its float32 bits). k and `shown` are for the message: the choice
 * and the expert as the caller's user wrote them (a gate's int64 id; a table's NO_EXPERT
 * as -1). 0, or a negative enum dp_routing_error with why. */
static inline int dp_routing_check_entry(uint32_t t, uint32_t k, int64_t shown, uint32_t expert,
					 int64_t prev, uint32_t bits, uint32_t n_experts,
					 char *why, size_t n)
{
	if (expert == DP_ROUTING_NO_EXPERT)
		return 0;
	if (expert >= n_experts)
		return dp_refuse(DP_ROUTING_ERROR_EXPERT, why, n,
					 "token %u, choice %u names expert %lld; the layer has %u "
					 "(0..%u), or -1 for no expert: route with this layer's gate",
					 t, k, (long long)shown, n_experts, n_experts - 1);
	if (expert == prev)
		return dp_refuse(DP_ROUTING_ERROR_DUPLICATE, why, n,
					 "token %u names expert %u twice (again at choice %u): a "
					 "token's experts are distinct, as a top-k gives them",
					 t, expert, k);
	if (expert < prev && prev == DP_ROUTING_NO_EXPERT)
		return dp_refuse(DP_ROUTING_ERROR_ORDER, why, n,
					 "token %u, choice %u names expert %u after a -1 (no "
					 "expert): a host table lists a token's experts in ascending "
					 "order, -1 last (dp_routing_pack sorts a gate's choices)",
					 t, k, expert);
	if (expert < prev)
		return dp_refuse(DP_ROUTING_ERROR_ORDER, why, n,
					 "token %u, choice %u names expert %u after expert %lld: a "
					 "host table lists a token's experts in ascending order, -1 "
					 "last (dp_routing_pack sorts a gate's choices)",
					 t, k, expert, (long long)prev);
	if (!dp_routing_finite(bits))
		return dp_refuse(DP_ROUTING_ERROR_WEIGHT, why, n,
					 "token %u, choice %u (expert %u) has weight bits 0x%08x: "
					 "NaN or infinite; weights must be finite",
					 t, k, expert, bits);
	return 0;
}

/* Check a host table of len bytes (a private copy: it is read once, in order) for a
 * forward of `tokens` rows on a layer of n_experts routed experts. 0, or a negative enum
 * dp_routing_error with why. Bytes past the table's size are not read. */
static inline int dp_routing_check(const void *table, uint64_t len, uint32_t tokens,
				   uint32_t n_experts, char *why, size_t n)
{
	const uint8_t *p = table;
	struct dp_routing_header h;
	uint64_t size;
	int rc = dp_routing_check_n_experts(n_experts, why, n);
	if (rc < 0)
		return rc;
	if (len < DP_ROUTING_HEADER_SIZE)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n,
					 "%llu bytes are fewer than the routing header's %llu",
					 (unsigned long long)len,
					 (unsigned long long)DP_ROUTING_HEADER_SIZE);
	memcpy(&h, p, sizeof(h));
	rc = dp_routing_check_header(&h, len, tokens, n_experts, &size, why, n);
	if (rc < 0)
		return rc;
	const uint8_t *e = p + DP_ROUTING_HEADER_SIZE;
	for (uint32_t t = 0; t < h.tokens; t++) {
		int64_t prev = -1;
		for (uint32_t k = 0; k < h.topk; k++, e += DP_ROUTING_ENTRY_SIZE) {
			uint32_t expert, bits;
			memcpy(&expert, e, 4);
			memcpy(&bits, e + 4, 4);
			rc = dp_routing_check_entry(t, k, dp_routing_entry_expert(expert), expert,
						    prev, bits, n_experts, why, n);
			if (rc < 0)
				return rc;
			prev = expert;
		}
	}
	return 0;
}

/* Sort n (<= DP_MAX_TOPK) keys ascending in place, by a fixed network of compare-exchanges
 * that compile to conditional moves: a gate's choices come in random order to a branch
 * predictor, and a sort with branches per key cost more than the rest of the pack. The
 * keys past n up to the network's width (8 or 16) must be UINT64_MAX. */
static inline __attribute__((always_inline)) void dp_routing_cx(uint64_t *s, int i, int j)
{
	uint64_t a = s[i], b = s[j];
	s[i] = a < b ? a : b;
	s[j] = a < b ? b : a;
}

/* Knuth's 19 compare-exchanges for 8 keys, written out so that the keys stay in registers */
static inline void dp_routing_sort8(uint64_t *s)
{
	dp_routing_cx(s, 0, 2); dp_routing_cx(s, 1, 3); dp_routing_cx(s, 4, 6); dp_routing_cx(s, 5, 7);
	dp_routing_cx(s, 0, 4); dp_routing_cx(s, 1, 5); dp_routing_cx(s, 2, 6); dp_routing_cx(s, 3, 7);
	dp_routing_cx(s, 0, 1); dp_routing_cx(s, 2, 3); dp_routing_cx(s, 4, 5); dp_routing_cx(s, 6, 7);
	dp_routing_cx(s, 2, 4); dp_routing_cx(s, 3, 5); dp_routing_cx(s, 1, 4); dp_routing_cx(s, 3, 6);
	dp_routing_cx(s, 1, 2); dp_routing_cx(s, 3, 4); dp_routing_cx(s, 5, 6);
}

/* Green's 60 for 16 keys (10 layers) */
static inline void dp_routing_sort16(uint64_t *s)
{
	dp_routing_cx(s, 0, 13); dp_routing_cx(s, 1, 12); dp_routing_cx(s, 2, 15); dp_routing_cx(s, 3, 14);
	dp_routing_cx(s, 4, 8); dp_routing_cx(s, 5, 6); dp_routing_cx(s, 7, 11); dp_routing_cx(s, 9, 10);
	dp_routing_cx(s, 0, 5); dp_routing_cx(s, 1, 7); dp_routing_cx(s, 2, 9); dp_routing_cx(s, 3, 4);
	dp_routing_cx(s, 6, 13); dp_routing_cx(s, 8, 14); dp_routing_cx(s, 10, 15); dp_routing_cx(s, 11, 12);
	dp_routing_cx(s, 0, 1); dp_routing_cx(s, 2, 3); dp_routing_cx(s, 4, 5); dp_routing_cx(s, 6, 8);
	dp_routing_cx(s, 7, 9); dp_routing_cx(s, 10, 11); dp_routing_cx(s, 12, 13); dp_routing_cx(s, 14, 15);
	dp_routing_cx(s, 0, 2); dp_routing_cx(s, 1, 3); dp_routing_cx(s, 4, 10); dp_routing_cx(s, 5, 11);
	dp_routing_cx(s, 6, 7); dp_routing_cx(s, 8, 9); dp_routing_cx(s, 12, 14); dp_routing_cx(s, 13, 15);
	dp_routing_cx(s, 1, 2); dp_routing_cx(s, 3, 12); dp_routing_cx(s, 4, 6); dp_routing_cx(s, 5, 7);
	dp_routing_cx(s, 8, 10); dp_routing_cx(s, 9, 11); dp_routing_cx(s, 13, 14); dp_routing_cx(s, 1, 4);
	dp_routing_cx(s, 2, 6); dp_routing_cx(s, 5, 8); dp_routing_cx(s, 7, 10); dp_routing_cx(s, 9, 13);
	dp_routing_cx(s, 11, 14); dp_routing_cx(s, 2, 4); dp_routing_cx(s, 3, 6); dp_routing_cx(s, 9, 12);
	dp_routing_cx(s, 11, 13); dp_routing_cx(s, 3, 5); dp_routing_cx(s, 6, 8); dp_routing_cx(s, 7, 9);
	dp_routing_cx(s, 10, 12); dp_routing_cx(s, 3, 4); dp_routing_cx(s, 5, 6); dp_routing_cx(s, 7, 8);
	dp_routing_cx(s, 9, 10); dp_routing_cx(s, 11, 12); dp_routing_cx(s, 6, 7); dp_routing_cx(s, 8, 9);
}

static inline void dp_routing_sort_keys(uint64_t *s, uint32_t n)
{
	if (n <= 1)
		return;
	if (n <= 8)
		dp_routing_sort8(s);
	else
		dp_routing_sort16(s);
}

/* A gate's id as the table holds it: -1 is NO_EXPERT; any other id outside 0..2^32-2 is
 * one no layer has (0xfffffffe: refused as EXPERT, named by its own value). */
static inline uint32_t dp_routing_table_id(int64_t id)
{
	if (id == -1)
		return DP_ROUTING_NO_EXPERT;
	return id < 0 || id > 0xfffffffeLL ? 0xfffffffeu : (uint32_t)id;
}

/* Write the host table of a gate's choices into out (out_len bytes) and check it by the
 * rule dp_routing_check keeps, in the same pass: the client's one check of a routed
 * submit. indices are [tokens][topk] signed integers of index_size bytes (4: int32, 8:
 * int64; -1: no expert), weights [tokens][topk] float32, both C-contiguous, in any order
 * within a token: each token's choices are sorted by expert (stably: a duplicate keeps
 * its order) and the sorted list is checked entry by entry as dp_routing_check does,
 * so the verdict is the one it gives that table; messages name a choice by the caller's
 * index. A -1 becomes NO_EXPERT with weight 0. 0, or a negative enum dp_routing_error
 * with why; on a refusal out holds a partial table that must not be sent. */
static inline int dp_routing_pack(const void *indices, uint32_t index_size, const void *weights,
				  uint32_t tokens, uint32_t topk, uint32_t n_experts, void *out,
				  uint64_t out_len, char *why, size_t n)
{
	uint8_t *p = out;
	uint64_t size;
	int rc = dp_routing_check_n_experts(n_experts, why, n);
	if (rc < 0)
		return rc;
	if (index_size != 4 && index_size != 8)
		return dp_refuse(DP_ROUTING_ERROR_EXPERT, why, n,
					 "expert ids of %u bytes: give int32 or int64", index_size);
	struct dp_routing_header h = {
		.magic = DP_ROUTING_MAGIC,
		.version = DP_ROUTING_VERSION,
		.topk = topk > UINT16_MAX ? 0 : (uint16_t)topk, /* 0: refused as topk */
		.tokens = tokens,
		.n_experts = n_experts,
	};
	rc = dp_routing_check_header(&h, out_len, tokens, n_experts, &size, why, n);
	if (rc < 0)
		return rc;
	memcpy(p, &h, sizeof(h));
	const uint8_t *idx = indices, *w = weights;
	uint8_t *e = p + DP_ROUTING_HEADER_SIZE;
	for (uint32_t t = 0; t < tokens; t++) {
		uint64_t row = (uint64_t)t * topk, key[16];
		int64_t id[DP_MAX_TOPK];
		for (uint32_t k = 0; k < 16; k++)
			key[k] = UINT64_MAX;
		for (uint32_t k = 0; k < topk; k++) {
			if (index_size == 4) {
				int32_t e32;
				memcpy(&e32, idx + (row + k) * 4, 4);
				id[k] = e32;
			} else {
				memcpy(&id[k], idx + (row + k) * 8, 8);
			}
			/* the table's id, then the choice: a stable sort by id */
			key[k] = (uint64_t)dp_routing_table_id(id[k]) << 8 | k;
		}
		dp_routing_sort_keys(key, topk);
		int64_t prev = -1;
		for (uint32_t i = 0; i < topk; i++, e += DP_ROUTING_ENTRY_SIZE) {
			uint32_t expert = (uint32_t)(key[i] >> 8), k = (uint32_t)(key[i] & 0xff), bits;
			memcpy(&bits, w + (row + k) * 4, 4);
			rc = dp_routing_check_entry(t, k, id[k], expert, prev, bits, n_experts, why, n);
			if (rc < 0)
				return rc;
			if (expert == DP_ROUTING_NO_EXPERT)
				bits = 0; /* not read; a table with no NaN in it all the same */
			memcpy(e, &expert, 4);
			memcpy(e + 4, &bits, 4);
			prev = expert;
		}
	}
	return 0;
}

/* Check a placement (the dataplane's own copy, made from a layer's load): 1..MAX_EXPERTS
 * experts, each on 1..MAX_REPLICAS distinct ducks below DP_MAX_DUCKS. */
static inline int dp_routing_placement_check(const struct dp_routing_placement *pl, char *why,
					     size_t n)
{
	if (pl->n_experts < 1 || pl->n_experts > DP_MAX_EXPERTS)
		return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
					 "the placement's %u experts are outside 1..%u",
					 pl->n_experts, DP_MAX_EXPERTS);
	for (uint32_t e = 0; e < pl->n_experts; e++) {
		uint32_t r = pl->replicas[e];
		const uint16_t *ducks = &pl->ducks[e * DP_MAX_REPLICAS];
		if (r < 1 || r > DP_MAX_REPLICAS)
			return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
						 "expert %u is on %u ducks; give it 1..%u", e, r,
						 DP_MAX_REPLICAS);
		for (uint32_t i = 0; i < r; i++) {
			if (ducks[i] >= DP_MAX_DUCKS)
				return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
							 "expert %u is placed on duck %u; ducks "
							 "are 0..%u",
							 e, ducks[i], DP_MAX_DUCKS - 1);
			for (uint32_t j = 0; j < i; j++)
				if (ducks[j] == ducks[i])
					return dp_refuse(
						DP_ROUTING_ERROR_PLACEMENT, why, n,
						"expert %u is placed on duck %u twice", e, ducks[i]);
		}
	}
	return 0;
}

/* The duck of token t's route to expert e (replica t % replicas[e]), or -1 when the
 * placement cannot say (an expert past it, no replicas, a duck past DP_MAX_DUCKS). */
static inline int32_t dp_routing_duck_of(const struct dp_routing_placement *pl, uint32_t t,
					 uint32_t e)
{
	if (e >= pl->n_experts || e >= DP_MAX_EXPERTS)
		return -1;
	uint32_t r = pl->replicas[e];
	if (r < 1 || r > DP_MAX_REPLICAS)
		return -1;
	uint16_t d = pl->ducks[e * DP_MAX_REPLICAS + (r == 1 ? 0 : t % r)]; /* most: no divide */
	return d < DP_MAX_DUCKS ? d : -1;
}

/* The placement a forward follows while some ducks are known lost (issue 30.1): each
 * expert's replicas in their order with the `lost` ones (a DP_MAX_DUCKS-bit set) left
 * out, and with slots (NULL: none) their bank slots into out_slots, so that the plan's
 * rule, replica t % replicas[e], picks live[t % nlive]. An expert none of whose ducks is
 * lost keeps its list as it is: its tokens go where they go when every duck is live. An
 * expert with no live replica gets none: its cells are NOWHERE, so dp_routing_count
 * refuses (PLACEMENT) a table that names it, and nothing is sent to a lost duck. For a
 * checked placement; returns the experts left with no replica. */
static inline uint32_t dp_routing_live(const struct dp_routing_placement *pl,
				       const uint16_t *slots, const uint64_t *lost,
				       struct dp_routing_placement *out, uint16_t *out_slots)
{
	uint32_t none = 0, n_experts = pl->n_experts < DP_MAX_EXPERTS ? pl->n_experts
								       : DP_MAX_EXPERTS;
	out->n_experts = n_experts;
	for (uint32_t e = 0; e < n_experts; e++) {
		uint32_t r = pl->replicas[e] < DP_MAX_REPLICAS ? pl->replicas[e] : DP_MAX_REPLICAS;
		uint32_t live = 0, at = e * DP_MAX_REPLICAS;
		for (uint32_t i = 0; i < r; i++) {
			uint16_t d = pl->ducks[at + i];
			if (d < DP_MAX_DUCKS && (lost[d >> 6] >> (d & 63) & 1))
				continue;
			out->ducks[at + live] = d;
			if (slots && out_slots)
				out_slots[at + live] = slots[at + i];
			live++;
		}
		out->replicas[e] = (uint8_t)live;
		none += live == 0;
	}
	return none;
}

/* The bank slot of each placed expert: slots[e * DP_MAX_REPLICAS + r] is the index of
 * expert e among the experts of its r-th duck, ascending by expert id (a duck's bank holds
 * its experts in that order, docs/protocols.md); with per_duck non-NULL (DP_MAX_DUCKS
 * entries) also each duck's count of experts. For a placement accepted by
 * dp_routing_placement_check; on any other, entries it cannot place are left as they are. */
static inline void dp_routing_bank_slots(const struct dp_routing_placement *pl, uint16_t *slots,
					 uint16_t *per_duck)
{
	uint16_t count[DP_MAX_DUCKS] = { 0 };
	for (uint32_t e = 0; e < pl->n_experts && e < DP_MAX_EXPERTS; e++)
		for (uint32_t r = 0; r < pl->replicas[e] && r < DP_MAX_REPLICAS; r++) {
			uint16_t d = pl->ducks[e * DP_MAX_REPLICAS + r];
			if (d < DP_MAX_DUCKS)
				slots[e * DP_MAX_REPLICAS + r] = count[d]++;
		}
	if (per_duck)
		memcpy(per_duck, count, sizeof(count));
}

/* t % r for every replica count r (1..DP_MAX_REPLICAS) of one token t, kept by counting
 * from t = 0 rather than by dividing: a divide per entry cost more than the rest of it
 * (issue 28.6). For placements whose phases do not fit a plan (dp_routing_plan). */
struct dp_routing_tmod {
	/* m[r] = t % r for r in 2..max_r; 0 for every other byte value, so that any
	 * replicas[e] indexes it (one outside 1..DP_MAX_REPLICAS meets a NOWHERE cell) */
	uint8_t m[256];
	uint32_t max_r; /* the placement's most replicas, at most DP_MAX_REPLICAS */
};

static inline void dp_routing_tmod_next(struct dp_routing_tmod *tm)
{
	for (uint32_t r = 2; r <= tm->max_r; r++)
		tm->m[r] = (uint8_t)(tm->m[r] + 1u == r ? 0 : tm->m[r] + 1u);
}

/* A placement as the split and the dispatcher follow it, worked out once per call rather
 * than once per entry: which duck token t's choice of expert e goes to (its replica
 * t % replicas[e], dp_routing_duck_of's rule) and that expert's slot in the duck's bank.
 *
 * Token t's replica of every expert repeats with period L, the least common multiple of
 * the replica counts (1 without replicas; 2 with some experts on two ducks; 12 with 3 and
 * 4). When L tables of n_experts cells fit (DP_ROUTING_PLAN_CELLS), phases = L and the
 * cell of (t, e) is cell[(t % L) * n_experts + e]: one load per entry. Otherwise (say 5, 7
 * and 8 replicas on one layer) phases = 0 and it is cell[e * DP_MAX_REPLICAS + t % r],
 * t % r from dp_routing_tmod. A cell: bits 0..15 the duck, 16..30 its bank slot (or the
 * expert id, without slots), bit 31 (OUTSIDE) when the duck is not in the call's set;
 * NOWHERE where the placement cannot say (an unchecked one). */
#define DP_ROUTING_PLAN_CELLS (DP_MAX_EXPERTS * DP_MAX_REPLICAS)
#define DP_ROUTING_NOWHERE 0x7fffffffu
#define DP_ROUTING_OUTSIDE 0x80000000u

struct dp_routing_plan {
	const struct dp_routing_placement *pl;
	uint32_t n_experts; /* the placement's, at most DP_MAX_EXPERTS */
	uint32_t phases;    /* L, or 0: by dp_routing_tmod */
	uint32_t max_r;     /* the most replicas of an expert */
	uint32_t cell[DP_ROUTING_PLAN_CELLS];
};

static inline uint32_t dp_routing_gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t r = a % b;
		a = b;
		b = r;
	}
	return a;
}

/* The cell of expert e's replica i (< DP_MAX_REPLICAS) under pl, slots and ducks. */
static inline uint32_t dp_routing_cell(const struct dp_routing_placement *pl,
				       const uint16_t *slots, const uint64_t *ducks, uint32_t e,
				       uint32_t i)
{
	uint32_t r = pl->replicas[e];
	uint16_t d = pl->ducks[e * DP_MAX_REPLICAS + i];
	uint32_t id = slots ? slots[e * DP_MAX_REPLICAS + i] : e;
	if (i >= r || r > DP_MAX_REPLICAS || d >= DP_MAX_DUCKS || id > 0x7fff)
		return DP_ROUTING_NOWHERE;
	return d | id << 16 | (dp_routing_has_duck(ducks, d) ? 0 : DP_ROUTING_OUTSIDE);
}

/* Work out the plan of a placement (its n_experts at most DP_MAX_EXPERTS; unchecked ones
 * give NOWHERE cells, never a read past it) with bank slots (dp_routing_bank_slots) or
 * NULL for expert ids, and the call's set of ducks (NULL: every duck). */
static inline void dp_routing_plan(struct dp_routing_plan *plan,
				   const struct dp_routing_placement *pl, const uint16_t *slots,
				   const uint64_t *ducks)
{
	uint32_t n_experts = pl->n_experts < DP_MAX_EXPERTS ? pl->n_experts : DP_MAX_EXPERTS;
	uint32_t max_r = 1, lcm = 1;
	for (uint32_t e = 0; e < n_experts; e++) {
		uint32_t r = pl->replicas[e];
		if (r < 1 || r > DP_MAX_REPLICAS)
			continue; /* its cells are NOWHERE */
		max_r = r > max_r ? r : max_r;
		lcm = lcm / dp_routing_gcd(lcm, r) * r; /* at most 840, lcm(1..8) */
	}
	plan->pl = pl;
	plan->n_experts = n_experts;
	plan->max_r = max_r;
	plan->phases = n_experts && lcm * n_experts <= DP_ROUTING_PLAN_CELLS ? lcm : 0;
	if (plan->phases) {
		for (uint32_t e = 0; e < n_experts; e++) {
			uint32_t r = pl->replicas[e], i = 0; /* i = ph % r, by counting */
			for (uint32_t ph = 0; ph < lcm; ph++) {
				plan->cell[ph * n_experts + e] = dp_routing_cell(pl, slots, ducks, e, i);
				i = i + 1 >= r ? 0 : i + 1;
			}
		}
		return;
	}
	for (uint32_t e = 0; e < n_experts; e++)
		for (uint32_t i = 0; i < DP_MAX_REPLICAS; i++)
			plan->cell[e * DP_MAX_REPLICAS + i] = dp_routing_cell(pl, slots, ducks, e, i);
}

/* Where a walk over a table's tokens is: the current token's phase (its cells) or its
 * t % r. One walk per pass; `phased` (plan->phases != 0) is a constant in each caller's
 * copy of its loop, so the common case is one load per entry. */
struct dp_routing_walk {
	const uint32_t *cells; /* phased: the current token's n_experts cells */
	uint32_t phase;
	struct dp_routing_tmod tm;
};

static inline void dp_routing_walk_start(const struct dp_routing_plan *plan,
					 struct dp_routing_walk *w)
{
	w->cells = plan->cell;
	w->phase = 0;
	memset(w->tm.m, 0, sizeof(w->tm.m));
	w->tm.max_r = plan->max_r;
}

static inline __attribute__((always_inline)) void
dp_routing_walk_next(const struct dp_routing_plan *plan, struct dp_routing_walk *w, const int phased)
{
	if (!phased) {
		dp_routing_tmod_next(&w->tm);
		return;
	}
	if (++w->phase == plan->phases) {
		w->phase = 0;
		w->cells = plan->cell;
	} else {
		w->cells += plan->n_experts;
	}
}

/* The cell of the walk's token and expert e (< plan->n_experts). */
static inline __attribute__((always_inline)) uint32_t
dp_routing_walk_cell(const struct dp_routing_plan *plan, const struct dp_routing_walk *w,
		     uint32_t e, const int phased)
{
	if (phased)
		return w->cells[e];
	/* no branch on the replica count: see tm.m */
	return plan->cell[e * DP_MAX_REPLICAS + w->tm.m[plan->pl->replicas[e]]];
}

/* Count each duck's entries of the host entries e0 ([tokens][topk], in bounds) under a
 * plan into count[DP_MAX_DUCKS] (set here), ducks outside the plan's set left at 0;
 * NO_EXPERT entries and ids past n_experts (a refused table's) are not counted. 0, or
 * DP_ROUTING_ERROR_PLACEMENT with why for an expert named that the plan has no duck for.
 * Phased, with at least as many entries as cells (a prefill), a histogram of (phase,
 * expert) first and the cells after: one increment per entry instead of a cell lookup
 * and an increment; with fewer (a decode step), entry by entry, so that a token's count
 * does not clear and fold every cell. */
static inline __attribute__((always_inline)) int
dp_routing_count_walk(const struct dp_routing_plan *plan, const uint8_t *e0, uint32_t tokens,
		      uint32_t topk, uint32_t *count, char *why, size_t n, const int phased)
{
	uint32_t n_experts = plan->n_experts;
	struct dp_routing_walk w;
	dp_routing_walk_start(plan, &w);
	memset(count, 0, DP_MAX_DUCKS * sizeof(*count));
	uint32_t none = plan->phases * n_experts;
	if (phased && (uint64_t)tokens * topk >= none) {
		/* one cell per plan cell, and a last one for every entry that names none */
		uint32_t hist[DP_ROUTING_PLAN_CELLS + 1], base = 0;
		memset(hist, 0, (none + 1) * sizeof(*hist));
		for (uint32_t t = 0; t < tokens; t++) {
			const uint8_t *row = e0 + (uint64_t)t * topk * DP_ROUTING_ENTRY_SIZE;
			for (uint32_t k = 0; k < topk; k++) {
				uint32_t expert;
				memcpy(&expert, row + k * DP_ROUTING_ENTRY_SIZE, 4);
				hist[expert < n_experts ? base + expert : none]++;
			}
			base = base + n_experts == none ? 0 : base + n_experts;
		}
		for (uint32_t c = 0; c < none; c++) {
			uint32_t at = plan->cell[c];
			if (!hist[c])
				continue;
			if (at == DP_ROUTING_NOWHERE)
				return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
							 "the placement has no duck for expert %u",
							 c % n_experts);
			count[at & 0xffff] += at & DP_ROUTING_OUTSIDE ? 0 : hist[c];
		}
		return 0;
	}
	for (uint32_t t = 0; t < tokens; t++, dp_routing_walk_next(plan, &w, phased)) {
		const uint8_t *row = e0 + (uint64_t)t * topk * DP_ROUTING_ENTRY_SIZE;
		for (uint32_t k = 0; k < topk; k++) {
			uint32_t expert;
			memcpy(&expert, row + k * DP_ROUTING_ENTRY_SIZE, 4);
			if (expert >= n_experts)
				continue; /* NO_EXPERT: the slot contributes nothing */
			uint32_t at = dp_routing_walk_cell(plan, &w, expert, phased);
			if (at == DP_ROUTING_NOWHERE)
				return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
							 "the placement has no duck for expert %u",
							 expert);
			count[at & 0xffff] += !(at & DP_ROUTING_OUTSIDE);
		}
	}
	return 0;
}

static inline int dp_routing_count(const struct dp_routing_plan *plan, const uint8_t *e0,
				   uint32_t tokens, uint32_t topk, uint32_t *count, char *why,
				   size_t n)
{
	if (plan->phases)
		return dp_routing_count_walk(plan, e0, tokens, topk, count, why, n, 1);
	return dp_routing_count_walk(plan, e0, tokens, topk, count, why, n, 0);
}

/* Write every entry of e0 into its duck's section: at[d] is where duck d's next entry
 * goes (a sink for ducks outside the set, which is written over and never advanced: no
 * branch on it). Tokens come in order and each token's experts ascend (the host rule),
 * so each section comes out in (row, slot) order as written. */
static inline __attribute__((always_inline)) void
dp_routing_scatter(const struct dp_routing_plan *plan, const uint8_t *e0, uint32_t tokens,
		   uint32_t topk, uint8_t **at, const int phased)
{
	uint32_t n_experts = plan->n_experts;
	struct dp_routing_walk w;
	dp_routing_walk_start(plan, &w);
	for (uint32_t t = 0; t < tokens; t++, dp_routing_walk_next(plan, &w, phased)) {
		const uint8_t *row = e0 + (uint64_t)t * topk * DP_ROUTING_ENTRY_SIZE;
		for (uint32_t k = 0; k < topk; k++) {
			uint64_t x; /* the host entry: expert, then weight bits (little-endian) */
			memcpy(&x, row + k * DP_ROUTING_ENTRY_SIZE, 8);
			uint32_t expert = (uint32_t)x;
			if (expert >= n_experts)
				continue; /* NO_EXPERT (count refused any other) */
			uint32_t cell = dp_routing_walk_cell(plan, &w, expert, phased);
			uint32_t in = !(cell & DP_ROUTING_OUTSIDE);
			/* the wire entry (row, slot, weight bits as they are) made in a register */
			uint64_t we = (uint64_t)t | (uint64_t)(cell >> 16 & 0x7fff) << 16 |
				      (x & 0xffffffff00000000ull);
			uint8_t *q = at[cell & 0xffff];
			memcpy(q, &we, sizeof(we));
			at[cell & 0xffff] = q + (in << 3);
		}
	}
}

/* Distinct rows of a section of n >= 1 entries at w, whose rows do not descend: the
 * entries whose row differs from the one before, plus the first. SSE2 compares two
 * entries' rows a step (the scalar loop cost a sixth of the split). */
static inline uint32_t dp_routing_rows(const uint8_t *w, uint32_t n)
{
	uint32_t same = 0, j = 1;
#if defined(__SSE2__)
	const __m128i rows = _mm_set_epi32(0, 0xffff, 0, 0xffff), zero = _mm_setzero_si128();
	__m128i acc = zero; /* lanes 0 and 2 count equal rows; 1 and 3 count steps */
	for (; j + 2 <= n; j += 2) {
		__m128i a = _mm_loadu_si128((const void *)(w + (uint64_t)j * 8));
		__m128i b = _mm_loadu_si128((const void *)(w + (uint64_t)(j - 1) * 8));
		__m128i x = _mm_and_si128(_mm_xor_si128(a, b), rows);
		acc = _mm_sub_epi32(acc, _mm_cmpeq_epi32(x, zero));
	}
	uint32_t lane[4];
	_mm_storeu_si128((void *)lane, acc);
	same = lane[0] + lane[2];
#endif
	for (; j < n; j++) {
		uint16_t a, b;
		memcpy(&a, w + (uint64_t)j * 8, 2);
		memcpy(&b, w + (uint64_t)(j - 1) * 8, 2);
		same += a == b;
	}
	return n - same;
}

/* Split a host table (len bytes, accepted by dp_routing_check) by a placement (accepted
 * by dp_routing_placement_check, same n_experts) into the wire table of the ducks in
 * `ducks` (a DP_MAX_DUCKS-bit set: one NIC's; NULL: every duck), written to out (out_len
 * bytes): 0 and *out_size its bytes, 0 when no duck of the set is routed (send nothing),
 * or a negative enum dp_routing_error with why (out may then be partly written). With
 * `targets` (DP_MAX_DUCKS bits) non-NULL, it is set to the ducks that got a section.
 * Sections ascend by duck, entries by (row, expert); the rows are the tokens; NO_EXPERT
 * entries are left out (they reach no duck: a table of only those is "no duck"). An entry's
 * expert is the global id, or with `slots` (dp_routing_bank_slots) the expert's slot in
 * that duck's bank (slots ascend with ids on a duck: the order holds). `flags` (enum
 * dp_routing_wire_flag) go into the header; with SHARED a table is written even when no
 * duck of the set is routed (a header alone: the ducks still compute the shared expert).
 *
 * A counting sort by duck: count each duck's entries (dp_routing_count), then write each
 * entry at its duck's next place (dp_routing_scatter), then count each section's rows.
 * The host rule (a token's experts ascend) is what lets the scatter write in order
 * without a sort. On a table the check refused, every step stays inside its buffers and
 * the scatter never writes more than the count counted. */
static inline int dp_routing_split(const void *table, uint64_t len,
				   const struct dp_routing_placement *pl, const uint16_t *slots,
				   uint8_t flags, const uint64_t *ducks, void *out, uint64_t out_len,
				   uint64_t *out_size, uint64_t *targets, char *why, size_t n)
{
	const uint8_t *p = table;
	struct dp_routing_header h;
	uint64_t size;
	uint32_t count[DP_MAX_DUCKS];
	*out_size = 0;
	if (targets)
		memset(targets, 0, DP_MAX_DUCKS / 8);
	/* a checked table passes these; they keep an unchecked one from reading past len */
	if (len < DP_ROUTING_HEADER_SIZE)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n, "no routing header");
	memcpy(&h, p, sizeof(h));
	if (h.topk > DP_MAX_TOPK || h.tokens > DP_MAX_TOKENS ||
	    dp_routing_size(h.tokens, h.topk, &size) < 0 || size > len)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n,
					 "the routing table was not checked");
	if (h.n_experts != pl->n_experts)
		return dp_refuse(DP_ROUTING_ERROR_PLACEMENT, why, n,
					 "the table routes over %u experts, the placement places %u",
					 h.n_experts, pl->n_experts);
	const uint8_t *e0 = p + DP_ROUTING_HEADER_SIZE;
	struct dp_routing_plan plan; /* 32 KiB: per call, as the NIC's set is */
	dp_routing_plan(&plan, pl, slots, ducks);
	int rc = dp_routing_count(&plan, e0, h.tokens, h.topk, count, why, n);
	if (rc < 0)
		return rc;
	uint32_t n_ducks = 0, entries = 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++) {
		n_ducks += count[d] != 0;
		entries += count[d];
	}
	if (n_ducks == 0 && !(flags & DP_ROUTING_WIRE_FLAG_SHARED))
		return 0;
	if (dp_routing_wire_size(n_ducks, entries, &size) < 0 || size > out_len)
		return dp_refuse(DP_ROUTING_ERROR_NO_ROOM, why, n,
					 "the wire table needs %llu bytes, %llu are given",
					 (unsigned long long)size, (unsigned long long)out_len);
	uint8_t *o = out;
	struct dp_routing_wire_header wh = {
		.magic = DP_ROUTING_WIRE_MAGIC,
		.version = DP_ROUTING_VERSION,
		.flags = flags,
		.n_ducks = (uint16_t)n_ducks,
		.rows = h.tokens,
		.entries = entries,
	};
	memcpy(o, &wh, sizeof(wh));
	uint8_t *dir = o + DP_ROUTING_WIRE_HEADER_SIZE;
	uint8_t *w0 = dir + (uint64_t)n_ducks * DP_ROUTING_WIRE_DUCK_SIZE;
	uint8_t sink[DP_ROUTING_WIRE_ENTRY_SIZE];
	uint8_t *at[DP_MAX_DUCKS];
	for (uint32_t d = 0, first = 0; d < DP_MAX_DUCKS; d++) {
		at[d] = dp_routing_has_duck(ducks, d) ? w0 + (uint64_t)first * DP_ROUTING_WIRE_ENTRY_SIZE
						      : sink;
		first += count[d];
	}
	if (plan.phases)
		dp_routing_scatter(&plan, e0, h.tokens, h.topk, at, 1);
	else
		dp_routing_scatter(&plan, e0, h.tokens, h.topk, at, 0);
	const uint8_t *section = w0;
	for (uint32_t d = 0, i = 0; d < DP_MAX_DUCKS; d++) {
		if (!count[d])
			continue;
		uint32_t rows = dp_routing_rows(section, count[d]);
		struct dp_routing_wire_duck wd = { (uint16_t)d, (uint16_t)rows, count[d] };
		memcpy(dir + (uint64_t)i++ * DP_ROUTING_WIRE_DUCK_SIZE, &wd, sizeof(wd));
		section += (uint64_t)count[d] * DP_ROUTING_WIRE_ENTRY_SIZE;
		if (targets)
			targets[d >> 6] |= 1ull << (d & 63);
	}
	*out_size = size;
	return 0;
}

/* Check a wire table of len bytes that came with an activation of `rows` rows, for a
 * layer of n_experts routed experts: 0, or a negative enum dp_routing_error with why. */
static inline int dp_routing_wire_check(const void *table, uint64_t len, uint32_t rows,
					uint32_t n_experts, char *why, size_t n)
{
	const uint8_t *p = table;
	struct dp_routing_wire_header h;
	uint64_t size;
	int rc = dp_routing_check_n_experts(n_experts, why, n);
	if (rc < 0)
		return rc;
	if (len < DP_ROUTING_WIRE_HEADER_SIZE)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n,
					 "%llu bytes are fewer than the wire routing header's %llu",
					 (unsigned long long)len,
					 (unsigned long long)DP_ROUTING_WIRE_HEADER_SIZE);
	memcpy(&h, p, sizeof(h));
	if (h.magic != DP_ROUTING_WIRE_MAGIC)
		return dp_refuse(DP_ROUTING_ERROR_BAD_MAGIC, why, n,
					 "magic 0x%08x is not a wire routing table's (0x%08x)",
					 h.magic, DP_ROUTING_WIRE_MAGIC);
	if (h.version != DP_ROUTING_VERSION)
		return dp_refuse(DP_ROUTING_ERROR_BAD_VERSION, why, n,
					 "routing table version %u, this build reads %u", h.version,
					 DP_ROUTING_VERSION);
	if (h.flags & ~DP_ROUTING_WIRE_FLAG_SHARED)
		return dp_refuse(DP_ROUTING_ERROR_BAD_FLAGS, why, n,
					 "wire routing flags 0x%02x: only SHARED (0x%02x) is defined",
					 h.flags, DP_ROUTING_WIRE_FLAG_SHARED);
	if (h.rows < 1 || h.rows > DP_MAX_TOKENS || h.rows != rows)
		return dp_refuse(DP_ROUTING_ERROR_TOKENS, why, n,
					 "the table has %u rows, the activation %u (1..%u)", h.rows,
					 rows, DP_MAX_TOKENS);
	/* no section at all only where the shared expert gives its ducks work */
	if (h.n_ducks < !(h.flags & DP_ROUTING_WIRE_FLAG_SHARED) || h.n_ducks > DP_MAX_DUCKS)
		return dp_refuse(DP_ROUTING_ERROR_DUCKS, why, n,
					 "%u duck sections, not %u..%u", h.n_ducks,
					 !(h.flags & DP_ROUTING_WIRE_FLAG_SHARED), DP_MAX_DUCKS);
	if (h.entries < h.n_ducks || h.entries > h.rows * DP_MAX_TOPK)
		return dp_refuse(DP_ROUTING_ERROR_ENTRIES, why, n,
					 "%u entries for %u ducks and %u rows (at most %u per row)",
					 h.entries, h.n_ducks, h.rows, DP_MAX_TOPK);
	if (dp_routing_wire_size(h.n_ducks, h.entries, &size) < 0 || size > len)
		return dp_refuse(DP_ROUTING_ERROR_TRUNCATED, why, n,
					 "%u ducks and %u entries need %llu bytes, the table has %llu",
					 h.n_ducks, h.entries, (unsigned long long)size,
					 (unsigned long long)len);
	const uint8_t *dir = p + DP_ROUTING_WIRE_HEADER_SIZE;
	const uint8_t *w0 = dir + (uint64_t)h.n_ducks * DP_ROUTING_WIRE_DUCK_SIZE;
	uint64_t sum = 0;
	int32_t prev_duck = -1;
	for (uint32_t i = 0; i < h.n_ducks; i++) {
		struct dp_routing_wire_duck wd;
		memcpy(&wd, dir + (uint64_t)i * DP_ROUTING_WIRE_DUCK_SIZE, sizeof(wd));
		if (wd.duck >= DP_MAX_DUCKS || (int32_t)wd.duck <= prev_duck)
			return dp_refuse(DP_ROUTING_ERROR_DUCKS, why, n,
						 "section %u is duck %u: ducks must ascend, below %u",
						 i, wd.duck, DP_MAX_DUCKS);
		prev_duck = wd.duck;
		if (wd.n_entries < 1 || wd.n_entries > h.entries - sum)
			return dp_refuse(DP_ROUTING_ERROR_ENTRIES, why, n,
						 "duck %u's %u entries: zero, or past the table's %u",
						 wd.duck, wd.n_entries, h.entries);
		/* sections are consecutive: this one is [sum, sum + n_entries) */
		uint32_t distinct = 0;
		int32_t prev_row = -1, prev_expert = -1;
		for (uint32_t j = 0; j < wd.n_entries; j++) {
			struct dp_routing_wire_entry we;
			uint32_t bits;
			memcpy(&we, w0 + (sum + j) * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
			memcpy(&bits, &we.weight, 4);
			if (we.row >= h.rows)
				return dp_refuse(DP_ROUTING_ERROR_ROWS, why, n,
							 "duck %u, entry %u: row %u of %u", wd.duck,
							 j, we.row, h.rows);
			if (we.expert >= n_experts)
				return dp_refuse(DP_ROUTING_ERROR_EXPERT, why, n,
							 "duck %u, entry %u names expert %u; the "
							 "layer has %u",
							 wd.duck, j, we.expert, n_experts);
			if ((int32_t)we.row < prev_row ||
			    ((int32_t)we.row == prev_row && (int32_t)we.expert <= prev_expert))
				return dp_refuse(DP_ROUTING_ERROR_ORDER, why, n,
							 "duck %u, entry %u (row %u, expert %u) does "
							 "not follow (row %d, expert %d)",
							 wd.duck, j, we.row, we.expert, prev_row,
							 prev_expert);
			if (!dp_routing_finite(bits))
				return dp_refuse(DP_ROUTING_ERROR_WEIGHT, why, n,
							 "duck %u, entry %u has weight bits 0x%08x: "
							 "NaN or infinite",
							 wd.duck, j, bits);
			distinct += (int32_t)we.row != prev_row;
			prev_row = we.row;
			prev_expert = we.expert;
		}
		if (distinct != wd.n_rows)
			return dp_refuse(DP_ROUTING_ERROR_ROWS, why, n,
						 "duck %u says %u rows, its entries name %u", wd.duck,
						 wd.n_rows, distinct);
		sum += wd.n_entries;
	}
	if (sum != h.entries)
		return dp_refuse(DP_ROUTING_ERROR_ENTRIES, why, n,
					 "the sections hold %llu entries, the header says %u",
					 (unsigned long long)sum, h.entries);
	return 0;
}

/* Find duck's section in a wire table of len bytes (accepted by dp_routing_wire_check):
 * 0 and *out, or DP_ROUTING_ERROR_NO_SUCH_DUCK (or _TRUNCATED for a table that would
 * send the search past len). */
static inline int dp_routing_wire_section(const void *table, uint64_t len, uint16_t duck,
					  struct dp_routing_section *out)
{
	const uint8_t *p = table;
	struct dp_routing_wire_header h;
	if (len < DP_ROUTING_WIRE_HEADER_SIZE)
		return DP_ROUTING_ERROR_TRUNCATED;
	memcpy(&h, p, sizeof(h));
	uint64_t base = DP_ROUTING_WIRE_HEADER_SIZE + (uint64_t)h.n_ducks * DP_ROUTING_WIRE_DUCK_SIZE;
	if (base > len)
		return DP_ROUTING_ERROR_TRUNCATED;
	uint64_t first = 0;
	for (uint32_t i = 0; i < h.n_ducks; i++) {
		struct dp_routing_wire_duck wd;
		memcpy(&wd, p + DP_ROUTING_WIRE_HEADER_SIZE + (uint64_t)i * DP_ROUTING_WIRE_DUCK_SIZE,
		       sizeof(wd));
		if (wd.duck == duck) {
			uint64_t off = base + first * DP_ROUTING_WIRE_ENTRY_SIZE;
			if (off > len || (len - off) / DP_ROUTING_WIRE_ENTRY_SIZE < wd.n_entries)
				return DP_ROUTING_ERROR_TRUNCATED;
			out->offset = off;
			out->n_entries = wd.n_entries;
			out->n_rows = wd.n_rows;
			return 0;
		}
		first += wd.n_entries; /* at most 2^16 sections of 2^32: no wrap */
	}
	return DP_ROUTING_ERROR_NO_SUCH_DUCK;
}

/* Duck's section of a wire table of len bytes (accepted by dp_routing_wire_check) as a
 * table of its own, for a unicast that carries only its rows: written to out (out_len
 * bytes), rows renumbered 0..n_rows-1 in order; row_map[i] (row_cap entries) gets the
 * row that new row i was. 0 and *out_size, or a negative enum dp_routing_error. */
static inline int dp_routing_wire_unicast(const void *table, uint64_t len, uint16_t duck,
					  void *out, uint64_t out_len, uint16_t *row_map,
					  uint32_t row_cap, uint64_t *out_size, char *why, size_t n)
{
	const uint8_t *p = table;
	struct dp_routing_section s;
	uint64_t size;
	*out_size = 0;
	struct dp_routing_wire_header h;
	int rc = dp_routing_wire_section(table, len, duck, &s);
	if (rc < 0)
		return dp_refuse(rc, why, n, "duck %u has no section in this table", duck);
	memcpy(&h, p, sizeof(h)); /* wire_section read it: len holds a header */
	if (s.n_rows < 1 || s.n_rows > row_cap)
		return dp_refuse(DP_ROUTING_ERROR_NO_ROOM, why, n,
					 "duck %u has %u rows, the row map %u", duck, s.n_rows,
					 row_cap);
	if (dp_routing_wire_size(1, s.n_entries, &size) < 0 || size > out_len)
		return dp_refuse(DP_ROUTING_ERROR_NO_ROOM, why, n,
					 "the unicast table needs %llu bytes, %llu are given",
					 (unsigned long long)size, (unsigned long long)out_len);
	uint8_t *o = out;
	struct dp_routing_wire_header wh = {
		.magic = DP_ROUTING_WIRE_MAGIC,
		.version = DP_ROUTING_VERSION,
		.flags = h.flags,
		.n_ducks = 1,
		.rows = s.n_rows,
		.entries = s.n_entries,
	};
	struct dp_routing_wire_duck wd = { duck, (uint16_t)s.n_rows, s.n_entries };
	memcpy(o, &wh, sizeof(wh));
	memcpy(o + DP_ROUTING_WIRE_HEADER_SIZE, &wd, sizeof(wd));
	uint8_t *w0 = o + DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE;
	uint32_t new_row = 0;
	int32_t prev = -1;
	for (uint32_t j = 0; j < s.n_entries; j++) {
		struct dp_routing_wire_entry we;
		memcpy(&we, p + s.offset + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
		if ((int32_t)we.row != prev) {
			if (prev >= 0)
				new_row++;
			if (new_row >= s.n_rows) /* more rows than it says: not checked */
				return dp_refuse(DP_ROUTING_ERROR_ROWS, why, n,
							 "duck %u names more rows than its %u",
							 duck, s.n_rows);
			row_map[new_row] = we.row;
			prev = we.row;
		}
		we.row = (uint16_t)new_row;
		memcpy(w0 + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, &we, sizeof(we));
	}
	*out_size = size;
	return 0;
}

static inline const char *dp_routing_strerror(int rc)
{
	switch (rc) {
	case DP_ROUTING_ERROR_OK:
		return "ok";
	case DP_ROUTING_ERROR_TRUNCATED:
		return "the table is shorter than its header or the sizes it declares";
	case DP_ROUTING_ERROR_BAD_MAGIC:
		return "not a routing table of this kind";
	case DP_ROUTING_ERROR_BAD_VERSION:
		return "another routing table version";
	case DP_ROUTING_ERROR_BAD_FLAGS:
		return "routing flags this version does not define";
	case DP_ROUTING_ERROR_TOKENS:
		return "token count zero, over the maximum, or not the forward's rows";
	case DP_ROUTING_ERROR_TOPK:
		return "topk zero, over the maximum, or over the layer's experts";
	case DP_ROUTING_ERROR_N_EXPERTS:
		return "expert count zero, over the maximum, or not the layer's";
	case DP_ROUTING_ERROR_EXPERT:
		return "an expert id past the layer's experts";
	case DP_ROUTING_ERROR_DUPLICATE:
		return "a token names one expert twice";
	case DP_ROUTING_ERROR_WEIGHT:
		return "a weight is NaN or infinite";
	case DP_ROUTING_ERROR_DUCKS:
		return "duck sections missing, past the maximum, or not ascending";
	case DP_ROUTING_ERROR_ENTRIES:
		return "section entry counts zero or not adding up";
	case DP_ROUTING_ERROR_ORDER:
		return "out of order: a token's experts (host table) or a section's (row, expert) "
		       "(wire table) do not ascend";
	case DP_ROUTING_ERROR_ROWS:
		return "a row past the activation's, or a section's row count wrong";
	case DP_ROUTING_ERROR_PLACEMENT:
		return "an expert with no duck, too many, a duck twice or past the maximum";
	case DP_ROUTING_ERROR_NO_ROOM:
		return "the output buffer is too small";
	case DP_ROUTING_ERROR_NO_SUCH_DUCK:
		return "the duck has no section in the table";
	}
	return "unknown routing error";
}

#endif /* DP_ROUTING_H */
