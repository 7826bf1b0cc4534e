/* dp_reasm.h: which chunks of a message have arrived (one bitmap per duck per message).
 *
 * Duplicates (a NACK answered twice, a retransmit crossing the original) are
 * detected here so that no partial is ever added twice.
 */
#ifndef DP_REASM_H
#define DP_REASM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* 65,536 chunks: a max_forward_bytes of 64 MiB (a 4,096-token prefill of 7168 bf16 with its
 * table) at MTU 1500; a bitmap is then 8 KiB, of which a reset touches only a message's
 * own words */
#define DP_REASM_MAX_CHUNKS 65536u
#define DP_REASM_WORDS (DP_REASM_MAX_CHUNKS / 64)

struct dp_reasm {
	uint64_t bits[DP_REASM_WORDS];
	uint32_t chunks; /* expected; 0 until the first chunk says */
	uint32_t have;
};

static inline void dp_reasm_reset(struct dp_reasm *r, uint32_t chunks)
{
	/* chunks <= DP_REASM_MAX_CHUNKS: the caller refuses bigger messages */
	memset(r->bits, 0, sizeof(uint64_t) * ((chunks + 63) / 64));
	r->chunks = chunks;
	r->have = 0;
}

/* 1: new chunk, recorded. 0: duplicate. -1: out of range. */
static inline int dp_reasm_mark(struct dp_reasm *r, uint32_t chunk)
{
	if (chunk >= r->chunks)
		return -1;
	uint64_t bit = 1ull << (chunk & 63);
	uint64_t *w = &r->bits[chunk >> 6];
	if (*w & bit)
		return 0;
	*w |= bit;
	r->have++;
	return 1;
}

/* Whether chunk was recorded (out of range: no). */
static inline bool dp_reasm_has(const struct dp_reasm *r, uint32_t chunk)
{
	return chunk < r->chunks && (r->bits[chunk >> 6] >> (chunk & 63) & 1);
}

static inline int dp_reasm_complete(const struct dp_reasm *r)
{
	return r->chunks != 0 && r->have == r->chunks;
}

/* Up to max missing chunk indices into out; returns how many. */
static inline uint32_t dp_reasm_missing(const struct dp_reasm *r, uint32_t *out, uint32_t max)
{
	uint32_t n = 0;
	for (uint32_t c = 0; c < r->chunks && n < max; c++)
		if (!(r->bits[c >> 6] & (1ull << (c & 63))))
			out[n++] = c;
	return n;
}

#endif /* DP_REASM_H */
