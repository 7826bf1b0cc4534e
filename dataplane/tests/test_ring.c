/* test_ring.c: the shared-memory descriptor ring (dp_ring.h) and the agents' pointer
 * ring (dp_spsc.h): empty, full, wrap-around, and two threads hammering each.
 * Exit 0 pass, 1 fail. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_ring.h"
#include "dp_spsc.h"

static int failures;
#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                              \
		}                                                                \
	} while (0)

#define CAP 8
#define HAMMER 200000

static struct dp_ring_header ring __attribute__((aligned(64)));
static struct dp_desc descs[CAP];

static void test_empty_full_and_wrap(void)
{
	struct dp_desc d, out;
	memset(&ring, 0, sizeof(ring));
	memset(&d, 0, sizeof(d));
	CHECK(dp_ring_pop(&ring, descs, CAP, &out) == -1);
	CHECK(dp_ring_count(&ring) == 0);
	for (uint32_t i = 0; i < CAP; i++) {
		d.forward_id = i + 1;
		CHECK(dp_ring_push(&ring, descs, CAP, &d) == 0);
	}
	CHECK(dp_ring_push(&ring, descs, CAP, &d) == -1); /* full */
	CHECK(dp_ring_count(&ring) == CAP);
	uint64_t want = 1;
	for (uint32_t round = 0; round < 1000; round++) { /* free-running indices wrap the mask */
		CHECK(dp_ring_pop(&ring, descs, CAP, &out) == 0);
		CHECK(out.forward_id == want);
		want++;
		d.forward_id = want + CAP - 1;
		CHECK(dp_ring_push(&ring, descs, CAP, &d) == 0);
	}
	CHECK(ring.head == CAP + 1000 && ring.tail == 1000);
	struct dp_desc burst[CAP * 2];
	CHECK(dp_ring_pop_burst(&ring, descs, CAP, burst, CAP * 2) == CAP); /* short burst */
	for (uint32_t i = 0; i < CAP; i++)
		CHECK(burst[i].forward_id == want + i);
}

static void *ring_producer(void *arg)
{
	(void)arg;
	struct dp_desc d;
	memset(&d, 0, sizeof(d));
	for (uint64_t i = 1; i <= HAMMER;) {
		d.forward_id = i;
		d.layer = (uint32_t)(i * 7);
		if (dp_ring_push(&ring, descs, CAP, &d) == 0)
			i++;
	}
	return NULL;
}

static void test_two_threads_lose_nothing(void)
{
	pthread_t t;
	memset(&ring, 0, sizeof(ring));
	pthread_create(&t, NULL, ring_producer, NULL);
	struct dp_desc out[4];
	uint64_t want = 1;
	while (want <= HAMMER) {
		uint32_t n = dp_ring_pop_burst(&ring, descs, CAP, out, 4);
		for (uint32_t i = 0; i < n; i++, want++) {
			if (out[i].forward_id != want || out[i].layer != (uint32_t)(want * 7)) {
				fprintf(stderr, "descriptor %lu arrived as %lu\n", want, out[i].forward_id);
				failures++;
				want = HAMMER + 1;
				break;
			}
		}
	}
	pthread_join(t, NULL);
}

static struct dp_spsc spsc;

static void *spsc_producer(void *arg)
{
	(void)arg;
	for (uintptr_t i = 1; i <= HAMMER;) {
		void *p = (void *)i;
		i += dp_spsc_push(&spsc, &p, 1);
	}
	return NULL;
}

static void test_spsc(void)
{
	CHECK(dp_spsc_init(&spsc, 3) == -1); /* not a power of two */
	CHECK(dp_spsc_init(&spsc, 16) == 0);
	pthread_t t;
	pthread_create(&t, NULL, spsc_producer, NULL);
	uintptr_t want = 1;
	void *out[8];
	while (want <= HAMMER) {
		uint32_t n = dp_spsc_pop(&spsc, out, 8);
		for (uint32_t i = 0; i < n; i++, want++)
			if ((uintptr_t)out[i] != want) {
				fprintf(stderr, "pointer %lu arrived as %lu\n", want, (uintptr_t)out[i]);
				failures++;
				want = HAMMER + 1;
				break;
			}
	}
	pthread_join(t, NULL);
	dp_spsc_free(&spsc);
}

int main(void)
{
	test_empty_full_and_wrap();
	test_two_threads_lose_nothing();
	test_spsc();
	if (failures)
		fprintf(stderr, "test_ring: %d failures\n", failures);
	return failures ? 1 : 0;
}
