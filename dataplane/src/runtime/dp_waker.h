/* dp_waker.h: how a parked runner thread is woken by its work, never by a timer alone.
 *
 * Each runner (one thread running one or more agents) owns a waker: an epoll set
 * holding the file descriptors its agents wait on (sockets, the clients' doorbell,
 * ZeroMQ's) and an eventfd that agents on other threads kick after they push into
 * one of its rings. Kicking is io_uring's SQPOLL handshake again: the runner stores
 * `sleeping` before its last look for work, the producer pushes and then loads
 * `sleeping`, both with a full fence between, so one of the two always sees the other
 * and the kick costs a syscall only when the runner really parks.
 */
#ifndef DP_WAKER_H
#define DP_WAKER_H

#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "dp_barrier.h"
#include "dp_common.h"

/* An agent's park() answer: no timer of its own. */
#define DP_PARK_FOREVER INT64_MAX
/* Events one wait reports; more ready fds are seen by the next wait (level-triggered). */
#define DP_WAKER_MAX_EVENTS 16

struct dp_waker {
	uint32_t sleeping dp_cache_aligned; /* the runner: 1 from its last look until it runs */
	int epfd;                           /* set once */
	int efd;                            /* kicked by other threads */
	uint64_t parks;                     /* the runner's own: times it slept */
	uint64_t kicked;                    /* wake-ups by a kick */
	uint64_t expecting;                 /* of parks, those with fds muted (dp_main.c) */
	/* Whether the last park slept (every agent's park() said nothing to do), and for
	 * which fds it woke, so that an agent looks only where something came: -1 in nfired
	 * when it cannot say (a full batch) */
	bool waited;
	int fired[DP_WAKER_MAX_EVENTS];
	int nfired;
};

int dp_waker_init(struct dp_waker *wk);
void dp_waker_fini(struct dp_waker *wk);
/* Wake the runner when fd is readable (level-triggered). 0, or -1 with dp_error. */
int dp_waker_add(struct dp_waker *wk, int fd);
/* Stop (mute) or start again hearing fd, one added before: a muted fd's readiness wakes
 * nobody and stays, level-triggered, for the first wait after. 0, or -1 with dp_error. */
int dp_waker_mute(struct dp_waker *wk, int fd, bool mute);
/* The runner, about to park: from here on, producers kick. */
static inline void dp_waker_arm(struct dp_waker *wk)
{
	wk->waited = false;
	wk->nfired = 0;
	__atomic_store_n(&wk->sleeping, 1, __ATOMIC_RELAXED);
	/* seq_cst: sleeping's store before the agents' last look at their rings */
	dp_fence_seq_cst();
}
/* Sleep until an fd is readable, a kick, or timeout_ns (DP_PARK_FOREVER: none). */
void dp_waker_wait(struct dp_waker *wk, int64_t timeout_ns);
static inline void dp_waker_disarm(struct dp_waker *wk)
{
	__atomic_store_n(&wk->sleeping, 0, __ATOMIC_RELAXED);
}
/* After a park that slept (waited): may fd have woken it? (Also true when the wait
 * could not say.) */
static inline bool dp_waker_fired(const struct dp_waker *wk, int fd)
{
	if (wk->nfired < 0)
		return true;
	for (int i = 0; i < wk->nfired; i++)
		if (wk->fired[i] == fd)
			return true;
	return false;
}

/* A producer on another thread, after its push (release): wake the runner if it parks.
 * NULL: the producer runs on the same thread, which is awake by definition. */
static inline void dp_waker_kick(struct dp_waker *wk)
{
	if (!wk)
		return;
	/* seq_cst: the push's store before sleeping's load; pairs with dp_waker_arm */
	dp_fence_seq_cst();
	if (__atomic_load_n(&wk->sleeping, __ATOMIC_RELAXED)) {
		uint64_t one = 1;
		(void)!write(wk->efd, &one, sizeof(one));
	}
}

/* Wake it whatever it is doing: shutdown (async-signal-safe). */
static inline void dp_waker_stop(struct dp_waker *wk)
{
	uint64_t one = 1;
	(void)!write(wk->efd, &one, sizeof(one));
}

#endif /* DP_WAKER_H */
