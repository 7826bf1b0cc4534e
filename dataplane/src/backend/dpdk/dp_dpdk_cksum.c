/* dp_dpdk_cksum.c: the long sum of dp_dpdk_cksum.h, picked for the CPU at load. */
#include "dp_dpdk_cksum.h"

/* For AVX2, tuned so that GCC does not split unaligned 256-bit loads and stores as
 * DPDK's -march=corei7 would. */
#if defined(__x86_64__)
#if defined(__clang__)
#define LONG_TARGET "avx2"
#else
#define LONG_TARGET "avx2,tune=haswell"
#endif
__attribute__((target(LONG_TARGET))) static uint64_t sum_long_avx2(uint8_t *dst,
								   const uint8_t *src, size_t n)
{
	return dst ? dp_cksum_sum_v(dst, src, n, true, true)
		   : dp_cksum_sum_v(NULL, src, n, false, true);
}
#endif

static uint64_t sum_long_base(uint8_t *dst, const uint8_t *src, size_t n)
{
	return dst ? dp_cksum_sum_v(dst, src, n, true, false)
		   : dp_cksum_sum_v(NULL, src, n, false, false);
}

uint64_t (*dp_cksum_sum_long)(uint8_t *, const uint8_t *, size_t) = sum_long_base;

__attribute__((constructor)) static void sum_long_pick(void)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		dp_cksum_sum_long = sum_long_avx2;
#endif
}
