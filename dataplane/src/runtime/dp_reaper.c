/* dp_reaper.c: the reaper thread (dp_reaper.h): unmaps client segments and closes their
 * descriptors off the threads that serve forwards.
 */
#include "dp_reaper.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dp_barrier.h"
#include "dp_common.h"
#include "dp_waker.h"

/* Bytes per munmap: each call holds the process's mmap_lock for writing while it takes
 * its range out, so a fault or an mmap on another thread never waits behind a whole
 * 1 GiB segment's. A multiple of 2 MiB: a hugetlbfs mapping is unmapped in whole pages. */
#define REAP_STEP (8u << 20)

/* Its nice value (19: the least CPU a contended core gives it; the runners run at 0) */
#define REAPER_NICE 19

_Static_assert(sizeof(struct dp_reap_job) <= PIPE_BUF, "a job is one atomic pipe write");

/* Unmap, close, then say so: the free of the memory, if this was its last reference,
 * runs here on the way back from the munmap or the close. */
static void reap(const struct dp_reap_job *j)
{
	uint8_t *base = j->base;
	for (size_t off = 0; base && off < j->size; off += REAP_STEP) {
		size_t n = j->size - off < REAP_STEP ? j->size - off : REAP_STEP;
		if (munmap(base + off, n) < 0)
			DP_WARN("reaper: munmap(%p, %zu): %s", (void *)(base + off), n,
				strerror(errno));
	}
	if (j->fd >= 0)
		dp_close_untracked(j->fd); /* perhaps pidfd_getfd's (dp_client.c take_fd) */
	if (j->done) {
		/* release: the unmap is done before the control agent reuses the range's slot */
		dp_store_release_u32(j->done, 1);
		dp_waker_kick(j->kick);
	}
}

/* Blocked in read() until a job or the end (the write end closed: dp_reaper_stop).
 * Writes of whole jobs, never torn, so every read that returns gets whole ones. */
static void *reaper_main(void *arg)
{
	struct dp_reaper *r = arg;
	int rd = r->rd;
	dp_set_thread_name("reaper");
	/* batch: woken for a job, it never preempts a runner; it runs when one yields. And
	 * the least weight: on a CPU a runner needs, the kernel's free waits for it */
	struct sched_param sp = { 0 };
	int rc = pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
	if (rc)
		DP_WARN("reaper: keeps the default scheduling: %s", strerror(rc));
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), REAPER_NICE) < 0)
		DP_WARN("reaper: keeps its nice value: %s", strerror(errno));
	struct dp_reap_job job;
	for (;;) {
		ssize_t n = read(rd, &job, sizeof(job));
		if (n == (ssize_t)sizeof(job)) {
			reap(&job);
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else {
			if (n != 0) {
				DP_WARN("reaper: read: %s; segments are let go inline from now on",
					n < 0 ? strerror(errno) : "a torn job");
				/* release: give() stops writing jobs nobody would read (their slots
				 * would wait for their done flag for ever) */
				dp_store_release_u32(&r->gone, 1);
			}
			return NULL;
		}
	}
}

/* The CPUs this process may use that no runner is pinned to (topology `cores`), as for
 * ZeroMQ's I/O thread (dp_control.c); false when there are none or no runner is pinned:
 * then it runs wherever the scheduler puts it. */
static bool off_runner_cores(const struct dp_config *cfg, cpu_set_t *set)
{
	if (!cfg->ncores || sched_getaffinity(0, sizeof(*set), set) < 0)
		return false;
	for (uint32_t i = 0; i < cfg->ncores; i++)
		if (cfg->cores[i] >= 0 && cfg->cores[i] < CPU_SETSIZE)
			CPU_CLR(cfg->cores[i], set);
	return CPU_COUNT(set) > 0;
}

int dp_reaper_start(struct dp_reaper *r, const struct dp_config *cfg)
{
	int fds[2];
	*r = (struct dp_reaper){ .rd = -1, .wr = -1 };
	if (pipe2(fds, O_CLOEXEC) < 0) {
		dp_set_error("reaper: pipe2: %s", strerror(errno));
		return -1;
	}
	r->rd = fds[0];
	r->wr = fds[1];
	/* a full pipe (a reaper kept off the CPU) sends the control agent's jobs inline:
	 * it never blocks on it */
	if (fcntl(r->wr, F_SETFL, O_NONBLOCK) < 0) {
		dp_set_error("reaper: fcntl(O_NONBLOCK): %s", strerror(errno));
		goto fail;
	}
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	cpu_set_t cpus;
	if (off_runner_cores(cfg, &cpus))
		pthread_attr_setaffinity_np(&attr, sizeof(cpus), &cpus);
	/* signals go to the runners (dp_world_stop), never into its read() */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(&r->thread, &attr, reaper_main, r);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (rc) {
		dp_set_error("reaper: pthread_create: %s", strerror(rc));
		goto fail;
	}
	r->started = true;
	return 0;
fail:
	close(r->rd);
	close(r->wr);
	r->rd = r->wr = -1;
	return -1;
}

void dp_reaper_give(struct dp_reaper *r, const struct dp_reap_job *job)
{
	if (r && r->started && !dp_load_acquire_u32(&r->gone)) {
		if (write(r->wr, job, sizeof(*job)) == (ssize_t)sizeof(*job))
			return;
		/* EAGAIN: 1,600 jobs queued; the reaper is starved of CPU, or gone */
		if (r->inline_jobs++ == 0)
			DP_WARN("reaper: cannot take a job (%s): letting go of a segment on the "
				"control agent's thread",
				strerror(errno));
	}
	reap(job);
}

void dp_reaper_stop(struct dp_reaper *r)
{
	if (!r || !r->started)
		return;
	close(r->wr); /* the reaper finishes what is queued, then reads the end */
	pthread_join(r->thread, NULL);
	close(r->rd);
	r->rd = r->wr = -1;
	r->started = false;
}
