/* dp_inbox.c: the rte_ring side of a NIC worker's inbox (dp_inbox.h), and its init.
 * Built with DPDK's flags when the build has DPDK (DP_HAVE_DPDK), else without it: then
 * only the spsc kind exists and asking for an rte_ring is an error. */
#include "dp_inbox.h"

#include <stdio.h>
#include <string.h>

#include "dp_common.h"

#ifdef DP_HAVE_DPDK
/* The C11 flavour of the ring's head/tail updates (rte_ring_c11_pvt.h: acquire loads,
 * release stores) rather than x86's default (volatile accesses and compiler barriers,
 * rte_ring_generic_pvt.h): the same instructions on x86, and ones ThreadSanitizer
 * understands, so that the TSan build checks the code that runs. Only this file
 * touches the ring, from both ends, so nothing mixes the two flavours. */
#define RTE_USE_C11_MEM_MODEL 1
#include <rte_errno.h>
#include <rte_memory.h>
#include <rte_ring.h>

uint32_t dp_inbox_ring_enqueue(void *ring, void *const *objs, uint32_t n)
{
	return rte_ring_enqueue_burst(ring, objs, n, NULL);
}

uint32_t dp_inbox_ring_dequeue(void *ring, void **objs, uint32_t n)
{
	return rte_ring_dequeue_burst(ring, objs, n, NULL);
}

/* rte_ring_empty with explicit atomics (it reads the tails plainly): acquire on the
 * producer's tail, which the consumer goes on to dequeue behind */
bool dp_inbox_ring_empty(void *ring)
{
	struct rte_ring *r = ring;
	uint32_t cons = __atomic_load_n(&r->cons.tail, __ATOMIC_RELAXED);
	return __atomic_load_n(&r->prod.tail, __ATOMIC_ACQUIRE) == cons;
}

static int ring_init(struct dp_inbox *q, uint32_t capacity, const char *name)
{
	/* EXACT_SZ: room for exactly `capacity` (a plain ring of count N holds N - 1) */
	struct rte_ring *r = rte_ring_create(name, capacity, SOCKET_ID_ANY,
					     RING_F_SP_ENQ | RING_F_SC_DEQ | RING_F_EXACT_SZ);
	if (!r) {
		dp_set_error("rte_ring_create(%s, %u): %s (err=%d)", name, capacity,
			     rte_strerror(rte_errno), rte_errno);
		return -1;
	}
	q->ring = r;
	return 0;
}

static void ring_free(struct dp_inbox *q)
{
	rte_ring_free(q->ring);
}
#else
uint32_t dp_inbox_ring_enqueue(void *ring, void *const *objs, uint32_t n)
{
	(void)ring, (void)objs, (void)n;
	return 0;
}

uint32_t dp_inbox_ring_dequeue(void *ring, void **objs, uint32_t n)
{
	(void)ring, (void)objs, (void)n;
	return 0;
}

bool dp_inbox_ring_empty(void *ring)
{
	(void)ring;
	return true;
}

static int ring_init(struct dp_inbox *q, uint32_t capacity, const char *name)
{
	(void)q, (void)capacity;
	dp_set_error("inbox %s: an rte_ring needs a build with DPDK", name);
	return -1;
}

static void ring_free(struct dp_inbox *q)
{
	(void)q;
}
#endif

int dp_inbox_init(struct dp_inbox *q, enum dp_inbox_kind kind, uint32_t capacity,
		  const char *name)
{
	memset(q, 0, sizeof(*q));
	if (kind == DP_INBOX_RTE_RING)
		return ring_init(q, capacity, name);
	return dp_spsc_init(&q->spsc, capacity);
}

void dp_inbox_free(struct dp_inbox *q)
{
	if (q->ring)
		ring_free(q);
	q->ring = NULL;
	dp_spsc_free(&q->spsc);
}

const char *dp_inbox_kind_name(const struct dp_inbox *q)
{
	return q->ring ? "rte_ring" : "spsc ring";
}
