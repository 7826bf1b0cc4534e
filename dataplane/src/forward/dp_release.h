/* dp_release.h: a NIC's part of a context (a forward or a weight chunk) ends only once
 * the port has let go of the client's slot (dp_release.c). A leaf: it says which parts
 * the port let go of; the worker ends them (dp_worker.c). */
#ifndef DP_RELEASE_H
#define DP_RELEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_backend.h"

struct dp_fwd;

/* A port holding a part's buffers this long is logged (once per part). */
#define DP_RELEASE_WARN_NS 1000000000ull

/* The parts of one NIC that are over and wait for its port to free their buffers. The
 * worker owns it (and the parts array, one entry per context). */
struct dp_release_list {
	struct dp_backend *be;        /* the worker's: tx_reclaim, the NIC's name */
	uint32_t nic;
	struct dp_counters *counters; /* the worker's */
	struct dp_fwd **parts;        /* [0, n) wait for the port */
	uint32_t n;
};

/* This NIC's part of f is over with status (f has left the worker's active list): true
 * if the port holds nothing of f's slot, and the worker ends the part now; else false,
 * and it waits in r (its status kept in its part) until dp_release_poll finds the port
 * let go. */
bool dp_release_part(struct dp_release_list *r, struct dp_fwd *f, uint32_t status,
		     uint64_t now);
/* The worker's loop, while parts wait: ask the port to free what it sent. Returns how
 * many parts it no longer holds anything of: they left the list for
 * r->parts[r->n, r->n + returned), the first found last, each with its status in its
 * part, for the worker to end. Nothing to do (one load) when no part waits. */
uint32_t dp_release_poll(struct dp_release_list *r);

#endif /* DP_RELEASE_H */
