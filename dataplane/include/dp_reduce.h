/* dp_reduce.h: summing ducks' partials into a float32 accumulator, and writing it out.
 *
 * Partials arrive chunk by chunk, in any order and any alignment; each chunk is
 * added where its byte offset puts it. Float16 partials are accumulated in float32.
 */
#ifndef DP_REDUCE_H
#define DP_REDUCE_H

#include <stdint.h>
#include <string.h>

#include "dp_abi.h" /* dp_dtype_size: the schema's DTYPE_SIZES */
#include "dp_f16.h"

typedef float dp_v4f __attribute__((vector_size(16)));

/* acc[first .. first + n) += n values of `dtype` read from src, at any alignment: a
 * DPDK port's payload sits 2 bytes past an 8-byte boundary. float32 eight at a time in
 * unaligned 16-byte loads (memcpy into a vector: movups), each sum the same as the
 * scalar loop's, which GCC -O2 does not vectorise itself (src may alias acc). */
static inline void dp_accumulate(float *acc, uint64_t first, const void *src, uint32_t n,
				 uint8_t dtype)
{
	float *a = acc + first;
	const uint8_t *p = src;
	if (dtype == DP_DTYPE_F32) {
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
		for (; i < n; i++) {
			float v;
			memcpy(&v, p + 4 * (size_t)i, 4);
			a[i] += v;
		}
	} else {
		for (uint32_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, p + 2 * (size_t)i, 2);
			a[i] += dp_f16_to_f32(v);
		}
	}
}

/* acc += other (combining two NICs' sums). */
static inline void dp_accumulate_f32(float *restrict acc, const float *restrict other, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		acc[i] += other[i];
}

/* Write rows x hidden values of acc (+ bias per column, if any) to out as `dtype`.
 * out may alias acc when dtype is float32. */
static inline void dp_reduce_store(void *out, const float *acc, const float *bias, uint32_t rows,
				   uint32_t hidden, uint8_t dtype)
{
	if (dtype == DP_DTYPE_F32) {
		float *o = out;
		for (uint32_t r = 0; r < rows; r++)
			for (uint32_t c = 0; c < hidden; c++) {
				size_t i = (size_t)r * hidden + c;
				o[i] = acc[i] + (bias ? bias[c] : 0.0f);
			}
	} else {
		uint16_t *o = out;
		for (uint32_t r = 0; r < rows; r++)
			for (uint32_t c = 0; c < hidden; c++) {
				size_t i = (size_t)r * hidden + c;
				o[i] = dp_f32_to_f16(acc[i] + (bias ? bias[c] : 0.0f));
			}
	}
}

#endif /* DP_REDUCE_H */
