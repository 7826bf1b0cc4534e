/* dp_backend_null.c: no network. Every duck a datagram reaches answers at once.
 *
 * What the worker sends is answered by the backend itself, as the ducks of the
 * NIC would, on the next rx_burst:
 *
 *   FORWARD chunk -> a PARTIAL chunk from each duck it reached (the broadcast
 *                    address: every duck of the NIC; a duck's address: that duck),
 *                    with the same geometry, compute_ns 0, and as payload the
 *                    activation chunk itself: each duck's partial is x, so the
 *                    forward's result is n * x + b_down (n: the ducks that
 *                    answered), exactly where n * x is representable (always for
 *                    float16, n <= 256).
 *   LAYER, WEIGHT -> WEIGHT_ACK (weights are acknowledged and dropped)
 *   PING          -> PONG
 *   NACK          -> NACK|INPUT with an empty list ("send me all of it"): a null
 *                    duck keeps no outputs, so it asks for the input again.
 *
 * Replies come from the duck's configured address, with the request's session
 * and epoch, so every check of the receive path runs as for real ducks. This is
 * how the handoff (client ring -> dispatcher -> worker -> result slot) is
 * measured without a network, and a test double for clients. No allocation after
 * open: activation chunks wait in a byte ring, replies in a job ring (each job
 * answered by one duck or by all of the NIC's); when either is full the datagram
 * is dropped and counted in tx_errors, as a full socket buffer would be, and
 * NACKs recover it.
 *
 * One copy per chunk, not two: a PARTIAL's header and payload are kept together in
 * the byte ring, and the reply of a job's last duck is handed to the worker where it
 * lies (its header's duck written in place); the other ducks of a broadcast job get a
 * copy in rx_bufs. What a burst handed out stays in the ring until the next rx_burst
 * (the buffers are the backend's until then: dp_backend.h), so tx_burst cannot write
 * over it meanwhile.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dp_backend.h"
#include "dp_common.h"
#include "dp_wire.h"

#define RX_BURST 64
#define JOBS 32768u            /* replies waiting, a power of two */
#define DATA_BYTES (32u << 20) /* activation chunks waiting to be answered */
#define ALL_DUCKS 0xFFFFu
#define GSO_MAX_SEGMENTS 64

struct null_job {
	struct dp_wire_header h; /* the reply; h.duck is set per answering duck */
	uint64_t data;           /* PARTIAL: free-running offset of [header|payload] in data */
	uint64_t data_end;       /* the data ring's head once this job is done */
	uint16_t duck;           /* index in priv.ducks, or ALL_DUCKS */
	uint16_t next;           /* ALL_DUCKS: the next of priv.ducks to answer */
};

struct null_duck {
	uint16_t id;
	struct sockaddr_in addr;
};

struct null_priv {
	uint32_t nducks;
	struct null_duck ducks[DP_MAX_DUCKS];
	uint32_t max_payload;
	struct null_job *jobs;
	uint32_t job_head, job_tail; /* free-running, masked on access */
	uint8_t *data;
	uint64_t data_head, data_tail; /* free-running byte positions */
	uint64_t data_lent;            /* data_head once the last burst's buffers are given back */
	uint8_t *rx_bufs;              /* RX_BURST datagrams of max_payload + header */
	size_t rx_stride;              /* one datagram's room, 64-byte aligned: headers are read
					* as structs (an mtu of 9000 left them misaligned) */
	uint8_t *joined;               /* a payload sent in pieces (dp_tx_message), joined */
};

static int null_open(struct dp_backend *b)
{
	const struct dp_config *all = b->config;
	struct null_priv *p = calloc(1, sizeof(*p));
	if (!p) {
		dp_set_error("out of memory for the null backend");
		return -1;
	}
	for (uint32_t i = 0; i < all->nducks; i++)
		if (all->ducks[i].nic == b->nic)
			p->ducks[p->nducks++] = (struct null_duck){ .id = all->ducks[i].id,
								    .addr = all->ducks[i].addr };
	p->max_payload = dp_wire_payload_max(b->cfg->mtu);
	p->jobs = calloc(JOBS, sizeof(*p->jobs));
	p->data = malloc(DATA_BYTES);
	p->rx_stride = ((size_t)DP_WIRE_HDR_LEN + p->max_payload + 63) & ~(size_t)63;
	p->rx_bufs = aligned_alloc(64, RX_BURST * p->rx_stride);
	p->joined = malloc(p->max_payload);
	if (!p->jobs || !p->data || !p->rx_bufs || !p->joined) {
		free(p->joined);
		free(p->jobs);
		free(p->data);
		free(p->rx_bufs);
		free(p);
		dp_set_error("out of memory for the null backend's %u MiB of queues", DATA_BYTES >> 20);
		return -1;
	}
	/* fault every page in now: the first forwards must not pay for it */
	memset(p->data, 0, DATA_BYTES);
	memset(p->rx_bufs, 0, RX_BURST * p->rx_stride);
	b->gso = true; /* any number of datagrams per message: the worker batches them */
	b->max_gso_segments = GSO_MAX_SEGMENTS;
	b->priv = p;
	return 0;
}

static void null_close(struct dp_backend *b)
{
	struct null_priv *p = b->priv;
	if (!p)
		return;
	free(p->jobs);
	free(p->data);
	free(p->rx_bufs);
	free(p->joined);
	free(p);
	b->priv = NULL;
}

static bool same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
	return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port;
}

/* Who a datagram to dst reaches: ALL_DUCKS, a duck's index, or -1 (nobody). */
static int reached(const struct dp_backend *b, const struct null_priv *p,
		   const struct sockaddr_in *dst)
{
	if (b->cfg->use_broadcast && same_addr(dst, &b->cfg->broadcast))
		return ALL_DUCKS;
	for (uint32_t i = 0; i < p->nducks; i++)
		if (same_addr(dst, &p->ducks[i].addr))
			return (int)i;
	return -1;
}

/* A reply job for the request h (with `len` payload bytes to keep), or NULL when full. */
static struct null_job *job_push(struct null_priv *p, const struct dp_wire_header *req,
				 uint8_t op, uint16_t duck, const void *payload, uint32_t len)
{
	if (p->job_tail - p->job_head == JOBS)
		return NULL;
	/* Nothing queued and nothing lent: start again at the ring's start, so that the
	 * same few hot pages carry every forward instead of a walk through 32 MiB (which
	 * made each copy a DRAM-bound one). */
	if (p->data_head == p->data_tail && p->data_lent == p->data_tail)
		p->data_head = p->data_lent = p->data_tail =
			(p->data_tail + DATA_BYTES - 1) & ~(uint64_t)(DATA_BYTES - 1);
	uint64_t at = p->data_tail;
	if (len) {
		/* room for the reply's header before the payload: rx_burst hands both out */
		uint64_t room = ((uint64_t)DP_WIRE_HDR_LEN + len + 63) & ~(uint64_t)63;
		uint64_t room_to_end = DATA_BYTES - at % DATA_BYTES;
		if (room_to_end < room)
			at += room_to_end; /* never wrap a chunk: skip to the ring's start */
		if (at + room - p->data_head > DATA_BYTES)
			return NULL;
		memcpy(p->data + at % DATA_BYTES + DP_WIRE_HDR_LEN, payload, len);
		p->data_tail = at + room; /* 64-byte aligned: headers are read as structs */
	}
	struct null_job *j = &p->jobs[p->job_tail++ & (JOBS - 1)];
	dp_wire_init(&j->h, op, req->session, req->epoch);
	j->h.dtype = req->dtype;
	j->h.forward_id = req->forward_id;
	j->h.layer = req->layer;
	j->data = at;
	j->data_end = p->data_tail;
	j->duck = duck;
	j->next = 0;
	return j;
}

/* One datagram the worker sent: queue what the ducks it reached would answer. */
static bool answer(struct null_priv *p, uint16_t duck, const struct dp_wire_header *h,
		   const void *payload)
{
	struct null_job *j;
	switch (h->op) {
	case DP_WIRE_OP_FORWARD:
		if (h->length > p->max_payload)
			return false;
		if (!(j = job_push(p, h, DP_WIRE_OP_PARTIAL, duck, payload, h->length)))
			return false;
		j->h.chunk = h->chunk;
		j->h.chunks = h->chunks;
		j->h.offset = h->offset;
		j->h.total = h->total;
		j->h.length = h->length;
		j->h.rows = h->rows;
		return true;
	case DP_WIRE_OP_LAYER:
	case DP_WIRE_OP_WEIGHT:
		if (!(j = job_push(p, h, DP_WIRE_OP_WEIGHT_ACK, duck, NULL, 0)))
			return false;
		j->h.tensor = h->op == DP_WIRE_OP_LAYER ? DP_WIRE_LAYER_TENSOR : h->tensor;
		j->h.chunk = h->chunk;
		j->h.chunks = h->chunks;
		j->h.offset = h->offset;
		j->h.total = h->op == DP_WIRE_OP_LAYER ? 0 : h->total;
		return true;
	case DP_WIRE_OP_PING:
		return job_push(p, h, DP_WIRE_OP_PONG, duck, NULL, 0) != NULL;
	case DP_WIRE_OP_NACK:
		if (!(j = job_push(p, h, DP_WIRE_OP_NACK, duck, NULL, 0)))
			return false;
		j->h.flags = DP_WIRE_FLAG_INPUT;
		return true;
	default:
		return true; /* nothing a duck answers */
	}
}

static uint32_t null_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
{
	struct null_priv *p = b->priv;
	uint64_t datagrams = 0, bytes = 0, dropped = 0;
	for (uint32_t m = 0; m < n; m++) {
		const struct dp_tx *t = &tx[m];
		int who = reached(b, p, t->dst);
		/* the pieces are a header per datagram, then its payload in one piece or (a
		 * message sent from where its rows are: dp_tx_message) in several */
		for (uint32_t i = 0; i < t->iovcnt;) {
			const struct iovec *hv = &t->iov[i++];
			if (hv->iov_len != DP_WIRE_HDR_LEN) {
				dropped++;
				continue;
			}
			const struct dp_wire_header *h = hv->iov_base;
			const void *payload = NULL;
			if (h->length && i < t->iovcnt && t->iov[i].iov_len == h->length) {
				payload = t->iov[i++].iov_base;
			} else if (h->length) {
				uint32_t got = 0;
				while (got < h->length && got <= p->max_payload && i < t->iovcnt &&
				       t->iov[i].iov_len <= p->max_payload - got) {
					memcpy(p->joined + got, t->iov[i].iov_base, t->iov[i].iov_len);
					got += (uint32_t)t->iov[i++].iov_len;
				}
				if (got != h->length) {
					dropped++;
					continue;
				}
				payload = p->joined;
			}
			datagrams++;
			bytes += DP_WIRE_HDR_LEN + h->length;
			if (who >= 0 && !answer(p, (uint16_t)who, h, payload))
				dropped++; /* a queue is full: lost, as in a full socket buffer */
		}
		if (t->gso_size && t->datagrams > 1)
			dp_count(b->counters, DP_C_gso_sends, 1);
	}
	dp_count(b->counters, DP_C_tx_packets, datagrams);
	dp_count(b->counters, DP_C_tx_bytes, bytes);
	if (dropped)
		dp_count(b->counters, DP_C_tx_errors, dropped);
	return n;
}

static uint32_t null_rx_burst(struct dp_backend *b, struct dp_rx *rx, uint32_t n)
{
	struct null_priv *p = b->priv;
	uint32_t got = 0;
	if (n > RX_BURST)
		n = RX_BURST;
	p->data_head = p->data_lent; /* the last burst's buffers are ours again */
	while (got < n && p->job_head != p->job_tail) {
		struct null_job *j = &p->jobs[p->job_head & (JOBS - 1)];
		uint32_t d = j->duck == ALL_DUCKS ? j->next : j->duck;
		bool last = j->duck != ALL_DUCKS || (uint32_t)j->next + 1 >= p->nducks;
		if (d < p->nducks) {
			uint32_t len = j->h.op == DP_WIRE_OP_PARTIAL ? j->h.length : 0;
			uint8_t *buf;
			j->h.duck = p->ducks[d].id;
			if (len && last) { /* in place: nobody else answers from this record */
				buf = p->data + j->data % DATA_BYTES;
				memcpy(buf, &j->h, DP_WIRE_HDR_LEN);
			} else {
				buf = p->rx_bufs + (size_t)got * p->rx_stride;
				memcpy(buf, &j->h, DP_WIRE_HDR_LEN);
				if (len)
					memcpy(buf + DP_WIRE_HDR_LEN,
					       p->data + j->data % DATA_BYTES + DP_WIRE_HDR_LEN, len);
			}
			rx[got++] = (struct dp_rx){ .buf = buf, .len = DP_WIRE_HDR_LEN + len,
						    .src = p->ducks[d].addr };
		}
		if (!last) {
			j->next++;
			continue;
		}
		p->data_lent = j->data_end; /* freed at the next rx_burst, not before */
		p->job_head++;
	}
	return got;
}

/* The answers are made when the worker sends: they wait in the queue, no fd to poll. */
static bool null_rx_ready(struct dp_backend *b)
{
	const struct null_priv *p = b->priv;
	return p->job_head != p->job_tail;
}

const struct dp_backend_ops dp_backend_null = {
	.name = "null",
	.open = null_open,
	.close = null_close,
	.tx_burst = null_tx_burst,
	.rx_burst = null_rx_burst,
	.rx_ready = null_rx_ready,
};
