/* dp_dpdk_arp.c: the ducks' MACs, by ARP (dp_backend_dpdk.c says how). */
#include <arpa/inet.h>

#include <rte_arp.h>

#include "dp_common.h"
#include "dp_dpdk.h"

static const struct rte_ether_addr ether_bcast = {
	.addr_bytes = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff }
};

static uint32_t arp_hash(uint32_t ip)
{
	return (ntohl(ip) * 2654435761u) >> 23; /* 9 bits: ARP_SLOTS */
}

/* The entry of a duck address, or NULL for an address that is not a duck's. */
static struct arp_entry *arp_find(struct dpdk_priv *p, uint32_t ip)
{
	for (uint32_t i = arp_hash(ip), n = 0; n < ARP_SLOTS; i = (i + 1) % ARP_SLOTS, n++) {
		if (p->arp[i].ip == ip)
			return &p->arp[i];
		if (p->arp[i].ip == 0)
			return NULL;
	}
	return NULL;
}

/* Room for every duck (DP_MAX_DUCKS < ARP_SLOTS); a full table adds nothing. */
void dp_dpdk_arp_add(struct dpdk_priv *p, uint32_t ip)
{
	if (ip == 0 || arp_find(p, ip))
		return;
	for (uint32_t i = arp_hash(ip), n = 0; n < ARP_SLOTS; i = (i + 1) % ARP_SLOTS, n++)
		if (p->arp[i].ip == 0) {
			p->arp[i].ip = ip;
			return;
		}
}

/* A duck's address was seen with this MAC: remember it (ducks only). */
void dp_dpdk_arp_learn(struct dp_backend *b, struct dpdk_priv *p, uint32_t ip,
		       const struct rte_ether_addr *mac)
{
	struct arp_entry *e = arp_find(p, ip);
	if (!e || rte_is_zero_ether_addr(mac) || !rte_is_unicast_ether_addr(mac))
		return;
	if (e->known && rte_is_same_ether_addr(&e->mac, mac))
		return;
	e->mac = *mac;
	e->known = true;
	dp_count(b->counters, DP_C_arp_learned, 1);
}

/* An ARP frame (request or reply) from us, into m. */
static void arp_build(struct dpdk_priv *p, struct rte_mbuf *m, uint16_t op,
		      const struct rte_ether_addr *eth_dst, const struct rte_ether_addr *tha,
		      uint32_t tip)
{
	struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	struct rte_arp_hdr *arp = (struct rte_arp_hdr *)(eth + 1);
	eth->dst_addr = *eth_dst;
	eth->src_addr = p->mac;
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
	arp->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
	arp->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	arp->arp_hlen = RTE_ETHER_ADDR_LEN;
	arp->arp_plen = sizeof(uint32_t);
	arp->arp_opcode = rte_cpu_to_be_16(op);
	arp->arp_data.arp_sha = p->mac;
	arp->arp_data.arp_sip = p->host_ip;
	arp->arp_data.arp_tha = *tha;
	arp->arp_data.arp_tip = tip;
	m->data_len = m->pkt_len = RTE_ETHER_HDR_LEN + sizeof(struct rte_arp_hdr);
	m->ol_flags = 0;
}

/* Ask who has ip (broadcast), at most every ARP_RETRY_MS. */
void dp_dpdk_arp_request(struct dp_backend *b, struct dpdk_priv *p, struct arp_entry *e,
			 uint64_t now)
{
	if (e->asked_ns && now - e->asked_ns < (uint64_t)ARP_RETRY_MS * 1000000)
		return;
	struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
	if (!m)
		return;
	static const struct rte_ether_addr zero;
	arp_build(p, m, RTE_ARP_OP_REQUEST, &ether_bcast, &zero, e->ip);
	e->asked_ns = now;
	dp_count(b->counters, DP_C_arp_requests, 1);
	dp_dpdk_txq_push(b, p, m, 0);
}

/* The Ethernet destination for ip, or NULL (an ARP request is on its way). */
const struct rte_ether_addr *dp_dpdk_dst_mac(struct dp_backend *b, struct dpdk_priv *p,
					     uint32_t ip)
{
	if ((p->bcast_ip && ip == p->bcast_ip) || ip == INADDR_BROADCAST)
		return &ether_bcast;
	struct arp_entry *e = arp_find(p, ip);
	if (!e) {
		/* the worker sends only to its NIC's ducks, all in the table since open;
		 * any other on-link address is resolved the same way */
		dp_dpdk_arp_add(p, ip);
		e = arp_find(p, ip);
		if (!e)
			return NULL;
	}
	if (e->known)
		return &e->mac;
	dp_dpdk_arp_request(b, p, e, dp_now_ns());
	return NULL;
}

/* An ARP frame: answer requests for host_ip, learn ducks' MACs. Consumes m. */
void dp_dpdk_arp_input(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m)
{
	if (rte_pktmbuf_data_len(m) < RTE_ETHER_HDR_LEN + sizeof(struct rte_arp_hdr)) {
		if (dp_count_said(b->counters, DP_C_rx_malformed))
			DP_WARN("port %u: an ARP frame of %u bytes (rx_malformed)", p->port,
				rte_pktmbuf_data_len(m));
		rte_pktmbuf_free(m);
		return;
	}
	struct rte_arp_hdr *arp = rte_pktmbuf_mtod_offset(m, struct rte_arp_hdr *, RTE_ETHER_HDR_LEN);
	if (arp->arp_hardware != rte_cpu_to_be_16(RTE_ARP_HRD_ETHER) ||
	    arp->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) ||
	    arp->arp_hlen != RTE_ETHER_ADDR_LEN || arp->arp_plen != sizeof(uint32_t)) {
		dp_count(b->counters, DP_C_rx_not_ours, 1);
		rte_pktmbuf_free(m);
		return;
	}
	struct rte_arp_ipv4 who = arp->arp_data;
	dp_dpdk_arp_learn(b, p, who.arp_sip, &who.arp_sha);
	if (arp->arp_opcode == rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) && who.arp_tip == p->host_ip &&
	    rte_is_unicast_ether_addr(&who.arp_sha)) {
		/* the reply, in the request's own mbuf */
		uint32_t sip = who.arp_sip;
		arp_build(p, m, RTE_ARP_OP_REPLY, &who.arp_sha, &who.arp_sha, sip);
		dp_count(b->counters, DP_C_arp_replies, 1);
		dp_dpdk_txq_push(b, p, m, 0);
		return;
	}
	rte_pktmbuf_free(m);
}

/* The link came up (dp_dpdk_link.c): a gratuitous ARP (an RFC 5227 announcement: a
 * request for host_ip from host_ip) so that switches and the ducks' kernels relearn the
 * port, and a request for every duck address, now, known or not: a duck that moved while
 * the link was down answers from its new MAC (learned MACs stay until then). */
uint32_t dp_dpdk_arp_refresh(struct dp_backend *b, struct dpdk_priv *p, uint64_t now)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
	if (m) {
		static const struct rte_ether_addr zero;
		arp_build(p, m, RTE_ARP_OP_REQUEST, &ether_bcast, &zero, p->host_ip);
		dp_count(b->counters, DP_C_arp_requests, 1);
		dp_dpdk_txq_push(b, p, m, 0);
	}
	uint32_t ducks = 0;
	for (uint32_t i = 0; i < ARP_SLOTS; i++)
		if (p->arp[i].ip) {
			p->arp[i].asked_ns = 0;
			dp_dpdk_arp_request(b, p, &p->arp[i], now);
			ducks++;
		}
	return ducks;
}
