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
 *            One RX and one TX queue, an mbuf pool of its own (sized below), bursts
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
 *            rx_fragments, broken ones as rx_malformed, the port's own drops (imissed,
 *            rx_nombuf) as rxq_overflows. UDP payloads go up in place,
 *            in their mbufs, which are freed on the next rx_burst (as the socket
 *            backend's buffers stay valid until its next call).
 *   parking  a poll-mode port has no fd: wait_fd and rx_ready are NULL, so a parked
 *            worker polls every DP_BACKEND_POLL_NS. In production, run the dpdk
 *            backend with idle = "spin" and dedicated threads on their own lcores.
 *
 *   xstats   the port's extended statistics (its driver's counters) go into Stats,
 *            per NIC, the non-zero ones (`duckpipe stats`): names read at open, values
 *            by the control agent's thread on each GetStats (dpdk_xstats); close waits
 *            for a read in flight (dp_backend_xstats_dead). Also logged at close.
 *   rte_flow ingress rules steering the ducks' replies (IPv4 to host_ip, UDP to
 *            host_port) and ARP to the worker's RX queue, where the port has rte_flow
 *            (NIC flow_steering: auto, off, require; dp_dpdk_flow.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include "dp_common.h"
#include "dp_dpdk.h"

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

static int xstats_open(struct dpdk_priv *p);

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
	if (dp_dpdk_eal_get() < 0) {
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
	dp_dpdk_zc_open(p, &info); /* zero copy: which ports, dp_dpdk_zc.c */
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
		goto fail_configured;
	}
	struct rte_eth_rxconf rxq = info.default_rxconf;
	rxq.offloads = conf.rxmode.offloads;
	if ((rc = rte_eth_rx_queue_setup(p->port, 0, nrx, (unsigned)socket, &rxq, p->pool)) != 0) {
		dp_set_error("rte_eth_rx_queue_setup: err=%d, port=%u", rc, p->port);
		goto fail_configured;
	}
	struct rte_eth_txconf txq = info.default_txconf;
	txq.offloads = conf.txmode.offloads;
	if ((rc = rte_eth_tx_queue_setup(p->port, 0, ntx, (unsigned)socket, &txq)) != 0) {
		dp_set_error("rte_eth_tx_queue_setup: err=%d, port=%u", rc, p->port);
		goto fail_configured;
	}
	if ((rc = rte_eth_macaddr_get(p->port, &p->mac)) != 0) {
		dp_set_error("rte_eth_macaddr_get: err=%d, port=%u", rc, p->port);
		goto fail_configured;
	}
	if ((rc = rte_eth_dev_start(p->port)) != 0) {
		dp_set_error("rte_eth_dev_start: err=%d, port=%u", rc, p->port);
		goto fail_configured;
	}
	if ((rc = rte_eth_stats_reset(p->port)) != 0) /* rxq_overflows counts from here */
		DP_WARN("nic %s: rte_eth_stats_reset: err=%d, port=%u: rxq_overflows counts the "
			"port's drops since before this run", cfg->name, rc, p->port);
	p->host_ip = cfg->host.sin_addr.s_addr;
	p->host_port = cfg->host.sin_port;
	p->bcast_ip = cfg->use_broadcast ? cfg->broadcast.sin_addr.s_addr : 0;
	if (xstats_open(p) < 0 || dp_dpdk_flow_open(b, p) < 0)
		goto fail_started;
	p->max_datagram = cfg->mtu - (uint32_t)(sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr));
	for (uint32_t i = 0; i < b->config->nducks; i++)
		if (b->config->ducks[i].nic == b->nic)
			dp_dpdk_arp_add(p, b->config->ducks[i].addr.sin_addr.s_addr);
	b->priv = p;
	dp_dpdk_zc_start(b, p, &info);
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
				dp_dpdk_arp_request(b, p, &p->arp[i], now);
			}
		if (p->ntxq)
			dp_dpdk_txq_flush(b, p);
		struct dp_rx rx[BURST];
		(void)dp_dpdk_rx_burst(b, rx, BURST); /* only ARP is expected: datagrams are dropped */
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
	dp_backend_xstats_live(b); /* Stats may read the port from now on */
	return 0;
fail_started:
	free(p->xnames);
	free(p->xvals);
	if ((rc = rte_eth_dev_stop(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_stop: err=%d, port=%u", cfg->name, rc, p->port);
fail_configured: /* closed before its queues' mbuf pool goes */
	if ((rc = rte_eth_dev_close(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_close: err=%d, port=%u", cfg->name, rc, p->port);
fail_pool:
	rte_mempool_free(p->pool);
fail_eal:
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
	int rc = rte_eth_dev_stop(p->port);
	if (rc != 0)
		DP_WARN("nic %s: rte_eth_dev_stop: err=%d, port=%u", b->cfg->name, rc, p->port);
	if ((rc = rte_eth_dev_close(p->port)) != 0)
		DP_WARN("nic %s: rte_eth_dev_close: err=%d, port=%u", b->cfg->name, rc, p->port);
	rte_mempool_free(p->pool);
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
 * out of close), while the worker bursts on the port. rte_eth_xstats_get from another
 * thread is what DPDK's telemetry does. It can overlap the worker's rte_eth_stats_get
 * (rxq_overflows, every STATS_MS): ethdev promises nothing there. af_packet and tap
 * read per-queue counters; ice reads NIC registers against offsets it keeps, which two
 * threads may update at once (not checked on an E810): a counter could be off by a
 * reading, the port itself is not disturbed. */
static uint32_t dpdk_xstats(struct dp_backend *b, struct dp_xstat *out, uint32_t max,
			    uint64_t *left_out)
{
	struct dpdk_priv *p = b->priv;
	if (!p->nxstats)
		return 0;
	int n = rte_eth_xstats_get(p->port, p->xvals, p->nxstats);
	if (n <= 0 || (uint32_t)n > p->nxstats)
		return 0;
	uint32_t k = 0;
	for (int i = 0; i < n; i++) {
		const struct rte_eth_xstat *x = &p->xvals[i];
		if (!x->value || x->id >= p->nxstats)
			continue;
		if (k == max) {
			(*left_out)++;
			continue;
		}
		memcpy(out[k].name, p->xnames[x->id].name, sizeof(out[k].name));
		out[k].name[sizeof(out[k].name) - 1] = '\0';
		out[k].value = x->value;
		k++;
	}
	return k;
}

/* Poll mode: no wait_fd, no rx_ready (dp_backend.h): a parked worker polls. */
const struct dp_backend_ops dp_backend_dpdk = {
	.name = "dpdk",
	.open = dpdk_open,
	.close = dpdk_close,
	.tx_burst = dp_dpdk_tx_burst,
	.rx_burst = dp_dpdk_rx_burst,
	.tx_reclaim = dp_dpdk_tx_reclaim,
	.xstats = dpdk_xstats,
};
