/* dp_partial.h: may a duck's PARTIAL datagram be added into a forward's sum?
 *
 * The receive-side rule of the NIC worker (dp_gather.c dp_gather_on_partial), in a
 * header so that the worker and the libFuzzer harness (dataplane/fuzz/fuzz_wire_reasm.c)
 * run the same code. The guarantee it gives the caller: on DP_PARTIAL_ADD, the payload
 * adds h->length / item values at element h->offset / item of a float32 buffer of
 * `total / item` elements, and nowhere else, and never twice for one chunk.
 */
#ifndef DP_PARTIAL_H
#define DP_PARTIAL_H

#include <stdint.h>

#include "dp_reasm.h"
#include "dp_reduce.h"
#include "dp_wire.h"

enum dp_partial_verdict {
	DP_PARTIAL_ADD = 0,    /* new chunk, recorded in r: add its payload */
	DP_PARTIAL_DUPLICATE,  /* a chunk already added */
	DP_PARTIAL_MALFORMED,  /* geometry that disagrees with the forward or earlier chunks */
};

/* h passed dp_wire_check(); total and dtype are the forward's own (never the
 * datagram's); r and *chunk_bytes are this duck's reassembly state for the forward,
 * r->chunks == 0 before its first accepted chunk. A chunk size is whole items (one the
 * last chunk implies may not be): the failover sum walks a reply by its chunks
 * (dp_moe_accumulate_rest). */
static inline enum dp_partial_verdict dp_partial_admit(const struct dp_wire_header *h,
						       uint64_t total, uint8_t dtype,
						       struct dp_reasm *r, uint32_t *chunk_bytes)
{
	uint32_t item = dp_dtype_size(dtype);
	uint32_t size = dp_wire_chunk_size(h);
	if (item == 0 || h->total != total || h->dtype != dtype ||
	    h->chunks > DP_REASM_MAX_CHUNKS || h->offset % item || h->length % item ||
	    size == 0 || size % item ||
	    (r->chunks && (h->chunks != r->chunks || size != *chunk_bytes)))
		return DP_PARTIAL_MALFORMED;
	if (!r->chunks) {
		dp_reasm_reset(r, h->chunks);
		*chunk_bytes = size;
	}
	int fresh = dp_reasm_mark(r, h->chunk);
	return fresh > 0 ? DP_PARTIAL_ADD : fresh == 0 ? DP_PARTIAL_DUPLICATE : DP_PARTIAL_MALFORMED;
}

#endif /* DP_PARTIAL_H */
