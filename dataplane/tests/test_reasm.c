/* test_reasm.c: chunk bitmaps: new, duplicate, out of range, complete, missing lists.
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_reasm.h"
#include "test_check.h"

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

int main(void)
{
	test_reasm();
	return test_result("test_reasm");
}
