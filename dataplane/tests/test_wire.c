/* test_wire.c: datagram checks (every verdict), the chunking arithmetic, and a reply
 * read where a DPDK port hands it up (at any alignment, as the worker reads it).
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_partial.h"
#include "dp_reduce.h"
#include "dp_wire.h"
#include "test_check.h"

static void hdr(struct dp_wire_header *h, uint8_t op)
{
	dp_wire_init(h, op, 1, 2);
	h->chunks = 2;
	h->chunk = 1;
	h->total = 100;
	h->offset = 60;
	h->length = 40;
}

static void test_wire(void)
{
	static uint8_t buf[DP_WIRE_HDR_LEN + 128] __attribute__((aligned(8)));
	struct dp_wire_header *h = (void *)buf;
	size_t len = DP_WIRE_HDR_LEN + 40;

	hdr(h, DP_WIRE_OP_FORWARD);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_OK, "a good FORWARD");
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN - 1) == DP_WIRE_SHORT, "short");
	CHECK(dp_wire_check(buf, 0) == DP_WIRE_SHORT, "empty");
	h->magic ^= 1;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_MAGIC, "bad magic");
	hdr(h, DP_WIRE_OP_FORWARD);
	h->version = DP_WIRE_VERSION + 1;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_VERSION, "bad version");
	hdr(h, 0);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_OP, "op 0");
	hdr(h, DP_WIRE_OP_LAYER + 1);
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_OP, "op past LAYER");
	hdr(h, DP_WIRE_OP_FORWARD);
	CHECK(dp_wire_check(buf, len + 1) == DP_WIRE_BAD_LENGTH, "length mismatch");
	h->length = UINT32_MAX;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "length 2^32-1");
	hdr(h, DP_WIRE_OP_PARTIAL);
	h->chunk = 2;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "chunk == chunks");
	h->chunk = 0;
	h->chunks = 0;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "zero chunks");
	hdr(h, DP_WIRE_OP_WEIGHT);
	h->offset = 61;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "offset + length > total");
	h->offset = 101;
	h->length = 0;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN) == DP_WIRE_BAD_LENGTH, "offset > total");
	h->offset = UINT64_MAX - 10;
	h->length = 40;
	CHECK(dp_wire_check(buf, len) == DP_WIRE_BAD_LENGTH, "offset near 2^64");
	hdr(h, DP_WIRE_OP_NACK);
	h->length = 6;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 6) == DP_WIRE_BAD_LENGTH, "NACK of 6 bytes");
	h->length = 8;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 8) == DP_WIRE_OK, "NACK of 2 chunks");
	hdr(h, DP_WIRE_OP_LAYER);
	h->length = sizeof(struct dp_wire_layer);
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + h->length) == DP_WIRE_OK, "LAYER");
	h->length = 12;
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN + 12) == DP_WIRE_BAD_LENGTH, "LAYER of 12 bytes");
	dp_wire_init(h, DP_WIRE_OP_PING, 5, 6);
	CHECK(dp_wire_check(buf, DP_WIRE_HDR_LEN) == DP_WIRE_OK, "PING");
	CHECK(h->session == 5 && h->epoch == 6 && h->chunks == 0, "init fields");
	CHECK(!strcmp(dp_wire_verdict_name(DP_WIRE_BAD_MAGIC), "bad_magic") &&
		      !strcmp(dp_wire_verdict_name((enum dp_wire_verdict)42), "unknown"),
	      "verdict names");

	CHECK(dp_wire_payload_max(1500) == 1392, "payload at 1500: %u", dp_wire_payload_max(1500));
	CHECK(dp_wire_payload_max(9000) == 8892, "payload at 9000: %u", dp_wire_payload_max(9000));
	CHECK(dp_wire_payload_max(65536) + DP_WIRE_HDR_LEN <= DP_WIRE_MAX_DATAGRAM,
	      "payload at 65536: %u", dp_wire_payload_max(65536));
	CHECK(dp_wire_payload_max(1501) % 4 == 0, "payload rounds to floats");
	CHECK(dp_wire_chunk_count(0, 1392) == 1, "zero bytes is one chunk");
	CHECK(dp_wire_chunk_count(1392, 1392) == 1 && dp_wire_chunk_count(1393, 1392) == 2,
	      "chunk count at the boundary");
	CHECK(dp_wire_chunk_len(1393, 1392, 0) == 1392 && dp_wire_chunk_len(1393, 1392, 1) == 1 &&
		      dp_wire_chunk_len(1393, 1392, 2) == 0,
	      "chunk lengths");
	CHECK(dp_wire_chunk_len(2784, 1392, 1) == 1392, "last full chunk");
}

static void test_chunk_size(void)
{
	struct dp_wire_header h;
	hdr(&h, DP_WIRE_OP_PARTIAL);
	h.total = 1000;
	h.chunks = 3;
	h.chunk = 0;
	h.offset = 0;
	h.length = 400;
	CHECK(dp_wire_chunk_size(&h) == 400, "first of three");
	h.chunk = 1;
	h.offset = 400;
	CHECK(dp_wire_chunk_size(&h) == 400, "middle");
	h.chunk = 2;
	h.offset = 800;
	h.length = 200;
	CHECK(dp_wire_chunk_size(&h) == 400, "short last");
	h.chunks = 4; /* 1000 bytes in 400-byte chunks are 3, not 4 */
	h.chunk = 0;
	h.offset = 0;
	h.length = 400;
	CHECK(dp_wire_chunk_size(&h) == 0, "a lying chunk count");
	h.chunks = 3;
	h.chunk = 1;
	h.offset = 401;
	CHECK(dp_wire_chunk_size(&h) == 0, "a misplaced offset");
	h.chunk = 2;
	h.offset = 800;
	h.length = 100;
	CHECK(dp_wire_chunk_size(&h) == 0, "a last chunk that does not end the message");
	h.chunks = 1;
	h.chunk = 0;
	h.offset = 0;
	h.length = 1000;
	CHECK(dp_wire_chunk_size(&h) == 1000, "one chunk");
	h.chunks = 5000;
	h.chunk = 4999;
	CHECK(dp_wire_chunk_size(&h) == 0, "last of 5000 at offset 0");
}

/* The worker's receive path on a datagram that does not start at an 8-byte boundary:
 * a DPDK port's UDP payload sits 2 bytes past one (headroom 128 + 42 bytes of headers),
 * and nothing moves it. Header by copy (dp_wire_read, and dp_wire_check), the partial's
 * admission on the copy, the payload summed in place (dp_accumulate), a NACK's chunk
 * list read in place as dp_gather_on_nack reads it. A misaligned struct or u32 read is
 * undefined behaviour: the sanitizer build (-fsanitize=undefined, no recovery) ends
 * this test there. */
static void test_read_at_any_alignment(void)
{
	static uint8_t mem[8 + DP_WIRE_HDR_LEN + 64] __attribute__((aligned(8)));
	float vals[12]; /* 8 through dp_accumulate's vector loop, 4 through its tail */
	for (int i = 0; i < 12; i++)
		vals[i] = (float)(i - 4) * 0.75f;
	for (size_t at = 1; at < 8; at++) {
		/* a PARTIAL: chunk 1 of 2 of 24 float32 values, values 12..23 */
		struct dp_wire_header w;
		dp_wire_init(&w, DP_WIRE_OP_PARTIAL, 0x5e55, 7);
		w.dtype = DP_DTYPE_F32;
		w.forward_id = 0x30001;
		w.duck = 3;
		w.chunks = 2;
		w.chunk = 1;
		w.total = 96;
		w.offset = 48;
		w.length = 48;
		w.compute_ns = 12345;
		uint8_t *buf = mem + at;
		memset(mem, 0xee, sizeof(mem));
		memcpy(buf, &w, sizeof(w));
		memcpy(buf + DP_WIRE_HDR_LEN, vals, sizeof(vals));
		size_t len = DP_WIRE_HDR_LEN + sizeof(vals);

		CHECK(dp_wire_check(buf, len) == DP_WIRE_OK, "check at offset %zu", at);
		struct dp_wire_header h;
		memset(&h, 0, sizeof(h));
		CHECK(dp_wire_read(buf, len, &h) == DP_WIRE_OK, "read at offset %zu", at);
		CHECK(h.magic == DP_WIRE_MAGIC && h.session == 0x5e55 && h.epoch == 7 &&
			      h.forward_id == 0x30001 && h.duck == 3 && h.chunk == 1 &&
			      h.offset == 48 && h.length == 48 && h.compute_ns == 12345,
		      "the header copied whole at offset %zu", at);
		CHECK(dp_wire_read(buf, DP_WIRE_HDR_LEN - 1, &h) == DP_WIRE_SHORT,
		      "short at offset %zu", at);

		struct dp_reasm r;
		memset(&r, 0, sizeof(r));
		uint32_t chunk_bytes = 0;
		CHECK(dp_partial_admit(&h, 96, DP_DTYPE_F32, &r, &chunk_bytes) == DP_PARTIAL_ADD,
		      "admitted at offset %zu", at);
		float acc[24];
		for (int i = 0; i < 24; i++)
			acc[i] = 1.0f;
		dp_accumulate(acc, h.offset / 4, buf + DP_WIRE_HDR_LEN, h.length / 4, DP_DTYPE_F32);
		int wrong = -1;
		for (int i = 0; i < 24 && wrong < 0; i++)
			if (acc[i] != 1.0f + (i >= 12 ? vals[i - 12] : 0.0f))
				wrong = i;
		CHECK(wrong < 0, "float32 summed at offset %zu: element %d is %g", at, wrong,
		      wrong < 0 ? 0.0 : (double)acc[wrong]);
		uint16_t halves[12];
		for (int i = 0; i < 12; i++)
			halves[i] = dp_f32_to_f16(vals[i]);
		memcpy(buf + DP_WIRE_HDR_LEN, halves, sizeof(halves));
		for (int i = 0; i < 12; i++)
			acc[i] = 1.0f;
		dp_accumulate(acc, 0, buf + DP_WIRE_HDR_LEN, 12, DP_DTYPE_F16);
		for (int i = 0; i < 12 && wrong < 0; i++)
			if (acc[i] != 1.0f + vals[i])
				wrong = i;
		CHECK(wrong < 0, "float16 summed at offset %zu: element %d", at, wrong);

		/* a NACK listing chunks 5 and 9 */
		dp_wire_init(&w, DP_WIRE_OP_NACK, 0x5e55, 7);
		w.flags = DP_WIRE_FLAG_INPUT;
		w.length = 8;
		const uint32_t list[2] = { 5, 9 };
		memcpy(buf, &w, sizeof(w));
		memcpy(buf + DP_WIRE_HDR_LEN, list, sizeof(list));
		CHECK(dp_wire_read(buf, DP_WIRE_HDR_LEN + 8, &h) == DP_WIRE_OK &&
			      h.op == DP_WIRE_OP_NACK,
		      "NACK read at offset %zu", at);
		const uint8_t *p = buf + DP_WIRE_HDR_LEN;
		uint32_t got[2];
		for (uint32_t i = 0; i < h.length / 4; i++)
			memcpy(&got[i], p + (size_t)i * 4, 4);
		CHECK(got[0] == 5 && got[1] == 9, "NACK list at offset %zu", at);
	}
}

int main(void)
{
	test_wire();
	test_chunk_size();
	test_read_at_any_alignment();
	return test_result("test_wire");
}
