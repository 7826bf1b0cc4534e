/* dp_dpdk_stats.c: the port's counters, read by one thread: the NIC's worker.
 *
 * ethdev makes no promise for two threads reading one port's statistics at once, and on
 * ice a read is many register reads against offsets the driver keeps (two readers can
 * update them at once). So the worker, which owns the port, reads everything, every
 * STATS_MS from its rx_burst: rte_eth_stats_get (imissed, rx_nombuf: rx_missed,
 * rx_nombuf and their sum rxq_overflows, counters only the worker writes), the kernel's
 * drops under an af_packet port (rx_kernel_drops), and rte_eth_xstats_get into a
 * snapshot that the control agent's thread copies for Stats under a sequence lock
 * (dp_dpdk_stats_xstats) without touching the port. The control thread could not be the
 * reader instead: the drop counters are the worker's own (one writer each). STATS_MS
 * bounds the reads' cost on the polling core (ice: tens of register reads) to a few
 * per second; Stats' xstats are that old at most.
 *
 * af_packet in DPDK 22.11 does not report its kernel ring's drops (PACKET_STATISTICS
 * tp_drops; DPDK 25.03 adds them to imissed): the backend finds the PMD's AF_PACKET
 * sockets on the port's interface among the process's descriptors and reads them itself.
 * The read resets the kernel's count: this is its only reader.
 *
 * af_xdp (22.11 and later, to 25.x) puts its XSK's XDP_STATISTICS rx_dropped in imissed
 * but not rx_ring_full: with the whole struct (kernel 5.9+) the kernel reports the frames
 * it could not put in a full RX ring there only, not in rx_dropped. Those are the frames a
 * slow or small RX ring (rx_desc) loses: the veth counts them (ethtool -S: rx_queue_0_drops)
 * and duckpipe saw only the NACKs. The backend reads them itself into rx_kernel_drops. An
 * XSK has no getsockname: the port's own are the XSKs that appeared during its RX queue
 * setup (the PMD makes one per queue there; NICs open one after another). The counts are
 * cumulative: the reader keeps what it counted. Fill-ring-empty drops are in rx_dropped
 * (imissed: rx_missed) already. */
#include <dirent.h>
#include <linux/if_packet.h>
#include <linux/if_xdp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_version.h>

#include "dp_common.h"
#include "dp_dpdk.h"
#include "dp_dpdk_size.h"

#if RTE_VERSION < RTE_VERSION_NUM(25, 3, 0, 0)
#define AF_PACKET_DROPS_OURS 1 /* the PMD does not read tp_drops: we do */
#else
#define AF_PACKET_DROPS_OURS 0
#endif

/* The PMD's AF_PACKET sockets bound to ifindex (one per queue pair). */
static void find_packet_sockets(struct dpdk_priv *p, int ifindex)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) && p->st.nkfds < DP_ARRAY_LEN(p->st.kfds)) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end || fd < 0 || fd == dirfd(d))
			continue;
		struct stat sb;
		int domain = 0;
		socklen_t len = sizeof(domain);
		struct sockaddr_ll ll;
		socklen_t lllen = sizeof(ll);
		if (fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode) ||
		    getsockopt((int)fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
		    domain != AF_PACKET ||
		    getsockname((int)fd, (struct sockaddr *)&ll, &lllen) != 0 ||
		    ll.sll_ifindex != ifindex)
			continue;
		p->st.kfds[p->st.nkfds++] = (int)fd;
	}
	closedir(d);
}

static uint64_t kernel_drops(struct dpdk_priv *p)
{
	uint64_t drops = 0;
	for (uint32_t i = 0; i < p->st.nkfds; i++) {
		struct tpacket_stats ts;
		socklen_t len = sizeof(ts);
		if (getsockopt(p->st.kfds[i], SOL_PACKET, PACKET_STATISTICS, &ts, &len) == 0)
			drops += ts.tp_drops; /* since the last read: the kernel zeroes it */
	}
	return drops;
}

#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef SOL_XDP
#define SOL_XDP 283
#endif

/* The process's AF_XDP sockets, up to max, into fds. */
static uint32_t xdp_sockets(int *fds, uint32_t max)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	uint32_t n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end || fd < 0 || fd == dirfd(d))
			continue;
		struct stat sb;
		int domain = 0;
		socklen_t len = sizeof(domain);
		if (fstat((int)fd, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
		    getsockopt((int)fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
		    domain == AF_XDP)
			fds[n++] = (int)fd;
	}
	closedir(d);
	return n;
}

void dp_dpdk_stats_xsk_before(struct dpdk_priv *p)
{
	p->st.nxsk_before = xdp_sockets(p->st.xsk_before, DP_ARRAY_LEN(p->st.xsk_before));
}

/* An XSK's rx_ring_full: frames the kernel dropped, the socket's RX ring full; false
 * where the kernel predates the field (then they are in rx_dropped: imissed). */
static bool xsk_ring_full(int fd, uint64_t *out)
{
	struct xdp_statistics xs;
	socklen_t len = sizeof(xs);
	memset(&xs, 0, sizeof(xs));
	if (getsockopt(fd, SOL_XDP, XDP_STATISTICS, &xs, &len) != 0 || len < sizeof(xs))
		return false;
	*out = xs.rx_ring_full;
	return true;
}

/* The XSKs the PMD made in this port's queue setup: those not there before it. */
static void find_xdp_sockets(struct dpdk_priv *p)
{
	int now[DP_ARRAY_LEN(p->st.xsk_before) + DP_ARRAY_LEN(p->st.xfds)];
	uint32_t n = xdp_sockets(now, DP_ARRAY_LEN(now));
	for (uint32_t i = 0; i < n && p->st.nxfds < DP_ARRAY_LEN(p->st.xfds); i++) {
		bool old = false;
		for (uint32_t j = 0; j < p->st.nxsk_before; j++)
			old |= p->st.xsk_before[j] == now[i];
		uint64_t full;
		if (old || !xsk_ring_full(now[i], &full))
			continue;
		p->st.xfds[p->st.nxfds] = now[i];
		p->st.xfull[p->st.nxfds++] = full; /* drops before open are not ours */
	}
}

static uint64_t xsk_drops(struct dpdk_priv *p)
{
	uint64_t drops = 0;
	for (uint32_t i = 0; i < p->st.nxfds; i++) {
		uint64_t full;
		if (!xsk_ring_full(p->st.xfds[i], &full) || full < p->st.xfull[i])
			continue;
		drops += full - p->st.xfull[i];
		p->st.xfull[i] = full;
	}
	return drops;
}

int dp_dpdk_stats_open(struct dp_backend *b, struct dpdk_priv *p,
		       const struct rte_eth_dev_info *info)
{
	if (p->nxstats) {
		p->st.snap = calloc(p->nxstats, sizeof(*p->st.snap));
		p->st.copy = calloc(p->nxstats, sizeof(*p->st.copy));
		if (!p->st.snap || !p->st.copy) {
			dp_set_error("out of memory for %u xstats, port=%u", p->nxstats, p->port);
			return -1;
		}
	}
	p->st.oerrors_taken = !strcmp(info->driver_name, "net_af_packet");
	if (AF_PACKET_DROPS_OURS && !strcmp(info->driver_name, "net_af_packet") && info->if_index) {
		find_packet_sockets(p, (int)info->if_index);
		(void)kernel_drops(p); /* drops before open are not ours: from zero */
		if (!p->st.nkfds)
			DP_WARN("nic %s: no AF_PACKET socket on ifindex %u found: the kernel's drops "
				"(rx_kernel_drops) stay unseen", b->cfg->name, info->if_index);
	}
	if (!strcmp(info->driver_name, "net_af_xdp")) {
		find_xdp_sockets(p);
		if (!p->st.nxfds)
			DP_WARN("nic %s: no AF_XDP socket of port %u found (or a kernel before 5.9): "
				"frames dropped on its full RX ring (rx_ring_full) stay unseen",
				b->cfg->name, p->port);
	}
	/* the first reading, on the opening thread (the worker does not run yet): Stats
	 * has xstats from the start */
	dp_dpdk_stats_read(b, p);
	return 0;
}

void dp_dpdk_stats_close(struct dpdk_priv *p)
{
	free(p->st.snap);
	free(p->st.copy);
	p->st.snap = p->st.copy = NULL;
}

static void count_new(struct dp_backend *b, enum dp_counter which, uint64_t now, uint64_t *seen)
{
	if (now > *seen) {
		dp_count(b->counters, which, now - *seen);
		dp_count(b->counters, DP_C_rxq_overflows, now - *seen);
	}
	*seen = now;
}

/* The worker's thread against the port's socket: a warning, once (l2fwd and l3fwd
 * warn too), naming both; the pool is on the port's socket already (dpdk_open). */
static void check_numa(struct dp_backend *b, struct dpdk_priv *p)
{
	int port_socket = rte_eth_dev_socket_id(p->port);
	cpu_set_t set;
	int sockets[CPU_SETSIZE];
	unsigned n = 0;
	char cpus[128] = "";
	size_t used = 0;
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return;
	for (unsigned cpu = 0; cpu < CPU_SETSIZE && n < DP_ARRAY_LEN(sockets); cpu++) {
		if (!CPU_ISSET(cpu, &set))
			continue;
		sockets[n++] = dp_dpdk_cpu_socket(cpu);
		if (used < sizeof(cpus)) {
			int k = snprintf(cpus + used, sizeof(cpus) - used, "%s%u:%d", used ? "," : "",
					 cpu, sockets[n - 1]);
			used += k > 0 ? (size_t)k : 0;
		}
	}
	enum dp_dpdk_numa v = dp_dpdk_numa_verdict(port_socket, sockets, n);
	if (v == DP_DPDK_NUMA_REMOTE || v == DP_DPDK_NUMA_SPANS)
		DP_WARN("nic %s: port %u is on NUMA socket %d, its worker %s on another (CPU:socket "
			"%s): every frame and mbuf crosses sockets; put the worker on a CPU of socket "
			"%d (-l / --lcores, or the topology's cores)",
			b->cfg->name, p->port, port_socket,
			v == DP_DPDK_NUMA_REMOTE ? "runs" : "may run", cpus, port_socket);
	else
		DP_INFO("nic %s: port %u on NUMA socket %d, its worker on CPU(:socket) %s", b->cfg->name,
			p->port, port_socket, cpus);
}

void dp_dpdk_stats_read(struct dp_backend *b, struct dpdk_priv *p)
{
	struct rte_eth_stats st;
	if (rte_eth_stats_get(p->port, &st) == 0) {
		count_new(b, DP_C_rx_missed, st.imissed, &p->st.missed);
		count_new(b, DP_C_rx_nombuf, st.rx_nombuf, &p->st.nombuf);
		/* Frames the driver took and then failed to send: af_packet's tx_burst returns
		 * them as sent when its sendto fails (a link that went down before
		 * dp_dpdk_link.c saw it) and counts them in oerrors only. They were counted in
		 * tx_packets at hand-off: move them to tx_errors (an ARP frame among them makes
		 * tx_packets one short). Only there: other drivers (af_xdp) count in oerrors
		 * the frames tx_burst handed back, which txq_flush retries and counts itself. */
		if (p->st.oerrors_taken && st.oerrors > p->oerrors_seen) {
			uint64_t refused = st.oerrors - p->oerrors_seen;
			uint64_t sent = dp_load_relaxed_u64(&b->counters->v[DP_C_tx_packets]);
			dp_count(b->counters, DP_C_tx_errors, refused);
			dp_count(b->counters, DP_C_tx_packets, -(refused < sent ? refused : sent));
		}
		p->oerrors_seen = st.oerrors;
	}
	if (p->st.nkfds) {
		uint64_t k = kernel_drops(p);
		if (k) {
			dp_count(b->counters, DP_C_rx_kernel_drops, k);
			dp_count(b->counters, DP_C_rxq_overflows, k);
		}
	}
	if (p->st.nxfds) {
		uint64_t k = xsk_drops(p);
		if (k) {
			dp_count(b->counters, DP_C_rx_kernel_drops, k);
			dp_count(b->counters, DP_C_rxq_overflows, k);
		}
	}
	if (!p->nxstats || !p->st.snap)
		return;
	int n = rte_eth_xstats_get(p->port, p->xvals, p->nxstats);
	if (n <= 0 || (uint32_t)n > p->nxstats)
		return;
	/* seqlock, writer side: odd while the values change. Each value is stored with
	 * release (the odd seq before it; a plain store on x86) rather than after a fence,
	 * which ThreadSanitizer cannot follow. */
	uint32_t seq = p->st.seq;
	__atomic_store_n(&p->st.seq, seq + 1, __ATOMIC_RELAXED);
	for (int i = 0; i < n; i++)
		if (p->xvals[i].id < p->nxstats)
			__atomic_store_n(&p->st.snap[p->xvals[i].id], p->xvals[i].value, __ATOMIC_RELEASE);
	__atomic_store_n(&p->st.seq, seq + 2, __ATOMIC_RELEASE); /* the values before even */
}

void dp_dpdk_stats_poll(struct dp_backend *b, struct dpdk_priv *p)
{
	uint64_t now = dp_now_ns();
	if (now < p->st.next_ns)
		return;
	if (p->st.numa_due) { /* the first poll after open: on the worker's own thread */
		p->st.numa_due = false;
		check_numa(b, p);
	}
	p->st.next_ns = now + (uint64_t)STATS_MS * 1000000;
	dp_dpdk_stats_read(b, p);
}

uint32_t dp_dpdk_stats_xstats(struct dpdk_priv *p, struct dp_xstat *out, uint32_t max,
			      uint64_t *left_out)
{
	if (!p->nxstats || !p->st.snap)
		return 0;
	/* seqlock, reader side: a copy taken while seq stayed even and unchanged; the
	 * worker writes for a microsecond every STATS_MS, so a few tries do */
	bool whole = false;
	for (int tries = 0; tries < 1000 && !whole; tries++) {
		uint32_t s1 = __atomic_load_n(&p->st.seq, __ATOMIC_ACQUIRE); /* values after */
		if (s1 & 1) {
			sched_yield();
			continue;
		}
		/* each value loaded with acquire: the second seq is read after all of them */
		for (uint32_t i = 0; i < p->nxstats; i++)
			p->st.copy[i] = __atomic_load_n(&p->st.snap[i], __ATOMIC_ACQUIRE);
		whole = __atomic_load_n(&p->st.seq, __ATOMIC_RELAXED) == s1;
	}
	if (!whole)
		return 0;
	uint32_t k = 0;
	for (uint32_t id = 0; id < p->nxstats; id++) {
		if (!p->st.copy[id])
			continue;
		if (k == max) {
			(*left_out)++;
			continue;
		}
		memcpy(out[k].name, p->xnames[id].name, sizeof(out[k].name));
		out[k].name[sizeof(out[k].name) - 1] = '\0';
		out[k].value = p->st.copy[id];
		k++;
	}
	return k;
}
