/* dp_common.h: small things every dataplane file needs: time, logging, errors. */
#ifndef DP_COMMON_H
#define DP_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define DP_CACHE_LINE 64
#define dp_cache_aligned __attribute__((aligned(DP_CACHE_LINE)))
#define dp_likely(x) __builtin_expect(!!(x), 1)
#define dp_unlikely(x) __builtin_expect(!!(x), 0)
#define DP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static inline uint64_t dp_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock clients stamp submissions with */
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

enum dp_log_level { DP_LOG_DEBUG, DP_LOG_INFO, DP_LOG_WARN, DP_LOG_ERROR };

extern int dp_log_min;
void dp_log(enum dp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DP_DEBUG(...) do { if (dp_log_min <= DP_LOG_DEBUG) dp_log(DP_LOG_DEBUG, __VA_ARGS__); } while (0)
#define DP_INFO(...) dp_log(DP_LOG_INFO, __VA_ARGS__)
#define DP_WARN(...) dp_log(DP_LOG_WARN, __VA_ARGS__)
#define DP_ERROR(...) dp_log(DP_LOG_ERROR, __VA_ARGS__)

/* Functions return 0 / -1 and leave a message here, with context appended on the way up. */
void dp_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dp_add_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *dp_error(void);

/* in into out (len bytes, at least 4x in's length to hold it all) with every byte outside
 * printable ASCII written as \xNN; returns out. Every log line passes through it: a
 * client's string in a line (a name, a memfd's name, a path) stays text on the terminal
 * tailing the log, and cannot start a line of its own (issue 17). */
const char *dp_printable(const char *in, char *out, size_t len);

/* Name the calling thread in logs (and in top/ps). */
void dp_set_thread_name(const char *name);
/* close() of a descriptor the kernel handed over through a call ThreadSanitizer does not
 * see create one (pidfd_open, SO_PEERPIDFD, pidfd_getfd). Its own function, never
 * inlined, so that dataplane/tsan.supp can name it: TSan would otherwise take the close
 * for a race with whichever thread last made a descriptor of that number through a call
 * it does see (libzmq's accept4 of a connection libzmq closed since). */
void dp_close_untracked(int fd);

#endif /* DP_COMMON_H */
