/* test_reduce.c: float16 conversions and the host's reduce (accumulate, store, bias).
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
	for (int dt = 0; dt < 2; dt++) {
		uint8_t dtype = dt ? DP_DTYPE_F16 : DP_DTYPE_F32;
		for (size_t li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++)
			for (uint32_t mis = 0; mis < 4; mis++)
				for (uint64_t first = 0; first <= FIRST_MAX; first++) {
					uint32_t n = lengths[li];
					for (size_t i = 0; i < sizeof(acc_ref) / 4; i++)
						acc_ref[i] = acc_vec[i] = any_f32();
					for (uint32_t i = 0; i < n; i++) {
						if (dt) {
							uint16_t h = any_f16();
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
						      name, dt ? "f16" : "f32", n, mis,
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
	for (int dt = 0; dt < 2; dt++) {
		uint8_t dtype = dt ? DP_DTYPE_F16 : DP_DTYPE_F32;
		for (int i = 0; i < 40; i++)
			acc[i] = ref[i] = any_f32();
		for (int i = 0; i < 37; i++) {
			uint16_t h = any_f16() & 0x7bff; /* finite */
			float f = dt ? dp_f16_to_f32(h) : (float)(i - 18) * 0.37f;
			if (dt)
				memcpy(src + 3 + 2 * i, &h, 2);
			else
				memcpy(src + 3 + 4 * i, &f, 4);
			ref[2 + i] = 0.0f;
		}
		dp_accumulate_scalar(ref, 2, src + 3, 37, dtype);
		dp_reduce_first_scalar(acc, 2, src + 3, 37, dtype);
		CHECK(!memcmp(acc, ref, sizeof(acc)), "%s: first = zeros + accumulate, nothing else "
		      "touched", dt ? "f16" : "f32");
	}
	float neg = -0.0f;
	float one = 1.0f;
	dp_reduce_first_scalar(&one, 0, &neg, 1, DP_DTYPE_F32);
	CHECK(signbit(one) && one == 0.0f, "-0.0 stored as -0.0");
}

typedef void (*store_fn)(void *, const float *, const float *, uint32_t, uint32_t, uint8_t);

static void compare_store(const char *name, store_fn fn)
{
	enum { ROWS = 3, MAX_HIDDEN = 41 };
	static float acc[ROWS * MAX_HIDDEN + 1], bias[MAX_HIDDEN + 1];
	static uint8_t ref[4 * ROWS * MAX_HIDDEN + 8], vec[4 * ROWS * MAX_HIDDEN + 8];
	int bad = 0;
	for (int round = 0; round < 200; round++)
		for (uint32_t hidden = 1; hidden <= MAX_HIDDEN; hidden += round % 2 ? 1 : 7)
			for (int dt = 0; dt < 2; dt++)
				for (int with_bias = 0; with_bias < 2; with_bias++) {
					uint8_t dtype = dt ? DP_DTYPE_F16 : DP_DTYPE_F32;
					/* unaligned: acc one float in, bias one float in */
					for (size_t i = 0; i < sizeof(acc) / 4; i++)
						acc[i] = store_value();
					for (size_t i = 0; i < sizeof(bias) / 4; i++)
						bias[i] = store_value() * 0x1.0p-8f;
					memset(ref, 0xa5, sizeof(ref));
					memset(vec, 0xa5, sizeof(vec));
					const float *b = with_bias ? bias + 1 : NULL;
					dp_reduce_store_scalar(ref + 2, acc + 1, b, ROWS, hidden, dtype);
					fn(vec + 2, acc + 1, b, ROWS, hidden, dtype);
					if (memcmp(ref, vec, sizeof(ref)) && bad++ < 3)
						CHECK(0, "%s: %s store hidden=%u bias=%d differs", name,
						      dt ? "f16" : "f32", hidden, with_bias);
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
	test_reduce();
	test_first_is_stored();
	test_vectors_match_scalar();
	return test_result("test_reduce");
}
