/* dp_duck.c: duckpipe-ducks, the duck emulator.
 *
 * Emulates up to 32 ducks in one process: duck i has id
 * first_id + i and its own UDP socket on base_port + i, holds up to 64 layers of
 * float32 shard weights, and speaks the wire protocol of dp_abi.h / dp_wire.h
 * (documented in duckpipe/schema/wire.py):
 *
 *   host -> duck   LAYER    announce a shard's shape     -> WEIGHT_ACK (tensor 0xFFFF)
 *                  WEIGHT   bytes of one tensor           -> WEIGHT_ACK, or NACK|NO_LAYER
 *                  FORWARD  one chunk of an activation    -> PARTIAL chunks once complete,
 *                                                            or NACK|NO_LAYER
 *                  FORWARD|ROUTED  a chunk of a wire      -> PARTIAL|ROUTED of the rows it
 *                           routing table + activation       was routed (MOE layers), or
 *                                                            nothing when it has no part
 *                  NACK     chunks of a partial, again    -> PARTIAL chunks, or NACK|INPUT
 *                  PING                                   -> PONG
 *
 * A duck adopts the session and epoch of each host datagram and echoes them;
 * replies go to the datagram's source address. Every datagram is checked with
 * dp_wire_check() and anything wrong is counted and dropped, never trusted.
 * Requests other than PING name their addressee in `duck` (or DP_WIRE_ANY_DUCK);
 * one addressed to another duck is ignored.
 *
 * Threads (--threads N, default every CPU the process may use, at most one per duck): the
 * ducks are dealt out to N groups (duck i to worker i % N), each owned by one worker
 * thread (struct worker; worker 0 is the main thread) with its own epoll, buffers, delay
 * queue and counters. A
 * duck is touched by its worker alone, so its ducks compute while another worker's do,
 * and nothing on the hot path is shared or locked; the counters are summed at exit.
 * --drop draws from each duck's own generator: a seed drops the same datagrams whatever
 * the thread count. The kernels (dp_mlp.c) are AVX2 + FMA + F16C where the CPU has them,
 * else portable; --isa chooses.
 *
 * A worker's loop: epoll over its ducks' sockets (worker 0's also over the signalfd, every
 * worker's over an eventfd written once at the end); recvmmsg bursts of 32;
 * small replies (acks, nacks, pongs) leave in sendmmsg batches, partials in UDP
 * GSO sends of up to 64 datagrams (sendmmsg where GSO is refused). --delay-us
 * parks replies in a FIFO timer queue serviced by the loop; the epoll timeout is
 * finite only while it holds something. Nothing is allocated per packet: input,
 * output and scratch buffers are reserved at start (MAP_NORESERVE, so only what
 * is touched costs memory), tensors when a layer is created.
 *
 * A MOE layer's shard is the duck's bank (dp_mlp.h): its routed experts' columns, then
 * its shared-expert columns. A routed forward's message is a wire routing table
 * (dp_routing.h, checked with dp_routing_wire_check) and then the activation; the duck
 * computes its section's entries one expert at a time on the rows routed to it
 * (moe_forward()) and replies one row per row of its section (every row with SHARED on
 * a duck of the shared set: its bank holds shared-expert columns).
 *
 * Banks of one layer: a move of a live MOE layer to a new placement (MoveLayer) announces
 * a duck's new bank beside the old one, a generation on (dp_wire_layer.bank), and a
 * FORWARD says the generation it was planned for (its header's tensor): it is answered
 * from the newest bank of its layer whose generation is not newer (bank_for), so a
 * forward planned on the old placement finds the old bank while the new one fills, and a
 * duck the move left alone answers both generations from its one bank. A duck keeps at
 * most two banks of a layer: a new generation frees all but the newest other (the one
 * serving), a generation 0 (a load) every other.
 *
 * Fault knobs: --drop, --delay-us, --stop-after, --restart-after (see usage()).
 * SIGINT/SIGTERM: print the counters to stderr as one line of key=value and exit 0.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include "dp_abi.h"
#include "dp_fp8.h"
#include "dp_gro.h"
#include "dp_mlp.h"
#include "dp_reasm.h"
#include "dp_reduce.h"
#include "dp_routing.h"
#include "dp_udp.h"
#include "dp_wire.h"

/* ------------------------------------------------------------------ tunables */

#define PROG "duckpipe-ducks"

#define DUCK_MAX_DUCKS DP_EMULATOR_MAX_DUCKS /* the schema's, as duckpipe/launch/ducks.py */
#define DUCK_MAX_LAYERS 64u            /* layers held per duck */
#define DUCK_INPUTS 8u                 /* activations being reassembled per duck */
#define DUCK_OUTPUTS 16u               /* recent partials kept per duck for NACKs */
#define DUCK_MAX_FLOATS (256ull << 20) /* weight floats per duck, all layers (1 GiB) */
#define DUCK_MAX_MSG (64ull << 20)     /* bytes of one message: max_forward_bytes default */
#define DUCK_BURST 32u                 /* datagrams per recvmmsg / sendmmsg */
#define DUCK_RX_BURSTS 4u              /* bursts per duck per wake-up, for fairness */
#define DUCK_SOCK_BUF (4 << 20)        /* SO_RCVBUF / SO_SNDBUF, bytes */
#define DUCK_GSO_SEGS 64u              /* datagrams per GSO send (UDP_MAX_SEGMENTS >= 64) */
#define DUCK_NACK_LIST 1024u           /* chunk indices in one NACK|INPUT reply */
#define DUCK_DELAY_SLOTS 4096u         /* delayed replies in flight, a power of two */
#define DUCK_MAX_DELAY_US 10000000ull
#define DUCK_RX_BUF 65536u             /* > DP_WIRE_MAX_DATAGRAM */
#define DUCK_SMALL_MAX (DP_WIRE_HDR_LEN + 4 * DUCK_NACK_LIST)
#define DUCK_EVENTS 64
#define DUCK_SIGNAL_TOKEN UINT32_MAX   /* epoll data of the signalfd */
#define DUCK_QUIT_TOKEN (UINT32_MAX - 1) /* ... of the quit eventfd */
#define DUCK_MAX_THREADS 1024u
#define DUCK_TENSOR_ALIGN 16u          /* floats: each tensor starts on a cache line */
#define DUCK_MOE_ENTRIES (DP_MAX_TOKENS * DP_MAX_TOPK) /* wire entries of one table, at most */
#define DUCK_MAX_SLOTS 65536u          /* routed experts in a bank: dp_wire_layer.experts is u16 */

/* ------------------------------------------------------------ per-duck state */

struct duck_layer {
	uint32_t id;
	uint16_t bank;             /* its generation (dp_wire_layer.bank) */
	uint8_t used;
	uint8_t dtype;             /* of activations and partials */
	struct dp_mlp_shard shard; /* kind, hidden, ffn, MOE experts and expert_ffn, t[0..2] */
	float *block;              /* the one allocation holding t[0..2] */
	uint64_t floats;
	/* FP8 weights (weight_dtype DP_DTYPE_F8E4M3): the bank as the host sent it, each
	 * tensor's e4m3 bytes and float32 block scales (dp_fp8.h; fp8_len[t] bytes on the
	 * wire): fp8_n[t] e4m3 bytes at fp8 + fp8_off[t], its scales from the next multiple
	 * of DUCK_FP8_ALIGN (fp8_scales). t[0..2] hold them dequantized (dp_mlp_fp8_dequant),
	 * made again before a forward whenever a chunk came in since (fp8_stale): chunks land
	 * in any order, a resent one included, and scales need not precede their weights. */
	uint8_t weight_dtype;
	uint8_t fp8_stale;
	uint64_t fp8_last_ns; /* when its last FP8 chunk came (main_loop's quiet time) */
	uint64_t fp8_got, fp8_total; /* bytes of chunks taken (resends too), and all of them */
	uint8_t *fp8;
	uint64_t fp8_off[DP_SHARD_TENSORS], fp8_n[DP_SHARD_TENSORS], fp8_len[DP_SHARD_TENSORS];
};

#define DUCK_FP8_ALIGN 64u /* where a tensor's scales start after its e4m3 bytes */
/* An FP8 layer is dequantized when none of its chunks came for this long (main_loop) */
#define DUCK_FP8_QUIET_NS 250000000ull

struct duck_input { /* an activation being reassembled */
	uint64_t seq;       /* 0: free; else age, for eviction */
	uint64_t session, forward_id;
	uint64_t total, bytes;
	uint32_t layer, rows;
	uint16_t bank; /* the generation it was planned for (the FORWARD's tensor) */
	uint8_t dtype;
	uint8_t flags; /* the datagrams' DP_WIRE_FLAG_ROUTED: a routing table leads the message */
	struct dp_reasm reasm;
	uint8_t *buf; /* g_msg_cap bytes */
};

struct duck_output { /* a partial already sent, kept for NACKs */
	uint64_t seq;
	uint64_t session, forward_id;
	uint64_t total, compute_ns;
	uint32_t layer, rows, chunks;
	uint8_t dtype;
	uint8_t flags; /* DP_WIRE_FLAG_ROUTED for the partial of a routed forward */
	uint8_t *buf;
};

struct duck {
	int fd;
	uint16_t id;
	uint32_t index;
	struct sockaddr_in addr;
	uint64_t session, epoch; /* adopted from the last host datagram */
	uint64_t computed;       /* forwards computed, for --stop-after / --restart-after */
	uint64_t seq;            /* last input/output sequence number handed out */
	uint64_t floats;         /* weight floats held */
	uint32_t rxq_ovfl;       /* kernel's drop count at the last look */
	uint64_t rng;            /* --drop's xorshift state: the duck's own, whatever its thread */
	uint8_t *arena;
	size_t arena_len;
	struct duck_layer layers[DUCK_MAX_LAYERS];
	struct duck_input in[DUCK_INPUTS];
	struct duck_output out[DUCK_OUTPUTS];
} __attribute__((aligned(64)));

/* ------------------------------------------------------------------ counters */

#define DUCK_COUNTERS(X)                                                                 \
	X(rx) X(rx_bytes) X(tx) X(tx_bytes) X(dropped_malformed) X(malformed_short)        \
	X(malformed_magic) X(malformed_version) X(malformed_op) X(malformed_length)        \
	X(malformed_truncated) X(dropped_invalid) X(dropped_injected) X(rx_kernel_drops)   \
	X(wrong_duck) X(unexpected_op) X(duplicates) X(forwards_computed) X(partials_sent) \
	X(nacks_received) X(nacks_answered) X(nack_bad_chunks) X(input_nacks_sent)         \
	X(no_layer_replies) X(weight_bytes) X(weight_acks) X(layers) X(layers_rejected)    \
	X(inputs_evicted) X(outputs_evicted) X(stopped_ignored) X(restarts) X(pongs)       \
	X(gso_sends) X(gso_fallbacks) X(gro_receives) X(delayed) X(delay_overflow) X(delay_stale)          \
	X(tx_errors) X(rx_errors) X(moe_forwards) X(moe_expert_rows) X(moe_skipped)         \
	X(moe_bad_tables) X(moe_bad_banks) X(moe_routed_dense) X(moe_unrouted)            \
	X(fp8_dequants_at_load) X(fp8_dequants_later)

struct duck_stats {
#define X(name) uint64_t name;
	DUCK_COUNTERS(X)
#undef X
};

/* ------------------------------------------------------------ options, state */

static uint32_t opt_ducks = 8;
static uint32_t opt_threads; /* 0: every CPU this process may use (sched_getaffinity) */
static int opt_isa = DP_MLP_ISA_AUTO;
static const char *opt_bind = "127.0.0.1";
static uint32_t opt_base_port = 47100;
static uint32_t opt_first_id;
static uint32_t opt_mtu = 1500;
static int opt_echo;
static double opt_drop;
static uint64_t opt_delay_ns;
static uint64_t opt_stop_after = UINT64_MAX; /* never */
static uint64_t opt_restart_after;           /* 0: never */
static uint64_t opt_seed = 1;
static int opt_no_gso;
static int opt_no_gro;
static int opt_verbose;
static uint32_t opt_bench[4]; /* --bench HIDDEN,COLS,ROWS[,MS]: hidden 0 = no bench */

static struct in_addr g_ips[DUCK_MAX_DUCKS];
static struct duck *g_ducks;
static int g_sigfd = -1; /* polled by worker 0, the main thread */
static int g_quitfd = -1; /* an eventfd in every worker's epoll: written once, at the end */
static int force_quit;    /* __atomic: set by whichever worker ends the run */

static uint32_t g_payload;   /* payload bytes per datagram at the MTU */
static uint32_t g_seg;       /* header + payload: the GSO segment size */
static uint32_t g_gso_segs;  /* datagrams per GSO send */
static uint32_t g_nack_max;  /* chunk indices per NACK|INPUT reply */
static size_t g_msg_cap;     /* bytes of one activation or partial */
static int g_gso;            /* 1 while GSO is to be tried (__atomic: any worker clears it) */
static int g_gro;            /* ask for UDP GRO on the sockets opened from here */
static int g_gso_proven;     /* a GSO send has worked: later errors are not "unsupported" */
static size_t g_xy_len;      /* bytes of each worker's x32 and y32 */

/* Replies waiting for --delay-us: a FIFO, since every reply waits equally long. */
enum { DELAY_SMALL = 1, DELAY_PARTIAL = 2 };
struct delayed {
	uint64_t due_ns;
	uint64_t out_seq; /* PARTIAL: sent only if this output is still cached */
	uint64_t session, epoch;
	struct sockaddr_in dst;
	uint32_t duck, out_idx;
	uint32_t n; /* SMALL: datagram bytes; PARTIAL: chunk indices in data, 0 = all */
	uint8_t kind;
	uint8_t data[DUCK_SMALL_MAX] __attribute__((aligned(8)));
};

/* ------------------------------------------------------------------- workers
 *
 * The ducks are dealt out to --threads groups, one worker thread each (worker 0
 * is the main thread). A duck belongs to one worker for the whole run: its socket is in
 * that worker's epoll alone, its layers, inputs and outputs are touched by that thread
 * alone, so nothing on the hot path is shared and nothing is locked. Everything a
 * thread writes while it works is here, one mapping per worker (no false sharing): the
 * receive burst, the transmit batches, the delay queue, the compute buffers and its
 * counters, summed by the main thread after the others have been joined. `wk` is the
 * running thread's own (as DPDK's per-lcore variables are thread-locals). */
struct worker {
	uint32_t index;
	/* its ducks: g_ducks[index], g_ducks[index + g_n_workers], ... (WORKER_DUCKS) */
	int epfd;
	pthread_t tid;
	int started;
	struct duck_stats stats;

	/* Receive burst. */
	uint8_t rx_buf[DUCK_BURST][DUCK_RX_BUF] __attribute__((aligned(64)));
	struct mmsghdr rx_msg[DUCK_BURST];
	struct iovec rx_iov[DUCK_BURST];
	struct sockaddr_in rx_src[DUCK_BURST];
	union {
		char buf[CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(int))]; /* RXQ_OVFL, UDP_GRO */
		struct cmsghdr align;
	} rx_ctl[DUCK_BURST];
	/* a GRO datagram at an offset its header may not be read at (a segment size not a
	 * multiple of 8) is copied here first */
	uint8_t rx_aligned[DUCK_RX_BUF] __attribute__((aligned(64)));

	/* Small replies of one duck, flushed with sendmmsg. */
	struct {
		struct duck *d;
		uint32_t n;
		struct mmsghdr msg[DUCK_BURST];
		struct iovec iov[DUCK_BURST];
		struct sockaddr_in dst[DUCK_BURST];
		uint8_t buf[DUCK_BURST][DUCK_SMALL_MAX] __attribute__((aligned(8)));
	} tx;

	/* One GSO send (or sendmmsg batch) of partial chunks: headers here, payloads in place. */
	struct dp_wire_header part_hdr[DUCK_GSO_SEGS];
	struct iovec part_iov[2 * DUCK_GSO_SEGS];
	struct mmsghdr part_msg[DUCK_GSO_SEGS];

	uint8_t small[DUCK_SMALL_MAX] __attribute__((aligned(8)));
	uint32_t list[DP_WIRE_MAX_DATAGRAM / 4 + 1]; /* chunk indices of a NACK */
	struct dp_reasm seen;                         /* ... each resent once */

	/* One WEIGHT payload in float32 on its way into a MOE bank: at most DUCK_RX_BUF / 2
	 * elements (a 2-byte dtype's count). */
	float weight32[DUCK_RX_BUF / 2];

	/* A routed forward's entries grouped by expert slot (moe_forward), and where each
	 * slot's group starts: one pass of the kernel per expert. */
	uint32_t moe_xrow[DUCK_MOE_ENTRIES], moe_yrow[DUCK_MOE_ENTRIES];
	float moe_weight[DUCK_MOE_ENTRIES];
	uint32_t moe_start[DUCK_MAX_SLOTS + 1];

	/* Float32 views of float16 and bfloat16 activations and partials (g_xy_len bytes
	 * each), and the kernels' scratch. */
	float *x32, *y32;
	float *scratch;
	size_t scratch_floats;

	struct delayed *delayq; /* DUCK_DELAY_SLOTS */
	uint32_t delayq_head, delayq_tail; /* free-running, masked on access */
	int no_pwait2; /* epoll_pwait2 said ENOSYS */
};

static struct worker **g_workers;
static uint32_t g_n_workers;
static __thread struct worker *wk;

/* Duck i belongs to worker i % g_n_workers: dealt out rather than cut in runs, because a
 * MoE layer's experts sit on ducks in order (duckpipe.demo.moe_shape's placement) and a
 * token's experts cluster in a few of DeepSeek-V3's groups, so neighbouring ducks tend to
 * be busy together. */
#define WORKER_DUCKS(i, w) for (uint32_t i = (w)->index; i < opt_ducks; i += g_n_workers)

/* --------------------------------------------------------------------- utils */

/* --verbose: why a datagram was dropped. Off by default: a hostile sender must not be
 * able to fill the log, and the counters say how many. */
#define DUCK_DEBUG(...)                                   \
	do {                                              \
		if (opt_verbose) {                        \
			fprintf(stderr, PROG ": " __VA_ARGS__); \
			fputc('\n', stderr);              \
		}                                         \
	} while (0)

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t xorshift64(uint64_t *state)
{
	uint64_t x = *state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *state = x;
}

/* --drop: lose this datagram of duck d? Each duck draws from its own sequence, so which
 * datagrams a seed drops does not depend on how the ducks are spread over threads. */
static int inject_drop(struct duck *d)
{
	if (opt_drop <= 0.0)
		return 0;
	if ((double)(xorshift64(&d->rng) >> 11) * 0x1.0p-53 >= opt_drop)
		return 0;
	wk->stats.dropped_injected++;
	return 1;
}

static void *reserve(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static const char *ip_str(const struct sockaddr_in *a, char *buf, size_t len)
{
	return inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)len) ? buf : "?";
}

/* ------------------------------------------------------------------ transmit */

static void tx_flush(void)
{
	uint32_t done = 0;
	while (done < wk->tx.n) {
		int r = sendmmsg(wk->tx.d->fd, wk->tx.msg + done, wk->tx.n - done, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			wk->stats.tx_errors++;
			done++; /* skip the datagram the kernel refused */
			continue;
		}
		for (int i = 0; i < r; i++) {
			wk->stats.tx++;
			wk->stats.tx_bytes += wk->tx.msg[done + i].msg_len;
		}
		done += (uint32_t)r;
	}
	wk->tx.n = 0;
}

/* Queue one small datagram of duck d for the next sendmmsg. */
static void tx_small_now(struct duck *d, const struct sockaddr_in *dst, const void *dgram,
			 uint32_t len)
{
	if (inject_drop(d))
		return;
	if (wk->tx.n && wk->tx.d != d)
		tx_flush();
	wk->tx.d = d;
	uint32_t i = wk->tx.n++;
	memcpy(wk->tx.buf[i], dgram, len);
	wk->tx.dst[i] = *dst;
	wk->tx.iov[i] = (struct iovec){ .iov_base = wk->tx.buf[i], .iov_len = len };
	memset(&wk->tx.msg[i], 0, sizeof(wk->tx.msg[i]));
	wk->tx.msg[i].msg_hdr.msg_name = &wk->tx.dst[i];
	wk->tx.msg[i].msg_hdr.msg_namelen = sizeof(wk->tx.dst[i]);
	wk->tx.msg[i].msg_hdr.msg_iov = &wk->tx.iov[i];
	wk->tx.msg[i].msg_hdr.msg_iovlen = 1;
	if (wk->tx.n == DUCK_BURST)
		tx_flush();
}

/* The nb chunks in the worker's part_hdr/part_iov, one datagram each. */
static void partial_mmsg(struct duck *d, struct sockaddr_in *dst, uint32_t nb)
{
	for (uint32_t i = 0; i < nb; i++) {
		memset(&wk->part_msg[i], 0, sizeof(wk->part_msg[i]));
		wk->part_msg[i].msg_hdr.msg_name = dst;
		wk->part_msg[i].msg_hdr.msg_namelen = sizeof(*dst);
		wk->part_msg[i].msg_hdr.msg_iov = &wk->part_iov[2 * i];
		wk->part_msg[i].msg_hdr.msg_iovlen = 2;
	}
	uint32_t done = 0;
	while (done < nb) {
		int r = sendmmsg(d->fd, wk->part_msg + done, nb - done, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			wk->stats.tx_errors++;
			done++;
			continue;
		}
		for (int i = 0; i < r; i++)
			wk->stats.tx_bytes += wk->part_msg[done + i].msg_len;
		wk->stats.tx += (uint64_t)r;
		wk->stats.partials_sent += (uint64_t)r;
		done += (uint32_t)r;
	}
}

/* The nb chunks as one GSO send: the kernel cuts it every g_seg bytes, and only the
 * last chunk may be short. 0 if sent, -1 to fall back to sendmmsg. */
static int partial_gso(struct duck *d, struct sockaddr_in *dst, uint32_t nb)
{
	union {
		char buf[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof(ctl));
	struct msghdr m = {
		.msg_name = dst,
		.msg_namelen = sizeof(*dst),
		.msg_iov = wk->part_iov,
		.msg_iovlen = 2 * nb,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof(ctl.buf),
	};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_UDP;
	cm->cmsg_type = UDP_SEGMENT;
	cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
	uint16_t seg = (uint16_t)g_seg;
	memcpy(CMSG_DATA(cm), &seg, sizeof(seg));
	ssize_t r;
	do
		r = sendmsg(d->fd, &m, 0);
	while (r < 0 && errno == EINTR);
	if (r >= 0) {
		__atomic_store_n(&g_gso_proven, 1, __ATOMIC_RELAXED);
		wk->stats.gso_sends++;
		wk->stats.tx += nb;
		wk->stats.partials_sent += nb;
		wk->stats.tx_bytes += (uint64_t)r;
		return 0;
	}
	int e = errno;
	wk->stats.gso_fallbacks++;
	if (!__atomic_load_n(&g_gso_proven, __ATOMIC_RELAXED) &&
	    (e == EIO || e == EINVAL || e == EOPNOTSUPP || e == ENOPROTOOPT) &&
	    __atomic_exchange_n(&g_gso, 0, __ATOMIC_RELAXED)) { /* said once, by one worker */
		fprintf(stderr, PROG ": UDP GSO refused (%s); sending partials with sendmmsg\n",
			strerror(e));
	}
	return -1;
}

static void partial_flush(struct duck *d, const struct sockaddr_in *to, uint32_t nb)
{
	struct sockaddr_in dst = *to;
	if (nb > 1 && __atomic_load_n(&g_gso, __ATOMIC_RELAXED) && partial_gso(d, &dst, nb) == 0)
		return;
	partial_mmsg(d, &dst, nb);
}

/* Send chunks list[0..n) of output o (all of them if list is NULL). */
static void partial_send_now(struct duck *d, const struct sockaddr_in *dst,
			     const struct duck_output *o, const uint32_t *list, uint32_t n,
			     uint64_t session, uint64_t epoch)
{
	uint32_t count = list ? n : o->chunks, nb = 0;
	for (uint32_t k = 0; k < count; k++) {
		uint32_t c = list ? list[k] : k;
		if (c >= o->chunks)
			continue; /* handle_nack() already refused these */
		if (inject_drop(d))
			continue;
		uint32_t len = dp_wire_chunk_len(o->total, g_payload, c);
		struct dp_wire_header *h = &wk->part_hdr[nb];
		dp_wire_init(h, DP_WIRE_OP_PARTIAL, session, epoch);
		h->dtype = o->dtype;
		h->forward_id = o->forward_id;
		h->layer = o->layer;
		h->duck = d->id;
		h->chunk = c;
		h->chunks = o->chunks;
		h->offset = (uint64_t)c * g_payload;
		h->total = o->total;
		h->length = len;
		h->rows = o->rows;
		h->flags = o->flags;
		h->compute_ns = o->compute_ns;
		wk->part_iov[2 * nb] = (struct iovec){ .iov_base = h, .iov_len = DP_WIRE_HDR_LEN };
		wk->part_iov[2 * nb + 1] = (struct iovec){ .iov_base = o->buf + h->offset, .iov_len = len };
		nb++;
		/* a short chunk must end its GSO send */
		if (nb == g_gso_segs || len < g_payload) {
			partial_flush(d, dst, nb);
			nb = 0;
		}
	}
	if (nb)
		partial_flush(d, dst, nb);
}

/* --------------------------------------------------------------- delay queue */

static struct delayed *delay_push(const struct duck *d, const struct sockaddr_in *dst,
				  uint8_t kind)
{
	if (wk->delayq_tail - wk->delayq_head == DUCK_DELAY_SLOTS) {
		wk->stats.delay_overflow++;
		return NULL;
	}
	struct delayed *e = &wk->delayq[wk->delayq_tail++ & (DUCK_DELAY_SLOTS - 1)];
	e->due_ns = now_ns() + opt_delay_ns;
	e->kind = kind;
	e->duck = d->index;
	e->dst = *dst;
	e->session = d->session;
	e->epoch = d->epoch;
	e->n = 0;
	wk->stats.delayed++;
	return e;
}

/* Send every delayed reply whose time has come. */
static void delay_run(void)
{
	uint64_t now = now_ns();
	while (wk->delayq_head != wk->delayq_tail) {
		struct delayed *e = &wk->delayq[wk->delayq_head & (DUCK_DELAY_SLOTS - 1)];
		if (e->due_ns > now)
			break;
		struct duck *d = &g_ducks[e->duck];
		if (e->kind == DELAY_SMALL) {
			tx_small_now(d, &e->dst, e->data, e->n);
		} else {
			const struct duck_output *o = &d->out[e->out_idx];
			if (o->seq != e->out_seq)
				wk->stats.delay_stale++; /* evicted meanwhile: the host will NACK */
			else
				partial_send_now(d, &e->dst, o,
						 e->n ? (const uint32_t *)(void *)e->data : NULL,
						 e->n, e->session, e->epoch);
		}
		wk->delayq_head++;
	}
	if (wk->tx.n)
		tx_flush();
}

/* ------------------------------------------------------------------- replies */

static void reply_init(const struct duck *d, struct dp_wire_header *r, uint8_t op,
		       const struct dp_wire_header *req)
{
	dp_wire_init(r, op, d->session, d->epoch);
	r->duck = d->id;
	r->dtype = req->dtype;
	r->forward_id = req->forward_id;
	r->layer = req->layer;
}

/* Header r (its length set to plen) and plen payload bytes, now or after --delay-us. */
static void reply_small(struct duck *d, const struct sockaddr_in *dst,
			const struct dp_wire_header *r, const void *payload, uint32_t plen)
{
	uint8_t *buf = wk->small;
	struct delayed *e = NULL;
	if (opt_delay_ns) {
		if (!(e = delay_push(d, dst, DELAY_SMALL)))
			return;
		buf = e->data;
		e->n = DP_WIRE_HDR_LEN + plen;
	}
	memcpy(buf, r, DP_WIRE_HDR_LEN);
	if (plen)
		memcpy(buf + DP_WIRE_HDR_LEN, payload, plen);
	if (!e)
		tx_small_now(d, dst, buf, DP_WIRE_HDR_LEN + plen);
}

/* Chunks list[0..n) of output o (all if list is NULL), now or after --delay-us. */
static void reply_partial(struct duck *d, const struct sockaddr_in *dst,
			  const struct duck_output *o, const uint32_t *list, uint32_t n)
{
	if (!opt_delay_ns) {
		partial_send_now(d, dst, o, list, n, d->session, d->epoch);
		return;
	}
	uint32_t k = 0;
	do {
		struct delayed *e = delay_push(d, dst, DELAY_PARTIAL);
		if (!e)
			return;
		e->out_idx = (uint32_t)(o - d->out);
		e->out_seq = o->seq;
		if (list) {
			e->n = n - k < DUCK_NACK_LIST ? n - k : DUCK_NACK_LIST;
			memcpy(e->data, list + k, 4 * (size_t)e->n);
			k += e->n;
		}
	} while (list && k < n);
}

static void reply_no_layer(struct duck *d, const struct sockaddr_in *dst,
			   const struct dp_wire_header *req)
{
	struct dp_wire_header r;
	reply_init(d, &r, DP_WIRE_OP_NACK, req);
	r.flags = DP_WIRE_FLAG_NO_LAYER;
	r.tensor = req->tensor;
	r.chunk = req->chunk;
	r.chunks = req->chunks;
	r.offset = req->offset;
	r.rows = req->rows;
	wk->stats.no_layer_replies++;
	reply_small(d, dst, &r, NULL, 0);
}

/* -------------------------------------------------------------------- layers */

/* Generations compare modulo 2^16: a is newer than b when a - b is in (0, 2^15). */
static int bank_newer(uint16_t a, uint16_t b)
{
	return (int16_t)(uint16_t)(a - b) > 0;
}

/* The bank of layer id a FORWARD planned for generation gen computes with: the newest
 * not newer than gen (NULL: none, NO_LAYER). */
static struct duck_layer *bank_for(struct duck *d, uint32_t id, uint16_t gen)
{
	struct duck_layer *best = NULL;
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS; i++) {
		struct duck_layer *l = &d->layers[i];
		if (l->used && l->id == id && !bank_newer(l->bank, gen) &&
		    (!best || bank_newer(l->bank, best->bank)))
			best = l;
	}
	return best;
}

/* The newest bank of layer id: the one the last LAYER announced, which WEIGHTs fill. */
static struct duck_layer *layer_find(struct duck *d, uint32_t id)
{
	struct duck_layer *best = NULL;
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS; i++) {
		struct duck_layer *l = &d->layers[i];
		if (l->used && l->id == id && (!best || bank_newer(l->bank, best->bank)))
			best = l;
	}
	return best;
}

/* The bank (id, gen) itself, or NULL. */
static struct duck_layer *bank_find(struct duck *d, uint32_t id, uint16_t gen)
{
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS; i++)
		if (d->layers[i].used && d->layers[i].id == id && d->layers[i].bank == gen)
			return &d->layers[i];
	return NULL;
}

static void layer_free(struct duck *d, struct duck_layer *l);

/* Before bank (id, gen) is (re)made, `l` if it exists: a load (gen 0) frees every other
 * bank of the layer; a move's new bank every bank but the newest (the one serving; any
 * older one's forwards have drained: the dataplane moves a layer again only once they
 * did). A move's bank announced again keeps the others. Returns the floats those banks
 * hold, and frees them only with free_them: a LAYER is checked and allocated first, so
 * one refused frees nothing. */
static uint64_t banks_make_room(struct duck *d, uint32_t id, uint16_t gen, struct duck_layer *l,
				bool free_them)
{
	if (gen && l)
		return 0;
	struct duck_layer *keep = gen ? layer_find(d, id) : l;
	uint64_t floats = 0;
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS; i++) {
		struct duck_layer *o = &d->layers[i];
		if (o->used && o->id == id && o != keep) {
			floats += o->floats;
			if (free_them)
				layer_free(d, o);
		}
	}
	return floats;
}

static void layer_free(struct duck *d, struct duck_layer *l)
{
	free(l->block);
	free(l->fp8);
	d->floats -= l->floats;
	memset(l, 0, sizeof(*l));
}

/* --restart-after: as if the duck had rebooted, its weights are gone. */
static void layers_forget(struct duck *d)
{
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS; i++)
		if (d->layers[i].used)
			layer_free(d, &d->layers[i]);
}

/* The kernels' scratch must fit the widest shard (MOE: its widest expert, or its shared
 * columns, by hidden); it grows only here. */
static int scratch_fit(const struct dp_wire_layer *w)
{
	size_t need = dp_mlp_scratch_floats(w->ffn);
	if (w->kind == DP_MLP_KIND_MOE) {
		uint32_t shared = w->ffn - (uint32_t)w->experts * w->expert_ffn; /* checked */
		uint32_t widest = w->experts && w->expert_ffn > shared ? w->expert_ffn : shared;
		need = dp_mlp_rows_scratch_floats(w->hidden, widest);
	}
	if (need <= wk->scratch_floats)
		return 0;
	float *p = aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63);
	if (!p)
		return -1;
	free(wk->scratch);
	wk->scratch = p;
	wk->scratch_floats = need;
	return 0;
}

/* A MOE bank: experts * expert_ffn routed columns, the rest of ffn shared ones; dense
 * kinds carry neither field. 1 if the announcement is coherent, else 0, counted and said. */
static int layer_bank_ok(const struct duck *d, uint32_t layer, const struct dp_wire_layer *w)
{
	uint64_t routed = (uint64_t)w->experts * w->expert_ffn;
	if (w->kind != DP_MLP_KIND_MOE) {
		if (!w->experts && !w->expert_ffn)
			return 1;
		fprintf(stderr,
			PROG ": duck %u refuses layer %u: a dense layer (kind %u) with %u experts of "
			     "%u columns\n",
			d->id, layer, w->kind, w->experts, w->expert_ffn);
	} else if (w->experts && !w->expert_ffn) {
		fprintf(stderr, PROG ": duck %u refuses layer %u: %u experts of 0 columns\n", d->id,
			layer, w->experts);
	} else if (routed > w->ffn) {
		fprintf(stderr,
			PROG ": duck %u refuses layer %u: %u experts of %u columns need %" PRIu64
			     " columns, the bank has %u\n",
			d->id, layer, w->experts, w->expert_ffn, routed, w->ffn);
	} else {
		return 1;
	}
	wk->stats.moe_bad_banks++;
	return 0;
}

/* An FP8 layer's raw bytes: each tensor's e4m3 bytes (len[t] of them), then its scales
 * from the next multiple of DUCK_FP8_ALIGN, the tensors one after the other at off[];
 * their total, UINT64_MAX when it cannot be. */
static uint64_t fp8_layout(const struct dp_wire_layer *w, const uint64_t *len, uint64_t *off)
{
	uint64_t total = 0, wire = dp_fp8_tensor_bytes(w->hidden, w->ffn, w->experts, w->expert_ffn);
	for (unsigned t = 0; t < DP_SHARD_TENSORS; t++) {
		off[t] = total;
		uint64_t at = (len[t] + DUCK_FP8_ALIGN - 1) & ~(uint64_t)(DUCK_FP8_ALIGN - 1);
		if (wire == UINT64_MAX || wire < len[t] ||
		    __builtin_add_overflow(total, at + (wire - len[t]) + DUCK_FP8_ALIGN, &total))
			return UINT64_MAX;
	}
	return total;
}

/* Where the tensor's scales begin in l->fp8. */
static inline uint8_t *fp8_scales(const struct duck_layer *l, unsigned t)
{
	uint64_t at = (l->fp8_n[t] + DUCK_FP8_ALIGN - 1) & ~(uint64_t)(DUCK_FP8_ALIGN - 1);
	return l->fp8 + l->fp8_off[t] + at;
}

static void handle_layer(struct duck *d, const struct sockaddr_in *src,
			 const struct dp_wire_header *h, const uint8_t *payload)
{
	struct dp_wire_layer w;
	memcpy(&w, payload, sizeof(w));
	struct duck_layer *l = bank_find(d, h->layer, w.bank);
	uint64_t len[DP_SHARD_TENSORS] = { 0 }, floats = 0, off[DP_SHARD_TENSORS] = { 0 };
	uint64_t raw = 0; /* FP8: bytes of the e4m3 bank and its scales */
	const int fp8 = w.weight_dtype == DP_DTYPE_F8E4M3;
	int ok = (w.kind == DP_MLP_KIND_GELU || w.kind == DP_MLP_KIND_SWIGLU ||
		  w.kind == DP_MLP_KIND_MOE) &&
		 (!w.weight_dtype || (fp8 && w.kind != DP_MLP_KIND_GELU)) &&
		 dp_dtype_is_act(w.dtype) && w.hidden && w.ffn && layer_bank_ok(d, h->layer, &w);
	for (unsigned t = 0; ok && t < DP_SHARD_TENSORS; t++) {
		len[t] = dp_mlp_tensor_len(w.kind, w.hidden, w.ffn, t);
		floats += (len[t] + DUCK_TENSOR_ALIGN - 1) & ~(uint64_t)(DUCK_TENSOR_ALIGN - 1);
	}
	if (ok && fp8) { /* its bytes count against the budget too, in floats */
		raw = fp8_layout(&w, len, off);
		ok = raw != UINT64_MAX;
		floats += ok ? (raw + 3) / 4 : 0;
	}
	if (ok && l && l->shard.kind == w.kind && l->dtype == w.dtype &&
	    l->weight_dtype == w.weight_dtype && l->shard.hidden == w.hidden &&
	    l->shard.ffn == w.ffn && l->shard.experts == w.experts &&
	    l->shard.expert_ffn == w.expert_ffn)
		goto ack; /* the same announcement again (our ack was lost): keep the weights */
	uint64_t going = ok ? banks_make_room(d, h->layer, w.bank, l, false) : 0;
	ok = ok && floats <= DUCK_MAX_FLOATS &&
	     d->floats - going - (l ? l->floats : 0) + floats <= DUCK_MAX_FLOATS;
	float *block = NULL;
	uint8_t *bytes = NULL;
	if (!ok || scratch_fit(&w) < 0 ||
	    !(block = calloc(floats - (raw + 3) / 4, sizeof(float))) ||
	    (fp8 && !(bytes = aligned_alloc(DUCK_FP8_ALIGN, (raw + DUCK_FP8_ALIGN - 1) &
								 ~(uint64_t)(DUCK_FP8_ALIGN - 1))))) {
		free(block);
		wk->stats.layers_rejected++;
		return; /* no ack: the host's loader reports it; every bank kept */
	}
	banks_make_room(d, h->layer, w.bank, l, true);
	for (uint32_t i = 0; i < DUCK_MAX_LAYERS && !l; i++)
		if (!d->layers[i].used)
			l = &d->layers[i];
	if (!l) { /* every slot holds another layer */
		free(block);
		free(bytes);
		wk->stats.layers_rejected++;
		return;
	}
	if (l->used)
		layer_free(d, l);
	l->used = 1;
	l->id = h->layer;
	l->bank = w.bank;
	l->dtype = w.dtype;
	l->weight_dtype = w.weight_dtype;
	l->fp8 = bytes;
	l->fp8_stale = 0;
	l->fp8_got = l->fp8_total = 0;
	for (unsigned t = 0; t < DP_SHARD_TENSORS; t++) {
		l->fp8_off[t] = off[t];
		l->fp8_n[t] = fp8 ? len[t] : 0;
		l->fp8_len[t] = fp8 ? dp_fp8_tensor_bytes(w.hidden, w.ffn, w.experts, w.expert_ffn) : 0;
		l->fp8_total += l->fp8_len[t];
	}
	if (fp8)
		memset(bytes, 0, raw);
	l->shard.kind = w.kind;
	l->shard.hidden = w.hidden;
	l->shard.ffn = w.ffn;
	l->shard.experts = w.experts;
	l->shard.expert_ffn = w.expert_ffn;
	l->block = block;
	l->floats = floats;
	for (unsigned t = 0; t < DP_SHARD_TENSORS; t++) {
		l->shard.t[t] = block;
		block += (len[t] + DUCK_TENSOR_ALIGN - 1) & ~(uint64_t)(DUCK_TENSOR_ALIGN - 1);
	}
	d->floats += floats;
	wk->stats.layers++;
ack:;
	struct dp_wire_header r;
	reply_init(d, &r, DP_WIRE_OP_WEIGHT_ACK, h);
	r.tensor = DP_WIRE_LAYER_TENSOR;
	r.chunk = h->chunk;
	r.chunks = h->chunks;
	r.offset = h->offset;
	wk->stats.weight_acks++;
	reply_small(d, src, &r, NULL, 0);
}

static void weight_ack(struct duck *d, const struct sockaddr_in *src,
		       const struct dp_wire_header *h)
{
	struct dp_wire_header r;
	reply_init(d, &r, DP_WIRE_OP_WEIGHT_ACK, h);
	r.tensor = h->tensor;
	r.chunk = h->chunk;
	r.chunks = h->chunks;
	r.offset = h->offset;
	r.total = h->total;
	wk->stats.weight_acks++;
	reply_small(d, src, &r, NULL, 0);
}

/* An FP8 layer's float32 weights out of its e4m3 bytes and scales, DeepSeek-V3's
 * weight_dequant (dp_mlp_fp8_dequant); a MOE bank a payload's worth at a time through
 * the worker's weight32 into its blocks (dp_mlp_bank_store), as its chunks of other dtypes go. */
static void fp8_dequant(struct duck_layer *l)
{
	const struct dp_mlp_shard *s = &l->shard;
	const uint64_t step = sizeof(wk->weight32) / sizeof(wk->weight32[0]);
	for (unsigned t = 0; t < DP_SHARD_TENSORS; t++) {
		uint64_t n = dp_mlp_tensor_len(s->kind, s->hidden, s->ffn, t);
		const uint8_t *w = l->fp8 + l->fp8_off[t];
		const float *scale = (const float *)(const void *)fp8_scales(l, t);
		if (s->kind != DP_MLP_KIND_MOE) {
			dp_mlp_fp8_dequant(s, t, w, scale, 0, n, s->t[t]);
			continue;
		}
		for (uint64_t first = 0; first < n; first += step) {
			uint64_t k = n - first < step ? n - first : step;
			dp_mlp_fp8_dequant(s, t, w, scale, first, k, wk->weight32);
			dp_mlp_bank_store(s, t, first, wk->weight32, k);
		}
	}
	l->fp8_stale = 0;
}

/* A chunk of an FP8 layer: bytes of a tensor's e4m3 weights or scales, kept as they are
 * (any byte offset: a datagram may cut a scale in two); dequantized before the next
 * forward (fp8_dequant). */
static void fp8_weight(struct duck *d, const struct sockaddr_in *src, struct duck_layer *l,
		       const struct dp_wire_header *h, const uint8_t *payload)
{
	uint64_t end;
	if (h->tensor >= DP_SHARD_TENSORS || h->total != l->fp8_len[h->tensor] ||
	    __builtin_add_overflow(h->offset, (uint64_t)h->length, &end) || end > h->total) {
		wk->stats.dropped_invalid++;
		return;
	}
	unsigned t = h->tensor;
	uint64_t n = l->fp8_n[t], at = h->offset, len = h->length;
	if (at < n) { /* its e4m3 part */
		uint64_t k = len < n - at ? len : n - at;
		memcpy(l->fp8 + l->fp8_off[t] + at, payload, k);
		at += k, payload += k, len -= k;
	}
	if (len) /* its scales' part */
		memcpy(fp8_scales(l, t) + (at - n), payload, len);
	l->fp8_stale = 1;
	l->fp8_last_ns = now_ns();
	uint64_t before = l->fp8_got;
	l->fp8_got += h->length;
	wk->stats.weight_bytes += h->length;
	/* the chunk that makes every byte in: dequantize before its ack, so the load
	 * completes with the weights ready for the first forward. Once only: a resend (or a
	 * count that a resend made reach the total early) leaves the layer stale for
	 * main_loop's quiet time, or the next forward, to dequantize again */
	if (before < l->fp8_total && l->fp8_got >= l->fp8_total) {
		fp8_dequant(l);
		wk->stats.fp8_dequants_at_load++;
	}
	weight_ack(d, src, h);
}

static void handle_weight(struct duck *d, const struct sockaddr_in *src,
			  const struct dp_wire_header *h, const uint8_t *payload)
{
	struct duck_layer *l = layer_find(d, h->layer);
	if (!l) {
		reply_no_layer(d, src, h);
		return;
	}
	if (l->weight_dtype) {
		fp8_weight(d, src, l, h, payload);
		return;
	}
	uint32_t isz = dp_dtype_size(h->dtype);
	uint64_t n = h->tensor < DP_SHARD_TENSORS
			     ? dp_mlp_tensor_len(l->shard.kind, l->shard.hidden, l->shard.ffn, h->tensor)
			     : 0;
	if (!dp_dtype_is_act(h->dtype) || !n || h->total != n * isz || h->offset % isz ||
	    h->length % isz) {
		wk->stats.dropped_invalid++;
		return;
	}
	/* a MOE bank keeps its blocks apart (dp_mlp.h): float32 first, then into place */
	const int bank = l->shard.kind == DP_MLP_KIND_MOE;
	float *dst = bank ? wk->weight32 : l->shard.t[h->tensor] + h->offset / isz;
	dp_mlp_to_f32(dst, payload, h->length / isz, h->dtype);
	if (bank)
		dp_mlp_bank_store(&l->shard, h->tensor, h->offset / isz, dst, h->length / isz);
	wk->stats.weight_bytes += h->length;
	weight_ack(d, src, h);
}

/* ---------------------------------------------------------- inputs, outputs */

static struct duck_input *input_find(struct duck *d, uint64_t session, uint64_t fwd)
{
	for (uint32_t i = 0; i < DUCK_INPUTS; i++)
		if (d->in[i].seq && d->in[i].forward_id == fwd && d->in[i].session == session)
			return &d->in[i];
	return NULL;
}

static struct duck_output *output_find(struct duck *d, uint64_t session, uint64_t fwd)
{
	for (uint32_t i = 0; i < DUCK_OUTPUTS; i++)
		if (d->out[i].seq && d->out[i].forward_id == fwd && d->out[i].session == session)
			return &d->out[i];
	return NULL;
}

static struct duck_input *input_alloc(struct duck *d)
{
	struct duck_input *v = &d->in[0];
	for (uint32_t i = 0; i < DUCK_INPUTS; i++) {
		if (!d->in[i].seq) {
			v = &d->in[i];
			break;
		}
		if (d->in[i].seq < v->seq)
			v = &d->in[i];
	}
	if (v->seq)
		wk->stats.inputs_evicted++;
	v->seq = ++d->seq;
	return v;
}

static struct duck_output *output_alloc(struct duck *d)
{
	struct duck_output *v = &d->out[0];
	for (uint32_t i = 0; i < DUCK_OUTPUTS; i++) {
		if (!d->out[i].seq) {
			v = &d->out[i];
			break;
		}
		if (d->out[i].seq < v->seq)
			v = &d->out[i];
	}
	if (v->seq)
		wk->stats.outputs_evicted++;
	v->seq = ++d->seq;
	return v;
}

/* -------------------------------------------------------------------- compute */

/* The partial in o (its buf, rows, total, dtype, flags and compute_ns set) for input
 * `in`: cache it for NACKs, send it, and count the forward. */
static void forward_reply(struct duck *d, const struct sockaddr_in *src, struct duck_input *in,
			  struct duck_output *o)
{
	o->session = in->session;
	o->forward_id = in->forward_id;
	o->layer = in->layer;
	o->chunks = dp_wire_chunk_count(o->total, g_payload);
	in->seq = 0;
	d->computed++;
	wk->stats.forwards_computed++;
	reply_partial(d, src, o, NULL, 0);
	if (opt_restart_after && d->computed == opt_restart_after) {
		layers_forget(d);
		wk->stats.restarts++;
	}
}

/* The worker's x32 rows [r0, r0 + n) = the 2-byte rows (float16 or bfloat16) of x16 there. */
static void widen_rows(const uint8_t *x16, uint32_t r0, uint32_t n, uint32_t hid, uint8_t dtype)
{
	size_t first = (size_t)r0 * hid;
	dp_mlp_to_f32(wk->x32 + first, x16 + 2 * first, (size_t)n * hid, dtype);
}

/* --compute echo on a routed forward: every expert, and the shared one, is x * (id + 1);
 * the arguments are dp_mlp_expert_rows's. */
static void moe_echo(const struct duck *d, const float *x, const uint32_t *x_rows,
		     const float *weight, uint32_t n, float *y, const uint32_t *y_rows, uint32_t hid)
{
	const float k = (float)d->id + 1.0f;
	for (uint32_t i = 0; i < n; i++) {
		const float *xi = x + (size_t)(x_rows ? x_rows[i] : i) * hid;
		float *yi = y + (size_t)(y_rows ? y_rows[i] : i) * hid;
		float w = (weight ? weight[i] : 1.0f) * k;
		for (uint32_t c = 0; c < hid; c++)
			yi[c] += w * xi[c];
	}
}

static void moe_bad_table(const struct duck *d, const struct duck_input *in, const char *why)
{
	wk->stats.moe_bad_tables++;
	DUCK_DEBUG("duck %u drops routed forward %" PRIu64 " of layer %u: %s", d->id,
		   in->forward_id, in->layer, why);
}

/* A routed forward on MOE layer l: the message is a wire routing table W, then the
 * activation's rows. Check W (all of it: a table this duck cannot read whole is not one
 * to trust), find this duck's section, and compute
 *
 *   y[reply row of r] = sum over its entries (r, slot, w) of w * expert_slot(x[r])
 *                       (+ the shared expert's columns of x[r], for every row, with SHARED
 *                          on a duck of the shared set: its bank holds shared columns)
 *
 * in float32, one kernel pass per expert over the rows routed to it (DeepSeek's decode:
 * 32 tokens, a duck's 8 experts each see a few of them, every expert's weights read
 * once). Reply rows: every row on a shared-set duck with SHARED, else the section's
 * distinct rows ascending. */
static void moe_forward(struct duck *d, const struct sockaddr_in *src, struct duck_input *in,
			const struct duck_layer *l, const struct dp_wire_header *h)
{
	char why[192];
	struct dp_routing_wire_header wh;
	struct dp_routing_section sec = { 0 };
	uint64_t size;
	const uint32_t hid = l->shard.hidden, isz = dp_dtype_size(in->dtype);
	in->seq = 0; /* consumed whatever happens; buf stays readable until the next input */
	if (in->total < sizeof(wh)) {
		moe_bad_table(d, in, "the message is shorter than a wire routing header");
		return;
	}
	memcpy(&wh, in->buf, sizeof(wh));
	if (dp_routing_wire_size(wh.n_ducks, wh.entries, &size) < 0 || size > in->total) {
		snprintf(why, sizeof(why), "a table of %u ducks and %u entries does not fit %" PRIu64
			 " bytes", wh.n_ducks, wh.entries, in->total);
		moe_bad_table(d, in, why);
		return;
	}
	/* Other ducks' sections name slots of their own banks, which may hold more experts
	 * than this one (uneven placements): the table is checked against the widest bank
	 * there can be, and this duck's own slots against its bank below. */
	if (dp_routing_wire_check(in->buf, size, in->rows, DP_MAX_EXPERTS, why, sizeof(why)) < 0) {
		moe_bad_table(d, in, why);
		return;
	}
	if (in->total - size != (uint64_t)in->rows * hid * isz) {
		/* a shape the layer does not have, as a dense forward's: the host's shard is
		 * not this one (a stale layer), and NO_LAYER makes it load it again */
		DUCK_DEBUG("duck %u: routed forward %" PRIu64 " carries %" PRIu64 " activation "
			   "bytes, %u rows of layer %u take %" PRIu64, d->id, in->forward_id,
			   in->total - size, in->rows, in->layer, (uint64_t)in->rows * hid * isz);
		reply_no_layer(d, src, h);
		return;
	}
	/* SHARED: the layer has a shared expert, and the ducks of its set (those whose bank
	 * holds shared columns: the load put them there and nowhere else) compute them for
	 * every row; a duck outside the set answers its own rows, as without SHARED */
	const int shared = (wh.flags & DP_ROUTING_WIRE_FLAG_SHARED) &&
			   l->shard.ffn > (uint64_t)l->shard.experts * l->shard.expert_ffn;
	int rc = dp_routing_wire_section(in->buf, size, d->id, &sec);
	if (rc == DP_ROUTING_ERROR_NO_SUCH_DUCK && !shared) {
		wk->stats.moe_skipped++; /* another duck's tokens: no compute, no reply */
		return;
	}
	if (rc < 0 && rc != DP_ROUTING_ERROR_NO_SUCH_DUCK) {
		moe_bad_table(d, in, dp_routing_strerror(rc));
		return;
	}
	const uint8_t *entries = in->buf + sec.offset;
	const uint32_t n = rc == 0 ? sec.n_entries : 0, slots = l->shard.experts;
	const uint32_t out_rows = shared ? in->rows : sec.n_rows;
	const uint8_t *x_in = in->buf + size; /* size is a multiple of 8: floats are aligned */

	/* Group the entries by slot (a counting sort: rows stay ascending in each group),
	 * each with the row it reads and the reply row it adds to. */
	memset(wk->moe_start, 0, (slots + 1) * sizeof(wk->moe_start[0]));
	for (uint32_t j = 0; j < n; j++) {
		struct dp_routing_wire_entry we;
		memcpy(&we, entries + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
		if (we.expert >= slots) {
			snprintf(why, sizeof(why), "entry %u names slot %u, the bank holds %u experts",
				 j, we.expert, slots);
			moe_bad_table(d, in, why);
			return;
		}
		wk->moe_start[we.expert + 1]++;
	}
	for (uint32_t e = 0; e < slots; e++)
		wk->moe_start[e + 1] += wk->moe_start[e];

	struct duck_output *o = output_alloc(d);
	uint64_t t0 = now_ns();
	const float *x = (const float *)(const void *)x_in;
	float *y = in->dtype == DP_DTYPE_F32 ? (float *)(void *)o->buf : wk->y32;
	/* float16, bfloat16: the rows read, in float32 at their own places (with SHARED all
	 * of them) */
	const int widen = in->dtype != DP_DTYPE_F32;
	if (widen) {
		x = wk->x32;
		if (shared)
			widen_rows(x_in, 0, in->rows, hid, in->dtype);
	}
	int32_t prev = -1;
	uint32_t reply_row = 0;
	for (uint32_t j = 0; j < n; j++) {
		struct dp_routing_wire_entry we;
		memcpy(&we, entries + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
		if ((int32_t)we.row != prev) { /* the next of the section's distinct rows */
			if (prev >= 0)
				reply_row++;
			if (widen && !shared)
				widen_rows(x_in, we.row, 1, hid, in->dtype);
			prev = we.row;
		}
		uint32_t at = wk->moe_start[we.expert]++; /* after this loop: each group's end */
		wk->moe_xrow[at] = we.row;
		wk->moe_yrow[at] = shared ? we.row : reply_row;
		memcpy(&wk->moe_weight[at], &we.weight, sizeof(float));
	}
	memset(y, 0, (size_t)out_rows * hid * sizeof(float));
	struct dp_mlp_expert ex;
	for (uint32_t e = 0; e < slots; e++) {
		uint32_t lo = e ? wk->moe_start[e - 1] : 0, cnt = wk->moe_start[e] - lo;
		if (!cnt)
			continue;
		if (opt_echo)
			moe_echo(d, x, wk->moe_xrow + lo, wk->moe_weight + lo, cnt, y, wk->moe_yrow + lo, hid);
		else if (dp_mlp_bank_block(&l->shard, e, &ex) == 0) /* e < slots: always */
			dp_mlp_expert_rows(&ex, x, wk->moe_xrow + lo, wk->moe_weight + lo, cnt, y,
					   wk->moe_yrow + lo, wk->scratch);
	}
	/* the shared block: every row, weight 1 (no columns: nothing to add) */
	if (shared && dp_mlp_bank_block(&l->shard, slots, &ex) == 0 && ex.cols) {
		if (opt_echo)
			moe_echo(d, x, NULL, NULL, in->rows, y, NULL, hid);
		else
			dp_mlp_expert_rows(&ex, x, NULL, NULL, in->rows, y, NULL, wk->scratch);
	}
	if (widen) /* the partial in the layer's dtype, rounded to nearest even */
		dp_reduce_store(o->buf, y, NULL, out_rows, hid, in->dtype);
	o->compute_ns = now_ns() - t0;
	o->rows = out_rows;
	o->dtype = in->dtype;
	o->flags = DP_WIRE_FLAG_ROUTED;
	o->total = (uint64_t)out_rows * hid * isz;
	wk->stats.moe_forwards++;
	wk->stats.moe_expert_rows += n;
	forward_reply(d, src, in, o);
}

/* Input `in` is complete: compute, cache and send the partial (or NACK|NO_LAYER). */
static void forward_complete(struct duck *d, const struct sockaddr_in *src,
			     struct duck_input *in, const struct dp_wire_header *h)
{
	struct duck_layer *l = bank_for(d, in->layer, in->bank);
	uint32_t isz = dp_dtype_size(in->dtype);
	if (in->bytes != in->total) { /* chunks that overlap or leave holes */
		wk->stats.dropped_invalid++;
		in->seq = 0;
		return;
	}
	const int routed = in->flags & DP_WIRE_FLAG_ROUTED;
	if (l && (l->shard.kind == DP_MLP_KIND_MOE) != !!routed) {
		if (routed)
			wk->stats.moe_routed_dense++;
		else
			wk->stats.moe_unrouted++;
		DUCK_DEBUG("duck %u drops forward %" PRIu64 ": layer %u is %s, the forward %s",
			   d->id, in->forward_id, in->layer,
			   routed ? "dense" : "a mixture of experts",
			   routed ? "carries routing" : "carries no routing");
		in->seq = 0;
		return;
	}
	if (l && l->fp8_stale) { /* FP8 chunks came in since the last forward */
		fp8_dequant(l);
		wk->stats.fp8_dequants_later++;
	}
	if (l && l->dtype == in->dtype && routed) {
		moe_forward(d, src, in, l, h);
		return;
	}
	if (!l || l->dtype != in->dtype ||
	    in->total != (uint64_t)in->rows * l->shard.hidden * isz) {
		in->seq = 0;
		reply_no_layer(d, src, h);
		return;
	}
	struct duck_output *o = output_alloc(d);
	size_t n = (size_t)in->rows * l->shard.hidden;
	uint64_t t0 = now_ns();
	const float *x = (const float *)(void *)in->buf;
	float *y = (float *)(void *)o->buf;
	const int widen = in->dtype != DP_DTYPE_F32; /* float16, bfloat16: in float32 */
	if (widen) {
		dp_mlp_to_f32(wk->x32, in->buf, n, in->dtype);
		x = wk->x32;
		y = wk->y32;
	}
	if (opt_echo)
		dp_mlp_scale(y, x, n, (float)d->id + 1.0f);
	else
		dp_mlp_forward(&l->shard, x, in->rows, y, wk->scratch);
	if (widen) /* the partial in the layer's dtype, rounded to nearest even */
		dp_reduce_store(o->buf, y, NULL, in->rows, l->shard.hidden, in->dtype);
	o->compute_ns = now_ns() - t0;
	o->rows = in->rows;
	o->dtype = in->dtype;
	o->flags = 0;
	o->total = in->total;
	forward_reply(d, src, in, o);
}

static void handle_forward(struct duck *d, const struct sockaddr_in *src,
			   const struct dp_wire_header *h, const uint8_t *payload)
{
	if (d->computed >= opt_stop_after) {
		wk->stats.stopped_ignored++;
		return;
	}
	if (output_find(d, h->session, h->forward_id)) {
		wk->stats.duplicates++; /* already answered; a lost partial is NACKed, not re-sent */
		return;
	}
	uint32_t isz = dp_dtype_size(h->dtype);
	if (!dp_dtype_is_act(h->dtype) || !h->rows || !h->total || h->total % isz ||
	    h->total > g_msg_cap ||
	    h->chunks > DP_REASM_MAX_CHUNKS) {
		wk->stats.dropped_invalid++;
		return;
	}
	struct duck_input *in = input_find(d, h->session, h->forward_id);
	if (!in) {
		in = input_alloc(d);
		in->session = h->session;
		in->forward_id = h->forward_id;
		in->total = h->total;
		in->bytes = 0;
		in->layer = h->layer;
		in->bank = h->tensor;
		in->rows = h->rows;
		in->dtype = h->dtype;
		in->flags = h->flags & DP_WIRE_FLAG_ROUTED;
		dp_reasm_reset(&in->reasm, h->chunks);
	} else if (in->total != h->total || in->reasm.chunks != h->chunks ||
		   in->layer != h->layer || in->rows != h->rows || in->dtype != h->dtype ||
		   in->flags != (h->flags & DP_WIRE_FLAG_ROUTED)) {
		wk->stats.dropped_invalid++;
		return;
	}
	int m = dp_reasm_mark(&in->reasm, h->chunk);
	if (m <= 0) {
		if (m == 0)
			wk->stats.duplicates++;
		else
			wk->stats.dropped_invalid++;
		return;
	}
	memcpy(in->buf + h->offset, payload, h->length);
	in->bytes += h->length;
	if (dp_reasm_complete(&in->reasm))
		forward_complete(d, src, in, h);
}

static void handle_nack(struct duck *d, const struct sockaddr_in *src,
			const struct dp_wire_header *h, const uint8_t *payload)
{
	wk->stats.nacks_received++;
	if (d->computed >= opt_stop_after) {
		wk->stats.stopped_ignored++;
		return;
	}
	struct duck_output *o = output_find(d, h->session, h->forward_id);
	if (o) {
		/* Resend each listed chunk once, in the order asked; drop nonsense indices. */
		uint32_t asked = h->length / 4, n = 0;
		dp_reasm_reset(&wk->seen, o->chunks);
		for (uint32_t k = 0; k < asked; k++) {
			uint32_t c;
			memcpy(&c, payload + 4 * (size_t)k, 4);
			if (dp_reasm_mark(&wk->seen, c) > 0)
				wk->list[n++] = c;
		}
		if (n < asked)
			wk->stats.nack_bad_chunks++; /* repeated indices, or past the partial's end */
		wk->stats.nacks_answered++;
		if (asked && !n)
			return; /* nothing valid to resend */
		reply_partial(d, src, o, asked ? wk->list : NULL, n);
		return;
	}
	/* Not computed yet: ask for the input chunks we lack (none known: all of them). */
	struct dp_wire_header r;
	reply_init(d, &r, DP_WIRE_OP_NACK, h);
	r.flags = DP_WIRE_FLAG_INPUT;
	uint32_t n = 0;
	struct duck_input *in = input_find(d, h->session, h->forward_id);
	if (in) {
		n = dp_reasm_missing(&in->reasm, wk->list, g_nack_max);
		r.layer = in->layer;
		r.dtype = in->dtype;
		r.rows = in->rows;
		r.chunks = in->reasm.chunks;
		r.total = in->total;
	}
	r.length = 4 * n;
	wk->stats.input_nacks_sent++;
	reply_small(d, src, &r, wk->list, 4 * n);
}

static void handle_ping(struct duck *d, const struct sockaddr_in *src,
			const struct dp_wire_header *h)
{
	struct dp_wire_header r;
	reply_init(d, &r, DP_WIRE_OP_PONG, h);
	wk->stats.pongs++;
	reply_small(d, src, &r, NULL, 0);
}

/* ----------------------------------------------------------------- receive */

static void handle_datagram(struct duck *d, const uint8_t *buf, uint32_t len, int flags,
			    const struct sockaddr_in *src)
{
	wk->stats.rx++;
	wk->stats.rx_bytes += len;
	if (inject_drop(d))
		return;
	if (flags & MSG_TRUNC) {
		wk->stats.dropped_malformed++;
		wk->stats.malformed_truncated++;
		return;
	}
	enum dp_wire_verdict v = dp_wire_check(buf, len);
	if (v != DP_WIRE_OK) {
		wk->stats.dropped_malformed++;
		switch (v) {
		case DP_WIRE_SHORT: wk->stats.malformed_short++; break;
		case DP_WIRE_BAD_MAGIC: wk->stats.malformed_magic++; break;
		case DP_WIRE_BAD_VERSION: wk->stats.malformed_version++; break;
		case DP_WIRE_BAD_OP: wk->stats.malformed_op++; break;
		default: wk->stats.malformed_length++; break;
		}
		return;
	}
	const struct dp_wire_header *h = (const void *)buf; /* wk->rx_buf is 64-byte aligned */
	const uint8_t *payload = dp_wire_payload(buf);
	if (h->op == DP_WIRE_OP_PARTIAL || h->op == DP_WIRE_OP_WEIGHT_ACK ||
	    h->op == DP_WIRE_OP_PONG) {
		wk->stats.unexpected_op++; /* a duck's own ops, not the host's */
		return;
	}
	if (h->op != DP_WIRE_OP_PING && h->duck != d->id && h->duck != DP_WIRE_ANY_DUCK) {
		wk->stats.wrong_duck++;
		return;
	}
	d->session = h->session;
	d->epoch = h->epoch;
	switch (h->op) {
	case DP_WIRE_OP_FORWARD: handle_forward(d, src, h, payload); break;
	case DP_WIRE_OP_NACK: handle_nack(d, src, h, payload); break;
	case DP_WIRE_OP_WEIGHT: handle_weight(d, src, h, payload); break;
	case DP_WIRE_OP_LAYER: handle_layer(d, src, h, payload); break;
	case DP_WIRE_OP_PING: handle_ping(d, src, h); break;
	default: break;
	}
}

/* The kernel's count of datagrams dropped on a full receive buffer (SO_RXQ_OVFL). */
static void rx_overflow(struct duck *d, struct msghdr *m)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SO_RXQ_OVFL)
			continue;
		uint32_t drops;
		memcpy(&drops, CMSG_DATA(c), sizeof(drops));
		wk->stats.rx_kernel_drops += (uint32_t)(drops - d->rxq_ovfl);
		d->rxq_ovfl = drops;
	}
}

static void duck_rx(struct duck *d)
{
	for (uint32_t b = 0; b < DUCK_RX_BURSTS; b++) {
		for (uint32_t i = 0; i < DUCK_BURST; i++) {
			wk->rx_msg[i].msg_hdr.msg_namelen = sizeof(wk->rx_src[i]);
			wk->rx_msg[i].msg_hdr.msg_controllen = sizeof(wk->rx_ctl[i].buf);
			wk->rx_msg[i].msg_hdr.msg_flags = 0;
		}
		int n = recvmmsg(d->fd, wk->rx_msg, DUCK_BURST, MSG_DONTWAIT, NULL);
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				wk->stats.rx_errors++;
			break;
		}
		for (int i = 0; i < n; i++) {
			struct msghdr *m = &wk->rx_msg[i].msg_hdr;
			if (m->msg_controllen)
				rx_overflow(d, m);
			/* UDP GRO: a GSO send of the host's arrives whole; cut it (dp_gro.h) */
			uint32_t seg = dp_gro_cmsg_size(m); /* only a GRO socket gets one */
			if (!seg) {
				handle_datagram(d, wk->rx_buf[i], wk->rx_msg[i].msg_len, m->msg_flags,
						&wk->rx_src[i]);
				continue;
			}
			struct dp_gro_cursor cur;
			uint8_t *p;
			uint32_t len;
			dp_gro_start(&cur, wk->rx_buf[i], wk->rx_msg[i].msg_len, seg, m->msg_flags & MSG_TRUNC);
			if (cur.seg)
				wk->stats.gro_receives++;
			while (dp_gro_next(&cur, &p, &len)) {
				if ((uintptr_t)p % 8) {
					memcpy(wk->rx_aligned, p, len);
					p = wk->rx_aligned;
				}
				/* a cut datagram (len 0) is refused as short by handle_datagram */
				handle_datagram(d, p, len, m->msg_flags & ~MSG_TRUNC, &wk->rx_src[i]);
			}
		}
		if (wk->tx.n)
			tx_flush();
		if ((uint32_t)n < DUCK_BURST)
			break;
	}
}

/* ---------------------------------------------------------------- main loop */

static int wait_events(struct epoll_event *ev, const struct timespec *ts)
{
	if (!wk->no_pwait2) {
		int n = epoll_pwait2(wk->epfd, ev, DUCK_EVENTS, ts, NULL);
		if (n >= 0 || errno != ENOSYS)
			return n;
		wk->no_pwait2 = 1;
	}
	int ms = -1;
	if (ts)
		ms = (int)(ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000);
	return epoll_wait(wk->epfd, ev, DUCK_EVENTS, ms);
}

/* Every worker leaves its loop: the eventfd in all their epolls becomes readable (and
 * stays so: nobody reads it). */
static void quit_all(void)
{
	uint64_t one = 1;
	__atomic_store_n(&force_quit, 1, __ATOMIC_RELAXED);
	if (write(g_quitfd, &one, sizeof(one)) < 0)
		fprintf(stderr, PROG ": cannot wake the workers: %s\n", strerror(errno));
}

/* The n events epoll gave: a signal (worker 0) or the quit eventfd ends the loop, a
 * duck's socket is read; then the delayed replies that are due go out. */
static void handle_events(const struct epoll_event *ev, int n)
{
	for (int i = 0; i < n; i++) {
		if (ev[i].data.u32 == DUCK_SIGNAL_TOKEN) {
			struct signalfd_siginfo si;
			if (read(g_sigfd, &si, sizeof(si)) > 0)
				quit_all();
			continue;
		}
		if (ev[i].data.u32 == DUCK_QUIT_TOKEN)
			continue; /* force_quit is set */
		duck_rx(&g_ducks[ev[i].data.u32]);
	}
	if (wk->delayq_head != wk->delayq_tail)
		delay_run();
}

/* The FP8 layer whose chunks came in since its last dequantization and stopped coming
 * the longest ago, or NULL. */
static struct duck_layer *fp8_stale_layer(void)
{
	struct duck_layer *oldest = NULL;
	WORKER_DUCKS(i, wk)
		for (uint32_t k = 0; k < DUCK_MAX_LAYERS; k++) {
			struct duck_layer *l = &g_ducks[i].layers[k];
			if (l->used && l->fp8_stale && (!oldest || l->fp8_last_ns < oldest->fp8_last_ns))
				oldest = l;
		}
	return oldest;
}

static void main_loop(void)
{
	struct epoll_event ev[DUCK_EVENTS];
	while (!__atomic_load_n(&force_quit, __ATOMIC_RELAXED)) {
		struct timespec ts, *tsp = NULL;
		uint64_t wait = UINT64_MAX, now = now_ns();
		if (wk->delayq_head != wk->delayq_tail) { /* sleep only until the next delayed reply */
			uint64_t due = wk->delayq[wk->delayq_head & (DUCK_DELAY_SLOTS - 1)].due_ns;
			wait = due > now ? due - now : 0;
		}
		/* An FP8 layer is dequantized once its chunks have stopped coming for
		 * DUCK_FP8_QUIET_NS, while nothing waits: the first forward after a load does not
		 * pay for it (handle_forward would, at the latest, with a deadline to lose), and
		 * a load in progress is not slowed by dequantizing it again after each burst */
		struct duck_layer *stale = fp8_stale_layer();
		uint64_t quiet = stale ? stale->fp8_last_ns + DUCK_FP8_QUIET_NS : 0;
		if (stale && (quiet > now ? quiet - now : 0) < wait)
			wait = quiet > now ? quiet - now : 0;
		if (wait != UINT64_MAX) {
			ts.tv_sec = (time_t)(wait / 1000000000ull);
			ts.tv_nsec = (long)(wait % 1000000000ull);
			tsp = &ts;
		}
		int n = wait_events(ev, tsp);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, PROG ": worker %u: epoll_wait failed: %s\n", wk->index,
				strerror(errno));
			quit_all(); /* the run ends whole, not with a worker's ducks gone silent */
			break;
		}
		handle_events(ev, n);
		if (n == 0 && stale && now_ns() >= quiet) {
			fp8_dequant(stale);
			wk->stats.fp8_dequants_later++;
		}
	}
}

static void *worker_main(void *arg)
{
	wk = arg;
	main_loop();
	return NULL;
}

/* ------------------------------------------------------------ option parsing */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [options]\n"
		"Emulates up to %u ducks (duckpipe's compute nodes) on UDP sockets.\n"
		"  --ducks N           ducks to emulate (default 8, at most %u)\n"
		"  --threads N         worker threads, each computing its own group of ducks\n"
		"                      (default: every CPU this process may use; at most --ducks)\n"
		"  --isa ISA           the kernels: auto (default), avx2 or portable (no AVX2)\n"
		"  --bind IP[,IP...]   address of every duck, or one per duck (default 127.0.0.1)\n"
		"  --base-port P       duck i listens on P + i (default 47100)\n"
		"  --first-id K        duck i has id K + i (default 0)\n"
		"  --mtu BYTES         sets the payload per partial datagram (default 1500)\n"
		"  --compute MODE      real: the MLP shard (default); echo: x * (id + 1)\n"
		"  --drop FRACTION     fault: lose each datagram in and out with this probability\n"
		"  --delay-us US       fault: hold every reply this long\n"
		"  --stop-after N      fault: ignore FORWARD and NACK after N computed forwards\n"
		"  --restart-after N   fault: forget all layers after N computed forwards\n"
		"  --seed S            seed of --drop (default 1)\n"
		"  --no-gso            send partials with sendmmsg, not UDP GSO\n"
		"  --no-gro            receive datagram by datagram, without UDP GRO\n"
		"  -v, --verbose       say why each dropped routed forward was dropped\n"
		"  --bench H,C,R[,MS]  no ducks: time the expert kernel (hidden H, C columns, R rows)\n"
		"                      on 8 experts per thread for MS ms (default 500), print GFLOP/s\n"
		"SIGINT/SIGTERM print the counters to stderr and exit 0.\n",
		DUCK_MAX_DUCKS, DUCK_MAX_DUCKS);
}

static void __attribute__((noreturn)) bad_option(const char *name, const char *val,
						 const char *want)
{
	fprintf(stderr, PROG ": --%s must be %s, got '%s'\n", name, want, val);
	exit(2);
}

static uint64_t parse_u64(const char *name, const char *val, uint64_t lo, uint64_t hi,
			  const char *want)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(val, &end, 0);
	if (errno || end == val || *end || val[0] == '-' || v < lo || v > hi)
		bad_option(name, val, want);
	return v;
}

static void parse_bind(const char *arg)
{
	char buf[4096];
	uint32_t n = 0;
	if (strlen(arg) >= sizeof(buf))
		bad_option("bind", arg, "a short list of IPv4 addresses");
	strcpy(buf, arg);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == DUCK_MAX_DUCKS || inet_pton(AF_INET, tok, &g_ips[n]) != 1)
			bad_option("bind", arg, "IPv4 addresses separated by commas");
		n++;
	}
	if (n != 1 && n != opt_ducks) {
		fprintf(stderr, PROG ": --bind lists %u addresses for %u ducks: give one, or one per duck\n",
			n, opt_ducks);
		exit(2);
	}
	for (uint32_t i = n; i < opt_ducks; i++)
		g_ips[i] = g_ips[0];
}

static void parse_bench(const char *arg)
{
	char buf[64], *save = NULL;
	unsigned k = 0;
	static const uint32_t hi[4] = { 65536, 65536, DP_MLP_GATHER_ROWS * 64, 600000 };
	if (strlen(arg) >= sizeof(buf))
		bad_option("bench", arg, "HIDDEN,COLS,ROWS[,MS]");
	strcpy(buf, arg);
	opt_bench[3] = 500;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (k == 4)
			bad_option("bench", arg, "HIDDEN,COLS,ROWS[,MS]");
		opt_bench[k] = (uint32_t)parse_u64("bench", tok, 1, hi[k],
						   "HIDDEN,COLS,ROWS[,MS], each at least 1");
		k++;
	}
	if (k < 3)
		bad_option("bench", arg, "HIDDEN,COLS,ROWS[,MS]");
}

static void parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "ducks", required_argument, NULL, 'n' },
		{ "threads", required_argument, NULL, 't' },
		{ "isa", required_argument, NULL, 'I' },
		{ "bind", required_argument, NULL, 'b' },
		{ "base-port", required_argument, NULL, 'p' },
		{ "first-id", required_argument, NULL, 'i' },
		{ "mtu", required_argument, NULL, 'm' },
		{ "compute", required_argument, NULL, 'c' },
		{ "drop", required_argument, NULL, 'd' },
		{ "delay-us", required_argument, NULL, 'D' },
		{ "stop-after", required_argument, NULL, 's' },
		{ "restart-after", required_argument, NULL, 'r' },
		{ "seed", required_argument, NULL, 'S' },
		{ "no-gso", no_argument, NULL, 'G' },
		{ "no-gro", no_argument, NULL, 'R' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "bench", required_argument, NULL, 'B' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "hv", opts, NULL)) != -1) {
		switch (c) {
		case 'n': {
			char want[16];
			snprintf(want, sizeof(want), "1..%u", (unsigned)DUCK_MAX_DUCKS);
			opt_ducks = (uint32_t)parse_u64("ducks", optarg, 1, DUCK_MAX_DUCKS, want);
			break;
		}
		case 't': {
			char want[24];
			snprintf(want, sizeof(want), "1..%u", DUCK_MAX_THREADS);
			opt_threads = (uint32_t)parse_u64("threads", optarg, 1, DUCK_MAX_THREADS, want);
			break;
		}
		case 'I':
			if ((opt_isa = dp_mlp_isa_parse(optarg)) < 0)
				bad_option("isa", optarg, "auto, avx2 or portable");
			break;
		case 'b': opt_bind = optarg; break;
		case 'p':
			opt_base_port = (uint32_t)parse_u64("base-port", optarg, 1, 65535, "1..65535");
			break;
		case 'i':
			opt_first_id = (uint32_t)parse_u64("first-id", optarg, 0, 65534, "0..65534");
			break;
		case 'm':
			opt_mtu = (uint32_t)parse_u64("mtu", optarg, 256, 65536, "256..65536");
			break;
		case 'c':
			if (strcmp(optarg, "real") && strcmp(optarg, "echo"))
				bad_option("compute", optarg, "real or echo");
			opt_echo = !strcmp(optarg, "echo");
			break;
		case 'd':
			errno = 0;
			opt_drop = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(opt_drop >= 0.0 && opt_drop <= 1.0))
				bad_option("drop", optarg, "a fraction in 0..1");
			break;
		case 'D':
			opt_delay_ns = 1000 * parse_u64("delay-us", optarg, 0, DUCK_MAX_DELAY_US,
							"0..10000000");
			break;
		case 's':
			opt_stop_after = parse_u64("stop-after", optarg, 0, UINT64_MAX - 1,
						   "a count of forwards");
			break;
		case 'r':
			opt_restart_after = parse_u64("restart-after", optarg, 1, UINT64_MAX,
						      "a count of forwards, at least 1");
			break;
		case 'S':
			opt_seed = parse_u64("seed", optarg, 0, UINT64_MAX, "an unsigned integer");
			break;
		case 'G': opt_no_gso = 1; break;
		case 'R': opt_no_gro = 1; break;
		case 'v': opt_verbose = 1; break;
		case 'B': parse_bench(optarg); break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc) {
		fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		exit(2);
	}
	if (opt_base_port + opt_ducks - 1 > 65535) {
		fprintf(stderr, PROG ": ports %u..%u do not fit below 65536\n", opt_base_port,
			opt_base_port + opt_ducks - 1);
		exit(2);
	}
	if (opt_first_id + opt_ducks - 1 >= DP_WIRE_ANY_DUCK) {
		fprintf(stderr, PROG ": ids %u..%u reach %u, which means \"any duck\"\n",
			opt_first_id, opt_first_id + opt_ducks - 1, DP_WIRE_ANY_DUCK);
		exit(2);
	}
	parse_bind(opt_bind);
}

/* --------------------------------------------------------------------- setup */

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...);
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs(PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(EXIT_FAILURE);
}

/* Large buffers: past net.core.[rw]mem_max where we may (root), else what we get. */
static void sock_buf(int fd, int force, int plain)
{
	int v = DUCK_SOCK_BUF;
	if (setsockopt(fd, SOL_SOCKET, force, &v, sizeof(v)) < 0)
		(void)setsockopt(fd, SOL_SOCKET, plain, &v, sizeof(v));
}

static void duck_open(struct worker *w, struct duck *d, uint32_t i)
{
	char ip[INET_ADDRSTRLEN];
	d->index = i;
	d->rng = splitmix64(opt_seed + i) | 1; /* xorshift must not start at 0 */
	d->id = (uint16_t)(opt_first_id + i);
	d->addr.sin_family = AF_INET;
	d->addr.sin_addr = g_ips[i];
	d->addr.sin_port = htons((uint16_t)(opt_base_port + i));
	d->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (d->fd < 0)
		die("socket() failed for duck %u: %s", d->id, strerror(errno));
	sock_buf(d->fd, SO_RCVBUFFORCE, SO_RCVBUF);
	sock_buf(d->fd, SO_SNDBUFFORCE, SO_SNDBUF);
	int one = 1;
	(void)setsockopt(d->fd, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof(one));
	/* UDP GRO (Linux 5.0): the host's GSO sends arrive whole, not cut by the kernel */
	if (g_gro && setsockopt(d->fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) < 0) {
		fprintf(stderr, PROG ": UDP GRO refused (%s); receiving datagram by datagram\n",
			strerror(errno));
		g_gro = 0;
	}
	if (bind(d->fd, (struct sockaddr *)&d->addr, sizeof(d->addr)) < 0) {
		int e = errno;
		die("cannot bind duck %u to %s:%u: %s (%s)", d->id,
		    ip_str(&d->addr, ip, sizeof(ip)), opt_base_port + i, strerror(e),
		    e == EADDRNOTAVAIL ? "is that address configured on this host?"
				       : "port in use?");
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = i };
	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, d->fd, &ev) < 0)
		die("epoll_ctl() failed for duck %u: %s", d->id, strerror(errno));

	d->arena_len = (DUCK_INPUTS + DUCK_OUTPUTS) * g_msg_cap;
	if (!(d->arena = reserve(d->arena_len)))
		die("cannot reserve %zu MiB for duck %u's buffers: %s", d->arena_len >> 20, d->id,
		    strerror(errno));
	for (uint32_t k = 0; k < DUCK_INPUTS; k++)
		d->in[k].buf = d->arena + k * g_msg_cap;
	for (uint32_t k = 0; k < DUCK_OUTPUTS; k++)
		d->out[k].buf = d->arena + (DUCK_INPUTS + k) * g_msg_cap;
}

/* --threads, or every CPU this process may use; never more than cap (the ducks). */
static uint32_t thread_count(uint32_t cap)
{
	uint32_t n = opt_threads;
	if (!n) {
		cpu_set_t set;
		n = sched_getaffinity(0, sizeof(set), &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
	}
	return n < 1 ? 1 : n > cap ? cap : n;
}

/* Worker t of g_n_workers: its epoll and its buffers, in one mapping of its own. */
static struct worker *worker_new(uint32_t t)
{
	struct worker *w = reserve(sizeof(*w));
	if (!w)
		die("cannot reserve %zu KiB for worker %u: %s", sizeof(*w) >> 10, t, strerror(errno));
	w->index = t;
	if ((w->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
		die("epoll_create1() failed for worker %u: %s", t, strerror(errno));
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = DUCK_QUIT_TOKEN };
	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, g_quitfd, &ev) < 0)
		die("epoll_ctl() failed for worker %u's eventfd: %s", t, strerror(errno));
	if (!(w->x32 = reserve(g_xy_len)) || !(w->y32 = reserve(g_xy_len)))
		die("cannot reserve %zu MiB of compute buffers for worker %u: %s",
		    2 * g_xy_len >> 20, t, strerror(errno));
	if (!(w->delayq = calloc(DUCK_DELAY_SLOTS, sizeof(*w->delayq))))
		die("cannot allocate worker %u's delay queue", t);
	for (uint32_t i = 0; i < DUCK_BURST; i++) {
		w->rx_iov[i] = (struct iovec){ .iov_base = w->rx_buf[i], .iov_len = DUCK_RX_BUF };
		w->rx_msg[i].msg_hdr.msg_name = &w->rx_src[i];
		w->rx_msg[i].msg_hdr.msg_iov = &w->rx_iov[i];
		w->rx_msg[i].msg_hdr.msg_iovlen = 1;
		w->rx_msg[i].msg_hdr.msg_control = w->rx_ctl[i].buf;
	}
	return w;
}

static void setup(void)
{
	g_payload = dp_wire_payload_max(opt_mtu);
	g_seg = DP_WIRE_HDR_LEN + g_payload;
	g_gso_segs = DP_WIRE_MAX_DATAGRAM / g_seg;
	if (g_gso_segs > DUCK_GSO_SEGS)
		g_gso_segs = DUCK_GSO_SEGS;
	if (g_gso_segs < 1)
		g_gso_segs = 1;
	g_gso = !opt_no_gso && g_gso_segs > 1;
	g_gro = !opt_no_gro;
	g_nack_max = g_payload / 4 < DUCK_NACK_LIST ? g_payload / 4 : DUCK_NACK_LIST;
	g_msg_cap = (uint64_t)DP_REASM_MAX_CHUNKS * g_payload;
	if (g_msg_cap > DUCK_MAX_MSG)
		g_msg_cap = DUCK_MAX_MSG;
	g_msg_cap = (g_msg_cap + 4095) & ~(size_t)4095;
	g_xy_len = 2 * g_msg_cap; /* float32 of the largest 2-byte message */
	if (dp_mlp_set_isa(opt_isa) < 0) /* before any thread computes */
		die("--isa %s: this CPU lacks it (it has %s)", dp_mlp_isa_name(opt_isa),
		    dp_mlp_isa_name(dp_mlp_isa()));

	/* blocked here, so in every thread created after: only the signalfd sees them */
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0 ||
	    (g_sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
		die("signalfd() failed: %s", strerror(errno));
	if ((g_quitfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
		die("eventfd() failed: %s", strerror(errno));

	g_n_workers = thread_count(opt_ducks);
	if (!(g_workers = calloc(g_n_workers, sizeof(*g_workers))))
		die("cannot allocate %u workers", g_n_workers);
	for (uint32_t t = 0; t < g_n_workers; t++)
		g_workers[t] = worker_new(t);
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = DUCK_SIGNAL_TOKEN };
	if (epoll_ctl(g_workers[0]->epfd, EPOLL_CTL_ADD, g_sigfd, &ev) < 0)
		die("epoll_ctl() failed for the signalfd: %s", strerror(errno));

	if (!(g_ducks = aligned_alloc(64, opt_ducks * sizeof(*g_ducks))))
		die("cannot allocate %u ducks", opt_ducks);
	memset(g_ducks, 0, opt_ducks * sizeof(*g_ducks));
	for (uint32_t i = 0; i < opt_ducks; i++)
		g_ducks[i].fd = -1;
	for (uint32_t t = 0; t < g_n_workers; t++) {
		struct worker *w = g_workers[t];
		WORKER_DUCKS(i, w)
			duck_open(w, &g_ducks[i], i);
	}
}

/* Workers 1.. on threads of their own; worker 0 is the caller's. */
static void workers_start(void)
{
	for (uint32_t t = 1; t < g_n_workers; t++) {
		int e = pthread_create(&g_workers[t]->tid, NULL, worker_main, g_workers[t]);
		if (e)
			die("pthread_create() failed for worker %u of %u: %s (try --threads %u)", t,
			    g_n_workers, strerror(e), t);
		g_workers[t]->started = 1;
		char name[16]; /* as top -H and /proc/PID/task/TID/comm show it */
		snprintf(name, sizeof(name), "ducks-w%u", t % 10000); /* t < 1024 */
		(void)pthread_setname_np(g_workers[t]->tid, name);
	}
}

static void workers_join(void)
{
	for (uint32_t t = 1; t < g_n_workers; t++)
		if (g_workers[t]->started)
			pthread_join(g_workers[t]->tid, NULL);
}

/* Every worker's counters, summed (they are all joined: no one writes them now). */
static void print_counters(void)
{
	struct duck_stats sum = { 0 };
	for (uint32_t t = 0; t < g_n_workers; t++) {
		const struct duck_stats *st = &g_workers[t]->stats;
#define X(name) sum.name += st->name;
		DUCK_COUNTERS(X)
#undef X
	}
	const char *sep = "";
#define X(name)                                                        \
	fprintf(stderr, "%s" #name "=%" PRIu64, sep, sum.name); \
	sep = " ";
	DUCK_COUNTERS(X)
#undef X
	fputc('\n', stderr);
}

static void teardown(void)
{
	for (uint32_t i = 0; i < opt_ducks; i++) {
		struct duck *d = &g_ducks[i];
		layers_forget(d);
		if (d->arena)
			munmap(d->arena, d->arena_len);
		if (d->fd >= 0)
			close(d->fd);
	}
	free(g_ducks);
	for (uint32_t t = 0; t < g_n_workers; t++) {
		struct worker *w = g_workers[t];
		munmap(w->x32, g_xy_len);
		munmap(w->y32, g_xy_len);
		free(w->scratch);
		free(w->delayq);
		close(w->epfd);
		munmap(w, sizeof(*w));
	}
	free(g_workers);
	close(g_sigfd);
	close(g_quitfd);
}

/* --------------------------------------------------------------- kernel bench
 *
 * --bench H,C,R[,MS]: what the emulator's compute costs, without the network. Each of the
 * --threads threads holds 8 experts of hidden H and C columns (one DeepSeek-V3 duck's bank:
 * weights of their own, so as many bytes stream from memory as on ducks that are loaded)
 * and runs dp_mlp_expert_rows on R rows through each in turn, for MS ms. One line out:
 * the GFLOP/s of all threads together, counted as 2 x 3 x H x C per row and expert (gate,
 * up, down; SiLU and the adds are not counted), and the weight bytes read per second. */

#define BENCH_EXPERTS 8u

struct bench_thread {
	pthread_t tid;
	pthread_barrier_t *start;
	uint64_t calls;  /* expert passes done */
	uint64_t ns;     /* how long they took */
	int failed;
};

static void *bench_main(void *arg)
{
	struct bench_thread *b = arg;
	const uint32_t hid = opt_bench[0], cols = opt_bench[1], rows = opt_bench[2];
	const size_t per = (size_t)hid * cols;
	float *w = aligned_alloc(64, 3 * per * BENCH_EXPERTS * sizeof(float)); /* as a layer's block */
	float *x = malloc((size_t)rows * hid * sizeof(float));
	float *y = calloc((size_t)rows * hid, sizeof(float));
	float *scratch = malloc(dp_mlp_rows_scratch_floats(hid, cols) * sizeof(float));
	if (!w || !x || !y || !scratch) {
		b->failed = 1;
		pthread_barrier_wait(b->start);
		goto out;
	}
	for (size_t i = 0; i < 3 * per * BENCH_EXPERTS; i++) /* small, varied, no denormals */
		w[i] = (float)((int)(i % 17) - 8) * 0x1p-10f;
	for (size_t i = 0; i < (size_t)rows * hid; i++)
		x[i] = (float)((int)(i % 13) - 6) * 0x1p-4f;
	struct dp_mlp_expert ex[BENCH_EXPERTS];
	for (uint32_t e = 0; e < BENCH_EXPERTS; e++)
		ex[e] = (struct dp_mlp_expert){ .w_gate = w + 3 * per * e, .w_up = w + 3 * per * e + per,
						.w_down = w + 3 * per * e + 2 * per, .hidden = hid,
						.cols = cols, .ldb = cols };
	pthread_barrier_wait(b->start);
	uint64_t t0 = now_ns(), until = t0 + (uint64_t)opt_bench[3] * 1000000ull, t;
	do {
		for (uint32_t e = 0; e < BENCH_EXPERTS; e++)
			dp_mlp_expert_rows(&ex[e], x, NULL, NULL, rows, y, NULL, scratch);
		b->calls += BENCH_EXPERTS;
	} while ((t = now_ns()) < until);
	b->ns = t - t0;
out:
	free(w);
	free(x);
	free(y);
	free(scratch);
	return NULL;
}

static int bench_run(void)
{
	if (dp_mlp_set_isa(opt_isa) < 0)
		die("--isa %s: this CPU lacks it (it has %s)", dp_mlp_isa_name(opt_isa),
		    dp_mlp_isa_name(dp_mlp_isa()));
	uint32_t n = thread_count(DUCK_MAX_THREADS);
	struct bench_thread *th = calloc(n, sizeof(*th));
	pthread_barrier_t start;
	if (!th || pthread_barrier_init(&start, NULL, n))
		die("cannot set up %u bench threads", n);
	for (uint32_t t = 0; t < n; t++) {
		th[t].start = &start;
		if (t && (errno = pthread_create(&th[t].tid, NULL, bench_main, &th[t])))
			die("pthread_create() failed for bench thread %u: %s", t, strerror(errno));
	}
	bench_main(&th[0]);
	uint64_t calls = 0, ns = 0;
	int failed = th[0].failed;
	for (uint32_t t = 0; t < n; t++) {
		if (t)
			pthread_join(th[t].tid, NULL);
		failed |= th[t].failed;
		calls += th[t].calls;
		ns = th[t].ns > ns ? th[t].ns : ns; /* the slowest thread's time: all ran together */
	}
	pthread_barrier_destroy(&start);
	free(th);
	if (failed)
		die("--bench: cannot allocate %" PRIu64 " MiB of weights per thread",
		    (uint64_t)3 * opt_bench[0] * opt_bench[1] * BENCH_EXPERTS * 4 >> 20);
	const double s = (double)ns * 1e-9, per = (double)opt_bench[0] * opt_bench[1];
	const double passes = (opt_bench[2] + DP_MLP_GATHER_ROWS - 1) / DP_MLP_GATHER_ROWS;
	printf(PROG " bench: isa=%s threads=%u hidden=%u cols=%u rows=%u experts=%u "
		    "expert_calls=%" PRIu64 " seconds=%.3f gflops=%.3f weight_gbytes_per_s=%.3f\n",
	       dp_mlp_isa_name(dp_mlp_isa()), n, opt_bench[0], opt_bench[1], opt_bench[2],
	       BENCH_EXPERTS, calls, s, (double)calls * 6.0 * per * opt_bench[2] / s * 1e-9,
	       (double)calls * passes * 3.0 * per * 4.0 / s * 1e-9);
	return 0;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	if (opt_bench[0])
		return bench_run();
	setup();
	workers_start(); /* before the ready line: a reader of it finds every thread there */
	printf(PROG ": %u ducks, ids %u..%u, on %s:%u..%u (pid %d)\n", opt_ducks, opt_first_id,
	       opt_first_id + opt_ducks - 1, opt_bind, opt_base_port,
	       opt_base_port + opt_ducks - 1, (int)getpid());
	fflush(stdout);
	worker_main(g_workers[0]);
	workers_join();
	print_counters();
	teardown();
	return 0;
}
