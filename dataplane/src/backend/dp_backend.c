/* dp_backend.c: which backends this build has, and the options after "--". */
#include <stdlib.h>
#include <string.h>

#include "dp_backend.h"
#include "dp_common.h"

struct dp_backend_args dp_backend_args;

const char *dp_backend_names(void)
{
#ifdef DP_HAVE_DPDK
	return "socket null dpdk";
#else
	return "socket null";
#endif
}

const struct dp_backend_ops *dp_backend_lookup(const char *name)
{
	static const struct dp_backend_ops *const all[] = {
		&dp_backend_socket,
		&dp_backend_null,
#ifdef DP_HAVE_DPDK
		&dp_backend_dpdk,
#endif
	};
	for (size_t i = 0; i < DP_ARRAY_LEN(all); i++)
		if (!strcmp(all[i]->name, name))
			return all[i];
#ifndef DP_HAVE_DPDK
	if (!strcmp(name, "dpdk")) {
		dp_set_error("this dataplane was built without DPDK: install libdpdk-dev "
			     "(tools/setup does) and rebuild");
		return NULL;
	}
#endif
	dp_set_error("backend '%s' is not built in (have: %s)", name, dp_backend_names());
	return NULL;
}

void dp_backend_mem_register(struct dp_mem *m, void *va, size_t len, size_t page_sz)
{
	*m = (struct dp_mem){ .va = va, .len = len, .page_sz = page_sz,
			      .n_pages = (uint32_t)(len / page_sz) };
#ifdef DP_HAVE_DPDK
	dp_dpdk_mem_register(m);
#endif
}

void dp_backend_mem_unregister(struct dp_mem *m)
{
#ifdef DP_HAVE_DPDK
	dp_dpdk_mem_unregister(m);
#endif
	free(m->iova);
	*m = (struct dp_mem){ 0 };
}
