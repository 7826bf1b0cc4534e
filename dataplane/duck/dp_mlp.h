/* dp_mlp.h: one duck's share of an MLP layer, computed in float32.
 *
 * Tensor parallelism over the FFN dimension (duckpipe/client/models.py): a duck holds
 * `ffn` columns of the first matrix (and of the first bias) and the same rows of
 * the second, and computes a full [rows x hidden] partial that the host sums.
 *
 *   GELU   t0 w_up   [hidden x ffn]  t1 b_up [ffn]          t2 w_down [ffn x hidden]
 *          partial = gelu_erf(x . w_up + b_up) . w_down
 *   SWIGLU t0 w_gate [hidden x ffn]  t1 w_up [hidden x ffn]  t2 w_down [ffn x hidden]
 *          partial = (silu(x . w_gate) * (x . w_up)) . w_down
 *
 * All matrices row-major float32. The caller owns every buffer: a forward
 * allocates nothing.
 */
#ifndef DP_MLP_H
#define DP_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "dp_abi.h"

/* Rows of x processed per pass over the weights; the scratch holds this many. */
#define DP_MLP_ROW_BLOCK 16u

struct dp_mlp_shard {
	uint8_t kind; /* enum dp_mlp_kind */
	uint32_t hidden, ffn;
	float *t[DP_SHARD_TENSORS];
};

/* Elements of tensor t (0..DP_SHARD_TENSORS-1) of a shard of this kind and shape; 0 if there is no such tensor. */
uint64_t dp_mlp_tensor_len(uint8_t kind, uint32_t hidden, uint32_t ffn, unsigned t);

/* Floats of scratch dp_mlp_forward needs for a shard of `ffn` columns (any rows). */
size_t dp_mlp_scratch_floats(uint32_t ffn);

/* out[rows x hidden] = the shard's partial for x[rows x hidden]. x and out must not
 * overlap; scratch holds dp_mlp_scratch_floats(s->ffn) floats. 0, or -1 for an
 * unknown kind (out untouched). */
int dp_mlp_forward(const struct dp_mlp_shard *s, const float *x, uint32_t rows, float *out,
		   float *scratch);

/* out[i] = x[i] * k: the emulator's cheap, checkable "echo" compute. */
void dp_mlp_scale(float *out, const float *x, size_t n, float k);

float dp_mlp_gelu(float v); /* 0.5 v (1 + erf(v / sqrt 2)) */
float dp_mlp_silu(float v); /* v / (1 + exp(-v)) */

#endif /* DP_MLP_H */
