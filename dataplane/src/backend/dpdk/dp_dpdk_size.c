/* dp_dpdk_size.c: a dpdk port's rings, mbuf pool and cache sized from the topology, and
 * the worker's NUMA socket against the port's (dp_dpdk_size.h). No DPDK calls: the
 * backend gathers the numbers at open (dp_backend_dpdk.c), test_dpdk_size.c checks this. */
#include "dp_dpdk_size.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include <rte_config.h> /* RTE_MEMPOOL_CACHE_MAX_SIZE */

#include "dp_common.h"

uint32_t dp_dpdk_rx_want(uint32_t ducks, uint32_t reply_frames)
{
	uint64_t need = (uint64_t)ducks * reply_frames;
	uint32_t n = DP_DPDK_RX_DESC_MIN;
	while (n < need && n < DP_DPDK_RX_DESC_MAX)
		n <<= 1;
	return n;
}

uint64_t dp_dpdk_zc_chunks(uint32_t max_inflight, uint32_t max_forward_bytes, uint32_t payload)
{
	uint64_t bytes = (uint64_t)max_inflight * max_forward_bytes;
	if (bytes > DP_DPDK_ZC_BYTES)
		bytes = DP_DPDK_ZC_BYTES;
	/* each forward's chunks are whole: one more per context for its last, short one */
	uint64_t per = max_forward_bytes < bytes ? max_forward_bytes : bytes;
	uint64_t forwards = per ? bytes / per : 0;
	return forwards * ((per + payload - 1) / payload);
}

int dp_dpdk_desc_check(const char *what, uint32_t n, const struct dp_dpdk_desc_lim *lim)
{
	uint32_t align = lim->nb_align ? lim->nb_align : 1;
	if (n < lim->nb_min || n > lim->nb_max || n % align) {
		dp_set_error("%s = %u: the port takes %u to %u descriptors, a multiple of %u "
			     "(0: sized from the topology)",
			     what, n, lim->nb_min, lim->nb_max, align);
		return -1;
	}
	return 0;
}

uint32_t dp_dpdk_cache_size(uint32_t n)
{
	uint32_t cache = DP_DPDK_CACHE;
	if (cache > RTE_MEMPOOL_CACHE_MAX_SIZE)
		cache = RTE_MEMPOOL_CACHE_MAX_SIZE;
	/* rte_mempool_create refuses a cache whose flush threshold (1.5 x) passes n */
	if ((uint64_t)cache * 3 / 2 > n)
		cache = n * 2 / 3;
	return cache;
}

int dp_dpdk_pool_plan(const struct dp_dpdk_pool_in *in, struct dp_dpdk_pool_plan *out)
{
	/* the rings full, a burst in each direction plus the one held by rx_burst and the
	 * one being built, and each lcore's cache at its flush threshold */
	uint64_t rings = (uint64_t)in->nrx + in->ntx + 4 * DP_DPDK_BURST;
	uint64_t caches = (uint64_t)in->lcores * DP_DPDK_CACHE * 3 / 2;
	uint64_t want = rings + caches + in->zc_chunks;
	if (want > UINT32_MAX)
		want = UINT32_MAX;
	memset(out, 0, sizeof(*out));
	out->want = (uint32_t)want;
	uint64_t n = want;
	if (in->mbufs_cfg) {
		if (in->mbufs_cfg < rings) {
			dp_set_error("mbufs = %u: the port's rings hold %lu (%u RX + %u TX descriptors "
				     "and bursts): at least that many (0: sized from the topology)",
				     in->mbufs_cfg, (unsigned long)rings, in->nrx, in->ntx);
			return -1;
		}
		n = in->mbufs_cfg;
	} else if (in->budget_bytes && in->elt_bytes && n * in->elt_bytes > in->budget_bytes) {
		/* less room for zero-copy chunks in flight (they wait for mbufs, counted as
		 * tx_errors and resent), never less than the rings and caches need */
		n = in->budget_bytes / in->elt_bytes;
		if (n < rings + caches)
			n = rings + caches;
		out->capped = n < want;
	}
	out->mbufs = (uint32_t)n;
	out->cache = dp_dpdk_cache_size(out->mbufs);
	return 0;
}

/* free_hugepages x the page size, for every page size under dir (hugepages-<kB>kB) */
static uint64_t free_in(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	uint64_t bytes = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		unsigned long kb, pages;
		if (sscanf(e->d_name, "hugepages-%lukB", &kb) != 1)
			continue;
		char path[512];
		snprintf(path, sizeof(path), "%s/%s/free_hugepages", dir, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%lu", &pages) == 1)
			bytes += (uint64_t)pages * kb * 1024;
		fclose(f);
	}
	closedir(d);
	return bytes;
}

uint64_t dp_dpdk_hugepages_free(int socket)
{
	if (socket >= 0) {
		char dir[128];
		snprintf(dir, sizeof(dir), "/sys/devices/system/node/node%d/hugepages", socket);
		uint64_t b = free_in(dir);
		if (b)
			return b;
	}
	return free_in("/sys/kernel/mm/hugepages");
}

enum dp_dpdk_numa dp_dpdk_numa_verdict(int port_socket, const int *cpu_sockets, unsigned n)
{
	if (port_socket < 0 || !n)
		return DP_DPDK_NUMA_UNKNOWN;
	unsigned local = 0;
	for (unsigned i = 0; i < n; i++)
		local += cpu_sockets[i] == port_socket;
	if (local == n)
		return DP_DPDK_NUMA_LOCAL;
	return local ? DP_DPDK_NUMA_SPANS : DP_DPDK_NUMA_REMOTE;
}

int dp_dpdk_cpu_socket(unsigned cpu)
{
	char dir[96];
	snprintf(dir, sizeof(dir), "/sys/devices/system/cpu/cpu%u", cpu);
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int node = -1;
	struct dirent *e;
	while ((e = readdir(d)))
		if (sscanf(e->d_name, "node%d", &node) == 1)
			break;
	closedir(d);
	return node;
}
