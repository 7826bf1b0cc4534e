/* dp_inbox.h: a NIC worker's inbox, the dispatcher -> worker queue of forward contexts
 * (struct dp_fwd *): one producer (the dispatcher), one consumer (the worker).
 *
 * Two implementations behind the same calls, chosen once at init:
 *   spsc      dp_spsc.h, for the socket and null backends (no DPDK in the build needed);
 *   rte_ring  for a dpdk NIC: rte_ring_create(RING_F_SP_ENQ | RING_F_SC_DEQ |
 *             RING_F_EXACT_SZ), used only through rte_ring_enqueue_burst /
 *             rte_ring_dequeue_burst (dp_inbox.c, built with DPDK's flags: the rest of
 *             the dataplane includes no DPDK header).
 * Both hold exactly `capacity` pointers: the dispatcher never has more contexts out.
 * Either way a push that put something in kicks the consumer's runner when it parks on
 * another thread (dp_waker_kick: io_uring's SQPOLL handshake, dp_waker.h); the rte_ring
 * publishes its tail with a release store (or a write barrier on x86) before the kick's
 * full fence, as dp_spsc does.
 */
#ifndef DP_INBOX_H
#define DP_INBOX_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_spsc.h"
#include "dp_waker.h"

enum dp_inbox_kind { DP_INBOX_SPSC, DP_INBOX_RTE_RING };

struct dp_inbox {
	struct dp_spsc spsc;       /* DP_INBOX_SPSC (its own consumer stays NULL) */
	void *ring;                /* DP_INBOX_RTE_RING: struct rte_ring *, else NULL */
	struct dp_waker *consumer; /* set once, before the threads start; NULL: same thread */
};

/* 0, or -1 with dp_error (DP_INBOX_RTE_RING needs the EAL up; name: the ring's). */
int dp_inbox_init(struct dp_inbox *q, enum dp_inbox_kind kind, uint32_t capacity,
		  const char *name);
void dp_inbox_free(struct dp_inbox *q);
const char *dp_inbox_kind_name(const struct dp_inbox *q);

/* the rte_ring side, out of line in dp_inbox.c (one call per burst) */
uint32_t dp_inbox_ring_enqueue(void *ring, void *const *objs, uint32_t n);
uint32_t dp_inbox_ring_dequeue(void *ring, void **objs, uint32_t n);
bool dp_inbox_ring_empty(void *ring);

/* Producer: a burst; returns how many of n went in. */
static inline uint32_t dp_inbox_push(struct dp_inbox *q, void *const *objs, uint32_t n)
{
	n = q->ring ? dp_inbox_ring_enqueue(q->ring, objs, n) : dp_spsc_push(&q->spsc, objs, n);
	if (n)
		dp_waker_kick(q->consumer);
	return n;
}

/* Consumer: a burst; returns how many (up to n) came out. */
static inline uint32_t dp_inbox_pop(struct dp_inbox *q, void **objs, uint32_t n)
{
	return q->ring ? dp_inbox_ring_dequeue(q->ring, objs, n) : dp_spsc_pop(&q->spsc, objs, n);
}

/* Consumer: is anything waiting? */
static inline bool dp_inbox_empty(struct dp_inbox *q)
{
	return q->ring ? dp_inbox_ring_empty(q->ring) : dp_spsc_empty(&q->spsc);
}

#endif /* DP_INBOX_H */
