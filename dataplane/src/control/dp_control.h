/* dp_control.h: the control agent (ZeroMQ ROUTER, completions, housekeeping). */
#ifndef DP_CONTROL_H
#define DP_CONTROL_H

#include <stdint.h>

#include "dp_world.h"

struct dp_control;

/* Binds the control endpoint; NULL with dp_error() when it cannot. */
struct dp_control *dp_control_new(struct dp_world *w);
void dp_control_free(struct dp_control *c);
int dp_control_do_work(struct dp_world *w, void *self, uint64_t now);
/* Parking (struct dp_agent): ZeroMQ's fds into the runner's waker; before a park, -1
 * if a message or a completion waits, else ns until the next housekeeping. */
int dp_control_wait_on(struct dp_world *w, void *self, struct dp_waker *wk);
int64_t dp_control_park(struct dp_world *w, void *self, uint64_t now);
/* After a park: the first pass asks ZeroMQ's sockets (they are asked at most every 50 us
 * while the runner is awake and nothing comes). */
void dp_control_unpark(struct dp_world *w, void *self);

#endif /* DP_CONTROL_H */
