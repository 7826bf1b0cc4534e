/* fuzz_desc: one submission descriptor against dp_desc_check, and what the dispatcher
 * then does with its answer.
 *
 * A client writes its 128-byte descriptors into shared memory; the dispatcher copies
 * one out of the ring and asks dp_desc_check (include/dp_desc_check.h) whether it may
 * act on it, reading the layer through dp_desc_layer_of (src/forward/dp_desc.c). This harness
 * gives it a descriptor, a layer and a layout made from the input (decode()), and when
 * it says yes, checks the plan with arithmetic of its own (128-bit, so nothing wraps)
 * and touches exactly the bytes the dispatcher would: the activation and result slot of
 * a forward, the b_down bytes of a host chunk, each in a buffer allocated to its exact
 * size so that ASan sees one byte too many.
 *
 * Links src/forward/dp_desc.c (fuzz/meson.build); check() is the one call to adjust if its
 * signature changes. desc_verdicts.c includes this file to print each corpus input's
 * verdict, which tests/hostile/test_desc_verdicts.py holds the mock dataplane's own path to.
 *
 * Input: struct dp_desc (128 bytes), then (each read as 0 once the input runs out)
 *   u8 flags: bit 0 float16 layer, bit 1 SwiGLU, bit 2 has b_down, bit 3 committed
 *             (ready), bit 4 no such layer, bit 5 (with bit 0) bfloat16, not float16
 *   u16 hidden - 1 (mod 4096)   u8 ducks - 1 (mod 8), then per duck u8 id, u16 shard - 1
 *   u8 slot_count - 1 (mod 16)  u16 act slot size, u16 result slot size (mod 4097 each)
 *   u32 max_forward_bytes, u32 default_timeout_us, u32 max_timeout_us
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_desc.h"
#include "dp_layers.h"
#include "dp_reduce.h"

typedef unsigned __int128 u128;

struct reader {
	const uint8_t *p;
	size_t n;
};

static uint64_t take(struct reader *r, unsigned bytes)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < bytes; i++)
		if (r->n) {
			v |= (uint64_t)*r->p++ << (8 * i);
			r->n--;
		}
	return v;
}

/* What one input decodes to: the dispatcher's private copies, and the layer it names. */
struct fuzz_desc_input {
	struct dp_desc d;
	struct dp_client_layout c;
	struct dp_limits lim;
	const struct dp_layer *l; /* NULL: no such layer; else static, until the next decode */
};

/* As the dispatcher calls it (dp_dispatch.c: dispatch). */
static int check(const struct fuzz_desc_input *in, struct dp_desc_plan *out, char *why,
		 size_t whylen)
{
	struct dp_desc_layer view;
	return dp_desc_check(&in->c, dp_desc_layer_of(in->l, &view), &in->d, &in->lim, out, why,
			     whylen);
}

#define EXPECT(cond)                                                                               \
	do {                                                                                       \
		if (!(cond))                                                                       \
			abort();                                                                   \
	} while (0)

static void touch(uint8_t *region, uint64_t region_size, uint64_t off, uint64_t n)
{
	EXPECT((u128)off + n <= region_size);
	memset(region + off, 0x5a, n);
}

static void forward_ok(const struct dp_client_layout *c, const struct dp_layer *l,
		       const struct dp_desc *d, const struct dp_limits *lim,
		       const struct dp_desc_plan *p, uint8_t *act, uint8_t *res)
{
	EXPECT(l && l->ready && d->dtype == l->dtype);
	EXPECT(d->ndim >= 1 && d->ndim <= DP_MAX_DIMS && d->shape[d->ndim - 1] == l->hidden);
	u128 elems = 1;
	for (uint32_t k = 0; k < d->ndim; k++)
		elems *= d->shape[k]; /* at most 4 x 32 bits: fits */
	EXPECT(elems * dp_dtype_size(l->dtype) == d->nbytes && p->bytes == d->nbytes);
	EXPECT((u128)p->rows * l->hidden == elems);
	EXPECT(p->bytes <= c->act_slot_size && p->bytes <= c->res_slot_size &&
	       p->bytes <= lim->max_forward_bytes);
	EXPECT(p->timeout_us == (d->timeout_us ? d->timeout_us : lim->default_timeout_us));
	EXPECT(d->timeout_us <= lim->max_timeout_us);
	uint32_t n = 0;
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++)
		if (dp_targets_has(p->targets, k)) {
			EXPECT(l->index[k] >= 0 && l->ducks[l->index[k]] == k);
			n++;
		}
	EXPECT(n > 0);
	/* the worker reads the activation and writes the result (dp_reduce_store) */
	touch(act, (uint64_t)c->slot_count * c->act_slot_size,
	      (uint64_t)d->slot * c->act_slot_size, p->bytes);
	touch(res, (uint64_t)c->slot_count * c->res_slot_size,
	      (uint64_t)d->slot * c->res_slot_size, p->bytes);
}

static void weight_ok(const struct dp_client_layout *c, const struct dp_layer *l,
		      const struct dp_desc *d, const struct dp_limits *lim,
		      const struct dp_desc_plan *p, uint8_t *act)
{
	EXPECT(l && !l->ready);
	EXPECT(d->nbytes > 0 && d->nbytes <= c->act_slot_size && d->nbytes <= lim->max_forward_bytes);
	EXPECT(p->bytes == d->nbytes);
	u128 end = (u128)d->offset + d->nbytes;
	u128 item = dp_dtype_size(l->dtype);
	if (d->duck == DP_HOST_TENSOR_DUCK) {
		EXPECT(l->has_b_down && d->tensor == DP_B_DOWN_TENSOR && p->duck_index == -1);
		/* the dispatcher gathers b_down into a buffer of hidden values */
		uint64_t size = (uint64_t)(l->hidden * item);
		uint8_t *b_down = malloc(size);
		EXPECT(b_down);
		EXPECT(end <= size);
		memcpy(b_down + d->offset, act + (uint64_t)d->slot * c->act_slot_size, d->nbytes);
		free(b_down);
	} else {
		EXPECT(d->duck < DP_MAX_DUCKS && l->index[d->duck] >= 0);
		int32_t i = l->index[d->duck];
		EXPECT(p->duck_index == i && d->tensor < DP_SHARD_TENSORS);
		u128 f = l->shard[i];
		u128 size = l->kind == DP_MLP_KIND_GELU && d->tensor == 1 ? f * item
									  : (u128)l->hidden * f * item;
		EXPECT(end <= size);
	}
	/* the chunk is read out of the activation slot to go on the wire */
	touch(act, (uint64_t)c->slot_count * c->act_slot_size,
	      (uint64_t)d->slot * c->act_slot_size, d->nbytes);
}

/* 0 with *in filled from the input (the format at the top), or -1 when it is shorter
 * than a descriptor. */
static int decode(const uint8_t *data, size_t size, struct fuzz_desc_input *in)
{
	if (size < sizeof(in->d))
		return -1;
	memcpy(&in->d, data, sizeof(in->d));
	struct reader r = { data + sizeof(in->d), size - sizeof(in->d) };

	/* the layer as LoadWeights builds it (dp_layer_fill: dp_layer_build's shape, which
	 * allocates nothing; this harness links no state) from the request the input makes */
	static struct dp_ctl_load_weights m; /* big (expert lists): not on the stack */
	static struct dp_layer layer;         /* big (acked[][]) */
	memset(&m, 0, sizeof(m));
	memset(&layer, 0, sizeof(layer));
	uint8_t flags = (uint8_t)take(&r, 1);
	m.layer = in->d.layer;
	m.dtype = flags & 1 ? (flags & 32 ? DP_DTYPE_BF16 : DP_DTYPE_F16) : DP_DTYPE_F32;
	m.kind = flags & 2 ? DP_MLP_KIND_SWIGLU : DP_MLP_KIND_GELU;
	m.has_b_down = flags & 4;
	m.hidden = 1 + (uint32_t)take(&r, 2) % 4096;
	bool listed[256] = { false };
	uint32_t want = 1 + (uint32_t)take(&r, 1) % 8;
	for (uint32_t i = 0; i < want; i++) {
		uint8_t id = (uint8_t)take(&r, 1);
		uint32_t shard = 1 + (uint32_t)take(&r, 2);
		if (listed[id])
			continue; /* LoadWeights refuses a duck listed twice (dp_load_check) */
		listed[id] = true;
		m.ducks[m.ducks_len++] = id;
		m.shard_sizes[m.shard_sizes_len++] = shard;
		m.ffn += shard;
	}
	dp_layer_fill(&layer, &m);
	layer.ready = flags & 8 ? 1 : 0;
	memset(&in->c, 0, sizeof(in->c));
	in->c.slot_count = 1 + (uint32_t)take(&r, 1) % 16;
	in->c.ring_capacity = 64;
	in->c.act_slot_size = take(&r, 2) % 4097;
	in->c.res_slot_size = take(&r, 2) % 4097;
	memset(&in->lim, 0, sizeof(in->lim));
	in->lim.max_forward_bytes = take(&r, 4);
	in->lim.default_timeout_us = (uint32_t)take(&r, 4);
	in->lim.max_timeout_us = (uint32_t)take(&r, 4);
	in->l = flags & 16 ? NULL : &layer;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_desc_input in;
	if (decode(data, size, &in) < 0)
		return 0;
	const struct dp_client_layout *c = &in.c;
	const struct dp_desc *d = &in.d;

	struct dp_desc_plan plan;
	char why[DP_DESC_WHY_LEN];
	memset(&plan, 0xa5, sizeof(plan));
	if (check(&in, &plan, why, sizeof(why)) != 0)
		return 0;
	EXPECT(d->slot < c->slot_count);
	size_t act_size = (size_t)c->slot_count * c->act_slot_size;
	size_t res_size = (size_t)c->slot_count * c->res_slot_size;
	uint8_t *act = malloc(act_size ? act_size : 1);
	uint8_t *res = malloc(res_size ? res_size : 1);
	EXPECT(act && res);
	switch (d->op) {
	case DP_OP_FORWARD:
		forward_ok(c, in.l, d, &in.lim, &plan, act, res);
		break;
	case DP_OP_WEIGHT_CHUNK:
		weight_ok(c, in.l, d, &in.lim, &plan, act);
		break;
	case DP_OP_WEIGHT_COMMIT:
		break;
	default:
		abort(); /* an op the validator does not know was let through */
	}
	free(act);
	free(res);
	return 0;
}
