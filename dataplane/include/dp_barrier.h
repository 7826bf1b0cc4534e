/* dp_barrier.h: the only place that orders memory between processes.
 *
 * Everything shared is a plain fixed-width field in dp_abi.h (so cffi can parse
 * it); these helpers reach it through C11 atomics, as liburing's barrier.h does.
 */
#ifndef DP_BARRIER_H
#define DP_BARRIER_H

#include <stdatomic.h>
#include <stdint.h>

static inline uint64_t dp_load_acquire_u64(const uint64_t *p)
{
	return atomic_load_explicit((const _Atomic uint64_t *)p, memory_order_acquire);
}

static inline void dp_store_release_u64(uint64_t *p, uint64_t v)
{
	atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_release);
}

/* A field only its owner writes, read by the owner itself: no ordering needed. */
static inline uint64_t dp_load_relaxed_u64(const uint64_t *p)
{
	return atomic_load_explicit((const _Atomic uint64_t *)p, memory_order_relaxed);
}

static inline void dp_store_relaxed_u64(uint64_t *p, uint64_t v)
{
	atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_relaxed);
}

static inline uint32_t dp_load_acquire_u32(const uint32_t *p)
{
	return atomic_load_explicit((const _Atomic uint32_t *)p, memory_order_acquire);
}

static inline void dp_store_release_u32(uint32_t *p, uint32_t v)
{
	atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release);
}

static inline void *dp_load_acquire_ptr(void *const *p)
{
	return atomic_load_explicit((void *_Atomic const *)p, memory_order_acquire);
}

static inline void dp_store_release_ptr(void **p, void *v)
{
	atomic_store_explicit((void *_Atomic *)p, v, memory_order_release);
}

/* Returns the value before; acq_rel so that the last one out sees everyone's writes. */
static inline uint64_t dp_fetch_add_u64(uint64_t *p, int64_t v)
{
	return atomic_fetch_add_explicit((_Atomic uint64_t *)p, (uint64_t)v, memory_order_acq_rel);
}

static inline uint32_t dp_fetch_sub_u32(uint32_t *p, uint32_t v)
{
	return atomic_fetch_sub_explicit((_Atomic uint32_t *)p, v, memory_order_acq_rel);
}

/* A full fence: my store before my next load of another word (the wake-up handshakes'
 * Dekker pattern, dp_wake.h and dp_waker.h). GCC's ThreadSanitizer cannot model
 * atomic_thread_fence (-Wtsan): there a seq_cst read-modify-write of a private word,
 * a locked instruction and so as full a barrier on x86, stands in for it. */
#if defined(__SANITIZE_THREAD__)
static inline void dp_fence_seq_cst(void)
{
	static uint32_t fence_word;
	(void)__atomic_fetch_add(&fence_word, 0, __ATOMIC_SEQ_CST);
}
#else
static inline void dp_fence_seq_cst(void)
{
	atomic_thread_fence(memory_order_seq_cst);
}
#endif

/* Tell the core we are spinning (frees the sibling hyperthread, saves power). */
static inline void dp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#endif /* DP_BARRIER_H */
