/* dp_spsc.h: a single-producer single-consumer ring of pointers between two agents
 * (dispatcher -> NIC worker, agent -> control, control -> dispatcher).
 *
 * Same discipline as the shared-memory ring: free-running head (producer) and
 * tail (consumer) on their own cache lines, release stores, acquire loads. A push
 * kicks the consumer's runner if it parks on another thread (dp_waker.h).
 */
#ifndef DP_SPSC_H
#define DP_SPSC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "dp_barrier.h"
#include "dp_common.h"
#include "dp_waker.h"

struct dp_spsc {
	uint64_t head dp_cache_aligned; /* producer writes */
	uint64_t tail dp_cache_aligned; /* consumer writes */
	uint32_t mask dp_cache_aligned; /* set once */
	void **slots;
	struct dp_waker *consumer; /* set once, before the threads start; NULL: same thread */
};

static inline int dp_spsc_init(struct dp_spsc *r, uint32_t capacity)
{
	if (capacity == 0 || (capacity & (capacity - 1))) {
		dp_set_error("ring capacity %u is not a power of two", capacity);
		return -1;
	}
	r->head = r->tail = 0;
	r->consumer = NULL;
	r->mask = capacity - 1;
	r->slots = calloc(capacity, sizeof(void *));
	if (!r->slots) {
		dp_set_error("out of memory for a ring of %u", capacity);
		return -1;
	}
	return 0;
}

static inline void dp_spsc_free(struct dp_spsc *r)
{
	free(r->slots);
	r->slots = NULL;
}

/* Producer: returns how many of n went in. */
static inline uint32_t dp_spsc_push(struct dp_spsc *r, void *const *objs, uint32_t n)
{
	uint64_t head = dp_load_relaxed_u64(&r->head);
	/* acquire: the consumer is done with the entries it freed */
	uint64_t tail = dp_load_acquire_u64(&r->tail);
	uint32_t space = r->mask + 1 - (uint32_t)(head - tail);
	if (n > space)
		n = space;
	for (uint32_t i = 0; i < n; i++)
		r->slots[(head + i) & r->mask] = objs[i];
	/* release: entries (and what they point to) are visible before the head */
	dp_store_release_u64(&r->head, head + n);
	if (n)
		dp_waker_kick(r->consumer);
	return n;
}

/* Consumer: returns how many (up to n) came out. */
static inline uint32_t dp_spsc_pop(struct dp_spsc *r, void **objs, uint32_t n)
{
	uint64_t tail = dp_load_relaxed_u64(&r->tail);
	/* acquire: pairs with the producer's release of head */
	uint64_t head = dp_load_acquire_u64(&r->head);
	uint32_t avail = (uint32_t)(head - tail);
	if (n > avail)
		n = avail;
	for (uint32_t i = 0; i < n; i++)
		objs[i] = r->slots[(tail + i) & r->mask];
	/* release: our reads are done before the producer may overwrite */
	dp_store_release_u64(&r->tail, tail + n);
	return n;
}

/* Consumer: is anything waiting? (acquire: the caller goes on to pop it) */
static inline bool dp_spsc_empty(struct dp_spsc *r)
{
	return dp_load_acquire_u64(&r->head) == dp_load_relaxed_u64(&r->tail);
}

#endif /* DP_SPSC_H */
