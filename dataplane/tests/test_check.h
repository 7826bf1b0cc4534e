/* test_check.h: the checks every C unit test shares (one TU each, so static is fine). */
#ifndef TEST_CHECK_H
#define TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>

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
static inline float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) * 0x1.0p-52 - 1.0);
}

static inline int test_result(const char *name)
{
	if (failures) {
		printf("%s: %d check(s) failed\n", name, failures);
		return 1;
	}
	printf("%s: all checks passed\n", name);
	return 0;
}

#endif /* TEST_CHECK_H */
