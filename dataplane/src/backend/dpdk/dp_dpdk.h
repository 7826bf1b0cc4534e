/* dp_dpdk.h: the dpdk backend's state and the calls between its files.
 *
 *   dp_backend_dpdk.c  the ops table: open (port, mbuf pool, queues), close
 *   dp_dpdk_eal.c      rte_eal_init / rte_eal_cleanup, once per process
 *   dp_dpdk_arp.c      the ducks' MACs: ARP requests, replies, learning
 *   dp_dpdk_tx.c       frames from dp_tx messages
 *   dp_dpdk_txq.c      the transmit queue: tx bursts, the worker's reclaim
 *   dp_dpdk_zc.c       zero copy: client memory as external buffers, their release
 *   dp_dpdk_mem.c      client segments registered with DPDK (extmem, DMA mapping)
 *   dp_dpdk_rx.c       rx bursts: Ethernet/IPv4/UDP parsed, payloads handed up
 *   dp_dpdk_cksum.h/.c one's-complement sums: UDP checksums made (tx) and checked (rx)
 *   dp_dpdk_flow.c     rte_flow rules steering duck replies and ARP to the RX queue
 *   dp_dpdk_link.c     the link: waited for at open, watched (LSC or polled), its transitions
 *   dp_dpdk_size.c     rings, mbuf pool and cache sized from the topology; NUMA verdict
 *   dp_dpdk_stats.c    the port's counters, read by the worker alone; xstats for Stats
 *   dp_dpdk_intr.c     RX interrupts: the fd a parked worker sleeps on
 *
 * A dpdk_priv belongs to one NIC worker: only that worker's thread touches it, but
 * for the xstats snapshot (st.seq, st.snap, st.copy), which the control agent's thread
 * copies for Stats (dp_dpdk_stats.c).
 */
#ifndef DP_DPDK_H
#define DP_DPDK_H

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <net/if.h>

#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include "dp_backend.h"
#include "dp_wire.h"

/* --- tunables ------------------------------------------------------------------- */

#define BURST 32                /* rte_eth_rx_burst / tx_burst */
/* RX/TX descriptors, pool and cache: dp_dpdk_size.h */
#define POOL_HUGEPAGE_SHARE 2   /* a port's pool takes at most 1/2 of the free hugepages */
#define TX_RETRIES 64           /* tx_burst calls without progress before a drop */
#define ARP_SLOTS 512           /* open-addressed table of the NIC's duck addresses */
#define ARP_RETRY_MS 10         /* a request per address at most this often */
#define ARP_WAIT_MS 200         /* at open: how long to wait for the ducks' replies */
#define ZC_MIN 256              /* payload bytes from one iov piece worth an extbuf */
#define ZC_HOLD_MAX 8192        /* test knob DUCKPIPE_DPDK_TX_HOLD_US: extbufs held at once */
#define FLUSH_FRAMES 32         /* zero copy: frames of a flush burst, the tx_rs_thresh set */
#define FLUSH_ETHERTYPE 0x88B5  /* IEEE 802 local experimental: the flush burst's frames */
#define STATS_MS 100            /* the worker reads the port's counters this often */
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
	uint64_t zc_hold_frames;  /* "traffic:N": held until N more frames went out */
	uint64_t zc_frames_sent;  /* frames the port took, for the knob above */
	uint64_t zc_last_tx_ns;   /* the port's last tx burst that sent something */
	uint64_t zc_flushed_at;   /* zc_frames_sent after the last flush burst */
	uint64_t zc_hold_max_ns;  /* NIC zc_hold_max_us: idle this long holding: flush burst */
	struct zc_hold { struct rte_mbuf *m; uint64_t ns; } *zc_hold;
	uint32_t zc_hold_head, zc_hold_tail;
	uint16_t ip_id;
	uint64_t tx_rearm; /* dp_dpdk_tx.c: a fresh frame's rearm_data, 0 until the first */
	uint32_t tx_data_at; /* dp_dpdk_tx.c: a fresh frame's first byte, from its mbuf */
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
	/* rte_flow rules made at open (dp_dpdk_flow.c), NULL where the port has none */
	struct rte_flow *flow_replies;
	struct rte_flow *flow_arp;
	bool flow_isolated; /* rte_flow_isolate took: the queue gets only what the rules send */
	/* RX interrupts (dp_dpdk_intr.c): queue 0's fd, -1 where the port has none */
	int rx_intr_fd;
	bool rx_intr_eventfd; /* an eventfd to read empty (not tap's queue fd) */
	bool rx_intr_armed;   /* enabled for this park */
	/* the port's xstats, for Stats: names read at open, values read by the worker into
	 * xvals and published in st.snap (dp_dpdk_stats.c) */
	uint32_t nxstats;
	struct rte_eth_xstat_name *xnames;
	struct rte_eth_xstat *xvals;
	/* the link (dp_dpdk_link.c); b->link holds its state */
	bool link_lsc;          /* the port raises RTE_ETH_EVENT_INTR_LSC: read on its flag */
	bool link_registered;   /* the LSC callback is registered */
	uint32_t link_event;    /* raised by the LSC callback (the EAL's interrupt thread) */
	int link_fd;            /* for SIOCGIFFLAGS on the port's kernel interface, or -1 */
	char link_ifname[IF_NAMESIZE];
	uint64_t link_next_ns;  /* polled ports: the next read */
	uint64_t link_down_ns;  /* when it went down */
	uint64_t oerrors_seen;  /* the port's oerrors, counted into tx_errors (dp_dpdk_stats.c) */
	/* the port's counters, one reader: the worker (dp_dpdk_stats.c) */
	struct {
		uint64_t next_ns;       /* the next reading */
		uint64_t missed, nombuf; /* imissed, rx_nombuf counted so far */
		int kfds[8];            /* af_packet: the PMD's sockets (tp_drops) */
		uint32_t nkfds;
		int xfds[8];            /* af_xdp: the PMD's XSKs (rx_ring_full), and ... */
		uint64_t xfull[8];      /* ... their rx_ring_full counted so far */
		uint32_t nxfds;
		int xsk_before[16];     /* af_xdp: the process's XSKs before our queue setup */
		uint32_t nxsk_before;
		uint32_t seq;           /* seqlock: odd while the worker writes snap */
		uint64_t *snap;         /* xstats values by id (the worker writes) */
		uint64_t *copy;         /* the control agent's copy of snap */
		bool numa_due;          /* open is done: the next poll is the worker's */
		bool oerrors_taken;     /* the port's oerrors are frames tx_burst reported sent
					 * (af_packet): moved from tx_packets to tx_errors */
	} st;
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
/* a gratuitous ARP for host_ip, a request for every duck address; returns how many ducks */
uint32_t dp_dpdk_arp_refresh(struct dp_backend *b, struct dpdk_priv *p, uint64_t now);

/* dp_dpdk_link.c: _conf before rte_eth_dev_configure (intr_conf.lsc), _start after
 * rte_eth_dev_start (waits up to link_wait_ms, sets b->link), _poll from rx_burst */
void dp_dpdk_link_conf(struct dpdk_priv *p, const struct rte_eth_dev_info *info,
		       struct rte_eth_conf *conf);
void dp_dpdk_link_start(struct dp_backend *b, struct dpdk_priv *p);
void dp_dpdk_link_poll(struct dp_backend *b, struct dpdk_priv *p, uint64_t now);
void dp_dpdk_link_close(struct dpdk_priv *p);

/* dp_dpdk_tx.c */
uint32_t dp_dpdk_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n);

/* dp_dpdk_txq.c: the frames for the next rte_eth_tx_burst (push flushes a full queue),
 * and the worker's reclaim (dp_backend_ops.tx_reclaim) */
void dp_dpdk_txq_push(struct dp_backend *b, struct dpdk_priv *p, struct rte_mbuf *m,
		      uint32_t udp_payload);
void dp_dpdk_txq_flush(struct dp_backend *b, struct dpdk_priv *p);
void dp_dpdk_tx_reclaim(struct dp_backend *b);

/* dp_dpdk_zc.c */
struct rte_eth_dev_info;
struct rte_device;
void dp_dpdk_zc_open(struct dpdk_priv *p, const struct rte_eth_dev_info *info);
void dp_dpdk_zc_start(struct dp_backend *b, struct dpdk_priv *p,
		      const struct rte_eth_dev_info *info);
void dp_dpdk_zc_close(struct dpdk_priv *p);
struct rte_mbuf *dp_dpdk_zc_attach(struct dpdk_priv *p, struct dp_tx_owner *owner,
				   const uint8_t *from, uint16_t len);
void dp_dpdk_zc_reclaim(struct dp_backend *b, struct dpdk_priv *p, uint16_t sent);
void dp_dpdk_zc_release_due(struct dpdk_priv *p);
void dp_dpdk_zc_txconf(const struct dpdk_priv *p, struct rte_eth_txconf *txq, uint16_t ntx);

/* dp_dpdk_mem.c (and dp_backend.h: dp_dpdk_mem_register / unregister) */
void dp_dpdk_mem_add_port(uint16_t port, struct rte_device *dev);
void dp_dpdk_mem_del_port(uint16_t port);
uint32_t dp_dpdk_mem_port_bit(uint16_t port);
rte_iova_t dp_dpdk_mem_iova(const struct dp_mem *m, uint32_t port_bit, const uint8_t *from,
			    uint32_t len);

/* dp_dpdk_flow.c: 0, or -1 with dp_error where flow_steering = "require" fails;
 * isolate before rte_eth_dev_configure, open once the port started */
int dp_dpdk_flow_isolate(struct dp_backend *b, struct dpdk_priv *p);
int dp_dpdk_flow_open(struct dp_backend *b, struct dpdk_priv *p);
void dp_dpdk_flow_close(struct dp_backend *b, struct dpdk_priv *p);

/* dp_dpdk_stats.c */
int dp_dpdk_stats_open(struct dp_backend *b, struct dpdk_priv *p,
		       const struct rte_eth_dev_info *info);
void dp_dpdk_stats_close(struct dpdk_priv *p);
void dp_dpdk_stats_read(struct dp_backend *b, struct dpdk_priv *p);
/* Before rte_eth_rx_queue_setup: the XSKs that exist already (other ports'), so that
 * dp_dpdk_stats_open can tell an af_xdp port's own (the PMD makes it in queue setup). */
void dp_dpdk_stats_xsk_before(struct dpdk_priv *p);
void dp_dpdk_stats_poll(struct dp_backend *b, struct dpdk_priv *p);
uint32_t dp_dpdk_stats_xstats(struct dpdk_priv *p, struct dp_xstat *out, uint32_t max,
			      uint64_t *left_out);

/* dp_dpdk_intr.c: rxq interrupts where a worker parks (ops wait_fd, rx_arm, rx_disarm) */
void dp_dpdk_intr_conf(const struct dp_backend *b, struct rte_eth_conf *conf);
void dp_dpdk_intr_start(struct dp_backend *b, struct dpdk_priv *p, const struct rte_eth_conf *conf);
int dp_dpdk_wait_fd(struct dp_backend *b);
bool dp_dpdk_rx_arm(struct dp_backend *b);
void dp_dpdk_rx_disarm(struct dp_backend *b);

/* dp_dpdk_rx.c */
uint32_t dp_dpdk_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n);

#endif /* DP_DPDK_H */
