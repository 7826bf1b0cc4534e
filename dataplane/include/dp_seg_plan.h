/* dp_seg_plan.h: the one rule that places every region of a segment.
 *
 * The creating client (duckpipe/shm.py, through cffi), the dataplane
 * (dp_client.c, at attach) and anyone else who maps a segment compute the
 * layout here and nowhere else; a header whose offsets differ from the plan is
 * refused. Every step is overflow-checked: a header is input from another
 * process, and a wrapped product once aimed the dataplane's writes 1 TiB past
 * a 4 KiB file.
 *
 *   ring_offset    = align(sizeof(dp_seg_header), 128)
 *   res_hdr_offset = align(ring_offset + sizeof(dp_ring_header) + capacity * sizeof(dp_desc), 64)
 *   act_offset     = align(res_hdr_offset + slots * sizeof(dp_slot_header), 4096)
 *   act_slot_size  = align(act_slot_size, 4096)      (page-aligned slots: NOTES.md, 4 KiB aliasing)
 *   res_slot_size  = align(res_slot_size, 4096)
 *   res_offset     = act_offset + slots * act_slot_size
 *   size           = align(res_offset + slots * res_slot_size, page_size)
 *
 * The struct and the enum below are parsed by cffi (duckpipe/_native_build.py
 * takes the @cdef section): keep them plain.
 */
#ifndef DP_SEG_PLAN_H
#define DP_SEG_PLAN_H

#include <stdint.h>

#include "dp_abi.h"

/* @cdef-begin: cffi parses from here */

struct dp_seg_plan {
    uint64_t ring_offset;
    uint64_t res_hdr_offset;
    uint64_t act_offset;
    uint64_t res_offset;
    uint64_t act_slot_size;  /* rounded up to 4 KiB */
    uint64_t res_slot_size;  /* rounded up to 4 KiB */
    uint64_t size;           /* whole pages of page_size */
};

/* Why dp_seg_plan() refused; dp_seg_plan_strerror() says it in words. */
enum dp_seg_plan_error {
    DP_SEG_PLAN_OK = 0,
    DP_SEG_PLAN_BAD_SLOT_COUNT = -1,     /* zero or not a power of two */
    DP_SEG_PLAN_BAD_CAPACITY = -2,       /* zero or not a power of two */
    DP_SEG_PLAN_CAPACITY_BELOW_SLOTS = -3,
    DP_SEG_PLAN_ZERO_SLOT_SIZE = -4,
    DP_SEG_PLAN_BAD_PAGE_SIZE = -5,      /* not a power of two of at least 4 KiB */
    DP_SEG_PLAN_OVERFLOW = -6,           /* the segment would not fit 64 bits */
};

/* @cdef-end */

#define DP_SEG_PLAN_SLOT_ALIGN 4096u

static inline int dp_seg_plan_pow2(uint64_t n)
{
	return n && !(n & (n - 1));
}

/* *out = n rounded up to a (a power of two); 0, or -1 when that overflows. */
static inline int dp_seg_plan_align(uint64_t n, uint64_t a, uint64_t *out)
{
	uint64_t sum;
	if (__builtin_add_overflow(n, a - 1, &sum))
		return -1;
	*out = sum & ~(a - 1);
	return 0;
}

/* 0 and *out filled, or a negative enum dp_seg_plan_error (then *out is untouched). */
static inline int dp_seg_plan(uint32_t slot_count, uint32_t ring_capacity, uint64_t act_slot_size,
			      uint64_t res_slot_size, uint64_t page_size, struct dp_seg_plan *out)
{
	struct dp_seg_plan p;
	uint64_t t, u;
	if (!dp_seg_plan_pow2(slot_count))
		return DP_SEG_PLAN_BAD_SLOT_COUNT;
	if (!dp_seg_plan_pow2(ring_capacity))
		return DP_SEG_PLAN_BAD_CAPACITY;
	if (ring_capacity < slot_count)
		return DP_SEG_PLAN_CAPACITY_BELOW_SLOTS;
	if (act_slot_size == 0 || res_slot_size == 0)
		return DP_SEG_PLAN_ZERO_SLOT_SIZE;
	if (!dp_seg_plan_pow2(page_size) || page_size < DP_SEG_PLAN_SLOT_ALIGN)
		return DP_SEG_PLAN_BAD_PAGE_SIZE;
	/* the header and ring terms cannot overflow (32-bit counts times 128); the rest can */
	p.ring_offset = (sizeof(struct dp_seg_header) + 127) & ~(uint64_t)127;
	t = p.ring_offset + sizeof(struct dp_ring_header) +
	    (uint64_t)ring_capacity * sizeof(struct dp_desc);
	p.res_hdr_offset = (t + 63) & ~(uint64_t)63;
	t = p.res_hdr_offset + (uint64_t)slot_count * sizeof(struct dp_slot_header);
	if (dp_seg_plan_align(t, DP_SEG_PLAN_SLOT_ALIGN, &p.act_offset) < 0 ||
	    dp_seg_plan_align(act_slot_size, DP_SEG_PLAN_SLOT_ALIGN, &p.act_slot_size) < 0 ||
	    dp_seg_plan_align(res_slot_size, DP_SEG_PLAN_SLOT_ALIGN, &p.res_slot_size) < 0 ||
	    __builtin_mul_overflow((uint64_t)slot_count, p.act_slot_size, &t) ||
	    __builtin_add_overflow(p.act_offset, t, &p.res_offset) ||
	    __builtin_mul_overflow((uint64_t)slot_count, p.res_slot_size, &t) ||
	    __builtin_add_overflow(p.res_offset, t, &u) ||
	    dp_seg_plan_align(u, page_size, &p.size) < 0)
		return DP_SEG_PLAN_OVERFLOW;
	*out = p;
	return DP_SEG_PLAN_OK;
}

static inline const char *dp_seg_plan_strerror(int rc)
{
	switch (rc) {
	case DP_SEG_PLAN_OK:
		return "ok";
	case DP_SEG_PLAN_BAD_SLOT_COUNT:
		return "slot_count must be a power of two";
	case DP_SEG_PLAN_BAD_CAPACITY:
		return "ring_capacity must be a power of two";
	case DP_SEG_PLAN_CAPACITY_BELOW_SLOTS:
		return "ring_capacity must be at least slot_count";
	case DP_SEG_PLAN_ZERO_SLOT_SIZE:
		return "slot sizes must be positive";
	case DP_SEG_PLAN_BAD_PAGE_SIZE:
		return "page size must be a power of two of at least 4 KiB";
	case DP_SEG_PLAN_OVERFLOW:
		return "the segment's size overflows 64 bits";
	}
	return "unknown segment plan error";
}

#endif /* DP_SEG_PLAN_H */
