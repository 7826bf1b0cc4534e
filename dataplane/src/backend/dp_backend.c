/* dp_backend.c: which backends this build has, and the options after "--". */
#include <stdlib.h>
#include <string.h>

#include "dp_backend.h"
#include "dp_barrier.h"
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

/* Dekker's handshake, seq_cst on both sides: a reader announces itself, then looks
 * whether the backend is live; close marks it dead, then waits for the readers it
 * did not stop. Either the reader sees dead, or close sees the reader. */
uint32_t dp_backend_xstats(struct dp_backend *b, struct dp_xstat *out, uint32_t max,
			   uint64_t *left_out)
{
	uint32_t n = 0;
	*left_out = 0;
	if (!b->ops || !b->ops->xstats)
		return 0;
	__atomic_fetch_add(&b->xstats_readers, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&b->xstats_live, __ATOMIC_SEQ_CST))
		n = b->ops->xstats(b, out, max, left_out);
	__atomic_fetch_sub(&b->xstats_readers, 1, __ATOMIC_SEQ_CST);
	return n;
}

void dp_backend_xstats_live(struct dp_backend *b)
{
	__atomic_store_n(&b->xstats_live, 1, __ATOMIC_SEQ_CST); /* after open's stores */
}

void dp_backend_xstats_dead(struct dp_backend *b)
{
	__atomic_store_n(&b->xstats_live, 0, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&b->xstats_readers, __ATOMIC_SEQ_CST))
		dp_cpu_relax(); /* a Stats request reading the port: microseconds */
}
