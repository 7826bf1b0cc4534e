/* dp_lcore.h: NIC workers on the EAL's worker lcores (threads = "dedicated", dpdk NICs).
 *
 * The EAL made a thread per lcore of its -l / --lcores list at rte_eal_init, each
 * pinned to that lcore's CPUs; all but the main lcore wait for rte_eal_remote_launch.
 * dp_main.c hands the n-th dpdk NIC's runner to the n-th worker lcore (in
 * RTE_LCORE_FOREACH_WORKER order) and joins it with rte_eal_wait_lcore. Built with
 * DPDK's flags where the build has DPDK; without it there are no worker lcores.
 */
#ifndef DP_LCORE_H
#define DP_LCORE_H

#include <stddef.h>

/* The EAL's worker lcores (its lcores but the main one); 0 without the EAL. */
unsigned dp_lcore_workers(void);
/* The n-th worker lcore's id, n < dp_lcore_workers(). */
unsigned dp_lcore_worker(unsigned n);
/* The lcores as the EAL has them, for messages: "0 (main, CPU 0), 1 (CPU 1)". */
void dp_lcore_describe_all(char *out, size_t size);
/* The CPUs an lcore's thread is pinned to: "1" or "0-1" or "0,2". */
void dp_lcore_cpus(unsigned lcore, char *out, size_t size);
/* Does the lcore's cpuset hold exactly this one CPU? */
int dp_lcore_is_only_cpu(unsigned lcore, int cpu);
/* rte_eal_remote_launch(fn, arg, lcore): 0, or -1 with dp_error. */
int dp_lcore_launch(unsigned lcore, int (*fn)(void *), void *arg);
/* rte_eal_wait_lcore: waits for fn to return. */
void dp_lcore_wait(unsigned lcore);

#endif /* DP_LCORE_H */
