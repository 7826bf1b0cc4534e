/* dp_routing_bench.c: how long dp_routing_check and dp_routing_split take on one
 * prefill-sized routed forward (issue 28.6: each at most 100 us at 4,096 tokens x top-8),
 * and the client's dp_routing_pack that writes the table.
 *
 * A DeepSeek-V3-like gate: 256 routed experts, top-8, a random but seeded choice of 8
 * distinct experts per token in no order (as a gate gives them, by score), packed (and so
 * sorted per token) by dp_routing_pack; the placement spreads the experts over --ducks
 * ducks (expert e on duck e % ducks), each on --replicas ducks, and the split is timed for
 * every duck (one NIC) and for half of them (one of two NICs), with bank slots, as
 * dp_moe.c calls it. Prints the median and the minimum of --reps runs of each, in
 * microseconds:
 *   pack MEDIAN_US MIN_US
 *   check MEDIAN_US MIN_US
 *   split_all MEDIAN_US MIN_US
 *   split_half MEDIAN_US MIN_US
 *   expert_count MEDIAN_US MIN_US   (the stats segment's per-expert count, dp_expert_load.h)
 *   dispatch MEDIAN_US MIN_US        the dispatcher's plan and count, every duck live
 * and with --lost N (default 1) ducks known lost (duck 0 up; issue 30.1), what a forward
 * that routes around them costs instead: the dispatcher's live placement, plan and count,
 * and its rerouted count by the placement as loaded; each NIC's live placement and split:
 *   dispatch_lost MEDIAN_US MIN_US
 *   split_all_lost MEDIAN_US MIN_US
 * (with one replica an expert on a lost duck has none: those rows are skipped).
 * Run it on an idle core for numbers to quote; it is not a test (nothing is asserted).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp_expert_load.h"
#include "dp_routing.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *name, uint64_t *ns, int reps)
{
	qsort(ns, (size_t)reps, sizeof(*ns), cmp_u64);
	printf("%s %.1f %.1f\n", name, ns[reps / 2] / 1e3, ns[0] / 1e3);
}

/* The dispatch and split rows, all live and with ducks 1..nlost known lost (dp_dispatch.c
 * route_forward, dp_moe.c dp_moe_send). */
static void lost_rows(const uint8_t *table, uint64_t len, uint32_t tokens, uint32_t topk,
		      const struct dp_routing_placement *pl, const uint16_t *slots,
		      const uint64_t *all, uint32_t nducks, uint32_t nlost, uint8_t *wire,
		      uint64_t wire_cap, uint64_t *ns, int reps)
{
	static struct dp_routing_plan plan;
	static struct dp_routing_placement live;
	static uint16_t live_slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS];
	uint64_t lost[DP_MAX_DUCKS / 64] = { 0 }, size, targets[DP_MAX_DUCKS / 64], moved = 0;
	uint32_t count[DP_MAX_DUCKS];
	const uint8_t *e0 = table + DP_ROUTING_HEADER_SIZE;
	char why[128];
	for (uint32_t d = 1; d <= nlost && d < nducks; d++)
		lost[d >> 6] |= 1ull << (d & 63);
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		dp_routing_plan(&plan, pl, NULL, NULL);
		int rc = dp_routing_count(&plan, e0, tokens, topk, count, why, sizeof(why));
		ns[i] = now_ns() - t0;
		if (rc < 0)
			fprintf(stderr, "count: %s\n", why);
	}
	report("dispatch", ns, reps);
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		dp_routing_live(pl, NULL, lost, &live, NULL);
		dp_routing_plan(&plan, &live, NULL, NULL);
		int rc = dp_routing_count(&plan, e0, tokens, topk, count, why, sizeof(why));
		dp_routing_plan(&plan, pl, NULL, NULL); /* the rerouted count */
		rc |= dp_routing_count(&plan, e0, tokens, topk, count, why, sizeof(why));
		ns[i] = now_ns() - t0;
		if (rc < 0)
			fprintf(stderr, "count: %s\n", why);
		moved = count[1];
	}
	report("dispatch_lost", ns, reps);
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		dp_routing_live(pl, slots, lost, &live, live_slots);
		int rc = dp_routing_split(table, len, &live, live_slots, 0, all, wire, wire_cap,
					  &size, targets, why, sizeof(why));
		ns[i] = now_ns() - t0;
		if (rc < 0 || targets[0] & lost[0])
			fprintf(stderr, "split: %s\n", rc < 0 ? why : "a lost duck has a section");
	}
	report("split_all_lost", ns, reps);
	fprintf(stderr, "(duck 1 alone would have had %lu entries)\n", (unsigned long)moved);
}

int main(int argc, char **argv)
{
	uint32_t tokens = 4096, topk = 8, n_experts = 256, nducks = 8, replicas = 1, nlost = 1;
	int reps = 200, opt;
	while ((opt = getopt(argc, argv, "t:k:e:d:r:n:l:")) != -1) {
		switch (opt) {
		case 't': tokens = (uint32_t)atoi(optarg); break;
		case 'k': topk = (uint32_t)atoi(optarg); break;
		case 'e': n_experts = (uint32_t)atoi(optarg); break;
		case 'd': nducks = (uint32_t)atoi(optarg); break;
		case 'r': replicas = (uint32_t)atoi(optarg); break;
		case 'n': reps = atoi(optarg); break;
		case 'l': nlost = (uint32_t)atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-t tokens] [-k topk] [-e experts] [-d ducks] "
					"[-r replicas] [-n reps] [-l lost ducks]\n", argv[0]);
			return 2;
		}
	}
	if (reps < 1 || topk > n_experts || replicas > nducks || replicas > DP_MAX_REPLICAS ||
	    nlost >= nducks) {
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	uint64_t len;
	if (dp_routing_size(tokens, topk, &len) < 0) {
		fprintf(stderr, "%u tokens x %u: too big\n", tokens, topk);
		return 2;
	}
	uint32_t *idx = malloc(sizeof(uint32_t) * tokens * topk);
	float *wts = malloc(sizeof(float) * tokens * topk);
	uint8_t *table = malloc(len);
	uint64_t wire_cap = DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE * DP_MAX_DUCKS +
			    DP_ROUTING_WIRE_ENTRY_SIZE * (uint64_t)tokens * topk;
	uint8_t *wire = malloc(wire_cap);
	static struct dp_routing_placement pl;
	static uint16_t slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS];
	uint64_t *ns = malloc(sizeof(uint64_t) * (size_t)reps);
	if (!idx || !wts || !table || !wire || !ns)
		return 2;
	srand(28);
	for (uint32_t t = 0; t < tokens; t++)
		for (uint32_t k = 0; k < topk; k++) {
			uint32_t e;
		again:
			e = (uint32_t)rand() % n_experts;
			for (uint32_t j = 0; j < k; j++)
				if (idx[t * topk + j] == e)
					goto again;
			idx[t * topk + k] = e;
			wts[t * topk + k] = 1.0f / (float)(k + 1);
		}
	char why[128];
	if (dp_routing_pack(idx, 4, wts, tokens, topk, n_experts, table, len, why, sizeof(why)) <
	    0) {
		fprintf(stderr, "pack: %s\n", why);
		return 1;
	}
	pl.n_experts = n_experts;
	for (uint32_t e = 0; e < n_experts; e++) {
		pl.replicas[e] = (uint8_t)replicas;
		for (uint32_t r = 0; r < replicas; r++)
			pl.ducks[e * DP_MAX_REPLICAS + r] = (uint16_t)((e + r) % nducks);
	}
	dp_routing_bank_slots(&pl, slots, NULL);
	uint64_t all[DP_MAX_DUCKS / 64] = { 0 }, half[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t d = 0; d < nducks; d++) {
		all[d >> 6] |= 1ull << (d & 63);
		if (d < (nducks + 1) / 2)
			half[d >> 6] |= 1ull << (d & 63);
	}

	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		int rc = dp_routing_pack(idx, 4, wts, tokens, topk, n_experts, table, len, why,
					 sizeof(why));
		ns[i] = now_ns() - t0;
		if (rc < 0) {
			fprintf(stderr, "pack: %s\n", why);
			return 1;
		}
	}
	report("pack", ns, reps);
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		int rc = dp_routing_check(table, len, tokens, n_experts, why, sizeof(why));
		ns[i] = now_ns() - t0;
		if (rc < 0) {
			fprintf(stderr, "check: %s\n", why);
			return 1;
		}
	}
	report("check", ns, reps);
	const uint64_t *sets[2] = { all, half };
	const char *names[2] = { "split_all", "split_half" };
	for (int s = 0; s < 2; s++) {
		uint64_t size, targets[DP_MAX_DUCKS / 64];
		for (int i = 0; i < reps; i++) {
			uint64_t t0 = now_ns();
			int rc = dp_routing_split(table, len, &pl, slots, 0, sets[s], wire, wire_cap,
						  &size, targets, why, sizeof(why));
			ns[i] = now_ns() - t0;
			if (rc < 0) {
				fprintf(stderr, "split: %s\n", why);
				return 1;
			}
		}
		report(names[s], ns, reps);
	}
	static uint64_t counts[DP_MAX_EXPERTS];
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		dp_expert_load_count(table + DP_ROUTING_HEADER_SIZE, tokens, topk, n_experts, counts);
		ns[i] = now_ns() - t0;
	}
	report("expert_count", ns, reps);
	if (replicas > 1)
		lost_rows(table, len, tokens, topk, &pl, slots, all, nducks, nlost, wire, wire_cap,
			  ns, reps);
	free(idx);
	free(wts);
	free(table);
	free(wire);
	free(ns);
	return 0;
}
