/* dp_ring.h: the single-producer single-consumer descriptor ring.
 *
 * head and tail are free-running uint64_t, masked only on access, each on its
 * own cache line (struct dp_ring_header). The producer (a client) owns head,
 * the consumer (the dataplane) owns tail. Shared by the dataplane and the cffi
 * module, so Python never orders memory by hand.
 */
#ifndef DP_RING_H
#define DP_RING_H

#include <stdint.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_barrier.h"
#include "dp_wake.h"

/* Descriptors the consumer has not taken yet. */
static inline uint32_t dp_ring_count(const struct dp_ring_header *r)
{
	/* acquire on both: a caller may act on what the count promises */
	return (uint32_t)(dp_load_acquire_u64(&r->head) - dp_load_acquire_u64(&r->tail));
}

/* Producer: copy up to n descriptors in; returns how many went in (0 if full). */
static inline uint32_t dp_ring_push_burst(struct dp_ring_header *r, struct dp_desc *descs,
					  uint32_t capacity, const struct dp_desc *in, uint32_t n)
{
	uint64_t head = dp_load_relaxed_u64(&r->head);
	/* acquire: the consumer has finished reading the entries it freed */
	uint64_t tail = dp_load_acquire_u64(&r->tail);
	uint32_t space = capacity - (uint32_t)(head - tail);
	uint32_t mask = capacity - 1;
	if (n > space)
		n = space;
	for (uint32_t i = 0; i < n; i++)
		memcpy(&descs[(head + i) & mask], &in[i], sizeof(*in));
	/* release: the entries are visible before the head that covers them */
	dp_store_release_u64(&r->head, head + n);
	return n;
}

/* Consumer: copy up to n descriptors out; returns how many came out. */
static inline uint32_t dp_ring_pop_burst(struct dp_ring_header *r, const struct dp_desc *descs,
					 uint32_t capacity, struct dp_desc *out, uint32_t n)
{
	uint64_t tail = dp_load_relaxed_u64(&r->tail);
	/* acquire: pairs with the producer's release of head */
	uint64_t head = dp_load_acquire_u64(&r->head);
	uint32_t avail = (uint32_t)(head - tail);
	uint32_t mask = capacity - 1;
	if (n > avail)
		n = avail;
	for (uint32_t i = 0; i < n; i++)
		memcpy(&out[i], &descs[(tail + i) & mask], sizeof(*out));
	/* release: our reads of the entries are done before the producer may reuse them */
	dp_store_release_u64(&r->tail, tail + n);
	return n;
}

/* Consumer that trusts nothing in the ring header: the dataplane's (and the mock's) way.
 *
 * *tail is the consumer's private index (shm's tail is only published for the producer)
 * and *head_seen the last head it accepted. A head that moved back, or that runs more
 * than capacity ahead of *tail, is a broken ring: returns -1 and takes nothing, so a
 * stale entry is never replayed. Else copies up to n descriptors out once (the caller
 * checks its copy, never the ring entry) and returns how many. */
static inline int32_t dp_ring_consume(struct dp_ring_header *r, const struct dp_desc *descs,
				      uint32_t capacity, uint64_t *tail, uint64_t *head_seen,
				      struct dp_desc *out, uint32_t n)
{
	/* acquire: pairs with the producer's release of head */
	uint64_t head = dp_load_acquire_u64(&r->head);
	if (head < *head_seen || head - *tail > capacity)
		return -1;
	*head_seen = head;
	uint64_t avail = head - *tail;
	uint32_t mask = capacity - 1;
	if (n > avail)
		n = (uint32_t)avail;
	for (uint32_t i = 0; i < n; i++)
		memcpy(&out[i], &descs[(*tail + i) & mask], sizeof(*out));
	*tail += n;
	/* release: our reads of the entries are done before the producer may reuse them */
	dp_store_release_u64(&r->tail, *tail);
	return (int32_t)n;
}

static inline int dp_ring_push(struct dp_ring_header *r, struct dp_desc *descs,
			       uint32_t capacity, const struct dp_desc *d)
{
	return dp_ring_push_burst(r, descs, capacity, d, 1) == 1 ? 0 : -1;
}

static inline int dp_ring_pop(struct dp_ring_header *r, const struct dp_desc *descs,
			      uint32_t capacity, struct dp_desc *out)
{
	return dp_ring_pop_burst(r, descs, capacity, out, 1) == 1 ? 0 : -1;
}

/* Consumer: publish a slot's completion. v's fields first (but done and waiters, which
 * are not v's to say): line 0's and line 1's, the forward's phase times; then the done
 * word (release), then wake the client if it sleeps on it (dp_wake.h). Returns 1 if it
 * called FUTEX_WAKE, else 0. */
static inline int dp_slot_publish(struct dp_slot_header *h, const struct dp_slot_header *v,
				  uint32_t generation, uint32_t status)
{
	h->forward_id = v->forward_id;
	h->epoch = v->epoch;
	h->nbytes = v->nbytes;
	h->answered = v->answered;
	h->missing = v->missing;
	h->prepare_ns = v->prepare_ns;
	h->send_ns = v->send_ns;
	h->wait_ns = v->wait_ns;
	h->fetch_ns = v->fetch_ns;
	h->reduce_ns = v->reduce_ns;
	h->spread_ns = v->spread_ns;
	h->duck_compute_max_ns = v->duck_compute_max_ns;
	h->duck_compute_sum_ns = v->duck_compute_sum_ns;
	/* release: a client that sees this generation sees the fields and the result bytes */
	dp_store_release_u64(&h->done, ((uint64_t)generation << 32) | status);
	/* seq_cst: done's store before waiters' load; pairs with dp_slot_sleep */
	dp_fence_seq_cst();
	if (!__atomic_load_n(&h->waiters, __ATOMIC_RELAXED))
		return 0;
	(void)dp_futex_wake(dp_done_futex(&h->done));
	return 1;
}

/* Client: the phase times of the forward whose completion left `generation` and a
 * final status in the slot's done word, into out[0..7] in line 1's order (prepare, send,
 * wait, fetch, reduce, spread, duck compute max, sum). Returns 1, or 0 (out untouched)
 * when done carries another generation or none yet. Only while the client holds the slot
 * for that forward: once it submits the slot again, the dataplane may be rewriting it. */
static inline int dp_slot_phases(const struct dp_slot_header *h, uint32_t generation,
				 uint64_t *out)
{
	/* acquire: pairs with dp_slot_publish's release: line 1 was written before done */
	uint64_t w = dp_load_acquire_u64(&h->done);
	if ((uint32_t)(w >> 32) != generation || (uint32_t)w == 0)
		return 0;
	out[0] = h->prepare_ns;
	out[1] = h->send_ns;
	out[2] = h->wait_ns;
	out[3] = h->fetch_ns;
	out[4] = h->reduce_ns;
	out[5] = h->spread_ns;
	out[6] = h->duck_compute_max_ns;
	out[7] = h->duck_compute_sum_ns;
	return 1;
}

#endif /* DP_RING_H */
