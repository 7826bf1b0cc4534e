/* test_gather.c: a forward on one NIC (dp_gather.c), through its view alone: no world,
 * no worker, no socket. The view is made by hand (two ducks on the NIC, unicast fan-out),
 * the transmit batch goes to a backend that writes down what it was given, and the
 * clock is the test's (`now` is an argument of every call but the accept's, which reads
 * the real one: the times below count from the part's wait_start).
 *
 *   the RTO estimator  RFC 6298: the first reply time R sets srtt = R, rttvar = R/2;
 *                      later ones move them (rttvar falls 32x slower than it rises);
 *                      rto = srtt + max(G, 4 rttvar) within [nack_min, nack_max];
 *                      Karn: no sample from a duck that was NACKed
 *   NACK timing        a duck is NACKed once its partial made no progress for its RTO,
 *                      not a nanosecond before, for the chunks it has not sent, at most
 *                      64 a NACK; each NACK doubles its RTO up to nack_max; its own NACKs
 *                      for input are answered once per nack interval, each chunk once
 *   first write / add  a chunk's first contribution is stored over whatever the result
 *                      slot held, later ones added; a duplicate is not added again; a
 *                      duck whose chunks are cut on another grid still sums right
 *
 * Exit 0 pass, 1 fail. */
#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_gather.h"
#include "dp_tx.h"
#include "dp_wire.h"
#include "test_check.h"

#define MS 1000000ull
#define US 1000ull
#define SESSION 0x5e55u
#define EPOCH 3u
#define PAYLOAD 16u   /* bytes a datagram: 4 float32 values */
#define MAX_CHUNKS 128u
#define DUCK_A 3u
#define DUCK_B 5u
#define NACK_NS (1 * MS)
#define NACK_MIN_NS (200 * US)
#define NACK_MAX_NS (10 * MS)

/* --- a backend that writes down what it was given ---------------------------------- */

struct sent {
	uint8_t op;
	uint16_t port;    /* the destination's: which duck */
	uint32_t chunk;   /* FORWARD: the first chunk of the message */
	uint32_t datagrams;
	uint32_t list[64]; /* NACK: the chunks it asks for */
	uint32_t nlist;
};

static struct sent sent[4096];
static uint32_t nsent;

static uint32_t fake_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
{
	(void)b;
	for (uint32_t i = 0; i < n && nsent < sizeof(sent) / sizeof(sent[0]); i++) {
		const struct dp_wire_header *h = tx[i].iov[0].iov_base;
		struct sent *s = &sent[nsent++];
		*s = (struct sent){ .op = h->op, .port = ntohs(tx[i].dst->sin_port),
				    .chunk = h->chunk, .datagrams = tx[i].datagrams };
		if (h->op == DP_WIRE_OP_NACK) {
			s->nlist = h->length / 4;
			memcpy(s->list, tx[i].iov[1].iov_base, h->length);
		}
	}
	return n;
}

static const struct dp_backend_ops fake_ops = { .name = "fake", .tx_burst = fake_tx_burst };

/* What went out since the last call, by op and duck. */
static uint32_t count_sent(struct dp_tx_batch *tx, uint8_t op, uint16_t port)
{
	dp_tx_flush(tx);
	uint32_t n = 0;
	for (uint32_t i = 0; i < nsent; i++)
		n += sent[i].op == op && (!port || sent[i].port == port) ? sent[i].datagrams : 0;
	return n;
}

/* --- the view and a forward, by hand --------------------------------------------------- */

static struct dp_backend be = { .ops = &fake_ops };
static struct dp_tx_batch tx = { .be = &be, .session = SESSION, .payload = PAYLOAD };
static int16_t duck_index[DP_MAX_DUCKS];
static struct dp_duck_cfg duck_cfg[2];
static struct dp_nic_cfg nic_cfg = { .name = "eth0", .use_broadcast = false };
static uint16_t ducks[2] = { DUCK_A, DUCK_B };
static struct dp_rto rto[DP_MAX_DUCKS];
static struct dp_counters counters;
static struct dp_wire_header hdrs[MAX_CHUNKS];
static float scratch[MAX_CHUNKS * PAYLOAD / 4];
static struct dp_reasm summed, nack_seen;

static struct dp_gather_view view = {
	.limits = { .nack_ns = NACK_NS, .nack_min_ns = NACK_MIN_NS, .nack_max_ns = NACK_MAX_NS },
	.session = SESSION,
	.duck_index = duck_index,
	.duck_cfg = duck_cfg,
	.nic_cfg = &nic_cfg,
	.nic = 0,
	.payload = PAYLOAD,
	.nducks = 2,
	.ducks = ducks,
	.rto = rto,
	.counters = &counters,
	.tx = &tx,
	.hdrs = hdrs,
	.max_chunks = MAX_CHUNKS,
	.scratch = scratch,
	.scratch_floats = MAX_CHUNKS * PAYLOAD / 4,
	.summed = &summed,
	.nack_seen = &nack_seen,
};

static struct dp_client client;
static struct dp_layer layer = { .id = 7, .dtype = DP_DTYPE_F32 };
static struct dp_duck_rx rx[2];
static float act[MAX_CHUNKS * PAYLOAD / 4];
static float res[MAX_CHUNKS * PAYLOAD / 4];
static struct dp_fwd fwd;

static void setup_view(void)
{
	memset(duck_index, 0xff, sizeof(duck_index));
	for (uint32_t i = 0; i < 2; i++) {
		duck_index[ducks[i]] = (int16_t)i;
		duck_cfg[i] = (struct dp_duck_cfg){ .id = ducks[i], .nic = 0 };
		duck_cfg[i].addr.sin_family = AF_INET;
		duck_cfg[i].addr.sin_port = htons((uint16_t)(9000 + ducks[i]));
	}
	for (uint32_t i = 0; i < 2; i++)
		rto[ducks[i]] = (struct dp_rto){ .rto = NACK_NS }; /* as the worker starts them */
	memset(&counters, 0, sizeof(counters));
}

/* A dense float32 forward of `floats` values (1 row) to both ducks, accepted: its
 * activation went out, its result slot holds `garbage` (the sum must not read it). */
static struct dp_fwd *start_forward(uint32_t floats, float garbage)
{
	struct dp_fwd *f = &fwd;
	memset(f, 0, sizeof(*f));
	layer.hidden = floats;
	f->wire_id = 1u << 16;
	f->kind = DP_FWD_FORWARD;
	f->client = &client;
	f->layer = &layer;
	f->desc.epoch = EPOCH;
	f->rows = 1;
	f->bytes = (uint64_t)floats * 4;
	f->act = (const uint8_t *)act;
	f->res = (uint8_t *)res;
	f->nic_mask = 1;
	f->nics_pending = 1;
	f->rx = rx;
	f->targets[0] = 1ull << DUCK_A | 1ull << DUCK_B;
	for (uint32_t i = 0; i < sizeof(res) / sizeof(res[0]); i++)
		res[i] = garbage;
	nsent = 0;
	dp_gather_accept(&view, f);
	return f;
}

/* Duck's value for element i: distinct per duck, exact in float32 when added. */
static float value(uint32_t duck, uint32_t i)
{
	return (float)(duck * 1000 + i);
}

/* Chunk c of duck's partial, cut into chunks of `cut` bytes, at `now`. */
static uint32_t partial(struct dp_fwd *f, uint32_t duck, uint32_t cut, uint32_t c, uint64_t now)
{
	float vals[MAX_CHUNKS * PAYLOAD / 4];
	struct dp_wire_header h;
	dp_wire_init(&h, DP_WIRE_OP_PARTIAL, SESSION, EPOCH);
	h.dtype = DP_DTYPE_F32;
	h.forward_id = f->wire_id;
	h.layer = layer.id;
	h.duck = (uint16_t)duck;
	h.chunk = c;
	h.chunks = dp_wire_chunk_count(f->bytes, cut);
	h.offset = (uint64_t)c * cut;
	h.total = f->bytes;
	h.length = dp_wire_chunk_len(f->bytes, cut, c);
	h.rows = f->rows;
	for (uint32_t i = 0; i < h.length / 4; i++)
		vals[i] = value(duck, (uint32_t)(h.offset / 4) + i);
	return dp_gather_on_partial(&view, f, &h, (const uint8_t *)vals, duck, 0, now);
}

/* duck's whole partial on the activation's grid; the last call's status. */
static uint32_t answer(struct dp_fwd *f, uint32_t duck, uint64_t now)
{
	uint32_t status = DP_STATUS_PENDING;
	for (uint32_t c = 0; c < dp_wire_chunk_count(f->bytes, PAYLOAD); c++)
		status = partial(f, duck, PAYLOAD, c, now);
	return status;
}

static uint64_t wait_start(const struct dp_fwd *f)
{
	return f->part[0].wait_start;
}

/* --- the RTO estimator ---------------------------------------------------------------- */

/* Duck A answers one forward whole after r ns: one RTT sample. */
static void sample(uint64_t r)
{
	struct dp_fwd *f = start_forward(10, 0.0f);
	answer(f, DUCK_A, wait_start(f) + r);
}

static void test_first_sample_sets_srtt_and_half_of_it_as_rttvar(void)
{
	setup_view();
	sample(2 * MS);
	const struct dp_rto *e = &rto[DUCK_A];
	CHECK(e->sampled, "a complete answer is a sample");
	CHECK(e->srtt == 2 * MS, "srtt %lu, want R", (unsigned long)e->srtt);
	CHECK(e->rttvar == 1 * MS, "rttvar %lu, want R/2", (unsigned long)e->rttvar);
	CHECK(e->rto == 6 * MS, "rto %lu, want srtt + 4 rttvar = 3R", (unsigned long)e->rto);
	CHECK(counters.v[DP_C_rto_samples] == 1, "rto_samples %lu",
	      (unsigned long)counters.v[DP_C_rto_samples]);
	/* 2 ms > the 1 ms nack_us: a fixed timeout would have NACKed it */
	CHECK(counters.v[DP_C_nacks_avoided] == 1, "nacks_avoided %lu",
	      (unsigned long)counters.v[DP_C_nacks_avoided]);
	CHECK(rto[DUCK_B].rto == NACK_NS && !rto[DUCK_B].sampled, "the other duck's is its own");
}

static void test_later_samples_move_srtt_by_an_eighth_and_rttvar_up_fast_down_slow(void)
{
	setup_view();
	sample(2 * MS);
	sample(4 * MS); /* |srtt - R| = 2 ms >= rttvar: rttvar = (3 rttvar + delta) / 4 */
	const struct dp_rto *e = &rto[DUCK_A];
	CHECK(e->srtt == 2250 * US, "srtt %lu, want 7/8 2 ms + 1/8 4 ms", (unsigned long)e->srtt);
	CHECK(e->rttvar == 1250 * US, "rttvar %lu, want (3 + 2) / 4 ms", (unsigned long)e->rttvar);
	CHECK(e->rto == 7250 * US, "rto %lu, want 2.25 + 4 x 1.25 ms", (unsigned long)e->rto);
	sample(2250 * US); /* delta 0 < rttvar: rttvar falls by (rttvar - delta) / 32 */
	uint64_t rttvar = 1250 * US - 1250 * US / 32;
	CHECK(e->srtt == 2250 * US, "srtt %lu", (unsigned long)e->srtt);
	CHECK(e->rttvar == rttvar, "rttvar %lu, want %lu", (unsigned long)e->rttvar,
	      (unsigned long)rttvar);
	CHECK(e->rto == 2250 * US + 4 * rttvar, "rto %lu", (unsigned long)e->rto);
}

static void test_rto_stays_within_nack_min_plus_srtt_and_nack_max(void)
{
	setup_view();
	sample(1); /* a 1 ns reply: rttvar 0, so G (nack_min) is the margin */
	CHECK(rto[DUCK_A].rto == 1 + NACK_MIN_NS, "rto %lu, want srtt + G",
	      (unsigned long)rto[DUCK_A].rto);
	setup_view();
	sample(5 * MS); /* 5 + 4 x 2.5 = 15 ms: over nack_max */
	CHECK(rto[DUCK_A].rto == NACK_MAX_NS, "rto %lu, want nack_max",
	      (unsigned long)rto[DUCK_A].rto);
}

static void test_a_duck_that_was_nacked_gives_no_sample(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, 0.0f);
	dp_gather_send_nacks(&view, f, wait_start(f) + NACK_NS); /* both are NACKed */
	uint64_t backed_off = rto[DUCK_A].rto;
	answer(f, DUCK_A, wait_start(f) + 3 * MS);
	CHECK(!rto[DUCK_A].sampled && counters.v[DP_C_rto_samples] == 0,
	      "Karn: a reply after a NACK is no RTT sample");
	CHECK(rto[DUCK_A].rto == backed_off, "rto %lu, want the backed-off %lu",
	      (unsigned long)rto[DUCK_A].rto, (unsigned long)backed_off);
}

/* --- NACK timing ----------------------------------------------------------------------- */

static void test_no_nack_before_the_rto_one_at_it(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, 0.0f);
	CHECK(count_sent(&tx, DP_WIRE_OP_FORWARD, 9000 + DUCK_A) == 3 &&
	      count_sent(&tx, DP_WIRE_OP_FORWARD, 9000 + DUCK_B) == 3,
	      "the activation's 3 chunks to each duck");
	nsent = 0;
	uint64_t t0 = wait_start(f);
	uint64_t next = dp_gather_send_nacks(&view, f, t0 + NACK_NS - 1);
	CHECK(count_sent(&tx, DP_WIRE_OP_NACK, 0) == 0, "NACKed 1 ns before the RTO");
	CHECK(next == t0 + NACK_NS, "next NACK due at %lu, want wait_start + rto %lu",
	      (unsigned long)next, (unsigned long)(t0 + NACK_NS));
	next = dp_gather_send_nacks(&view, f, t0 + NACK_NS);
	CHECK(count_sent(&tx, DP_WIRE_OP_NACK, 9000 + DUCK_A) == 1 &&
	      count_sent(&tx, DP_WIRE_OP_NACK, 9000 + DUCK_B) == 1, "each duck NACKed at its RTO");
	CHECK(nsent == 2 && sent[0].nlist == 0, "nothing heard yet: an empty list (everything)");
	CHECK(counters.v[DP_C_nacks_sent] == 2, "nacks_sent %lu",
	      (unsigned long)counters.v[DP_C_nacks_sent]);
	/* backed off: the next NACK one doubled RTO from now */
	CHECK(rto[DUCK_A].rto == 2 * NACK_NS, "rto %lu after a NACK, want doubled",
	      (unsigned long)rto[DUCK_A].rto);
	CHECK(next == t0 + NACK_NS + 2 * NACK_NS, "next due %lu", (unsigned long)next);
}

static void test_a_nack_comes_one_rto_after_the_last_chunk_for_the_missing_ones(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, 0.0f); /* 3 chunks */
	uint64_t t0 = wait_start(f), got = t0 + 700 * US;
	partial(f, DUCK_A, PAYLOAD, 1, got);
	answer(f, DUCK_B, got);
	nsent = 0;
	dp_gather_send_nacks(&view, f, got + NACK_NS - 1);
	CHECK(count_sent(&tx, DP_WIRE_OP_NACK, 0) == 0,
	      "NACKed while its stream made progress within one RTO");
	dp_gather_send_nacks(&view, f, got + NACK_NS);
	dp_tx_flush(&tx);
	CHECK(nsent == 1 && sent[0].op == DP_WIRE_OP_NACK && sent[0].port == 9000 + DUCK_A,
	      "one NACK, to the duck still missing chunks (%u sent)", nsent);
	CHECK(sent[0].nlist == 2 && sent[0].list[0] == 0 && sent[0].list[1] == 2,
	      "it lists chunks 0 and 2 (%u listed)", sent[0].nlist);
}

static void test_backoff_stops_at_nack_max_and_a_nack_lists_64_chunks_at_most(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(100 * PAYLOAD / 4, 0.0f); /* 100 chunks */
	uint64_t now = wait_start(f);
	partial(f, DUCK_A, PAYLOAD, 0, now); /* it knows the count: it lists */
	answer(f, DUCK_B, now);
	for (int i = 0; i < 8; i++) {
		now += rto[DUCK_A].rto;
		nsent = 0;
		dp_gather_send_nacks(&view, f, now);
		CHECK(count_sent(&tx, DP_WIRE_OP_NACK, 9000 + DUCK_A) == 1, "NACK %d sent", i);
		CHECK(rto[DUCK_A].rto <= NACK_MAX_NS, "rto %lu over nack_max",
		      (unsigned long)rto[DUCK_A].rto);
		CHECK(sent[0].nlist == 64 && sent[0].list[0] == 1 && sent[0].list[63] == 64,
		      "a NACK lists the first 64 missing (%u, from %u)", sent[0].nlist,
		      sent[0].list[0]);
	}
	CHECK(rto[DUCK_A].rto == NACK_MAX_NS, "backed off to nack_max: %lu",
	      (unsigned long)rto[DUCK_A].rto);
	/* 1 -> 2 -> 4 -> 8 -> 10 ms: four backoffs, then it stays */
	CHECK(counters.v[DP_C_rto_backoffs] == 4, "rto_backoffs %lu",
	      (unsigned long)counters.v[DP_C_rto_backoffs]);
}

/* A NACK from duck for input chunks list[0..n). */
static void nack_input(struct dp_fwd *f, uint32_t duck, const uint32_t *list, uint32_t n,
		       uint64_t now)
{
	struct dp_wire_header h;
	dp_wire_init(&h, DP_WIRE_OP_NACK, SESSION, EPOCH);
	h.flags = DP_WIRE_FLAG_INPUT;
	h.forward_id = f->wire_id;
	h.duck = (uint16_t)duck;
	h.length = n * 4;
	dp_gather_on_nack(&view, f, &h, (const uint8_t *)list, duck, now);
}

static void test_a_ducks_nacks_for_input_are_answered_once_per_interval_each_chunk_once(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, 0.0f);
	uint64_t t0 = wait_start(f);
	static const uint32_t list[5] = { 2, 0, 2, 2, 9 }; /* 9: no such chunk */
	nsent = 0;
	nack_input(f, DUCK_A, list, 5, t0);
	CHECK(count_sent(&tx, DP_WIRE_OP_FORWARD, 9000 + DUCK_A) == 2,
	      "chunks 2 and 0 resent, once each");
	CHECK(counters.v[DP_C_retransmits] == 2 && counters.v[DP_C_nack_resends_suppressed] == 2,
	      "retransmits %lu, suppressed %lu", (unsigned long)counters.v[DP_C_retransmits],
	      (unsigned long)counters.v[DP_C_nack_resends_suppressed]);
	nsent = 0;
	nack_input(f, DUCK_A, list, 1, t0 + NACK_NS - 1);
	CHECK(count_sent(&tx, DP_WIRE_OP_FORWARD, 0) == 0, "a second NACK within nack_us: no send");
	nack_input(f, DUCK_A, NULL, 0, t0 + NACK_NS);
	CHECK(count_sent(&tx, DP_WIRE_OP_FORWARD, 9000 + DUCK_A) == 3,
	      "an empty list a nack interval later: the whole activation again");
}

/* --- first write vs add ---------------------------------------------------------------- */

static void test_first_contribution_is_stored_later_ones_added_duplicates_not(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, NAN); /* the slot's old contents: not read */
	CHECK(f->acc[0] == res, "float32 on the first NIC: summed in place in the slot");
	uint64_t now = wait_start(f) + 100 * US;
	partial(f, DUCK_A, PAYLOAD, 0, now);
	CHECK(res[0] == value(DUCK_A, 0) && res[3] == value(DUCK_A, 3),
	      "the first contribution is stored: %g, want %g", res[0], value(DUCK_A, 0));
	CHECK(isnan(res[4]), "a chunk nobody sent is untouched until the part ends");
	partial(f, DUCK_B, PAYLOAD, 0, now);
	CHECK(res[0] == value(DUCK_A, 0) + value(DUCK_B, 0), "the second is added: %g, want %g",
	      res[0], value(DUCK_A, 0) + value(DUCK_B, 0));
	partial(f, DUCK_B, PAYLOAD, 0, now); /* a retransmit crossing the original */
	CHECK(res[0] == value(DUCK_A, 0) + value(DUCK_B, 0), "a duplicate is not added: %g",
	      res[0]);
	CHECK(counters.v[DP_C_rx_duplicates] == 1, "rx_duplicates %lu",
	      (unsigned long)counters.v[DP_C_rx_duplicates]);
	/* the rest in the other order: B first, then A */
	for (uint32_t c = 1; c < 3; c++)
		partial(f, DUCK_B, PAYLOAD, c, now);
	uint32_t status = DP_STATUS_PENDING;
	for (uint32_t c = 1; c < 3; c++)
		status = partial(f, DUCK_A, PAYLOAD, c, now);
	CHECK(status == DP_STATUS_OK, "the last duck's last chunk ends the part: %u", status);
	for (uint32_t i = 0; i < 10; i++)
		CHECK(res[i] == value(DUCK_A, i) + value(DUCK_B, i), "element %u: %g, want %g", i,
		      res[i], value(DUCK_A, i) + value(DUCK_B, i));
}

static void test_a_duck_that_cuts_its_reply_on_another_grid_still_sums_right(void)
{
	setup_view();
	struct dp_fwd *f = start_forward(10, NAN);
	uint64_t now = wait_start(f) + 100 * US;
	partial(f, DUCK_A, PAYLOAD, 0, now); /* stored: chunk 0 of the grid */
	/* 8-byte chunks: off the grid, so what no duck wrote yet is zeroed and added onto */
	for (uint32_t c = 0; c < 5; c++)
		partial(f, DUCK_B, 8, c, now);
	uint32_t status = DP_STATUS_PENDING;
	for (uint32_t c = 1; c < 3; c++)
		status = partial(f, DUCK_A, PAYLOAD, c, now);
	CHECK(status == DP_STATUS_OK, "part over: %u", status);
	for (uint32_t i = 0; i < 10; i++)
		CHECK(res[i] == value(DUCK_A, i) + value(DUCK_B, i), "element %u: %g, want %g", i,
		      res[i], value(DUCK_A, i) + value(DUCK_B, i));
}

int main(void)
{
	test_first_sample_sets_srtt_and_half_of_it_as_rttvar();
	test_later_samples_move_srtt_by_an_eighth_and_rttvar_up_fast_down_slow();
	test_rto_stays_within_nack_min_plus_srtt_and_nack_max();
	test_a_duck_that_was_nacked_gives_no_sample();
	test_no_nack_before_the_rto_one_at_it();
	test_a_nack_comes_one_rto_after_the_last_chunk_for_the_missing_ones();
	test_backoff_stops_at_nack_max_and_a_nack_lists_64_chunks_at_most();
	test_a_ducks_nacks_for_input_are_answered_once_per_interval_each_chunk_once();
	test_first_contribution_is_stored_later_ones_added_duplicates_not();
	test_a_duck_that_cuts_its_reply_on_another_grid_still_sums_right();
	return test_result("test_gather");
}
