/* dp_accept_guard.h: accept4() under libzmq sheds connections instead of aborting on
 * EMFILE (dp_accept_guard.c says why). */
#ifndef DP_ACCEPT_GUARD_H
#define DP_ACCEPT_GUARD_H

#include <stdint.h>

/* Take the reserve descriptor now, while there are descriptors to take. */
void dp_accept_guard_init(void);

/* Connections shed so far (connections_shed). */
uint64_t dp_accept_guard_shed(void);

#endif /* DP_ACCEPT_GUARD_H */
