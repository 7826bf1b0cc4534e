/* test_dpdk_cksum.c: the one's-complement sums transmit writes and receive checks
 * (dp_dpdk_cksum.h) against a word-by-word reference: exit 0 pass, 1 fail. */
#include <string.h>

#include <rte_config.h>

#include "dp_dpdk_cksum.h"
#include "test_check.h"

/* RFC 1071, a 16-bit word at a time, folded at every step */
static uint16_t reference(const uint8_t *p, size_t n)
{
	uint32_t s = 0;
	for (size_t i = 0; i + 1 < n; i += 2) {
		uint16_t w;
		memcpy(&w, p + i, 2);
		s += w;
		s = (s & 0xffffu) + (s >> 16);
	}
	if (n & 1) {
		uint16_t w = 0;
		memcpy(&w, p + n - 1, 1);
		s += w;
		s = (s & 0xffffu) + (s >> 16);
	}
	return (uint16_t)s;
}

static void fill(uint8_t *p, size_t n, int pattern)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern == 0 ? 0xff : pattern == 1 ? 0 : (uint8_t)(frand() * 128 + 128);
}

/* the wire header's sum: the carries out of each 64-bit add (all 0xff bytes make one at
 * every word) come back in, and the copy is exact */
static void the_wire_headers_sum_and_copy(void)
{
	uint8_t src[80 + 8], dst[80 + 8];
	for (int round = 0; round < 200; round++) {
		int pattern = round < 2 ? round : 2;
		fill(src, sizeof(src), pattern);
		memset(dst, 0xa5, sizeof(dst));
		uint64_t s = dp_cksum_copy80(dst, src + round % 8);
		CHECK(s < (1ull << 33), "round %d: %llu", round, (unsigned long long)s);
		uint16_t want = reference(src + round % 8, 80);
		CHECK(dp_cksum_fold(s) == want || (dp_cksum_fold(s) == 0xffff && want == 0) ||
			      (dp_cksum_fold(s) == 0 && want == 0xffff),
		      "round %d: %#x, want %#x", round, dp_cksum_fold(s), want);
		CHECK(!memcmp(dst, src + round % 8, 80), "round %d: the copy differs", round);
		CHECK(dst[80] == 0xa5, "round %d: written past 80 bytes", round);
	}
}

/* the short folds give what the long one does over their ranges */
static void the_short_folds_match_the_long_one(void)
{
	const uint32_t s32[] = { 0, 1, 0xffff, 0x10000, 0x1fffe, 0xfffeffffu, 0xffffffffu };
	for (size_t i = 0; i < sizeof(s32) / sizeof(s32[0]); i++)
		CHECK(dp_cksum_fold32(s32[i]) == dp_cksum_fold(s32[i]), "%#x: %#x, want %#x", s32[i],
		      dp_cksum_fold32(s32[i]), dp_cksum_fold(s32[i]));
	const uint64_t s48[] = { 0, 0xffff, 0x1ffffffffull, 0x3ffffffffull, 0xfffeffffffffull,
				 0xffffffffffffull };
	for (size_t i = 0; i < sizeof(s48) / sizeof(s48[0]); i++)
		CHECK(dp_cksum_fold48(s48[i]) == dp_cksum_fold(s48[i]), "%#llx: %#x, want %#x",
		      (unsigned long long)s48[i], dp_cksum_fold48(s48[i]), dp_cksum_fold(s48[i]));
	for (int round = 0; round < 100000; round++) {
		uint64_t x = (uint64_t)((frand() + 1) * 0x1p47);
		CHECK(dp_cksum_fold48(x) == dp_cksum_fold(x), "%#llx", (unsigned long long)x);
		CHECK(dp_cksum_fold32((uint32_t)x) == dp_cksum_fold((uint32_t)x), "%#x", (uint32_t)x);
	}
}

int main(void)
{
	the_wire_headers_sum_and_copy();
	the_short_folds_match_the_long_one();
	if (failures)
		printf("%d check(s) failed\n", failures);
	return failures ? 1 : 0;
}
