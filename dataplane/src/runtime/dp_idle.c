/* dp_idle.c: spin, yield, back-off. Back-off is the default: on a 2-core machine the
 * model, the dataplane and emulated ducks share the cores, so after a while without
 * work the runner parks, to be woken by the work itself (dp_waker.h). The spin before
 * it keeps a forward's reply from paying a cross-core wake-up (35-50 us on these VMs,
 * NOTES.md) when the reply comes soon.
 *
 * A runner that `cores` did not pin (nor the EAL) shares its CPU with whoever the
 * scheduler puts there: the client it just woke, the model. It spins by calling
 * sched_yield(), which returns at once when nobody else is runnable and lets them run
 * first when somebody is. Spinning on the CPU instead kept a woken client waiting up to
 * idle_spin_us whenever the scheduler did not preempt the runner for it: p99 of a
 * one-duck forward 1.68-1.82x the C floor's, 1.05-1.20x yielding (docs/benchmarks.md,
 * issue 19, fourth round). A pinned runner has its core: it spins on it. */
#include "dp_idle.h"

#include <sched.h>
#include <string.h>

#include "dp_barrier.h"
#include "dp_common.h"

int dp_idle_parse(const char *name, enum dp_idle_kind *out)
{
	if (!strcmp(name, "spin"))
		*out = DP_IDLE_SPIN;
	else if (!strcmp(name, "yield"))
		*out = DP_IDLE_YIELD;
	else if (!strcmp(name, "backoff"))
		*out = DP_IDLE_BACKOFF;
	else {
		dp_set_error("idle strategy '%s' is not spin, yield or backoff", name);
		return -1;
	}
	return 0;
}

void dp_idle_init(struct dp_idle *s, enum dp_idle_kind kind, uint32_t spin_us, bool polite)
{
	s->polite = polite;
	s->kind = kind;
	s->spin_ns = (uint64_t)spin_us * 1000;
	s->idle_since = 0;
	s->woke = false;
}

bool dp_idle_idle(struct dp_idle *s, int work, uint64_t now)
{
	if (work > 0) {
		s->idle_since = 0;
		s->woke = false;
		return false;
	}
	switch (s->kind) {
	case DP_IDLE_SPIN:
		dp_cpu_relax();
		return false;
	case DP_IDLE_YIELD:
		sched_yield();
		return false;
	case DP_IDLE_BACKOFF:
		break;
	}
	if (s->woke)
		return true; /* woken for nothing: back to sleep (dp_idle_reset) */
	if (!s->idle_since)
		s->idle_since = now;
	uint64_t idle = now - s->idle_since;
	if (idle < s->spin_ns) {
		if (s->polite)
			sched_yield();
		else
			dp_cpu_relax();
		return false;
	}
	if (idle < 2 * s->spin_ns) {
		sched_yield(); /* whoever shares this core (a client, a duck) runs first */
		return false;
	}
	return true;
}
