/* dp_desc.c: dp_desc_check(), the descriptor validator (see dp_desc.h).
 *
 * Every product and sum of client-chosen numbers is overflow-checked: a wrapped
 * shape product once passed the nbytes check with 2.8e9 rows, and a wrapped
 * weight-chunk offset once wrote before a heap buffer. A duck id is checked
 * against DP_MAX_DUCKS before it indexes anything.
 */
#include "dp_desc.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dp_reduce.h"

static int refuse(char *why, size_t whylen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (why && whylen)
		vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return -1;
}

static int check_forward(const struct dp_client_layout *c, const struct dp_layer *l,
			 const struct dp_desc *d, const struct dp_limits *lim,
			 struct dp_desc_plan *out, char *why, size_t whylen)
{
	if (l && dp_load_acquire_u32(&l->failed))
		return refuse(why, whylen, "layer %u failed to load (Layers: failed, missing); "
			      "load it again", d->layer);
	if (!l || !dp_load_acquire_u32(&l->ready))
		return refuse(why, whylen, "layer %u is not loaded", d->layer);
	if (d->dtype != l->dtype)
		return refuse(why, whylen, "dtype %u does not match layer %u's (%u)", d->dtype, l->id,
			      l->dtype);
	if (d->ndim < 1 || d->ndim > DP_MAX_DIMS || d->shape[d->ndim - 1] != l->hidden)
		return refuse(why, whylen, "shape does not end in layer %u's hidden %u", l->id,
			      l->hidden);
	uint64_t elems = 1, bytes;
	for (uint32_t k = 0; k < d->ndim; k++)
		if (d->shape[k] == 0 || __builtin_mul_overflow(elems, d->shape[k], &elems))
			return refuse(why, whylen, "shape dimension %u (%u) is zero or overflows", k,
				      d->shape[k]);
	if (__builtin_mul_overflow(elems, dp_dtype_size(d->dtype), &bytes) || bytes != d->nbytes)
		return refuse(why, whylen, "%lu bytes do not match the shape",
			      (unsigned long)d->nbytes);
	if (bytes > c->act_slot_size || bytes > c->res_slot_size || bytes > lim->max_forward_bytes)
		return refuse(why, whylen, "%lu bytes exceed the slots or max_forward_bytes %lu",
			      (unsigned long)bytes, (unsigned long)lim->max_forward_bytes);
	if (d->timeout_us > lim->max_timeout_us)
		return refuse(why, whylen, "timeout %u us is over this dataplane's max_timeout_us %u",
			      d->timeout_us, lim->max_timeout_us);
	bool any = d->ducks[0] | d->ducks[1] | d->ducks[2] | d->ducks[3];
	uint32_t n = 0;
	memset(out->targets, 0, sizeof(out->targets));
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++) {
		bool wanted = any ? dp_targets_has(d->ducks, k) : l->index[k] >= 0;
		if (!wanted)
			continue;
		if (l->index[k] < 0)
			return refuse(why, whylen, "duck %u holds no shard of layer %u", k, l->id);
		out->targets[k >> 6] |= 1ull << (k & 63);
		n++;
	}
	if (n == 0)
		return refuse(why, whylen, "layer %u has no ducks to ask", l->id);
	out->bytes = bytes;
	out->rows = (uint32_t)(elems / l->hidden); /* exact: the last dimension is hidden */
	out->timeout_us = d->timeout_us ? d->timeout_us : lim->default_timeout_us;
	out->duck_index = -1;
	return 0;
}

static int check_weight(const struct dp_client_layout *c, const struct dp_layer *l,
			const struct dp_desc *d, const struct dp_limits *lim,
			struct dp_desc_plan *out, char *why, size_t whylen)
{
	uint64_t end, size;
	if (!l || dp_load_acquire_u32(&l->ready))
		return refuse(why, whylen, "layer %u is not being loaded (send LoadWeights first)",
			      d->layer);
	if (d->nbytes == 0 || d->nbytes > c->act_slot_size || d->nbytes > lim->max_forward_bytes)
		return refuse(why, whylen, "weight chunk of %lu bytes", (unsigned long)d->nbytes);
	if (__builtin_add_overflow(d->offset, d->nbytes, &end))
		return refuse(why, whylen, "weight chunk [%lu, +%lu) overflows",
			      (unsigned long)d->offset, (unsigned long)d->nbytes);
	if (d->duck == DP_HOST_TENSOR_DUCK) {
		/* b_down stays in the dataplane: it is added once, after the reduce */
		size = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
		if (!l->has_b_down || d->tensor != 3 || end > size)
			return refuse(why, whylen, "bad b_down chunk for layer %u", l->id);
		out->duck_index = -1;
	} else {
		int16_t i = d->duck < DP_MAX_DUCKS ? l->index[d->duck] : -1;
		if (i < 0 || d->tensor > 2 || end > dp_tensor_bytes(l, (uint32_t)i, d->tensor))
			return refuse(why, whylen, "duck %u tensor %u [%lu, +%lu) is not in layer %u",
				      d->duck, d->tensor, (unsigned long)d->offset,
				      (unsigned long)d->nbytes, l->id);
		out->duck_index = i;
	}
	out->bytes = d->nbytes;
	out->rows = 0;
	out->timeout_us = 0;
	memset(out->targets, 0, sizeof(out->targets));
	return 0;
}

int dp_desc_check(const struct dp_client_layout *c, const struct dp_layer *layer,
		  const struct dp_desc *d, const struct dp_limits *lim, struct dp_desc_plan *out,
		  char *why, size_t whylen)
{
	if (d->slot >= c->slot_count)
		return refuse(why, whylen, "slot %u is out of range", d->slot);
	switch (d->op) {
	case DP_OP_FORWARD:
		return check_forward(c, layer, d, lim, out, why, whylen);
	case DP_OP_WEIGHT_CHUNK:
		return check_weight(c, layer, d, lim, out, why, whylen);
	case DP_OP_WEIGHT_COMMIT:
		memset(out, 0, sizeof(*out));
		out->duck_index = -1;
		return 0; /* the commit itself checks the layer, once every chunk is in */
	}
	return refuse(why, whylen, "unknown op %u", d->op);
}
