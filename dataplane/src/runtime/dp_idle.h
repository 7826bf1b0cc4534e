/* dp_idle.h: what a runner does after a loop that found no work (Aeron's idle
 * strategies). spin and yield never sleep; backoff spins, yields, then asks the
 * runner to park on its waker (dp_waker.h) until work, a datagram or a timer. A
 * backoff runner without a core of its own (no `cores`, not an EAL lcore) spins by
 * yielding (dp_idle.c). */
#ifndef DP_IDLE_H
#define DP_IDLE_H

#include <stdbool.h>
#include <stdint.h>

enum dp_idle_kind { DP_IDLE_SPIN, DP_IDLE_YIELD, DP_IDLE_BACKOFF };

struct dp_idle {
	enum dp_idle_kind kind;
	uint64_t spin_ns;      /* backoff: spin this long after the last work, yield as long */
	uint64_t idle_since;   /* 0: the last loop did work */
	bool woke;             /* backoff: parked last; no spin until a loop does work */
	bool polite;           /* backoff: spin by yielding: the runner has no core of its own */
};

int dp_idle_parse(const char *name, enum dp_idle_kind *out);
void dp_idle_init(struct dp_idle *s, enum dp_idle_kind kind, uint32_t spin_us, bool polite);
/* work > 0 resets; else spin or yield once. True when the runner should park now. */
bool dp_idle_idle(struct dp_idle *s, int work, uint64_t now);
/* After a park. A wake-up whose first loop finds no work (a stray doorbell: anyone on
 * the host can ring it; a timer with nothing due; a kick already served) parks again at
 * once: the spin is for replies to work just done, and there was none. */
static inline void dp_idle_reset(struct dp_idle *s)
{
	s->idle_since = 0;
	s->woke = true;
}

/* Backoff, and this loop is the first without work since some was done (not since a
 * wake-up): the moment to ask whether a park could wait for what was just sent. */
static inline bool dp_idle_starts(const struct dp_idle *s)
{
	return s->kind == DP_IDLE_BACKOFF && !s->idle_since && !s->woke;
}
/* After a park until replies were due: they are now, so spin for them as after work. */
static inline void dp_idle_resume(struct dp_idle *s)
{
	s->idle_since = 0;
	s->woke = false;
}

#endif /* DP_IDLE_H */
