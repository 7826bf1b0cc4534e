/* dp_reaper.h: the thread that lets go of client segments, so that the kernel's free of
 * their memory never runs on a thread that serves forwards.
 *
 * A segment's memory goes with the last reference to its memfd: the client's descriptor
 * and mapping, and the dataplane's mapping (dp_client_map closes its own descriptor once
 * it has mapped it). A client that closed its memfd before it detached leaves the
 * dataplane's munmap the last: the file's final fput then frees every page of it on the
 * thread that unmapped, on its way back from the syscall (shmem_evict_inode): 40-70 ms
 * for 512 MiB of 4 KiB pages, however finely the unmap is stepped (issue 26, point 4).
 * The control agent shares its thread with the dispatcher and the workers (threads =
 * "shared"), so every unmap of a segment, and every close of a segment's descriptor that
 * may be its last reference, is handed to the reaper: one thread per dataplane, fed jobs
 * through a pipe, blocked in read() on it when idle (it costs nothing then).
 */
#ifndef DP_REAPER_H
#define DP_REAPER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_config.h"

struct dp_waker;

/* What to let go of: a mapping, a descriptor, or both; then who to tell. Copied whole
 * through the pipe (under PIPE_BUF: one write, never torn), so the reaper reads no
 * memory another thread writes. */
struct dp_reap_job {
	void *base;            /* munmap'ed, a step at a time (NULL: no mapping) */
	size_t size;
	int fd;                /* closed after the unmap (-1: none) */
	uint32_t *done;        /* 1 stored with release once both are gone (NULL: nobody asks) */
	struct dp_waker *kick; /* then kicked: its runner may park waiting for done (or NULL) */
};

struct dp_reaper {
	int rd, wr; /* the pipe: the control agent writes jobs (non-blocking), the reaper reads */
	pthread_t thread;
	bool started;
	uint32_t gone;        /* atomic, the reaper's: it stopped reading (a failed read) */
	uint64_t inline_jobs; /* the control agent's: jobs it did itself (pipe full or no reaper) */
};

/* Start the reaper thread: SCHED_BATCH and off the runners' pinned cores, as ZeroMQ's I/O
 * thread. 0, or -1 with dp_error(). */
int dp_reaper_start(struct dp_reaper *r, const struct dp_config *cfg);
/* Hand a job over; where it cannot be (r NULL or not started, its pipe full), do it on
 * the caller's thread. Either way the job is done or under way when this returns. */
void dp_reaper_give(struct dp_reaper *r, const struct dp_reap_job *job);
/* Finish the jobs given and stop the thread; r may be NULL or never started. */
void dp_reaper_stop(struct dp_reaper *r);

#endif /* DP_REAPER_H */
