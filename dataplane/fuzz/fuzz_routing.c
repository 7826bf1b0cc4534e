/* fuzz_routing: routing tables against dp_routing.h, and what the dataplane and a duck
 * then do with an accepted one.
 *
 * A client writes a host routing table into shared memory; a duck receives a wire table
 * in a datagram. The same bytes go to both checks. When dp_routing_check accepts them,
 * this harness checks the verdict with loops of its own, splits the table by a placement
 * (all ducks, or one NIC's), and expects the split to succeed, to pass dp_routing_wire_check,
 * to place every (token, expert) exactly once on a duck that holds the expert, and each
 * duck's unicast table to pass too. When dp_routing_wire_check accepts them, it walks every
 * section as a duck would. dp_routing_pack, given the same entries as a gate's arrays, must
 * agree with the check and write the same bytes (a -1 id is the table's NO_EXPERT, 0xffffffff,
 * whose weight it stores as 0). Split, section and unicast also run on refused tables: they must
 * stay inside their buffers whatever the bytes (each buffer is allocated to its exact size,
 * so that ASan sees one byte too many).
 *
 * Header-only (dp_routing.h): nothing to link.
 *
 * Input: 8 bytes of parameters, then the table
 *   u16 n_experts - 1 (mod DP_MAX_EXPERTS)   u16 rows (the forward's, as given: 0 and
 *   more than DP_MAX_TOKENS are inputs too)   u8 bits 0-2: replicas - 1 of the most
 *   replicated expert, bit 7: expert 0 has no duck   u8 placement stride   u8 the NIC's
 *   ducks: 0 every duck, else d % (1 + v % 8) == (v >> 3) % (1 + v % 8)   u8 unused
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_routing.h"

#define EXPECT(cond)                                                                               \
	do {                                                                                       \
		if (!(cond))                                                                       \
			abort();                                                                   \
	} while (0)

static uint32_t u16_at(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t u32_at(const uint8_t *p)
{
	return u16_at(p) | u16_at(p + 2) << 16;
}

static int finite(uint32_t bits)
{
	return ((bits >> 23) & 0xff) != 0xff;
}

/* The host table rules, again, in the plainest loops: the verdict must match. */
static void host_ok(const uint8_t *t, uint64_t len, uint32_t rows, uint32_t n_experts)
{
	EXPECT(len >= 16);
	EXPECT(u32_at(t) == DP_ROUTING_MAGIC && t[4] == DP_ROUTING_VERSION && t[5] == 0);
	uint32_t topk = u16_at(t + 6), tokens = u32_at(t + 8);
	EXPECT(u32_at(t + 12) == n_experts && tokens == rows);
	EXPECT(tokens >= 1 && tokens <= DP_MAX_TOKENS && topk >= 1 && topk <= DP_MAX_TOPK);
	EXPECT(topk <= n_experts && n_experts <= DP_MAX_EXPERTS);
	EXPECT(16 + (unsigned __int128)tokens * topk * 8 <= len);
	for (uint32_t i = 0; i < tokens; i++)
		for (uint32_t k = 0; k < topk; k++) {
			const uint8_t *e = t + 16 + ((uint64_t)i * topk + k) * 8;
			/* ascending: after a no expert only no expert, else above the one before */
			if (k > 0 && u32_at(e - 8) == 0xffffffffu)
				EXPECT(u32_at(e) == 0xffffffffu);
			if (u32_at(e) == 0xffffffffu) /* no expert: as often as it likes, any weight */
				continue;
			EXPECT(u32_at(e) < n_experts && finite(u32_at(e + 4)));
			EXPECT(k == 0 || u32_at(e) > u32_at(e - 8));
		}
}

/* A wire table's rules, again: the verdict must match. Returns its size. */
static uint64_t wire_ok(const uint8_t *w, uint64_t len, uint32_t rows, uint32_t n_experts)
{
	EXPECT(len >= 16 && u32_at(w) == DP_ROUTING_WIRE_MAGIC && w[4] == DP_ROUTING_VERSION &&
	       (w[5] == 0 || w[5] == DP_ROUTING_WIRE_FLAG_SHARED));
	uint32_t n_ducks = u16_at(w + 6), entries = u32_at(w + 12);
	EXPECT(u32_at(w + 8) == rows && rows >= 1 && rows <= DP_MAX_TOKENS);
	/* no section at all only with SHARED (every duck computes the shared expert) */
	EXPECT((n_ducks >= 1 || w[5] == DP_ROUTING_WIRE_FLAG_SHARED) && n_ducks <= DP_MAX_DUCKS);
	uint64_t size = 16 + 8 * ((uint64_t)n_ducks + entries);
	EXPECT(size <= len);
	const uint8_t *e = w + 16 + 8 * (uint64_t)n_ducks;
	uint64_t sum = 0;
	for (uint32_t i = 0; i < n_ducks; i++) {
		const uint8_t *d = w + 16 + 8 * (uint64_t)i;
		EXPECT(u16_at(d) < DP_MAX_DUCKS && (i == 0 || u16_at(d) > u16_at(d - 8)));
		uint32_t n = u32_at(d + 4), distinct = 0;
		EXPECT(n >= 1);
		for (uint32_t j = 0; j < n; j++) {
			const uint8_t *x = e + (sum + j) * 8;
			EXPECT(u16_at(x) < rows && u16_at(x + 2) < n_experts && finite(u32_at(x + 4)));
			if (j > 0) {
				uint32_t a = u32_at(x - 8), b = u32_at(x); /* row | expert << 16 */
				uint32_t ka = (a & 0xffff) << 16 | a >> 16, kb = (b & 0xffff) << 16 | b >> 16;
				EXPECT(kb > ka);
			}
			distinct += j == 0 || u16_at(x) != u16_at(x - 8);
		}
		EXPECT(distinct == u16_at(d + 2));
		sum += n;
	}
	EXPECT(sum == entries);
	return size;
}

/* A duck walks its section; a unicast of it must be a valid table of its rows alone. */
static void each_section(const uint8_t *w, uint64_t len, int checked, uint32_t n_experts)
{
	uint32_t n_ducks = len >= 16 ? u16_at(w + 6) : 0;
	for (uint32_t i = 0; i < n_ducks && 16 + 8 * (uint64_t)i + 8 <= len; i++) {
		uint16_t duck = (uint16_t)u16_at(w + 16 + 8 * (uint64_t)i);
		struct dp_routing_section s;
		if (dp_routing_wire_section(w, len, duck, &s) != 0) {
			EXPECT(!checked);
			continue;
		}
		EXPECT(s.offset + (uint64_t)s.n_entries * 8 <= len);
		uint64_t cap = 16 + 8 + 8 * (uint64_t)s.n_entries, size;
		if (cap > (1u << 20))
			continue; /* an unchecked count: not worth a big allocation */
		uint8_t *u = malloc(cap);
		uint16_t *map = malloc(sizeof(uint16_t) * (s.n_rows ? s.n_rows : 1));
		EXPECT(u && map);
		int rc = dp_routing_wire_unicast(w, len, duck, u, cap, map, s.n_rows, &size, NULL, 0);
		if (checked) {
			EXPECT(rc == 0 && size == cap);
			char why[200];
			EXPECT(dp_routing_wire_check(u, size, s.n_rows, n_experts, why, sizeof(why)) == 0);
			for (uint32_t r = 1; r < s.n_rows; r++)
				EXPECT(map[r] > map[r - 1]);
		}
		free(map);
		free(u);
	}
}

static void placement_of(struct dp_routing_placement *p, uint32_t n_experts, uint8_t shape,
			 uint8_t stride)
{
	memset(p, 0, sizeof(*p));
	p->n_experts = n_experts;
	uint32_t most = 1 + (shape & 7);
	for (uint32_t e = 0; e < n_experts; e++) {
		p->replicas[e] = (uint8_t)(1 + e % most);
		for (uint32_t r = 0; r < p->replicas[e]; r++) /* 37 r: distinct mod 256 for r < 8 */
			p->ducks[e * DP_MAX_REPLICAS + r] =
				(uint16_t)((e * (2u * stride + 1) + 37 * r) % DP_MAX_DUCKS);
	}
	if (shape & 0x80)
		p->replicas[0] = 0;
}

static void split_ok(const uint8_t *t, uint64_t len, const struct dp_routing_placement *p,
		     const uint64_t *nic, int checked, int placed, uint32_t rows,
		     uint32_t n_experts)
{
	/* room for every entry in a section of its own duck, computed from the header as the
	 * dataplane would from the descriptor; capped, as split refuses more anyway */
	uint64_t entries = 0;
	if (len >= 16)
		entries = (uint64_t)u16_at(t + 6) * u32_at(t + 8);
	if (entries > DP_MAX_TOKENS * DP_MAX_TOPK)
		entries = DP_MAX_TOKENS * DP_MAX_TOPK;
	uint64_t cap = 16 + 8 * ((entries < DP_MAX_DUCKS ? entries : DP_MAX_DUCKS) + entries);
	uint8_t *out = malloc(cap);
	uint64_t size = 1, targets[DP_MAX_DUCKS / 64];
	EXPECT(out);
	char why[200];
	int rc = dp_routing_split(t, len, p, NULL, 0, nic, out, cap, &size, targets, why, sizeof(why));
	EXPECT(rc != 0 || size <= cap);
	if (!checked || !placed) {
		free(out);
		return;
	}
	EXPECT(rc == 0);
	/* every (token, expert) whose duck is in the NIC's set, exactly once */
	uint32_t topk = u16_at(t + 6), want = 0;
	for (uint32_t i = 0; i < rows; i++)
		for (uint32_t k = 0; k < topk; k++) {
			uint32_t e = u32_at(t + 16 + ((uint64_t)i * topk + k) * 8);
			if (e == 0xffffffffu) /* no expert: in no section */
				continue;
			uint32_t d = p->ducks[e * DP_MAX_REPLICAS + i % p->replicas[e]];
			want += !nic || (nic[d >> 6] >> (d & 63) & 1);
		}
	if (want == 0) {
		EXPECT(size == 0 && !targets[0] && !targets[1] && !targets[2] && !targets[3]);
		free(out);
		return;
	}
	EXPECT(wire_ok(out, size, rows, n_experts) == size);
	EXPECT(u32_at(out + 12) == want);
	uint32_t n_ducks = u16_at(out + 6);
	const uint8_t *e0 = out + 16 + 8 * (uint64_t)n_ducks;
	uint64_t at = 0;
	for (uint32_t i = 0; i < n_ducks; i++) {
		uint32_t d = u16_at(out + 16 + 8 * (uint64_t)i), n = u32_at(out + 16 + 8 * i + 4);
		EXPECT(targets[d >> 6] >> (d & 63) & 1);
		for (uint32_t j = 0; j < n; j++, at++) {
			const uint8_t *x = e0 + at * 8;
			uint32_t row = u16_at(x), ex = u16_at(x + 2);
			/* the duck holds the expert, by the token's replica */
			EXPECT(p->ducks[ex * DP_MAX_REPLICAS + row % p->replicas[ex]] == d);
			/* and the weight is the host table's, bit for bit */
			uint32_t k = 0;
			while (k < topk && u32_at(t + 16 + ((uint64_t)row * topk + k) * 8) != ex)
				k++;
			EXPECT(k < topk);
			EXPECT(u32_at(x + 4) == u32_at(t + 16 + ((uint64_t)row * topk + k) * 8 + 4));
		}
	}
	each_section(out, size, 1, n_experts);
	/* the same split as the dataplane sends it: experts as bank slots, flag SHARED; the
	 * same sections, each entry its expert's slot on that duck, below the duck's count */
	static uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS];
	uint16_t per_duck[DP_MAX_DUCKS];
	uint8_t *banked = malloc(cap);
	uint64_t banked_size = 0;
	EXPECT(banked);
	dp_routing_bank_slots(p, slots, per_duck);
	EXPECT(dp_routing_split(t, len, p, slots, DP_ROUTING_WIRE_FLAG_SHARED, nic, banked, cap,
				&banked_size, NULL, why, sizeof(why)) == 0);
	EXPECT(banked_size == size && banked[5] == DP_ROUTING_WIRE_FLAG_SHARED);
	EXPECT(!memcmp(banked + 6, out + 6, 16 + 8 * (uint64_t)n_ducks - 6));
	at = 0;
	for (uint32_t i = 0; i < n_ducks; i++) {
		uint32_t d = u16_at(out + 16 + 8 * (uint64_t)i), n = u32_at(out + 16 + 8 * i + 4);
		for (uint32_t j = 0; j < n; j++, at++) {
			uint32_t row = u16_at(e0 + at * 8), ex = u16_at(e0 + at * 8 + 2);
			uint32_t slot = u16_at(banked + (e0 - out) + at * 8 + 2);
			EXPECT(slot == slots[ex * DP_MAX_REPLICAS + row % p->replicas[ex]]);
			EXPECT(slot < per_duck[d]);
		}
	}
	free(banked);
	free(out);
}

/* dp_routing_pack on the same entries, as a gate's int32 ids and float32 weights, in the
 * order the input gives them: it gives the verdict (the same code) dp_routing_check gives
 * the table of those entries under a valid header with each token's entries sorted by id
 * (stably), and on acceptance writes exactly that table. */
static void pack_ok(const uint8_t *t, uint64_t len, uint32_t n_experts)
{
	if (len < 16)
		return;
	uint32_t topk = u16_at(t + 6), tokens = u32_at(t + 8);
	if (tokens < 1 || tokens > DP_MAX_TOKENS || topk < 1 || topk > DP_MAX_TOPK ||
	    16 + (uint64_t)tokens * topk * 8 > len)
		return;
	uint64_t n = (uint64_t)tokens * topk, size = 16 + 8 * n;
	int32_t *ids = malloc(n * 4);
	uint32_t *w = malloc(n * 4);
	uint8_t *out = malloc(size), *hand = malloc(size);
	EXPECT(ids && w && out && hand);
	for (uint64_t i = 0; i < n; i++) {
		ids[i] = (int32_t)u32_at(t + 16 + 8 * i); /* >= 2^31 as uint32: negative here */
		w[i] = u32_at(t + 20 + 8 * i);
	}
	struct dp_routing_header h = { DP_ROUTING_MAGIC, DP_ROUTING_VERSION, 0, (uint16_t)topk,
				       tokens, n_experts };
	memcpy(hand, &h, sizeof(h));
	memcpy(hand + 16, t + 16, 8 * n);
	for (uint32_t i = 0; i < tokens; i++) /* insertion sort of each token's 8-byte entries */
		for (uint32_t k = 1; k < topk; k++)
			for (uint8_t *e = hand + 16 + ((uint64_t)i * topk + k) * 8;
			     e > hand + 16 + (uint64_t)i * topk * 8 && u32_at(e - 8) > u32_at(e); e -= 8) {
				uint8_t x[8];
				memcpy(x, e, 8);
				memcpy(e, e - 8, 8);
				memcpy(e - 8, x, 8);
			}
	char why[200];
	int rc = dp_routing_pack(ids, 4, w, tokens, topk, n_experts, out, size, why, sizeof(why));
	EXPECT(rc == dp_routing_check(hand, size, tokens, n_experts, why, sizeof(why)));
	for (uint64_t i = 0; i < n; i++) /* the gate's -1: the pack stores weight 0 */
		if (u32_at(hand + 16 + 8 * i) == 0xffffffffu)
			memset(hand + 20 + 8 * i, 0, 4);
	if (rc == 0)
		EXPECT(memcmp(out, hand, size) == 0);
	free(ids);
	free(w);
	free(out);
	free(hand);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 8)
		return 0;
	uint32_t n_experts = 1 + u16_at(data) % DP_MAX_EXPERTS, rows = u16_at(data + 2);
	uint8_t shape = data[4], stride = data[5], v = data[6];
	const uint8_t *t = data + 8; /* libFuzzer's copy ends exactly at size: ASan sees past */
	uint64_t len = size - 8;
	char why[200];

	int host = dp_routing_check(t, len, rows, n_experts, why, sizeof(why));
	EXPECT(host <= 0 && host >= DP_ROUTING_ERROR_NO_SUCH_DUCK);
	if (host == 0)
		host_ok(t, len, rows, n_experts);
	pack_ok(t, len, n_experts);

	static struct dp_routing_placement p; /* 17 KiB: not on the stack */
	placement_of(&p, n_experts, shape, stride);
	int placed = dp_routing_placement_check(&p, why, sizeof(why)) == 0;
	EXPECT(placed == !(shape & 0x80));
	uint64_t nic[DP_MAX_DUCKS / 64] = { 0 };
	uint32_t m = 1 + v % 8;
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		if (d % m == (uint32_t)(v >> 3) % m)
			nic[d >> 6] |= 1ull << (d & 63);
	split_ok(t, len, &p, v ? nic : NULL, host == 0, placed, rows, n_experts);

	int wire = dp_routing_wire_check(t, len, rows, n_experts, why, sizeof(why));
	if (wire == 0)
		wire_ok(t, len, rows, n_experts);
	each_section(t, len, wire == 0, n_experts);
	return 0;
}
