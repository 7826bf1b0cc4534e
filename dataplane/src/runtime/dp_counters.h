/* dp_counters.h: every event a person would ask about, per agent.
 *
 * Each agent owns one struct dp_counters and is its only writer (relaxed
 * stores); the control agent sums them for Stats without stopping anyone.
 * The list itself, DP_COUNTER_LIST, is the schema's (COUNTERS in
 * duckpipe/schema/stats.py, generated into dp_stats_abi.h): the mock dataplane
 * and the readers take the same names from there.
 */
#ifndef DP_COUNTERS_H
#define DP_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_barrier.h"
#include "dp_common.h"
#include "dp_stats_abi.h"

enum dp_counter {
#define DP_COUNTER_ENUM(name) DP_C_##name,
	DP_COUNTER_LIST(DP_COUNTER_ENUM)
#undef DP_COUNTER_ENUM
	DP_NCOUNTERS
};

extern const char *const dp_counter_names[DP_NCOUNTERS];

struct dp_counters {
	uint64_t v[DP_NCOUNTERS];
} dp_cache_aligned;

static inline void dp_count(struct dp_counters *c, enum dp_counter which, uint64_t n)
{
	dp_store_relaxed_u64(&c->v[which], c->v[which] + n);
}

/* Count one piece of bad input and say whether to log it too: the first, then each
 * power of two after (a flood of junk is logged a few dozen times, not per packet, and
 * a test that finds a count it did not expect finds the reason in the log). */
static inline bool dp_count_said(struct dp_counters *c, enum dp_counter which)
{
	uint64_t v = c->v[which] + 1;
	dp_store_relaxed_u64(&c->v[which], v);
	return (v & (v - 1)) == 0;
}

#endif /* DP_COUNTERS_H */
