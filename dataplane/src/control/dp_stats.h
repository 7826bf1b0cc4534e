/* dp_stats.h: the stats segment (layout: dp_stats_abi.h, from duckpipe/schema/stats.py).
 *
 * A file next to the control socket (ipc://<dir>/control -> <dir>/stats), mode 0600,
 * mapped MAP_SHARED. Readers (duckpipe stats, duckpipe-top, duckpipe exporter) map it
 * read-only and take no lock: every value is one aligned 64-bit word stored relaxed
 * by its one writer, and the header's magic is stored last (release).
 *
 * Who writes what: everything below is written by the control agent alone. It
 * publishes each agent's struct dp_counters into that agent's region (each agent is
 * still the only writer of its own counters; the control agent only reads them, as
 * GetStats always did), the client and duck entries, and records the histograms from
 * the completions it sends (dp_fwd_summarize: the same numbers a client gets). So the
 * segment trails the agents by one tick: at most ~10 ms while the control agent
 * works, one housekeeping period (50 ms) while it is parked.
 */
#ifndef DP_STATS_H
#define DP_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "dp_world.h"
#include "dp_stats_abi.h"

#define DP_STATS_TICK_NS 10000000ull /* 10 ms: heartbeat, counters, clients, ducks */

struct dp_fwd;
struct dp_fwd_summary;

/* The stats path of a control endpoint, as duckpipe/observe/stats_reader.py stats_path_for computes it.
 * 0, or -1 with dp_error() when it does not fit. */
int dp_stats_path(const char *control, char *out, size_t len);

/* The checks dp_stats_open makes of the stats path of control (its directory ours and
 * closed to others; nothing there, or a regular file of ours), made by main before
 * anything is bound: a dataplane refused for its run directory has not taken its ports,
 * nor been refused for ports another one holds. 0, or -1 with dp_error(). */
int dp_stats_check(const char *control);

/* Bucket of a value (ns) in every histogram: 2**k and 1.5 * 2**k bounds from 256 ns. */
static inline uint32_t dp_stats_bucket(uint64_t ns)
{
	if (ns <= (1ull << DP_STATS_FIRST_BOUND_LOG2))
		return 0;
	uint32_t k = 63u - (uint32_t)__builtin_clzll(ns - 1); /* 2**k < ns <= 2**(k+1) */
	uint32_t i = 2 * (k - DP_STATS_FIRST_BOUND_LOG2) + (ns <= (3ull << (k - 1)) ? 1 : 2);
	return i < DP_STATS_BUCKETS - 1 ? i : DP_STATS_BUCKETS - 1;
}

/* Upper bound (ns) of bucket i. */
static inline uint64_t dp_stats_bound(uint32_t i)
{
	if (i >= DP_STATS_BUCKETS - 1)
		return INT64_MAX;
	uint32_t j = i / 2;
	return i % 2 ? 3ull << (DP_STATS_FIRST_BOUND_LOG2 - 1 + j)
		     : 1ull << (DP_STATS_FIRST_BOUND_LOG2 + j);
}

/* One value into counts[] and its sum (the histogram's only writer). */
static inline void dp_stats_record(uint64_t *counts, uint64_t *sum, uint64_t ns)
{
	uint64_t *c = &counts[dp_stats_bucket(ns)];
	dp_store_relaxed_u64(c, *c + 1);
	dp_store_relaxed_u64(sum, *sum + ns);
}

/* Create the segment (replacing a stale one) and fill what never changes; NULL with
 * dp_error() when it cannot. Called by the control agent at its start. nic_counters:
 * each NIC worker's counters, by NIC (cfg.nnics of them), which every tick publishes. */
struct dp_stats_seg *dp_stats_open(struct dp_world *w,
				   const struct dp_counters *const *nic_counters);
/* Remove the file and unmap (clean exit). */
void dp_stats_close(struct dp_stats_seg *s);
/* Control agent, every DP_STATS_TICK_NS: heartbeat, counters, clients, ducks. */
void dp_stats_tick(struct dp_stats_seg *s, uint64_t now);
/* Control agent, for every completion it sends. */
void dp_stats_completion(struct dp_stats_seg *s, const struct dp_fwd *f,
			 const struct dp_fwd_summary *sum, uint64_t now);
const char *dp_stats_file(const struct dp_stats_seg *s);

#endif /* DP_STATS_H */
