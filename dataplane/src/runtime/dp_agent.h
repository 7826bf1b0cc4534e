/* dp_agent.h: an agent, Aeron's shape: the control agent (dp_control.h), the
 * dispatcher (dp_dispatch.h) and each NIC worker (dp_worker.h) fill one, and dp_main.c's
 * runners call it. */
#ifndef DP_AGENT_H
#define DP_AGENT_H

#include <stdint.h>

struct dp_waker; /* dp_waker.h */
struct dp_world; /* dp_world.h */

/* do_work returns how much it did. The parking hooks let the runner sleep when every
 * agent on it is idle (dp_waker.h); each may be NULL. */
struct dp_agent {
	const char *name;
	int (*do_work)(struct dp_world *w, void *self, uint64_t now);
	/* at start: add the fds whose readiness means work to the runner's waker */
	int (*wait_on)(struct dp_world *w, void *self, struct dp_waker *wk);
	/* the runner armed its waker: -1 if work came after all, else ns until the agent's
	 * next timer (DP_PARK_FOREVER: none) */
	int64_t (*park)(struct dp_world *w, void *self, uint64_t now);
	void (*unpark)(struct dp_world *w, void *self); /* the runner woke up */
	/* nothing to do now: ns until the replies to what it sent are due, its fd (which the
	 * runner may mute until then) in *fd; 0 when it waits for nothing; -1 when something
	 * may come any time (dp_main.c's park_expecting) */
	int64_t (*expect)(struct dp_world *w, void *self, uint64_t now, int *fd);
	void *self;
};

#endif /* DP_AGENT_H */
