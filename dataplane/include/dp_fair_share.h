/* dp_fair_share.h: how many forwards one client may have in flight.
 *
 * Nobody holds more than a fair share of the forward contexts, with one share kept for
 * a client yet to come: a client whose contexts wait on slow or silent ducks (a weight
 * chunk holds one up to weight_timeout_ms) cannot leave another none. The dispatcher
 * (dp_dispatch.c: its pass over the rings, and the check before it parks) and the mock
 * dataplane (duckpipe/mock/dataplane.py, through cffi) take their quota from here.
 */
#ifndef DP_FAIR_SHARE_H
#define DP_FAIR_SHARE_H

#include <stdint.h>

/* Forwards one client may have in flight: client_max_inflight, or less when `contexts`
 * (the forward contexts, max_inflight) shared among `nactive` clients and one more give
 * each less; never less than one. */
static inline uint64_t dp_client_quota(uint64_t contexts, uint32_t nactive,
				       uint64_t client_max_inflight)
{
	uint64_t share = contexts / ((uint64_t)nactive + 1);
	if (share < 1)
		share = 1;
	return client_max_inflight < share ? client_max_inflight : share;
}

#endif /* DP_FAIR_SHARE_H */
