/* test_desc.c: dp_desc_check() refuses every descriptor of issue 7 that once reached
 * outside a buffer, and passes the ones the client library writes. Also the ring
 * consumer that trusts no index in shared memory. Exit 0 pass, 1 fail. */
#include <stdlib.h>
#include <string.h>

#include "dp_desc.h"
#include "dp_ring.h"
#include "test_check.h"

#define HIDDEN 32u
#define FFN 64u

static const struct dp_client_layout layout = {
	.slot_count = 4, .ring_capacity = 8, .act_slot_size = 8192, .res_slot_size = 8192
};
static const struct dp_limits limits = {
	.max_forward_bytes = 1 << 20, .default_timeout_us = 1000000, .max_timeout_us = 10000000
};

static struct dp_layer *layer(uint32_t ready)
{
	struct dp_layer *l = calloc(1, sizeof(*l));
	memset(l->index, 0xff, sizeof(l->index));
	l->id = 7;
	l->kind = DP_MLP_KIND_GELU;
	l->dtype = DP_DTYPE_F32;
	l->hidden = HIDDEN;
	l->ffn = FFN;
	l->nducks = 2;
	l->ducks[0] = 3;
	l->ducks[1] = 5;
	l->shard[0] = l->shard[1] = FFN / 2;
	l->index[3] = 0;
	l->index[5] = 1;
	l->has_b_down = true;
	l->ready = ready;
	return l;
}

static struct dp_desc forward(uint32_t rows)
{
	struct dp_desc d;
	memset(&d, 0, sizeof(d));
	d.op = DP_OP_FORWARD;
	d.layer = 7;
	d.dtype = DP_DTYPE_F32;
	d.ndim = 2;
	d.shape[0] = rows;
	d.shape[1] = HIDDEN;
	d.nbytes = (uint64_t)rows * HIDDEN * 4;
	return d;
}

static struct dp_desc chunk(uint16_t duck, uint16_t tensor, uint64_t offset, uint64_t nbytes)
{
	struct dp_desc d;
	memset(&d, 0, sizeof(d));
	d.op = DP_OP_WEIGHT_CHUNK;
	d.layer = 7;
	d.duck = duck;
	d.tensor = tensor;
	d.offset = offset;
	d.nbytes = nbytes;
	return d;
}

/* As the dispatcher calls it: the layer read through dp_desc_layer_of. */
static int check(const struct dp_layer *l, const struct dp_desc *d, struct dp_desc_plan *p,
		 char *why)
{
	struct dp_desc_layer view;
	return dp_desc_check(&layout, dp_desc_layer_of(l, &view), d, &limits, p, why,
			     DP_DESC_WHY_LEN);
}

static void test_a_client_forward_passes_with_its_plan(void)
{
	struct dp_layer *l = layer(1);
	struct dp_desc d = forward(3);
	struct dp_desc_plan p;
	char why[DP_DESC_WHY_LEN] = "";
	CHECK(check(l, &d, &p, why) == 0, "%s", why);
	CHECK(p.rows == 3 && p.bytes == 3 * HIDDEN * 4, "rows %u bytes %lu", p.rows,
	      (unsigned long)p.bytes);
	CHECK(p.timeout_us == limits.default_timeout_us, "default timeout");
	CHECK(p.targets[0] == ((1ull << 3) | (1ull << 5)) && !p.targets[1] && !p.targets[3],
	      "targets %lx", (unsigned long)p.targets[0]);
	free(l);
}

static void test_a_wrapping_shape_product_is_refused(void)
{
	struct dp_layer *l = layer(1);
	struct dp_desc_plan p;
	char why[DP_DESC_WHY_LEN];
	/* 1073807362 * 536838145 * 32 = 2^64 + 64: wraps to 64 elements, 256 bytes */
	struct dp_desc d = forward(1);
	d.ndim = 3;
	d.shape[0] = 1073807362u;
	d.shape[1] = 536838145u;
	d.shape[2] = HIDDEN;
	d.nbytes = 256;
	CHECK(check(l, &d, &p, why) < 0 && strstr(why, "overflows"), "wrapped shape: %s", why);
	d = forward(0);
	CHECK(check(l, &d, &p, why) < 0, "a zero dimension passed");
	d = forward(1);
	d.ndim = 0;
	CHECK(check(l, &d, &p, why) < 0, "ndim 0 passed");
	d.ndim = 5;
	CHECK(check(l, &d, &p, why) < 0, "ndim 5 passed");
	d = forward(1);
	d.nbytes += 4;
	CHECK(check(l, &d, &p, why) < 0, "nbytes off the shape passed");
	d = forward(65); /* 8320 bytes: over the 8192-byte slots */
	CHECK(check(l, &d, &p, why) < 0, "bigger than the slot passed");
	free(l);
}

static void test_slots_timeouts_and_targets_outside_the_limits_are_refused(void)
{
	struct dp_layer *l = layer(1);
	struct dp_desc_plan p;
	char why[DP_DESC_WHY_LEN];
	struct dp_desc d = forward(1);
	d.slot = layout.slot_count;
	CHECK(check(l, &d, &p, why) < 0 && strstr(why, "slot"), "slot: %s", why);
	d = forward(1);
	d.timeout_us = UINT32_MAX;
	CHECK(check(l, &d, &p, why) < 0 && strstr(why, "max_timeout_us"), "timeout: %s", why);
	d.timeout_us = limits.max_timeout_us;
	CHECK(check(l, &d, &p, why) == 0 && p.timeout_us == limits.max_timeout_us, "max timeout");
	d = forward(1);
	d.ducks[3] = 1ull << 63; /* duck 255: not in the layer */
	CHECK(check(l, &d, &p, why) < 0 && strstr(why, "duck 255"), "targets: %s", why);
	d = forward(1);
	d.dtype = DP_DTYPE_F16;
	CHECK(check(l, &d, &p, why) < 0, "another dtype passed");
	d = forward(1);
	d.op = 99;
	CHECK(check(l, &d, &p, why) < 0 && strstr(why, "op"), "op: %s", why);
	CHECK(check(NULL, &(struct dp_desc){ .op = DP_OP_FORWARD }, &p, why) < 0, "no layer");
	l->ready = 0;
	d = forward(1);
	CHECK(check(l, &d, &p, why) < 0, "a forward on a loading layer passed");
	free(l);
}

static void test_weight_chunks_that_wrap_or_name_no_duck_are_refused(void)
{
	struct dp_layer *l = layer(0);
	struct dp_desc_plan p;
	char why[DP_DESC_WHY_LEN];
	struct dp_desc d = chunk(3, 0, 0, 128);
	CHECK(check(l, &d, &p, why) == 0 && p.duck_index == 0, "good chunk: %s", why);
	d = chunk(DP_HOST_TENSOR_DUCK, DP_B_DOWN_TENSOR, 0, HIDDEN * 4);
	CHECK(check(l, &d, &p, why) == 0 && p.duck_index == -1, "good b_down: %s", why);
	/* issue 7 item 3: duck 65535, offset 2^64 - 64 */
	d = chunk(DP_HOST_TENSOR_DUCK, DP_B_DOWN_TENSOR, UINT64_MAX - 63, 128);
	CHECK(check(l, &d, &p, why) < 0, "wrapping b_down offset passed");
	d = chunk(3, 0, UINT64_MAX - 63, 128);
	CHECK(check(l, &d, &p, why) < 0, "wrapping shard offset passed");
	d = chunk(3, 2, HIDDEN * (FFN / 2) * 4 - 64, 128);
	CHECK(check(l, &d, &p, why) < 0, "a chunk past the tensor's end passed");
	for (uint32_t duck = DP_MAX_DUCKS; duck < 65535; duck += 997) {
		d = chunk((uint16_t)duck, 0, 0, 128);
		CHECK(check(l, &d, &p, why) < 0, "duck %u passed", duck);
	}
	d = chunk(4, 0, 0, 128); /* in range, not in the layer */
	CHECK(check(l, &d, &p, why) < 0, "a duck without a shard passed");
	d = chunk(3, DP_B_DOWN_TENSOR, 0, 128);
	CHECK(check(l, &d, &p, why) < 0, "b_down's tensor index from a duck passed");
	d = chunk(3, 0, 0, 0);
	CHECK(check(l, &d, &p, why) < 0, "an empty chunk passed");
	d = chunk(3, 0, 0, layout.act_slot_size + 1);
	CHECK(check(l, &d, &p, why) < 0, "a chunk bigger than its slot passed");
	l->ready = 1;
	d = chunk(3, 0, 0, 128);
	CHECK(check(l, &d, &p, why) < 0, "a chunk for a ready layer passed");
	free(l);
}

static void test_tensor_sizes_saturate_instead_of_wrapping(void)
{
	struct dp_layer *l = layer(0);
	l->hidden = UINT32_MAX;
	l->shard[0] = UINT32_MAX;
	CHECK(dp_tensor_bytes(l, 0, 0) == UINT64_MAX, "w_up of 2^64 * 4 bytes");
	CHECK(dp_tensor_bytes(l, 0, 1) == (uint64_t)UINT32_MAX * 4, "b_up");
	free(l);
}

static void test_a_ring_whose_head_moves_back_or_runs_ahead_is_broken(void)
{
	static struct dp_ring_header r __attribute__((aligned(64)));
	static struct dp_desc descs[8], out[8];
	uint64_t tail = 0, seen = 0;
	memset(&r, 0, sizeof(r));
	for (int i = 0; i < 5; i++)
		CHECK(dp_ring_push(&r, descs, 8, &(struct dp_desc){ .forward_id = (uint64_t)i + 1 }) == 0,
		      "push %d", i);
	CHECK(dp_ring_consume(&r, descs, 8, &tail, &seen, out, 8) == 5 && tail == 5 && r.tail == 5,
	      "consume");
	CHECK(out[4].forward_id == 5, "order");
	r.tail = 0; /* the producer rewrites tail: our private copy decides */
	CHECK(dp_ring_consume(&r, descs, 8, &tail, &seen, out, 8) == 0 && tail == 5, "rewritten tail");
	r.head = 4; /* rewound below what we took: stale entries must not be replayed */
	CHECK(dp_ring_consume(&r, descs, 8, &tail, &seen, out, 8) == -1 && tail == 5, "rewind");
	r.head = 5 + 8 + 1; /* more than capacity ahead */
	uint64_t tail2 = 5, seen2 = 5;
	CHECK(dp_ring_consume(&r, descs, 8, &tail2, &seen2, out, 8) == -1 && tail2 == 5, "jump");
	r.head = 5 + 8; /* exactly full is fine */
	CHECK(dp_ring_consume(&r, descs, 8, &tail2, &seen2, out, 3) == 3 && tail2 == 8, "full ring");
}

int main(void)
{
	test_a_client_forward_passes_with_its_plan();
	test_a_wrapping_shape_product_is_refused();
	test_slots_timeouts_and_targets_outside_the_limits_are_refused();
	test_weight_chunks_that_wrap_or_name_no_duck_are_refused();
	test_tensor_sizes_saturate_instead_of_wrapping();
	test_a_ring_whose_head_moves_back_or_runs_ahead_is_broken();
	return test_result("test_desc");
}
