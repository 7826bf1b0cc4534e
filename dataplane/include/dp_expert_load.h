/* dp_expert_load.h: a routed forward's tokens per expert, for the stats segment's MoE
 * region (dp_stats_moe.c, issue 30 point 4). Header-only, so that routing-bench times the
 * very loop the dataplane runs.
 *
 * Where it runs, and why there: the control agent calls it as it sends a routed forward's
 * completion, on the dispatcher's checked copy of the host table (the context's route),
 * which the context holds until that agent releases it. The slot's done word has told the
 * client already, and neither the dispatcher nor the NIC workers run it: the forward path
 * does not wait for it. The control agent is the stats segment's one writer, so each
 * count is a plain increment stored relaxed (a reader sees each value whole, never a lock).
 */
#ifndef DP_EXPERT_LOAD_H
#define DP_EXPERT_LOAD_H

#include <stdint.h>
#include <string.h>

#include "dp_barrier.h"
#include "dp_routing_abi.h"

/* Add each entry of the host entries e0 ([tokens][topk], a table dp_routing_check
 * accepted) to its expert's count in counts[n_experts]: a token counts once per expert it
 * chose (the placement's replicas are not told apart here). Entries naming no expert
 * (ROUTING_NO_EXPERT, the gate's -1) or an id at or past n_experts are not counted.
 * Returns how many were. */
static inline uint64_t dp_expert_load_count(const uint8_t *e0, uint32_t tokens, uint32_t topk,
					    uint32_t n_experts, uint64_t *counts)
{
	uint64_t n = (uint64_t)tokens * topk, counted = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint32_t e;
		memcpy(&e, e0 + i * sizeof(struct dp_routing_entry), sizeof(e));
		if (e >= n_experts)
			continue; /* no expert: no duck computes it, nobody's load */
		dp_store_relaxed_u64(&counts[e], counts[e] + 1);
		counted++;
	}
	return counted;
}

#endif /* DP_EXPERT_LOAD_H */
