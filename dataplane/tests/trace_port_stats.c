/* trace_port_stats.so: an LD_PRELOAD shim that notes every read of a port's statistics
 * (rte_eth_stats_get, rte_eth_xstats_get) as "tid seconds name", appended to the file
 * $DP_TRACE names, then calls DPDK's own. tests/dataplane/test_dpdk_rxsize.py starts the
 * dataplane under it to check that one thread (the NIC worker) reads them while the
 * control agent answers GetStats from its snapshot: ethdev does not make two readers
 * safe. Built with DPDK's headers, so a signature that drifts from ethdev's is a compile
 * error; without sanitizers (it only wraps two calls).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rte_ethdev.h>

typedef int (*stats_get_fn)(uint16_t, struct rte_eth_stats *);
typedef int (*xstats_get_fn)(uint16_t, struct rte_eth_xstat *, unsigned int);

/* One line per call; the file is opened each time so that every thread's line lands
 * whole (O_APPEND) and nothing is held between calls. */
static void note(const char *what)
{
	const char *path = getenv("DP_TRACE");
	struct timespec ts;
	if (!path)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
	if (fd < 0)
		return;
	dprintf(fd, "%ld %ld.%09ld %s\n", (long)syscall(SYS_gettid), (long)ts.tv_sec,
		ts.tv_nsec, what);
	close(fd);
}

int rte_eth_stats_get(uint16_t port, struct rte_eth_stats *s)
{
	stats_get_fn real = (stats_get_fn)dlsym(RTLD_NEXT, "rte_eth_stats_get");
	note("rte_eth_stats_get");
	return real(port, s);
}

int rte_eth_xstats_get(uint16_t port, struct rte_eth_xstat *x, unsigned int n)
{
	xstats_get_fn real = (xstats_get_fn)dlsym(RTLD_NEXT, "rte_eth_xstats_get");
	note("rte_eth_xstats_get");
	return real(port, x, n);
}
