/* dp_wake.h: waking a sleeper across the shared segment, both ways.
 *
 * Client -> dataplane: the dataplane sets need_wakeup in a segment header before it
 * parks; a client that advanced its ring head rings its doorbell (one byte into its
 * own pipe, whose read end the dataplane took at attach: nobody else can ring it) only
 * when it sees the flag: io_uring's IORING_SQ_NEED_WAKEUP, no syscall while the
 * dataplane is awake.
 *
 * Dataplane -> client: a client that gave up spinning sets its slot's `waiters` and
 * sleeps on the high half of the done word (the generation: it changes with every
 * completion) with FUTEX_WAIT; dp_slot_publish calls FUTEX_WAKE only when `waiters`
 * is set. The futex is a shared one (no FUTEX_PRIVATE_FLAG): the two processes map
 * the same memfd, and the kernel keys the futex by its page, not the address.
 *
 * Both handshakes are Dekker's: each side stores its own word, fences (seq_cst), then
 * loads the other's. Either the sleeper sees the work, or the waker sees the flag.
 * Every flag is a hint from memory the other side can write: a wrong one costs a
 * spurious syscall or a wake-up late by one timeout slice, never a result.
 */
#ifndef DP_WAKE_H
#define DP_WAKE_H

#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dp_abi.h"
#include "dp_barrier.h"

/* unistd.h declares syscall(2) only under _DEFAULT_SOURCE; this header is also built as
 * strict C11 (tests/tools/test_generated_files.py), so it says the prototype itself */
long syscall(long number, ...);

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the done word's futex is its high half: bytes 4-7 on little-endian");

/* The 32-bit futex word inside a slot's done word: its generation half. */
static inline uint32_t *dp_done_futex(uint64_t *done)
{
	return (uint32_t *)done + 1;
}

/* Sleep while *word == expected, up to timeout_ns (0: no limit). Returns 0 when woken
 * or the word already differs, -1 with errno ETIMEDOUT or EINTR otherwise. */
static inline int dp_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
	struct timespec ts = { (time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u) };
	long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout_ns ? &ts : NULL, NULL, 0);
	if (rc == 0 || errno == EAGAIN)
		return 0;
	return -1;
}

static inline int dp_futex_wake(uint32_t *word)
{
	return (int)syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* Client, after advancing head (release): ring the doorbell if the dataplane parks.
 * doorbell_fd is the pipe's write end, O_NONBLOCK; the client keeps the read end open
 * too, so that a dataplane gone never makes the write raise SIGPIPE. Returns 1 if it
 * rang, 0 if the dataplane is awake, -1 if the write failed (errno; EAGAIN: the pipe
 * is full, so it rang already). Ring only after advancing head: the dispatcher mutes
 * for a while a doorbell whose rings bring no new descriptors (dp_dispatch.c). */
static inline int dp_doorbell_ring(const struct dp_seg_header *h, int doorbell_fd)
{
	/* seq_cst: head's store before need_wakeup's load; pairs with dp_dispatch_park's fence */
	dp_fence_seq_cst();
	if (!__atomic_load_n(&h->need_wakeup, __ATOMIC_RELAXED))
		return 0;
	static const char ding = 1;
	return write(doorbell_fd, &ding, 1) == 1 ? 1 : -1;
}

/* Client, about to wait for a ZeroMQ completion (timings, duck lists), want != 0; done
 * waiting, want == 0. While it is set the dataplane sends its completion outbox at once
 * instead of after completion_flush_us (dp_control_outbox.c); setting it rings the
 * doorbell if the dataplane parks, so that a completion already in the outbox leaves
 * now. Returns dp_doorbell_ring's answer (0 when clearing). */
static inline int dp_completions_want(struct dp_seg_header *h, int want, int doorbell_fd)
{
	__atomic_store_n(&h->completions_wanted, want ? 1u : 0u, __ATOMIC_RELAXED);
	if (!want || doorbell_fd < 0)
		return 0;
	return dp_doorbell_ring(h, doorbell_fd); /* its fence orders the store before the load */
}

/* Client, out of spin budget: sleep until the slot's done word carries `generation`,
 * up to timeout_ns. Returns the last done word read. */
static inline uint64_t dp_slot_sleep(struct dp_slot_header *h, uint32_t generation,
				     uint64_t timeout_ns)
{
	uint64_t w = dp_load_acquire_u64(&h->done);
	if ((uint32_t)(w >> 32) == generation)
		return w;
	__atomic_store_n(&h->waiters, 1, __ATOMIC_RELAXED);
	/* seq_cst: waiters' store before done's load; pairs with dp_slot_publish */
	dp_fence_seq_cst();
	w = dp_load_acquire_u64(&h->done);
	if ((uint32_t)(w >> 32) != generation) {
		(void)dp_futex_wait(dp_done_futex(&h->done), (uint32_t)(w >> 32), timeout_ns);
		w = dp_load_acquire_u64(&h->done);
	}
	__atomic_store_n(&h->waiters, 0, __ATOMIC_RELAXED);
	return w;
}

#endif /* DP_WAKE_H */
