/* dp_dispatch.h: the dispatcher agent (client rings -> NIC workers). */
#ifndef DP_DISPATCH_H
#define DP_DISPATCH_H

#include <stdint.h>

#include "dp_dataplane.h"

struct dp_dispatcher;

struct dp_dispatcher *dp_dispatch_new(struct dp_world *w);
void dp_dispatch_free(struct dp_dispatcher *d);
int dp_dispatch_do_work(struct dp_world *w, void *self, uint64_t now);

#endif /* DP_DISPATCH_H */
