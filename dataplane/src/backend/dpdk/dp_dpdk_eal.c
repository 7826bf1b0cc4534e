/* dp_dpdk_eal.c: the EAL, once per process (dp_dpdk.h). */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include <rte_eal.h>
#include <rte_errno.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* 0 before init, the number of open dpdk NICs after. */
static int eal_users;
static bool eal_up, eal_done;

int dp_dpdk_eal_get(void)
{
	if (eal_up) {
		eal_users++;
		return 0;
	}
	if (eal_done) {
		dp_set_error("the EAL was cleaned up and cannot start again in this process");
		return -1;
	}
	/* rte_eal_init permutes its argv: hand it a copy, with a program name first */
	int argc = dp_backend_args.argc + 1;
	char **argv = calloc((size_t)argc + 1, sizeof(char *));
	if (!argv) {
		dp_set_error("out of memory for the EAL's arguments");
		return -1;
	}
	argv[0] = "duckpipe-dataplane";
	for (int i = 0; i < dp_backend_args.argc; i++)
		argv[i + 1] = dp_backend_args.argv[i];
	cpu_set_t before;
	bool have_before = pthread_getaffinity_np(pthread_self(), sizeof(before), &before) == 0;
	int rc = rte_eal_init(argc, argv);
	free(argv);
	if (rc < 0) {
		dp_set_error("rte_eal_init: %s (err=%d); the EAL options come after -- "
			     "(e.g. --no-pci --in-memory --vdev=net_af_packet0,iface=IF -l 0); "
			     "DPDK needs root and free hugepages",
			     rte_strerror(rte_errno), rte_errno);
		return -1;
	}
	if (rc < argc - 1)
		DP_WARN("rte_eal_init took %d of the %d options after --; ignored from '%s' on",
			rc, argc - 1, dp_backend_args.argv[rc]);
	/* the EAL pinned this thread to its main lcore; duckpipe's runners pin themselves */
	if (have_before)
		(void)pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
	eal_up = true;
	eal_users = 1;
	return 0;
}

void dp_dpdk_eal_put(void)
{
	if (!eal_up || --eal_users > 0)
		return;
	rte_eal_cleanup();
	eal_up = false;
	eal_done = true;
}
