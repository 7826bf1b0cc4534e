/* dp_backend_xstats.c: a port's xstats read from the control agent's thread while the
 * NIC worker may be closing it. A leaf: the backends call _live and _dead, Stats calls
 * dp_backend_xstats, which calls back into no backend file but through its ops table.
 */
#include "dp_backend.h"
#include "dp_barrier.h"
#include "dp_common.h"

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
