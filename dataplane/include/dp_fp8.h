/* dp_fp8.h: FP8 weights as DeepSeek-V3 ships them (duckpipe/client/fp8.py).
 *
 * A weight in float8 e4m3fn with a float32 scale per FP8_BLOCK x FP8_BLOCK block:
 * w[i][j] = (float)e4m3[i][j] * scale[i / 128][j / 128], one float32 multiplication,
 * exactly as the official weight_dequant; a dimension that is not a multiple of 128
 * ends in a partial block with its own scale (the grid is ceil(rows/128) x
 * ceil(cols/128)). V3.2's ue8m0 scales are widened to float32 by the host (exact).
 *
 * On the wire and in the LoadWeights plan, shard tensor t of an FP8 layer is its e4m3
 * bytes in the tensor's [rows x cols] order (TENSOR_SHAPES), then its scale grid,
 * float32 row-major: the gate and up tensors [hidden x ffn] have a [hb x cb] grid, the
 * down tensor [ffn x hidden] a [cb x hb] one, hb = ceil(hidden/128). A duck's columns
 * are blocks (a MOE bank: `experts` routed experts of expert_ffn columns each, then its
 * shared-expert columns; a dense shard: one block), each with its own grid columns, so
 * cb = experts * ceil(expert_ffn/128) + ceil(rest/128) and column c of the shard finds
 * its scale at dp_fp8_scale_col. The host cuts dense shards and the shared expert only
 * between 128-column blocks (dp_load_fp8_check), so a duck's blocks are the checkpoint's.
 */
#ifndef DP_FP8_H
#define DP_FP8_H

#include <stdint.h>
#include <string.h>

#include "dp_abi.h"

/* The float32 value of an e4m3fn byte, exactly: 4 exponent bits (bias 7), 3 mantissa
 * bits, subnormals at exponent 0, no infinities, S.1111.111 NaN. */
static inline float dp_f8e4m3_to_f32(uint8_t b)
{
	uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7, u;
	if (e == 15 && m == 7) {
		u = sign | 0x7fc00000u;
	} else if (e) {
		u = sign | (e + 120) << 23 | m << 20; /* 2^(e-7) (1 + m/8): rebias 7 -> 127 */
	} else {
		float f = (float)m * 0x1p-9f; /* m/8 * 2^-6, exact */
		memcpy(&u, &f, sizeof(u));
		u |= sign;
	}
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* A dtype activations, partials and whole weights travel in (F32, F16, BF16); F8E4M3 has a
 * size but is for weights only (LoadWeights.weight_dtype), so a datagram that names it
 * for anything else is refused rather than read as 1-byte floats of another kind. */
static inline int dp_dtype_is_act(uint8_t dtype)
{
	return dtype == DP_DTYPE_F32 || dtype == DP_DTYPE_F16 || dtype == DP_DTYPE_BF16;
}

static inline uint32_t dp_fp8_blocks(uint32_t n)
{
	return (uint32_t)(((uint64_t)n + DP_FP8_BLOCK - 1) / DP_FP8_BLOCK);
}

/* Scale-grid columns of a duck's ffn columns: `experts` blocks of expert_ffn (MOE), then
 * the rest as one block. experts * expert_ffn <= ffn is the caller's (the bank check). */
static inline uint64_t dp_fp8_scale_cols(uint32_t ffn, uint32_t experts, uint32_t expert_ffn)
{
	uint64_t routed = (uint64_t)experts * expert_ffn;
	uint32_t rest = routed <= ffn ? (uint32_t)(ffn - routed) : 0;
	return (uint64_t)experts * dp_fp8_blocks(expert_ffn) + dp_fp8_blocks(rest);
}

/* The grid column of the duck's column c (c < ffn). */
static inline uint32_t dp_fp8_scale_col(uint32_t c, uint32_t experts, uint32_t expert_ffn)
{
	uint64_t routed = (uint64_t)experts * expert_ffn;
	if (c < routed)
		return c / expert_ffn * dp_fp8_blocks(expert_ffn) + c % expert_ffn / DP_FP8_BLOCK;
	return (uint32_t)(experts * dp_fp8_blocks(expert_ffn) + (c - routed) / DP_FP8_BLOCK);
}

/* Bytes of shard tensor t (0..2) of an FP8 SWIGLU or MOE duck: hidden * ffn e4m3 bytes
 * and hb * cb float32 scales; UINT64_MAX when that does not fit. */
static inline uint64_t dp_fp8_tensor_bytes(uint32_t hidden, uint32_t ffn, uint32_t experts,
					   uint32_t expert_ffn)
{
	uint64_t w, s, n;
	if (__builtin_mul_overflow((uint64_t)hidden, (uint64_t)ffn, &w) ||
	    __builtin_mul_overflow((uint64_t)dp_fp8_blocks(hidden) * 4,
				   dp_fp8_scale_cols(ffn, experts, expert_ffn), &s) ||
	    __builtin_add_overflow(w, s, &n))
		return UINT64_MAX;
	return n;
}

#endif /* DP_FP8_H */
