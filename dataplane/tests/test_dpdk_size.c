/* test_dpdk_size.c: a dpdk port's sizes from the topology and the NUMA verdict
 * (dp_dpdk_size.c), without a port: exit 0 pass, 1 fail. */
#include <string.h>

#include <rte_config.h>

#include "dp_common.h"
#include "dp_dpdk_size.h"
#include "test_check.h"

static void rx_want_holds_one_forwards_replies(void)
{
	CHECK(dp_dpdk_rx_want(1, 10) == DP_DPDK_RX_DESC_MIN, "a small NIC keeps the floor");
	/* the issue: 24 ducks x 157 frames (229 KiB replies) = 3768 */
	CHECK(dp_dpdk_rx_want(24, 157) == 4096, "%u", dp_dpdk_rx_want(24, 157));
	CHECK(dp_dpdk_rx_want(8, 128) == 1024, "exactly 1024: %u", dp_dpdk_rx_want(8, 128));
	CHECK(dp_dpdk_rx_want(8, 129) == 2048, "%u", dp_dpdk_rx_want(8, 129));
	CHECK(dp_dpdk_rx_want(256, 720) == DP_DPDK_RX_DESC_MAX, "capped: %u",
	      dp_dpdk_rx_want(256, 720));
}

static void a_count_the_port_refuses_is_an_error_naming_it(void)
{
	struct dp_dpdk_desc_lim ice = { .nb_max = 4096, .nb_min = 64, .nb_align = 32 };
	CHECK(dp_dpdk_desc_check("rx_desc", 2048, &ice) == 0, "%s", dp_error());
	CHECK(dp_dpdk_desc_check("rx_desc", 8192, &ice) < 0, "past nb_max");
	CHECK(strstr(dp_error(), "rx_desc = 8192: the port takes 64 to 4096 descriptors, a "
				 "multiple of 32"),
	      "%s", dp_error());
	CHECK(dp_dpdk_desc_check("tx_desc", 1000, &ice) < 0, "not a multiple of 32");
	CHECK(strstr(dp_error(), "tx_desc = 1000"), "%s", dp_error());
	CHECK(dp_dpdk_desc_check("rx_desc", 32, &ice) < 0, "below nb_min");
	struct dp_dpdk_desc_lim any = { .nb_max = UINT16_MAX }; /* a vdev: no align given */
	CHECK(dp_dpdk_desc_check("rx_desc", 1000, &any) == 0, "%s", dp_error());
}

static void the_cache_fits_what_rte_mempool_takes(void)
{
	CHECK(dp_dpdk_cache_size(100000) == 256, "l2fwd's: %u", dp_dpdk_cache_size(100000));
	CHECK(dp_dpdk_cache_size(300) == 200, "1.5 x cache <= n: %u", dp_dpdk_cache_size(300));
	CHECK(DP_DPDK_CACHE <= RTE_MEMPOOL_CACHE_MAX_SIZE, "the cache is within the EAL's max");
}

static void the_pool_holds_the_rings_and_follows_the_budget(void)
{
	struct dp_dpdk_pool_in in = { .nrx = 4096, .ntx = 1024, .lcores = 2, .zc_chunks = 10000,
				      .elt_bytes = 2304, .budget_bytes = 0 };
	struct dp_dpdk_pool_plan plan;
	CHECK(dp_dpdk_pool_plan(&in, &plan) == 0, "%s", dp_error());
	uint32_t rings = 4096 + 1024 + 4 * DP_DPDK_BURST, caches = 2 * DP_DPDK_CACHE * 3 / 2;
	CHECK(plan.mbufs == rings + caches + 10000 && !plan.capped, "no budget: %u", plan.mbufs);
	CHECK(plan.cache == DP_DPDK_CACHE, "%u", plan.cache);
	/* a budget smaller than want: zero-copy room goes first */
	in.budget_bytes = (uint64_t)(rings + caches + 1000) * in.elt_bytes;
	CHECK(dp_dpdk_pool_plan(&in, &plan) == 0 && plan.capped, "capped");
	CHECK(plan.mbufs == rings + caches + 1000, "%u", plan.mbufs);
	/* ... never below the rings and caches */
	in.budget_bytes = 1 << 20;
	CHECK(dp_dpdk_pool_plan(&in, &plan) == 0 && plan.mbufs == rings + caches, "%u",
	      plan.mbufs);
	/* mbufs set: taken as it is when it fills the rings, refused when not */
	in.mbufs_cfg = 6000;
	CHECK(dp_dpdk_pool_plan(&in, &plan) == 0 && plan.mbufs == 6000 && !plan.capped, "%u",
	      plan.mbufs);
	in.mbufs_cfg = 100;
	CHECK(dp_dpdk_pool_plan(&in, &plan) < 0, "fewer mbufs than the rings");
	CHECK(strstr(dp_error(), "mbufs = 100: the port's rings hold 5248"), "%s", dp_error());
}

static void a_worker_on_another_socket_is_told(void)
{
	int local[] = { 0, 0 }, remote[] = { 1, 1 }, spans[] = { 0, 1 };
	CHECK(dp_dpdk_numa_verdict(0, local, 2) == DP_DPDK_NUMA_LOCAL, "local");
	CHECK(dp_dpdk_numa_verdict(0, remote, 2) == DP_DPDK_NUMA_REMOTE, "remote");
	CHECK(dp_dpdk_numa_verdict(0, spans, 2) == DP_DPDK_NUMA_SPANS, "spans");
	CHECK(dp_dpdk_numa_verdict(-1, remote, 2) == DP_DPDK_NUMA_UNKNOWN, "a vdev: no socket");
	CHECK(dp_dpdk_numa_verdict(0, local, 0) == DP_DPDK_NUMA_UNKNOWN, "no CPUs known");
	CHECK(dp_dpdk_cpu_socket(0) >= 0, "CPU 0 has a node in sysfs: %d", dp_dpdk_cpu_socket(0));
}

static void zero_copy_room_is_bounded_whatever_max_forward_bytes(void)
{
	/* the old default: 64 contexts of 1 MiB, 754 chunks of 1392 bytes each */
	CHECK(dp_dpdk_zc_chunks(64, 1 << 20, 1392) == 64 * 754, "%lu",
	      (unsigned long)dp_dpdk_zc_chunks(64, 1 << 20, 1392));
	/* 64 MiB forwards: two of them (128 MiB), not 64 (3 million mbufs) */
	CHECK(dp_dpdk_zc_chunks(64, 64 << 20, 1392) == 2 * 48211, "%lu",
	      (unsigned long)dp_dpdk_zc_chunks(64, 64 << 20, 1392));
	/* a forward over the bound: one's chunks */
	CHECK(dp_dpdk_zc_chunks(4, 200u << 20, 8892) == (DP_DPDK_ZC_BYTES + 8891) / 8892, "%lu",
	      (unsigned long)dp_dpdk_zc_chunks(4, 200u << 20, 8892));
	CHECK(dp_dpdk_zc_chunks(0, 1 << 20, 1392) == 0, "no contexts");
}

int main(void)
{
	zero_copy_room_is_bounded_whatever_max_forward_bytes();
	rx_want_holds_one_forwards_replies();
	a_count_the_port_refuses_is_an_error_naming_it();
	the_cache_fits_what_rte_mempool_takes();
	the_pool_holds_the_rings_and_follows_the_budget();
	a_worker_on_another_socket_is_told();
	return test_result("test_dpdk_size");
}
