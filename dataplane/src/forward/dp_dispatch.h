/* dp_dispatch.h: the dispatcher agent (client rings -> NIC workers). */
#ifndef DP_DISPATCH_H
#define DP_DISPATCH_H

#include <stdint.h>

#include "dp_agent.h"
#include "dp_world.h"

struct dp_dispatcher;

struct dp_dispatcher *dp_dispatch_new(struct dp_world *w);
void dp_dispatch_free(struct dp_dispatcher *d);
int dp_dispatch_do_work(struct dp_world *w, void *self, uint64_t now);
/* Parking (struct dp_agent): the doorbell into the runner's waker; before a park, set
 * every client's need_wakeup and look at the rings once more; after, clear them. */
int dp_dispatch_wait_on(struct dp_world *w, void *self, struct dp_waker *wk);
int64_t dp_dispatch_park(struct dp_world *w, void *self, uint64_t now);
void dp_dispatch_unpark(struct dp_world *w, void *self);

#endif /* DP_DISPATCH_H */
