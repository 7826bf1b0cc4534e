/* test_reduce.c: float16 and bfloat16 conversions and the host's reduce (accumulate, store, bias).
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_f16.h"
#include "dp_reduce.h"
#include "test_check.h"

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

/* float32 bits -> bfloat16 bits, as ml_dtypes 0.7.0 rounds them (numpy
 * `np.array(bits, np.uint32).view(np.float32).astype(ml_dtypes.bfloat16)`);
 * tests/client/test_bf16.py checks the same table against the installed ml_dtypes. */
static const struct {
	uint32_t f32;
	uint16_t bf16;
} bf16_table[] = {
	{ 0x00000000u, 0x0000 }, { 0x80000000u, 0x8000 }, /* zeros keep their sign */
	{ 0x3f800000u, 0x3f80 }, /* 1 */
	{ 0x3f808000u, 0x3f80 }, /* a tie rounds to even (down) */
	{ 0x3f818000u, 0x3f82 }, /* a tie rounds to even (up) */
	{ 0x3f808001u, 0x3f81 }, { 0x3f807fffu, 0x3f80 }, /* a hair either side of a tie */
	{ 0xbf818000u, 0xbf82 }, /* negative ties too */
	{ 0x00008000u, 0x0000 }, { 0x00018000u, 0x0002 }, /* subnormal ties, not flushed */
	{ 0x00000001u, 0x0000 }, { 0x0000c000u, 0x0001 }, { 0x807fffffu, 0x8080 },
	{ 0x007f8000u, 0x0080 }, /* the largest subnormals round up to the smallest normal */
	{ 0x7f7fffffu, 0x7f80 }, /* FLT_MAX overflows to inf */
	{ 0x7f7f7fffu, 0x7f7f }, /* just under halfway: the largest finite bfloat16 */
	{ 0x7f7f8000u, 0x7f80 }, /* halfway, odd lsb: up, to inf */
	{ 0x7f7e8000u, 0x7f7e }, /* halfway, even lsb: down */
	{ 0xff7f8000u, 0xff80 }, /* ... and to -inf */
	{ 0x7f800000u, 0x7f80 }, { 0xff800000u, 0xff80 }, /* infinities stay */
	{ 0x7f800001u, 0x7fc0 }, /* a NaN whose payload is below the kept bits: not inf */
	{ 0x7fc00000u, 0x7fc0 }, { 0xffffffffu, 0xffc0 }, /* all-ones would carry into the sign */
	{ 0x7fffffffu, 0x7fc0 }, { 0xff800001u, 0xffc0 },
	{ 0x477fe000u, 0x4780 }, { 0x4b7fffffu, 0x4b80 }, /* carries into the exponent */
};
enum { BF16_TABLE_N = sizeof(bf16_table) / sizeof(bf16_table[0]) };

typedef void (*store_fn)(void *, const float *, const float *, uint32_t, uint32_t, uint8_t);

/* The table through a store (one row of BF16_TABLE_N values: the vectors' lanes and
 * the scalar tail alike), with a bias of -0.0, the one float whose add changes nothing
 * (the store without a bias adds +0.0, which turns -0.0 into +0.0, as numpy does). */
static void check_bf16_table(const char *name, store_fn fn)
{
	float acc[BF16_TABLE_N], bias[BF16_TABLE_N];
	uint16_t out[BF16_TABLE_N];
	for (int i = 0; i < BF16_TABLE_N; i++) {
		memcpy(&acc[i], &bf16_table[i].f32, 4);
		bias[i] = -0.0f;
	}
	fn(out, acc, bias, 1, BF16_TABLE_N, DP_DTYPE_BF16);
	for (int i = 0; i < BF16_TABLE_N; i++)
		CHECK(out[i] == bf16_table[i].bf16, "%s: float32 0x%08x stored as bfloat16 0x%04x, "
		      "ml_dtypes says 0x%04x", name, bf16_table[i].f32, out[i], bf16_table[i].bf16);
}

static void test_bf16(void)
{
	/* Every non-NaN bfloat16 survives bfloat16 -> float -> bfloat16, and widens to the
	 * float32 with those top bits. */
	int bad = 0;
	for (uint32_t b = 0; b < 65536 && bad < 3; b++) {
		uint16_t h = (uint16_t)b;
		if ((h & 0x7f80) == 0x7f80 && (h & 0x007f))
			continue; /* NaN */
		float f = dp_bf16_to_f32(h);
		uint32_t u;
		memcpy(&u, &f, 4);
		uint16_t back = dp_f32_to_bf16(f);
		if (back != h || u != (uint32_t)h << 16) {
			bad++;
			CHECK(0, "bfloat16 0x%04x came back as 0x%04x (float32 0x%08x)", h, back, u);
		}
	}
	for (int i = 0; i < BF16_TABLE_N; i++) {
		float f;
		memcpy(&f, &bf16_table[i].f32, 4);
		uint16_t got = dp_f32_to_bf16(f);
		CHECK(got == bf16_table[i].bf16, "float32 0x%08x rounds to bfloat16 0x%04x, "
		      "ml_dtypes says 0x%04x", bf16_table[i].f32, got, bf16_table[i].bf16);
	}
	CHECK(dp_half_to_f32(0x3f80, DP_DTYPE_BF16) == 1.0f &&
		      dp_half_to_f32(0x3c00, DP_DTYPE_F16) == 1.0f &&
		      dp_f32_to_half(1.0f, DP_DTYPE_BF16) == 0x3f80 &&
		      dp_f32_to_half(1.0f, DP_DTYPE_F16) == 0x3c00,
	      "dp_half_to_f32 and dp_f32_to_half pick the dtype");
	check_bf16_table("scalar store", dp_reduce_store_scalar);
	check_bf16_table("dispatched store", dp_reduce_store);
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa_probe() == DP_REDUCE_ISA_AVX2)
		check_bf16_table("avx2 store", dp_reduce_store_avx2);
#endif

	/* 1 + 2^-8 is a bfloat16 tie: summed in float32 from two bfloat16 partials and
	 * rounded once it is 1 (even); rounded per partial it would not be. */
	uint16_t parts[2] = { 0x3f80, 0x3b80 }; /* 1 and 2^-8 */
	float acc[1];
	uint16_t out;
	dp_reduce_first(acc, 0, &parts[0], 1, DP_DTYPE_BF16);
	dp_accumulate(acc, 0, &parts[1], 1, DP_DTYPE_BF16);
	dp_reduce_store(&out, acc, NULL, 1, 1, DP_DTYPE_BF16);
	CHECK(acc[0] == 1.0f + 0x1.0p-8f && out == 0x3f80,
	      "bf16 partials sum in float32 (%a), stored to even (0x%04x)", (double)acc[0], out);
}

static void test_reduce(void)
{
	CHECK(dp_dtype_size(DP_DTYPE_F32) == 4 && dp_dtype_size(DP_DTYPE_F16) == 2 &&
		      dp_dtype_size(DP_DTYPE_BF16) == 2 && dp_dtype_size(0) == 0 &&
		      dp_dtype_size(DP_DTYPE_F8E4M3) == 1 && dp_dtype_size(5) == 0,
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

/* ---------------------------------------------- every vector version = the scalar one */

static uint32_t rand_bits(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

/* Any float but NaN (whose payload an add may take from either operand): normals of every
 * exponent, subnormals, zeros, infinities. */
static float any_f32(void)
{
	for (;;) {
		uint32_t b = rand_bits();
		if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu))
			continue;
		float f;
		memcpy(&f, &b, 4);
		return f;
	}
}

static uint16_t any_f16(void)
{
	for (;;) {
		uint16_t h = (uint16_t)rand_bits();
		if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff))
			continue;
		return h;
	}
}

/* Values whose float16 rounding is interesting: near float16's ties, its subnormals,
 * its overflow, or anything. */
static float store_value(void)
{
	switch (rand_bits() % 4) {
	case 0: /* a half plus exactly half an ulp (a tie), or a hair either side */
		return dp_f16_to_f32(any_f16() & 0x7bff) * (1.0f + 0x1.0p-11f) +
		       (float)((int)(rand_bits() % 3) - 1) * 0x1.0p-30f;
	case 1:
		return frand() * 0x1.0p-14f; /* float16 subnormals */
	case 2:
		return frand() * 70000.0f; /* around float16's largest, 65504 */
	default:
		return any_f32();
	}
}

/* A finite bfloat16 or an infinity, never NaN: its top 16 bits of any_f32. */
static uint16_t any_bf16(void)
{
	uint32_t u;
	float f = any_f32();
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

/* The dtypes the loops run over, by index: float32, float16, bfloat16. */
enum { N_DTYPES = 3 };
static const uint8_t dtypes[N_DTYPES] = { DP_DTYPE_F32, DP_DTYPE_F16, DP_DTYPE_BF16 };
static const char *const dtype_names[N_DTYPES] = { "f32", "f16", "bf16" };

static uint16_t any_half(uint8_t dtype)
{
	return dtype == DP_DTYPE_BF16 ? any_bf16() : any_f16();
}

/* Values whose bfloat16 rounding is interesting: exact ties (the dropped 16 bits
 * 0x8000) and a hair either side, bfloat16's subnormals, the largest finite values
 * (which round up to inf from halfway to the next power of two), NaNs of either sign
 * and any payload, or anything. */
static float store_value_bf16(void)
{
	uint32_t u = rand_bits(), top = u & 0xffff0000u;
	float f;
	switch (rand_bits() % 6) {
	case 0:
		u = top | (0x8000u + (uint32_t)((int)(rand_bits() % 3) - 1));
		break;
	case 1:
		u = (u & 0x807fffffu); /* float32 subnormals: bfloat16's, rounded */
		break;
	case 2:
		u = (u & 0x80000000u) | 0x7f7f0000u | (u & 0xffffu); /* up to FLT_MAX */
		break;
	case 3:
		u = (u & 0x80000000u) | 0x7f800000u | (u & 0x7fffffu) | 1u; /* NaN */
		break;
	default:
		memcpy(&f, &u, 4);
		return f;
	}
	memcpy(&f, &u, 4);
	return f;
}

typedef void (*accumulate_fn)(float *, uint64_t, const void *, uint32_t, uint8_t);

/* acc[first..first+n) += src at every byte misalignment of src, lengths around the
 * vector widths (tails of every length), compared with the scalar loop bit for bit. */
static void compare_with(const char *name, accumulate_fn ref, accumulate_fn fn)
{
	static const uint32_t lengths[] = { 0, 1, 3, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 47,
					    64, 100, 1000, 4099 };
	enum { MAX_N = 4099, FIRST_MAX = 3 };
	static float acc_ref[MAX_N + FIRST_MAX + 8], acc_vec[MAX_N + FIRST_MAX + 8];
	static uint8_t src[4 * MAX_N + 8];
	int bad = 0;
	for (int dt = 0; dt < N_DTYPES; dt++) {
		uint8_t dtype = dtypes[dt];
		for (size_t li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++)
			for (uint32_t mis = 0; mis < 4; mis++)
				for (uint64_t first = 0; first <= FIRST_MAX; first++) {
					uint32_t n = lengths[li];
					for (size_t i = 0; i < sizeof(acc_ref) / 4; i++)
						acc_ref[i] = acc_vec[i] = any_f32();
					for (uint32_t i = 0; i < n; i++) {
						if (dt) {
							uint16_t h = any_half(dtype);
							memcpy(src + mis + 2 * i, &h, 2);
						} else {
							float f = any_f32();
							memcpy(src + mis + 4 * i, &f, 4);
						}
					}
					ref(acc_ref, first, src + mis, n, dtype);
					fn(acc_vec, first, src + mis, n, dtype);
					if (memcmp(acc_ref, acc_vec, sizeof(acc_ref)) && bad++ < 3)
						CHECK(0, "%s: %s n=%u src+%u first=%lu differs from scalar",
						      name, dtype_names[dt], n, mis,
						      (unsigned long)first);
				}
	}
	CHECK(!bad, "%s: %d accumulates differ from the scalar loop", name, bad);
}

static void compare_accumulate(const char *name, accumulate_fn fn)
{
	compare_with(name, dp_accumulate_scalar, fn);
}

/* A chunk's first contribution is stored: the same bits as adding it to zeros, except
 * that -0.0 stays -0.0 (as numpy's sum of one array keeps it), and the vectors' bits are
 * the scalar loop's. */
static void test_first_is_stored(void)
{
	float acc[40], ref[40];
	uint8_t src[4 * 37 + 3];
	for (int dt = 0; dt < N_DTYPES; dt++) {
		uint8_t dtype = dtypes[dt];
		for (int i = 0; i < 40; i++)
			acc[i] = ref[i] = any_f32();
		for (int i = 0; i < 37; i++) {
			/* finite */
			uint16_t h = dtype == DP_DTYPE_BF16 ? any_bf16() & 0x7f7f : any_f16() & 0x7bff;
			float f = dt ? dp_half_to_f32(h, dtype) : (float)(i - 18) * 0.37f;
			if (dt)
				memcpy(src + 3 + 2 * i, &h, 2);
			else
				memcpy(src + 3 + 4 * i, &f, 4);
			ref[2 + i] = 0.0f;
		}
		dp_accumulate_scalar(ref, 2, src + 3, 37, dtype);
		dp_reduce_first_scalar(acc, 2, src + 3, 37, dtype);
		CHECK(!memcmp(acc, ref, sizeof(acc)), "%s: first = zeros + accumulate, nothing else "
		      "touched", dtype_names[dt]);
	}
	float neg = -0.0f;
	float one = 1.0f;
	dp_reduce_first_scalar(&one, 0, &neg, 1, DP_DTYPE_F32);
	CHECK(signbit(one) && one == 0.0f, "-0.0 stored as -0.0");
}

static void compare_store(const char *name, store_fn fn)
{
	enum { ROWS = 3, MAX_HIDDEN = 41 };
	static float acc[ROWS * MAX_HIDDEN + 1], bias[MAX_HIDDEN + 1];
	static uint8_t ref[4 * ROWS * MAX_HIDDEN + 8], vec[4 * ROWS * MAX_HIDDEN + 8];
	int bad = 0;
	for (int round = 0; round < 200; round++)
		for (uint32_t hidden = 1; hidden <= MAX_HIDDEN; hidden += round % 2 ? 1 : 7)
			for (int dt = 0; dt < N_DTYPES; dt++)
				for (int with_bias = 0; with_bias < 2; with_bias++) {
					uint8_t dtype = dtypes[dt];
					int bf = dtype == DP_DTYPE_BF16;
					/* unaligned: acc one float in, bias one float in */
					for (size_t i = 0; i < sizeof(acc) / 4; i++)
						acc[i] = bf ? store_value_bf16() : store_value();
					/* bfloat16: a bias of zeros half the time, so that ties
					 * and NaNs reach the rounding as they are */
					for (size_t i = 0; i < sizeof(bias) / 4; i++)
						bias[i] = bf && round % 2 ? 0.0f
									  : store_value() * 0x1.0p-8f;
					memset(ref, 0xa5, sizeof(ref));
					memset(vec, 0xa5, sizeof(vec));
					const float *b = with_bias ? bias + 1 : NULL;
					dp_reduce_store_scalar(ref + 2, acc + 1, b, ROWS, hidden, dtype);
					fn(vec + 2, acc + 1, b, ROWS, hidden, dtype);
					if (memcmp(ref, vec, sizeof(ref)) && bad++ < 3)
						CHECK(0, "%s: %s store hidden=%u bias=%d differs", name,
						      dtype_names[dt], hidden, with_bias);
				}
	CHECK(!bad, "%s: %d stores differ from the scalar loop", name, bad);

	/* float32 in place (out == acc), with a bias */
	float a_ref[2 * 19], a_vec[2 * 19];
	for (size_t i = 0; i < 2 * 19; i++)
		a_ref[i] = a_vec[i] = store_value();
	dp_reduce_store_scalar(a_ref, a_ref, bias, 2, 19, DP_DTYPE_F32);
	fn(a_vec, a_vec, bias, 2, 19, DP_DTYPE_F32);
	CHECK(!memcmp(a_ref, a_vec, sizeof(a_ref)), "%s: f32 store in place with bias", name);
}

static void test_vectors_match_scalar(void)
{
	compare_accumulate("v4", dp_accumulate_v4);
	compare_accumulate("dispatched", dp_accumulate);
	compare_store("dispatched", dp_reduce_store);
	compare_with("first, dispatched", dp_reduce_first_scalar, dp_reduce_first);
#ifdef DP_REDUCE_X86
	if (dp_reduce_isa_probe() == DP_REDUCE_ISA_AVX2) {
		CHECK(dp_reduce_isa() == DP_REDUCE_ISA_AVX2, "AVX2 is picked where the CPU has it");
		compare_accumulate("avx2", dp_accumulate_avx2);
		compare_store("avx2", dp_reduce_store_avx2);
		compare_with("first, avx2", dp_reduce_first_scalar, dp_reduce_first_avx2);
		float x[37], y[37], z[37];
		for (int i = 0; i < 37; i++)
			x[i] = y[i] = any_f32(), z[i] = any_f32();
		dp_accumulate_f32_scalar(x + 1, z + 1, 35);
		dp_accumulate_f32_avx2(y + 1, z + 1, 35);
		CHECK(!memcmp(x, y, sizeof(x)), "avx2: accumulate f32 arrays (unaligned, tail)");
	} else {
		printf("test_reduce: this CPU has no AVX2 + F16C: their versions not checked\n");
	}
#endif
}

int main(void)
{
	test_f16();
	test_bf16();
	test_reduce();
	test_first_is_stored();
	test_vectors_match_scalar();
	return test_result("test_reduce");
}
