/* dp_floor_moe.c: duckpipe-floor --moe, the C floor of a routed (mixture-of-experts) forward.
 *
 * What `duckpipe bench moe` holds duckpipe's routed modes against: the least a host can
 * do to send a layer's tokens to their experts' ducks and add the answers up, with the
 * project's routing code (dp_routing.h's public functions) and nothing else. Per forward:
 *   route     the gate's choices (int32 ids, float32 weights: one of --routing FILE's
 *             tables in turn, or of the built-in seeded gate's) packed and checked
 *             (dp_routing_pack), split by the placement into per-duck sections of bank
 *             slots (dp_routing_split), each routed duck's section made a table of its
 *             own, its rows renumbered (dp_routing_wire_unicast);
 *   dispatch  each routed duck gets its table, then its rows straight from the
 *             activation by iovec (nothing copied), in FORWARD|ROUTED datagrams: one
 *             sendmmsg for the whole forward, each of its messages a UDP GSO send of up
 *             to 44 datagrams of one duck;
 *   combine   the output zeroed while the ducks compute, then recvmmsg of their
 *             PARTIAL|ROUTED chunks with UDP GRO (a duck's GSO train arrives whole, as at
 *             the dataplane; --no-gro: one by one), poll() when none is queued, each
 *             chunk added in float32
 *             to the output rows its duck's row map names (dp_accumulate, the dataplane's
 *             kernel).
 * No NACKs, no resends: a forward whose partials are not all in within --timeout-ms is
 * lost and the next one starts. The placement is the client's default (contiguous blocks:
 * expert e on duck e * ducks / experts), one replica each; each duck is announced a MOE
 * layer of its experts, one column each (echo reads no weights). Start the emulator with
 * --compute echo: a duck answers each of its rows r with the sum over its entries of
 * weight * (id + 1) * x[r], so after the timed forwards the last output is checked
 * against that sum computed here.
 *
 * Output, one line per timed forward (nanoseconds):
 *   fwd E2E SEND RECV_WINDOW MAX_COMPUTE SUM_COMPUTE LOST ROUTE
 * (E2E from the start of route to the last partial added; SEND the sendmmsg; ROUTE the
 * route step and the datagrams' headers and iovecs), then `bytes WIRE_BYTES FORWARDS`
 * (table and row bytes sent, headers not counted: what the dataplane's moe_bytes counts),
 * `cpu CPU_NS FORWARDS` (getrusage over the timed forwards) and `check REL_ERR` (max |out -
 * want| / max |want| of the last forward, run again untimed while it loses a datagram;
 * exit 3 when it is past the dtype's rounding or still incomplete; --out writes that
 * output). The activation is x[i] = ((i % 97) - 48) / 100 in the dtype.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "dp_abi.h"
#include "dp_f16.h"
#include "dp_floor.h"
#include "dp_gro.h"
#include "dp_reduce.h"
#include "dp_routing.h"
#include "dp_wire.h"

/* ------------------------------------------------------------------ tunables */
#define MOE_LAYER 0x7f12u     /* the layer id the MoE floor announces (dense: 0x7f10) */
#define MOE_BURST 16u         /* receives per recvmmsg, each up to 64 KiB (UDP GRO) */
#define MOE_RX_BUF 65536u     /* one receive: a GRO train of datagrams, or one */
#define MOE_TX_MSGS 1024u     /* messages per sendmmsg (UIO_MAXIOV) */
#define MOE_GSO_SEGS 44u      /* 44 x 1472 bytes fit in one 64 KiB GSO send */
#define MOE_MAX_IOV 1024u     /* iovecs of one message (UIO_MAXIOV) */
#define MOE_TABLES 8u         /* the built-in gate's tables, used in turn */
#define MOE_GROUPS 8u         /* the built-in gate: DeepSeek-V3's 8 groups, 4 kept */
#define MOE_GROUPS_KEPT 4u
#define MOE_ROUTED_SCALE 2.5f /* DeepSeek-V3's routed_scaling_factor */

/* ------------------------------------------------------------------- options */
static uint32_t o_ducks = 8, o_base_port, o_first_id, o_hidden = 7168, o_tokens = 1;
static uint32_t o_experts = 256, o_topk = 8, o_seed = 1;
static uint8_t o_dtype = DP_DTYPE_F16;
static uint64_t o_iters = 100, o_warmup = 10, o_timeout_ms = 500;
static uint64_t o_session = 0x666c6f6f72ull; /* "floor" */
static const char *o_routing, *o_out;
static int o_gro = 1, o_spin;

/* --------------------------------------------------------------------- state */

/* One routed duck of the current forward: where its table and rows are, what it owes. */
struct routed {
	uint32_t index;       /* 0..ducks-1: its socket address and LAYER */
	uint16_t *map;        /* reply row i is output row map[i] */
	uint32_t rows;        /* rows sent and owed back */
	const uint8_t *table; /* its unicast table, tsize bytes */
	uint64_t tsize;
	uint32_t chunks_in, got; /* its partial's chunks (from the first one in), seen */
	uint64_t compute_ns;
};

static int g_fd;
static uint32_t g_isz, g_payload, g_segs, g_ntables;
static uint64_t g_row_bytes;
static struct sockaddr_in g_addr[FLOOR_MAX_DUCKS];
static uint8_t *g_x;                /* tokens x hidden, dtype: the activation */
static float *g_out;                /* tokens x hidden, float32: the combined output */
static int32_t *g_idx;              /* tables x tokens x topk: the gate's expert ids */
static float *g_w;                  /* tables x tokens x topk: their weights */
static uint8_t *g_host, *g_wire, *g_utab;
static uint64_t g_host_cap, g_wire_cap, g_utab_cap;
static uint16_t *g_maps;            /* ducks x tokens: every routed duck's row map */
static struct dp_routing_placement g_pl;
static uint16_t g_slots[DP_MAX_EXPERTS * DP_MAX_REPLICAS], g_per_duck[DP_MAX_DUCKS];
static struct routed g_rd[FLOOR_MAX_DUCKS];
static int32_t g_rd_of[FLOOR_MAX_DUCKS]; /* duck index -> its g_rd entry this forward, or -1 */
static uint32_t g_nrd;
static struct dp_wire_header *g_hdr; /* one per datagram of the forward */
static struct iovec *g_iov;
static struct mmsghdr *g_tx;
static char (*g_ctrl)[CMSG_SPACE(sizeof(uint16_t))];
static uint64_t g_dgram_cap, g_iov_cap, g_msg_cap;
static uint8_t (*rx_buf)[MOE_RX_BUF];
static char rx_ctrl[MOE_BURST][CMSG_SPACE(sizeof(int))];
static struct iovec rx_iov[MOE_BURST];
static struct mmsghdr rx_msg[MOE_BURST];

static void *alloc_or_die(size_t n, const char *what)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
	if (!p)
		floor_die("out of memory for %s (%zu bytes)", what, n);
	memset(p, 0, n); /* touches every page before timing */
	return p;
}

/* ------------------------------------------------------------------ the gate */

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12; /* xorshift64* */
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

/* The index of the largest of n scores not yet taken (taken[i] != 0), or -1. */
static int32_t best_of(const float *score, const uint8_t *taken, uint32_t n)
{
	int32_t b = -1;
	for (uint32_t i = 0; i < n; i++)
		if (!taken[i] && (b < 0 || score[i] > score[b]))
			b = (int32_t)i;
	return b;
}

/* One token's choices, DeepSeek-V3-like: sigmoid-like scores in (0, 1), 8 groups scored
 * by their two best experts, the 4 best groups kept, the topk best experts of those
 * (distinct), weights their scores normalised and scaled by 2.5. Without 8 groups that
 * hold topk experts in 4, the topk best of all. */
static void gate_token(uint64_t *rng, int32_t *idx, float *w)
{
	static float score[DP_MAX_EXPERTS];
	static uint8_t taken[DP_MAX_EXPERTS];
	uint32_t E = o_experts, per = E / MOE_GROUPS;
	for (uint32_t e = 0; e < E; e++) {
		score[e] = (float)((rng_next(rng) >> 11) + 1) / (float)(1ull << 53);
		taken[e] = 0;
	}
	if (E % MOE_GROUPS == 0 && per >= 2 && o_topk <= per * MOE_GROUPS_KEPT) {
		float gscore[MOE_GROUPS];
		uint8_t gtaken[MOE_GROUPS] = { 0 };
		for (uint32_t g = 0; g < MOE_GROUPS; g++) {
			float a = 0, b = 0; /* its two best */
			for (uint32_t e = g * per; e < (g + 1) * per; e++) {
				if (score[e] > a) {
					b = a;
					a = score[e];
				} else if (score[e] > b) {
					b = score[e];
				}
			}
			gscore[g] = a + b;
		}
		for (uint32_t k = 0; k < MOE_GROUPS_KEPT; k++)
			gtaken[best_of(gscore, gtaken, MOE_GROUPS)] = 1;
		for (uint32_t e = 0; e < E; e++) /* experts of dropped groups are out */
			taken[e] = !gtaken[e / per];
	}
	float sum = 0;
	for (uint32_t k = 0; k < o_topk; k++) {
		int32_t e = best_of(score, taken, E);
		taken[e] = 1;
		idx[k] = e;
		w[k] = score[e];
		sum += score[e];
	}
	for (uint32_t k = 0; k < o_topk; k++)
		w[k] = w[k] / sum * MOE_ROUTED_SCALE;
}

/* --routing FILE: int32 ids [R][tokens][topk], then float32 weights [R][tokens][topk]. */
static void read_routing(void)
{
	FILE *f = fopen(o_routing, "rb");
	if (!f)
		floor_die("--routing %s: %s", o_routing, strerror(errno));
	uint64_t one = (uint64_t)o_tokens * o_topk;
	if (fseek(f, 0, SEEK_END) < 0)
		floor_die("--routing %s: cannot seek: %s", o_routing, strerror(errno));
	long len = ftell(f);
	rewind(f);
	if (len <= 0 || (uint64_t)len % (one * 8) || (uint64_t)len / (one * 8) > 4096)
		floor_die("--routing %s: %ld bytes are not 1..4096 tables of %u tokens x %u (8 "
			  "bytes a choice: int32 ids, then float32 weights)",
			  o_routing, len, o_tokens, o_topk);
	g_ntables = (uint32_t)((uint64_t)len / (one * 8));
	g_idx = alloc_or_die(g_ntables * one * 4, "the routing ids");
	g_w = alloc_or_die(g_ntables * one * 4, "the routing weights");
	if (fread(g_idx, 4, g_ntables * one, f) != g_ntables * one ||
	    fread(g_w, 4, g_ntables * one, f) != g_ntables * one)
		floor_die("--routing %s: short read", o_routing);
	fclose(f);
}

static void make_routing(void)
{
	if (o_routing) {
		read_routing();
		return;
	}
	uint64_t one = (uint64_t)o_tokens * o_topk, rng = 0x9e3779b97f4a7c15ull ^ o_seed;
	g_ntables = MOE_TABLES;
	g_idx = alloc_or_die(g_ntables * one * 4, "the routing ids");
	g_w = alloc_or_die(g_ntables * one * 4, "the routing weights");
	for (uint64_t t = 0; t < g_ntables * (uint64_t)o_tokens; t++)
		gate_token(&rng, g_idx + t * o_topk, g_w + t * o_topk);
}

/* ------------------------------------------------------------------ the route */

/* Duck index of expert e: the client's default placement, contiguous blocks. */
static uint32_t duck_of(uint32_t e)
{
	return (uint32_t)((uint64_t)e * o_ducks / o_experts);
}

static void make_placement(void)
{
	char why[160];
	g_pl.n_experts = o_experts;
	for (uint32_t e = 0; e < o_experts; e++) {
		g_pl.replicas[e] = 1;
		g_pl.ducks[e * DP_MAX_REPLICAS] = (uint16_t)(o_first_id + duck_of(e));
	}
	if (dp_routing_placement_check(&g_pl, why, sizeof(why)) < 0)
		floor_die("the placement: %s", why);
	dp_routing_bank_slots(&g_pl, g_slots, g_per_duck);
}

/* Table r's host table, split and cut into each routed duck's unicast table and row map
 * (g_rd). Exits on a refusal: the tables are the floor's own, a refusal is a bug or a
 * --routing file that is not a gate's. */
static void route(uint32_t r)
{
	char why[192];
	uint64_t one = (uint64_t)o_tokens * o_topk, hsize = g_host_cap /* the table's size */, wsize, targets[DP_MAX_DUCKS / 64];
	int rc = dp_routing_pack(g_idx + r * one, 4, g_w + r * one, o_tokens, o_topk, o_experts,
				 g_host, g_host_cap, why, sizeof(why));
	if (rc < 0)
		floor_die("routing table %u: %s", r, why);
	rc = dp_routing_split(g_host, hsize, &g_pl, g_slots, 0, NULL, g_wire, g_wire_cap, &wsize,
			      targets, why, sizeof(why));
	if (rc < 0)
		floor_die("routing table %u: split: %s", r, why);
	g_nrd = 0;
	uint64_t at = 0;
	for (uint32_t d = 0; d < o_ducks; d++) {
		uint32_t id = o_first_id + d;
		g_rd_of[d] = -1;
		if (!(targets[id >> 6] >> (id & 63) & 1))
			continue;
		struct routed *rd = &g_rd[g_nrd];
		uint64_t tsize;
		rd->map = g_maps + (uint64_t)g_nrd * o_tokens;
		rc = dp_routing_wire_unicast(g_wire, wsize, (uint16_t)id, g_utab + at,
					     g_utab_cap - at, rd->map, o_tokens, &tsize, why,
					     sizeof(why));
		if (rc < 0)
			floor_die("routing table %u: duck %u's table: %s", r, id, why);
		struct dp_routing_wire_header h;
		memcpy(&h, g_utab + at, sizeof(h));
		rd->index = d;
		rd->rows = h.rows;
		rd->table = g_utab + at;
		rd->tsize = tsize;
		rd->chunks_in = rd->got = 0;
		rd->compute_ns = 0;
		g_rd_of[d] = (int32_t)g_nrd++;
		at += tsize;
	}
}

/* ------------------------------------------------------------------ dispatch */

/* Where the bytes of one duck's message come from, piece by piece: its table, then each
 * of its rows in the activation. */
struct cursor {
	const struct routed *rd;
	uint32_t piece; /* 0: the table; 1 + i: row map[i] */
	uint64_t at;    /* bytes of the piece already taken */
};

static void piece(const struct cursor *c, const uint8_t **p, uint64_t *len)
{
	if (c->piece == 0) {
		*p = c->rd->table;
		*len = c->rd->tsize;
	} else {
		*p = g_x + (uint64_t)c->rd->map[c->piece - 1] * g_row_bytes;
		*len = g_row_bytes;
	}
}

/* The iovecs of n bytes of the message from c on, written at iov; their count. */
static uint32_t take(struct cursor *c, uint64_t n, struct iovec *iov)
{
	uint32_t k = 0;
	while (n) {
		const uint8_t *p;
		uint64_t len;
		piece(c, &p, &len);
		uint64_t m = len - c->at < n ? len - c->at : n;
		iov[k++] = (struct iovec){ .iov_base = (void *)(p + c->at), .iov_len = m };
		n -= m;
		c->at += m;
		if (c->at == len) {
			c->piece++;
			c->at = 0;
		}
	}
	return k;
}

/* Every datagram of forward fwd, as sendmmsg messages of up to g_segs datagrams of one
 * duck (UDP GSO when more than one): their count; *bytes gets the tables' and rows'. */
static uint32_t build(uint64_t fwd, uint64_t *bytes)
{
	uint64_t nd = 0, ni = 0;
	uint32_t nm = 0;
	*bytes = 0;
	for (uint32_t i = 0; i < g_nrd; i++) {
		const struct routed *rd = &g_rd[i];
		uint64_t total = rd->tsize + (uint64_t)rd->rows * g_row_bytes;
		uint32_t chunks = dp_wire_chunk_count(total, g_payload);
		struct dp_wire_header tpl;
		dp_wire_init(&tpl, DP_WIRE_OP_FORWARD, o_session, 1);
		tpl.flags = DP_WIRE_FLAG_ROUTED;
		tpl.dtype = o_dtype;
		tpl.forward_id = fwd;
		tpl.layer = MOE_LAYER;
		tpl.duck = (uint16_t)(o_first_id + rd->index);
		tpl.chunks = chunks;
		tpl.total = total;
		tpl.rows = rd->rows;
		struct cursor cur = { .rd = rd };
		*bytes += total;
		for (uint32_t c = 0; c < chunks; c += g_segs) {
			uint32_t nseg = chunks - c < g_segs ? chunks - c : g_segs;
			uint64_t first_iov = ni;
			for (uint32_t s = c; s < c + nseg; s++) {
				struct dp_wire_header *h = &g_hdr[nd++];
				*h = tpl;
				h->chunk = s;
				h->offset = (uint64_t)s * g_payload;
				h->length = dp_wire_chunk_len(total, g_payload, s);
				g_iov[ni++] = (struct iovec){ .iov_base = h, .iov_len = DP_WIRE_HDR_LEN };
				ni += take(&cur, h->length, &g_iov[ni]);
			}
			struct mmsghdr *m = &g_tx[nm];
			m->msg_hdr = (struct msghdr){ .msg_name = &g_addr[rd->index],
						      .msg_namelen = sizeof(g_addr[0]),
						      .msg_iov = &g_iov[first_iov],
						      .msg_iovlen = ni - first_iov };
			if (nseg > 1) { /* one datagram needs no segmentation */
				m->msg_hdr.msg_control = g_ctrl[nm];
				m->msg_hdr.msg_controllen = sizeof(g_ctrl[nm]);
				struct cmsghdr *cm = CMSG_FIRSTHDR(&m->msg_hdr);
				cm->cmsg_level = SOL_UDP;
				cm->cmsg_type = UDP_SEGMENT;
				cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
				uint16_t gso = (uint16_t)(DP_WIRE_HDR_LEN + g_payload);
				memcpy(CMSG_DATA(cm), &gso, sizeof(gso));
			}
			nm++;
		}
	}
	return nm;
}

static void send_all(uint32_t n)
{
	uint32_t done = 0;
	while (done < n) {
		uint32_t batch = n - done < MOE_TX_MSGS ? n - done : MOE_TX_MSGS;
		int r = sendmmsg(g_fd, g_tx + done, batch, 0);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS)
				continue;
			floor_die("sendmmsg() failed: %s", strerror(errno));
		}
		done += (uint32_t)r;
	}
}

/* ------------------------------------------------------------------- combine */

struct fwd_result {
	uint64_t first_rx, last_rx, max_compute, sum_compute;
	uint32_t lost;
};

/* One partial chunk of routed duck rd: added into the output rows its map names. */
static void add_chunk(const struct routed *rd, const struct dp_wire_header *h, const uint8_t *p)
{
	uint64_t first = h->offset / g_isz, row = first / o_hidden;
	uint32_t col = (uint32_t)(first % o_hidden), n = h->length / g_isz;
	while (n) {
		uint32_t seg = o_hidden - col < n ? o_hidden - col : n; /* the rest of this row */
		dp_accumulate(g_out + (uint64_t)rd->map[row] * o_hidden, col, p, seg, o_dtype);
		p += (size_t)seg * g_isz;
		n -= seg;
		row++;
		col = 0;
	}
}

/* A datagram of forward fwd: added when it is a partial chunk a routed duck owes; 1 when it
 * completed that duck's partial. Anything else (acks, a lost forward's late chunks, a
 * chunk that does not fit what the duck was sent) is skipped. */
static int take_partial(uint64_t fwd, const uint8_t *buf, uint32_t len, uint64_t t,
			struct fwd_result *res)
{
	const struct dp_wire_header *h = (const void *)buf;
	if (dp_wire_check(buf, len) != DP_WIRE_OK || h->op != DP_WIRE_OP_PARTIAL ||
	    h->session != o_session || h->forward_id != fwd || h->duck < o_first_id ||
	    h->duck >= o_first_id + o_ducks || g_rd_of[h->duck - o_first_id] < 0)
		return 0;
	struct routed *rd = &g_rd[g_rd_of[h->duck - o_first_id]];
	uint64_t want = (uint64_t)rd->rows * g_row_bytes;
	if (h->rows != rd->rows || h->total != want || h->dtype != o_dtype ||
	    h->offset % g_isz || h->length % g_isz || h->offset > want ||
	    h->length > want - h->offset || (rd->chunks_in && h->chunks != rd->chunks_in) ||
	    rd->got == h->chunks)
		return 0;
	if (!res->first_rx)
		res->first_rx = t;
	res->last_rx = t;
	if (rd->got++ == 0) {
		rd->chunks_in = h->chunks;
		rd->compute_ns = h->compute_ns;
		res->sum_compute += h->compute_ns;
		if (h->compute_ns > res->max_compute)
			res->max_compute = h->compute_ns;
	}
	add_chunk(rd, h, dp_wire_payload(buf));
	return rd->got == rd->chunks_in;
}

static void receive(uint64_t fwd, uint64_t deadline, struct fwd_result *res)
{
	uint32_t done = 0;
	memset(res, 0, sizeof(*res));
	while (done < g_nrd) {
		int n = recvmmsg(g_fd, rx_msg, MOE_BURST, MSG_DONTWAIT, NULL);
		if (n <= 0) {
			if (n < 0 && errno != EAGAIN && errno != EINTR)
				floor_die("recvmmsg() failed: %s", strerror(errno));
			uint64_t t = floor_now_ns();
			if (t >= deadline)
				break;
			if (o_spin)
				continue;
			struct pollfd p = { .fd = g_fd, .events = POLLIN };
			poll(&p, 1, (int)((deadline - t + 999999) / 1000000));
			continue;
		}
		uint64_t t = floor_now_ns();
		for (int i = 0; i < n; i++) {
			struct msghdr *m = &rx_msg[i].msg_hdr;
			struct dp_gro_cursor cur;
			uint8_t *p;
			uint32_t len;
			dp_gro_start(&cur, rx_buf[i], rx_msg[i].msg_len, dp_gro_cmsg_size(m),
				     m->msg_flags & MSG_TRUNC);
			while (dp_gro_next(&cur, &p, &len))
				done += (uint32_t)take_partial(fwd, p, len, t, res);
			m->msg_controllen = sizeof(rx_ctrl[i]); /* the kernel shortened it */
		}
	}
	res->lost = g_nrd - done;
}

/* ------------------------------------------------------------------- the check */

static float x_at(uint64_t i)
{
	if (o_dtype == DP_DTYPE_F32) {
		float v;
		memcpy(&v, g_x + i * 4, 4);
		return v;
	}
	uint16_t b;
	memcpy(&b, g_x + i * 2, 2);
	return dp_half_to_f32(b, o_dtype);
}

/* max |out - want| / max |want| for table r, where want[t] = sum over t's choices of
 * weight * (its duck's id + 1) * x[t], what echo ducks answer. */
static double check(uint32_t r)
{
	uint64_t one = (uint64_t)o_tokens * o_topk;
	double err = 0, top = 0;
	for (uint32_t t = 0; t < o_tokens; t++) {
		double k = 0;
		for (uint32_t j = 0; j < o_topk; j++) {
			int32_t e = g_idx[r * one + (uint64_t)t * o_topk + j];
			if (e >= 0)
				k += (double)g_w[r * one + (uint64_t)t * o_topk + j] *
				     (o_first_id + duck_of((uint32_t)e) + 1);
		}
		for (uint32_t c = 0; c < o_hidden; c++) {
			uint64_t i = (uint64_t)t * o_hidden + c;
			double want = k * x_at(i), d = fabs((double)g_out[i] - want);
			err = d > err ? d : err;
			top = fabs(want) > top ? fabs(want) : top;
		}
	}
	return err / (top > 1e-30 ? top : 1e-30);
}

/* --out FILE: the last forward's output, for a test to check on its own. */
static void write_out(void)
{
	FILE *f = fopen(o_out, "wb");
	uint64_t n = (uint64_t)o_tokens * o_hidden;
	if (!f || fwrite(g_out, sizeof(float), n, f) != n || fclose(f) != 0)
		floor_die("--out %s: %s", o_out, strerror(errno));
}

/* --------------------------------------------------------------------- setup */

static void setup(void)
{
	g_isz = dp_dtype_size(o_dtype);
	g_row_bytes = (uint64_t)o_hidden * g_isz;
	g_payload = dp_wire_payload_max(FLOOR_MTU);
	g_fd = floor_socket();
	for (uint32_t d = 0; d < o_ducks; d++)
		g_addr[d] = (struct sockaddr_in){ .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)(o_base_port + d)),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	uint64_t n = (uint64_t)o_tokens * o_hidden;
	g_x = alloc_or_die(n * g_isz, "the activation");
	for (uint64_t i = 0; i < n; i++) { /* small values, exact in every dtype's range */
		float v = (float)((int)(i % 97) - 48) * 0.01f;
		if (o_dtype == DP_DTYPE_F32) {
			memcpy(g_x + i * 4, &v, 4);
		} else {
			uint16_t b = dp_f32_to_half(v, o_dtype);
			memcpy(g_x + i * 2, &b, 2);
		}
	}
	g_out = alloc_or_die(n * sizeof(float), "the output");
	uint64_t entries = (uint64_t)o_tokens * o_topk;
	dp_routing_size(o_tokens, o_topk, &g_host_cap);
	dp_routing_wire_size(o_ducks, entries, &g_wire_cap);
	g_utab_cap = (uint64_t)o_ducks * (DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE) +
		     entries * DP_ROUTING_WIRE_ENTRY_SIZE;
	g_host = alloc_or_die(g_host_cap, "the host table");
	g_wire = alloc_or_die(g_wire_cap, "the wire table");
	g_utab = alloc_or_die(g_utab_cap, "the unicast tables");
	g_maps = alloc_or_die((uint64_t)o_ducks * o_tokens * sizeof(uint16_t), "the row maps");
	/* the most a forward can send: every duck every row, each with its table */
	uint64_t most = g_utab_cap / o_ducks + entries * DP_ROUTING_WIRE_ENTRY_SIZE +
			(uint64_t)o_tokens * g_row_bytes;
	uint32_t per_dgram = 1 + 2 + (uint32_t)(g_payload / g_row_bytes) + 1; /* header, pieces */
	g_segs = MOE_MAX_IOV / per_dgram < MOE_GSO_SEGS ? MOE_MAX_IOV / per_dgram : MOE_GSO_SEGS;
	if (g_segs < 1)
		floor_die("hidden %u: a datagram would need more than %u iovecs", o_hidden,
			  MOE_MAX_IOV);
	g_dgram_cap = (uint64_t)o_ducks * dp_wire_chunk_count(most, g_payload);
	g_iov_cap = g_dgram_cap * per_dgram;
	g_msg_cap = g_dgram_cap; /* at most one message a datagram */
	g_hdr = alloc_or_die(g_dgram_cap * sizeof(*g_hdr), "the datagram headers");
	g_iov = alloc_or_die(g_iov_cap * sizeof(*g_iov), "the iovecs");
	g_tx = alloc_or_die(g_msg_cap * sizeof(*g_tx), "the messages");
	g_ctrl = alloc_or_die(g_msg_cap * sizeof(*g_ctrl), "the GSO controls");
	/* UDP GRO: a duck's GSO send of its partial arrives whole, as the dataplane's socket
	 * backend takes it (and the emulator's kernel is spared cutting it up for us) */
	int on = 1;
	if (o_gro && setsockopt(g_fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) < 0)
		floor_die("setsockopt(UDP_GRO) failed: %s; try --no-gro", strerror(errno));
	rx_buf = alloc_or_die(MOE_BURST * sizeof(*rx_buf), "the receive buffers");
	for (uint32_t i = 0; i < MOE_BURST; i++) {
		rx_iov[i] = (struct iovec){ .iov_base = rx_buf[i], .iov_len = MOE_RX_BUF };
		rx_msg[i].msg_hdr = (struct msghdr){ .msg_iov = &rx_iov[i],
						     .msg_iovlen = 1,
						     .msg_control = rx_ctrl[i],
						     .msg_controllen = sizeof(rx_ctrl[i]) };
	}
	make_placement();
	make_routing();
	for (uint32_t d = 0; d < o_ducks; d++) {
		uint32_t id = o_first_id + d;
		struct dp_wire_layer w = {
			.kind = DP_MLP_KIND_MOE,
			.dtype = o_dtype,
			.experts = g_per_duck[id],
			.hidden = o_hidden,
			.ffn = g_per_duck[id], /* one column an expert: echo reads none */
			.expert_ffn = 1,
		};
		floor_announce(g_fd, &g_addr[d], id, MOE_LAYER, o_session, &w);
	}
}

/* ------------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " --moe --base-port P [options]\n"
		"  --ducks N           ducks on 127.0.0.1:P..P+N-1 (1..32, default 8)\n"
		"  --first-id K        id of the first duck (default 0)\n"
		"  --hidden H          activation columns (default 7168)\n"
		"  --tokens T          activation rows (1..4096, default 1)\n"
		"  --experts E         routed experts, placed in contiguous blocks (ducks..1024, "
		"default 256)\n"
		"  --topk K            experts per token (1..16, default 8)\n"
		"  --dtype D           f32, f16 or bf16 (default f16)\n"
		"  --seed S            the built-in gate's seed (default 1)\n"
		"  --routing FILE      the gate's choices instead: int32 ids [R][T][K], then float32\n"
		"                      weights [R][T][K]; forward i uses table i %% R\n"
		"  --out FILE          write the last forward's output there (float32 [T][H])\n"
		"  --no-gro            receive datagram by datagram, without UDP GRO\n"
		"  --spin              poll the socket without sleeping (default: poll() when idle)\n"
		"  --iters N           timed forwards (default 100)\n"
		"  --warmup N          untimed forwards first (default 10)\n"
		"  --timeout-ms MS     a forward not complete by then is lost (default 500)\n"
		"  --session S         session cookie (default 0x666c6f6f72)\n");
}

static void parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "moe", no_argument, NULL, 'm' },
		{ "ducks", required_argument, NULL, 'n' },
		{ "base-port", required_argument, NULL, 'p' },
		{ "first-id", required_argument, NULL, 'f' },
		{ "hidden", required_argument, NULL, 'H' },
		{ "tokens", required_argument, NULL, 'T' },
		{ "experts", required_argument, NULL, 'E' },
		{ "topk", required_argument, NULL, 'K' },
		{ "dtype", required_argument, NULL, 'd' },
		{ "seed", required_argument, NULL, 'S' },
		{ "routing", required_argument, NULL, 'R' },
		{ "out", required_argument, NULL, 'o' },
		{ "no-gro", no_argument, NULL, 'G' },
		{ "spin", no_argument, NULL, 'P' },
		{ "iters", required_argument, NULL, 'i' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "timeout-ms", required_argument, NULL, 't' },
		{ "session", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': break;
		case 'n': o_ducks = (uint32_t)floor_parse_u64("ducks", optarg, 1, FLOOR_MAX_DUCKS); break;
		case 'p': o_base_port = (uint32_t)floor_parse_u64("base-port", optarg, 1, 65535); break;
		case 'f': o_first_id = (uint32_t)floor_parse_u64("first-id", optarg, 0, DP_MAX_DUCKS - 1); break;
		case 'H': o_hidden = (uint32_t)floor_parse_u64("hidden", optarg, 1, 1u << 20); break;
		case 'T': o_tokens = (uint32_t)floor_parse_u64("tokens", optarg, 1, DP_MAX_TOKENS); break;
		case 'E': o_experts = (uint32_t)floor_parse_u64("experts", optarg, 1, DP_MAX_EXPERTS); break;
		case 'K': o_topk = (uint32_t)floor_parse_u64("topk", optarg, 1, DP_MAX_TOPK); break;
		case 'S': o_seed = (uint32_t)floor_parse_u64("seed", optarg, 0, UINT32_MAX); break;
		case 'R': o_routing = optarg; break;
		case 'o': o_out = optarg; break;
		case 'G': o_gro = 0; break;
		case 'P': o_spin = 1; break;
		case 'i': o_iters = floor_parse_u64("iters", optarg, 1, 10000000); break;
		case 'w': o_warmup = floor_parse_u64("warmup", optarg, 0, 10000000); break;
		case 't': o_timeout_ms = floor_parse_u64("timeout-ms", optarg, 1, 60000); break;
		case 's': o_session = floor_parse_u64("session", optarg, 1, UINT64_MAX); break;
		case 'd':
			if (!strcmp(optarg, "f32"))
				o_dtype = DP_DTYPE_F32;
			else if (!strcmp(optarg, "f16"))
				o_dtype = DP_DTYPE_F16;
			else if (!strcmp(optarg, "bf16"))
				o_dtype = DP_DTYPE_BF16;
			else
				floor_die("--dtype %s: expected f32, f16 or bf16", optarg);
			break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (!o_base_port || o_base_port + o_ducks > 65536 || o_first_id + o_ducks > DP_MAX_DUCKS) {
		usage(stderr);
		exit(2);
	}
	if (o_experts < o_ducks || o_topk > o_experts)
		floor_die("%u experts on %u ducks, %u a token: every duck needs an expert, every "
			  "token topk distinct ones",
			  o_experts, o_ducks, o_topk);
}

/* ---------------------------------------------------------------------- main */

/* One forward of table r: route, send, receive. Times into t[0..3]; bytes sent into *sent. */
static void forward(uint64_t fwd, uint32_t r, uint64_t *t, uint64_t *sent, struct fwd_result *res)
{
	t[0] = floor_now_ns();
	route(r);
	uint32_t nm = build(fwd, sent);
	t[1] = floor_now_ns();
	send_all(nm);
	t[2] = floor_now_ns();
	/* zeroed while the ducks compute: the first partial is microseconds away */
	memset(g_out, 0, (uint64_t)o_tokens * o_hidden * sizeof(float));
	receive(fwd, t[2] + o_timeout_ms * 1000000ull, res);
	t[3] = floor_now_ns();
}

int floor_moe_main(int argc, char **argv)
{
	parse_args(argc, argv);
	setup();
	uint64_t cpu0 = 0, bytes = 0, sent = 0, t[4], k;
	struct fwd_result res = { 0 };
	uint32_t r = 0;
	for (k = 0; k < o_warmup + o_iters; k++) {
		if (k == o_warmup)
			cpu0 = floor_cpu_ns();
		r = (uint32_t)(k % g_ntables);
		forward(k + 1, r, t, &sent, &res);
		if (k >= o_warmup) {
			bytes += sent;
			printf("fwd %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
			       " %u %" PRIu64 "\n",
			       t[3] - t[0], t[2] - t[1], res.first_rx ? res.last_rx - res.first_rx : 0,
			       res.max_compute, res.sum_compute, res.lost, t[1] - t[0]);
		}
	}
	uint64_t cpu = floor_cpu_ns() - cpu0;
	/* the check needs a whole output: a last forward that lost a datagram (no NACKs here)
	 * is followed by a few more, untimed */
	for (uint32_t again = 0; res.lost && again < 5; again++, k++)
		forward(k + 1, r, t, &sent, &res);
	printf("bytes %" PRIu64 " %" PRIu64 "\n", bytes, o_iters);
	printf("cpu %" PRIu64 " %" PRIu64 "\n", cpu, o_iters);
	double err = res.lost ? NAN : check(r);
	printf("check %.3g\n", err);
	if (o_out)
		write_out();
	/* a partial rounded to the dtype, at most topk of them added */
	double tol = o_dtype == DP_DTYPE_F32 ? 1e-5 : o_dtype == DP_DTYPE_F16 ? 4e-3 : 3e-2;
	if (!(err <= tol)) {
		fprintf(stderr, PROG ": the last forward's output is %s (relative error %.3g, "
				"allowed %.1g): are the ducks running with --compute echo?\n",
			res.lost ? "incomplete, six times over" : "wrong", err, tol);
		return 3;
	}
	return 0;
}
