/* dp_dpdk.h: the dpdk backend's state and the calls between its files.
 *
 *   dp_backend_dpdk.c  the ops table: open (port, mbuf pool, queues), close
 *   dp_dpdk_eal.c      rte_eal_init / rte_eal_cleanup, once per process
 *   dp_dpdk_arp.c      the ducks' MACs: ARP requests, replies, learning
 *   dp_dpdk_tx.c       frames from dp_tx messages, tx bursts
 *   dp_dpdk_zc.c       zero copy: client memory as external buffers, their release
 *   dp_dpdk_mem.c      client segments registered with DPDK (extmem, DMA mapping)
 *   dp_dpdk_rx.c       rx bursts: Ethernet/IPv4/UDP parsed, payloads handed up
 *   dp_dpdk_cksum.h/.c one's-complement sums: UDP checksums made (tx) and checked (rx)
 *   dp_dpdk_flow.c     rte_flow rules steering duck replies and ARP to the RX queue
 *
 * A dpdk_priv belongs to one NIC worker: only that worker's thread touches it, but
 * for the xstats fields at its end, which the control agent's thread uses (Stats).
 */
#ifndef DP_DPDK_H
#define DP_DPDK_H

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>

#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include "dp_backend.h"
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
#define ZC_HOLD_MAX 8192        /* test knob DUCKPIPE_DPDK_TX_HOLD_US: extbufs held at once */
#define STATS_MS 10             /* the port's drop counters read this often (rxq_overflows) */
_Static_assert(DP_MAX_DUCKS < ARP_SLOTS, "every duck's address needs a slot, and one free");
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
	/* zero-copy transmit (dp_dpdk_zc.c): a payload piece goes out as an external buffer
	 * chained to the header mbuf; zc_out counts the extbufs the port has not freed yet */
	bool zero_copy;
	bool zc_dma;       /* the port DMAs (PCI): only registered memory, with its IOVA */
	uint32_t zc_port_bit; /* this port among dp_dpdk_mem.c's (DMA mappings) */
	uint32_t zc_out;   /* relaxed atomic, one writer at a time (dp_dpdk_zc.c) */
	/* test knob: each extbuf held zc_hold_ns after tx_burst, as a NIC that frees on
	 * completion would (DUCKPIPE_DPDK_TX_HOLD_US; 0: off) */
	uint64_t zc_hold_ns;
	struct zc_hold { struct rte_mbuf *m; uint64_t ns; } *zc_hold;
	uint32_t zc_hold_head, zc_hold_tail;
	uint16_t ip_id;
	/* dp_dpdk_tx.c: the Ethernet/IPv4/UDP headers to the last destination sent to,
	 * lengths, id and checksums zero, and their raw sums: a frame copies them and
	 * patches lengths, id and checksums (rebuilt when the destination or its MAC changes) */
	struct {
		alignas(16) uint8_t hdrs[48]; /* HDRS_LEN used */
		uint32_t ip_sum;   /* the IPv4 header */
		uint32_t phdr_sum; /* UDP pseudo header without its length */
		uint32_t udp_sum;  /* phdr_sum + the UDP ports */
		bool valid;
	} tmpl;
	struct arp_entry arp[ARP_SLOTS];
	/* mbufs handed up by the last rx_burst, freed on the next */
	struct rte_mbuf *held[BURST];
	uint16_t nheld;
	/* frames being built for the next rte_eth_tx_burst; txq_len[i]: txq[i]'s UDP payload
	 * bytes, 0 for a frame that is not a datagram (ARP), so that frames the port refuses
	 * come off tx_packets and tx_bytes exactly */
	struct rte_mbuf *txq[BURST];
	uint32_t txq_len[BURST];
	uint16_t ntxq;
	uint64_t txq_bytes; /* UDP payload bytes of the datagrams in txq */
	uint16_t txq_datagrams;
	/* the port's drops before rx_burst saw the frames (RX ring full, no mbuf) */
	uint64_t next_stats_ns;
	uint64_t dropped_seen;
	/* rte_flow rules made at open (dp_dpdk_flow.c), NULL where the port has none */
	struct rte_flow *flow_replies;
	struct rte_flow *flow_arp;
	/* the port's xstats, for Stats: names read at open, values read by the control
	 * agent's thread into xvals (its own; dp_backend_xstats keeps it out of close) */
	uint32_t nxstats;
	struct rte_eth_xstat_name *xnames;
	struct rte_eth_xstat *xvals;
};

/* dp_dpdk_eal.c */
int dp_dpdk_eal_get(void);
void dp_dpdk_eal_put(void);

/* dp_dpdk_arp.c */
void dp_dpdk_arp_add(struct dpdk_priv *p, uint32_t ip);
void dp_dpdk_arp_learn(struct dp_backend *b, struct dpdk_priv *p, uint32_t ip,
		       const struct rte_ether_addr *mac);
void dp_dpdk_arp_request(struct dp_backend *b, struct dpdk_priv *p, struct arp_entry *e,
			 uint64_t now);
const struct rte_ether_addr *dp_dpdk_dst_mac(struct dp_backend *b, struct dpdk_priv *p,
					     uint32_t ip);
void dp_dpdk_arp_input(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m);

/* dp_dpdk_tx.c */
void dp_dpdk_txq_push(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		      uint32_t udp_payload);
void dp_dpdk_txq_flush(struct dp_backend *b, struct dpdk_priv *p);
uint32_t dp_dpdk_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n);

/* dp_dpdk_zc.c */
struct rte_eth_dev_info;
struct rte_device;
void dp_dpdk_zc_open(struct dpdk_priv *p, const struct rte_eth_dev_info *info);
void dp_dpdk_zc_start(struct dp_backend *b, struct dpdk_priv *p,
		      const struct rte_eth_dev_info *info);
void dp_dpdk_zc_close(struct dpdk_priv *p);
struct rte_mbuf *dp_dpdk_zc_attach(struct dpdk_priv *p, struct dp_tx_owner *owner,
				   const uint8_t *from, uint16_t len);
void dp_dpdk_zc_reclaim(struct dp_backend *b, struct dpdk_priv *p);
void dp_dpdk_tx_reclaim(struct dp_backend *b);

/* dp_dpdk_mem.c (and dp_backend.h: dp_dpdk_mem_register / unregister) */
void dp_dpdk_mem_add_port(uint16_t port, struct rte_device *dev);
void dp_dpdk_mem_del_port(uint16_t port);
uint32_t dp_dpdk_mem_port_bit(uint16_t port);
rte_iova_t dp_dpdk_mem_iova(const struct dp_mem *m, uint32_t port_bit, const uint8_t *from,
			    uint32_t len);

/* dp_dpdk_flow.c: 0, or -1 with dp_error where flow_steering = "require" fails */
int dp_dpdk_flow_open(struct dp_backend *b, struct dpdk_priv *p);
void dp_dpdk_flow_close(struct dp_backend *b, struct dpdk_priv *p);

/* dp_dpdk_rx.c */
uint32_t dp_dpdk_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n);

#endif /* DP_DPDK_H */
