/* dp_waker.c: a runner's epoll set and the eventfd other threads kick (dp_waker.h). */
#include "dp_waker.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>

int dp_waker_init(struct dp_waker *wk)
{
	memset(wk, 0, sizeof(*wk));
	wk->epfd = epoll_create1(EPOLL_CLOEXEC);
	wk->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (wk->epfd < 0 || wk->efd < 0) {
		dp_set_error("epoll_create1/eventfd: %s", strerror(errno));
		dp_waker_fini(wk);
		return -1;
	}
	return dp_waker_add(wk, wk->efd);
}

void dp_waker_fini(struct dp_waker *wk)
{
	if (wk->epfd >= 0)
		close(wk->epfd);
	if (wk->efd >= 0)
		close(wk->efd);
	wk->epfd = wk->efd = -1;
}

int dp_waker_add(struct dp_waker *wk, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	if (epoll_ctl(wk->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		dp_set_error("epoll_ctl(ADD, fd %d): %s", fd, strerror(errno));
		return -1;
	}
	return 0;
}

int dp_waker_mute(struct dp_waker *wk, int fd, bool mute)
{
	struct epoll_event ev = { .events = mute ? 0 : EPOLLIN, .data.fd = fd };
	if (epoll_ctl(wk->epfd, EPOLL_CTL_MOD, fd, &ev) < 0) {
		dp_set_error("epoll_ctl(MOD, fd %d): %s", fd, strerror(errno));
		return -1;
	}
	return 0;
}

void dp_waker_wait(struct dp_waker *wk, int64_t timeout_ns)
{
	struct epoll_event ev[DP_WAKER_MAX_EVENTS];
	struct timespec ts, *tp = NULL;
	if (timeout_ns != DP_PARK_FOREVER) {
		if (timeout_ns < 0)
			timeout_ns = 0;
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tp = &ts;
	}
	dp_store_relaxed_u64(&wk->parks, wk->parks + 1); /* Stats reads it */
	wk->waited = true;
	/* epoll_pwait2: a nanosecond timeout (epoll_wait's is in ms: a NACK timer of 300 us
	 * would sleep a whole millisecond). Kernels before 5.11 say ENOSYS, seccomp profiles
	 * that predate it EPERM: then epoll_wait, its timeout rounded up (never early: a
	 * timer late by under a millisecond, rather than a runner that never sleeps) */
	static int no_pwait2; /* every runner finds the same answer: a benign race */
	int n = -1;
	if (!__atomic_load_n(&no_pwait2, __ATOMIC_RELAXED)) {
		n = epoll_pwait2(wk->epfd, ev, DP_WAKER_MAX_EVENTS, tp, NULL);
		if (n < 0 && (errno == ENOSYS || errno == EPERM)) {
			__atomic_store_n(&no_pwait2, 1, __ATOMIC_RELAXED);
			DP_WARN("epoll_pwait2: %s; parking with epoll_wait (millisecond timers)",
				strerror(errno));
		}
	}
	if (__atomic_load_n(&no_pwait2, __ATOMIC_RELAXED)) {
		int ms = -1;
		if (tp) {
			int64_t r = timeout_ns / 1000000 + (timeout_ns % 1000000 != 0);
			ms = r > INT_MAX ? INT_MAX : (int)r;
		}
		n = epoll_wait(wk->epfd, ev, DP_WAKER_MAX_EVENTS, ms);
	}
	wk->nfired = n == DP_WAKER_MAX_EVENTS ? -1 : 0;
	for (int i = 0; i < n; i++) {
		if (ev[i].data.fd == wk->efd) {
			uint64_t v;
			(void)!read(wk->efd, &v, sizeof(v)); /* level-triggered: drain it */
			dp_store_relaxed_u64(&wk->kicked, wk->kicked + 1);
		}
		if (wk->nfired >= 0)
			wk->fired[wk->nfired++] = ev[i].data.fd;
	}
}
