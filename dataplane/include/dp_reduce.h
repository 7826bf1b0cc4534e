/* dp_reduce.h: summing ducks' partials into a float32 accumulator, and writing it out.
 *
 * Partials arrive chunk by chunk, in any order and any alignment; each chunk is
 * added where its byte offset puts it. Float16 and bfloat16 partials are widened
 * (exactly) and accumulated in float32; the sum is rounded to the result's dtype once,
 * at the store, to nearest even.
 *
 * Three versions of each loop, every one giving the scalar loop's bits (an add is an
 * add, F16C's conversions are IEEE's, round to nearest even, as _Float16's; bfloat16's
 * are dp_f16.h's bit arithmetic, done eight lanes at a time):
 *   _scalar  the reference, one value at a time;
 *   _v4      portable 16-byte vectors (GCC/Clang vector extensions): float32 only;
 *   _avx2    AVX2 + F16C (x86-64), 32-byte unaligned loads and VCVTPH2PS/VCVTPS2PH
 *            (float16), VPMOVZXWD and shifts (bfloat16), compiled for that target by
 *            attribute, not for the whole file.
 * dp_accumulate, dp_accumulate_f32 and dp_reduce_store pick the fastest the CPU has
 * (dp_reduce_isa, asked once per file that includes this: CPUID, as dp_dpdk_cksum.c and
 * dp_mlp.c do). Header-only: the fuzz harnesses and the emulator include it alone.
 * tests/test_reduce.c compares every version with the scalar one, bit for bit.
 */
#ifndef DP_REDUCE_H
#define DP_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dp_abi.h" /* dp_dtype_size: the schema's DTYPE_SIZES */
#include "dp_f16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define DP_REDUCE_X86 1
#endif

typedef float dp_v4f __attribute__((vector_size(16)));

/* ------------------------------------------------------------------ the reference */

static inline void dp_accumulate_scalar(float *acc, uint64_t first, const void *src, uint32_t n,
					uint8_t dtype)
{
	float *a = acc + first;
	const uint8_t *p = src;
	if (dtype == DP_DTYPE_F32) {
		for (uint32_t i = 0; i < n; i++) {
			float v;
			memcpy(&v, p + 4 * (size_t)i, 4);
			a[i] += v;
		}
	} else {
		for (uint32_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, p + 2 * (size_t)i, 2);
			a[i] += dp_half_to_f32(v, dtype);
		}
	}
}

/* acc[first .. first + n) = n values of `dtype` from src: a chunk's first contribution,
 * stored rather than added to zeros (no memset of the sum, no read of it). */
static inline void dp_reduce_first_scalar(float *acc, uint64_t first, const void *src,
					  uint32_t n, uint8_t dtype)
{
	float *a = acc + first;
	const uint8_t *p = src;
	if (dtype == DP_DTYPE_F32) {
		memcpy(a, p, 4 * (size_t)n);
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint16_t v;
		memcpy(&v, p + 2 * (size_t)i, 2);
		a[i] = dp_half_to_f32(v, dtype);
	}
}

static inline void dp_accumulate_f32_scalar(float *restrict acc, const float *restrict other,
					    uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		acc[i] += other[i];
}

static inline void dp_reduce_store_scalar(void *out, const float *acc, const float *bias,
					  uint32_t rows, uint32_t hidden, uint8_t dtype)
{
	/* stores by memcpy: out may sit at any alignment (the tests store at every offset) */
	uint8_t *o = out;
	if (dtype == DP_DTYPE_F32) {
		for (uint32_t r = 0; r < rows; r++)
			for (uint32_t c = 0; c < hidden; c++) {
				size_t i = (size_t)r * hidden + c;
				float v = acc[i] + (bias ? bias[c] : 0.0f);
				memcpy(o + i * sizeof(v), &v, sizeof(v));
			}
	} else {
		for (uint32_t r = 0; r < rows; r++)
			for (uint32_t c = 0; c < hidden; c++) {
				size_t i = (size_t)r * hidden + c;
				uint16_t h = dp_f32_to_half(acc[i] + (bias ? bias[c] : 0.0f), dtype);
				memcpy(o + i * sizeof(h), &h, sizeof(h));
			}
	}
}

/* ------------------------------------------------- portable 16-byte vectors (float32) */

/* acc[first ..] += n float32 read from src at any alignment (a DPDK port's payload sits
 * 2 bytes past an 8-byte boundary): eight at a time in unaligned 16-byte loads (memcpy
 * into a vector: movups), which GCC -O2 does not do itself (src may alias acc). */
static inline void dp_accumulate_v4(float *acc, uint64_t first, const void *src, uint32_t n,
				    uint8_t dtype)
{
	if (dtype != DP_DTYPE_F32) {
		dp_accumulate_scalar(acc, first, src, n, dtype);
		return;
	}
	float *a = acc + first;
	const uint8_t *p = src;
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		dp_v4f x0, x1, a0, a1;
		memcpy(&x0, p + 4 * (size_t)i, 16);
		memcpy(&x1, p + 4 * (size_t)i + 16, 16);
		memcpy(&a0, a + i, 16);
		memcpy(&a1, a + i + 4, 16);
		a0 += x0;
		a1 += x1;
		memcpy(a + i, &a0, 16);
		memcpy(a + i + 4, &a1, 16);
	}
	dp_accumulate_scalar(a + i, 0, p + 4 * (size_t)i, n - i, dtype);
}

/* ------------------------------------------------------------------- AVX2 and F16C */

#ifdef DP_REDUCE_X86
/* GCC's default tuning splits unaligned 256-bit loads in two (as dp_dpdk_cksum.c says) */
#if defined(__clang__)
#define DP_REDUCE_AVX2_TARGET __attribute__((target("avx2,f16c")))
#else
#define DP_REDUCE_AVX2_TARGET __attribute__((target("avx2,f16c,tune=haswell")))
#endif

/* Eight 2-byte values at p in float32, exactly: float16 by VCVTPH2PS, bfloat16 by
 * zero-extending each to 32 bits and shifting it into the top half. */
DP_REDUCE_AVX2_TARGET static inline __m256 dp_widen8_avx2(const uint8_t *p, uint8_t dtype)
{
	__m128i h = _mm_loadu_si128((const void *)p);
	if (dtype == DP_DTYPE_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

/* Eight float32 as 2-byte values, rounded to nearest even: float16 by VCVTPS2PH;
 * bfloat16 as dp_f32_to_bf16 does it (add 0x7fff + lsb, keep the top half; a NaN
 * becomes 0x7fc0 with its sign), then VPACKUSDW (every lane is <= 0xffff: no
 * saturation) of the two 128-bit halves. */
DP_REDUCE_AVX2_TARGET static inline __m128i dp_narrow8_avx2(__m256 v, uint8_t dtype)
{
	if (dtype != DP_DTYPE_BF16)
		return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
	const __m256i u = _mm256_castps_si256(v), one = _mm256_set1_epi32(1);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
	__m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
	r = _mm256_srli_epi32(r, 16);
	__m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16),
							_mm256_set1_epi32(0x8000)),
				       _mm256_set1_epi32(0x7fc0));
	__m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
	r = _mm256_blendv_epi8(r, qnan, nan);
	return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 16 values per step, two independent adds in flight; 2-byte dtypes: 16 values (32
 * bytes) widened by dp_widen8_avx2, exact. */
DP_REDUCE_AVX2_TARGET static inline void dp_accumulate_avx2(float *acc, uint64_t first,
							    const void *src, uint32_t n,
							    uint8_t dtype)
{
	float *a = acc + first;
	const uint8_t *p = src;
	uint32_t i = 0;
	if (dtype == DP_DTYPE_F32) {
		for (; i + 16 <= n; i += 16) {
			__m256 x0 = _mm256_loadu_ps((const float *)(p + 4 * (size_t)i));
			__m256 x1 = _mm256_loadu_ps((const float *)(p + 4 * (size_t)i + 32));
			_mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), x0));
			_mm256_storeu_ps(a + i + 8, _mm256_add_ps(_mm256_loadu_ps(a + i + 8), x1));
		}
		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(a + i,
					 _mm256_add_ps(_mm256_loadu_ps(a + i),
						       _mm256_loadu_ps((const float *)(p + 4 * (size_t)i))));
	} else {
		for (; i + 16 <= n; i += 16) {
			__m256 x0 = dp_widen8_avx2(p + 2 * (size_t)i, dtype);
			__m256 x1 = dp_widen8_avx2(p + 2 * (size_t)i + 16, dtype);
			_mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), x0));
			_mm256_storeu_ps(a + i + 8, _mm256_add_ps(_mm256_loadu_ps(a + i + 8), x1));
		}
		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i),
							      dp_widen8_avx2(p + 2 * (size_t)i, dtype)));
	}
	dp_accumulate_scalar(a + i, 0, p + (size_t)i * (dtype == DP_DTYPE_F32 ? 4 : 2), n - i, dtype);
}

/* 2-byte dtypes widened 16 at a time by dp_widen8_avx2 (exact); float32 moved 16 at a time in
 * unaligned loads and stores, as the accumulate reads it (glibc's memcpy took the ERMS
 * `rep movsb` here, slower from a payload 80 bytes into its datagram on this AMD VM) */
DP_REDUCE_AVX2_TARGET static inline void dp_reduce_first_avx2(float *acc, uint64_t first,
							      const void *src, uint32_t n,
							      uint8_t dtype)
{
	float *a = acc + first;
	const uint8_t *p = src;
	uint32_t i = 0;
	if (dtype == DP_DTYPE_F32)
		for (; i + 16 <= n; i += 16) {
			__m256 x0 = _mm256_loadu_ps((const float *)(p + 4 * (size_t)i));
			__m256 x1 = _mm256_loadu_ps((const float *)(p + 4 * (size_t)i + 32));
			_mm256_storeu_ps(a + i, x0);
			_mm256_storeu_ps(a + i + 8, x1);
		}
	else
		for (; i + 16 <= n; i += 16) {
			_mm256_storeu_ps(a + i, dp_widen8_avx2(p + 2 * (size_t)i, dtype));
			_mm256_storeu_ps(a + i + 8, dp_widen8_avx2(p + 2 * (size_t)i + 16, dtype));
		}
	dp_reduce_first_scalar(a + i, 0, p + (size_t)i * (dtype == DP_DTYPE_F32 ? 4 : 2), n - i,
			       dtype);
}

DP_REDUCE_AVX2_TARGET static inline void dp_accumulate_f32_avx2(float *restrict acc,
								const float *restrict other,
								uint64_t n)
{
	uint64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(acc + i,
				 _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(other + i)));
	dp_accumulate_f32_scalar(acc + i, other + i, n - i);
}

/* One row: o[c] = acc[c] + bias[c] (bias may be NULL), in `dtype`. out may
 * alias acc for float32: each vector is loaded before it is stored. */
DP_REDUCE_AVX2_TARGET static inline void dp_reduce_store_avx2(void *out, const float *acc,
							      const float *bias, uint32_t rows,
							      uint32_t hidden, uint8_t dtype)
{
	for (uint32_t r = 0; r < rows; r++) {
		const float *ar = acc + (size_t)r * hidden;
		uint32_t c = 0;
		if (dtype == DP_DTYPE_F32) {
			float *o = (float *)out + (size_t)r * hidden;
			for (; c + 8 <= hidden; c += 8) {
				__m256 v = _mm256_loadu_ps(ar + c);
				v = _mm256_add_ps(v, bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps());
				_mm256_storeu_ps(o + c, v);
			}
			for (; c < hidden; c++) { /* memcpy: out at any alignment */
				float v = ar[c] + (bias ? bias[c] : 0.0f);
				memcpy(o + c, &v, sizeof(v));
			}
		} else {
			uint16_t *o = (uint16_t *)out + (size_t)r * hidden;
			for (; c + 8 <= hidden; c += 8) {
				__m256 v = _mm256_loadu_ps(ar + c);
				v = _mm256_add_ps(v, bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps());
				_mm_storeu_si128((void *)(o + c), dp_narrow8_avx2(v, dtype));
			}
			for (; c < hidden; c++) {
				uint16_t h = dp_f32_to_half(ar[c] + (bias ? bias[c] : 0.0f), dtype);
				memcpy(o + c, &h, sizeof(h));
			}
		}
	}
}
#endif /* DP_REDUCE_X86 */

/* ----------------------------------------------------------------- which to run */

enum dp_reduce_isa_kind { DP_REDUCE_ISA_V4 = 1, DP_REDUCE_ISA_AVX2 = 2 };

/* AVX2 and F16C, and the OS saves the YMM registers (OSXSAVE, XCR0 bits 1-2): CPUID
 * directly, as clang 16's __builtin_cpu_supports knows no "f16c". */
static inline enum dp_reduce_isa_kind dp_reduce_isa_probe(void)
{
#ifdef DP_REDUCE_X86
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return DP_REDUCE_ISA_V4;
	bool osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
	if (!osxsave || !avx || !f16c)
		return DP_REDUCE_ISA_V4;
	uint32_t xcr0_lo, xcr0_hi;
	__asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
	if ((xcr0_lo & 6) != 6)
		return DP_REDUCE_ISA_V4;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b >> 5 & 1))
		return DP_REDUCE_ISA_V4;
	return DP_REDUCE_ISA_AVX2;
#else
	return DP_REDUCE_ISA_V4;
#endif
}

/* The probe's answer, kept per file (relaxed atomics: threads may race to fill it, with
 * the same value). */
static inline enum dp_reduce_isa_kind dp_reduce_isa(void)
{
	static int known;
	int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
	if (!k) {
		k = dp_reduce_isa_probe();
		__atomic_store_n(&known, k, __ATOMIC_RELAXED);
	}
	return (enum dp_reduce_isa_kind)k;
}

/* acc[first .. first + n) += n values of `dtype` read from src, at any alignment. */
static inline void dp_accumulate(float *acc, uint64_t first, const void *src, uint32_t n,
				 uint8_t dtype)
{
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa() == DP_REDUCE_ISA_AVX2) {
		dp_accumulate_avx2(acc, first, src, n, dtype);
		return;
	}
#endif
	dp_accumulate_v4(acc, first, src, n, dtype);
}

/* acc[first .. first + n) = n values of `dtype` read from src (a chunk's first
 * contribution to the sum: dp_gather.c stores it instead of zeroing the sum first). */
static inline void dp_reduce_first(float *acc, uint64_t first, const void *src, uint32_t n,
				   uint8_t dtype)
{
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa() == DP_REDUCE_ISA_AVX2) {
		dp_reduce_first_avx2(acc, first, src, n, dtype);
		return;
	}
#endif
	dp_reduce_first_scalar(acc, first, src, n, dtype);
}

/* acc += other (combining two NICs' sums). */
static inline void dp_accumulate_f32(float *restrict acc, const float *restrict other, uint64_t n)
{
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa() == DP_REDUCE_ISA_AVX2) {
		dp_accumulate_f32_avx2(acc, other, n);
		return;
	}
#endif
	dp_accumulate_f32_scalar(acc, other, n);
}

/* Write rows x hidden values of acc (+ bias per column, if any) to out as `dtype`.
 * out may alias acc when dtype is float32; then, without a bias, there is nothing to do
 * (the float32 sum was made in place in the result slot). */
static inline void dp_reduce_store(void *out, const float *acc, const float *bias, uint32_t rows,
				   uint32_t hidden, uint8_t dtype)
{
	if (dtype == DP_DTYPE_F32 && out == acc && !bias)
		return;
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa() == DP_REDUCE_ISA_AVX2) {
		dp_reduce_store_avx2(out, acc, bias, rows, hidden, dtype);
		return;
	}
#endif
	dp_reduce_store_scalar(out, acc, bias, rows, hidden, dtype);
}

#endif /* DP_REDUCE_H */
