/* dp_dpdk_cksum.h: one's-complement sums for the UDP checksums that transmit computes
 * (dp_dpdk_tx.c, folded into the payload copy) and receive verifies (dp_dpdk_rx.c),
 * on ports that do not offload them: one vector sum for both.
 *
 * A raw sum is a one's-complement sum of native 16-bit words, any width, any grouping
 * (2^16 = 1 mod 0xffff): fold it to 16 bits. Summed in native order, a checksum is
 * right in network order too (the byte swap commutes with the sum).
 */
#ifndef DP_DPDK_CKSUM_H
#define DP_DPDK_CKSUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <rte_common.h>

static __rte_always_inline uint16_t dp_cksum_fold(uint64_t s)
{
	s = (s & 0xffffffffu) + (s >> 32);
	s = (s & 0xffffu) + (s >> 16);
	s = (s & 0xffffu) + (s >> 16);
	s = (s & 0xffffu) + (s >> 16);
	return (uint16_t)s;
}

/* The tail of a sum: fewer than 16 bytes, native 16-bit words, an odd last byte as
 * the first byte of a zero-padded word (as rte_raw_cksum). */
static __rte_always_inline uint64_t dp_cksum_tail(uint8_t *dst, const uint8_t *src, size_t n)
{
	uint64_t s = 0;
	if (dst)
		memcpy(dst, src, n);
	for (; n >= 2; n -= 2, src += 2) {
		uint16_t w;
		memcpy(&w, src, 2);
		s += w;
	}
	if (n) {
		uint16_t w = 0;
		memcpy(&w, src, 1);
		s += w;
	}
	return s;
}

/* The raw sum of n bytes at src (n < 64 KiB), copied to dst on the way when copy is
 * set: the bytes are read once for both. Vector lanes of 32 bits hold each 16-bit
 * word's share. Written with GCC vector types: SSE2 inline for short pieces (wire
 * headers), and for long ones (payloads) dp_cksum_sum_long, compiled for AVX2 where
 * the CPU has it (dp_dpdk_cksum.c). */
typedef uint32_t dp_v8u __attribute__((vector_size(32)));
typedef uint32_t dp_v4u __attribute__((vector_size(16)));

/* v's lanes in the order a, b, c, d (one pshufd). __builtin_shufflevector is clang's and
 * GCC's from 12 on; GCC before 12 has only __builtin_shuffle, which clang lacks (the
 * fuzz build, -Dfuzz=true, compiles this file with clang-16). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define DP_V4_SHUFFLE(v, a, b, c, d) __builtin_shufflevector(v, v, a, b, c, d)
#endif
#endif
#ifndef DP_V4_SHUFFLE
#define DP_V4_SHUFFLE(v, a, b, c, d) __builtin_shuffle(v, (dp_v4u){ a, b, c, d })
#endif

/* 16 bytes: each 16-bit word into its 32-bit lane */
static __rte_always_inline dp_v4u dp_cksum_16(uint8_t *dst, const uint8_t *src, bool copy)
{
	dp_v4u x;
	memcpy(&x, src, 16);
	if (copy)
		memcpy(dst, &x, 16);
	return (x & 0xffff) + (x >> 16);
}

/* Below 64 KiB the lanes cannot overflow: 32768 words of 0xffff are less than 2^31. */
static __rte_always_inline uint64_t dp_cksum_sum_v(uint8_t *dst, const uint8_t *src, size_t n,
						   bool copy, bool wide)
{
	dp_v4u h = { 0 }, g = { 0 };
	if (wide) { /* 32 bytes at a time: AVX2 registers where compiled for them */
		dp_v8u a = { 0 };
		for (; n >= 64; n -= 64, src += 64) {
			dp_v8u x, y;
			memcpy(&x, src, 32);
			memcpy(&y, src + 32, 32);
			if (copy) {
				memcpy(dst, &x, 32);
				memcpy(dst + 32, &y, 32);
				dst += 64;
			}
			a += (x & 0xffff) + (x >> 16) + (y & 0xffff) + (y >> 16);
		}
		h = (dp_v4u){ a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7] };
	}
	for (; n >= 32; n -= 32, src += 32, dst = copy ? dst + 32 : dst) {
		h += dp_cksum_16(dst, src, copy);
		g += dp_cksum_16(dst + 16, src + 16, copy);
	}
	if (n >= 16) {
		h += dp_cksum_16(dst, src, copy);
		n -= 16;
		src += 16;
		dst = copy ? dst + 16 : dst;
	}
	h += g;
	h += DP_V4_SHUFFLE(h, 2, 3, 0, 1);
	h += DP_V4_SHUFFLE(h, 1, 0, 3, 2);
	uint64_t s = h[0];
	if (n)
		s += dp_cksum_tail(copy ? dst : NULL, src, n);
	return s;
}

/* The raw sum of 80 bytes (a wire header), copied to dst. On x86-64 a chain of 64-bit
 * adds with carry (eleven instructions; GCC makes neither that nor anything as short
 * from C) beside the copy's vector moves; elsewhere dp_cksum_sum_v. Below 2^33. */
static __rte_always_inline uint64_t dp_cksum_copy80(uint8_t *dst, const uint8_t *src)
{
#if defined(__x86_64__)
	uint64_t s;
	memcpy(&s, src, 8);
	__asm__("addq 8(%[src]), %[s]\n\t"
		"adcq 16(%[src]), %[s]\n\t"
		"adcq 24(%[src]), %[s]\n\t"
		"adcq 32(%[src]), %[s]\n\t"
		"adcq 40(%[src]), %[s]\n\t"
		"adcq 48(%[src]), %[s]\n\t"
		"adcq 56(%[src]), %[s]\n\t"
		"adcq 64(%[src]), %[s]\n\t"
		"adcq 72(%[src]), %[s]\n\t"
		"adcq $0, %[s]" /* 2^64 = 1 (mod 0xffff): the end-around carry */
		: [s] "+r"(s)
		: [src] "r"(src), "m"(*(const uint8_t(*)[80])src)
		: "cc");
	memcpy(dst, src, 80);
	return (s & 0xffffffffu) + (s >> 32);
#else
	return dp_cksum_sum_v(dst, src, 80, true, false);
#endif
}

/* dp_cksum_fold for a sum below 2^32 (an IPv4 header's): two steps */
static __rte_always_inline uint16_t dp_cksum_fold32(uint32_t s)
{
	s = (s & 0xffffu) + (s >> 16);
	s = (s & 0xffffu) + (s >> 16);
	return (uint16_t)s;
}

/* dp_cksum_fold for a sum below 2^48 (a datagram's, below 64 KiB): three steps */
static __rte_always_inline uint16_t dp_cksum_fold48(uint64_t s)
{
	s = (s & 0xffffu) + (s >> 16);
	s = (s & 0xffffu) + (s >> 16);
	s = (s & 0xffffu) + (s >> 16);
	return (uint16_t)s;
}

#define DP_CKSUM_LONG 256u /* bytes from which a piece is summed out of line */

/* dp_cksum_sum_v out of line (AVX2 where the CPU has it), copying when dst is not NULL */
extern uint64_t (*dp_cksum_sum_long)(uint8_t *dst, const uint8_t *src, size_t n);

/* The raw sum of n bytes at src (n < 64 KiB), copied to dst when copy is set. */
static __rte_always_inline uint64_t dp_cksum_sum_copy(uint8_t *dst, const uint8_t *src, size_t n,
						      bool copy)
{
	if (n >= DP_CKSUM_LONG)
		return dp_cksum_sum_long(copy ? dst : NULL, src, n);
	return dp_cksum_sum_v(dst, src, n, copy, false);
}

#endif /* DP_DPDK_CKSUM_H */
