/* dp_desc.h: the check every submission descriptor passes before the dataplane acts on it.
 *
 * A descriptor is input from another process, like a datagram. dp_desc_check()
 * is a pure function of the dataplane's private copy of the client's layout,
 * the layer the descriptor names, the descriptor (already copied out of the
 * ring, so it cannot change under us) and the configured limits: a fuzz
 * harness calls it exactly as the dispatcher does.
 */
#ifndef DP_DESC_H
#define DP_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_client.h" /* struct dp_client_layout */
#include "dp_layers.h"

/* A duck id bitmap (a descriptor's ducks, a forward's targets): is duck in it? */
static inline bool dp_targets_has(const uint64_t *t, uint32_t duck)
{
	return (t[duck >> 6] >> (duck & 63)) & 1;
}

struct dp_limits {
	uint64_t max_forward_bytes;  /* largest activation, result or weight chunk */
	uint32_t default_timeout_us; /* a descriptor's timeout_us 0 means this */
	uint32_t max_timeout_us;     /* larger timeouts are refused */
};

/* What a descriptor that passed asks for, computed once with checked arithmetic. */
struct dp_desc_plan {
	uint64_t bytes;                       /* FORWARD: activation (= result) bytes; WEIGHT_CHUNK: chunk */
	uint64_t timeout_us;                  /* FORWARD: the deadline after pickup */
	uint32_t rows;                        /* FORWARD: activation rows (tokens) */
	int32_t duck_index;                   /* WEIGHT_CHUNK: desc->duck's index in the layer; -1: b_down */
	uint64_t targets[DP_MAX_DUCKS / 64];  /* FORWARD: the ducks to ask, each holding a shard */
};

/* 0 with *out filled, or -1 with the reason in why (the descriptor completes BAD_REQUEST).
 * layer: the layer desc->layer names, or NULL when there is none. */
int dp_desc_check(const struct dp_client_layout *c, const struct dp_layer *layer,
		  const struct dp_desc *d, const struct dp_limits *lim, struct dp_desc_plan *out,
		  char *why, size_t whylen);

#endif /* DP_DESC_H */
