/* dp_dpdk_rx.c: rx bursts: Ethernet/IPv4/UDP parsed, payloads handed up in place. */
#include <arpa/inet.h>
#include <string.h>

#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"
#include "dp_dpdk_cksum.h"

/* The UDP checksum: by the port where it offloads it, else in software (af_packet,
 * af_xdp): the wire header has no checksum of its own, so this is a datagram's only
 * end-to-end check. 0 means the sender sent none. Summed with the vector sum transmit
 * uses (dp_dpdk_cksum.h); the read brings the payload into the cache the worker's
 * reduce reads it from next. */
static inline bool udp_cksum_ok(const struct dpdk_priv *p, const struct rte_mbuf *m,
				const struct rte_ipv4_hdr *ip, const struct rte_udp_hdr *udp,
				uint32_t udp_len)
{
	if (p->rx_cksum_offload) {
		uint64_t f = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
		if (f == RTE_MBUF_F_RX_L4_CKSUM_BAD)
			return false;
		if (f == RTE_MBUF_F_RX_L4_CKSUM_GOOD)
			return true;
	}
	if (udp->dgram_cksum == 0)
		return true;
	/* the pseudo header (addresses, protocol, UDP length), then header and payload */
	uint64_t s = dp_cksum_sum_copy(NULL, (const uint8_t *)&ip->src_addr, 8, false) +
		     rte_cpu_to_be_16(IPPROTO_UDP) + udp->dgram_len +
		     dp_cksum_sum_copy(NULL, (const uint8_t *)udp, udp_len, false);
	return dp_cksum_fold(s) == 0xffff;
}

/* Say what a broken IPv4 frame was: its length, and what its IP header claims when it
 * has one (who sent it, how long it says it is). */
static void rx_said_malformed(const struct dpdk_priv *p, const struct rte_mbuf *m,
			      uint32_t frame_len)
{
	if (m->nb_segs != 1 || frame_len < HDRS_LEN) {
		DP_WARN("port %u: a frame of %u bytes in %u segments, too short for IPv4 + UDP "
			"(rx_malformed)", p->port, frame_len, m->nb_segs);
		return;
	}
	const struct rte_ipv4_hdr *ip =
		rte_pktmbuf_mtod_offset(m, const struct rte_ipv4_hdr *, RTE_ETHER_HDR_LEN);
	const uint8_t *s = (const uint8_t *)&ip->src_addr, *d = (const uint8_t *)&ip->dst_addr;
	DP_WARN("port %u: a broken IPv4/UDP frame of %u bytes from %u.%u.%u.%u to %u.%u.%u.%u, "
		"IP length %u, protocol %u (rx_malformed)", p->port, frame_len, s[0], s[1], s[2],
		s[3], d[0], d[1], d[2], d[3], rte_be_to_cpu_16(ip->total_length), ip->next_proto_id);
}

/* An IPv4 frame: the UDP payload for us into *rx (returns 1), or counted and freed (0). */
static int ipv4_input(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		      struct dp_rx *rx)
{
	enum dp_counter why = DP_C_rx_malformed;
	uint32_t frame_len = rte_pktmbuf_data_len(m);
	if (m->nb_segs != 1 || frame_len < HDRS_LEN)
		goto drop; /* the pool's mbufs hold a whole frame at the NIC's mtu */
	struct rte_ipv4_hdr *ip = rte_pktmbuf_mtod_offset(m, struct rte_ipv4_hdr *, RTE_ETHER_HDR_LEN);
	/* A frame for another address is not ours, broken or not: net_af_packet's socket
	 * hears every interface until it is bound to its own (the PMD binds after opening
	 * it), so a port can start with other hosts' traffic queued, loopback's 64 KiB
	 * datagrams cut to the ring's frame among them. */
	if (ip->dst_addr != p->host_ip)
		why = DP_C_rx_not_ours;
	uint32_t ihl = (uint32_t)(ip->version_ihl & RTE_IPV4_HDR_IHL_MASK) * RTE_IPV4_IHL_MULTIPLIER;
	uint32_t ip_len = rte_be_to_cpu_16(ip->total_length);
	if ((ip->version_ihl >> 4) != 4 || ihl < sizeof(*ip) || ip_len < ihl + sizeof(struct rte_udp_hdr) ||
	    ip_len > frame_len - RTE_ETHER_HDR_LEN)
		goto drop;
	if (p->rx_cksum_offload &&
	    (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) == RTE_MBUF_F_RX_IP_CKSUM_BAD)
		goto drop;
	if (!(p->rx_cksum_offload &&
	      (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) == RTE_MBUF_F_RX_IP_CKSUM_GOOD) &&
	    rte_raw_cksum(ip, ihl) != 0xffff)
		goto drop;
	/* a duck's frame tells its MAC, whatever it carries */
	const struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, const struct rte_ether_hdr *);
	dp_dpdk_arp_learn(b, p, ip->src_addr, &eth->src_addr);
	why = DP_C_rx_not_ours;
	if (ip->next_proto_id != IPPROTO_UDP || ip->dst_addr != p->host_ip)
		goto drop;
	if (rte_be_to_cpu_16(ip->fragment_offset) & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK)) {
		why = DP_C_rx_fragments; /* duckpipe's datagrams fit the MTU: never reassembled */
		goto drop;
	}
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)((uint8_t *)ip + ihl);
	if (udp->dst_port != p->host_port)
		goto drop;
	why = DP_C_rx_malformed;
	uint32_t udp_len = rte_be_to_cpu_16(udp->dgram_len);
	if (udp_len < sizeof(*udp) || udp_len > ip_len - ihl)
		goto drop;
	if (!udp_cksum_ok(p, m, ip, udp, udp_len)) {
		why = DP_C_rx_bad_checksum;
		goto drop;
	}
	memset(&rx->src, 0, sizeof(rx->src));
	rx->src.sin_family = AF_INET;
	rx->src.sin_addr.s_addr = ip->src_addr;
	rx->src.sin_port = udp->src_port;
	/* The payload goes up where it lies, 2 bytes past an 8-byte boundary (headroom 128,
	 * then 42 bytes of headers): the worker copies the wire header out (dp_wire_read)
	 * and sums the payload with unaligned loads (dp_accumulate). */
	rx->buf = (uint8_t *)(udp + 1);
	rx->len = udp_len - (uint32_t)sizeof(*udp);
	rx->stamp_ns = 0;
	return 1;
drop:
	if (why != DP_C_rx_malformed)
		dp_count(b->counters, why, 1);
	else if (dp_count_said(b->counters, why))
		rx_said_malformed(p, m, frame_len);
	rte_pktmbuf_free(m);
	return 0;
}

uint32_t dp_dpdk_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n)
{
	struct dpdk_priv *p = b->priv;
	dp_dpdk_stats_poll(b, p); /* the port's counters: this thread alone reads them */
	dp_dpdk_link_poll(b, p, dp_now_ns());
	if (p->nheld) {
		rte_pktmbuf_free_bulk(p->held, p->nheld);
		p->nheld = 0;
	}
	struct rte_mbuf *pkts[BURST];
	uint16_t got = rte_eth_rx_burst(p->port, 0, pkts, (uint16_t)(n < BURST ? n : BURST));
	uint32_t out = 0;
	for (uint16_t i = 0; i < got; i++) {
		struct rte_mbuf *m = pkts[i];
		if (rte_pktmbuf_data_len(m) < RTE_ETHER_HDR_LEN) {
			if (dp_count_said(b->counters, DP_C_rx_malformed))
				DP_WARN("port %u: a frame of %u bytes (rx_malformed)", p->port,
					rte_pktmbuf_data_len(m));
			rte_pktmbuf_free(m);
			continue;
		}
		const struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, const struct rte_ether_hdr *);
		uint16_t type = rte_be_to_cpu_16(eth->ether_type);
		if (type == RTE_ETHER_TYPE_ARP) {
			dp_dpdk_arp_input(b, p, m);
		} else if (type == RTE_ETHER_TYPE_IPV4) {
			if (ipv4_input(b, p, m, &rx[out])) {
				p->held[p->nheld++] = m;
				out++;
			}
		} else {
			dp_count(b->counters, DP_C_rx_not_ours, 1); /* IPv6, VLANs, LLDP... */
			rte_pktmbuf_free(m);
		}
	}
	if (p->ntxq) /* ARP replies */
		dp_dpdk_txq_flush(b, p);
	return out;
}
