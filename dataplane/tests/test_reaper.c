/* test_reaper.c: the reaper (dp_reaper.h) unmaps and closes on its own thread, never the
 * caller's: a segment whose memory the kernel frees at its last unmap (its client closed
 * the memfd first) would otherwise stall every agent of the control agent's thread for
 * tens of ms (issue 26, point 4). It says done (and kicks) only once both are gone, does
 * the job on the caller's thread without a reaper, and finishes every job given before it
 * stops. dp_client_let_go hands a detached client's segment over and reports it gone only
 * once the reaper is done. Runs under TSan too (the C unit tests' TSan pass).
 *
 * This program defines munmap, which the dataplane's objects linked into it call, to see
 * which thread calls it (by the thread's name), and hands the call to the next definition.
 * Exit 0 pass, 1 fail.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dp_client.h"
#include "dp_reaper.h"
#include "dp_waker.h"
#include "test_check.h"

#define MIB (1u << 20)

/* munmap calls by thread name: made by the reaper, and by anyone else */
static uint32_t unmaps_by_reaper, unmaps_elsewhere;

int munmap(void *addr, size_t len)
{
	static int (*next)(void *, size_t);
	if (!next)
		next = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
	char name[16] = "";
	pthread_getname_np(pthread_self(), name, sizeof(name));
	if (!strcmp(name, "reaper"))
		__atomic_add_fetch(&unmaps_by_reaper, 1, __ATOMIC_RELAXED);
	else
		__atomic_add_fetch(&unmaps_elsewhere, 1, __ATOMIC_RELAXED);
	return next(addr, len);
}

/* Is [p, p + len) still mapped, page by page? (msync says ENOMEM for a hole.) */
static bool mapped(void *p, size_t len)
{
	for (size_t off = 0; off < len; off += 4096)
		if (msync((uint8_t *)p + off, 4096, MS_ASYNC) < 0 && errno == ENOMEM)
			return false;
	return true;
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void *segment(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(p, 1, size);
	return p;
}

static bool wait_done(const uint32_t *done)
{
	for (int i = 0; i < 5000; i++) {
		if (__atomic_load_n(done, __ATOMIC_ACQUIRE))
			return true;
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
	return false;
}

static const struct dp_config no_cores; /* no runner pinned */

static void test_a_job_is_done_on_the_reaper_thread_then_said_done_and_kicked(void)
{
	struct dp_reaper r;
	CHECK(dp_reaper_start(&r, &no_cores) == 0, "%s", dp_error());
	struct dp_waker wk;
	CHECK(dp_waker_init(&wk) == 0, "%s", dp_error());
	dp_waker_arm(&wk); /* a parked runner: a kick writes its eventfd */
	size_t size = 20 * MIB + 4096; /* several steps, the last one short */
	void *p = segment(size);
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uint32_t done = 0;
	uint32_t before = __atomic_load_n(&unmaps_elsewhere, __ATOMIC_RELAXED);
	dp_reaper_give(&r, &(struct dp_reap_job){ .base = p, .size = size, .fd = fd, .done = &done,
						  .kick = &wk });
	CHECK(wait_done(&done), "the reaper never said done");
	CHECK(!mapped(p, size), "still mapped once done");
	CHECK(!fd_open(fd), "fd %d still open once done", fd);
	struct pollfd pfd = { .fd = wk.efd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 5000) == 1, "the parked runner was not kicked");
	CHECK(__atomic_load_n(&unmaps_by_reaper, __ATOMIC_RELAXED) == 3,
	      "%u munmap calls on the reaper (3 steps of at most 8 MiB)", unmaps_by_reaper);
	CHECK(__atomic_load_n(&unmaps_elsewhere, __ATOMIC_RELAXED) == before,
	      "%u munmap calls on the caller's thread", unmaps_elsewhere - before);
	dp_waker_disarm(&wk);
	dp_reaper_stop(&r);
	dp_waker_fini(&wk);
}

static void test_without_a_reaper_the_caller_does_the_job(void)
{
	void *p = segment(MIB);
	uint32_t done = 0;
	uint32_t by_reaper = __atomic_load_n(&unmaps_by_reaper, __ATOMIC_RELAXED);
	dp_reaper_give(NULL, &(struct dp_reap_job){ .base = p, .size = MIB, .fd = -1, .done = &done });
	CHECK(done == 1 && !mapped(p, MIB), "done %u", done);
	struct dp_reaper never = { .rd = -1, .wr = -1 };
	p = segment(MIB);
	dp_reaper_give(&never, &(struct dp_reap_job){ .base = p, .size = MIB, .fd = -1 });
	CHECK(!mapped(p, MIB), "a reaper never started left it mapped");
	CHECK(__atomic_load_n(&unmaps_by_reaper, __ATOMIC_RELAXED) == by_reaper, "a reaper ran");
	dp_reaper_stop(&never); /* nothing to stop */
	dp_reaper_stop(NULL);
}

static void test_stop_finishes_every_job_given(void)
{
	struct dp_reaper r;
	CHECK(dp_reaper_start(&r, &no_cores) == 0, "%s", dp_error());
	enum { N = 16 };
	void *p[N];
	uint32_t done[N] = { 0 };
	for (int i = 0; i < N; i++) {
		p[i] = segment(2 * MIB);
		dp_reaper_give(&r, &(struct dp_reap_job){ .base = p[i], .size = 2 * MIB, .fd = -1,
							  .done = &done[i] });
	}
	dp_reaper_stop(&r);
	for (int i = 0; i < N; i++)
		CHECK(__atomic_load_n(&done[i], __ATOMIC_ACQUIRE) == 1 && !mapped(p[i], 2 * MIB),
		      "job %d not done at stop", i);
}

static void test_a_detached_clients_segment_is_gone_once_the_reaper_says_so(void)
{
	struct dp_reaper r;
	CHECK(dp_reaper_start(&r, &no_cores) == 0, "%s", dp_error());
	dp_client_set_reaper(&r);
	static struct dp_client c;
	c.doorbell_fd = -1;
	c.size = 16 * MIB;
	c.base = segment(c.size);
	c.hdr = (struct dp_seg_header *)c.base;
	uint8_t *base = c.base;
	uint32_t elsewhere = __atomic_load_n(&unmaps_elsewhere, __ATOMIC_RELAXED);
	int rc = 0;
	for (int i = 0; i < 5000 && rc == 0; i++) {
		rc = dp_client_let_go(&c, NULL);
		if (rc == 0) {
			CHECK(dp_client_reaping(&c), "not reaping while the reaper has it");
			nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
		}
	}
	CHECK(rc == 1 && !c.base && !c.hdr && !dp_client_reaping(&c), "rc %d", rc);
	CHECK(!mapped(base, 16 * MIB), "still mapped once let go");
	CHECK(__atomic_load_n(&unmaps_elsewhere, __ATOMIC_RELAXED) == elsewhere,
	      "unmapped on the control agent's thread");
	dp_client_unmap(&c); /* at exit: nothing left to unmap */
	CHECK(__atomic_load_n(&unmaps_elsewhere, __ATOMIC_RELAXED) == elsewhere,
	      "unmapped twice");
	dp_client_set_reaper(NULL);
	dp_reaper_stop(&r);
}

int main(void)
{
	test_a_job_is_done_on_the_reaper_thread_then_said_done_and_kicked();
	test_without_a_reaper_the_caller_does_the_job();
	test_stop_finishes_every_job_given();
	test_a_detached_clients_segment_is_gone_once_the_reaper_says_so();
	return test_result("test_reaper");
}
