/* dp_mlp.c: the duck's compute kernels (see dp_mlp.h for the maths).
 *
 * Every product is C[rows x n] = bias + A[rows x k] . B[k x n] with B row-major
 * (the weights), in one of two loop orders, chosen per block of x's rows:
 *
 *  - streaming (few rows, the decode case): for each k, broadcast A[r][k] and
 *    stream row k of B into C's rows (axpy), four rows of C per pass. B is read
 *    front to back, which is what matters once the shards outgrow the caches:
 *    24 emulated ducks of a 0.6B model hold 36 MiB, and there this order ran
 *    twice as fast as the blocked one.
 *  - register-blocked (many rows, prefill): a 4 x 16 tile of C stays in
 *    registers while the kernel walks k, so each load of B feeds 4 rows; 1.5-2x
 *    faster than streaming from 12-16 rows on.
 *
 * Vectors are written with GCC's vector extension rather than left to the
 * auto-vectoriser: gcc 12 at -O2 uses the "very cheap" cost model, which
 * refuses any loop that needs a remainder, so plain loops stay scalar there.
 *
 * Two instances of every hot loop (the products, add_row, the float16/bfloat16
 * widening, the FP8 dequantization), as dp_reduce.h has: `portable`, the same code
 * compiled for the build's baseline (SSE2 on x86-64; whatever vectors another target
 * has), and on x86-64 `avx2`, compiled by attribute for AVX2 + FMA + F16C. One is
 * chosen at run time (dp_mlp_set_isa; by default the best the CPU has) rather than by
 * target_clones' ifunc: a test and the emulator's --isa can then run either, and the
 * choice needs no resolver running before ThreadSanitizer's runtime is up. The two
 * differ in rounding only where FMA fuses a product into its sum (same order of
 * summation); conversions and the dequantization are exact in both
 * (tests/test_mlp_isa.c).
 */
#include <math.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_f16.h"
#include "dp_fp8.h"
#include "dp_mlp.h"
#include "dp_reduce.h" /* dp_widen8_avx2 */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define DP_MLP_X86 1
/* GCC's default tuning splits unaligned 256-bit loads in two (as dp_reduce.h says) */
#if defined(__clang__)
#define DP_MLP_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define DP_MLP_AVX2 __attribute__((target("avx2,fma,f16c,tune=haswell")))
#endif
#endif

#define DP_MLP_VEC 8u             /* floats per vector */
#define DP_MLP_NR (2 * DP_MLP_VEC) /* columns of C per micro-kernel */
#define DP_MLP_MR 4u              /* rows of C per micro-kernel */
#define DP_MLP_STREAM_ROWS 12u    /* row blocks smaller than this stream B */

typedef float dp_v8f __attribute__((vector_size(DP_MLP_VEC * sizeof(float))));

/* Unaligned loads and stores: rows of B start wherever n puts them. */
#define V8_LOAD(dst, p) memcpy(&(dst), (p), sizeof(dp_v8f))
#define V8_STORE(p, src) memcpy((p), &(src), sizeof(dp_v8f))
#define V8_SPLAT(a) ((dp_v8f){ (a), (a), (a), (a), (a), (a), (a), (a) })

/* ------------------------------------------------------------- which kernels */

static int g_isa; /* enum dp_mlp_isa, resolved (never AUTO once set); 0: not asked yet */

/* AVX2, FMA (__builtin_cpu_supports) and F16C with the OS saving the YMM registers (CPUID
 * directly: clang 16's __builtin_cpu_supports knows no "f16c"). */
static int cpu_has_avx2(void)
{
#ifdef DP_MLP_X86
	unsigned a, b, c, d;
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 0;
	return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1) && (c >> 28 & 1);
#else
	return 0;
#endif
}

int dp_mlp_set_isa(int isa)
{
	if (isa == DP_MLP_ISA_AUTO)
		isa = cpu_has_avx2() ? DP_MLP_ISA_AVX2 : DP_MLP_ISA_PORTABLE;
	if (isa != DP_MLP_ISA_PORTABLE && (isa != DP_MLP_ISA_AVX2 || !cpu_has_avx2()))
		return -1;
	__atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
	return 0;
}

int dp_mlp_isa(void)
{
	/* relaxed: threads that race to resolve it store the same value */
	int isa = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
	if (!isa) {
		dp_mlp_set_isa(DP_MLP_ISA_AUTO);
		isa = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
	}
	return isa;
}

const char *dp_mlp_isa_name(int isa)
{
	switch (isa) {
	case DP_MLP_ISA_AUTO: return "auto";
	case DP_MLP_ISA_PORTABLE: return "portable";
	case DP_MLP_ISA_AVX2: return "avx2";
	default: return "?";
	}
}

int dp_mlp_isa_parse(const char *name)
{
	for (int isa = DP_MLP_ISA_AUTO; isa <= DP_MLP_ISA_AVX2; isa++)
		if (!strcmp(name, dp_mlp_isa_name(isa)))
			return isa;
	return -1;
}

#ifdef DP_MLP_X86
#define USE_AVX2() (dp_mlp_isa() == DP_MLP_ISA_AVX2)
#else
#define USE_AVX2() 0
#endif

/* ---------------------------------------------------------------- conversions */

/* n 2-byte values (float16 or bfloat16) at src, any alignment, one at a time. */
static void half_to_f32_portable(float *dst, const uint8_t *src, size_t n, uint8_t dtype)
{
	for (size_t i = 0; i < n; i++) { /* bfloat16: a shift and a store, GCC vectorizes it */
		uint16_t v;
		memcpy(&v, src + 2 * i, 2);
		dst[i] = dp_half_to_f32(v, dtype);
	}
}

#ifdef DP_MLP_X86
/* Eight at a time: VCVTPH2PS (float16, exact as the scalar conversion) or zero-extension
 * and a shift into the top half (bfloat16), dp_reduce.h's dp_widen8_avx2. */
DP_MLP_AVX2 static void half_to_f32_avx2(float *dst, const uint8_t *src, size_t n,
					 uint8_t dtype)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, dp_widen8_avx2(src + 2 * i, dtype));
	half_to_f32_portable(dst + i, src + 2 * i, n - i, dtype);
}
#endif

static void half_to_f32(float *dst, const void *src, size_t n, uint8_t dtype)
{
#ifdef DP_MLP_X86
	if (USE_AVX2()) {
		half_to_f32_avx2(dst, src, n, dtype);
		return;
	}
#endif
	half_to_f32_portable(dst, src, n, dtype);
}

void dp_mlp_f16_to_f32(float *dst, const void *src, size_t n)
{
	half_to_f32(dst, src, n, DP_DTYPE_F16);
}

void dp_mlp_to_f32(float *dst, const void *src, size_t n, uint8_t dtype)
{
	if (dtype == DP_DTYPE_F32)
		memcpy(dst, src, 4 * n);
	else /* float16, or bfloat16 */
		half_to_f32(dst, src, n, dtype == DP_DTYPE_BF16 ? DP_DTYPE_BF16 : DP_DTYPE_F16);
}

uint64_t dp_mlp_tensor_len(uint8_t kind, uint32_t hidden, uint32_t ffn, unsigned t)
{
	return dp_tensor_elems(kind, hidden, ffn, t); /* the schema's TENSOR_SHAPES */
}

size_t dp_mlp_scratch_floats(uint32_t ffn)
{
	return 2 * (size_t)DP_MLP_ROW_BLOCK * ffn; /* SwiGLU: gate and up; GELU uses half */
}

float dp_mlp_gelu(float v)
{
	return 0.5f * v * (1.0f + erff(v * (float)M_SQRT1_2));
}

float dp_mlp_silu(float v)
{
	return v / (1.0f + expf(-v));
}

/* C[4 x 16] = bias + A[4 x k] . B[k x 16]; A rows lda apart, B and C rows ldb, ldc apart. */
static inline __attribute__((always_inline)) void
kernel_4x16(const float *restrict a, size_t lda, const float *restrict b, size_t ldb,
	    uint32_t k_len, const float *restrict bias, float *restrict c, size_t ldc)
{
	dp_v8f c00, c01, c10, c11, c20, c21, c30, c31;
	if (bias) {
		V8_LOAD(c00, bias);
		V8_LOAD(c01, bias + DP_MLP_VEC);
	} else {
		c00 = c01 = V8_SPLAT(0.0f);
	}
	c10 = c20 = c30 = c00;
	c11 = c21 = c31 = c01;
	for (uint32_t k = 0; k < k_len; k++) {
		const float *bk = b + k * ldb;
		dp_v8f b0, b1;
		V8_LOAD(b0, bk);
		V8_LOAD(b1, bk + DP_MLP_VEC);
		dp_v8f a0 = V8_SPLAT(a[k]), a1 = V8_SPLAT(a[lda + k]);
		dp_v8f a2 = V8_SPLAT(a[2 * lda + k]), a3 = V8_SPLAT(a[3 * lda + k]);
		c00 += a0 * b0;
		c01 += a0 * b1;
		c10 += a1 * b0;
		c11 += a1 * b1;
		c20 += a2 * b0;
		c21 += a2 * b1;
		c30 += a3 * b0;
		c31 += a3 * b1;
	}
	V8_STORE(c, c00);
	V8_STORE(c + DP_MLP_VEC, c01);
	V8_STORE(c + ldc, c10);
	V8_STORE(c + ldc + DP_MLP_VEC, c11);
	V8_STORE(c + 2 * ldc, c20);
	V8_STORE(c + 2 * ldc + DP_MLP_VEC, c21);
	V8_STORE(c + 3 * ldc, c30);
	V8_STORE(c + 3 * ldc + DP_MLP_VEC, c31);
}

/* The same for one row. */
static inline __attribute__((always_inline)) void
kernel_1x16(const float *restrict a, const float *restrict b, size_t ldb, uint32_t k_len,
	    const float *restrict bias, float *restrict c)
{
	dp_v8f c0, c1;
	if (bias) {
		V8_LOAD(c0, bias);
		V8_LOAD(c1, bias + DP_MLP_VEC);
	} else {
		c0 = c1 = V8_SPLAT(0.0f);
	}
	for (uint32_t k = 0; k < k_len; k++) {
		const float *bk = b + k * ldb;
		dp_v8f b0, b1;
		V8_LOAD(b0, bk);
		V8_LOAD(b1, bk + DP_MLP_VEC);
		dp_v8f a0 = V8_SPLAT(a[k]);
		c0 += a0 * b0;
		c1 += a0 * b1;
	}
	V8_STORE(c, c0);
	V8_STORE(c + DP_MLP_VEC, c1);
}

/* Four rows of C += a0..a3 * row k of B (n floats). */
static inline __attribute__((always_inline)) void
axpy4(float *c0, float *c1, float *c2, float *c3, float a0, float a1, float a2, float a3,
      const float *restrict bk, uint32_t n)
{
	uint32_t n_vec = n - n % DP_MLP_VEC, j = 0;
	dp_v8f v0 = V8_SPLAT(a0), v1 = V8_SPLAT(a1), v2 = V8_SPLAT(a2), v3 = V8_SPLAT(a3);
	for (; j < n_vec; j += DP_MLP_VEC) {
		dp_v8f b, y0, y1, y2, y3;
		V8_LOAD(b, bk + j);
		V8_LOAD(y0, c0 + j);
		V8_LOAD(y1, c1 + j);
		V8_LOAD(y2, c2 + j);
		V8_LOAD(y3, c3 + j);
		y0 += v0 * b;
		y1 += v1 * b;
		y2 += v2 * b;
		y3 += v3 * b;
		V8_STORE(c0 + j, y0);
		V8_STORE(c1 + j, y1);
		V8_STORE(c2 + j, y2);
		V8_STORE(c3 + j, y3);
	}
	for (; j < n; j++) {
		c0[j] += a0 * bk[j];
		c1[j] += a1 * bk[j];
		c2[j] += a2 * bk[j];
		c3[j] += a3 * bk[j];
	}
}

static inline __attribute__((always_inline)) void
axpy1(float *restrict c0, float a0, const float *restrict bk, uint32_t n)
{
	uint32_t n_vec = n - n % DP_MLP_VEC, j = 0;
	dp_v8f v0 = V8_SPLAT(a0);
	for (; j < n_vec; j += DP_MLP_VEC) {
		dp_v8f b, y0;
		V8_LOAD(b, bk + j);
		V8_LOAD(y0, c0 + j);
		y0 += v0 * b;
		V8_STORE(c0 + j, y0);
	}
	for (; j < n; j++)
		c0[j] += a0 * bk[j];
}

/* Streaming order: B front to back, once per four rows of C. */
static inline __attribute__((always_inline)) void
gemm_stream_body(const float *restrict a, size_t lda, uint32_t rows,
			const float *restrict b, size_t ldb, uint32_t k_len, uint32_t n,
			const float *restrict bias, float *restrict c, size_t ldc)
{
	for (uint32_t r = 0; r < rows; r++) {
		if (bias)
			memcpy(c + r * ldc, bias, n * sizeof(float));
		else
			memset(c + r * ldc, 0, n * sizeof(float));
	}
	uint32_t r = 0;
	for (; r + DP_MLP_MR <= rows; r += DP_MLP_MR) {
		float *c0 = c + r * ldc;
		const float *a0 = a + r * lda;
		for (uint32_t k = 0; k < k_len; k++)
			axpy4(c0, c0 + ldc, c0 + 2 * ldc, c0 + 3 * ldc, a0[k], a0[lda + k],
			      a0[2 * lda + k], a0[3 * lda + k], b + (size_t)k * ldb, n);
	}
	for (; r < rows; r++)
		for (uint32_t k = 0; k < k_len; k++)
			axpy1(c + r * ldc, a[r * lda + k], b + (size_t)k * ldb, n);
}

/* Register-blocked order: C[rows x n] (rows ldc apart) = bias + A . B. */
static inline __attribute__((always_inline)) void
gemm_blocked_body(const float *restrict a, size_t lda, uint32_t rows, const float *restrict b,
			 size_t ldb, uint32_t k_len, uint32_t n, const float *restrict bias,
			 float *restrict c, size_t ldc)
{
	uint32_t n_vec = n - n % DP_MLP_NR;
	uint32_t r = 0;
	for (; r + DP_MLP_MR <= rows; r += DP_MLP_MR)
		for (uint32_t j = 0; j < n_vec; j += DP_MLP_NR)
			kernel_4x16(a + r * lda, lda, b + j, ldb, k_len, bias ? bias + j : NULL,
				    c + r * ldc + j, ldc);
	for (; r < rows; r++)
		for (uint32_t j = 0; j < n_vec; j += DP_MLP_NR)
			kernel_1x16(a + r * lda, b + j, ldb, k_len, bias ? bias + j : NULL,
				    c + r * ldc + j);
	/* The last n % 16 columns, scalar: shards are rarely that narrow. */
	for (r = 0; r < rows; r++)
		for (uint32_t j = n_vec; j < n; j++) {
			float acc = bias ? bias[j] : 0.0f;
			for (uint32_t k = 0; k < k_len; k++)
				acc += a[r * lda + k] * b[(size_t)k * ldb + j];
			c[r * ldc + j] = acc;
		}
}

#define GEMM_ARGS                                                                          \
	const float *restrict a, size_t lda, uint32_t rows, const float *restrict b, size_t ldb, \
		uint32_t k_len, uint32_t n, const float *restrict bias, float *restrict c, size_t ldc
#define GEMM_PASS a, lda, rows, b, ldb, k_len, n, bias, c, ldc

/* The instances: the same bodies, compiled for the baseline and for AVX2 + FMA (where
 * GCC fuses `c += a * b` into one VFMADD: -ffp-contract=fast is GNU C's default). */
static void gemm_stream_portable(GEMM_ARGS) { gemm_stream_body(GEMM_PASS); }
static void gemm_blocked_portable(GEMM_ARGS) { gemm_blocked_body(GEMM_PASS); }
#ifdef DP_MLP_X86
DP_MLP_AVX2 static void gemm_stream_avx2(GEMM_ARGS) { gemm_stream_body(GEMM_PASS); }
DP_MLP_AVX2 static void gemm_blocked_avx2(GEMM_ARGS) { gemm_blocked_body(GEMM_PASS); }
#endif

/* C[rows x n] (rows ldc apart) = bias + A[rows x k] (rows lda apart) . B[k x n] (rows ldb
 * apart: n columns of a wider matrix, as an expert's columns of a MoE bank). */
static void gemm_ld(GEMM_ARGS)
{
	const int stream = rows < DP_MLP_STREAM_ROWS;
#ifdef DP_MLP_X86
	if (USE_AVX2()) {
		if (stream)
			gemm_stream_avx2(GEMM_PASS);
		else
			gemm_blocked_avx2(GEMM_PASS);
		return;
	}
#endif
	if (stream)
		gemm_stream_portable(GEMM_PASS);
	else
		gemm_blocked_portable(GEMM_PASS);
}

/* The same with B[k x n] whole (rows n apart). */
static void gemm(const float *restrict a, size_t lda, uint32_t rows, const float *restrict b,
		 uint32_t k_len, uint32_t n, const float *restrict bias, float *restrict c, size_t ldc)
{
	gemm_ld(a, lda, rows, b, n, k_len, n, bias, c, ldc);
}

int dp_mlp_forward(const struct dp_mlp_shard *s, const float *x, uint32_t rows, float *out,
		   float *scratch)
{
	const uint32_t hid = s->hidden, ffn = s->ffn;
	if (s->kind != DP_MLP_KIND_GELU && s->kind != DP_MLP_KIND_SWIGLU)
		return -1;
	for (uint32_t r0 = 0; r0 < rows; r0 += DP_MLP_ROW_BLOCK) {
		uint32_t rb = rows - r0 < DP_MLP_ROW_BLOCK ? rows - r0 : DP_MLP_ROW_BLOCK;
		const float *xb = x + (size_t)r0 * hid;
		float *h = scratch;
		size_t nh = (size_t)rb * ffn;
		if (s->kind == DP_MLP_KIND_GELU) {
			gemm(xb, hid, rb, s->t[0], hid, ffn, s->t[1], h, ffn);
			for (size_t i = 0; i < nh; i++)
				h[i] = dp_mlp_gelu(h[i]);
		} else {
			float *u = scratch + (size_t)DP_MLP_ROW_BLOCK * ffn;
			gemm(xb, hid, rb, s->t[0], hid, ffn, NULL, h, ffn);
			gemm(xb, hid, rb, s->t[1], hid, ffn, NULL, u, ffn);
			for (size_t i = 0; i < nh; i++)
				h[i] = dp_mlp_silu(h[i]) * u[i];
		}
		gemm(h, ffn, rb, s->t[2], ffn, hid, NULL, out + (size_t)r0 * hid, hid);
	}
	return 0;
}

size_t dp_mlp_rows_scratch_floats(uint32_t hidden, uint32_t cols)
{
	return (size_t)DP_MLP_GATHER_ROWS * (2 * (size_t)hidden + 2 * (size_t)cols);
}

/* y[0..n) += x[0..n) */
static inline __attribute__((always_inline)) void
add_row_body(float *restrict y, const float *restrict x, uint32_t n)
{
	uint32_t n_vec = n - n % DP_MLP_VEC, j = 0;
	for (; j < n_vec; j += DP_MLP_VEC) {
		dp_v8f a, b;
		V8_LOAD(a, y + j);
		V8_LOAD(b, x + j);
		a += b;
		V8_STORE(y + j, a);
	}
	for (; j < n; j++)
		y[j] += x[j];
}

static void add_row_portable(float *restrict y, const float *restrict x, uint32_t n)
{
	add_row_body(y, x, n);
}

#ifdef DP_MLP_X86
DP_MLP_AVX2 static void add_row_avx2(float *restrict y, const float *restrict x, uint32_t n)
{
	add_row_body(y, x, n);
}
#endif

static void add_row(float *restrict y, const float *restrict x, uint32_t n)
{
#ifdef DP_MLP_X86
	if (USE_AVX2()) {
		add_row_avx2(y, x, n);
		return;
	}
#endif
	add_row_portable(y, x, n);
}

int dp_mlp_bank_block(const struct dp_mlp_shard *s, uint32_t b, struct dp_mlp_expert *e)
{
	const uint64_t hid = s->hidden, routed = (uint64_t)s->experts * s->expert_ffn;
	if (s->kind != DP_MLP_KIND_MOE || b > s->experts || routed > s->ffn)
		return -1;
	uint64_t col0 = (uint64_t)b * s->expert_ffn; /* blocks before b: all expert_ffn wide */
	e->cols = b < s->experts ? s->expert_ffn : (uint32_t)(s->ffn - routed);
	e->hidden = s->hidden;
	e->ldb = e->cols;
	e->w_gate = s->t[0] + col0 * hid;
	e->w_up = s->t[1] + col0 * hid;
	e->w_down = s->t[2] + col0 * hid;
	return 0;
}

void dp_mlp_bank_store(const struct dp_mlp_shard *s, unsigned t, uint64_t first,
		       const float *src, uint64_t n)
{
	if (t == 2) { /* [ffn x hidden]: blocks of rows, in order already */
		memcpy(s->t[2] + first, src, n * sizeof(float));
		return;
	}
	const uint64_t ffn = s->ffn, hid = s->hidden, e = s->expert_ffn;
	const uint64_t routed = (uint64_t)s->experts * e;
	uint64_t k = first / ffn, j = first % ffn; /* row and column of the wire's matrix */
	while (n) {
		/* the rest of column j's block on row k: contiguous in the bank */
		uint64_t block0 = j < routed ? j - j % e : routed;
		uint64_t width = j < routed ? e : ffn - routed;
		uint64_t run = block0 + width - j < n ? block0 + width - j : n;
		memcpy(s->t[t] + block0 * hid + k * width + (j - block0), src, run * sizeof(float));
		src += run;
		n -= run;
		j += run;
		if (j == ffn) {
			j = 0;
			k++;
		}
	}
}

void dp_mlp_expert_rows(const struct dp_mlp_expert *e, const float *x, const uint32_t *x_rows,
			const float *weight, uint32_t n, float *y, const uint32_t *y_rows,
			float *scratch)
{
	const uint32_t hid = e->hidden, cols = e->cols;
	if (!cols)
		return;
	float *xb = scratch;                               /* gathered rows of x */
	float *g = xb + (size_t)DP_MLP_GATHER_ROWS * hid;  /* gate, then the weighted h */
	float *u = g + (size_t)DP_MLP_GATHER_ROWS * cols;  /* up */
	float *ob = u + (size_t)DP_MLP_GATHER_ROWS * cols; /* h . w_down, before it is added */
	for (uint32_t r0 = 0; r0 < n; r0 += DP_MLP_GATHER_ROWS) {
		uint32_t rb = n - r0 < DP_MLP_GATHER_ROWS ? n - r0 : DP_MLP_GATHER_ROWS;
		const float *a = x + (size_t)r0 * hid;
		if (x_rows) {
			for (uint32_t i = 0; i < rb; i++)
				memcpy(xb + (size_t)i * hid, x + (size_t)x_rows[r0 + i] * hid,
				       hid * sizeof(float));
			a = xb;
		}
		gemm_ld(a, hid, rb, e->w_gate, e->ldb, hid, cols, NULL, g, cols);
		gemm_ld(a, hid, rb, e->w_up, e->ldb, hid, cols, NULL, u, cols);
		/* weight * (h . w_down) = (weight * h) . w_down: scale the narrow side */
		for (uint32_t i = 0; i < rb; i++) {
			float w = weight ? weight[r0 + i] : 1.0f;
			float *gi = g + (size_t)i * cols, *ui = u + (size_t)i * cols;
			for (uint32_t j = 0; j < cols; j++)
				gi[j] = dp_mlp_silu(gi[j]) * ui[j] * w;
		}
		gemm(g, cols, rb, e->w_down, cols, hid, NULL, ob, hid);
		for (uint32_t i = 0; i < rb; i++) {
			uint32_t row = y_rows ? y_rows[r0 + i] : r0 + i;
			add_row(y + (size_t)row * hid, ob + (size_t)i * hid, hid);
		}
	}
}

void dp_mlp_scale(float *restrict out, const float *restrict x, size_t n, float k)
{
	for (size_t i = 0; i < n; i++)
		out[i] = x[i] * k;
}

/* The first column past c's 128-block in a shard of experts blocks of expert_ffn, then
 * the rest (dp_fp8.h): where the next scale begins. */
static uint64_t fp8_block_end(uint64_t c, uint32_t experts, uint32_t expert_ffn)
{
	uint64_t routed = (uint64_t)experts * expert_ffn;
	if (c < routed) {
		uint64_t base = c / expert_ffn * expert_ffn, j = c - base;
		uint64_t end = (j / DP_FP8_BLOCK + 1) * DP_FP8_BLOCK;
		return base + (end < expert_ffn ? end : expert_ffn);
	}
	return routed + ((c - routed) / DP_FP8_BLOCK + 1) * DP_FP8_BLOCK;
}

/* o[0..k) = q's e4m3 values times sc: one float32 product each, as weight_dequant. */
static void fp8_run_portable(float *o, const uint8_t *q, uint64_t k, const float *lut, float sc)
{
	for (uint64_t j = 0; j < k; j++)
		o[j] = lut[q[j]] * sc;
}

#ifdef DP_MLP_X86
/* Eight at a time: the bytes widened to indices, the table gathered, the same product. */
DP_MLP_AVX2 static void fp8_run_avx2(float *o, const uint8_t *q, uint64_t k, const float *lut,
				     float sc)
{
	const __m256 s8 = _mm256_set1_ps(sc);
	uint64_t j = 0;
	for (; j + 8 <= k; j += 8) {
		__m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(q + j)));
		_mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_i32gather_ps(lut, idx, 4), s8));
	}
	fp8_run_portable(o + j, q + j, k - j, lut, sc);
}
#endif

static void fp8_run(float *o, const uint8_t *q, uint64_t k, const float *lut, float sc)
{
#ifdef DP_MLP_X86
	if (USE_AVX2()) {
		fp8_run_avx2(o, q, k, lut, sc);
		return;
	}
#endif
	fp8_run_portable(o, q, k, lut, sc);
}

void dp_mlp_fp8_dequant(const struct dp_mlp_shard *s, unsigned t, const uint8_t *w,
			const float *scale, uint64_t first, uint64_t n, float *dst)
{
	float lut[256]; /* every e4m3 value: a load, not bit arithmetic, per weight */
	for (unsigned b = 0; b < 256; b++)
		lut[b] = dp_f8e4m3_to_f32((uint8_t)b);
	/* t0, t1: rows are hidden, columns the shard's; t2 the other way round */
	const int down = t == 2;
	const uint64_t cols = down ? s->hidden : s->ffn;
	const uint64_t hb = dp_fp8_blocks(s->hidden);
	const uint64_t cb = dp_fp8_scale_cols(s->ffn, s->experts, s->expert_ffn);
	const uint64_t end = first + n;
	/* runs of one row sharing one scale: to the row's end, or its block's */
	for (uint64_t i = first; i < end;) {
		uint64_t r = i / cols, c = i % cols, stop, at;
		if (down) {
			at = dp_fp8_scale_col((uint32_t)r, s->experts, s->expert_ffn) * hb +
			     c / DP_FP8_BLOCK;
			stop = (c / DP_FP8_BLOCK + 1) * DP_FP8_BLOCK;
		} else {
			at = r / DP_FP8_BLOCK * cb +
			     dp_fp8_scale_col((uint32_t)c, s->experts, s->expert_ffn);
			stop = fp8_block_end(c, s->experts, s->expert_ffn);
		}
		uint64_t k = (stop < cols ? stop : cols) - c;
		if (k > end - i)
			k = end - i;
		fp8_run(dst + (i - first), w + i, k, lut, scale[at]);
		i += k;
	}
}
