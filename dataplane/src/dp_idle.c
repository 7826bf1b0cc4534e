/* dp_idle.c: spin, yield, back-off. Back-off is the default: on a 2-core machine
 * the model, the dataplane and emulated ducks share the cores. */
#include "dp_idle.h"

#include <sched.h>
#include <string.h>
#include <time.h>

#include "dp_barrier.h"
#include "dp_common.h"

#define BACKOFF_SPINS 1000
#define BACKOFF_YIELDS 100
#define BACKOFF_MIN_PARK_NS 10000u
#define BACKOFF_MAX_PARK_NS 200000u

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

void dp_idle_init(struct dp_idle *s, enum dp_idle_kind kind)
{
	s->kind = kind;
	s->count = 0;
	s->park_ns = BACKOFF_MIN_PARK_NS;
}

void dp_idle_idle(struct dp_idle *s, int work)
{
	if (work > 0) {
		s->count = 0;
		s->park_ns = BACKOFF_MIN_PARK_NS;
		return;
	}
	switch (s->kind) {
	case DP_IDLE_SPIN:
		dp_cpu_relax();
		return;
	case DP_IDLE_YIELD:
		sched_yield();
		return;
	case DP_IDLE_BACKOFF:
		break;
	}
	if (++s->count <= BACKOFF_SPINS) {
		dp_cpu_relax();
		return;
	}
	if (s->count <= BACKOFF_SPINS + BACKOFF_YIELDS) {
		sched_yield();
		return;
	}
	struct timespec ts = { 0, (long)s->park_ns };
	nanosleep(&ts, NULL);
	if (s->park_ns < BACKOFF_MAX_PARK_NS)
		s->park_ns *= 2;
}
