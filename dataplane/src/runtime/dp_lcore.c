/* dp_lcore.c: launching NIC workers on EAL worker lcores (dp_lcore.h). */
#include "dp_lcore.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "dp_common.h"

#ifdef DP_HAVE_DPDK
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>

unsigned dp_lcore_workers(void)
{
	unsigned n = rte_lcore_count();
	return n ? n - 1 : 0;
}

unsigned dp_lcore_worker(unsigned n)
{
	unsigned id, k = 0;
	RTE_LCORE_FOREACH_WORKER(id)
	{
		if (k++ == n)
			return id;
	}
	return RTE_MAX_LCORE;
}

void dp_lcore_cpus(unsigned lcore, char *out, size_t size)
{
	rte_cpuset_t set = rte_lcore_cpuset(lcore);
	size_t used = 0;
	out[0] = 0;
	for (int c = 0; c < CPU_SETSIZE && used < size; c++) {
		if (!CPU_ISSET(c, &set))
			continue;
		int last = c;
		while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
			last++;
		int k = last > c ? snprintf(out + used, size - used, "%s%d-%d", used ? "," : "", c, last)
				 : snprintf(out + used, size - used, "%s%d", used ? "," : "", c);
		used += k > 0 ? (size_t)k : 0;
		c = last;
	}
}

int dp_lcore_is_only_cpu(unsigned lcore, int cpu)
{
	rte_cpuset_t set = rte_lcore_cpuset(lcore);
	return cpu >= 0 && cpu < CPU_SETSIZE && CPU_COUNT(&set) == 1 && CPU_ISSET(cpu, &set);
}

void dp_lcore_describe_all(char *out, size_t size)
{
	size_t used = 0;
	unsigned id;
	out[0] = 0;
	RTE_LCORE_FOREACH(id)
	{
		if (used >= size)
			break;
		char cpus[64];
		dp_lcore_cpus(id, cpus, sizeof(cpus));
		int k = snprintf(out + used, size - used, "%s%u (%sCPU %s)", used ? ", " : "", id,
				 id == rte_get_main_lcore() ? "main, " : "", cpus);
		used += k > 0 ? (size_t)k : 0;
	}
}

int dp_lcore_launch(unsigned lcore, int (*fn)(void *), void *arg)
{
	int rc = rte_eal_remote_launch(fn, arg, lcore);
	if (rc) {
		dp_set_error("rte_eal_remote_launch: err=%d, lcore=%u", rc, lcore);
		return -1;
	}
	return 0;
}

void dp_lcore_wait(unsigned lcore)
{
	(void)rte_eal_wait_lcore(lcore);
}
#else
unsigned dp_lcore_workers(void)
{
	return 0;
}

unsigned dp_lcore_worker(unsigned n)
{
	(void)n;
	return ~0u;
}

void dp_lcore_cpus(unsigned lcore, char *out, size_t size)
{
	(void)lcore;
	snprintf(out, size, "?");
}

int dp_lcore_is_only_cpu(unsigned lcore, int cpu)
{
	(void)lcore, (void)cpu;
	return 0;
}

void dp_lcore_describe_all(char *out, size_t size)
{
	snprintf(out, size, "none (a build without DPDK)");
}

int dp_lcore_launch(unsigned lcore, int (*fn)(void *), void *arg)
{
	(void)fn, (void)arg;
	dp_set_error("lcore %u: a build without DPDK has no EAL lcores", lcore);
	return -1;
}

void dp_lcore_wait(unsigned lcore)
{
	(void)lcore;
}
#endif
