/* dp_release.c: no slot goes back to its client while a port may still read it.
 *
 * With zero-copy transmit (dp_dpdk_zc.c) a port sends activation chunks and weight
 * bytes straight from the client's slot, as external buffers that it frees when it is
 * done with them: inside rte_eth_tx_burst for af_packet and tap (which copy into the
 * kernel), on a later tx_burst or rte_eth_tx_done_cleanup for a NIC that DMAs. Each
 * piece is counted on its owner, the context's part on that NIC (dp_nic_part.owner),
 * until its free callback runs. A part whose ducks have answered (or whose deadline
 * passed) but whose pieces the port still holds is not ended: it waits here, and the
 * worker asks the port to free (tx_reclaim) on every loop until the count is 0; only
 * then does the worker end it (dp_fwd_part_done), and the last NIC out publishes the
 * done word and hands the context to the control agent (dp_fwd_complete): the slot goes
 * back to the client after the port's last read. This file only says which parts the
 * port let go of; the worker ends them (dp_worker.c), in one place. A port that never
 * frees is logged after DP_RELEASE_WARN_NS; the part keeps waiting (its status, a
 * timeout say, is decided already): the client sees a forward still pending, never a
 * slot handed back too early, and the client's segment stays mapped and registered (the
 * control agent unmaps it only once nothing of it is in flight). On af_packet and tap,
 * and on the socket and null backends, the count is 0 when the part ends: nothing waits
 * and nothing is counted.
 */
#include "dp_release.h"

#include "dp_fwd.h"

static uint32_t held(const struct dp_release_list *r, struct dp_fwd *f)
{
	/* the free callbacks ran on this thread, inside the backend's calls (dp_dpdk_zc.c) */
	return __atomic_load_n(&f->part[r->nic].owner.held, __ATOMIC_RELAXED);
}

bool dp_release_part(struct dp_release_list *r, struct dp_fwd *f, uint32_t status,
		     uint64_t now)
{
	if (held(r, f) && r->be->ops->tx_reclaim)
		r->be->ops->tx_reclaim(r->be); /* a port that frees on completion: ask once */
	if (!held(r, f))
		return true;
	struct dp_nic_part *p = &f->part[r->nic];
	p->status = status;
	p->release_ns = now;
	p->release_logged = false;
	r->parts[r->n++] = f;
	dp_count(r->counters, DP_C_tx_release_deferred, 1);
	return false;
}

uint32_t dp_release_poll(struct dp_release_list *r)
{
	if (!r->n)
		return 0;
	if (r->be->ops->tx_reclaim)
		r->be->ops->tx_reclaim(r->be);
	uint64_t now = dp_now_ns();
	uint32_t let_go = 0;
	for (uint32_t i = 0; i < r->n;) {
		struct dp_fwd *f = r->parts[i];
		struct dp_nic_part *p = &f->part[r->nic];
		uint32_t n = held(r, f);
		if (n == 0) {
			/* swapped with the last waiting: it moves to the tail, past the new r->n */
			r->parts[i] = r->parts[--r->n];
			r->parts[r->n] = f;
			let_go++;
			continue;
		}
		if (!p->release_logged && now > p->release_ns + DP_RELEASE_WARN_NS) {
			DP_WARN("nic %s: the port still holds %u buffer(s) of %s %lu's slot after %lu ms; "
				"its completion waits until the port frees them",
				r->be->cfg->name, n,
				f->kind == DP_FWD_FORWARD ? "forward" : "weight chunk",
				(unsigned long)f->desc.forward_id,
				(unsigned long)((now - p->release_ns) / 1000000));
			p->release_logged = true;
		}
		i++;
	}
	return let_go;
}
