/* dp_tsan.h: telling ThreadSanitizer about hand-overs it cannot see.
 *
 * A slot goes from the agent that publishes its completion (dp_fwd_publish: the
 * done word, release) to the client process, which reads the result and then
 * submits the same slot again through its ring; the dispatcher reads that
 * descriptor (acquire) and a NIC worker fills the slot. The middle of that chain
 * runs in another address space, so TSan sees a NIC worker's memset of a result
 * slot race with another NIC worker's earlier reduce into it. These two calls
 * draw the edge TSan misses, on the slot's header: DP_TSAN_RELEASE after the
 * completion is published, DP_TSAN_ACQUIRE when a descriptor naming the slot is
 * taken. Without TSan they compile to nothing.
 */
#ifndef DP_TSAN_H
#define DP_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define DP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DP_TSAN 1
#endif
#endif

#ifdef DP_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define DP_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#define DP_TSAN_RELEASE(p) __tsan_release((void *)(p))
#else
#define DP_TSAN_ACQUIRE(p) ((void)(p))
#define DP_TSAN_RELEASE(p) ((void)(p))
#endif

#endif /* DP_TSAN_H */
