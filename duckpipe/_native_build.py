"""cffi build script (out-of-line API mode): the ffi of duckpipe._native.

meson.build runs it with --emit to write the module's C source and compiles that.

The struct and enum declarations are the @cdef section of the generated
dataplane/include/gen/dp_abi.h, so the cffi module, the dataplane and the duck
emulator compile against one header; cffi checks every field offset at build.
"""

from pathlib import Path

from cffi import FFI

INCLUDE = Path(__file__).resolve().parent.parent / "dataplane" / "include"
CDEF_BEGIN = "/* @cdef-begin: cffi parses from here */"
CDEF_END = "/* @cdef-end */"


def cdef_section(header: str) -> str:
    """The @cdef section of one header in dataplane/include/ (or its generated gen/)."""
    path = INCLUDE / header
    text = (path if path.exists() else INCLUDE / "gen" / header).read_text()
    return text.split(CDEF_BEGIN, 1)[1].split(CDEF_END, 1)[0]


def abi_cdef() -> str:
    return cdef_section("dp_abi.h")


FUNCTIONS = """
uint64_t dp_load_acquire_u64(const uint64_t *p);
void dp_store_release_u64(uint64_t *p, uint64_t v);
uint32_t dp_ring_count(const struct dp_ring_header *r);
uint32_t dp_ring_push_burst(struct dp_ring_header *r, struct dp_desc *descs,
                            uint32_t capacity, const struct dp_desc *in, uint32_t n);
uint32_t dp_ring_pop_burst(struct dp_ring_header *r, const struct dp_desc *descs,
                           uint32_t capacity, struct dp_desc *out, uint32_t n);
int32_t dp_ring_consume(struct dp_ring_header *r, const struct dp_desc *descs,
                        uint32_t capacity, uint64_t *tail, uint64_t *head_seen,
                        struct dp_desc *out, uint32_t n);
int dp_ring_push(struct dp_ring_header *r, struct dp_desc *descs, uint32_t capacity,
                 const struct dp_desc *d);
int dp_ring_pop(struct dp_ring_header *r, const struct dp_desc *descs, uint32_t capacity,
                struct dp_desc *out);
int dp_slot_publish(struct dp_slot_header *h, const struct dp_slot_header *v,
                    uint32_t generation, uint32_t status);
int dp_slot_phases(const struct dp_slot_header *h, uint32_t generation, uint64_t *out);
uint64_t dp_spin_until_generation(const uint64_t *done, uint32_t generation, uint64_t max_ns,
                                  int polite);
int dp_client_submit(const struct dp_seg_header *seg, struct dp_ring_header *r,
                     struct dp_desc *descs, uint32_t capacity, const struct dp_desc *d,
                     int doorbell_fd);
int dp_completions_want(struct dp_seg_header *h, int want, int doorbell_fd);
struct dp_submitter {
    const struct dp_seg_header *seg;
    struct dp_ring_header *ring;
    struct dp_desc *descs;
    uint32_t capacity;
    int doorbell_fd;
};
int dp_submit_template(const struct dp_submitter *s, const struct dp_desc *tpl,
                       uint64_t forward_id, uint32_t slot, uint32_t generation, uint64_t epoch);
uint64_t dp_wait_done(struct dp_slot_header *h, uint32_t generation, uint64_t spin_ns,
                      uint64_t sleep_ns);
struct dp_routed_submit {
    struct dp_desc tpl;
    uint64_t table_len;
    uint32_t tokens;
    uint32_t topk;
    uint32_t n_experts;
    uint32_t index_size;
    char why[256];
};
int dp_submit_routed(const struct dp_submitter *s, struct dp_routed_submit *r,
                     uint64_t forward_id, uint32_t slot, uint32_t generation, uint64_t epoch,
                     const void *indices, const void *weights, void *table);
int dp_seg_plan(uint32_t slot_count, uint32_t ring_capacity, uint64_t act_slot_size,
                uint64_t res_slot_size, uint64_t page_size, struct dp_seg_plan *out);
const char *dp_seg_plan_strerror(int rc);
int dp_seg_check(const struct dp_seg_header *h, uint64_t file_size, uint32_t max_slots,
                 uint64_t max_bytes, struct dp_seg_plan *out);
int dp_msgpack_prescan(const char *buf, size_t len, uint32_t max_depth, char *why, size_t n);
uint32_t dp_wire_payload_max(uint32_t mtu);
int dp_desc_check(const struct dp_client_layout *c, const struct dp_desc_layer *layer,
                  const struct dp_desc *d, const struct dp_limits *lim, struct dp_desc_plan *out,
                  char *why, size_t whylen);
int dp_desc_routing_copy(const struct dp_client_layout *c, const struct dp_limits *lim,
                         const struct dp_desc_plan *plan, const uint8_t *slot,
                         uint32_t n_experts, void *copy, uint64_t copy_cap,
                         uint64_t *table_bytes, char *why, size_t whylen);
uint64_t dp_client_quota(uint64_t contexts, uint32_t nactive, uint64_t client_max_inflight);
int dp_routing_size(uint64_t tokens, uint64_t topk, uint64_t *out);
int dp_routing_check(const void *table, uint64_t len, uint32_t tokens, uint32_t n_experts,
                     char *why, size_t n);
int dp_routing_pack(const void *indices, uint32_t index_size, const void *weights,
                    uint32_t tokens, uint32_t topk, uint32_t n_experts, void *out,
                    uint64_t out_len, char *why, size_t n);
int dp_routing_placement_check(const struct dp_routing_placement *pl, char *why, size_t n);
uint32_t dp_routing_live(const struct dp_routing_placement *pl, const uint16_t *slots,
                         const uint64_t *lost, struct dp_routing_placement *out,
                         uint16_t *out_slots);
void dp_routing_bank_slots(const struct dp_routing_placement *pl, uint16_t *slots,
                           uint16_t *per_duck);
int dp_routing_split(const void *table, uint64_t len, const struct dp_routing_placement *pl,
                     const uint16_t *slots, uint8_t flags, const uint64_t *ducks, void *out,
                     uint64_t out_len, uint64_t *out_size, uint64_t *targets, char *why,
                     size_t n);
int dp_routing_wire_check(const void *table, uint64_t len, uint32_t rows, uint32_t n_experts,
                          char *why, size_t n);
int dp_routing_wire_section(const void *table, uint64_t len, uint16_t duck,
                            struct dp_routing_section *out);
int dp_routing_wire_unicast(const void *table, uint64_t len, uint16_t duck, void *out,
                            uint64_t out_len, uint16_t *row_map, uint32_t row_cap,
                            uint64_t *out_size, char *why, size_t n);
const char *dp_routing_strerror(int rc);
int dp_attach_admit(const struct dp_attach_census *c, const struct dp_attach_limits *lim,
                    bool *quota, char *why, size_t n);
int dp_load_check(const struct dp_ctl_load_weights *m, const struct dp_load_limits *lim,
                  const int16_t *topology, char *why, size_t n);
int dp_load_moe_plan(const struct dp_ctl_load_weights *m, struct dp_layer_moe *moe, char *why,
                     size_t n);
uint32_t dp_load_moe_shared_stand_in(const struct dp_layer_moe *moe, const uint16_t *ducks,
                                     const uint32_t *shard, uint32_t nducks, uint32_t i,
                                     const uint64_t *can);
uint64_t dp_load_state_bytes(const struct dp_ctl_load_weights *m);
uint64_t dp_load_plan_bytes(const struct dp_ctl_load_weights *m);
int dp_load_quota_check(const struct dp_ctl_load_weights *m, const struct dp_load_holding *h,
                        uint64_t bytes, char *why, size_t n);
"""

# Only the Python client spins or sleeps on a done word; the GIL is released for the call.
SOURCE = r"""
#include <time.h>
#include "dp_abi.h"
#include "dp_ring.h"
#include "dp_seg_plan.h"
#include "dp_msgpack_scan.h" /* the mock dataplane's control pre-scan: the dataplane's own */
#include "dp_wire.h"    /* dp_wire_payload_max: chunk sizes for tools and fake ducks */
/* the mock dataplane's descriptor check and fair share: the dataplane's own */
#include "dp_desc_check.h"
#include "dp_fair_share.h"
#include "dp_routing.h" /* MoE routing tables: the client's pack, the mock's check */
/* the mock dataplane's Attach admission and LoadWeights rules: the dataplane's own */
#include "dp_ctl_rules.h"

#include <sched.h>
static uint64_t dp_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spin until the done word carries `generation` with a final status, or max_ns pass.
 * Returns the last word read. polite: spin by yielding (a core shared with the
 * dataplane or the model, which then run first). */
static uint64_t dp_spin_until_generation(const uint64_t *done, uint32_t generation, uint64_t max_ns,
                                         int polite)
{
    uint64_t deadline = dp_mono_ns() + max_ns;
    for (unsigned i = 0;; i++) {
        uint64_t w = dp_load_acquire_u64(done);
        if ((uint32_t)(w >> 32) == generation && (uint32_t)w != DP_STATUS_PENDING)
            return w;
        if ((i & 63) == 63 && dp_mono_ns() >= deadline)
            return w;
        if (polite)
            sched_yield();
        else
            dp_cpu_relax();
    }
}

/* Push one descriptor, then ring the dataplane's doorbell if it said it parks
 * (dp_wake.h). Returns -1 when the ring is full, 1 when it rang, else 0. */
static int dp_client_submit(const struct dp_seg_header *seg, struct dp_ring_header *r,
                            struct dp_desc *descs, uint32_t capacity, const struct dp_desc *d,
                            int doorbell_fd)
{
    if (dp_ring_push(r, descs, capacity, d) < 0)
        return -1;
    return doorbell_fd >= 0 && dp_doorbell_ring(seg, doorbell_fd) == 1;
}

/* What dp_client_submit needs of one client's ring, gathered once: the Python client's
 * per-forward call then converts a handful of arguments, not a dozen. */
struct dp_submitter {
    const struct dp_seg_header *seg;
    struct dp_ring_header *ring;
    struct dp_desc *descs;
    uint32_t capacity;
    int doorbell_fd; /* -1: no doorbell */
};

/* dp_client_submit of a copy of `tpl` (a descriptor prepared once per layer, shape and
 * dtype) with the fields that change per forward filled in, and submit_ns taken here
 * (CLOCK_MONOTONIC, the clock runtime.monotonic_ns reads). Same return values. */
static int dp_submit_template(const struct dp_submitter *s, const struct dp_desc *tpl,
                              uint64_t forward_id, uint32_t slot, uint32_t generation,
                              uint64_t epoch)
{
    struct dp_desc d;
    memcpy(&d, tpl, sizeof d);
    d.forward_id = forward_id;
    d.slot = slot;
    d.generation = generation;
    d.epoch = epoch;
    d.submit_ns = dp_mono_ns();
    return dp_client_submit(s->seg, s->ring, s->descs, s->capacity, &d, s->doorbell_fd);
}

/* What a routed submit of one layer, shape, dtype, send mode and routing shape needs
 * beyond its arguments, filled in once by the client's first such submit (its plan):
 * the FORWARD template, the routing's shape and index width, the table's bytes, and
 * room for a refusal's reason (the client's, read only after a refusal). */
struct dp_routed_submit {
    struct dp_desc tpl;
    uint64_t table_len;  /* dp_routing_size(tokens, topk): the bytes at `table` */
    uint32_t tokens;
    uint32_t topk;
    uint32_t n_experts;
    uint32_t index_size; /* 4: int32 ids, 8: int64 */
    char why[256];
};

/* A routed submit in one call (issue 29: two calls and the Python between them cost a
 * routed submit 3.8x a dense one at 1 token): dp_routing_pack of a gate's [tokens][topk]
 * indices and weights into the slot's table (table_len bytes at `table`, behind the
 * activation), every entry judged by the C rule, then, only if it accepted them all,
 * dp_submit_template of r's template. The caller vouches that indices and weights hold
 * tokens * topk elements, C-contiguous, and table table_len bytes of the slot: the
 * plan's checks. Returns the pack's refusal (< 0, enum dp_routing_error, reason in
 * r->why): nothing was published, and the slot's half-written table is the client's
 * own; else 0 published, 1 published and the doorbell rung, 2 the ring was full
 * (nothing published). */
static int dp_submit_routed(const struct dp_submitter *s, struct dp_routed_submit *r,
                            uint64_t forward_id, uint32_t slot, uint32_t generation,
                            uint64_t epoch, const void *indices, const void *weights,
                            void *table)
{
    r->why[0] = '\0'; /* an earlier refusal's reason is not this call's */
    int rc = dp_routing_pack(indices, r->index_size, weights, r->tokens, r->topk, r->n_experts,
                             table, r->table_len, r->why, sizeof r->why);
    if (rc < 0)
        return rc;
    rc = dp_submit_template(s, &r->tpl, forward_id, slot, generation, epoch);
    return rc < 0 ? 2 : rc;
}

/* Wait for the slot's done word to carry `generation`: spin up to spin_ns, then sleep
 * on its futex up to sleep_ns more (0: don't). Returns the last word read. A wait that
 * sleeps after its spin (hybrid) is one for a core shared with the dataplane: it spins
 * by yielding, or its spin kept the dataplane that finishes the forward off the core
 * (a one-duck forward's p50 114 -> 57 us; docs/benchmark-history.md, issue 19 fourth round). */
static uint64_t dp_wait_done(struct dp_slot_header *h, uint32_t generation, uint64_t spin_ns,
                             uint64_t sleep_ns)
{
    uint64_t w = spin_ns ? dp_spin_until_generation(&h->done, generation, spin_ns, sleep_ns != 0)
                         : dp_load_acquire_u64(&h->done);
    if ((uint32_t)(w >> 32) == generation || !sleep_ns)
        return w;
    return dp_slot_sleep(h, generation, sleep_ns);
}
"""

ffibuilder = FFI()
ffibuilder.cdef(
    abi_cdef()
    + cdef_section("dp_seg_plan.h")
    + cdef_section("dp_desc_check.h")
    + cdef_section("dp_routing_abi.h")
    + cdef_section("dp_routing.h")
    + cdef_section("dp_ctl_gen.h")
    + cdef_section("dp_ctl_rules.h")
    + FUNCTIONS
)
ffibuilder.set_source(
    "duckpipe._native",
    SOURCE,
    include_dirs=[str(INCLUDE), str(INCLUDE / "gen")],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    # meson.build: `python _native_build.py --emit OUT.c` writes the module's C source
    # (cffi's API mode), which meson compiles as an extension module. Without
    # arguments: cffi compiles it in place (setuptools' compiler; a quick check).
    import sys

    if sys.argv[1:2] == ["--emit"] and len(sys.argv) == 3:
        ffibuilder.emit_c_code(sys.argv[2])
    else:
        ffibuilder.compile(verbose=True)
