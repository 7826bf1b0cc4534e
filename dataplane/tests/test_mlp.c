/* test_mlp.c: the duck's kernels against a double-precision reference.
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
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

static double ref_gelu(double v)
{
	return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
}

static double ref_silu(double v)
{
	return v / (1.0 + exp(-v));
}

/* The naive partial, in double: the definition in dp_mlp.h, loop for loop. */
static void ref_forward(const struct dp_mlp_shard *s, const float *x, uint32_t rows, double *out)
{
	uint32_t hid = s->hidden, ffn = s->ffn;
	for (uint32_t r = 0; r < rows; r++) {
		for (uint32_t c = 0; c < hid; c++)
			out[r * hid + c] = 0.0;
		for (uint32_t j = 0; j < ffn; j++) {
			double a = 0.0, b = 0.0, h;
			for (uint32_t k = 0; k < hid; k++) {
				a += (double)x[r * hid + k] * s->t[0][k * ffn + j];
				if (s->kind == DP_MLP_KIND_SWIGLU)
					b += (double)x[r * hid + k] * s->t[1][k * ffn + j];
			}
			if (s->kind == DP_MLP_KIND_GELU)
				h = ref_gelu(a + s->t[1][j]);
			else
				h = ref_silu(a) * b;
			for (uint32_t c = 0; c < hid; c++)
				out[r * hid + c] += h * s->t[2][j * hid + c];
		}
	}
}

static void check_kernel(uint8_t kind, uint32_t hidden, uint32_t ffn, uint32_t rows)
{
	const char *name = kind == DP_MLP_KIND_GELU ? "gelu" : "swiglu";
	struct dp_mlp_shard s = { .kind = kind, .hidden = hidden, .ffn = ffn };
	for (unsigned t = 0; t < 3; t++) {
		uint64_t n = dp_mlp_tensor_len(kind, hidden, ffn, t);
		s.t[t] = malloc(n * sizeof(float));
		for (uint64_t i = 0; i < n; i++)
			s.t[t][i] = frand() * (t == 2 ? 1.0f / sqrtf((float)ffn) : 1.0f / sqrtf((float)hidden)) * 2.0f;
	}
	size_t n = (size_t)rows * hidden;
	float *x = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
	float *scratch = malloc(dp_mlp_scratch_floats(ffn) * sizeof(float));
	double *ref = malloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++) {
		x[i] = frand() * 2.0f;
		out[i] = NAN;
	}
	CHECK(dp_mlp_forward(&s, x, rows, out, scratch) == 0, "%s forward refused", name);
	ref_forward(&s, x, rows, ref);

	/* Relative to the output's scale: a sum of products may cancel to near zero. */
	double scale = 0.0;
	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(ref[i]));
	int bad = 0;
	for (size_t i = 0; i < n && bad < 3; i++) {
		double err = fabs((double)out[i] - ref[i]);
		if (!(err <= 1e-4 * fmax(fabs(ref[i]), scale))) {
			bad++;
			CHECK(0, "%s hidden %u ffn %u rows %u: out[%zu] = %.7g, reference %.7g", name,
			      hidden, ffn, rows, i, out[i], ref[i]);
		}
	}
	for (unsigned t = 0; t < 3; t++)
		free(s.t[t]);
	free(x);
	free(out);
	free(scratch);
	free(ref);
}

static void test_kernels(void)
{
	/* hidden x ffn x rows. Under 12 rows a block streams the weights, from 12 on it
	 * is register-blocked: both orders, their 4-row and 1-row kernels, column tails
	 * (widths not a multiple of 8 or 16) and a second row block (17 = 16 + 1). */
	static const uint32_t shapes[][3] = { { 48, 20, 3 },  { 37, 19, 5 },  { 64, 32, 4 },
					      { 16, 1, 1 },   { 1, 16, 9 },   { 37, 19, 13 },
					      { 24, 40, 12 }, { 33, 48, 17 }, { 40, 9, 30 } };
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		check_kernel(DP_MLP_KIND_GELU, shapes[i][0], shapes[i][1], shapes[i][2]);
		check_kernel(DP_MLP_KIND_SWIGLU, shapes[i][0], shapes[i][1], shapes[i][2]);
	}

	struct dp_mlp_shard bad = { .kind = 9, .hidden = 4, .ffn = 4 };
	float x[4] = { 0 }, out[4] = { 1, 2, 3, 4 };
	CHECK(dp_mlp_forward(&bad, x, 1, out, NULL) == -1, "unknown kind accepted");
	CHECK(out[0] == 1 && out[3] == 4, "unknown kind wrote its output");

	CHECK(dp_mlp_tensor_len(DP_MLP_KIND_GELU, 8, 3, 0) == 24, "gelu w_up len");
	CHECK(dp_mlp_tensor_len(DP_MLP_KIND_GELU, 8, 3, 1) == 3, "gelu b_up len");
	CHECK(dp_mlp_tensor_len(DP_MLP_KIND_GELU, 8, 3, 2) == 24, "gelu w_down len");
	CHECK(dp_mlp_tensor_len(DP_MLP_KIND_SWIGLU, 8, 3, 1) == 24, "swiglu w_up len");
	CHECK(dp_mlp_tensor_len(DP_MLP_KIND_SWIGLU, 8, 3, 3) == 0, "a fourth tensor");
	CHECK(dp_mlp_tensor_len(7, 8, 3, 0) == 0, "unknown kind has tensors");

	CHECK(fabsf(dp_mlp_gelu(1.0f) - 0.8413447f) < 1e-6f, "gelu(1) = %.8g", dp_mlp_gelu(1.0f));
	CHECK(fabsf(dp_mlp_silu(1.0f) - 0.7310586f) < 1e-6f, "silu(1) = %.8g", dp_mlp_silu(1.0f));

	float e[5] = { 1, -2, 0.5f, 0, 3 }, eo[5];
	dp_mlp_scale(eo, e, 5, 3.0f);
	CHECK(eo[0] == 3 && eo[1] == -6 && eo[2] == 1.5f && eo[3] == 0 && eo[4] == 9, "scale");
}

/* Block b of a MOE bank of `experts` of expert_ffn columns and `shared` more: stored from
 * the wire's order in uneven pieces by dp_mlp_bank_store, then dp_mlp_expert_rows on rows
 * of x gathered through x_rows (every third row, backwards), weighted, added into rows of
 * y that already hold values (y_rows reverse them again), against the definition in
 * double on the wire's [hidden x ffn] matrices. With `strided` the block is read in place
 * from those matrices instead (rows ffn apart): gemm's row stride. */
static void check_rows(uint32_t hidden, uint32_t experts, uint32_t expert_ffn, uint32_t shared,
		       uint32_t b, uint32_t n, int strided)
{
	const uint32_t ffn = experts * expert_ffn + shared;
	struct dp_mlp_shard s = { .kind = DP_MLP_KIND_MOE, .hidden = hidden, .ffn = ffn,
				  .experts = experts, .expert_ffn = expert_ffn };
	float *wire[3];
	for (unsigned t = 0; t < 3; t++) {
		uint64_t len = dp_mlp_tensor_len(DP_MLP_KIND_MOE, hidden, ffn, t);
		wire[t] = malloc(len * sizeof(float));
		s.t[t] = malloc(len * sizeof(float));
		for (uint64_t i = 0; i < len; i++)
			wire[t][i] = frand() * 2.0f / sqrtf((float)(t == 2 ? ffn : hidden));
		for (uint64_t at = 0, piece = 1; at < len; at += piece, piece = piece * 3 + 1) {
			if (piece > len - at)
				piece = len - at;
			dp_mlp_bank_store(&s, t, at, wire[t] + at, piece);
		}
	}
	struct dp_mlp_expert e;
	CHECK(dp_mlp_bank_block(&s, b, &e) == 0, "block %u refused", b);
	uint32_t col0 = b * expert_ffn, cols = e.cols;
	CHECK(cols == (b < experts ? expert_ffn : shared), "block %u has %u columns", b, cols);
	if (strided)
		e = (struct dp_mlp_expert){ .w_gate = wire[0] + col0, .w_up = wire[1] + col0,
					    .w_down = wire[2] + (size_t)col0 * hidden,
					    .hidden = hidden, .cols = cols, .ldb = ffn };
	uint32_t x_count = 3 * n + 1;
	float *x = malloc((size_t)x_count * hidden * sizeof(float));
	float *y = malloc((size_t)n * hidden * sizeof(float));
	double *ref = malloc((size_t)n * hidden * sizeof(double));
	float *scratch = malloc(dp_mlp_rows_scratch_floats(hidden, cols) * sizeof(float));
	uint32_t *x_rows = malloc(n * sizeof(uint32_t)), *y_rows = malloc(n * sizeof(uint32_t));
	float *weight = malloc(n * sizeof(float));
	for (size_t i = 0; i < (size_t)x_count * hidden; i++)
		x[i] = frand() * 2.0f;
	for (uint32_t i = 0; i < n; i++) {
		x_rows[i] = 3 * (n - 1 - i) + 1;
		y_rows[i] = n - 1 - i;
		weight[i] = 0.25f + (float)i / (float)n;
	}
	for (size_t i = 0; i < (size_t)n * hidden; i++) {
		y[i] = frand();
		ref[i] = y[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		const float *xi = x + (size_t)x_rows[i] * hidden;
		double *yi = ref + (size_t)y_rows[i] * hidden;
		for (uint32_t j = col0; j < col0 + cols; j++) {
			double a = 0.0, c = 0.0;
			for (uint32_t k = 0; k < hidden; k++) {
				a += (double)xi[k] * wire[0][(size_t)k * ffn + j];
				c += (double)xi[k] * wire[1][(size_t)k * ffn + j];
			}
			double h = ref_silu(a) * c * weight[i];
			for (uint32_t o = 0; o < hidden; o++)
				yi[o] += h * wire[2][(size_t)j * hidden + o];
		}
	}
	dp_mlp_expert_rows(&e, x, x_rows, weight, n, y, y_rows, scratch);
	double scale = 0.0;
	for (size_t i = 0; i < (size_t)n * hidden; i++)
		scale = fmax(scale, fabs(ref[i]));
	int bad = 0;
	for (size_t i = 0; i < (size_t)n * hidden && bad < 3; i++) {
		double err = fabs((double)y[i] - ref[i]);
		if (!(err <= 1e-4 * fmax(fabs(ref[i]), scale))) {
			bad++;
			CHECK(0, "rows hidden %u bank %u x %u + %u block %u n %u%s: y[%zu] = %.7g, "
			      "reference %.7g", hidden, experts, expert_ffn, shared, b, n,
			      strided ? " strided" : "", i, y[i], ref[i]);
		}
	}
	for (unsigned t = 0; t < 3; t++) {
		free(s.t[t]);
		free(wire[t]);
	}
	free(x);
	free(y);
	free(ref);
	free(scratch);
	free(x_rows);
	free(y_rows);
	free(weight);
}

static void test_rows(void)
{
	/* hidden, experts, expert_ffn, shared columns, block, rows, strided: streaming (< 12)
	 * and blocked row counts, a second gather block (33 = 32 + 1), widths with column
	 * tails, first, middle and last experts, the shared block, a bank of shared columns
	 * alone, and the same blocks read in place with a row stride */
	static const uint32_t cases[][7] = {
		{ 48, 3, 16, 16, 1, 3, 0 },  { 37, 3, 19, 0, 2, 5, 0 },  { 64, 2, 32, 32, 0, 13, 0 },
		{ 40, 5, 9, 7, 5, 33, 0 },   { 16, 1, 16, 0, 0, 1, 0 },  { 24, 0, 8, 40, 0, 70, 0 },
		{ 37, 3, 19, 5, 1, 13, 1 },  { 40, 5, 9, 7, 5, 4, 1 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_rows(cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4],
			   cases[i][5], (int)cases[i][6]);

	float t[3][64] = { { 0 } };
	struct dp_mlp_shard s = { .kind = DP_MLP_KIND_MOE, .hidden = 4, .ffn = 8, .experts = 2,
				  .expert_ffn = 3, .t = { t[0], t[1], t[2] } };
	struct dp_mlp_expert e;
	CHECK(dp_mlp_bank_block(&s, 2, &e) == 0 && e.cols == 2 && e.w_gate == t[0] + 24,
	      "the shared block");
	CHECK(dp_mlp_bank_block(&s, 3, &e) == -1, "a block past the bank");
	s.expert_ffn = 5;
	CHECK(dp_mlp_bank_block(&s, 0, &e) == -1, "experts wider than the bank");
	s.kind = DP_MLP_KIND_SWIGLU;
	s.expert_ffn = 3;
	CHECK(dp_mlp_bank_block(&s, 0, &e) == -1, "a dense shard has no blocks");
	s.kind = DP_MLP_KIND_MOE;
	float x[4] = { 1, 2, 3, 4 }, out[4] = { 7, 7, 7, 7 }, dense_scratch[2 * DP_MLP_ROW_BLOCK * 8];
	CHECK(dp_mlp_forward(&s, x, 1, out, dense_scratch) == -1 && out[0] == 7,
	      "dense forward of a MOE bank");
}

/* Every float16 value, bit for bit as the scalar conversion gives it, from every
 * alignment and with every tail length the eight-wide path leaves. */
static void test_f16_to_f32(void)
{
	enum { N = 65536 };
	static uint8_t raw[2 * N + 1];
	static float got[N];
	for (int shift = 0; shift < 2; shift++) {
		for (uint32_t i = 0; i < N; i++) {
			uint16_t v = (uint16_t)i;
			memcpy(raw + shift + 2 * i, &v, 2);
		}
		for (size_t n = N - 9; n <= N; n++) {
			memset(got, 0xA5, sizeof(got));
			dp_mlp_f16_to_f32(got, raw + shift, n);
			size_t bad = 0, first = 0;
			for (size_t i = 0; i < N; i++) {
				uint32_t want, have;
				float ref = dp_f16_to_f32((uint16_t)i);
				memcpy(&want, &ref, 4);
				memcpy(&have, &got[i], 4);
				if (i >= n)
					want = 0xA5A5A5A5u; /* past n: untouched */
				if (want != have && !bad++)
					first = i;
			}
			CHECK(!bad, "f16_to_f32 (shift %d, n %zu): %zu wrong, the first at 0x%04zx",
			      shift, n, bad, first);
		}
	}
}

/* dp_mlp_to_f32 by dtype: every bfloat16 is the float32 with those top 16 bits (NaNs
 * too: widening loses nothing), every float16 is dp_f16_to_f32's, float32 is copied;
 * from an odd address, n short of a multiple of eight. */
static void test_to_f32(void)
{
	enum { N = 65536 };
	static uint8_t raw[4 * N + 1];
	static float got[N];
	for (uint32_t i = 0; i < N; i++) {
		uint16_t v = (uint16_t)i;
		memcpy(raw + 1 + 2 * i, &v, 2);
	}
	memset(got, 0xA5, sizeof(got));
	dp_mlp_to_f32(got, raw + 1, N - 3, DP_DTYPE_BF16);
	size_t bad = 0;
	for (uint32_t i = 0; i < N; i++) {
		uint32_t have, want = i < N - 3 ? i << 16 : 0xA5A5A5A5u;
		memcpy(&have, &got[i], 4);
		bad += have != want;
	}
	CHECK(!bad, "to_f32 bf16: %zu wrong", bad);
	dp_mlp_to_f32(got, raw + 1, N, DP_DTYPE_F16);
	bad = 0;
	for (uint32_t i = 0; i < N; i++) {
		float ref = dp_f16_to_f32((uint16_t)i);
		bad += memcmp(&ref, &got[i], 4) != 0;
	}
	CHECK(!bad, "to_f32 f16: %zu differ from dp_f16_to_f32", bad);
	for (uint32_t i = 0; i < 100; i++) {
		float f = (float)i * -0.37f;
		memcpy(raw + 1 + 4 * i, &f, 4);
	}
	dp_mlp_to_f32(got, raw + 1, 100, DP_DTYPE_F32);
	CHECK(!memcmp(got, raw + 1, 400), "to_f32 f32 copies");
}

/* e4m3fn by its definition, in double: S EEEE MMM, bias 7, subnormal at E 0, the one NaN
 * pattern S.1111.111, no infinities (OCP FP8, torch.float8_e4m3fn). */
static double ref_e4m3(unsigned b)
{
	unsigned e = (b >> 3) & 15, m = b & 7;
	if (e == 15 && m == 7)
		return NAN;
	double v = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp(m / 8.0, -6);
	return (b & 0x80) ? -v : v;
}

static void test_e4m3(void)
{
	size_t bad = 0;
	for (unsigned b = 0; b < 256; b++) {
		float f = dp_f8e4m3_to_f32((uint8_t)b);
		if ((b & 0x7f) == 0x7f)
			bad += !isnan(f);
		else
			bad += (double)f != ref_e4m3(b) || !!signbit(f) != !!(b & 0x80);
	}
	CHECK(!bad, "e4m3: %zu of 256 codes wrong", bad);
	CHECK(dp_f8e4m3_to_f32(0x7e) == 448.0f && dp_f8e4m3_to_f32(0x01) == 0x1p-9f,
	      "e4m3 largest %g, smallest %g", dp_f8e4m3_to_f32(0x7e), dp_f8e4m3_to_f32(0x01));
}

/* A bank of 2 experts of 136 columns and 40 shared ones, hidden 200 (neither a multiple
 * of 128): every element of every tensor is (float)e4m3 * the scale of its own block,
 * the block found here from the official rule, expert by expert (grid columns 0-1 expert
 * 0's, 2-3 expert 1's, 4 the shared columns'), rows by i / 128. */
static void test_fp8_dequant(void)
{
	enum { H = 200, EF = 136, EX = 2, SH = 40, F = EX * EF + SH, HB = 2, CB = 5 };
	struct dp_mlp_shard s = { .kind = DP_MLP_KIND_MOE, .hidden = H, .ffn = F,
				  .experts = EX, .expert_ffn = EF };
	CHECK(dp_fp8_scale_cols(F, EX, EF) == CB, "grid columns %llu",
	      (unsigned long long)dp_fp8_scale_cols(F, EX, EF));
	CHECK(dp_fp8_tensor_bytes(H, F, EX, EF) == (uint64_t)H * F + 4 * HB * CB, "tensor bytes");
	CHECK(dp_fp8_scale_cols(300, 0, 0) == 3, "a dense shard of 300 columns has 3 blocks");
	static uint8_t w[H * F];
	static float got[H * F];
	float grid[HB * CB];
	for (size_t i = 0; i < sizeof(w); i++)
		w[i] = (uint8_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 56);
	for (unsigned i = 0; i < HB * CB; i++)
		grid[i] = ldexpf(1.0f + (float)i / 16, -(int)i); /* every block its own */
	for (unsigned t = 0; t < 3; t++) {
		size_t bad = 0;
		/* in two pieces, the second starting mid-row: a payload's worth at a time */
		dp_mlp_fp8_dequant(&s, t, w, grid, 0, 1001, got);
		dp_mlp_fp8_dequant(&s, t, w, grid, 1001, (uint64_t)H * F - 1001, got + 1001);
		for (uint32_t r = 0; r < (t == 2 ? F : H); r++)
			for (uint32_t c = 0; c < (t == 2 ? H : F); c++) {
				uint32_t bank = t == 2 ? r : c, other = t == 2 ? c : r;
				uint32_t col = bank < EX * EF ? bank / EF * 2 + bank % EF / 128
							      : 4 + (bank - EX * EF) / 128;
				float sc = t == 2 ? grid[col * HB + other / 128]
						  : grid[other / 128 * CB + col];
				size_t i = (size_t)r * (t == 2 ? H : F) + c;
				float want = (float)ref_e4m3(w[i]) * sc; /* one float32 product */
				bad += !(got[i] == want || (isnan(got[i]) && isnan(want)));
			}
		CHECK(!bad, "fp8 dequant tensor %u: %zu of %d elements wrong", t, bad, H * F);
	}
}

int main(void)
{
	test_e4m3();
	test_fp8_dequant();
	test_kernels();
	test_rows();
	test_f16_to_f32();
	test_to_f32();
	return test_result("test_mlp");
}
