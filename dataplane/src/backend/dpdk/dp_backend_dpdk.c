/* dp_backend_dpdk.c: a DPDK port behind the backend ops table: open and close here;
 * the EAL, ARP, transmit and receive in dp_dpdk_*.c (dp_dpdk.h lists them).
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
 *            One RX and one TX queue, an mbuf pool of its own (sizes below), bursts
 *            of 32. IPv4 and UDP checksums offloaded where the port can, else
 *            computed here.
 *   TX       each datagram is one mbuf: Ethernet + IPv4 + UDP headers built here,
 *            then the wire header and payload copied behind them. A GSO-grouped
 *            dp_tx is cut into gso_size datagrams exactly as the kernel would.
 *   zero copy on a port that sends mbuf chains (MULTI_SEGS) and is either a virtual
 *            device reading through the CPU (af_packet, tap) or a PCI NIC, a payload
 *            piece of ZC_MIN bytes or more behind the wire header (an activation or
 *            weight chunk, in the client's slot) is not copied: it is an external
 *            buffer (rte_pktmbuf_attach_extbuf) chained to the header mbuf
 *            (tx_zero_copy; tx_copied where the port cannot chain: af_xdp). Client
 *            segments are registered with rte_extmem_register (and rte_dev_dma_map)
 *            at attach (dp_dpdk_mem.c): a PCI port sends in place only from
 *            registered memory, at its IOVA. A forward's part on this NIC completes
 *            only once the port freed its external buffers (dp_dpdk_zc.c,
 *            dp_release.c), so a slot is never released while the port may read it.
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
 *            and UDP checksums checked (by the port where it can, else in software:
 *            dp_dpdk_cksum.h; a wrong UDP checksum is rx_bad_checksum, 0 means none
 *            sent). Frames not for host_ip:host_port
 *            (other protocols, other ports) are counted as rx_not_ours, fragments as
 *            rx_fragments, broken ones as rx_malformed, the port's own drops as
 *            rx_missed, rx_nombuf, rx_kernel_drops (af_packet, af_xdp) and their sum
 *            rxq_overflows (dp_dpdk_stats.c). UDP payloads go up in place,
 *            in their mbufs, which are freed on the next rx_burst (as the socket
 *            backend's buffers stay valid until its next call).
 *   link     waited for at open (NIC link_wait_ms), then watched: link interrupts
 *            where the port has them, else read every 10 ms; while it is down nothing
 *            is sent and the worker fails the NIC's forwards at once (dp_dpdk_link.c).
 *   parking  where the port has RX interrupts (net_tap, vfio-bound NICs) a parked
 *            worker sleeps on RX queue 0's event fd, armed while it sleeps
 *            (dp_dpdk_intr.c); a port without them (af_packet, af_xdp) has no fd
 *            (wait_fd -1), so a parked worker polls it every DP_BACKEND_POLL_NS. In
 *            production, run the dpdk backend with idle = "spin" and dedicated threads
 *            on their own lcores: then no interrupt is asked for at all.
 *
 *   xstats   the port's extended statistics (its driver's counters) go into Stats,
 *            per NIC, the non-zero ones (`duckpipe stats`): names read at open, values
 *            by the worker every STATS_MS (the port's one reader, dp_dpdk_stats.c),
 *            copied by the control agent's thread on each GetStats (dpdk_xstats); close
 *            waits for a copy in flight (dp_backend_xstats_dead). Also logged at close.
 *   sizes    RX descriptors for one forward's replies from every duck of the NIC, the
 *            mbuf pool for the rings, caches and zero-copy chunks within half the free
 *            hugepages, cache 256 (dp_dpdk_size.c; rx_desc, tx_desc, mbufs override).
 *   rte_flow flow isolation (rte_flow_isolate, before configure) and ingress rules
 *            steering the ducks' replies (IPv4 to host_ip, UDP to host_port) and ARP to
 *            the worker's RX queue, where the port has them: isolated, the queue gets
 *            nothing else (NIC flow_steering: auto, off, require; dp_dpdk_flow.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include "dp_common.h"
#include "dp_dpdk.h"
#include "dp_dpdk_size.h"

/* the checksum offloads used where the port has both: IPv4 header and UDP */
#define TX_CKSUM (RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM)
#define RX_CKSUM (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM)

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

/* A port's sizes: its rings from the topology (the NIC's rx_desc, tx_desc, mbufs when
 * set), within what the port takes, and its mbuf pool within a hugepage budget. */
struct port_sizes {
	uint16_t nrx, ntx;
	uint32_t ducks, reply_frames, rx_want;
	bool af_xdp; /* rings an XSK's (dp_dpdk_size.h: DP_DPDK_AF_XDP_FILL) */
	uint64_t budget;
	struct dp_dpdk_pool_plan pool;
};

/* An af_packet port's RX ring is the kernel's (the vdev's framecnt; rx_desc does not
 * reach it): 0 for another driver. */
static uint32_t af_packet_framecnt(const struct rte_eth_dev_info *info)
{
	if (strcmp(info->driver_name, "net_af_packet"))
		return 0;
	const struct rte_devargs *da = info->device ? rte_dev_devargs(info->device) : NULL;
	const char *at = da && da->args ? strstr(da->args, "framecnt=") : NULL;
	return at ? (uint32_t)strtoul(at + strlen("framecnt="), NULL, 0) : 512; /* the PMD's */
}

static int size_port(const struct dp_backend *b, uint16_t port, const struct rte_eth_dev_info *info,
		     uint32_t elt, int socket, struct port_sizes *sz)
{
	const struct dp_config *all = b->config;
	const struct dp_nic_cfg *cfg = b->cfg;
	memset(sz, 0, sizeof(*sz));
	for (uint32_t i = 0; i < all->nducks; i++)
		sz->ducks += all->ducks[i].nic == b->nic;
	uint32_t payload = dp_wire_payload_max(cfg->mtu);
	sz->reply_frames = dp_wire_chunk_count(all->max_forward_bytes, payload);
	sz->rx_want = dp_dpdk_rx_want(sz->ducks, sz->reply_frames);
	const struct rte_eth_desc_lim *rl = &info->rx_desc_lim, *tl = &info->tx_desc_lim;
	if ((cfg->rx_desc && dp_dpdk_desc_check("rx_desc", cfg->rx_desc,
						&(struct dp_dpdk_desc_lim){ rl->nb_max, rl->nb_min,
									    rl->nb_align }) < 0) ||
	    (cfg->tx_desc && dp_dpdk_desc_check("tx_desc", cfg->tx_desc,
						&(struct dp_dpdk_desc_lim){ tl->nb_max, tl->nb_min,
									    tl->nb_align }) < 0)) {
		dp_add_error_context("nic %s, port %u (%s)", cfg->name, port, info->driver_name);
		return -1;
	}
	/* af_xdp: every frame waiting for the worker is one of the fill ring's 2048 mbufs; an
	 * RX ring that holds them all drops nothing the fill ring would have taken (a smaller
	 * one drops: XDP_STATISTICS rx_ring_full, rx_kernel_drops), a larger one never fills.
	 * The XSK's rings are powers of two (xsk_socket__create refuses others). */
	sz->af_xdp = !strcmp(info->driver_name, "net_af_xdp");
	if (sz->af_xdp && cfg->rx_desc && !rte_is_power_of_2(cfg->rx_desc)) {
		dp_set_error("rx_desc = %u: net_af_xdp's rings (the XSK's) take a power of two "
			     "(0: %u, its fill ring's)", cfg->rx_desc, DP_DPDK_AF_XDP_FILL);
		dp_add_error_context("nic %s, port %u (%s)", cfg->name, port, info->driver_name);
		return -1;
	}
	sz->nrx = (uint16_t)(cfg->rx_desc ? cfg->rx_desc
				 : sz->af_xdp ? DP_DPDK_AF_XDP_FILL : sz->rx_want);
	sz->ntx = (uint16_t)(cfg->tx_desc ? cfg->tx_desc : DP_DPDK_TX_DESC);
	int rc = rte_eth_dev_adjust_nb_rx_tx_desc(port, &sz->nrx, &sz->ntx); /* to the port's */
	if (rc != 0) {
		dp_set_error("rte_eth_dev_adjust_nb_rx_tx_desc: err=%d, port=%u", rc, port);
		return -1;
	}
	/* zero copy: a header mbuf per chunk in flight (it stays attached to its slot until
	 * the port sent it; issue 9 item 3), up to DP_DPDK_ZC_BYTES of chunks */
	uint64_t zc = dp_dpdk_zc_chunks(all->max_inflight, all->max_forward_bytes, payload);
	sz->budget = dp_dpdk_hugepages_free(socket) / POOL_HUGEPAGE_SHARE;
	/* af_xdp holds its fill ring's mbufs on the RX side whatever rx_desc, and its TX ring
	 * is rx_desc big (tx_desc does not reach it) */
	struct dp_dpdk_pool_in in = { .nrx = sz->af_xdp ? DP_DPDK_AF_XDP_FILL : sz->nrx,
				      .ntx = sz->af_xdp ? sz->nrx : sz->ntx,
				      .lcores = rte_lcore_count(),
				      .zc_chunks = zc, .elt_bytes = elt,
				      .budget_bytes = sz->budget, .mbufs_cfg = cfg->mbufs };
	if (dp_dpdk_pool_plan(&in, &sz->pool) < 0) {
		dp_add_error_context("nic %s, port %u", cfg->name, port);
		return -1;
	}
	return 0;
}

static int xstats_open(struct dpdk_priv *p);

/* What open chose, in one line (and a warning where an af_packet ring is smaller than
 * one forward's replies: the issue-18 incast, frames lost before the worker sees them). */
static void log_sizes(const struct dp_backend *b, const struct dpdk_priv *p,
		      const struct port_sizes *sz, uint32_t room, int socket, uint32_t framecnt)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	uint64_t mib = ((uint64_t)sz->pool.mbufs * (room + sizeof(struct rte_mbuf))) >> 20;
	char rx[96];
	if (framecnt)
		snprintf(rx, sizeof(rx), "the kernel's ring: framecnt=%u frames", framecnt);
	else if (sz->af_xdp)
		snprintf(rx, sizeof(rx), "%u descriptors (the XSK's RX and TX rings; its fill "
			 "ring %u mbufs)", sz->nrx, DP_DPDK_AF_XDP_FILL);
	else
		snprintf(rx, sizeof(rx), "%u descriptors", sz->nrx);
	DP_INFO("nic %s: port %u sizes: RX %s (one forward's replies: %u duck(s) x %u frames%s), "
		"TX %u descriptors, mbuf pool %u x %u bytes (%lu MiB; wanted %u, hugepage budget "
		"%lu MiB%s) on socket %d, cache %u per lcore",
		cfg->name, p->port, rx, sz->ducks, sz->reply_frames,
		cfg->rx_desc ? ", rx_desc set" : "", sz->ntx, sz->pool.mbufs, room,
		(unsigned long)mib, sz->pool.want, (unsigned long)(sz->budget >> 20),
		sz->pool.capped ? ": capped, less room for zero-copy chunks" : "", socket,
		sz->pool.cache);
	uint64_t need = (uint64_t)sz->ducks * sz->reply_frames;
	if (framecnt && framecnt < need)
		DP_WARN("nic %s: the af_packet ring holds %u frames (framecnt), fewer than one "
			"forward's replies at max_forward_bytes (%u duck(s) x %u frames = %lu): the "
			"kernel drops the rest (rx_kernel_drops) and NACKs resend them; add "
			"framecnt=%lu (a power of two) to its --vdev (docs/dpdk.md)",
			cfg->name, framecnt, sz->ducks, sz->reply_frames, (unsigned long)need,
			(unsigned long)rte_align64pow2(need));
	if (sz->af_xdp && sz->nrx < DP_DPDK_AF_XDP_FILL && sz->nrx < need)
		DP_WARN("nic %s: the af_xdp RX ring holds %u frames (rx_desc), fewer than one "
			"forward's replies (%u duck(s) x %u frames = %lu): the kernel drops the "
			"rest when the worker falls behind (rx_kernel_drops); rx_desc = 0 sizes it "
			"to the fill ring's %u", cfg->name, sz->nrx, sz->ducks, sz->reply_frames,
			(unsigned long)need, DP_DPDK_AF_XDP_FILL);
	if (sz->af_xdp && need > DP_DPDK_AF_XDP_FILL)
		DP_WARN("nic %s: one forward's replies (%u duck(s) x %u frames = %lu) are more than "
			"net_af_xdp's fill ring holds (%u mbufs, fixed in the PMD): what the worker "
			"has not taken by then is dropped (rx_missed); fewer ducks per port, a smaller "
			"max_forward_bytes or net_af_packet with framecnt=%lu (docs/dpdk.md)",
			cfg->name, sz->ducks, sz->reply_frames, (unsigned long)need,
			DP_DPDK_AF_XDP_FILL, (unsigned long)rte_align64pow2(need));
}

/* What the config alone can refuse, before the EAL starts. */
static int check_nic(const struct dp_nic_cfg *cfg)
{
	if (!cfg->interface[0]) {
		dp_set_error("the dpdk backend needs `interface`: the DPDK port's name "
			     "(net_af_packet0 for --vdev=net_af_packet0,iface=IF, or a PCI address)");
		return -1;
	}
	if (cfg->mtu > RTE_ETHER_MAX_JUMBO_FRAME_LEN - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN) {
		dp_set_error("mtu %u is more than an Ethernet jumbo frame carries", cfg->mtu);
		return -1;
	}
	return 0;
}

/* The NIC's `interface` as a DPDK port id, or an error listing the ports there are. */
static int find_port(const struct dp_nic_cfg *cfg, struct dpdk_priv *p)
{
	int rc;
	if ((rc = rte_eth_dev_get_port_by_name(cfg->interface, &p->port)) != 0) {
		char ports[256];
		list_ports(ports, sizeof(ports));
		/* af_packet's probe fails when its PACKET_FANOUT group id (pid ^ ifindex, no
		 * devarg sets it) is another interface's group in this namespace */
		dp_set_error("rte_eth_dev_get_port_by_name(%s): no such DPDK port (err=%d); ports: %s%s",
			     cfg->interface, rc, ports,
			     strncmp(cfg->interface, "net_af_packet", 13) ? ""
			     : "; if the EAL said \"could not set PACKET_FANOUT\", another process "
			       "holds this port's fanout group id (pid ^ ifindex): start again "
			       "(docs/dpdk.md)");
		return -1;
	}
	return 0;
}

/* What the port can do: its mtu, checksum offloads and zero copy (dp_dpdk_zc.c). */
static int read_port_info(const struct dp_nic_cfg *cfg, struct dpdk_priv *p,
			  struct rte_eth_dev_info *info)
{
	int rc;
	if ((rc = rte_eth_dev_info_get(p->port, info)) != 0) {
		dp_set_error("rte_eth_dev_info_get: err=%d, port=%u", rc, p->port);
		return -1;
	}
	if (info->max_mtu < cfg->mtu) {
		dp_set_error("port %u (%s) takes an mtu of %u at most, the NIC's is %u", p->port,
			     cfg->interface, info->max_mtu, cfg->mtu);
		return -1;
	}
	p->tx_cksum_offload = (info->tx_offload_capa & TX_CKSUM) == TX_CKSUM;
	p->rx_cksum_offload = (info->rx_offload_capa & RX_CKSUM) == RX_CKSUM;
	dp_dpdk_zc_open(p, info); /* zero copy: which ports, dp_dpdk_zc.c */
	return 0;
}

/* The port's configuration: the offloads it has, link and RX interrupts where it has them. */
static void port_conf(struct dp_backend *b, struct dpdk_priv *p,
		      const struct rte_eth_dev_info *info, struct rte_eth_conf *conf)
{
	*conf = (struct rte_eth_conf){
		.rxmode = { .mtu = b->cfg->mtu, .offloads = p->rx_cksum_offload ? RX_CKSUM : 0 },
		.txmode = { .mq_mode = RTE_ETH_MQ_TX_NONE,
			    .offloads = (p->tx_cksum_offload ? TX_CKSUM : 0) |
					(p->zero_copy ? RTE_ETH_TX_OFFLOAD_MULTI_SEGS : 0) },
	};
	dp_dpdk_link_conf(p, info, conf); /* intr_conf.lsc where the port has it */
	dp_dpdk_intr_conf(b, conf);
}

/* The port's ring sizes and its mbuf pool, on the port's socket: the NIC writes the
 * frames there (the worker's socket is checked against it on its first poll,
 * dp_dpdk_stats.c). *room is an mbuf's data room: one mbuf holds a whole frame. */
static int make_pool(const struct dp_backend *b, struct dpdk_priv *p,
		     const struct rte_eth_dev_info *info, struct port_sizes *sz, uint32_t *room,
		     int *socket)
{
	/* one mbuf holds a whole frame: headroom, Ethernet (and a VLAN tag, the CRC), mtu */
	*room = RTE_PKTMBUF_HEADROOM + RTE_ETHER_HDR_LEN + 8 + b->cfg->mtu;
	if (*room < RTE_MBUF_DEFAULT_BUF_SIZE)
		*room = RTE_MBUF_DEFAULT_BUF_SIZE;
	char pool_name[RTE_MEMPOOL_NAMESIZE];
	snprintf(pool_name, sizeof(pool_name), "dp_mbufs_%u", b->nic);
	*socket = rte_eth_dev_socket_id(p->port);
	if (*socket < 0)
		*socket = SOCKET_ID_ANY;
	if (size_port(b, p->port, info, *room + (uint32_t)sizeof(struct rte_mbuf), *socket, sz) < 0)
		return -1;
	uint32_t nmbufs = sz->pool.mbufs;
	p->pool = rte_pktmbuf_pool_create(pool_name, nmbufs, sz->pool.cache, 0, (uint16_t)*room,
					  *socket);
	if (!p->pool) {
		dp_set_error("rte_pktmbuf_pool_create(%u mbufs of %u bytes): %s (err=%d), port=%u; "
			     "are hugepages free?",
			     nmbufs, *room, rte_strerror(rte_errno), rte_errno, p->port);
		return -1;
	}
	return 0;
}

/* Close a port that was configured (or whose flow mode changed): before its queues'
 * mbuf pool goes. */
static void close_port(const struct dp_nic_cfg *cfg, const struct dpdk_priv *p)
{
	int rc;
	if ((rc = rte_eth_dev_close(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_close: err=%d, port=%u", cfg->name, rc, p->port);
}

/* Flow isolation (before configure), then one RX and one TX queue. On failure the port
 * is left as it was, closed if isolation may have changed its flow mode. */
static int configure_port(struct dp_backend *b, struct dpdk_priv *p,
			  const struct rte_eth_conf *conf)
{
	int rc;
	if (dp_dpdk_flow_isolate(b, p) < 0) {
		close_port(b->cfg, p); /* its flow mode may have changed: closed, as after configure */
		return -1;
	}
	if ((rc = rte_eth_dev_configure(p->port, 1, 1, conf)) != 0) {
		dp_set_error("rte_eth_dev_configure: err=%d, port=%u", rc, p->port);
		return -1;
	}
	return 0;
}

/* The RX queue on the mbuf pool (an af_xdp port makes its XSK here) and the TX queue,
 * with the configured offloads. */
static int setup_queues(struct dpdk_priv *p, const struct rte_eth_dev_info *info,
			const struct rte_eth_conf *conf, const struct port_sizes *sz, int socket)
{
	int rc;
	uint16_t nrx = sz->nrx, ntx = sz->ntx;
	struct rte_eth_rxconf rxq = info->default_rxconf;
	rxq.offloads = conf->rxmode.offloads;
	dp_dpdk_stats_xsk_before(p); /* an af_xdp port's XSK is made in queue setup */
	if ((rc = rte_eth_rx_queue_setup(p->port, 0, nrx, (unsigned)socket, &rxq, p->pool)) != 0) {
		dp_set_error("rte_eth_rx_queue_setup: err=%d, port=%u", rc, p->port);
		return -1;
	}
	struct rte_eth_txconf txq = info->default_txconf;
	txq.offloads = conf->txmode.offloads;
	dp_dpdk_zc_txconf(p, &txq, ntx); /* completion thresholds where a NIC DMAs in place */
	if ((rc = rte_eth_tx_queue_setup(p->port, 0, ntx, (unsigned)socket, &txq)) != 0) {
		dp_set_error("rte_eth_tx_queue_setup: err=%d, port=%u", rc, p->port);
		return -1;
	}
	return 0;
}

/* Start the port: its MAC, the link (waited for up to link_wait_ms), counters from zero,
 * RX interrupts where the port has them. */
static int start_port(struct dp_backend *b, struct dpdk_priv *p, const struct rte_eth_conf *conf)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	int rc;
	if ((rc = rte_eth_macaddr_get(p->port, &p->mac)) != 0) {
		dp_set_error("rte_eth_macaddr_get: err=%d, port=%u", rc, p->port);
		return -1;
	}
	if ((rc = rte_eth_dev_start(p->port)) != 0) {
		dp_set_error("rte_eth_dev_start: err=%d, port=%u", rc, p->port);
		return -1;
	}
	dp_dpdk_link_start(b, p); /* waits up to link_wait_ms for the link */
	if ((rc = rte_eth_stats_reset(p->port)) != 0) /* rxq_overflows counts from here */
		DP_WARN("nic %s: rte_eth_stats_reset: err=%d, port=%u: rxq_overflows counts the "
			"port's drops since before this run", cfg->name, rc, p->port);
	dp_dpdk_intr_start(b, p, conf);
	return 0;
}

/* The backend goes live: its largest datagram, an ARP entry per duck on this NIC, zero
 * copy, GSO. */
static void go_live(struct dp_backend *b, struct dpdk_priv *p, const struct rte_eth_dev_info *info)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	p->max_datagram = cfg->mtu - (uint32_t)(sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr));
	for (uint32_t i = 0; i < b->config->nducks; i++)
		if (b->config->ducks[i].nic == b->nic)
			dp_dpdk_arp_add(p, b->config->ducks[i].addr.sin_addr.s_addr);
	b->priv = p;
	dp_dpdk_zc_start(b, p, info);
	/* the worker batches up to 64 datagrams per message, which are cut here */
	b->gso = true;
	b->max_gso_segments = 64;
}

/* Resolve the ducks now, so that the first forwards find their MACs: a request each,
 * then answers for ARP_WAIT_MS at most (ducks not up yet: on demand later). Returns how
 * many stay unresolved; *waited_ns how long it took. */
static uint32_t resolve_ducks(struct dp_backend *b, struct dpdk_priv *p, uint64_t *waited_ns)
{
	uint64_t start = dp_now_ns(), now = start;
	uint32_t unknown;
	do {
		unknown = 0;
		for (uint32_t i = 0; i < ARP_SLOTS; i++)
			if (p->arp[i].ip && !p->arp[i].known) {
				unknown++;
				dp_dpdk_arp_request(b, p, &p->arp[i], now);
			}
		if (p->ntxq)
			dp_dpdk_txq_flush(b, p);
		struct dp_rx rx[BURST];
		(void)dp_dpdk_rx_burst(b, rx, BURST); /* only ARP is expected: datagrams are dropped */
		if (unknown)
			rte_delay_us_sleep(200);
		now = dp_now_ns();
	} while (unknown && now - start < (uint64_t)ARP_WAIT_MS * 1000000 &&
		 !dp_backend_link_down(b)); /* down: at link up (dp_dpdk_arp_refresh) */
	if (p->nheld) {
		rte_pktmbuf_free_bulk(p->held, p->nheld);
		p->nheld = 0;
	}
	*waited_ns = now - start;
	return unknown;
}

/* EAL, port, pool, queues, start, then ARP: the steps of DPDK's l2fwd port init, each
 * undone in reverse on failure. */
static int dpdk_open(struct dp_backend *b)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	if (check_nic(cfg) < 0)
		return -1;
	struct dpdk_priv *p = calloc(1, sizeof(*p));
	if (!p) {
		dp_set_error("out of memory for the dpdk backend");
		return -1;
	}
	p->link_fd = -1; /* dp_dpdk_link_conf opens it */
	if (dp_dpdk_eal_get() < 0) {
		free(p);
		return -1;
	}
	int rc, socket;
	uint32_t room;
	struct rte_eth_dev_info info;
	struct rte_eth_conf conf;
	struct port_sizes sz;
	if (find_port(cfg, p) < 0 || read_port_info(cfg, p, &info) < 0)
		goto fail_eal;
	port_conf(b, p, &info, &conf);
	if (make_pool(b, p, &info, &sz, &room, &socket) < 0)
		goto fail_eal;
	if (configure_port(b, p, &conf) < 0)
		goto fail_pool;
	if (setup_queues(p, &info, &conf, &sz, socket) < 0 || start_port(b, p, &conf) < 0)
		goto fail_configured;
	p->host_ip = cfg->host.sin_addr.s_addr;
	p->host_port = cfg->host.sin_port;
	p->bcast_ip = cfg->use_broadcast ? cfg->broadcast.sin_addr.s_addr : 0;
	if (xstats_open(p) < 0 || dp_dpdk_stats_open(b, p, &info) < 0 ||
	    dp_dpdk_flow_open(b, p) < 0)
		goto fail_started;
	go_live(b, p, &info);
	uint64_t waited;
	uint32_t unknown = resolve_ducks(b, p, &waited);
	DP_INFO("nic %s: DPDK port %u (%s, driver %s), MAC " RTE_ETHER_ADDR_PRT_FMT
		", %u mbufs of %u bytes, checksums %s, transmit %s, %u duck address(es) unresolved "
		"after %lu ms",
		cfg->name, p->port, cfg->interface, info.driver_name, RTE_ETHER_ADDR_BYTES(&p->mac),
		sz.pool.mbufs, room, p->tx_cksum_offload ? "offloaded" : "in software",
		p->zero_copy ? "zero-copy" : "copying", unknown, (unsigned long)(waited / 1000000));
	log_sizes(b, p, &sz, room, socket, af_packet_framecnt(&info));
	p->st.numa_due = true; /* the worker's first poll checks its socket against the port's */
	dp_backend_xstats_live(b); /* Stats may read the port from now on */
	return 0;
fail_started:
	dp_dpdk_stats_close(p);
	free(p->xnames);
	free(p->xvals);
	if ((rc = rte_eth_dev_stop(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_stop: err=%d, port=%u", cfg->name, rc, p->port);
fail_configured: /* closed before its queues' mbuf pool goes */
	close_port(cfg, p);
fail_pool:
	rte_mempool_free(p->pool);
fail_eal:
	dp_dpdk_link_close(p);
	dp_dpdk_eal_put();
	free(p);
	return -1;
}

/* The port's extended statistics (its driver's own counters), non-zero ones, in one log
 * line at close: where the frames went that the backend's counters cannot see (while
 * it runs, `duckpipe stats` shows them: dpdk_xstats). */
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
	dp_backend_xstats_dead(b); /* no Stats request reads the port past here */
	log_xstats(b, p);
	dp_dpdk_flow_close(b, p);
	if (p->nheld)
		rte_pktmbuf_free_bulk(p->held, p->nheld);
	if (p->ntxq)
		rte_pktmbuf_free_bulk(p->txq, p->ntxq);
	dp_dpdk_zc_close(p);
	dp_dpdk_link_close(p);
	int rc = rte_eth_dev_stop(p->port);
	if (rc != 0)
		DP_WARN("nic %s: rte_eth_dev_stop: err=%d, port=%u", b->cfg->name, rc, p->port);
	if ((rc = rte_eth_dev_close(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_close: err=%d, port=%u", b->cfg->name, rc, p->port);
	rte_mempool_free(p->pool);
	dp_dpdk_stats_close(p);
	free(p->xnames);
	free(p->xvals);
	free(p);
	b->priv = NULL;
	dp_dpdk_eal_put();
}

/* The port's xstats names, once (they do not change while it runs), and room for their
 * values, which dpdk_xstats reads on the control agent's thread. */
static int xstats_open(struct dpdk_priv *p)
{
	int n = rte_eth_xstats_get_names(p->port, NULL, 0);
	if (n <= 0)
		return 0; /* a port without xstats: Stats shows none */
	p->xnames = calloc((size_t)n, sizeof(*p->xnames));
	p->xvals = calloc((size_t)n, sizeof(*p->xvals));
	if (!p->xnames || !p->xvals) {
		dp_set_error("out of memory for %d xstats, port=%u", n, p->port);
		return -1;
	}
	int got = rte_eth_xstats_get_names(p->port, p->xnames, (unsigned)n);
	if (got != n) {
		dp_set_error("rte_eth_xstats_get_names: %d of %d, port=%u", got, n, p->port);
		return -1;
	}
	p->nxstats = (uint32_t)n;
	return 0;
}

_Static_assert(sizeof(((struct dp_xstat *)0)->name) == RTE_ETH_XSTATS_NAME_SIZE,
	       "an xstat's name fits Stats whole (control.XSTAT_NAME_MAX)");

/* ops->xstats: on the control agent's thread, through dp_backend_xstats (which keeps it
 * out of close): a copy of the worker's last reading, never the port itself (one reader
 * of the port's counters: dp_dpdk_stats.c says why). */
static uint32_t dpdk_xstats(struct dp_backend *b, struct dp_xstat *out, uint32_t max,
			    uint64_t *left_out)
{
	return dp_dpdk_stats_xstats(b->priv, out, max, left_out);
}

/* No rx_ready: a parked worker sleeps on the RX interrupt's fd, or polls without one. */
const struct dp_backend_ops dp_backend_dpdk = {
	.name = "dpdk",
	.open = dpdk_open,
	.close = dpdk_close,
	.tx_burst = dp_dpdk_tx_burst,
	.rx_burst = dp_dpdk_rx_burst,
	.tx_reclaim = dp_dpdk_tx_reclaim,
	.wait_fd = dp_dpdk_wait_fd,
	.rx_arm = dp_dpdk_rx_arm,
	.rx_disarm = dp_dpdk_rx_disarm,
	.xstats = dpdk_xstats,
};
