/* dp_stats_moe.h: the stats segment's MoE region, each MoE layer's expert and duck load
 * (layout: dp_stats_moe_layer in dp_stats_abi.h, from duckpipe/schema/stats.py; issue 30
 * point 4). Written by the control agent alone, through dp_stats.c: at each routed
 * forward's completion (the running totals, dp_expert_load.h) and at the first stats
 * tick past each recent window (the window's numbers, under the slot's seq).
 */
#ifndef DP_STATS_MOE_H
#define DP_STATS_MOE_H

#include <stdint.h>

#include "dp_stats_abi.h"
#include "dp_world.h"

struct dp_fwd;
struct dp_fwd_summary;
struct dp_stats_moe_seg;

/* The control agent's own state of the region at base + DP_STATS_MOE_OFFSET, whose head
 * it fills; NULL with dp_error() when out of memory. */
struct dp_stats_moe_seg *dp_stats_moe_open(uint8_t *base, uint64_t now);
void dp_stats_moe_close(struct dp_stats_moe_seg *m);
/* A completion: counted when it is a routed forward that went out (kind FORWARD). */
void dp_stats_moe_forward(struct dp_stats_moe_seg *m, struct dp_world *w, const struct dp_fwd *f,
			  const struct dp_fwd_summary *sum);
/* Every stats tick: ends the recent window once STATS_MOE_WINDOW_NS have passed. */
void dp_stats_moe_tick(struct dp_stats_moe_seg *m, struct dp_world *w, uint64_t now);

#endif /* DP_STATS_MOE_H */
