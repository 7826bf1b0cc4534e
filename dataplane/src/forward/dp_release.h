/* dp_release.h: a NIC's part of a context (a forward or a weight chunk) ends only once
 * the port has let go of the client's slot (dp_release.c). */
#ifndef DP_RELEASE_H
#define DP_RELEASE_H

#include <stdint.h>

struct dp_worker;
struct dp_fwd;

/* A port holding a part's buffers this long is logged (once per part). */
#define DP_RELEASE_WARN_NS 1000000000ull

/* This worker's part of f is over with status: end it now (dp_fwd_part_done, and the
 * last NIC out finalises) if the port holds nothing of f's slot, else once it has let
 * go (dp_release_poll). f has left the worker's active list already. */
void dp_release_part(struct dp_worker *wk, struct dp_fwd *f, uint32_t status, uint64_t now);
/* The worker's loop, while parts wait: ask the port to free what it sent and end the
 * parts it no longer holds anything of. Returns how many ended; nothing to do (one
 * load) when no part waits. */
int dp_release_poll(struct dp_worker *wk);

#endif /* DP_RELEASE_H */
