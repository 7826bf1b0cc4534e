/* dp_dpdk_zc.c: zero-copy transmit: client memory as external-buffer mbufs, and the
 * rule that no slot is released while the port may still read it. */
#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* An extbuf's free callback: the port is done reading that piece of client memory. */
static void zc_free(void *addr, void *opaque)
{
	(void)addr;
	struct dpdk_priv *p = opaque;
	p->zc_out--;
}

/* Zero copy's release rule, kept synchronous: tx_burst does not return while the port
 * still holds an external buffer, so a slot the worker sent from can be released (the
 * forward finished, the done word published) at any time after. af_packet, tap and
 * null copy or drop the frame inside rte_eth_tx_burst, so this costs nothing there; a
 * port that frees on completion is asked with rte_eth_tx_done_cleanup (and later
 * tx_burst calls with nothing to send) until every free callback has run. */
void dp_dpdk_zc_reclaim(struct dp_backend *b, struct dpdk_priv *p)
{
	(void)b;
	uint64_t start = 0;
	bool logged = false;
	while (p->zc_out) {
		(void)rte_eth_tx_done_cleanup(p->port, 0, 0);
		if (!p->zc_out)
			break;
		(void)rte_eth_tx_burst(p->port, 0, NULL, 0);
		uint64_t now = dp_now_ns();
		if (!start)
			start = now;
		else if (!logged && now - start > ZC_WAIT_NS) {
			DP_WARN("dpdk: port %u still holds %u external buffers after 1 s; waiting: "
			       "their slots stay with the dataplane until the port frees them",
			       p->port, p->zc_out);
			logged = true;
		}
	}
	p->zc_next = 0;
}

/* An mbuf whose data is len bytes of client memory at from (not copied), or NULL when
 * every shared-info slot of this burst is taken or the pool is empty (then copy). */
struct rte_mbuf *dp_dpdk_zc_attach(struct dpdk_priv *p, const uint8_t *from, uint16_t len)
{
	if (p->zc_next == BURST)
		return NULL;
	struct rte_mbuf *ext = rte_pktmbuf_alloc(p->pool);
	if (!ext)
		return NULL;
	struct rte_mbuf_ext_shared_info *sh = &p->zc_info[p->zc_next++];
	sh->free_cb = zc_free;
	sh->fcb_opaque = p;
	rte_mbuf_ext_refcnt_set(sh, 1);
	rte_pktmbuf_attach_extbuf(ext, (void *)(uintptr_t)from,
				  p->iova_va ? (rte_iova_t)(uintptr_t)from : RTE_BAD_IOVA, len, sh);
	p->zc_out++;
	/* attach_extbuf resets the lengths: the piece starts at the buffer's first byte */
	ext->data_off = 0;
	ext->data_len = len;
	ext->pkt_len = len;
	return ext;
}
