/* dp_seg_plan.h: the one rule that places every region of a segment.
 *
 * The creating client (duckpipe/client/shm.py, through cffi), the dataplane
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
 * dp_seg_check() is the one check of a header someone else wrote against that plan
 * (the dataplane at attach, shm.py's Segment.open_fd/open for the mock dataplane and
 * tools): a header is accepted only when it is exactly what dp_seg_plan() would write.
 *
 * The struct and the enums below are parsed by cffi (duckpipe/_native_build.py
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

/* Why dp_seg_check() refused a header (or a negative enum dp_seg_plan_error). */
enum dp_seg_check_error {
    DP_SEG_CHECK_NO_MAGIC = -16,         /* not a duckpipe segment header */
    DP_SEG_CHECK_ABI_MAJOR = -17,        /* another ABI major version */
    DP_SEG_CHECK_STRUCT_SIZES = -18,     /* header_size or desc_size differs from this build's */
    DP_SEG_CHECK_BACKING = -19,          /* neither hugetlbfs nor devshm */
    DP_SEG_CHECK_OVER_LIMITS = -20,      /* more slots or bytes than the reader allows */
    DP_SEG_CHECK_LAYOUT = -21,           /* offsets, sizes or file size not the plan's */
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

/* Page size of a backing, in bytes; 0 for an unknown backing. */
static inline uint64_t dp_seg_page_size(uint32_t backing)
{
	return backing == DP_BACKING_HUGETLBFS ? 2ull << 20 : backing == DP_BACKING_DEVSHM ? 4096u : 0;
}

/* Check a private copy of a header (read with pread, never the mapping) for a file of
 * file_size bytes: 0 and *out the plan it passed, or a negative enum dp_seg_check_error
 * or dp_seg_plan_error (the plan's own refusal). */
static inline int dp_seg_check(const struct dp_seg_header *h, uint64_t file_size,
			       uint32_t max_slots, uint64_t max_bytes, struct dp_seg_plan *out)
{
	struct dp_seg_plan p;
	if (h->magic != DP_SEG_MAGIC)
		return DP_SEG_CHECK_NO_MAGIC;
	if (h->abi_major != DP_ABI_MAJOR)
		return DP_SEG_CHECK_ABI_MAJOR;
	if (h->header_size != sizeof(struct dp_seg_header) || h->desc_size != sizeof(struct dp_desc))
		return DP_SEG_CHECK_STRUCT_SIZES;
	if (!dp_seg_page_size(h->backing))
		return DP_SEG_CHECK_BACKING;
	if (h->slot_count > max_slots || file_size > max_bytes)
		return DP_SEG_CHECK_OVER_LIMITS;
	int rc = dp_seg_plan(h->slot_count, h->ring_capacity, h->act_slot_size, h->res_slot_size,
			     dp_seg_page_size(h->backing), &p);
	if (rc < 0)
		return rc;
	if (h->ring_offset != p.ring_offset || h->res_hdr_offset != p.res_hdr_offset ||
	    h->act_offset != p.act_offset || h->res_offset != p.res_offset ||
	    h->act_slot_size != p.act_slot_size || h->res_slot_size != p.res_slot_size ||
	    h->segment_size != p.size || p.size != file_size)
		return DP_SEG_CHECK_LAYOUT;
	*out = p;
	return 0;
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
	case DP_SEG_CHECK_NO_MAGIC:
		return "no duckpipe segment header";
	case DP_SEG_CHECK_ABI_MAJOR:
		return "another segment ABI major version";
	case DP_SEG_CHECK_STRUCT_SIZES:
		return "header or descriptor size differs from this build's";
	case DP_SEG_CHECK_BACKING:
		return "unknown backing";
	case DP_SEG_CHECK_OVER_LIMITS:
		return "over the reader's limits";
	case DP_SEG_CHECK_LAYOUT:
		return "the header's layout is not one this version writes";
	}
	return "unknown segment plan error";
}

#endif /* DP_SEG_PLAN_H */
