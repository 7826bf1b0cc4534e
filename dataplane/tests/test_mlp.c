/* test_mlp.c: the duck's kernels against a double-precision reference, and the
 * shared wire, reassembly, reduce and float16 helpers they rely on.
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_f16.h"
#include "dp_mlp.h"
#include "dp_reasm.h"
#include "dp_reduce.h"
#include "dp_wire.h"

static int failures;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			failures++;                                        \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			putchar('\n');                                     \
		}                                                          \
	} while (0)

static uint64_t rng = 0x243f6a8885a308d3ull;

/* Uniform in [-1, 1). */
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) * 0x1.0p-52 - 1.0);
}

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

static void test_f16(void)
{
	/* Every non-NaN half survives half -> float -> half. */
	int bad = 0;
	for (uint32_t b = 0; b < 65536 && bad < 3; b++) {
		uint16_t h = (uint16_t)b;
		if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff))
			continue; /* NaN */
		uint16_t back = dp_f32_to_f16(dp_f16_to_f32(h));
		if (back != h) {
			bad++;
			CHECK(0, "half 0x%04x came back as 0x%04x", h, back);
		}
	}
	CHECK(dp_f16_to_f32(0x3c00) == 1.0f, "0x3c00 is 1");
	CHECK(dp_f16_to_f32(0xc000) == -2.0f, "0xc000 is -2");
	CHECK(dp_f16_to_f32(0x7bff) == 65504.0f, "0x7bff is 65504");
	CHECK(dp_f16_to_f32(0x0001) == 0x1.0p-24f, "smallest subnormal");
	CHECK(dp_f32_to_f16(1.0f + 0x1.0p-11f) == 0x3c00, "a tie rounds to even (down)");
	CHECK(dp_f32_to_f16(1.0f + 3 * 0x1.0p-11f) == 0x3c02, "a tie rounds to even (up)");
	CHECK(dp_f32_to_f16(1e6f) == 0x7c00, "overflow gives +inf");
	float nan_back = dp_f16_to_f32(dp_f32_to_f16(NAN));
	CHECK(isnan(nan_back), "NaN stays NaN");
}

static void test_reduce(void)
{
	CHECK(dp_dtype_size(DP_DTYPE_F32) == 4 && dp_dtype_size(DP_DTYPE_F16) == 2 &&
		      dp_dtype_size(0) == 0 && dp_dtype_size(3) == 0,
	      "dtype sizes");

	float acc[6] = { 1, 1, 1, 1, 1, 1 };
	uint8_t src[1 + 3 * 4]; /* deliberately misaligned by one byte */
	float vals[3] = { 0.5f, -2.0f, 4.0f };
	memcpy(src + 1, vals, sizeof(vals));
	dp_accumulate(acc, 2, src + 1, 3, DP_DTYPE_F32);
	CHECK(acc[0] == 1 && acc[1] == 1 && acc[2] == 1.5f && acc[3] == -1 && acc[4] == 5 &&
		      acc[5] == 1,
	      "f32 accumulate at offset 2: %g %g %g %g %g %g", acc[0], acc[1], acc[2], acc[3],
	      acc[4], acc[5]);

	uint16_t h16[2] = { dp_f32_to_f16(0.25f), dp_f32_to_f16(-1.0f) };
	uint8_t src16[1 + sizeof(h16)];
	memcpy(src16 + 1, h16, sizeof(h16));
	dp_accumulate(acc, 0, src16 + 1, 2, DP_DTYPE_F16);
	CHECK(acc[0] == 1.25f && acc[1] == 0 && acc[2] == 1.5f, "f16 accumulate: %g %g %g",
	      acc[0], acc[1], acc[2]);

	float other[6] = { 1, 2, 3, 4, 5, 6 };
	dp_accumulate_f32(acc, other, 6);
	CHECK(acc[0] == 2.25f && acc[5] == 7, "accumulate f32 arrays");

	/* store: 2 rows x 3 columns, bias per column */
	float a[6] = { 1, 2, 3, 4, 5, 6 }, bias[3] = { 0.5f, -1, 10 }, o32[6];
	dp_reduce_store(o32, a, bias, 2, 3, DP_DTYPE_F32);
	CHECK(o32[0] == 1.5f && o32[1] == 1 && o32[2] == 13 && o32[3] == 4.5f && o32[5] == 16,
	      "f32 store with bias");
	uint16_t o16[6];
	dp_reduce_store(o16, a, bias, 2, 3, DP_DTYPE_F16);
	CHECK(dp_f16_to_f32(o16[0]) == 1.5f && dp_f16_to_f32(o16[4]) == 4.0f &&
		      dp_f16_to_f32(o16[5]) == 16.0f,
	      "f16 store with bias");
	dp_reduce_store(o16, a, NULL, 2, 3, DP_DTYPE_F16);
	CHECK(dp_f16_to_f32(o16[2]) == 3.0f, "f16 store without bias");
	dp_reduce_store(a, a, NULL, 2, 3, DP_DTYPE_F32);
	CHECK(a[0] == 1 && a[5] == 6, "f32 store in place");
}

static void test_reasm(void)
{
	static struct dp_reasm r;
	uint32_t miss[8];
	dp_reasm_reset(&r, 5);
	CHECK(!dp_reasm_complete(&r), "empty message complete");
	CHECK(dp_reasm_mark(&r, 0) == 1, "new chunk 0");
	CHECK(dp_reasm_mark(&r, 3) == 1, "new chunk 3");
	CHECK(dp_reasm_mark(&r, 3) == 0, "duplicate chunk 3");
	CHECK(dp_reasm_mark(&r, 5) == -1, "chunk 5 of 5");
	CHECK(dp_reasm_mark(&r, UINT32_MAX) == -1, "chunk 2^32-1");
	CHECK(r.have == 2, "have %u", r.have);
	uint32_t n = dp_reasm_missing(&r, miss, 8);
	CHECK(n == 3 && miss[0] == 1 && miss[1] == 2 && miss[2] == 4, "missing 1 2 4, got %u", n);
	CHECK(dp_reasm_missing(&r, miss, 2) == 2 && miss[1] == 2, "missing list capped");
	dp_reasm_mark(&r, 1);
	dp_reasm_mark(&r, 2);
	CHECK(!dp_reasm_complete(&r), "complete with 4 of 5");
	dp_reasm_mark(&r, 4);
	CHECK(dp_reasm_complete(&r), "incomplete with 5 of 5");
	CHECK(dp_reasm_missing(&r, miss, 8) == 0, "missing after complete");

	/* Across words, at the largest size, and reset clearing the last use. */
	dp_reasm_reset(&r, DP_REASM_MAX_CHUNKS);
	CHECK(dp_reasm_mark(&r, 64) == 1 && dp_reasm_mark(&r, DP_REASM_MAX_CHUNKS - 1) == 1,
	      "marks in later words");
	CHECK(dp_reasm_mark(&r, 63) == 1 && dp_reasm_mark(&r, 64) == 0, "word boundary");
	dp_reasm_reset(&r, 100);
	CHECK(dp_reasm_mark(&r, 64) == 1 && dp_reasm_mark(&r, 63) == 1, "reset clears bits");
	CHECK(dp_reasm_missing(&r, miss, 1) == 1 && miss[0] == 0, "first missing is 0");
}

static void hdr(struct dp_wire_header *h, uint8_t op)
{
	dp_wire_init(h, op, 1, 2);
	h->chunks = 2;
	h->chunk = 1;
	h->total = 100;
	h->offset = 60;
	h->length = 40;
}

static void test_wire(void)
{
	static uint8_t buf[DP_WIRE_HDR_LEN + 128] __attribute__((aligned(8)));
	struct dp_wire_header *h = (void *)buf;
	size_t len = DP_WIRE_HDR_LEN + 40;

	hdr(h, DP_WIRE_OP_FORWARD);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_OK, "a good FORWARD");
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN - 1) == DP_WIRE_SHORT, "short");
	CHECK(dp_wire_check(buf, 0) == DP_WIRE_SHORT, "empty");
	h->magic ^= 1;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_MAGIC, "bad magic");
	hdr(h, DP_WIRE_OP_FORWARD);
	h->version = DP_WIRE_VERSION + 1;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_VERSION, "bad version");
	hdr(h, 0);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_OP, "op 0");
	hdr(h, DP_WIRE_OP_LAYER + 1);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_OP, "op past LAYER");
	hdr(h, DP_WIRE_OP_FORWARD);
	CHECK(dp_wire_check(buf, len + 1) == DP_WIRE_BAD_LENGTH, "length mismatch");
	h->length = UINT32_MAX;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "length 2^32-1");
	hdr(h, DP_WIRE_OP_PARTIAL);
	h->chunk = 2;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "chunk == chunks");
	h->chunk = 0;
	h->chunks = 0;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "zero chunks");
	hdr(h, DP_WIRE_OP_WEIGHT);
	h->offset = 61;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "offset + length > total");
	h->offset = 101;
	h->length = 0;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN) == DP_WIRE_BAD_LENGTH, "offset > total");
	h->offset = UINT64_MAX - 10;
	h->length = 40;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "offset near 2^64");
	hdr(h, DP_WIRE_OP_NACK);
	h->length = 6;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 6) == DP_WIRE_BAD_LENGTH, "NACK of 6 bytes");
	h->length = 8;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 8) == DP_WIRE_OK, "NACK of 2 chunks");
	hdr(h, DP_WIRE_OP_LAYER);
	h->length = sizeof(struct dp_wire_layer);
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + h->length) == DP_WIRE_OK, "LAYER");
	h->length = 12;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 12) == DP_WIRE_BAD_LENGTH, "LAYER of 12 bytes");
	dp_wire_init(h, DP_WIRE_OP_PING, 5, 6);
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN) == DP_WIRE_OK, "PING");
	CHECK(h->session == 5 && h->epoch == 6 && h->chunks == 0, "init fields");
	CHECK(!strcmp(dp_wire_verdict_name(DP_WIRE_BAD_MAGIC), "bad_magic") &&
		      !strcmp(dp_wire_verdict_name((enum dp_wire_verdict)42), "unknown"),
	      "verdict names");

	CHECK(dp_wire_payload_max(1500) == 1392, "payload at 1500: %u", dp_wire_payload_max(1500));
	CHECK(dp_wire_payload_max(9000) == 8892, "payload at 9000: %u", dp_wire_payload_max(9000));
	CHECK(dp_wire_payload_max(65536) + DP_WIRE_HDR_LEN <= DP_WIRE_MAX_DATAGRAM,
	      "payload at 65536: %u", dp_wire_payload_max(65536));
	CHECK(dp_wire_payload_max(1501) % 4 == 0, "payload rounds to floats");
	CHECK(dp_wire_chunk_count(0, 1392) == 1, "zero bytes is one chunk");
	CHECK(dp_wire_chunk_count(1392, 1392) == 1 && dp_wire_chunk_count(1393, 1392) == 2,
	      "chunk count at the boundary");
	CHECK(dp_wire_chunk_len(1393, 1392, 0) == 1392 && dp_wire_chunk_len(1393, 1392, 1) == 1 &&
		      dp_wire_chunk_len(1393, 1392, 2) == 0,
	      "chunk lengths");
	CHECK(dp_wire_chunk_len(2784, 1392, 1) == 1392, "last full chunk");
}

int main(void)
{
	test_kernels();
	test_f16();
	test_reduce();
	test_reasm();
	test_wire();
	if (failures) {
		printf("test_mlp: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_mlp: all checks passed\n");
	return 0;
}
