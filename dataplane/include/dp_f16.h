/* dp_f16.h: IEEE half and bfloat16 <-> float conversions (GCC/Clang _Float16 for the
 * half; bit arithmetic for bfloat16, which is float32's top 16 bits). */
#ifndef DP_F16_H
#define DP_F16_H

#include <stdint.h>
#include <string.h>

#include "dp_abi.h" /* enum dp_dtype */

static inline float dp_f16_to_f32(uint16_t bits)
{
	_Float16 h;
	memcpy(&h, &bits, sizeof(h));
	return (float)h;
}

static inline uint16_t dp_f32_to_f16(float f)
{
	_Float16 h = (_Float16)f; /* round to nearest even */
	uint16_t bits;
	memcpy(&bits, &h, sizeof(bits));
	return bits;
}

/* Exact: bfloat16 is a float32 with the low 16 bits of its mantissa zero. */
static inline float dp_bf16_to_f32(uint16_t bits)
{
	uint32_t u = (uint32_t)bits << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Round to nearest, ties to even, as ml_dtypes.bfloat16 (Eigen) and torch round:
 * adding 0x7fff plus the kept lsb carries into the kept bits exactly when the dropped
 * half is above one half, or one half with an odd lsb; a carry out of the mantissa
 * bumps the exponent (the largest finite values round up to inf, as they should).
 * Subnormals round the same way (no flush to zero). A NaN would carry into the sign
 * or lose its payload to zero (becoming inf): it becomes the quiet NaN 0x7fc0 with its
 * sign, as ml_dtypes does (torch drops the sign). dp_reduce.h's AVX2 store does the same
 * eight at a time; tests/test_reduce.c compares the two bit for bit. */
static inline uint16_t dp_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if (f != f)
		return (uint16_t)((u >> 16 & 0x8000) | 0x7fc0);
	u += 0x7fff + (u >> 16 & 1);
	return (uint16_t)(u >> 16);
}

/* The 2-byte dtypes by code (anything but DP_DTYPE_BF16 is the IEEE half). */
static inline float dp_half_to_f32(uint16_t bits, uint8_t dtype)
{
	return dtype == DP_DTYPE_BF16 ? dp_bf16_to_f32(bits) : dp_f16_to_f32(bits);
}

static inline uint16_t dp_f32_to_half(float f, uint8_t dtype)
{
	return dtype == DP_DTYPE_BF16 ? dp_f32_to_bf16(f) : dp_f32_to_f16(f);
}

#endif /* DP_F16_H */
