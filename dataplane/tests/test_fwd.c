/* test_fwd.c: the end of a forward (dp_fwd.c), as the last NIC out runs it: the NICs'
 * partial sums added into one (a NIC outside the forward's mask is not), b_down (the
 * layer's down-projection bias, one value per hidden column) added to every row when
 * the layer has one, the result stored in the forward's dtype; the status when NICs
 * disagree (OK < TIMEOUT < the rest, the first NIC winning a tie; an OK whose epoch
 * moved is STALE_EPOCH); and which NIC's part is the last. The world is a calloc'ed one
 * with only what dp_fwd_complete reads set: the epoch, the ducks' index, the NICs' names.
 *
 * Exit 0 pass, 1 fail. */
#include <stdlib.h>
#include <string.h>

#include "dp_f16.h"
#include "dp_fwd.h"
#include "test_check.h"

#define ROWS 2u
#define HIDDEN 4u
#define N (ROWS * HIDDEN)
#define EPOCH 5u
#define DUCK 3u

static struct dp_world *w;
static struct dp_client client;
static struct dp_layer layer = { .id = 11, .dtype = DP_DTYPE_F32, .hidden = HIDDEN };
static struct dp_duck_rx rx[1];
static float bias[HIDDEN] = { 0.5f, -1.0f, 2.0f, 0.25f };
static float acc[DP_MAX_NICS][N];
static uint8_t res[N * 4];
static struct dp_fwd fwd;
static struct dp_spsc done;
static struct dp_counters counters;

/* A forward on the NICs of nic_mask whose parts ended with status[nic], NIC k's sum
 * holding (k + 1) * (i + 1) at element i; completed by the last NIC out. */
static struct dp_fwd *complete(uint32_t nic_mask, const uint32_t *status, uint8_t dtype)
{
	struct dp_fwd *f = &fwd;
	memset(f, 0, sizeof(*f));
	memset(&counters, 0, sizeof(counters));
	memset(res, 0xab, sizeof(res));
	layer.dtype = dtype;
	f->kind = DP_FWD_FORWARD;
	f->client = &client; /* slot_count 0: nothing to publish into */
	f->layer = &layer;
	f->desc.epoch = EPOCH;
	f->rows = ROWS;
	f->bytes = (uint64_t)N * dp_dtype_size(dtype);
	f->res = res;
	f->rx = rx;
	f->targets[0] = 1ull << DUCK;
	rx[0].state = 1;
	f->nic_mask = nic_mask;
	for (uint32_t k = 0; k < DP_MAX_NICS; k++) {
		for (uint32_t i = 0; i < N; i++)
			acc[k][i] = (float)((k + 1) * (i + 1));
		f->acc[k] = acc[k];
		f->nics_pending += nic_mask >> k & 1;
	}
	bool last = false;
	for (uint32_t k = 0; k < DP_MAX_NICS; k++)
		if (nic_mask & (1u << k)) {
			CHECK(!last, "NIC %u's part came after the last", k);
			last = dp_fwd_part_done(f, k, status[k]);
		}
	CHECK(last, "the last NIC's part is the last");
	if (last)
		dp_fwd_complete(w, f, &done, &counters);
	void *out;
	CHECK(dp_spsc_pop(&done, &out, 1) == 1 && out == f, "the forward is on the done ring");
	return f;
}

static float res_f32(uint32_t i)
{
	float v;
	memcpy(&v, res + (size_t)i * 4, sizeof(v));
	return v;
}

/* --- the sum --------------------------------------------------------------------------- */

static void test_the_nics_partial_sums_are_added_into_the_result(void)
{
	static const uint32_t ok[DP_MAX_NICS] = { DP_STATUS_OK, DP_STATUS_OK, DP_STATUS_OK,
						  DP_STATUS_OK };
	layer.has_b_down = false;
	struct dp_fwd *f = complete(1u << 0 | 1u << 2, ok, DP_DTYPE_F32); /* NIC 1 not in it */
	CHECK(f->status == DP_STATUS_OK, "status %u", f->status);
	for (uint32_t i = 0; i < N; i++) /* NIC 0's (i + 1) + NIC 2's 3 (i + 1) */
		CHECK(res_f32(i) == (float)(4 * (i + 1)), "element %u: %g, want %g", i,
		      res_f32(i), (float)(4 * (i + 1)));
	CHECK(counters.v[DP_C_forwards_ok] == 1, "forwards_ok %lu",
	      (unsigned long)counters.v[DP_C_forwards_ok]);
	complete(1u << 1, ok, DP_DTYPE_F32); /* one NIC, not the first: its sum alone */
	for (uint32_t i = 0; i < N; i++)
		CHECK(res_f32(i) == (float)(2 * (i + 1)), "one NIC, element %u: %g", i, res_f32(i));
}

static void test_b_down_is_added_to_every_row_when_the_layer_has_one(void)
{
	static const uint32_t ok[DP_MAX_NICS] = { DP_STATUS_OK, DP_STATUS_OK };
	layer.b_down = bias;
	layer.has_b_down = true;
	complete(1u << 0 | 1u << 1, ok, DP_DTYPE_F32);
	for (uint32_t r = 0; r < ROWS; r++)
		for (uint32_t c = 0; c < HIDDEN; c++) {
			uint32_t i = r * HIDDEN + c;
			float want = (float)(3 * (i + 1)) + bias[c];
			CHECK(res_f32(i) == want, "row %u col %u: %g, want %g", r, c, res_f32(i),
			      want);
		}
	layer.has_b_down = false; /* a layer without one: the pointer is not read */
	complete(1u << 0 | 1u << 1, ok, DP_DTYPE_F32);
	CHECK(res_f32(0) == 3.0f, "no b_down: %g, want 3", res_f32(0));
	layer.has_b_down = true; /* float16: summed in float32, biased, then stored */
	complete(1u << 0 | 1u << 1, ok, DP_DTYPE_F16);
	for (uint32_t i = 0; i < N; i++) {
		uint16_t h;
		memcpy(&h, res + (size_t)i * 2, sizeof(h));
		float want = (float)(3 * (i + 1)) + bias[i % HIDDEN];
		CHECK(dp_f16_to_f32(h) == want, "float16 element %u: %g, want %g", i,
		      dp_f16_to_f32(h), want);
	}
	layer.has_b_down = false;
	layer.b_down = NULL;
}

/* --- the status when NICs disagree ----------------------------------------------------- */

static uint32_t status_of(uint32_t a, uint32_t b)
{
	const uint32_t st[DP_MAX_NICS] = { a, b };
	return complete(1u << 0 | 1u << 1, st, DP_DTYPE_F32)->status;
}

static void test_the_worst_status_wins_and_the_first_nic_breaks_a_tie(void)
{
	enum { OK = DP_STATUS_OK, TIMEOUT = DP_STATUS_TIMEOUT, LOST = DP_STATUS_DUCK_LOST,
	       ERR = DP_STATUS_DATAPLANE_ERROR };
	static const struct { uint32_t a, b, want; } cases[] = {
		{ OK, OK, OK },         { OK, TIMEOUT, TIMEOUT }, { TIMEOUT, OK, TIMEOUT },
		{ TIMEOUT, LOST, LOST }, { LOST, TIMEOUT, LOST }, { OK, ERR, ERR },
		{ TIMEOUT, ERR, ERR },   { LOST, ERR, LOST },      { ERR, LOST, ERR },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint32_t got = status_of(cases[i].a, cases[i].b);
		CHECK(got == cases[i].want, "NICs %u and %u: %u, want %u", cases[i].a, cases[i].b,
		      got, cases[i].want);
	}
	/* a failed forward's result is not written, and it is counted as what it is */
	status_of(TIMEOUT, OK);
	CHECK(res[0] == 0xab, "a timed out forward wrote its result");
	CHECK(counters.v[DP_C_timeouts] == 1 && counters.v[DP_C_forwards_ok] == 0,
	      "timeouts %lu, forwards_ok %lu", (unsigned long)counters.v[DP_C_timeouts],
	      (unsigned long)counters.v[DP_C_forwards_ok]);
	status_of(OK, LOST);
	CHECK(counters.v[DP_C_duck_lost] == 1, "duck_lost %lu",
	      (unsigned long)counters.v[DP_C_duck_lost]);
	/* a NIC outside the mask has no say, whatever its part says */
	const uint32_t st[DP_MAX_NICS] = { OK, ERR, OK };
	CHECK(complete(1u << 0 | 1u << 2, st, DP_DTYPE_F32)->status == OK,
	      "a NIC the forward is not on decided its status");
}

static void test_an_ok_forward_whose_epoch_moved_is_stale_a_failed_one_keeps_its_status(void)
{
	w->epoch = EPOCH + 1;
	CHECK(status_of(DP_STATUS_OK, DP_STATUS_OK) == DP_STATUS_STALE_EPOCH,
	      "the epoch moved: STALE_EPOCH");
	CHECK(res[0] == 0xab, "a stale forward wrote its result");
	CHECK(counters.v[DP_C_stale_epoch] == 1, "stale_epoch %lu",
	      (unsigned long)counters.v[DP_C_stale_epoch]);
	CHECK(status_of(DP_STATUS_OK, DP_STATUS_TIMEOUT) == DP_STATUS_TIMEOUT,
	      "a timeout stays a timeout when the epoch moved");
	w->epoch = EPOCH;
}

static void test_a_nic_whose_link_was_down_is_named(void)
{
	const uint32_t st[DP_MAX_NICS] = { DP_STATUS_OK, DP_STATUS_DATAPLANE_ERROR };
	struct dp_fwd *f = &fwd;
	/* complete() clears the context: mark the part as dp_gather_link_down does, first */
	memset(f, 0, sizeof(*f));
	f->kind = DP_FWD_FORWARD;
	f->client = &client;
	f->layer = &layer;
	f->desc.epoch = EPOCH;
	f->rx = rx;
	f->nic_mask = 3;
	f->nics_pending = 2;
	f->part[1].link_down = true;
	dp_fwd_part_done(f, 0, st[0]);
	CHECK(dp_fwd_part_done(f, 1, st[1]), "the second of two parts is the last");
	dp_fwd_complete(w, f, &done, &counters);
	void *out;
	dp_spsc_pop(&done, &out, 1);
	CHECK(f->status == DP_STATUS_DATAPLANE_ERROR, "status %u", f->status);
	CHECK(strstr(f->message, "nic eth1: link down") != NULL, "message: %s", f->message);
}

int main(void)
{
	w = calloc(1, sizeof(*w));
	if (!w || dp_spsc_init(&done, 4) < 0) {
		printf("test_fwd: out of memory\n");
		return 1;
	}
	w->epoch = EPOCH;
	memset(w->duck_index, 0xff, sizeof(w->duck_index));
	w->duck_index[DUCK] = 0;
	for (uint32_t k = 0; k < DP_MAX_NICS; k++)
		snprintf(w->cfg.nics[k].name, sizeof(w->cfg.nics[k].name), "eth%u", k);
	test_the_nics_partial_sums_are_added_into_the_result();
	test_b_down_is_added_to_every_row_when_the_layer_has_one();
	test_the_worst_status_wins_and_the_first_nic_breaks_a_tie();
	test_an_ok_forward_whose_epoch_moved_is_stale_a_failed_one_keeps_its_status();
	test_a_nic_whose_link_was_down_is_named();
	dp_spsc_free(&done);
	free(w);
	return test_result("test_fwd");
}
