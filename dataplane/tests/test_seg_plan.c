/* test_seg_plan.c: dp_seg_plan() lays segments out as shm.py always has, and
 * refuses every header whose arithmetic would wrap. Exit 0 pass, 1 fail. */
#include <string.h>

#include "dp_seg_plan.h"
#include "test_check.h"

#define SMALL 4096u
#define HUGE (2u << 20)

static void test_lays_out_a_small_segment_with_page_aligned_slots(void)
{
	struct dp_seg_plan p;
	CHECK(dp_seg_plan(4, 4, 5000, 100, SMALL, &p) == 0, "refused");
	CHECK(p.ring_offset == 384, "ring_offset %lu", (unsigned long)p.ring_offset);
	CHECK(p.res_hdr_offset == 384 + 128 + 4 * 128, "res_hdr_offset %lu",
	      (unsigned long)p.res_hdr_offset);
	CHECK(p.act_offset == 4096, "act_offset %lu", (unsigned long)p.act_offset);
	CHECK(p.act_slot_size == 8192 && p.res_slot_size == 4096, "slot sizes");
	CHECK(p.res_offset == 4096 + 4 * 8192, "res_offset %lu", (unsigned long)p.res_offset);
	CHECK(p.size == p.res_offset + 4 * 4096, "size %lu", (unsigned long)p.size);
}

static void test_rounds_the_size_up_to_whole_hugepages(void)
{
	struct dp_seg_plan p;
	CHECK(dp_seg_plan(2, 8, 1 << 20, 1 << 20, HUGE, &p) == 0, "refused");
	CHECK(p.size % HUGE == 0 && p.size >= p.res_offset + 2 * (1 << 20), "size %lu",
	      (unsigned long)p.size);
}

static void test_refuses_counts_that_are_not_powers_of_two(void)
{
	struct dp_seg_plan p;
	CHECK(dp_seg_plan(0, 4, 1, 1, SMALL, &p) == DP_SEG_PLAN_BAD_SLOT_COUNT, "slots 0");
	CHECK(dp_seg_plan(3, 4, 1, 1, SMALL, &p) == DP_SEG_PLAN_BAD_SLOT_COUNT, "slots 3");
	CHECK(dp_seg_plan(4, 0, 1, 1, SMALL, &p) == DP_SEG_PLAN_BAD_CAPACITY, "capacity 0");
	CHECK(dp_seg_plan(4, 12, 1, 1, SMALL, &p) == DP_SEG_PLAN_BAD_CAPACITY, "capacity 12");
	CHECK(dp_seg_plan(8, 4, 1, 1, SMALL, &p) == DP_SEG_PLAN_CAPACITY_BELOW_SLOTS, "cap < slots");
}

static void test_refuses_zero_slot_sizes_and_odd_pages(void)
{
	struct dp_seg_plan p;
	CHECK(dp_seg_plan(4, 4, 0, 1, SMALL, &p) == DP_SEG_PLAN_ZERO_SLOT_SIZE, "act 0");
	CHECK(dp_seg_plan(4, 4, 1, 0, SMALL, &p) == DP_SEG_PLAN_ZERO_SLOT_SIZE, "res 0");
	CHECK(dp_seg_plan(4, 4, 1, 1, 0, &p) == DP_SEG_PLAN_BAD_PAGE_SIZE, "page 0");
	CHECK(dp_seg_plan(4, 4, 1, 1, 2048, &p) == DP_SEG_PLAN_BAD_PAGE_SIZE, "page 2048");
	CHECK(dp_seg_plan(4, 4, 1, 1, 12288, &p) == DP_SEG_PLAN_BAD_PAGE_SIZE, "page 12288");
}

static void test_refuses_every_size_that_wraps_64_bits(void)
{
	struct dp_seg_plan p;
	memset(&p, 0xab, sizeof(p));
	struct dp_seg_plan before = p;
	/* rounding a slot size up to 4 KiB wraps */
	CHECK(dp_seg_plan(4, 4, UINT64_MAX, 1, SMALL, &p) == DP_SEG_PLAN_OVERFLOW, "act max");
	CHECK(dp_seg_plan(4, 4, 1, UINT64_MAX - 100, SMALL, &p) == DP_SEG_PLAN_OVERFLOW, "res max");
	/* slots * slot size wraps: the 4 KiB file with result slots 1 TiB past it */
	CHECK(dp_seg_plan(1u << 31, 1u << 31, 1ull << 40, 4096, SMALL, &p) == DP_SEG_PLAN_OVERFLOW,
	      "slots * act");
	CHECK(dp_seg_plan(1u << 24, 1u << 24, 4096, 1ull << 41, SMALL, &p) == DP_SEG_PLAN_OVERFLOW,
	      "slots * res");
	/* res_offset + slots * res wraps although each product fits */
	CHECK(dp_seg_plan(1, 1, 1ull << 63, 1ull << 63, SMALL, &p) == DP_SEG_PLAN_OVERFLOW,
	      "sum");
	/* rounding the total up to a huge page wraps */
	CHECK(dp_seg_plan(1, 1, 4096, UINT64_MAX - (1ull << 20), 1ull << 32, &p) ==
		      DP_SEG_PLAN_OVERFLOW,
	      "page round");
	CHECK(!memcmp(&p, &before, sizeof(p)), "a refused plan wrote its output");
}

static void test_largest_counts_that_fit_are_planned_exactly(void)
{
	struct dp_seg_plan p;
	/* 2^31 descriptors and slot headers: big, but no term wraps */
	CHECK(dp_seg_plan(1u << 31, 1u << 31, 4096, 4096, SMALL, &p) == 0, "refused");
	uint64_t hdrs = 384 + 128 + (1ull << 31) * 128;
	CHECK(p.res_hdr_offset == hdrs, "res_hdr_offset %lu", (unsigned long)p.res_hdr_offset);
	CHECK(p.size == p.act_offset + (1ull << 31) * 8192, "size %lu", (unsigned long)p.size);
}

/* A header as shm.py writes one for 4 slots of 5000 bytes on small pages. */
static struct dp_seg_header good_header(struct dp_seg_plan *p)
{
	struct dp_seg_header h;
	memset(&h, 0, sizeof(h));
	dp_seg_plan(4, 4, 5000, 5000, SMALL, p);
	h.magic = DP_SEG_MAGIC;
	h.abi_major = DP_ABI_MAJOR;
	h.backing = DP_BACKING_DEVSHM;
	h.header_size = sizeof(h);
	h.desc_size = sizeof(struct dp_desc);
	h.segment_size = p->size;
	h.ring_offset = p->ring_offset;
	h.ring_capacity = 4;
	h.res_hdr_offset = p->res_hdr_offset;
	h.act_offset = p->act_offset;
	h.res_offset = p->res_offset;
	h.act_slot_size = p->act_slot_size;
	h.res_slot_size = p->res_slot_size;
	h.slot_count = 4;
	return h;
}

static void test_check_accepts_exactly_the_planned_header(void)
{
	struct dp_seg_plan p, got;
	struct dp_seg_header h = good_header(&p);
	CHECK(dp_seg_check(&h, p.size, 4, p.size, &got) == 0, "refused");
	CHECK(!memcmp(&p, &got, sizeof(p)), "the accepted plan differs");
#define REFUSED(field, value, rc)                                                          \
	do {                                                                               \
		struct dp_seg_header bad = good_header(&p);                                \
		bad.field = value;                                                         \
		CHECK(dp_seg_check(&bad, p.size, 4, p.size, &got) == (rc), #field " = " #value); \
	} while (0)
	REFUSED(magic, 0, DP_SEG_CHECK_NO_MAGIC);
	REFUSED(abi_major, DP_ABI_MAJOR + 1, DP_SEG_CHECK_ABI_MAJOR);
	REFUSED(header_size, 64, DP_SEG_CHECK_STRUCT_SIZES);
	REFUSED(desc_size, 64, DP_SEG_CHECK_STRUCT_SIZES);
	REFUSED(backing, 3, DP_SEG_CHECK_BACKING);
	REFUSED(backing, DP_BACKING_HUGETLBFS, DP_SEG_CHECK_LAYOUT); /* 2 MiB pages: other size */
	REFUSED(slot_count, 8, DP_SEG_CHECK_OVER_LIMITS);
	REFUSED(slot_count, 3, DP_SEG_PLAN_BAD_SLOT_COUNT);
	REFUSED(ring_capacity, 2, DP_SEG_PLAN_CAPACITY_BELOW_SLOTS);
	REFUSED(ring_capacity, 8, DP_SEG_CHECK_LAYOUT);
	REFUSED(ring_offset, 1u << 30, DP_SEG_CHECK_LAYOUT);
	REFUSED(res_offset, 4096, DP_SEG_CHECK_LAYOUT);
	REFUSED(act_slot_size, 5000, DP_SEG_CHECK_LAYOUT); /* not rounded as the plan does */
	REFUSED(segment_size, 1ull << 40, DP_SEG_CHECK_LAYOUT);
	REFUSED(act_slot_size, UINT64_MAX, DP_SEG_PLAN_OVERFLOW);
#undef REFUSED
	CHECK(dp_seg_check(&h, p.size + 4096, 4, UINT64_MAX, &got) == DP_SEG_CHECK_LAYOUT,
	      "a file longer than the plan");
	CHECK(dp_seg_check(&h, p.size, 4, p.size - 1, &got) == DP_SEG_CHECK_OVER_LIMITS,
	      "over max_bytes");
}

int main(void)
{
	test_lays_out_a_small_segment_with_page_aligned_slots();
	test_rounds_the_size_up_to_whole_hugepages();
	test_refuses_counts_that_are_not_powers_of_two();
	test_refuses_zero_slot_sizes_and_odd_pages();
	test_refuses_every_size_that_wraps_64_bits();
	test_largest_counts_that_fit_are_planned_exactly();
	test_check_accepts_exactly_the_planned_header();
	return test_result("test_seg_plan");
}
