/* dp_floor.c: duckpipe-floor, the C floor of `duckpipe bench forward`.
 *
 * The reference system's path done as bare as C allows: one UDP socket, every
 * activation chunk to every duck (unicast fan-out) with sendmmsg, or with one UDP
 * GSO sendmsg per duck and up to 44 datagrams (-g), then recvmmsg of every
 * partial chunk, blocking in poll() when nothing is queued. No NACKs, no
 * reassembly beyond counting chunks, no reduce: a floor, not a client. A forward
 * whose partials do not all arrive within --timeout-ms counts as lost and the
 * next one starts.
 *
 * Before timing it announces a layer (op LAYER, hidden = bytes / rows / 4) to each
 * duck and waits for the acks: the emulator answers FORWARD only for a known
 * layer. Start the emulator with --compute echo.
 *
 * Output, one line per timed forward (nanoseconds):
 *   fwd E2E SEND_SPREAD RECV_WINDOW MAX_COMPUTE SUM_COMPUTE LOST
 * then `cpu CPU_NS FORWARDS` (getrusage of this process over the timed forwards).
 *
 * With --moe anywhere on the line it is the floor of a routed forward instead
 * (dp_floor_moe.c, its own options).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "dp_abi.h"
#include "dp_floor.h"
#include "dp_udp.h"
#include "dp_wire.h"

/* ------------------------------------------------------------------ tunables */
#define FLOOR_BURST 64u           /* datagrams per recvmmsg */
#define FLOOR_TX_BATCH 1024u      /* datagrams per sendmmsg (UIO_MAXIOV) */
#define FLOOR_GSO_SEGS 44u        /* 44 x 1472 bytes fit in one 64 KiB GSO send */
#define FLOOR_LAYER 0x7f10u       /* the layer id the floor announces */
#define FLOOR_MAX_CHUNKS 4096u

/* ------------------------------------------------------------------- options */
static uint32_t opt_ducks = 1, opt_base_port, opt_first_id, opt_rows = 1;
static uint64_t opt_bytes = 4096, opt_iters = 100, opt_warmup = 10, opt_timeout_ms = 500;
static uint64_t opt_session = 0x666c6f6f72ull; /* "floor" */
static int opt_gso;

/* --------------------------------------------------------------------- state */
static int g_fd;
static uint32_t g_payload, g_chunks;
static struct sockaddr_in g_duck[FLOOR_MAX_DUCKS];
static uint8_t *g_act;                              /* the activation, shared by every duck */
static struct dp_wire_header *g_hdr;                /* ducks x chunks headers */
static struct iovec *g_iov;                         /* 2 per datagram: header, payload */
static struct mmsghdr *g_tx;                        /* one per datagram (mmsg mode) */
static uint8_t rx_buf[FLOOR_BURST][FLOOR_RX_BUF] __attribute__((aligned(64)));
static struct iovec rx_iov[FLOOR_BURST];
static struct mmsghdr rx_msg[FLOOR_BURST];

uint64_t floor_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void floor_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

/* ------------------------------------------------------------------ transmit */

static void set_forward_id(uint64_t fwd)
{
	for (uint32_t i = 0; i < opt_ducks * g_chunks; i++)
		g_hdr[i].forward_id = fwd;
}

static void send_mmsg(void)
{
	uint32_t n = opt_ducks * g_chunks, done = 0;
	while (done < n) {
		uint32_t batch = n - done < FLOOR_TX_BATCH ? n - done : FLOOR_TX_BATCH;
		int r = sendmmsg(g_fd, g_tx + done, batch, 0);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS)
				continue;
			floor_die("sendmmsg() failed: %s", strerror(errno));
		}
		done += (uint32_t)r;
	}
}

static void send_gso(void)
{
	uint32_t seg = DP_WIRE_HDR_LEN + g_payload;
	for (uint32_t d = 0; d < opt_ducks; d++) {
		for (uint32_t c = 0; c < g_chunks; c += FLOOR_GSO_SEGS) {
			uint32_t nseg = g_chunks - c < FLOOR_GSO_SEGS ? g_chunks - c : FLOOR_GSO_SEGS;
			char ctrl[CMSG_SPACE(sizeof(uint16_t))] = { 0 };
			struct msghdr m = {
				.msg_name = &g_duck[d],
				.msg_namelen = sizeof(g_duck[d]),
				.msg_iov = &g_iov[2 * ((size_t)d * g_chunks + c)],
				.msg_iovlen = 2 * nseg,
			};
			if (nseg > 1) { /* one datagram needs no segmentation */
				m.msg_control = ctrl;
				m.msg_controllen = sizeof(ctrl);
				struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
				cm->cmsg_level = SOL_UDP;
				cm->cmsg_type = UDP_SEGMENT;
				cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
				uint16_t gso = (uint16_t)seg;
				memcpy(CMSG_DATA(cm), &gso, sizeof(gso));
			}
			while (sendmsg(g_fd, &m, 0) < 0) {
				if (errno != EINTR && errno != EAGAIN && errno != ENOBUFS)
					floor_die("sendmsg(UDP_SEGMENT %u) to duck %u failed: %s", seg,
					    opt_first_id + d, strerror(errno));
			}
		}
	}
}

/* ------------------------------------------------------------------- receive */

struct fwd_result {
	uint64_t first_rx, last_rx, max_compute, sum_compute;
	uint32_t lost;
};

/* Receive every partial chunk of forward `fwd`, or give up at `deadline`. */
static void receive(uint64_t fwd, uint64_t deadline, struct fwd_result *res)
{
	static uint32_t got[FLOOR_MAX_DUCKS];
	uint32_t ducks_done = 0;
	memset(got, 0, sizeof(got));
	memset(res, 0, sizeof(*res));
	while (ducks_done < opt_ducks) {
		int n = recvmmsg(g_fd, rx_msg, FLOOR_BURST, MSG_DONTWAIT, NULL);
		if (n <= 0) {
			if (n < 0 && errno != EAGAIN && errno != EINTR)
				floor_die("recvmmsg() failed: %s", strerror(errno));
			uint64_t t = floor_now_ns();
			if (t >= deadline)
				break;
			struct pollfd p = { .fd = g_fd, .events = POLLIN };
			int ms = (int)((deadline - t + 999999) / 1000000);
			poll(&p, 1, ms);
			continue;
		}
		uint64_t t = floor_now_ns();
		for (int i = 0; i < n; i++) {
			const struct dp_wire_header *h = (const void *)rx_buf[i];
			if (dp_wire_check(rx_buf[i], rx_msg[i].msg_len) != DP_WIRE_OK ||
			    h->op != DP_WIRE_OP_PARTIAL || h->session != opt_session ||
			    h->forward_id != fwd || h->duck < opt_first_id ||
			    h->duck >= opt_first_id + opt_ducks)
				continue; /* late partials of a lost forward, acks */
			uint32_t d = h->duck - opt_first_id;
			if (!res->first_rx)
				res->first_rx = t;
			res->last_rx = t;
			if (got[d] == 0) {
				res->sum_compute += h->compute_ns;
				if (h->compute_ns > res->max_compute)
					res->max_compute = h->compute_ns;
			}
			if (++got[d] == h->chunks)
				ducks_done++;
		}
	}
	res->lost = opt_ducks - ducks_done;
}

/* --------------------------------------------------------------------- setup */

void floor_announce(int fd, const struct sockaddr_in *addr, uint32_t id, uint32_t layer,
		    uint64_t session, const struct dp_wire_layer *w)
{
	struct {
		struct dp_wire_header h;
		struct dp_wire_layer l;
	} msg; /* 80 + 24 bytes, no padding between them */
	_Static_assert(sizeof(msg) == DP_WIRE_HDR_LEN + sizeof(struct dp_wire_layer), "layout");
	for (int attempt = 0; attempt < 5; attempt++) {
		dp_wire_init(&msg.h, DP_WIRE_OP_LAYER, session, 1);
		msg.h.duck = (uint16_t)id;
		msg.h.layer = layer;
		msg.h.dtype = w->dtype;
		msg.h.length = sizeof(msg.l);
		msg.l = *w;
		if (sendto(fd, &msg, sizeof(msg), 0, (const struct sockaddr *)addr, sizeof(*addr)) < 0)
			floor_die("sendto(LAYER) to duck %u failed: %s", id, strerror(errno));
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t deadline = floor_now_ns() + 200000000ull;
		while (floor_now_ns() < deadline) {
			if (poll(&p, 1, 20) <= 0)
				continue;
			uint8_t buf[FLOOR_RX_BUF];
			ssize_t len = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
			const struct dp_wire_header *h = (const void *)buf;
			if (len > 0 && dp_wire_check(buf, (size_t)len) == DP_WIRE_OK &&
			    h->op == DP_WIRE_OP_WEIGHT_ACK && h->duck == id &&
			    h->tensor == DP_WIRE_LAYER_TENSOR)
				return;
		}
	}
	floor_die("duck %u at 127.0.0.1:%u never acknowledged layer 0x%x: is duckpipe-ducks "
		  "running there?",
		  id, ntohs(addr->sin_port), layer);
}

static void announce_layer(void)
{
	struct dp_wire_layer w = {
		.kind = DP_MLP_KIND_SWIGLU,
		.dtype = DP_DTYPE_F32,
		.hidden = (uint32_t)(opt_bytes / opt_rows / 4),
		.ffn = 8,
	};
	for (uint32_t d = 0; d < opt_ducks; d++)
		floor_announce(g_fd, &g_duck[d], opt_first_id + d, FLOOR_LAYER, opt_session, &w);
}

int floor_socket(void)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		floor_die("socket() failed: %s", strerror(errno));
	int sz = FLOOR_SOCK_BUF;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0)
		floor_die("bind(127.0.0.1:0) failed: %s", strerror(errno));
	return fd;
}

static void setup(void)
{
	g_payload = dp_wire_payload_max(FLOOR_MTU);
	g_chunks = dp_wire_chunk_count(opt_bytes, g_payload);
	if (g_chunks > FLOOR_MAX_CHUNKS)
		floor_die("%" PRIu64 " bytes need %u chunks, more than %u", opt_bytes, g_chunks,
		    FLOOR_MAX_CHUNKS);
	g_fd = floor_socket();
	for (uint32_t d = 0; d < opt_ducks; d++)
		g_duck[d] = (struct sockaddr_in){ .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)(opt_base_port + d)),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	size_t n = (size_t)opt_ducks * g_chunks;
	if (!(g_act = aligned_alloc(4096, (opt_bytes + 4095) & ~(size_t)4095)) ||
	    !(g_hdr = calloc(n, sizeof(*g_hdr))) || !(g_iov = calloc(2 * n, sizeof(*g_iov))) ||
	    !(g_tx = calloc(n, sizeof(*g_tx))))
		floor_die("out of memory for %zu datagrams", n);
	for (uint64_t i = 0; i < opt_bytes / 4; i++) /* touches every page too */
		((float *)(void *)g_act)[i] = (float)(i % 97) * 0.01f;
	for (uint32_t d = 0; d < opt_ducks; d++) {
		for (uint32_t c = 0; c < g_chunks; c++) {
			size_t k = (size_t)d * g_chunks + c;
			struct dp_wire_header *h = &g_hdr[k];
			dp_wire_init(h, DP_WIRE_OP_FORWARD, opt_session, 1);
			h->dtype = DP_DTYPE_F32;
			h->layer = FLOOR_LAYER;
			h->duck = (uint16_t)(opt_first_id + d);
			h->chunk = c;
			h->chunks = g_chunks;
			h->offset = (uint64_t)c * g_payload;
			h->total = opt_bytes;
			h->length = dp_wire_chunk_len(opt_bytes, g_payload, c);
			h->rows = opt_rows;
			g_iov[2 * k] = (struct iovec){ .iov_base = h, .iov_len = DP_WIRE_HDR_LEN };
			g_iov[2 * k + 1] = (struct iovec){ .iov_base = g_act + h->offset,
							   .iov_len = h->length };
			g_tx[k].msg_hdr = (struct msghdr){ .msg_name = &g_duck[d],
							   .msg_namelen = sizeof(g_duck[d]),
							   .msg_iov = &g_iov[2 * k],
							   .msg_iovlen = 2 };
		}
	}
	for (uint32_t i = 0; i < FLOOR_BURST; i++) {
		rx_iov[i] = (struct iovec){ .iov_base = rx_buf[i], .iov_len = FLOOR_RX_BUF };
		rx_msg[i].msg_hdr = (struct msghdr){ .msg_iov = &rx_iov[i], .msg_iovlen = 1 };
	}
}

/* ------------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " --base-port P [options]\n"
		"  --ducks N           ducks on 127.0.0.1:P..P+N-1 (1..32, default 1)\n"
		"  --first-id K        id of the first duck (default 0)\n"
		"  --bytes B           activation bytes, float32 (default 4096)\n"
		"  --rows R            rows in the activation (default 1)\n"
		"  --iters N           timed forwards (default 100)\n"
		"  --warmup N          untimed forwards first (default 10)\n"
		"  --timeout-ms MS     a forward not complete by then is lost (default 500)\n"
		"  --session S         session cookie (default 0x666c6f6f72)\n"
		"  -g, --gso           one UDP GSO send per duck instead of sendmmsg\n"
		"  --moe ...           the routed (mixture-of-experts) floor: " PROG " --moe --help\n");
}

uint64_t floor_parse_u64(const char *name, const char *val, uint64_t lo, uint64_t hi)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(val, &end, 0);
	if (errno || *end || v < lo || v > hi) {
		fprintf(stderr, PROG ": --%s %s: expected %" PRIu64 "..%" PRIu64 "\n", name, val,
			lo, hi);
		exit(2);
	}
	return v;
}

static void parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "ducks", required_argument, NULL, 'n' },
		{ "base-port", required_argument, NULL, 'p' },
		{ "first-id", required_argument, NULL, 'f' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "rows", required_argument, NULL, 'r' },
		{ "iters", required_argument, NULL, 'i' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "timeout-ms", required_argument, NULL, 't' },
		{ "session", required_argument, NULL, 's' },
		{ "gso", no_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "n:p:f:b:r:i:w:t:s:gh", opts, NULL)) != -1) {
		switch (c) {
		case 'n': opt_ducks = (uint32_t)floor_parse_u64("ducks", optarg, 1, FLOOR_MAX_DUCKS); break;
		case 'p': opt_base_port = (uint32_t)floor_parse_u64("base-port", optarg, 1, 65535); break;
		case 'f': opt_first_id = (uint32_t)floor_parse_u64("first-id", optarg, 0, 65000); break;
		case 'b': opt_bytes = floor_parse_u64("bytes", optarg, 4, 8u << 20); break;
		case 'r': opt_rows = (uint32_t)floor_parse_u64("rows", optarg, 1, 1u << 20); break;
		case 'i': opt_iters = floor_parse_u64("iters", optarg, 1, 10000000); break;
		case 'w': opt_warmup = floor_parse_u64("warmup", optarg, 0, 10000000); break;
		case 't': opt_timeout_ms = floor_parse_u64("timeout-ms", optarg, 1, 60000); break;
		case 's': opt_session = floor_parse_u64("session", optarg, 1, UINT64_MAX); break;
		case 'g': opt_gso = 1; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (!opt_base_port || opt_base_port + opt_ducks > 65536) {
		usage(stderr);
		exit(2);
	}
	if (opt_bytes % (4ull * opt_rows))
		floor_die("--bytes %" PRIu64 " is not rows (%u) x hidden x 4", opt_bytes, opt_rows);
}

/* ---------------------------------------------------------------------- main */

uint64_t floor_cpu_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--moe"))
			return floor_moe_main(argc, argv);
	parse_args(argc, argv);
	setup();
	announce_layer();
	uint64_t cpu0 = 0;
	for (uint64_t k = 0; k < opt_warmup + opt_iters; k++) {
		if (k == opt_warmup)
			cpu0 = floor_cpu_ns();
		uint64_t fwd = k + 1;
		struct fwd_result res;
		set_forward_id(fwd);
		uint64_t t0 = floor_now_ns();
		if (opt_gso)
			send_gso();
		else
			send_mmsg();
		uint64_t t1 = floor_now_ns();
		receive(fwd, t1 + opt_timeout_ms * 1000000ull, &res);
		uint64_t t2 = floor_now_ns();
		if (k >= opt_warmup)
			printf("fwd %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %u\n",
			       t2 - t0, t1 - t0, res.first_rx ? res.last_rx - res.first_rx : 0,
			       res.max_compute, res.sum_compute, res.lost);
	}
	printf("cpu %" PRIu64 " %" PRIu64 "\n", floor_cpu_ns() - cpu0, opt_iters);
	return 0;
}
