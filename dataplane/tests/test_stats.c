/* test_stats.c: the stats segment's histogram buckets, its path, its plan, and the MoE
 * region's per-expert count (dp_expert_load.h). Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_expert_load.h"
#include "dp_stats.h"
#include "test_check.h"

#define C(cond) CHECK(cond, "%s", "")

int main(void)
{
	/* bounds: 256, 384, 512, 768, ... strictly increasing, the last INT64_MAX */
	C(dp_stats_bound(0) == 256 && dp_stats_bound(1) == 384 && dp_stats_bound(2) == 512);
	C(dp_stats_bound(DP_STATS_BUCKETS - 1) == INT64_MAX);
	for (uint32_t i = 1; i < DP_STATS_BUCKETS; i++)
		C(dp_stats_bound(i) > dp_stats_bound(i - 1));
	/* a value lands in the first bucket whose bound holds it */
	C(dp_stats_bucket(0) == 0 && dp_stats_bucket(256) == 0 && dp_stats_bucket(257) == 1);
	for (uint32_t i = 0; i + 1 < DP_STATS_BUCKETS; i++) {
		uint64_t b = dp_stats_bound(i);
		C(dp_stats_bucket(b) == i);
		C(dp_stats_bucket(b + 1) == i + 1);
		if (i)
			C(dp_stats_bucket(dp_stats_bound(i - 1) + 1) == i);
	}
	C(dp_stats_bucket(UINT64_MAX) == DP_STATS_BUCKETS - 1);
	/* recording: one count, the exact sum */
	uint64_t counts[DP_STATS_BUCKETS] = { 0 }, sum = 0;
	dp_stats_record(counts, &sum, 1000);
	dp_stats_record(counts, &sum, 1000);
	C(counts[dp_stats_bucket(1000)] == 2 && sum == 2000);
	/* the path readers compute (duckpipe/observe/stats_reader.py stats_path_for) */
	char p[320];
	C(dp_stats_path("ipc:///run/x/control", p, sizeof(p)) == 0 && !strcmp(p, "/run/x/stats"));
	C(dp_stats_path("ipc:///run/x/dp1", p, sizeof(p)) == 0 && !strcmp(p, "/run/x/dp1.stats"));
	C(dp_stats_path("ipc:///run/x/control", p, 8) < 0); /* too long: refused, not cut */
	setenv("DUCKPIPE_RUN_DIR", "/tmp", 1);
	C(dp_stats_path("tcp://127.0.0.1:5555", p, sizeof(p)) == 0 &&
	      !strcmp(p, "/tmp/stats-tcp___127.0.0.1_5555"));
	/* the generated plan: regions in order, cache-line aligned, inside the segment */
	C(DP_STATS_AGENTS_OFFSET % 64 == 0 && DP_STATS_CLIENTS_OFFSET % 64 == 0 &&
	      DP_STATS_DUCKS_OFFSET % 64 == 0 && DP_STATS_HISTS_OFFSET % 64 == 0);
	C(DP_STATS_HISTS_OFFSET + DP_STATS_NHISTS * sizeof(struct dp_stats_hist) <=
	      DP_STATS_MOE_OFFSET);
	C(DP_STATS_MOE_OFFSET % 64 == 0 && sizeof(struct dp_stats_moe_layer) % 64 == 0);
	C(DP_STATS_MOE_OFFSET + sizeof(struct dp_stats_moe) +
		  DP_STATS_MOE_LAYERS * sizeof(struct dp_stats_moe_layer) <=
	      DP_STATS_SEGMENT_SIZE);
	/* per-expert tokens: a token once per expert it chose; no expert (-1) and ids past
	 * the layer's experts not counted */
	struct dp_routing_entry e[3][2] = {
		{ { 2, 1.0f }, { 5, 1.0f } },
		{ { 2, 1.0f }, { DP_ROUTING_NO_EXPERT, 0.0f } },
		{ { 0, 1.0f }, { 6, 1.0f } },
	};
	uint64_t n[8] = { 0 };
	C(dp_expert_load_count((const uint8_t *)e, 3, 2, 6, n) == 4);
	C(n[0] == 1 && n[2] == 2 && n[5] == 1 && n[1] == 0 && n[6] == 0);
	printf("test_stats: %s\n", failures ? "FAILED" : "ok");
	return failures ? 1 : 0;
}
