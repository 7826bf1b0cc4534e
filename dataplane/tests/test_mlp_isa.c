/* test_mlp_isa.c: the duck's AVX2 kernels against its portable ones (dp_mlp_set_isa).
 *
 * Conversions (float16, bfloat16 widening) and the FP8 dequantization must give the same
 * bits in both: each value is converted exactly, or multiplied once by its scale.
 *
 * The products may not: both instances sum in the same order, but AVX2's fuses each
 * multiply-add (FMA, one rounding instead of two). So an output is checked against the
 * exact value (computed in double) and the two against each other with the forward
 * error bound of float32 arithmetic, not a guess: a dot product of length n summed in
 * float32 in any order is within gamma_n * sum |a_k b_k| of the exact one, where
 * gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, 3.1). Through
 * SwiGLU, h = silu(g) * u: an error dg moves h by at most 1.1 |u| dg (|silu'| < 1.1) and
 * du by |silu(g)| du, so an output o of (weight * h) . w_down, added to y, is within
 *
 *   B_o = gamma_H sum_j |w2_jo| w (1.1 |u_j| G_j + |silu(g_j)| U_j)
 *         + gamma_(C+3) sum_j |w h_j| |w2_jo| + u |y_o|
 *
 * of exact (G_j, U_j: sum_k |x_k w_kj| of the gate and up products; H = hidden, C the
 * expert's columns; the +3: the products by silu, by u, by the weight, each rounded once),
 * to first order; the test allows 2 B_o against exact and 4 B_o between the two. A real
 * fault (a column skipped, a remainder lost, the wrong row) is off by about |y_o| itself,
 * orders of magnitude more.
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check), 77 skip (no AVX2 + FMA +
 * F16C on this CPU: there is only one instance to run).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_f16.h"
#include "dp_fp8.h"
#include "dp_mlp.h"
#include "test_check.h"

#define U32 0x1.0p-24 /* float32's unit roundoff */

static double gamma_n(double n)
{
	return n * U32 / (1.0 - n * U32);
}

static double ref_silu(double v)
{
	return v / (1.0 + exp(-v));
}

/* The exact (double) value of y_in + weight * expert(x) for one row, and its bound B. */
static void ref_row(const struct dp_mlp_expert *e, const float *x, float weight,
		    const float *y_in, double *ref, double *bound)
{
	const uint32_t hid = e->hidden, cols = e->cols;
	const double gh = gamma_n(hid), gc = gamma_n(cols + 3);
	for (uint32_t o = 0; o < hid; o++) {
		ref[o] = y_in[o];
		bound[o] = U32 * fabs(y_in[o]);
	}
	for (uint32_t j = 0; j < cols; j++) {
		double g = 0, u = 0, G = 0, U = 0;
		for (uint32_t k = 0; k < hid; k++) {
			double wg = e->w_gate[(size_t)k * e->ldb + j], wu = e->w_up[(size_t)k * e->ldb + j];
			g += (double)x[k] * wg;
			u += (double)x[k] * wu;
			G += fabs((double)x[k] * wg);
			U += fabs((double)x[k] * wu);
		}
		double h = ref_silu(g) * u * weight;
		double dh = gh * fabs(weight) * (1.1 * fabs(u) * G + fabs(ref_silu(g)) * U);
		for (uint32_t o = 0; o < hid; o++) {
			double w2 = e->w_down[(size_t)j * hid + o];
			ref[o] += h * w2;
			bound[o] += fabs(w2) * (dh + gc * fabs(h));
		}
	}
}

/* dp_mlp_expert_rows with `isa` on a copy of y0; y gets the result. */
static void run_rows(int isa, const struct dp_mlp_expert *e, const float *x, const uint32_t *x_rows,
		     const float *weight, uint32_t n, const float *y0, float *y, float *scratch)
{
	CHECK(dp_mlp_set_isa(isa) == 0 && dp_mlp_isa() == isa, "cannot select %s",
	      dp_mlp_isa_name(isa));
	memcpy(y, y0, (size_t)n * e->hidden * sizeof(float));
	dp_mlp_expert_rows(e, x, x_rows, weight, n, y, NULL, scratch);
}

/* One expert of hidden x cols, its weights rows ldb floats apart (a bank's stride when
 * ldb > cols), on n gathered and weighted rows: the streaming path below 12 rows, the
 * register-blocked one from 12, a second gather pass past 32. */
static void check_rows(uint32_t hidden, uint32_t cols, uint32_t ldb, uint32_t n)
{
	float *wg = malloc((size_t)hidden * ldb * sizeof(float));
	float *wu = malloc((size_t)hidden * ldb * sizeof(float));
	float *wd = malloc((size_t)cols * hidden * sizeof(float));
	for (size_t i = 0; i < (size_t)hidden * ldb; i++) {
		wg[i] = frand() * 2.0f / sqrtf((float)hidden);
		wu[i] = frand() * 2.0f / sqrtf((float)hidden);
	}
	for (size_t i = 0; i < (size_t)cols * hidden; i++)
		wd[i] = frand() * 2.0f / sqrtf((float)cols);
	struct dp_mlp_expert e = { .w_gate = wg, .w_up = wu, .w_down = wd, .hidden = hidden,
				   .cols = cols, .ldb = ldb };
	const uint32_t x_count = 2 * n + 1;
	float *x = malloc((size_t)x_count * hidden * sizeof(float));
	float *y0 = malloc((size_t)n * hidden * sizeof(float));
	float *yp = malloc((size_t)n * hidden * sizeof(float));
	float *ya = malloc((size_t)n * hidden * sizeof(float));
	double *ref = malloc((size_t)hidden * sizeof(double));
	double *bound = malloc((size_t)hidden * sizeof(double));
	float *scratch = malloc(dp_mlp_rows_scratch_floats(hidden, cols) * sizeof(float));
	uint32_t *x_rows = malloc(n * sizeof(uint32_t));
	float *weight = malloc(n * sizeof(float));
	for (size_t i = 0; i < (size_t)x_count * hidden; i++)
		x[i] = frand() * 2.0f;
	for (size_t i = 0; i < (size_t)n * hidden; i++)
		y0[i] = frand();
	for (uint32_t i = 0; i < n; i++) {
		x_rows[i] = 2 * (n - 1 - i) + 1;
		weight[i] = 0.25f + (float)i / (float)n;
	}
	run_rows(DP_MLP_ISA_PORTABLE, &e, x, x_rows, weight, n, y0, yp, scratch);
	run_rows(DP_MLP_ISA_AVX2, &e, x, x_rows, weight, n, y0, ya, scratch);
	int bad = 0;
	size_t differ = 0;
	for (uint32_t r = 0; r < n && bad < 3; r++) {
		ref_row(&e, x + (size_t)x_rows[r] * hidden, weight[r], y0 + (size_t)r * hidden, ref,
			bound);
		for (uint32_t o = 0; o < hidden && bad < 3; o++) {
			size_t i = (size_t)r * hidden + o;
			double ep = fabs(yp[i] - ref[o]), ea = fabs(ya[i] - ref[o]);
			double d = fabs((double)yp[i] - (double)ya[i]);
			differ += yp[i] != ya[i];
			if (ep <= 2 * bound[o] && ea <= 2 * bound[o] && d <= 4 * bound[o])
				continue;
			bad++;
			CHECK(0, "hidden %u cols %u ldb %u n %u: y[%u][%u] portable %.9g avx2 %.9g "
			      "exact %.9g, bound %.3g", hidden, cols, ldb, n, r, o, yp[i], ya[i],
			      ref[o], bound[o]);
		}
	}
	printf("expert rows hidden %u cols %u ldb %u n %u: %zu of %zu outputs differ in their "
	       "last bits (FMA), checked against the bound\n", hidden, cols, ldb, n, differ,
	       (size_t)n * hidden);
	free(wg);
	free(wu);
	free(wd);
	free(x);
	free(y0);
	free(yp);
	free(ya);
	free(ref);
	free(bound);
	free(scratch);
	free(x_rows);
	free(weight);
}

/* A dense SwiGLU shard (dp_mlp_forward): the same bound, its rows as one expert's with
 * weight 1 added to zeros. */
static void check_swiglu(uint32_t hidden, uint32_t ffn, uint32_t rows)
{
	struct dp_mlp_shard s = { .kind = DP_MLP_KIND_SWIGLU, .hidden = hidden, .ffn = ffn };
	for (unsigned t = 0; t < 3; t++) {
		uint64_t len = dp_mlp_tensor_len(s.kind, hidden, ffn, t);
		s.t[t] = malloc(len * sizeof(float));
		for (uint64_t i = 0; i < len; i++)
			s.t[t][i] = frand() * 2.0f / sqrtf((float)(t == 2 ? ffn : hidden));
	}
	struct dp_mlp_expert e = { .w_gate = s.t[0], .w_up = s.t[1], .w_down = s.t[2],
				   .hidden = hidden, .cols = ffn, .ldb = ffn };
	size_t n = (size_t)rows * hidden;
	float *x = malloc(n * sizeof(float)), *yp = malloc(n * sizeof(float));
	float *ya = malloc(n * sizeof(float)), *zero = calloc(hidden, sizeof(float));
	float *scratch = malloc(dp_mlp_scratch_floats(ffn) * sizeof(float));
	double *ref = malloc(hidden * sizeof(double)), *bound = malloc(hidden * sizeof(double));
	for (size_t i = 0; i < n; i++)
		x[i] = frand() * 2.0f;
	CHECK(dp_mlp_set_isa(DP_MLP_ISA_PORTABLE) == 0, "portable refused");
	CHECK(dp_mlp_forward(&s, x, rows, yp, scratch) == 0, "forward refused");
	CHECK(dp_mlp_set_isa(DP_MLP_ISA_AVX2) == 0, "avx2 refused");
	CHECK(dp_mlp_forward(&s, x, rows, ya, scratch) == 0, "forward refused");
	int bad = 0;
	for (uint32_t r = 0; r < rows && bad < 3; r++) {
		ref_row(&e, x + (size_t)r * hidden, 1.0f, zero, ref, bound);
		for (uint32_t o = 0; o < hidden && bad < 3; o++) {
			size_t i = (size_t)r * hidden + o;
			double ep = fabs(yp[i] - ref[o]), ea = fabs(ya[i] - ref[o]);
			double d = fabs((double)yp[i] - (double)ya[i]);
			if (ep <= 2 * bound[o] && ea <= 2 * bound[o] && d <= 4 * bound[o])
				continue;
			bad++;
			CHECK(0, "swiglu hidden %u ffn %u rows %u: y[%u][%u] portable %.9g avx2 %.9g "
			      "exact %.9g, bound %.3g", hidden, ffn, rows, r, o, yp[i], ya[i], ref[o],
			      bound[o]);
		}
	}
	for (unsigned t = 0; t < 3; t++)
		free(s.t[t]);
	free(x);
	free(yp);
	free(ya);
	free(zero);
	free(scratch);
	free(ref);
	free(bound);
}

/* Every 2-byte pattern of float16 and bfloat16, from an odd address and at lengths that
 * leave remainders, widened by both instances: the bits of dp_half_to_f32. */
static void test_widen(void)
{
	const size_t n = 65536 + 7;
	uint8_t *src = malloc(2 * n + 1);
	float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		uint16_t v = (uint16_t)(i * 40503u); /* every pattern, out of order */
		memcpy(src + 1 + 2 * i, &v, 2);
	}
	const uint8_t dtypes[] = { DP_DTYPE_F16, DP_DTYPE_BF16 };
	for (unsigned k = 0; k < 2; k++) {
		uint8_t dt = dtypes[k];
		dp_mlp_set_isa(DP_MLP_ISA_PORTABLE);
		dp_mlp_to_f32(a, src + 1, n, dt);
		dp_mlp_set_isa(DP_MLP_ISA_AVX2);
		dp_mlp_to_f32(b, src + 1, n, dt);
		size_t bad = 0;
		for (size_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, src + 1 + 2 * i, 2);
			float want = dp_half_to_f32(v, dt);
			bad += memcmp(&a[i], &want, 4) != 0 || memcmp(&b[i], &want, 4) != 0;
		}
		CHECK(bad == 0, "%s widening: %zu values not bit-exact",
		      dt == DP_DTYPE_F16 ? "float16" : "bfloat16", bad);
	}
	free(src);
	free(a);
	free(b);
}

/* An FP8 MOE bank's three tensors dequantized by both instances: the same bits. */
static void test_fp8(void)
{
	const uint32_t hidden = 300, experts = 3, expert_ffn = 200, shared = 72;
	const uint32_t ffn = experts * expert_ffn + shared;
	struct dp_mlp_shard s = { .kind = DP_MLP_KIND_MOE, .hidden = hidden, .ffn = ffn,
				  .experts = experts, .expert_ffn = expert_ffn };
	uint64_t cells = dp_fp8_blocks(hidden) * dp_fp8_scale_cols(ffn, experts, expert_ffn);
	float *scale = malloc(cells * sizeof(float));
	for (uint64_t i = 0; i < cells; i++)
		scale[i] = ldexpf(1.0f + frand() * 0.5f, (int)(i % 9) - 12);
	for (unsigned t = 0; t < 3; t++) {
		uint64_t n = dp_mlp_tensor_len(s.kind, hidden, ffn, t);
		uint8_t *w = malloc(n);
		float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
		for (uint64_t i = 0; i < n; i++)
			w[i] = (uint8_t)(i * 77u + t);
		/* from an odd element, so each row's runs start anywhere */
		dp_mlp_set_isa(DP_MLP_ISA_PORTABLE);
		dp_mlp_fp8_dequant(&s, t, w, scale, 5, n - 5, a);
		dp_mlp_set_isa(DP_MLP_ISA_AVX2);
		dp_mlp_fp8_dequant(&s, t, w, scale, 5, n - 5, b);
		CHECK(memcmp(a, b, (n - 5) * sizeof(float)) == 0, "tensor %u: FP8 dequantization "
		      "differs between the instances", t);
		free(w);
		free(a);
		free(b);
	}
	free(scale);
}

int main(void)
{
	if (dp_mlp_set_isa(DP_MLP_ISA_AVX2) < 0) {
		printf("test_mlp_isa: skipped: this CPU (or build target) has no AVX2 + FMA + F16C, "
		       "so there is only the portable instance\n");
		return 77;
	}
	CHECK(dp_mlp_set_isa(7) < 0, "an unknown instance was accepted");
	CHECK(dp_mlp_isa_parse("avx2") == DP_MLP_ISA_AVX2 &&
	      dp_mlp_isa_parse("portable") == DP_MLP_ISA_PORTABLE &&
	      dp_mlp_isa_parse("sse9") < 0, "names do not parse back");
	const uint32_t ns[] = { 1, 3, 13, 33 };
	for (unsigned i = 0; i < 4; i++) {
		check_rows(203, 40, 40, ns[i]);  /* remainders of 8 and 16 columns */
		check_rows(256, 128, 200, ns[i]); /* a bank's stride */
	}
	check_rows(7168, 128, 128, 2); /* DeepSeek-V3's hidden, the demo's expert width */
	check_swiglu(203, 72, 1);
	check_swiglu(203, 72, 17);
	test_widen();
	test_fp8();
	return test_result("test_mlp_isa");
}
