/* dp_desc_check.h: the one check every submission descriptor passes before anyone acts on it.
 *
 * A descriptor is input from another process, like a datagram. dp_desc_check() is a
 * pure function of a private copy of the client's layout, what it reads of the layer
 * the descriptor names (struct dp_desc_layer), the descriptor (already copied out of the
 * ring, so it cannot change under us) and the configured limits. The C dataplane
 * (dp_dispatch.c, through dp_desc_layer_of() in dp_desc.c), its fuzz harness and the
 * mock dataplane (duckpipe/mock/dataplane.py, through cffi) all call this one; the mock
 * only computes what it lets through.
 *
 * Every product and sum of client-chosen numbers is overflow-checked: a wrapped
 * shape product once passed the nbytes check with 2.8e9 rows, and a wrapped
 * weight-chunk offset once wrote before a heap buffer. A duck id is checked
 * against DP_MAX_DUCKS before it indexes anything.
 *
 * The structs below are parsed by cffi (duckpipe/_native_build.py takes the @cdef
 * section): keep them plain, with literal sizes.
 */
#ifndef DP_DESC_CHECK_H
#define DP_DESC_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_fp8.h"
#include "dp_routing.h"

/* @cdef-begin: cffi parses from here */

/* Room for a refusal's reason: the completion's message (the dataplane's DP_MSG_LEN). */
#define DP_DESC_WHY_LEN 160

/* A segment's layout as checked at attach (dp_seg_plan), in the reader's own memory:
 * the client can rewrite its header, never these. */
struct dp_client_layout {
    uint32_t slot_count;
    uint32_t ring_capacity;
    uint64_t act_slot_size;
    uint64_t res_slot_size;
};

struct dp_limits {
    uint64_t max_forward_bytes;  /* largest activation, result or weight chunk */
    uint32_t default_timeout_us; /* a descriptor's timeout_us 0 means this */
    uint32_t max_timeout_us;     /* larger timeouts are refused */
};

/* What the check reads of the layer a descriptor names, read once (ready and failed
 * with acquire loads by the dataplane, which publishes them from other threads). */
struct dp_desc_layer {
    uint32_t id;
    uint32_t hidden;
    uint8_t kind;          /* enum dp_mlp_kind */
    uint8_t dtype;         /* enum dp_dtype */
    bool has_b_down;
    bool ready;            /* committed: forwards may use it, weight chunks may not */
    bool failed;           /* a chunk or the commit failed: unusable until loaded again */
    /* another client's layer: it exists, this client may not use it; the view holds
     * nothing else (refused as LoadWeights refuses it, not as a layer not loaded) */
    bool foreign;
    const int16_t *index;  /* DP_MAX_DUCKS entries: duck id -> its shard's index, or -1 */
    const uint32_t *shard; /* FFN columns of the shard at each index */
    /* FP8 weights (weight_dtype DP_DTYPE_F8E4M3, else 0): a tensor is its e4m3 bytes and
     * its block scales, sized by each duck's experts (dp_fp8.h) */
    uint8_t weight_dtype;
    uint32_t expert_ffn;          /* MOE: columns of each routed expert */
    const uint16_t *experts_on;   /* MOE: DP_MAX_DUCKS entries, by duck id; else NULL */
    /* a repair open on the committed layer (RepairLayer): the ducks (DP_MAX_DUCKS bits)
     * whose banks it restreams, the only weight chunks a ready layer takes; else NULL */
    const uint64_t *repair;
};

/* What a descriptor that passed asks for, computed once with checked arithmetic. */
struct dp_desc_plan {
    uint64_t bytes;        /* FORWARD: activation (= result) bytes; WEIGHT_CHUNK: chunk */
    uint64_t timeout_us;   /* FORWARD: the deadline after pickup */
    uint32_t rows;         /* FORWARD: activation rows (tokens) */
    int32_t duck_index;    /* WEIGHT_CHUNK: desc->duck's shard index; -1: b_down */
    uint64_t targets[4];   /* FORWARD: the ducks to ask (DP_MAX_DUCKS bits), each with a shard */
};

/* @cdef-end */

_Static_assert(sizeof(((struct dp_desc_plan *)0)->targets) * 8 == DP_MAX_DUCKS,
	       "dp_desc_plan.targets: a bit per duck");

/* A duck id bitmap (a forward's targets, a descriptor's ducks): is duck in it? */
static inline bool dp_targets_has(const uint64_t *t, uint32_t duck)
{
	return (t[duck >> 6] >> (duck & 63)) & 1;
}

/* Bytes of shard tensor t of a duck holding ffn columns (dp_tensor_elems: the schema's
 * TENSOR_SHAPES); UINT64_MAX when that does not fit 64 bits (no chunk can then end
 * inside it, and a commit never sees it complete). */
static inline uint64_t dp_shard_tensor_bytes(uint8_t kind, uint8_t dtype, uint32_t hidden,
					     uint32_t ffn, uint32_t t)
{
	uint64_t n;
	if (__builtin_mul_overflow(dp_tensor_elems(kind, hidden, ffn, t), dp_dtype_size(dtype), &n))
		return UINT64_MAX;
	return n;
}

/* Bytes of shard tensor t of duck `duck` (at index i) of layer l: FP8 weights with their
 * scales (dp_fp8_tensor_bytes), else dp_shard_tensor_bytes. */
static inline uint64_t dp_desc_tensor_bytes(const struct dp_desc_layer *l, uint32_t duck,
					    uint32_t i, uint32_t t)
{
	if (l->weight_dtype != DP_DTYPE_F8E4M3)
		return dp_shard_tensor_bytes(l->kind, l->dtype, l->hidden, l->shard[i], t);
	uint32_t experts = l->experts_on && duck < DP_MAX_DUCKS ? l->experts_on[duck] : 0;
	return dp_fp8_tensor_bytes(l->hidden, l->shard[i], experts, l->experts_on ? l->expert_ffn : 0);
}

/* A forward's flags against its layer: ROUTED exactly on mixture-of-experts layers, at
 * most one forced mode, and with ROUTED no target set (the routing says which ducks) and
 * at most DP_MAX_TOKENS rows. `any`: the descriptor names ducks. */
static inline int dp_desc_check_routed(const struct dp_desc_layer *l, const struct dp_desc *d,
				       bool any, uint32_t rows, char *why, size_t whylen)
{
	const uint32_t known = DP_DESC_FLAG_ROUTED | DP_DESC_FLAG_MOE_BROADCAST |
			       DP_DESC_FLAG_MOE_UNICAST;
	const uint32_t modes = DP_DESC_FLAG_MOE_BROADCAST | DP_DESC_FLAG_MOE_UNICAST;
	bool routed = d->flags & DP_DESC_FLAG_ROUTED;
	if (d->flags & ~known)
		return dp_refuse(-1, why, whylen, "descriptor flags 0x%x: only ROUTED, MOE_BROADCAST "
				      "and MOE_UNICAST (0x%x) are defined", d->flags, known);
	if (routed && l->kind != DP_MLP_KIND_MOE)
		return dp_refuse(-1, why, whylen, "layer %u is dense: routing is only for "
				      "mixture-of-experts layers", l->id);
	if (!routed && l->kind == DP_MLP_KIND_MOE)
		return dp_refuse(-1, why, whylen, "layer %u is a mixture of experts: the forward "
				      "needs its routing", l->id);
	if (!routed && (d->flags & modes))
		return dp_refuse(-1, why, whylen, "MOE_BROADCAST and MOE_UNICAST are for routed "
				      "forwards only");
	if ((d->flags & modes) == modes)
		return dp_refuse(-1, why, whylen, "MOE_BROADCAST and MOE_UNICAST together: force "
				      "one mode, or neither for the dataplane's choice");
	if (routed && any)
		return dp_refuse(-1, why, whylen, "a routed forward takes no target set (ducks=): its "
				      "routing says which ducks get which rows");
	if (routed && rows > DP_MAX_TOKENS)
		return dp_refuse(-1, why, whylen, "a routed forward has at most %u rows, not %u",
				      DP_MAX_TOKENS, rows);
	return 0;
}

static inline int dp_desc_check_forward(const struct dp_client_layout *c,
					const struct dp_desc_layer *l, const struct dp_desc *d,
					const struct dp_limits *lim, struct dp_desc_plan *out,
					char *why, size_t whylen)
{
	if (l && l->foreign)
		return dp_refuse(-1, why, whylen, "layer %u belongs to another client", d->layer);
	if (l && l->failed)
		return dp_refuse(-1, why, whylen, "layer %u failed to load (Layers: failed, missing); "
				      "load it again", d->layer);
	if (!l || !l->ready)
		return dp_refuse(-1, why, whylen, "layer %u is not loaded", d->layer);
	if (d->dtype != l->dtype)
		return dp_refuse(-1, why, whylen, "dtype %u does not match layer %u's (%u)", d->dtype,
				      l->id, l->dtype);
	if (d->ndim < 1 || d->ndim > DP_MAX_DIMS || d->shape[d->ndim - 1] != l->hidden)
		return dp_refuse(-1, why, whylen, "shape does not end in layer %u's hidden %u", l->id,
				      l->hidden);
	uint64_t elems = 1, bytes;
	for (uint32_t k = 0; k < d->ndim; k++)
		if (d->shape[k] == 0 || __builtin_mul_overflow(elems, d->shape[k], &elems))
			return dp_refuse(-1, why, whylen, "shape dimension %u (%u) is zero or overflows",
					      k, d->shape[k]);
	if (__builtin_mul_overflow(elems, dp_dtype_size(d->dtype), &bytes) || bytes != d->nbytes)
		return dp_refuse(-1, why, whylen, "%lu bytes do not match the shape",
				      (unsigned long)d->nbytes);
	if (bytes > c->act_slot_size || bytes > c->res_slot_size || bytes > lim->max_forward_bytes)
		return dp_refuse(-1, why, whylen, "%lu bytes exceed the slots or max_forward_bytes %lu",
				      (unsigned long)bytes, (unsigned long)lim->max_forward_bytes);
	if (d->timeout_us > lim->max_timeout_us)
		return dp_refuse(-1, why, whylen,
				      "timeout %u us is over this dataplane's max_timeout_us %u",
				      d->timeout_us, lim->max_timeout_us);
	bool any = d->ducks[0] | d->ducks[1] | d->ducks[2] | d->ducks[3];
	uint32_t rows = (uint32_t)(elems / l->hidden); /* exact: the last dimension is hidden */
	if (dp_desc_check_routed(l, d, any, rows, why, whylen) < 0)
		return -1;
	uint32_t n = 0;
	memset(out->targets, 0, sizeof(out->targets));
	for (uint32_t k = 0; k < DP_MAX_DUCKS; k++) {
		bool wanted = any ? dp_targets_has(d->ducks, k) : l->index[k] >= 0;
		if (!wanted)
			continue;
		if (l->index[k] < 0)
			return dp_refuse(-1, why, whylen, "duck %u holds no shard of layer %u", k,
					      l->id);
		out->targets[k >> 6] |= 1ull << (k & 63);
		n++;
	}
	if (n == 0)
		return dp_refuse(-1, why, whylen, "layer %u has no ducks to ask", l->id);
	out->bytes = bytes;
	out->rows = rows;
	out->timeout_us = d->timeout_us ? d->timeout_us : lim->default_timeout_us;
	out->duck_index = -1;
	return 0;
}

static inline int dp_desc_check_weight(const struct dp_client_layout *c,
				       const struct dp_desc_layer *l, const struct dp_desc *d,
				       const struct dp_limits *lim, struct dp_desc_plan *out,
				       char *why, size_t whylen)
{
	uint64_t end, size;
	if (l && l->foreign)
		return dp_refuse(-1, why, whylen, "layer %u belongs to another client", d->layer);
	if (!l)
		return dp_refuse(-1, why, whylen,
				      "layer %u is not being loaded (send LoadWeights first)", d->layer);
	/* a committed layer takes the banks of the ducks a repair restreams, nothing else:
	 * b_down never leaves the dataplane, and the other ducks' banks are serving */
	if (l->ready && (!l->repair || d->duck >= DP_MAX_DUCKS || !dp_targets_has(l->repair, d->duck)))
		return dp_refuse(-1, why, whylen,
				      "layer %u is loaded: weight chunks go only to the ducks a "
				      "RepairLayer names (or send LoadWeights to replace it)", d->layer);
	if (d->nbytes == 0 || d->nbytes > c->act_slot_size || d->nbytes > lim->max_forward_bytes)
		return dp_refuse(-1, why, whylen, "weight chunk of %lu bytes", (unsigned long)d->nbytes);
	if (__builtin_add_overflow(d->offset, d->nbytes, &end))
		return dp_refuse(-1, why, whylen, "weight chunk [%lu, +%lu) overflows",
				      (unsigned long)d->offset, (unsigned long)d->nbytes);
	if (d->duck == DP_HOST_TENSOR_DUCK) {
		/* b_down stays in the dataplane: it is added once, after the reduce */
		size = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
		if (!l->has_b_down || d->tensor != DP_B_DOWN_TENSOR || end > size)
			return dp_refuse(-1, why, whylen, "bad b_down chunk for layer %u", l->id);
		out->duck_index = -1;
	} else {
		int16_t i = d->duck < DP_MAX_DUCKS ? l->index[d->duck] : -1;
		if (i < 0 || d->tensor >= DP_SHARD_TENSORS ||
		    end > dp_desc_tensor_bytes(l, d->duck, (uint32_t)i, d->tensor))
			return dp_refuse(-1, why, whylen,
					      "duck %u tensor %u [%lu, +%lu) is not in layer %u",
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

/* 0 with *out filled, or -1 with the reason in why (the descriptor completes BAD_REQUEST).
 * layer: what the check reads of the layer desc->layer names (the client's own, or a
 * shared one to forward on), or NULL when there is none. */
static inline int dp_desc_check(const struct dp_client_layout *c, const struct dp_desc_layer *layer,
				const struct dp_desc *d, const struct dp_limits *lim,
				struct dp_desc_plan *out, char *why, size_t whylen)
{
	if (d->slot >= c->slot_count)
		return dp_refuse(-1, why, whylen, "slot %u is out of range", d->slot);
	switch (d->op) {
	case DP_OP_FORWARD:
		return dp_desc_check_forward(c, layer, d, lim, out, why, whylen);
	case DP_OP_WEIGHT_CHUNK:
		return dp_desc_check_weight(c, layer, d, lim, out, why, whylen);
	case DP_OP_WEIGHT_COMMIT:
		memset(out, 0, sizeof(*out));
		out->duck_index = -1;
		return 0; /* the commit itself checks the layer, once every chunk is in */
	}
	return dp_refuse(-1, why, whylen, "unknown op %u", d->op);
}

/* A routed forward's host table sits in its activation slot at this offset (the
 * activation's bytes rounded up to 64: schema/routing.py). */
static inline uint64_t dp_desc_routing_offset(uint64_t nbytes)
{
	return (nbytes + 63) & ~(uint64_t)63; /* nbytes <= max_forward_bytes: no wrap */
}

/* The most one duck of a routed forward may be sent in one message: the worst wire table
 * (every duck a section, every (token, choice) an entry) and every row (a broadcast's;
 * a unicast's rows and table are fewer). A message is what a duck reassembles and a NACK
 * names chunks of, so it is held to max_forward_bytes, which the workers hold to
 * DP_REASM_MAX_CHUNKS datagrams (dp_worker_init); nothing bounds the sum of a unicast's
 * messages, which go out from the slot in place. */
static inline uint64_t dp_desc_routed_bytes(const struct dp_desc_plan *plan, uint32_t topk)
{
	return DP_ROUTING_WIRE_HEADER_SIZE +
	       8 * ((uint64_t)DP_MAX_DUCKS + (uint64_t)plan->rows * topk) + plan->bytes;
}

/* The host routing table of a routed forward that passed dp_desc_check, copied out of
 * its activation slot (slot: act_slot_size bytes the client may rewrite at any time)
 * into copy (copy_cap bytes, the caller's own) and checked there against the forward's
 * rows and the layer's n_experts. The slot is read twice only: the header (for topk),
 * then the table whole into the copy; everything after reads the copy, whose topk may
 * differ from the first read only to be refused (the size it was copied at no longer
 * holds). 0 and *table_bytes, or -1 and why (the forward completes BAD_REQUEST). */
static inline int dp_desc_routing_copy(const struct dp_client_layout *c, const struct dp_limits *lim,
				       const struct dp_desc_plan *plan, const uint8_t *slot,
				       uint32_t n_experts, void *copy, uint64_t copy_cap,
				       uint64_t *table_bytes, char *why, size_t whylen)
{
	struct dp_routing_header h;
	uint64_t at = dp_desc_routing_offset(plan->bytes), size;
	if (at > c->act_slot_size || c->act_slot_size - at < DP_ROUTING_HEADER_SIZE)
		return dp_refuse(-1, why, whylen, "no room for the routing table after the "
				      "activation's %llu bytes in a %llu-byte slot: connect(slot_size=) "
				      "larger", (unsigned long long)plan->bytes,
				      (unsigned long long)c->act_slot_size);
	memcpy(&h, slot + at, sizeof(h));
	uint32_t topk = h.topk > DP_MAX_TOPK ? DP_MAX_TOPK : h.topk; /* the check refuses more */
	if (topk == 0)
		topk = 1;
	if (dp_routing_size(plan->rows, topk, &size) < 0 || size > c->act_slot_size - at)
		return dp_refuse(-1, why, whylen, "the routing table (%llu bytes at byte %llu) does "
				      "not fit the %llu-byte slot: connect(slot_size=%llu) or more",
				      (unsigned long long)size, (unsigned long long)at,
				      (unsigned long long)c->act_slot_size,
				      (unsigned long long)(at + size));
	/* The table is copied into the context's own copy_cap bytes (the largest table, or
	 * max_forward_bytes, the smaller: dp_fwd_pool_init); one duck's message, table and
	 * rows, must fit max_forward_bytes (dp_desc_routed_bytes) */
	uint64_t need = dp_desc_routed_bytes(plan, topk);
	if (need > lim->max_forward_bytes || size > copy_cap)
		return dp_refuse(-1, why, whylen, "a routed forward of %u rows by top-%u sends a "
				      "duck up to %llu bytes in one message (table and rows); "
				      "max_forward_bytes is %llu",
				      plan->rows, topk, (unsigned long long)need,
				      (unsigned long long)lim->max_forward_bytes);
	memcpy(copy, slot + at, size);
	char rwhy[DP_DESC_WHY_LEN - 16];
	if (dp_routing_check(copy, size, plan->rows, n_experts, rwhy, sizeof(rwhy)) < 0)
		return dp_refuse(-1, why, whylen, "routing: %s", rwhy);
	*table_bytes = size;
	return 0;
}

#endif /* DP_DESC_CHECK_H */
