/* dp_dpdk_txq.c: the transmit queue every frame leaves by (dp_dpdk_tx.c's frames,
 * dp_dpdk_arp.c's requests and replies, the flush burst below), its bursts to the port,
 * and the worker's reclaim of what the port still holds.
 *
 * Below dp_dpdk_tx.c and dp_dpdk_arp.c, above dp_dpdk_zc.c: it tells zero copy how many
 * frames went out (dp_dpdk_zc_reclaim) and asks it for the test knob's due holds; zero
 * copy calls nothing of it.
 */
#include <string.h>

#include <rte_errno.h>
#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* --- tx bursts ---------------------------------------------------------------------- */

/* txq[i] out of txq, freed (the frames behind it move up), and off the counts. */
static void txq_drop(struct dpdk_priv *p, uint16_t i)
{
	rte_pktmbuf_free(p->txq[i]);
	if (p->txq_len[i]) {
		p->txq_datagrams--;
		p->txq_bytes -= p->txq_len[i];
	}
	p->ntxq--;
	memmove(p->txq + i, p->txq + i + 1, (size_t)(p->ntxq - i) * sizeof(p->txq[0]));
	memmove(p->txq_len + i, p->txq_len + i + 1, (size_t)(p->ntxq - i) * sizeof(p->txq_len[0]));
}

/* rte_eth_tx_prepare over txq where the port offloads checksums: the driver checks (and
 * fixes up) each frame's offload fields for its hardware; a frame it refuses is dropped
 * and counted as a tx_error. Returns those refused. */
static uint16_t txq_prepare(struct dp_backend *b, struct dpdk_priv *p)
{
	uint16_t ok = 0, refused = 0;
	while (ok < p->ntxq) {
		ok += rte_eth_tx_prepare(p->port, 0, p->txq + ok, p->ntxq - ok);
		if (ok == p->ntxq)
			break;
		if (!refused)
			DP_DEBUG("nic %s: rte_eth_tx_prepare refused a frame: %s, port=%u",
				 b->cfg->name, rte_strerror(rte_errno), p->port);
		txq_drop(p, ok);
		refused++;
	}
	return refused;
}

/* rte_eth_tx_burst what txq holds; retries while the port makes progress, then drops.
 * tx_packets and tx_bytes count the datagrams the port took, exactly. */
void dp_dpdk_txq_flush(struct dp_backend *b, struct dpdk_priv *p)
{
	if (dp_backend_link_down(b)) { /* nothing goes out: af_packet would take the frames,
					* count them in its oerrors and report them sent */
		rte_pktmbuf_free_bulk(p->txq, p->ntxq);
		if (p->txq_datagrams)
			dp_count(b->counters, DP_C_tx_link_down, p->txq_datagrams);
		dp_dpdk_zc_reclaim(b, p, 0);
		p->ntxq = 0;
		p->txq_datagrams = 0;
		p->txq_bytes = 0;
		return;
	}
	uint64_t errors = p->tx_cksum_offload ? txq_prepare(b, p) : 0;
	uint16_t n = p->ntxq, sent = n ? rte_eth_tx_burst(p->port, 0, p->txq, n) : 0;
	for (int tries = 0; sent < n && tries < TX_RETRIES;) {
		uint16_t k = rte_eth_tx_burst(p->port, 0, p->txq + sent, n - sent);
		sent += k;
		tries = k ? 0 : tries + 1;
	}
	uint16_t datagrams = p->txq_datagrams;
	uint64_t bytes = p->txq_bytes;
	if (sent < n) {
		for (uint16_t i = sent; i < n; i++)
			if (p->txq_len[i]) {
				datagrams--;
				bytes -= p->txq_len[i];
			}
		rte_pktmbuf_free_bulk(p->txq + sent, n - sent);
		errors += n - sent;
	}
	if (errors)
		dp_count(b->counters, DP_C_tx_errors, errors);
	dp_dpdk_zc_reclaim(b, p, sent);
	if (datagrams) {
		dp_count(b->counters, DP_C_tx_packets, datagrams);
		dp_count(b->counters, DP_C_tx_bytes, bytes);
	}
	p->ntxq = 0;
	p->txq_datagrams = 0;
	p->txq_bytes = 0;
}

void dp_dpdk_txq_push(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		      uint32_t udp_payload)
{
	p->txq_len[p->ntxq] = udp_payload;
	p->txq[p->ntxq++] = m;
	if (udp_payload) {
		p->txq_datagrams++;
		p->txq_bytes += udp_payload;
	}
	if (p->ntxq == BURST)
		dp_dpdk_txq_flush(b, p);
}

/* --- reclaim: what the port holds of client memory ---------------------------------- */

/* The flush burst (dp_dpdk_zc.c says why): FLUSH_FRAMES minimal frames to the port's own MAC. */
static void flush_burst(struct dp_backend *b, struct dpdk_priv *p)
{
	if (p->ntxq)
		dp_dpdk_txq_flush(b, p);
	uint32_t n = 0;
	for (; n < FLUSH_FRAMES; n++) {
		struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
		if (!m)
			break;
		struct rte_ether_hdr *eth =
			(struct rte_ether_hdr *)rte_pktmbuf_append(m, RTE_ETHER_MIN_LEN - RTE_ETHER_CRC_LEN);
		memset(eth, 0, RTE_ETHER_MIN_LEN - RTE_ETHER_CRC_LEN);
		rte_ether_addr_copy(&p->mac, &eth->dst_addr);
		rte_ether_addr_copy(&p->mac, &eth->src_addr);
		eth->ether_type = rte_cpu_to_be_16(FLUSH_ETHERTYPE);
		dp_dpdk_txq_push(b, p, m, 0);
	}
	if (p->ntxq)
		dp_dpdk_txq_flush(b, p);
	dp_count(b->counters, DP_C_tx_flush_frames, n);
}

/* The worker, while a part waits for its buffers (dp_backend_ops.tx_reclaim): ask the
 * port to free what it sent. rte_eth_tx_done_cleanup where the PMD has it; a tx_burst of
 * nothing makes some PMDs look at their completions too. */
void dp_dpdk_tx_reclaim(struct dp_backend *b)
{
	struct dpdk_priv *p = b->priv;
	dp_dpdk_zc_release_due(p);
	if (!__atomic_load_n(&p->zc_out, __ATOMIC_RELAXED))
		return;
	(void)rte_eth_tx_done_cleanup(p->port, 0, 0);
	(void)rte_eth_tx_burst(p->port, 0, NULL, 0);
	/* still held, and the port idle past the bound: what it holds may never have been
	 * reported done; traffic makes it report. One flush per idle spell: one RS interval
	 * past the held descriptors reports them all, and a NIC still sending them (or the
	 * "forever" knob) is not flooded */
	if (__atomic_load_n(&p->zc_out, __ATOMIC_RELAXED) && p->zc_frames_sent != p->zc_flushed_at &&
	    dp_now_ns() - p->zc_last_tx_ns >= p->zc_hold_max_ns) {
		flush_burst(b, p);
		p->zc_flushed_at = p->zc_frames_sent;
		(void)rte_eth_tx_done_cleanup(p->port, 0, 0);
	}
}
