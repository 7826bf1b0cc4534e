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
 *   MOE    SWIGLU's tensors; the ffn columns are the duck's bank: its routed experts'
 *          columns, expert_ffn each (slots 0..experts-1), then its shared-expert
 *          columns (block `experts`). A routed forward runs dp_mlp_expert_rows once per
 *          expert on the rows routed to it.
 *
 * All matrices row-major float32. The caller owns every buffer: a forward
 * allocates nothing.
 *
 * A MOE bank is held block by block: t0 and t1 are each block's [hidden x width]
 * matrix, one after the other, rather than one [hidden x ffn] matrix whose blocks are
 * column ranges. An expert's 128 columns of a 1024-column bank would put each of its
 * rows 4 KiB apart, one TLB entry per row read: 32 tokens through 8 experts of hidden
 * 7168 took 100-150 ms that way and 55 ms packed (a C bench, 2 shared cores). t2's rows
 * of one block are contiguous either way. dp_mlp_bank_store puts the wire's
 * [hidden x ffn] order there.
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
	uint32_t experts, expert_ffn; /* MOE: the bank's routed experts, columns of each */
	float *t[DP_SHARD_TENSORS];
};

/* One SwiGLU block: w_gate, w_up [hidden x cols] (rows ldb floats apart), w_down
 * [cols x hidden]. */
struct dp_mlp_expert {
	const float *w_gate, *w_up, *w_down;
	uint32_t hidden, cols;
	size_t ldb;
};

/* Which instance of the kernels runs (dp_mlp.c): PORTABLE, the code compiled for the
 * build's baseline (SSE2 vectors on x86-64), or AVX2 (x86-64 with AVX2, FMA and F16C).
 * AUTO: the best the CPU has, what every kernel uses until told otherwise. */
enum dp_mlp_isa { DP_MLP_ISA_AUTO = 0, DP_MLP_ISA_PORTABLE = 1, DP_MLP_ISA_AVX2 = 2 };

/* Use `isa` (enum dp_mlp_isa) from now on, for every thread: 0, or -1 when the CPU (or the
 * build's target) lacks it, nothing changed. Call it before threads compute. */
int dp_mlp_set_isa(int isa);
/* The instance in use (never AUTO). */
int dp_mlp_isa(void);
/* "auto", "portable", "avx2"; and back (-1 for another name). */
const char *dp_mlp_isa_name(int isa);
int dp_mlp_isa_parse(const char *name);

/* dst[0..n) = the float16 values at src (n of them, any alignment), exactly as
 * dp_f16_to_f32 gives them; with F16C eight at a time (a float16 load's weights went
 * through libgcc's __extendhfsf2 one by one: a third of the emulator's CPU). */
void dp_mlp_f16_to_f32(float *dst, const void *src, size_t n);

/* dst[0..n) = the n values of `dtype` (enum dp_dtype) at src in float32, exactly:
 * float32 copied, float16 by dp_mlp_f16_to_f32, bfloat16 shifted into the top half
 * (dp_bf16_to_f32). The ducks compute in float32 whatever the layer's dtype. */
void dp_mlp_to_f32(float *dst, const void *src, size_t n, uint8_t dtype);

/* Elements of tensor t (0..DP_SHARD_TENSORS-1) of a shard of this kind and shape; 0 if there is no such tensor. */
uint64_t dp_mlp_tensor_len(uint8_t kind, uint32_t hidden, uint32_t ffn, unsigned t);

/* Floats of scratch dp_mlp_forward needs for a shard of `ffn` columns (any rows). */
size_t dp_mlp_scratch_floats(uint32_t ffn);

/* out[rows x hidden] = the shard's partial for x[rows x hidden]. x and out must not
 * overlap; scratch holds dp_mlp_scratch_floats(s->ffn) floats. 0, or -1 for an
 * unknown kind (out untouched). */
int dp_mlp_forward(const struct dp_mlp_shard *s, const float *x, uint32_t rows, float *out,
		   float *scratch);

/* Rows of x per pass over one expert's weights in dp_mlp_expert_rows: a decode batch of
 * 32 tokens routed to one expert reads its weights once. */
#define DP_MLP_GATHER_ROWS 32u

/* Floats of scratch dp_mlp_expert_rows needs for a block of `cols` columns. */
size_t dp_mlp_rows_scratch_floats(uint32_t hidden, uint32_t cols);

/* Block b of a MOE shard (slot b < experts, or b == experts: the shared columns, cols 0
 * when there are none) as an expert; -1 for another kind or b past the bank. The bank
 * must be coherent: experts * expert_ffn <= ffn. */
int dp_mlp_bank_block(const struct dp_mlp_shard *s, uint32_t b, struct dp_mlp_expert *e);

/* Elements [first, first + n) of tensor t of a MOE shard in the wire's order (t0, t1
 * [hidden x ffn] row-major, t2 [ffn x hidden]) = src, stored where the bank keeps them.
 * The caller checked first + n against dp_mlp_tensor_len. */
void dp_mlp_bank_store(const struct dp_mlp_shard *s, unsigned t, uint64_t first,
		       const float *src, uint64_t n);

/* A mixture of experts' step: for i < n,
 *
 *   y[y_rows[i]] += weight[i] * (silu(x_i . w_gate) * (x_i . w_up)) . w_down
 *
 * of expert e, where x_i = x[x_rows[i]]; x_rows NULL: x_i = x[i]; y_rows NULL: row i of
 * y; weight NULL: 1. Rows are taken DP_MLP_GATHER_ROWS at a time, so n rows read the
 * expert's weights ceil(n / 32) times. scratch holds dp_mlp_rows_scratch_floats(hidden,
 * cols) floats; y must not overlap x or scratch. */
void dp_mlp_expert_rows(const struct dp_mlp_expert *e, const float *x, const uint32_t *x_rows,
			const float *weight, uint32_t n, float *y, const uint32_t *y_rows,
			float *scratch);

/* dst[k] = element first + k of shard tensor t (0..2, SWIGLU or MOE, the wire's order:
 * t0, t1 [hidden x ffn], t2 [ffn x hidden]) of an FP8 layer, dequantized exactly as
 * DeepSeek-V3's weight_dequant: (float)e4m3 * its 128x128 block's float32 scale, one
 * float32 multiplication (dp_fp8.h). w: the tensor's e4m3 bytes; scale: its grid
 * (hb x cb for t0, t1; cb x hb for t2), the shard's experts and expert_ffn giving each
 * column's grid column. The caller checked first + n against dp_mlp_tensor_len. */
void dp_mlp_fp8_dequant(const struct dp_mlp_shard *s, unsigned t, const uint8_t *w,
			const float *scale, uint64_t first, uint64_t n, float *dst);

/* out[i] = x[i] * k: the emulator's cheap, checkable "echo" compute. */
void dp_mlp_scale(float *out, const float *x, size_t n, float k);

float dp_mlp_gelu(float v); /* 0.5 v (1 + erf(v / sqrt 2)) */
float dp_mlp_silu(float v); /* v / (1 + exp(-v)) */

#endif /* DP_MLP_H */
