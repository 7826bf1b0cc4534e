/* dp_dpdk_tx.c: frames from dp_tx messages, tx bursts (dp_backend_dpdk.c says how). */
#include <arpa/inet.h>
#include <string.h>

#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* rte_eth_tx_burst what txq holds; retries while the port makes progress, then drops. */
void dp_dpdk_txq_flush(struct dp_backend *b, struct dpdk_priv *p)
{
	uint16_t sent = 0;
	for (int tries = 0; sent < p->ntxq && tries < TX_RETRIES;) {
		uint16_t k = rte_eth_tx_burst(p->port, 0, p->txq + sent, p->ntxq - sent);
		sent += k;
		tries = k ? 0 : tries + 1;
	}
	if (sent < p->ntxq) {
		rte_pktmbuf_free_bulk(p->txq + sent, p->ntxq - sent);
		dp_count(b->counters, DP_C_tx_errors, p->ntxq - sent);
	}
	dp_dpdk_zc_reclaim(b, p);
	/* what went out, approximately when some frames were dropped (ARP included) */
	uint16_t datagrams = sent < p->txq_datagrams ? sent : p->txq_datagrams;
	if (datagrams) {
		dp_count(b->counters, DP_C_tx_packets, datagrams);
		dp_count(b->counters, DP_C_tx_bytes,
			 p->txq_datagrams ? p->txq_bytes * datagrams / p->txq_datagrams : 0);
	}
	p->ntxq = 0;
	p->txq_datagrams = 0;
	p->txq_bytes = 0;
}

void dp_dpdk_txq_push(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		      uint32_t udp_payload)
{
	p->txq[p->ntxq++] = m;
	if (udp_payload) {
		p->txq_datagrams++;
		p->txq_bytes += udp_payload;
	}
	if (p->ntxq == BURST)
		dp_dpdk_txq_flush(b, p);
}

/* The UDP checksum of a chained frame (rte_ipv4_udptcp_cksum_mbuf, experimental in
 * 22.11, written out with stable calls). */
static uint16_t udp_cksum_chain(const struct rte_mbuf *m, const struct rte_ipv4_hdr *ip)
{
	uint16_t raw;
	uint32_t len = rte_be_to_cpu_16(ip->total_length) - (uint32_t)sizeof(*ip);
	if (rte_raw_cksum_mbuf(m, RTE_ETHER_HDR_LEN + (uint32_t)sizeof(*ip), len, &raw))
		return 0; /* no checksum: allowed for UDP over IPv4 */
	uint32_t sum = (uint32_t)raw + rte_ipv4_phdr_cksum(ip, 0);
	sum = ((sum & 0xffff0000) >> 16) + (sum & 0xffff);
	sum = ((sum & 0xffff0000) >> 16) + (sum & 0xffff);
	uint16_t c = (uint16_t)~sum;
	return c ? c : 0xffff;
}

/* One frame: Ethernet/IPv4/UDP headers to dst, then len payload bytes gathered from
 * iov starting at (*piece, *off), which advance past them. Pieces are copied behind
 * the headers, except a last piece of ZC_MIN bytes or more behind a copied one (an
 * activation chunk or weight bytes behind their wire header, from owner's memory): on a
 * port that chains mbufs it goes out in place, as an external buffer (tx_zero_copy,
 * counted on owner until the port frees it: dp_dpdk_zc.c), else copied (tx_copied). */
static struct rte_mbuf *frame(struct dp_backend *b, struct dpdk_priv *p,
			      const struct rte_ether_addr *mac, const struct sockaddr_in *dst,
			      const struct iovec *iov, uint32_t iovcnt, uint32_t *piece,
			      size_t *off, uint32_t len, struct dp_tx_owner *owner)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
	if (!m)
		return NULL;
	uint8_t *at = (uint8_t *)rte_pktmbuf_append(m, (uint16_t)HDRS_LEN);
	if (!at) {
		rte_pktmbuf_free(m);
		return NULL;
	}
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)at;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	struct rte_mbuf *ext = NULL;
	for (uint32_t copied = 0; copied < len;) {
		while (*piece < iovcnt && *off == iov[*piece].iov_len) {
			(*piece)++;
			*off = 0;
		}
		size_t k = iov[*piece].iov_len - *off;
		if (k > len - copied)
			k = len - copied;
		const uint8_t *from = (const uint8_t *)iov[*piece].iov_base + *off;
		bool last = copied + k == len;
		if (last && copied && k >= ZC_MIN && owner) {
			if (p->zero_copy && (ext = dp_dpdk_zc_attach(p, owner, from, (uint16_t)k))) {
				dp_count(b->counters, DP_C_tx_zero_copy, 1);
				*off += k;
				copied += (uint32_t)k;
				break;
			}
			dp_count(b->counters, DP_C_tx_copied, 1);
		}
		uint8_t *to = (uint8_t *)rte_pktmbuf_append(m, (uint16_t)k);
		if (!to) {
			rte_pktmbuf_free(m);
			return NULL;
		}
		memcpy(to, from, k);
		copied += (uint32_t)k;
		*off += k;
	}
	if (ext && rte_pktmbuf_chain(m, ext) != 0) {
		rte_pktmbuf_free(ext);
		rte_pktmbuf_free(m);
		return NULL;
	}
	eth->dst_addr = *mac;
	eth->src_addr = p->mac;
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->type_of_service = 0;
	ip->total_length = rte_cpu_to_be_16((uint16_t)(sizeof(*ip) + sizeof(*udp) + len));
	ip->packet_id = rte_cpu_to_be_16(p->ip_id++);
	ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->hdr_checksum = 0;
	ip->src_addr = p->host_ip;
	ip->dst_addr = dst->sin_addr.s_addr;
	udp->src_port = p->host_port;
	udp->dst_port = dst->sin_port;
	udp->dgram_len = rte_cpu_to_be_16((uint16_t)(sizeof(*udp) + len));
	udp->dgram_cksum = 0;
	if (p->tx_cksum_offload) {
		m->l2_len = RTE_ETHER_HDR_LEN;
		m->l3_len = sizeof(*ip);
		m->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
		udp->dgram_cksum = rte_ipv4_phdr_cksum(ip, m->ol_flags);
	} else {
		ip->hdr_checksum = rte_ipv4_cksum(ip);
		udp->dgram_cksum = ext ? udp_cksum_chain(m, ip) : rte_ipv4_udptcp_cksum(ip, udp);
	}
	return m;
}

uint32_t dp_dpdk_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
{
	struct dpdk_priv *p = b->priv;
	uint32_t whole = 0; /* messages all of whose datagrams were handed to the port */
	for (uint32_t i = 0; i < n; i++) {
		const struct dp_tx *t = &tx[i];
		size_t total = 0;
		for (uint32_t j = 0; j < t->iovcnt; j++)
			total += t->iov[j].iov_len;
		uint32_t seg = t->gso_size ? t->gso_size : (uint32_t)total;
		uint32_t datagrams = seg ? (uint32_t)((total + seg - 1) / seg) : 1;
		const struct rte_ether_addr *mac = dp_dpdk_dst_mac(b, p, t->dst->sin_addr.s_addr);
		if (!mac || seg > p->max_datagram) {
			if (!mac)
				dp_count(b->counters, DP_C_tx_no_mac, datagrams);
			dp_count(b->counters, DP_C_tx_errors, datagrams);
			continue;
		}
		if (t->gso_size && datagrams > 1)
			dp_count(b->counters, DP_C_gso_sends, 1);
		uint32_t piece = 0, made = 0;
		size_t off = 0;
		for (size_t done = 0; made < datagrams; made++) {
			uint32_t len = (uint32_t)(total - done < seg ? total - done : seg);
			struct rte_mbuf *m = frame(b, p, mac, t->dst, t->iov, t->iovcnt, &piece, &off, len,
						 t->owner);
			if (!m)
				break; /* the pool is empty: the port still holds what we sent */
			dp_dpdk_txq_push(b, p, m, len);
			done += len;
		}
		if (made < datagrams)
			dp_count(b->counters, DP_C_tx_errors, datagrams - made);
		else
			whole++;
	}
	if (p->ntxq)
		dp_dpdk_txq_flush(b, p);
	return whole;
}
