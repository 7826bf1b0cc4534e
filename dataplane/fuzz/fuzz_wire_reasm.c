/* fuzz_wire_reasm: datagrams from the network into one forward's reassembly and sum.
 *
 * What a rogue duck or a spoofed packet controls is every byte of a datagram; the
 * worker (dp_worker.c receive, dp_gather.c dp_gather_on_partial/dp_gather_on_nack)
 * takes it through dp_wire_check, the sender/session/forward/epoch filters,
 * dp_partial_admit, dp_accumulate into a float32 buffer of exactly the forward's
 * size, and resends activation chunks a NACK lists. This harness runs that path
 * over a sequence of datagrams against one forward in flight, with every buffer
 * allocated to its exact size so that ASan reports any byte outside it, and checks
 * what the sum relies on: a duck whose reassembly completes has added every element
 * of the message exactly once.
 *
 * The receive filters are static in dp_worker.c and dp_gather_on_nack needs a worker's
 * view (struct dp_gather_view: its transmit batch, an open backend); the copies here
 * follow them line for line (marked "worker:"), and dp_partial_admit is the shared
 * header.
 *
 * Input: an 8-byte scenario, then datagrams, each a one-byte frame tag and the
 * datagram: tag 0, its size is what its header's `length` says (so that a mutated
 * length moves the datagram's end with it, as a real duck's would); any other tag,
 * a little-endian u16 size follows (a datagram that disagrees with its header).
 * The scenario:
 *   [0] bit 0: a 2-byte dtype (else float32), bit 1: bfloat16 (else float16)
 *   [1..2] elements, u16 (0 reads as 1)
 *   [3..4] MTU - 128, u16               [5] ducks on this NIC - 1 (mod 4)
 *   [6..7] unused
 * Session 0x5e55, epoch 7, forward id 0x30001 (context 1 of 2) are fixed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_partial.h"
#include "dp_reasm.h"
#include "dp_reduce.h"
#include "dp_wire.h"

#define SESSION 0x5e55u
#define EPOCH 7u
#define NFWDS 2u
#define FWD_ID ((3ull << 16) | 1u)
#define MAX_DUCKS 4u

struct duck {
	struct dp_reasm reasm;
	uint32_t chunk_bytes;
	uint8_t state; /* worker: 0 waiting, 1 answered, 2 holds no such layer */
	uint8_t *adds; /* per element: how many times this duck's chunks added it */
};

struct fwd {
	uint8_t dtype;
	uint32_t item;
	uint64_t bytes, elems;
	uint32_t payload;
	uint8_t *act;                 /* the activation the NACK path resends from */
	struct dp_wire_header *hdrs;  /* worker: dp_gather_accept's prepared FORWARD headers */
	uint32_t chunks;
	float *acc;
	uint32_t nducks;
	int16_t duck_index[256];
	struct duck ducks[MAX_DUCKS];
	uint64_t owned[NFWDS];
	volatile uint64_t sink;       /* keeps the resend reads */
};

static uint16_t get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* worker: dp_tx_activation, reduced to the bytes it hands the kernel */
static void resend(struct fwd *f, uint32_t first, uint32_t n)
{
	for (uint32_t c = first; c < first + n; c++) {
		const struct dp_wire_header *h = &f->hdrs[c];
		uint64_t s = 0;
		for (uint32_t i = 0; i < h->length; i++)
			s += f->act[h->offset + i];
		f->sink += s;
	}
}

static void on_partial(struct fwd *f, const struct dp_wire_header *h, const uint8_t *payload,
		       uint32_t d)
{
	struct duck *rx = &f->ducks[d];
	if (rx->state != 0)
		return;
	if (dp_partial_admit(h, f->bytes, f->dtype, &rx->reasm, &rx->chunk_bytes) != DP_PARTIAL_ADD)
		return;
	uint64_t first = h->offset / f->item;
	uint32_t n = h->length / f->item;
	dp_accumulate(f->acc, first, payload, n, f->dtype);
	for (uint32_t i = 0; i < n; i++)
		rx->adds[first + i]++;
	if (dp_reasm_complete(&rx->reasm)) {
		rx->state = 1;
		for (uint64_t e = 0; e < f->elems; e++)
			if (rx->adds[e] != 1)
				abort(); /* a complete reassembly that missed or doubled an element */
	}
}

static void on_nack(struct fwd *f, const struct dp_wire_header *h, const uint8_t *payload,
		    uint32_t d)
{
	if (h->flags & DP_WIRE_FLAG_NO_LAYER) {
		if (f->ducks[d].state == 0)
			f->ducks[d].state = 2;
		return;
	}
	if (!(h->flags & DP_WIRE_FLAG_INPUT))
		return;
	const uint8_t *list = payload;
	uint32_t n = h->length / sizeof(uint32_t);
	if (n == 0)
		resend(f, 0, f->chunks);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c;
		memcpy(&c, list + (size_t)i * sizeof(c), sizeof(c));
		if (c < f->chunks)
			resend(f, c, 1);
	}
}

/* worker: receive(), for one datagram already copied into its own buffer */
static void receive_one(struct fwd *f, const uint8_t *buf, size_t len)
{
	struct dp_wire_header hdr;
	if (dp_wire_read(buf, len, &hdr) != DP_WIRE_OK)
		return;
	const struct dp_wire_header *h = &hdr;
	const uint8_t *payload = buf + DP_WIRE_HDR_LEN;
	if (h->duck > 255 || f->duck_index[h->duck] < 0) /* worker: sender_duck */
		return;
	uint32_t d = (uint32_t)f->duck_index[h->duck];
	if (h->session != SESSION || h->op == DP_WIRE_OP_PONG)
		return;
	uint32_t index = (uint32_t)(h->forward_id & 0xFFFF); /* worker: owned_fwd */
	if (index >= NFWDS || f->owned[index] != h->forward_id)
		return;
	if (h->epoch != EPOCH)
		return;
	if (h->op == DP_WIRE_OP_PARTIAL)
		on_partial(f, h, payload, d);
	else if (h->op == DP_WIRE_OP_NACK)
		on_nack(f, h, payload, d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 8)
		return 0;
	struct fwd f;
	memset(&f, 0, sizeof(f));
	/* bit 0: a 2-byte dtype; bit 1: bfloat16 (widened and rounded in lanes of its own) */
	f.dtype = data[0] & 1 ? (data[0] & 2 ? DP_DTYPE_BF16 : DP_DTYPE_F16) : DP_DTYPE_F32;
	f.item = dp_dtype_size(f.dtype);
	f.elems = get_u16(data + 1) ? get_u16(data + 1) : 1;
	f.bytes = f.elems * f.item;
	f.payload = dp_wire_payload_max(128u + get_u16(data + 3));
	f.nducks = 1 + data[5] % MAX_DUCKS;
	f.chunks = dp_wire_chunk_count(f.bytes, f.payload);
	memset(f.duck_index, -1, sizeof(f.duck_index));
	for (uint32_t d = 0; d < f.nducks; d++)
		f.duck_index[d] = (int16_t)d;
	f.owned[1] = FWD_ID;

	f.act = malloc(f.bytes);
	f.hdrs = calloc(f.chunks, sizeof(*f.hdrs));
	f.acc = calloc(f.elems, sizeof(float));
	if (!f.act || !f.hdrs || !f.acc)
		abort();
	memset(f.act, 0x3c, f.bytes);
	for (uint32_t c = 0; c < f.chunks; c++) { /* worker: dp_gather_accept */
		struct dp_wire_header *h = &f.hdrs[c];
		dp_wire_init(h, DP_WIRE_OP_FORWARD, SESSION, EPOCH);
		h->chunk = c;
		h->chunks = f.chunks;
		h->offset = (uint64_t)c * f.payload;
		h->total = f.bytes;
		h->length = dp_wire_chunk_len(f.bytes, f.payload, c);
	}
	for (uint32_t d = 0; d < f.nducks; d++) {
		f.ducks[d].adds = calloc(f.elems, 1);
		if (!f.ducks[d].adds)
			abort();
	}

	/* Each datagram in a buffer of its own size, as the backend's receive buffer
	 * would hold it, so that a read past the datagram is a read past the buffer; and
	 * 2 bytes past an 8-byte boundary, where a DPDK port hands it up (behind 42 bytes
	 * of Ethernet/IPv4/UDP headers), so that UBSan reports a misaligned read. */
	size_t pos = 8;
	while (pos < size) {
		size_t len;
		if (data[pos++] == 0) {
			struct dp_wire_header h;
			if (size - pos < sizeof(h))
				break;
			memcpy(&h, data + pos, sizeof(h));
			len = (size_t)DP_WIRE_HDR_LEN + h.length;
		} else {
			if (size - pos < 2)
				break;
			len = get_u16(data + pos);
			pos += 2;
		}
		if (len > size - pos)
			len = size - pos;
		uint8_t *mem = malloc(2 + (len ? len : 1));
		if (!mem)
			abort();
		uint8_t *dg = mem + 2;
		memcpy(dg, data + pos, len);
		receive_one(&f, dg, len);
		free(mem);
		pos += len;
	}

	/* worker: dp_fwd_complete, when every duck answered: the store reads the whole sum */
	int all = 1;
	for (uint32_t d = 0; d < f.nducks; d++)
		all &= f.ducks[d].state == 1;
	if (all) {
		void *res = malloc(f.bytes);
		if (!res)
			abort();
		dp_reduce_store(res, f.acc, NULL, 1, (uint32_t)f.elems, f.dtype);
		free(res);
	}

	for (uint32_t d = 0; d < f.nducks; d++)
		free(f.ducks[d].adds);
	free(f.act);
	free(f.hdrs);
	free(f.acc);
	return 0;
}
