/* test_inbox.c: a NIC worker's inbox (dp_inbox.h), both kinds: the SPSC ring and, in a
 * build with DPDK, the rte_ring (an EAL started with --no-huge --no-shconf, so no
 * hugepages are needed; that part is skipped, saying why, if the EAL will not start).
 * Each: holds exactly its capacity, FIFO bursts, empty, a push kicks a parked consumer
 * (and only then, and only when something went in), two threads lose nothing.
 * Exit 0 pass, 1 fail. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_inbox.h"
#include "dp_waker.h"

#ifdef DP_HAVE_DPDK
#include <rte_eal.h>
#include <rte_errno.h>
#endif

static int failures;
#define CHECK(cond)                                                                       \
	do {                                                                              \
		if (!(cond)) {                                                            \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                       \
		}                                                                         \
	} while (0)

#define CAP 16
#define HAMMER 200000

static void *val(uintptr_t i)
{
	return (void *)(i + 1);
}

/* 1 if the waker's eventfd was kicked since the last call (and clears it). */
static int kicked(struct dp_waker *wk)
{
	uint64_t v;
	return read(wk->efd, &v, sizeof(v)) == sizeof(v);
}

static void test_bursts_capacity_and_kicks(enum dp_inbox_kind kind, const char *name)
{
	struct dp_inbox q;
	struct dp_waker wk;
	CHECK(dp_inbox_init(&q, kind, CAP, name) == 0);
	CHECK(dp_waker_init(&wk) == 0);
	q.consumer = &wk;
	void *in[CAP + 4], *out[CAP + 4];
	for (uintptr_t i = 0; i < CAP + 4; i++)
		in[i] = val(i);
	CHECK(dp_inbox_empty(&q));
	/* awake consumer: no kick */
	CHECK(dp_inbox_push(&q, in, 3) == 3);
	CHECK(!kicked(&wk));
	CHECK(!dp_inbox_empty(&q));
	/* exactly CAP fit (an rte_ring of count N would hold N - 1 without EXACT_SZ) */
	CHECK(dp_inbox_push(&q, in + 3, CAP + 1) == CAP - 3);
	dp_waker_arm(&wk); /* parked from here on */
	CHECK(dp_inbox_push(&q, in, 1) == 0);
	CHECK(!kicked(&wk)); /* nothing went in: no kick */
	CHECK(dp_inbox_pop(&q, out, CAP + 4) == CAP);
	for (uintptr_t i = 0; i < CAP; i++)
		CHECK(out[i] == val(i));
	CHECK(dp_inbox_empty(&q));
	CHECK(dp_inbox_push(&q, in, 2) == 2);
	CHECK(kicked(&wk)); /* parked: one kick */
	dp_waker_disarm(&wk);
	CHECK(dp_inbox_pop(&q, out, 1) == 1 && out[0] == val(0));
	CHECK(dp_inbox_pop(&q, out, 8) == 1 && out[0] == val(1));
	CHECK(dp_inbox_pop(&q, out, 8) == 0);
	dp_waker_fini(&wk);
	dp_inbox_free(&q);
}

static struct dp_inbox hammered;

static void *producer(void *arg)
{
	(void)arg;
	void *burst[8];
	uintptr_t next = 0;
	while (next < HAMMER) {
		uint32_t n = (uint32_t)(next % 8) + 1;
		if (next + n > HAMMER)
			n = (uint32_t)(HAMMER - next);
		for (uint32_t k = 0; k < n; k++)
			burst[k] = val(next + k);
		uint32_t pushed = dp_inbox_push(&hammered, burst, n);
		next += pushed;
		if (pushed == 0)
			sched_yield(); /* full: see test_two_threads_lose_nothing */
	}
	return NULL;
}

static void test_two_threads_lose_nothing(enum dp_inbox_kind kind, const char *name)
{
	CHECK(dp_inbox_init(&hammered, kind, CAP, name) == 0);
	pthread_t t;
	pthread_create(&t, NULL, producer, NULL);
	uintptr_t expect = 0;
	int bad = 0;
	while (expect < HAMMER && !bad) {
		void *out[CAP];
		uint32_t n = dp_inbox_pop(&hammered, out, CAP);
		for (uint32_t k = 0; k < n; k++)
			bad |= out[k] != val(expect++);
		/* After rte_eal_init (-l 0) this thread and the producer it starts share CPU 0:
		 * a side that cannot move yields the core, else each hand-over costs a timeslice
		 * (minutes for the whole hammer on a loaded machine). */
		if (n == 0)
			sched_yield();
	}
	CHECK(!bad);
	pthread_join(t, NULL);
	CHECK(dp_inbox_empty(&hammered));
	dp_inbox_free(&hammered);
}

int main(void)
{
	test_bursts_capacity_and_kicks(DP_INBOX_SPSC, "spsc");
	test_two_threads_lose_nothing(DP_INBOX_SPSC, "spsc");
	CHECK(strcmp(dp_inbox_kind_name(&hammered), "spsc ring") == 0);
#ifdef DP_HAVE_DPDK
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "dp-test-inbox-%d", getpid());
	/* --no-huge (malloc'd memory; it rules out --in-memory), --no-shconf: no files */
	char *argv[] = { "test_inbox", "--no-huge", "--no-shconf", "--no-pci", "--no-telemetry",
			 "-l", "0", "-m", "32", "--log-level=lib.eal:error", "--file-prefix",
			 prefix, NULL };
	if (rte_eal_init((int)(sizeof(argv) / sizeof(argv[0])) - 1, argv) < 0) {
		printf("test_inbox: rte_ring part skipped: rte_eal_init failed (err=%d)\n", rte_errno);
	} else {
		test_bursts_capacity_and_kicks(DP_INBOX_RTE_RING, "dp_test_in_a");
		test_two_threads_lose_nothing(DP_INBOX_RTE_RING, "dp_test_in_b");
		struct dp_inbox q;
		CHECK(dp_inbox_init(&q, DP_INBOX_RTE_RING, CAP, "dp_test_in_c") == 0);
		CHECK(strcmp(dp_inbox_kind_name(&q), "rte_ring") == 0);
		dp_inbox_free(&q);
		rte_eal_cleanup();
	}
	/* the EAL's runtime directory, empty with --no-shconf (/var/run/dpdk as root) */
	char dir[256];
	const char *base = getenv("XDG_RUNTIME_DIR");
	snprintf(dir, sizeof(dir), "%s/dpdk/%s", getuid() == 0 || !base ? "/var/run" : base,
		 prefix);
	(void)rmdir(dir);
#else
	struct dp_inbox q;
	CHECK(dp_inbox_init(&q, DP_INBOX_RTE_RING, CAP, "x") == -1); /* no DPDK: refused */
	printf("test_inbox: a build without DPDK: the rte_ring kind is refused, as it should\n");
#endif
	if (failures) {
		fprintf(stderr, "test_inbox: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_inbox: all checks passed\n");
	return 0;
}
