/* dp_backend_socket.c: kernel UDP, the reference system's "non-DPDK baseline".
 *
 * One non-blocking socket per NIC bound to the host address (SO_BINDTODEVICE
 * when an interface is named); sendmmsg with UDP GSO (UDP_SEGMENT: one call
 * hands the kernel a run of chunks to cut into datagrams) where the kernel has
 * it; recvmmsg in bursts; receive buffers sized for the largest reply burst, and
 * SO_RXQ_OVFL to count what the kernel still dropped.
 *
 * UDP GRO (the NIC's `gro`, where the kernel has UDP_GRO): one receive takes a run of a
 * duck's datagrams whole (on loopback, a GSO send arrives as it left), so recvmmsg
 * moves a burst of 64 runs, not of 64 datagrams. Each entry is then 64 KiB, and
 * rx_burst hands the runs out datagram by datagram (dp_gro.h), keeping what did not
 * fit the caller's burst for the next call: the receive waits until all of it is out,
 * and rx_ready keeps the worker from parking meanwhile.
 *
 * The host port is open to every local user: a flood of junk once cost the worker
 * 3.3 CPU-s per 5 s, each datagram a wake-up and an rx_malformed. A classic BPF filter
 * (dp_duck_filter.h) lets through only datagrams whose source address and port are
 * one of this NIC's ducks', so the kernel drops the rest before anyone wakes. It
 * counts them in the socket's drops, which SO_RXQ_OVFL reports with the next datagram
 * that is let through: rxq_overflows then holds them too (the kernel keeps one count
 * for both; no per-socket count tells a full buffer from a refusal).
 */
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dp_backend.h"
#include "dp_common.h"
#include "dp_duck_filter.h"
#include "dp_gro.h"
#include "dp_udp.h"

#define RX_BURST 64
#define RX_BUF 9216      /* at least a jumbo frame; more when the NIC's mtu says so */
#define TX_BURST 64
#define GSO_MAX_SEGMENTS 64
#define RX_GRO_BUF 65536 /* a GRO receive holds up to 64 KiB (one GSO send's worth) */

struct sock_priv {
	int fd;
	uint32_t last_ovfl;
	struct mmsghdr rx_msgs[RX_BURST];
	struct iovec rx_iov[RX_BURST];
	struct sockaddr_in rx_src[RX_BURST];
	/* SO_RXQ_OVFL's uint32, UDP_GRO's int, SO_TIMESTAMPNS's timespec */
	char rx_cmsg[RX_BURST][CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(int)) +
			       CMSG_SPACE(sizeof(struct timespec))];
	uint64_t rx_stamp[RX_BURST]; /* each receive's arrival, monotonic ns (0: unknown) */
	uint8_t *rx_bufs;
	/* GRO: the last recvmmsg's receives, handed out datagram by datagram */
	bool gro;
	uint32_t rx_nmsg;          /* receives it returned */
	uint32_t rx_next;          /* the one rx_cur is cutting */
	struct dp_gro_cursor rx_cur;
	struct mmsghdr tx_msgs[TX_BURST];
	char tx_cmsg[TX_BURST][CMSG_SPACE(sizeof(uint16_t))];
};

static int set_int(int fd, int level, int opt, int val, const char *name)
{
	if (setsockopt(fd, level, opt, &val, sizeof(val)) < 0) {
		dp_set_error("setsockopt(%s=%d): %s", name, val, strerror(errno));
		return -1;
	}
	return 0;
}

/* Before bind: no datagram is queued that the filter would have refused. A kernel that
 * refuses the filter leaves the worker to drop junk itself (rx_malformed, logged). */
static void attach_duck_filter(struct dp_backend *b, int fd)
{
	static struct sock_filter code[DP_DUCK_FILTER_MAX]; /* open runs on one thread, at start */
	struct sock_fprog prog = { .filter = code };
	prog.len = (unsigned short)dp_duck_filter_build(b->config, b->nic, code);
	if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0) {
		DP_WARN("nic %s: SO_ATTACH_FILTER (%u instructions): %s; datagrams from others "
			"than its ducks reach the worker", b->cfg->name, prog.len, strerror(errno));
		return;
	}
	dp_count(b->counters, DP_C_rx_duck_filters, 1);
}

static int sock_open(struct dp_backend *b)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	struct sock_priv *p = calloc(1, sizeof(*p));
	if (!p) {
		dp_set_error("out of memory for socket buffers");
		return -1;
	}
	p->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (p->fd < 0) {
		dp_set_error("socket(): %s", strerror(errno));
		goto fail;
	}
	if (cfg->interface[0] && setsockopt(p->fd, SOL_SOCKET, SO_BINDTODEVICE, cfg->interface,
					     (socklen_t)strlen(cfg->interface)) < 0) {
		dp_set_error("SO_BINDTODEVICE %s: %s (needs root and an existing interface)",
			     cfg->interface, strerror(errno));
		goto fail;
	}
	/* Large replies need large buffers (NOTES.md): beyond rmem_max, root can force. */
	if (set_int(p->fd, SOL_SOCKET, SO_RCVBUFFORCE, (int)cfg->rcvbuf, "SO_RCVBUFFORCE") < 0 &&
	    set_int(p->fd, SOL_SOCKET, SO_RCVBUF, (int)cfg->rcvbuf, "SO_RCVBUF") < 0)
		DP_WARN("nic %s: %s", cfg->name, dp_error());
	if (set_int(p->fd, SOL_SOCKET, SO_SNDBUFFORCE, 4 << 20, "SO_SNDBUFFORCE") < 0)
		(void)set_int(p->fd, SOL_SOCKET, SO_SNDBUF, 4 << 20, "SO_SNDBUF");
	(void)set_int(p->fd, SOL_SOCKET, SO_RXQ_OVFL, 1, "SO_RXQ_OVFL");
	/* arrival times: a reply read late (the worker parked until replies were due,
	 * dp_main.c, or was descheduled) still measures its duck's reply time right */
	(void)set_int(p->fd, SOL_SOCKET, SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS");
	if (cfg->busy_poll_us && set_int(p->fd, SOL_SOCKET, SO_BUSY_POLL, (int)cfg->busy_poll_us,
					 "SO_BUSY_POLL") < 0)
		DP_WARN("nic %s: %s", cfg->name, dp_error());
	if (cfg->use_broadcast && set_int(p->fd, SOL_SOCKET, SO_BROADCAST, 1, "SO_BROADCAST") < 0)
		goto fail;
	attach_duck_filter(b, p->fd);
	if (bind(p->fd, (const struct sockaddr *)&cfg->host, sizeof(cfg->host)) < 0) {
		dp_set_error("bind to the NIC's host address (port %u): %s; is another dataplane "
			     "running, or the address not on this host?",
			     ntohs(cfg->host.sin_port), strerror(errno));
		goto fail;
	}
	/* Probe GSO: a socket-wide UDP_SEGMENT of 0 is accepted where the kernel has it. */
	b->gso = cfg->gso && set_int(p->fd, SOL_UDP, UDP_SEGMENT, 0, "UDP_SEGMENT") == 0;
	b->max_gso_segments = GSO_MAX_SEGMENTS;
	/* GRO where asked and the kernel has it (>= 5.0); else plain receives, said once */
	if (cfg->gro) {
		p->gro = set_int(p->fd, SOL_UDP, UDP_GRO, 1, "UDP_GRO") == 0;
		if (!p->gro)
			DP_WARN("nic %s: %s; receiving datagram by datagram", cfg->name, dp_error());
	}
	b->gro = p->gro;
	p->rx_cur.done = true; /* nothing received yet */
	/* a UDP payload is shorter than the mtu: room for the largest, or it arrives truncated */
	size_t stride = p->gro ? RX_GRO_BUF : cfg->mtu > RX_BUF ? cfg->mtu : RX_BUF;
	stride = (stride + 63) & ~(size_t)63;
	if (!(p->rx_bufs = aligned_alloc(64, RX_BURST * stride))) {
		dp_set_error("out of memory for socket buffers (%d x %zu bytes)", RX_BURST, stride);
		goto fail;
	}
	for (uint32_t i = 0; i < RX_BURST; i++) {
		p->rx_iov[i].iov_base = p->rx_bufs + (size_t)i * stride;
		p->rx_iov[i].iov_len = stride;
	}
	b->priv = p;
	return 0;
fail:
	if (p->fd >= 0)
		close(p->fd);
	free(p->rx_bufs);
	free(p);
	return -1;
}

static void sock_close(struct dp_backend *b)
{
	struct sock_priv *p = b->priv;
	if (!p)
		return;
	close(p->fd);
	free(p->rx_bufs);
	free(p);
	b->priv = NULL;
}

static uint32_t sock_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
{
	struct sock_priv *p = b->priv;
	uint32_t sent = 0;
	while (sent < n) {
		uint32_t batch = n - sent < TX_BURST ? n - sent : TX_BURST;
		for (uint32_t i = 0; i < batch; i++) {
			struct dp_tx *t = &tx[sent + i];
			struct msghdr *m = &p->tx_msgs[i].msg_hdr;
			memset(m, 0, sizeof(*m));
			m->msg_name = (void *)t->dst;
			m->msg_namelen = sizeof(*t->dst);
			m->msg_iov = t->iov;
			m->msg_iovlen = t->iovcnt;
			if (t->gso_size && t->datagrams > 1) {
				m->msg_control = p->tx_cmsg[i];
				m->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
				struct cmsghdr *c = CMSG_FIRSTHDR(m);
				c->cmsg_level = SOL_UDP;
				c->cmsg_type = UDP_SEGMENT;
				c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
				uint16_t seg = (uint16_t)t->gso_size;
				memcpy(CMSG_DATA(c), &seg, sizeof(seg));
			}
		}
		int rc = sendmmsg(p->fd, p->tx_msgs, batch, 0);
		if (rc <= 0) {
			if (rc < 0 && errno == EINTR)
				continue;
			if (rc < 0 && (errno == EIO || errno == EINVAL) && b->gso) {
				/* the device cannot segment: stop asking; the worker resends per chunk */
				DP_WARN("nic %s: UDP GSO refused (%s); sending chunk by chunk",
					b->cfg->name, strerror(errno));
				b->gso = false;
			}
			if (rc < 0 && errno != EAGAIN)
				DP_DEBUG("nic %s: sendmmsg: %s", b->cfg->name, strerror(errno));
			break; /* EAGAIN: buffer full; the caller counts and NACKs recover */
		}
		for (int i = 0; i < rc; i++) {
			struct dp_tx *t = &tx[sent + (uint32_t)i];
			dp_count(b->counters, DP_C_tx_packets, t->datagrams ? t->datagrams : 1);
			dp_count(b->counters, DP_C_tx_bytes, p->tx_msgs[i].msg_len);
			if (t->gso_size && t->datagrams > 1)
				dp_count(b->counters, DP_C_gso_sends, 1);
		}
		sent += (uint32_t)rc;
	}
	if (sent < n)
		dp_count(b->counters, DP_C_tx_errors, n - sent);
	return sent;
}

static void rx_count_overflows(struct dp_backend *b, struct sock_priv *p, struct msghdr *m)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL &&
		    c->cmsg_len >= CMSG_LEN(sizeof(uint32_t))) {
			uint32_t ovfl;
			memcpy(&ovfl, CMSG_DATA(c), sizeof(ovfl));
			if (ovfl > p->last_ovfl)
				dp_count(b->counters, DP_C_rxq_overflows, ovfl - p->last_ovfl);
			p->last_ovfl = ovfl;
		}
}

/* Receive m's SO_TIMESTAMPNS (CLOCK_REALTIME) on the monotonic clock: real - offset;
 * 0 when it has none or it is not in the past. */
static uint64_t rx_stamp(struct msghdr *m, int64_t offset, uint64_t mono_now)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
			struct timespec ts;
			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - offset;
			return t > 0 && (uint64_t)t <= mono_now ? (uint64_t)t : 0;
		}
	return 0;
}

/* recvmmsg up to n receives into the rx buffers; how many came (0 on none or error). */
static uint32_t rx_receive(struct sock_priv *p, uint32_t n)
{
	if (n > RX_BURST)
		n = RX_BURST;
	for (uint32_t i = 0; i < n; i++) {
		struct msghdr *m = &p->rx_msgs[i].msg_hdr;
		m->msg_name = &p->rx_src[i];
		m->msg_namelen = sizeof(p->rx_src[i]);
		m->msg_iov = &p->rx_iov[i];
		m->msg_iovlen = 1;
		m->msg_control = p->rx_cmsg[i];
		m->msg_controllen = sizeof(p->rx_cmsg[i]);
		m->msg_flags = 0;
	}
	int rc = recvmmsg(p->fd, p->rx_msgs, n, MSG_DONTWAIT, NULL);
	if (rc <= 0)
		return 0;
	struct timespec real, mono;
	clock_gettime(CLOCK_REALTIME, &real);
	clock_gettime(CLOCK_MONOTONIC, &mono);
	uint64_t mono_now = (uint64_t)mono.tv_sec * 1000000000 + (uint64_t)mono.tv_nsec;
	int64_t offset = ((int64_t)real.tv_sec - mono.tv_sec) * 1000000000 +
			 (real.tv_nsec - mono.tv_nsec);
	for (int i = 0; i < rc; i++)
		p->rx_stamp[i] = rx_stamp(&p->rx_msgs[i].msg_hdr, offset, mono_now);
	return (uint32_t)rc;
}

/* Start cutting receive i (GRO), counting it when it holds several datagrams. */
static void rx_gro_start(struct dp_backend *b, struct sock_priv *p, uint32_t i)
{
	struct msghdr *m = &p->rx_msgs[i].msg_hdr;
	rx_count_overflows(b, p, m);
	dp_gro_start(&p->rx_cur, p->rx_iov[i].iov_base, p->rx_msgs[i].msg_len,
		     dp_gro_cmsg_size(m), m->msg_flags & MSG_TRUNC);
	if (p->rx_cur.seg) {
		dp_count(b->counters, DP_C_rx_gro_buffers, 1);
		dp_count(b->counters, DP_C_rx_gro_segments,
			 (p->rx_cur.len + p->rx_cur.seg - 1) / p->rx_cur.seg);
	}
	p->rx_next = i;
}

/* GRO: up to n datagrams out of the receives in hand, then (only when none were handed
 * out in this call: the caller may still read the ones of the last) a new recvmmsg. */
static uint32_t sock_rx_burst_gro(struct dp_backend *b, struct sock_priv *p, struct dp_rx *rx,
				  uint32_t n)
{
	uint32_t out = 0;
	while (out < n) {
		if (dp_gro_next(&p->rx_cur, &rx[out].buf, &rx[out].len)) {
			rx[out].stamp_ns = p->rx_stamp[p->rx_next];
			rx[out++].src = p->rx_src[p->rx_next];
			continue;
		}
		if (p->rx_next + 1 < p->rx_nmsg) {
			rx_gro_start(b, p, p->rx_next + 1);
			continue;
		}
		if (out)
			break;
		p->rx_nmsg = rx_receive(p, RX_BURST);
		if (!p->rx_nmsg)
			break;
		rx_gro_start(b, p, 0);
	}
	return out;
}

static uint32_t sock_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n)
{
	struct sock_priv *p = b->priv;
	if (p->gro)
		return sock_rx_burst_gro(b, p, rx, n);
	uint32_t got = rx_receive(p, n);
	for (uint32_t i = 0; i < got; i++) {
		struct msghdr *m = &p->rx_msgs[i].msg_hdr;
		rx[i].buf = p->rx_iov[i].iov_base;
		/* a truncated datagram keeps a length the header check will refuse */
		rx[i].len = (m->msg_flags & MSG_TRUNC) ? 0 : p->rx_msgs[i].msg_len;
		rx[i].src = p->rx_src[i];
		rx[i].stamp_ns = p->rx_stamp[i];
		rx_count_overflows(b, p, m);
	}
	return got;
}

/* GRO: datagrams of the last receives not handed out yet (the fd may be quiet). */
static bool sock_rx_ready(struct dp_backend *b)
{
	const struct sock_priv *p = b->priv;
	return p->gro && (!p->rx_cur.done || p->rx_next + 1 < p->rx_nmsg);
}

/* A parked worker sleeps in epoll on this socket: the reply itself wakes it. */
static int sock_wait_fd(struct dp_backend *b)
{
	return ((const struct sock_priv *)b->priv)->fd;
}

const struct dp_backend_ops dp_backend_socket = {
	.name = "socket",
	.open = sock_open,
	.close = sock_close,
	.tx_burst = sock_tx_burst,
	.rx_burst = sock_rx_burst,
	.wait_fd = sock_wait_fd,
	.rx_ready = sock_rx_ready,
};
