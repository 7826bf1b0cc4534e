/* dp_backend_dpdk.c: a DPDK port behind the backend ops table (issue 9, first cut).
 *
 * The shape of DPDK's l2fwd/l3fwd samples: tunables, per-port state, the EAL and
 * port setup, ARP, transmit, receive, the ops table. What it does:
 *
 *   EAL      rte_eal_init once per process, on the first dpdk NIC's open, with the
 *            options after "--" on the dataplane's command line (a program name
 *            prepended); rte_eal_cleanup when the last dpdk NIC closes. The EAL pins
 *            the calling thread to its main lcore (-l): the thread's affinity is put
 *            back afterwards, so that duckpipe's runners keep the topology's `cores`.
 *            With dedicated threads each dpdk NIC's worker runs on an EAL worker lcore
 *            (rte_eal_remote_launch, dp_lcore.c) and is fed through an SP/SC rte_ring
 *            (dp_inbox.c); with shared threads the one runner polls the ports.
 *   port     the NIC's `interface` names the DPDK port: a vdev (net_af_packet0, with
 *            --vdev=net_af_packet0,iface=IF among the EAL options) or a PCI address.
 *            One RX and one TX queue, an mbuf pool of its own (sized below), bursts
 *            of 32. IPv4 and UDP checksums offloaded where the port can, else
 *            computed here.
 *   TX       each datagram is one mbuf: Ethernet + IPv4 + UDP headers built here,
 *            then the wire header and payload copied behind them. A GSO-grouped
 *            dp_tx is cut into gso_size datagrams exactly as the kernel would.
 *   zero copy on a virtual device that sends mbuf chains (MULTI_SEGS: af_packet,
 *            tap), a payload piece of ZC_MIN bytes or more behind the wire header
 *            (an activation or weight chunk, in the client's slot) is not copied: it
 *            is an external buffer (rte_pktmbuf_attach_extbuf) chained to the header
 *            mbuf (tx_zero_copy; tx_copied where the port cannot chain: af_xdp).
 *            tx_burst returns only once the port has freed every external buffer
 *            (zc_reclaim), so a slot is never released while the port may read it.
 *            Not yet: rte_extmem_register / rte_dev_dma_map of the client's memory,
 *            so PCI ports (DMA) copy.
 *   ARP      the destination MAC of a duck comes from ARP: a request for every duck
 *            address at open (waiting up to ARP_WAIT_MS for the answers), again on a
 *            miss (at most every ARP_RETRY_MS per address); MACs are learned from ARP
 *            requests and replies and from any IPv4 frame a duck sends. A frame for
 *            a duck whose MAC is still unknown is dropped and counted (tx_no_mac and
 *            tx_errors): the request that miss sent resolves it within a round trip,
 *            and the worker's NACK and retransmit timers recover the datagram, as for
 *            a full socket buffer. Holding frames would need a queue per duck for a
 *            case that only happens at startup or after a duck moved. The subnet's
 *            broadcast address goes to ff:ff:ff:ff:ff:ff. ARP requests for the NIC's
 *            host_ip are answered with the port's MAC (ducks use their kernel's ARP).
 *            Ducks must be on the link: there is no gateway.
 *   RX       rte_eth_rx_burst; Ethernet/IPv4/UDP parsed, with the IPv4 header
 *            checksum checked (by the port where it can). The UDP checksum is checked
 *            only where the port does it: a veth hands af_packet frames whose UDP
 *            checksum the kernel never filled in (CHECKSUM_PARTIAL), and the wire
 *            header is checked by the worker anyway. Frames not for host_ip:host_port
 *            (other protocols, other ports) are counted as rx_not_ours, fragments as
 *            rx_fragments, broken ones as rx_malformed, the port's own drops (imissed,
 *            rx_nombuf) as rxq_overflows. UDP payloads go up in place,
 *            in their mbufs, which are freed on the next rx_burst (as the socket
 *            backend's buffers stay valid until its next call).
 *   parking  a poll-mode port has no fd: wait_fd and rx_ready are NULL, so a parked
 *            worker polls every DP_BACKEND_POLL_NS. In production, run the dpdk
 *            backend with idle = "spin" and dedicated threads on their own lcores.
 *
 * Not here yet (issue 9): zero-copy transmit on PCI ports, the port's xstats in Stats (they are
 * logged at close), rte_flow.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include <rte_arp.h>
#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_udp.h>

#include "dp_backend.h"
#include "dp_common.h"
#include "dp_wire.h"

/* --- tunables ------------------------------------------------------------------- */

#define BURST 32                /* rte_eth_rx_burst / tx_burst */
#define RX_DESC 1024
#define TX_DESC 1024
#define MEMPOOL_CACHE 32
#define POOL_BUDGET (64u << 20) /* bytes of mbufs per port, at most: hugepages are shared */
#define POOL_MIN 2047u          /* mbufs, whatever the budget says */
#define TX_RETRIES 64           /* tx_burst calls without progress before a drop */
#define ARP_SLOTS 512           /* open-addressed table of the NIC's duck addresses */
#define ARP_RETRY_MS 10         /* a request per address at most this often */
#define ARP_WAIT_MS 200         /* at open: how long to wait for the ducks' replies */
#define ZC_MIN 256              /* payload bytes from one iov piece worth an extbuf */
#define ZC_WAIT_NS 1000000000ull /* a port holding extbufs this long after tx_burst: logged */
#define STATS_MS 10             /* the port's drop counters read this often (rxq_overflows) */
_Static_assert(DP_MAX_DUCKS < ARP_SLOTS, "every duck's address needs a slot, and one free");
_Static_assert(alignof(struct dp_wire_header) <= sizeof(struct rte_udp_hdr),
	       "an RX payload is aligned by moving it back over its UDP header");
#define HDRS_LEN (RTE_ETHER_HDR_LEN + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr))

/* --- state ---------------------------------------------------------------------- */

struct arp_entry {
	uint32_t ip; /* network order; 0 = free slot */
	bool known;
	struct rte_ether_addr mac;
	uint64_t asked_ns; /* last request sent */
};

struct dpdk_priv {
	uint16_t port;
	struct rte_mempool *pool;
	struct rte_ether_addr mac;
	uint32_t host_ip;   /* network order */
	uint16_t host_port; /* network order */
	uint32_t bcast_ip;  /* network order, 0 without broadcast */
	uint32_t max_datagram; /* UDP payload bytes a frame can carry at the NIC's mtu */
	bool tx_cksum_offload; /* IPv4 + UDP checksums by the port */
	bool rx_cksum_offload; /* the port flags bad IPv4 / UDP checksums */
	/* zero-copy transmit: a payload piece goes out as an external buffer chained to
	 * the header mbuf; zc_out counts the extbufs the port has not freed yet */
	bool zero_copy;
	bool iova_va; /* IOVA as VA: an address is its own IOVA */
	uint32_t zc_out;
	uint32_t zc_next; /* next free zc_info: all are free again once zc_out is 0 */
	struct rte_mbuf_ext_shared_info zc_info[BURST];
	uint16_t ip_id;
	struct arp_entry arp[ARP_SLOTS];
	/* mbufs handed up by the last rx_burst, freed on the next */
	struct rte_mbuf *held[BURST];
	uint16_t nheld;
	/* frames being built for the next rte_eth_tx_burst */
	struct rte_mbuf *txq[BURST];
	uint16_t ntxq;
	uint64_t txq_bytes; /* UDP payload bytes of the datagrams in txq */
	uint16_t txq_datagrams;
	/* the port's drops before rx_burst saw the frames (RX ring full, no mbuf) */
	uint64_t next_stats_ns;
	uint64_t dropped_seen;
};

static const struct rte_ether_addr ether_bcast = {
	.addr_bytes = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff }
};

/* EAL: once per process; 0 before init, the number of open dpdk NICs after. */
static int eal_users;
static bool eal_up, eal_done;

/* --- EAL ------------------------------------------------------------------------ */

static int eal_get(void)
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

static void eal_put(void)
{
	if (!eal_up || --eal_users > 0)
		return;
	rte_eal_cleanup();
	eal_up = false;
	eal_done = true;
}

/* --- ARP table ------------------------------------------------------------------ */

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
static void arp_add(struct dpdk_priv *p, uint32_t ip)
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
static void arp_learn(struct dp_backend *b, struct dpdk_priv *p, uint32_t ip,
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

/* --- transmit ------------------------------------------------------------------- */

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
static void zc_reclaim(struct dp_backend *b, struct dpdk_priv *p)
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

/* rte_eth_tx_burst what txq holds; retries while the port makes progress, then drops. */
static void txq_flush(struct dp_backend *b, struct dpdk_priv *p)
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
	zc_reclaim(b, p);
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

static void txq_push(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		     uint32_t udp_payload)
{
	p->txq[p->ntxq++] = m;
	if (udp_payload) {
		p->txq_datagrams++;
		p->txq_bytes += udp_payload;
	}
	if (p->ntxq == BURST)
		txq_flush(b, p);
}

/* Ask who has ip (broadcast), at most every ARP_RETRY_MS. */
static void arp_request(struct dp_backend *b, struct dpdk_priv *p, struct arp_entry *e,
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
	txq_push(b, p, m, 0);
}

/* The Ethernet destination for ip, or NULL (an ARP request is on its way). */
static const struct rte_ether_addr *dst_mac(struct dp_backend *b, struct dpdk_priv *p,
					    uint32_t ip)
{
	if ((p->bcast_ip && ip == p->bcast_ip) || ip == INADDR_BROADCAST)
		return &ether_bcast;
	struct arp_entry *e = arp_find(p, ip);
	if (!e) {
		/* the worker sends only to its NIC's ducks, all in the table since open;
		 * any other on-link address is resolved the same way */
		arp_add(p, ip);
		e = arp_find(p, ip);
		if (!e)
			return NULL;
	}
	if (e->known)
		return &e->mac;
	arp_request(b, p, e, dp_now_ns());
	return NULL;
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
 * activation chunk or weight bytes behind their wire header): on a port that chains
 * mbufs it goes out in place, as an external buffer (tx_zero_copy), else copied
 * (tx_copied). */
static struct rte_mbuf *frame(struct dp_backend *b, struct dpdk_priv *p,
			      const struct rte_ether_addr *mac, const struct sockaddr_in *dst,
			      const struct iovec *iov, uint32_t iovcnt, uint32_t *piece,
			      size_t *off, uint32_t len)
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
		if (last && copied && k >= ZC_MIN) {
			if (p->zero_copy && p->zc_next < BURST && (ext = rte_pktmbuf_alloc(p->pool))) {
				struct rte_mbuf_ext_shared_info *sh = &p->zc_info[p->zc_next++];
				sh->free_cb = zc_free;
				sh->fcb_opaque = p;
				rte_mbuf_ext_refcnt_set(sh, 1);
				rte_pktmbuf_attach_extbuf(ext, (void *)(uintptr_t)from,
							  p->iova_va ? (rte_iova_t)(uintptr_t)from : RTE_BAD_IOVA,
							  (uint16_t)k, sh);
				p->zc_out++;
				ext->data_off = 0;
				ext->data_len = (uint16_t)k;
				ext->pkt_len = (uint32_t)k;
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

static uint32_t dpdk_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
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
		const struct rte_ether_addr *mac = dst_mac(b, p, t->dst->sin_addr.s_addr);
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
			struct rte_mbuf *m = frame(b, p, mac, t->dst, t->iov, t->iovcnt, &piece, &off, len);
			if (!m)
				break; /* the pool is empty: the port still holds what we sent */
			txq_push(b, p, m, len);
			done += len;
		}
		if (made < datagrams)
			dp_count(b->counters, DP_C_tx_errors, datagrams - made);
		else
			whole++;
	}
	if (p->ntxq)
		txq_flush(b, p);
	return whole;
}

/* --- receive -------------------------------------------------------------------- */

/* An ARP frame: answer requests for host_ip, learn ducks' MACs. Consumes m. */
static void arp_input(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m)
{
	if (rte_pktmbuf_data_len(m) < RTE_ETHER_HDR_LEN + sizeof(struct rte_arp_hdr)) {
		dp_count(b->counters, DP_C_rx_malformed, 1);
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
	arp_learn(b, p, who.arp_sip, &who.arp_sha);
	if (arp->arp_opcode == rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) && who.arp_tip == p->host_ip &&
	    rte_is_unicast_ether_addr(&who.arp_sha)) {
		/* the reply, in the request's own mbuf */
		uint32_t sip = who.arp_sip;
		arp_build(p, m, RTE_ARP_OP_REPLY, &who.arp_sha, &who.arp_sha, sip);
		dp_count(b->counters, DP_C_arp_replies, 1);
		txq_push(b, p, m, 0);
		return;
	}
	rte_pktmbuf_free(m);
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
	arp_learn(b, p, ip->src_addr, &eth->src_addr);
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
	if (p->rx_cksum_offload &&
	    (m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) == RTE_MBUF_F_RX_L4_CKSUM_BAD)
		goto drop;
	memset(&rx->src, 0, sizeof(rx->src));
	rx->src.sin_family = AF_INET;
	rx->src.sin_addr.s_addr = ip->src_addr;
	rx->src.sin_port = udp->src_port;
	/* The payload lands 2 bytes past an 8-byte boundary (headroom 128, then 42 bytes of
	 * headers), and the worker reads the wire header in place as a struct: move the
	 * payload back over the UDP header, parsed by now (a copy of at most a frame, in
	 * cache; a real NIC's RX buffers could be offset instead: not done). */
	uint8_t *payload = (uint8_t *)(udp + 1);
	uint32_t len = udp_len - (uint32_t)sizeof(*udp);
	uintptr_t misaligned = (uintptr_t)payload & (alignof(struct dp_wire_header) - 1);
	if (misaligned) {
		memmove(payload - misaligned, payload, len);
		payload -= misaligned;
	}
	rx->buf = payload;
	rx->len = len;
	return 1;
drop:
	dp_count(b->counters, why, 1);
	rte_pktmbuf_free(m);
	return 0;
}

/* Frames the port dropped before we saw them (its RX ring full, or no mbuf to put one
 * in) into rxq_overflows, the socket backend's SO_RXQ_OVFL. Read from the worker's own
 * thread, every STATS_MS. */
static void port_drops(struct dp_backend *b, struct dpdk_priv *p)
{
	uint64_t now = dp_now_ns();
	if (now < p->next_stats_ns)
		return;
	p->next_stats_ns = now + (uint64_t)STATS_MS * 1000000;
	struct rte_eth_stats st;
	if (rte_eth_stats_get(p->port, &st) != 0)
		return;
	uint64_t dropped = st.imissed + st.rx_nombuf;
	if (dropped > p->dropped_seen)
		dp_count(b->counters, DP_C_rxq_overflows, dropped - p->dropped_seen);
	p->dropped_seen = dropped;
}

static uint32_t dpdk_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n)
{
	struct dpdk_priv *p = b->priv;
	port_drops(b, p);
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
			dp_count(b->counters, DP_C_rx_malformed, 1);
			rte_pktmbuf_free(m);
			continue;
		}
		const struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, const struct rte_ether_hdr *);
		uint16_t type = rte_be_to_cpu_16(eth->ether_type);
		if (type == RTE_ETHER_TYPE_ARP) {
			arp_input(b, p, m);
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
		txq_flush(b, p);
	return out;
}

/* --- open and close ------------------------------------------------------------- */

static void list_ports(char *out, size_t size)
{
	uint16_t id;
	size_t used = 0;
	out[0] = '\0';
	RTE_ETH_FOREACH_DEV(id)
	{
		char name[RTE_ETH_NAME_MAX_LEN];
		if (rte_eth_dev_get_name_by_port(id, name) == 0 && used < size) {
			int k = snprintf(out + used, size - used, "%s%s", used ? ", " : "", name);
			used += k > 0 ? (size_t)k : 0;
		}
	}
	if (!out[0])
		snprintf(out, size, "none: pass --vdev=... or bind a NIC to vfio-pci");
}

/* Mbufs for one port: the RX and TX rings, bursts, the mempool caches, and room for
 * every chunk of every forward context in flight (needed once transmit is zero copy
 * and an mbuf stays attached to its slot until the NIC has sent it; issue 9 item 3),
 * all within POOL_BUDGET. */
static uint32_t pool_size(const struct dp_backend *b, uint32_t elt)
{
	const struct dp_config *all = b->config;
	uint32_t payload = dp_wire_payload_max(b->cfg->mtu);
	uint64_t chunks = (uint64_t)all->max_inflight *
			  dp_wire_chunk_count(all->max_forward_bytes, payload);
	uint64_t n = RX_DESC + TX_DESC + 4 * BURST + (uint64_t)rte_lcore_count() * MEMPOOL_CACHE +
		     chunks;
	if (n * elt > POOL_BUDGET)
		n = POOL_BUDGET / elt;
	return n < POOL_MIN ? POOL_MIN : (uint32_t)n;
}

static int dpdk_open(struct dp_backend *b)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	if (!cfg->interface[0]) {
		dp_set_error("the dpdk backend needs `interface`: the DPDK port's name "
			     "(net_af_packet0 for --vdev=net_af_packet0,iface=IF, or a PCI address)");
		return -1;
	}
	if (cfg->mtu > RTE_ETHER_MAX_JUMBO_FRAME_LEN - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN) {
		dp_set_error("mtu %u is more than an Ethernet jumbo frame carries", cfg->mtu);
		return -1;
	}
	struct dpdk_priv *p = calloc(1, sizeof(*p));
	if (!p) {
		dp_set_error("out of memory for the dpdk backend");
		return -1;
	}
	if (eal_get() < 0) {
		free(p);
		return -1;
	}
	int rc;
	if ((rc = rte_eth_dev_get_port_by_name(cfg->interface, &p->port)) != 0) {
		char ports[256];
		list_ports(ports, sizeof(ports));
		dp_set_error("rte_eth_dev_get_port_by_name(%s): no such DPDK port (err=%d); ports: %s",
			     cfg->interface, rc, ports);
		goto fail_eal;
	}
	struct rte_eth_dev_info info;
	if ((rc = rte_eth_dev_info_get(p->port, &info)) != 0) {
		dp_set_error("rte_eth_dev_info_get: err=%d, port=%u", rc, p->port);
		goto fail_eal;
	}
	if (info.max_mtu < cfg->mtu) {
		dp_set_error("port %u (%s) takes an mtu of %u at most, the NIC's is %u", p->port,
			     cfg->interface, info.max_mtu, cfg->mtu);
		goto fail_eal;
	}
	uint64_t tx_ck = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
	uint64_t rx_ck = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
	p->tx_cksum_offload = (info.tx_offload_capa & tx_ck) == tx_ck;
	p->rx_cksum_offload = (info.rx_offload_capa & rx_ck) == rx_ck;
	/* Zero copy needs a port that sends mbuf chains (af_xdp does not: it sends the
	 * wrong bytes) and, for now, a virtual device (af_packet, tap, ...), which reads
	 * the bytes with the CPU through the mbuf's virtual address: a PCI NIC would DMA
	 * from them, and the client's memory is not registered with rte_extmem_register /
	 * rte_dev_dma_map yet, so a PCI port copies. The extbuf's IOVA is its address with
	 * IOVA as VA, else RTE_BAD_IOVA (which no virtual device reads). */
	/* Only the virtual devices known to be done with an mbuf when rte_eth_tx_burst
	 * returns (they copy it into the kernel): net_ring, say, would hold an extbuf
	 * until its consumer dequeues it, and zc_reclaim would wait for that. */
	const char *bus = info.device ? rte_bus_name(rte_dev_bus(info.device)) : NULL;
	bool cpu_copy = info.driver_name && (strcmp(info.driver_name, "net_af_packet") == 0 ||
					     strcmp(info.driver_name, "net_tap") == 0);
	p->zero_copy = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) && bus &&
		       strcmp(bus, "vdev") == 0 && cpu_copy;
	p->iova_va = rte_eal_iova_mode() == RTE_IOVA_VA;
	struct rte_eth_conf conf = {
		.rxmode = { .mtu = cfg->mtu, .offloads = p->rx_cksum_offload ? rx_ck : 0 },
		.txmode = { .mq_mode = RTE_ETH_MQ_TX_NONE,
			    .offloads = (p->tx_cksum_offload ? tx_ck : 0) |
					(p->zero_copy ? RTE_ETH_TX_OFFLOAD_MULTI_SEGS : 0) },
	};
	/* one mbuf holds a whole frame: headroom, Ethernet (and a VLAN tag, the CRC), mtu */
	uint32_t room = RTE_PKTMBUF_HEADROOM + RTE_ETHER_HDR_LEN + 8 + cfg->mtu;
	if (room < RTE_MBUF_DEFAULT_BUF_SIZE)
		room = RTE_MBUF_DEFAULT_BUF_SIZE;
	uint32_t nmbufs = pool_size(b, room + (uint32_t)sizeof(struct rte_mbuf));
	char pool_name[RTE_MEMPOOL_NAMESIZE];
	snprintf(pool_name, sizeof(pool_name), "dp_mbufs_%u", b->nic);
	int socket = rte_eth_dev_socket_id(p->port);
	if (socket < 0)
		socket = SOCKET_ID_ANY;
	p->pool = rte_pktmbuf_pool_create(pool_name, nmbufs, MEMPOOL_CACHE, 0, (uint16_t)room,
					  socket);
	if (!p->pool) {
		dp_set_error("rte_pktmbuf_pool_create(%u mbufs of %u bytes): %s (err=%d), port=%u; "
			     "are hugepages free?",
			     nmbufs, room, rte_strerror(rte_errno), rte_errno, p->port);
		goto fail_eal;
	}
	uint16_t nrx = RX_DESC, ntx = TX_DESC;
	if ((rc = rte_eth_dev_configure(p->port, 1, 1, &conf)) != 0) {
		dp_set_error("rte_eth_dev_configure: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	if ((rc = rte_eth_dev_adjust_nb_rx_tx_desc(p->port, &nrx, &ntx)) != 0) {
		dp_set_error("rte_eth_dev_adjust_nb_rx_tx_desc: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	struct rte_eth_rxconf rxq = info.default_rxconf;
	rxq.offloads = conf.rxmode.offloads;
	if ((rc = rte_eth_rx_queue_setup(p->port, 0, nrx, (unsigned)socket, &rxq, p->pool)) != 0) {
		dp_set_error("rte_eth_rx_queue_setup: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	struct rte_eth_txconf txq = info.default_txconf;
	txq.offloads = conf.txmode.offloads;
	if ((rc = rte_eth_tx_queue_setup(p->port, 0, ntx, (unsigned)socket, &txq)) != 0) {
		dp_set_error("rte_eth_tx_queue_setup: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	if ((rc = rte_eth_macaddr_get(p->port, &p->mac)) != 0) {
		dp_set_error("rte_eth_macaddr_get: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	if ((rc = rte_eth_dev_start(p->port)) != 0) {
		dp_set_error("rte_eth_dev_start: err=%d, port=%u", rc, p->port);
		goto fail_pool;
	}
	(void)rte_eth_stats_reset(p->port); /* rxq_overflows counts from here */
	p->host_ip = cfg->host.sin_addr.s_addr;
	p->host_port = cfg->host.sin_port;
	p->bcast_ip = cfg->use_broadcast ? cfg->broadcast.sin_addr.s_addr : 0;
	p->max_datagram = cfg->mtu - (uint32_t)(sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr));
	for (uint32_t i = 0; i < b->config->nducks; i++)
		if (b->config->ducks[i].nic == b->nic)
			arp_add(p, b->config->ducks[i].addr.sin_addr.s_addr);
	b->priv = p;
	/* the worker batches up to 64 datagrams per message, which are cut here */
	b->gso = true;
	b->max_gso_segments = 64;

	/* Resolve the ducks now, so that the first forwards find their MACs: a request
	 * each, then answers for ARP_WAIT_MS at most (ducks not up yet: on demand later). */
	uint64_t start = dp_now_ns(), now = start;
	uint32_t unknown;
	do {
		unknown = 0;
		for (uint32_t i = 0; i < ARP_SLOTS; i++)
			if (p->arp[i].ip && !p->arp[i].known) {
				unknown++;
				arp_request(b, p, &p->arp[i], now);
			}
		if (p->ntxq)
			txq_flush(b, p);
		struct dp_rx rx[BURST];
		(void)dpdk_rx_burst(b, rx, BURST); /* only ARP is expected: datagrams are dropped */
		if (unknown)
			rte_delay_us_sleep(200);
		now = dp_now_ns();
	} while (unknown && now - start < (uint64_t)ARP_WAIT_MS * 1000000);
	if (p->nheld) {
		rte_pktmbuf_free_bulk(p->held, p->nheld);
		p->nheld = 0;
	}
	DP_INFO("nic %s: DPDK port %u (%s, driver %s), MAC " RTE_ETHER_ADDR_PRT_FMT
		", %u mbufs of %u bytes, checksums %s, transmit %s, %u duck address(es) unresolved "
		"after %lu ms",
		cfg->name, p->port, cfg->interface, info.driver_name, RTE_ETHER_ADDR_BYTES(&p->mac),
		nmbufs, room, p->tx_cksum_offload ? "offloaded" : "in software",
		p->zero_copy ? "zero-copy" : "copying", unknown,
		(unsigned long)((now - start) / 1000000));
	return 0;
fail_pool:
	rte_mempool_free(p->pool);
fail_eal:
	eal_put();
	free(p);
	return -1;
}

/* The port's extended statistics (its driver's own counters), non-zero ones, in one log
 * line at close: where the frames went that the backend's counters cannot see. (Not
 * in `duckpipe stats` yet: that needs the control agent to ask each port.) */
static void log_xstats(const struct dp_backend *b, const struct dpdk_priv *p)
{
	int n = rte_eth_xstats_get(p->port, NULL, 0);
	if (n <= 0)
		return;
	struct rte_eth_xstat *vals = calloc((size_t)n, sizeof(*vals));
	struct rte_eth_xstat_name *names = calloc((size_t)n, sizeof(*names));
	char *line = malloc(4096);
	if (vals && names && line && rte_eth_xstats_get(p->port, vals, (unsigned)n) == n &&
	    rte_eth_xstats_get_names(p->port, names, (unsigned)n) == n) {
		size_t used = 0;
		line[0] = '\0';
		for (int i = 0; i < n && used < 4096; i++) {
			if (!vals[i].value || vals[i].id >= (uint64_t)n)
				continue;
			int k = snprintf(line + used, 4096 - used, "%s%s=%lu", used ? " " : "",
					 names[vals[i].id].name, (unsigned long)vals[i].value);
			used += k > 0 ? (size_t)k : 0;
		}
		DP_INFO("nic %s: port %u xstats: %s", b->cfg->name, p->port, line[0] ? line : "all zero");
	}
	free(vals);
	free(names);
	free(line);
}

static void dpdk_close(struct dp_backend *b)
{
	struct dpdk_priv *p = b->priv;
	if (!p)
		return;
	log_xstats(b, p);
	if (p->nheld)
		rte_pktmbuf_free_bulk(p->held, p->nheld);
	if (p->ntxq)
		rte_pktmbuf_free_bulk(p->txq, p->ntxq);
	int rc = rte_eth_dev_stop(p->port);
	if (rc != 0)
		DP_WARN("nic %s: rte_eth_dev_stop: err=%d, port=%u", b->cfg->name, rc, p->port);
	rte_eth_dev_close(p->port);
	rte_mempool_free(p->pool);
	free(p);
	b->priv = NULL;
	eal_put();
}

/* Poll mode: no wait_fd, no rx_ready (dp_backend.h): a parked worker polls. */
const struct dp_backend_ops dp_backend_dpdk = {
	.name = "dpdk",
	.open = dpdk_open,
	.close = dpdk_close,
	.tx_burst = dpdk_tx_burst,
	.rx_burst = dpdk_rx_burst,
};
