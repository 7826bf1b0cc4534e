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

int main(void)
{
	test_f16();
	test_reduce();
	return test_result("test_reduce");
}
