/* test_client.c: dp_client_map() attaches a sealed duckpipe memfd once, keeps a private
 * layout the client cannot move, and refuses everything else. The segments are made
 * here, in this process, as duckpipe/client/shm.py makes them, and taken through a pidfd
 * of this process (the control agent's is the connected client's: dp_peer_pidfd).
 * Exit 0 pass, 1 fail, 77 skip. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_barrier.h"
#include "dp_client.h"
#include "dp_seg_plan.h"
#include "test_check.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static struct dp_client clients[4];
static struct dp_config cfg;
static int self_pidfd = -1; /* this process, as the client that connected */

struct seg {
	int fd;
	size_t size;
	struct dp_seg_header *h;
};

/* A segment as shm.py makes one: memfd, size from dp_seg_plan, header, seals, pre-faulted. */
static struct seg make(const char *name, uint32_t slots, unsigned seals, bool populate)
{
	struct seg s = { -1, 0, NULL };
	struct dp_seg_plan p;
	if (dp_seg_plan(slots, slots, 4096, 4096, 4096, &p) < 0)
		return s;
	s.fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	s.size = p.size;
	if (s.fd < 0 || ftruncate(s.fd, (off_t)p.size) < 0)
		return s;
	if (seals && fcntl(s.fd, F_ADD_SEALS, seals) < 0)
		return s;
	s.h = mmap(NULL, p.size, PROT_READ | PROT_WRITE,
		   MAP_SHARED | (populate ? MAP_POPULATE : 0), s.fd, 0);
	struct dp_seg_header *h = s.h;
	h->abi_major = DP_ABI_MAJOR;
	h->abi_minor = DP_ABI_MINOR;
	h->backing = DP_BACKING_DEVSHM;
	h->header_size = sizeof(*h);
	h->page_size = 4096;
	h->segment_size = p.size;
	h->creator_pid = (uint32_t)getpid();
	h->ring_offset = p.ring_offset;
	h->ring_capacity = slots;
	h->desc_size = sizeof(struct dp_desc);
	h->res_hdr_offset = p.res_hdr_offset;
	h->act_offset = p.act_offset;
	h->res_offset = p.res_offset;
	h->act_slot_size = p.act_slot_size;
	h->res_slot_size = p.res_slot_size;
	h->slot_count = slots;
	dp_store_release_u64(&h->magic, DP_SEG_MAGIC);
	return s;
}

static void unmake(struct seg *s)
{
	if (s->h)
		munmap(s->h, s->size);
	if (s->fd >= 0)
		close(s->fd);
}

static int attach(struct dp_client *c, const struct seg *s)
{
	memset(c, 0, sizeof(*c));
	int rc = dp_client_map(c, self_pidfd, (uint32_t)getpid(), (uint32_t)geteuid(), s->fd);
	if (rc == 0)
		dp_store_release_u32(&c->state, DP_CLIENT_ACTIVE);
	return rc;
}

static void detach(struct dp_client *c)
{
	dp_client_unmap(c);
	memset(c, 0, sizeof(*c));
}

static void test_a_good_segment_attaches_once_with_a_private_layout(void)
{
	struct seg s = make("duckpipe-test-good", 4, F_SEAL_SHRINK | F_SEAL_GROW, true);
	CHECK(attach(&clients[0], &s) == 0, "%s", dp_error());
	struct dp_client *c = &clients[0];
	CHECK(c->layout.slot_count == 4 && c->layout.ring_capacity == 4 &&
		      c->layout.act_slot_size == 4096,
	      "layout %u %u %lu", c->layout.slot_count, c->layout.ring_capacity,
	      (unsigned long)c->layout.act_slot_size);
	CHECK(!strcmp(c->path, "duckpipe-test-good"), "name %s", c->path);
	int seals = fcntl(s.fd, F_GET_SEALS);
	CHECK(seals & F_SEAL_FUTURE_WRITE && seals & F_SEAL_SEAL, "seals 0x%x", seals);
	CHECK(fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) < 0 &&
		      errno == EPERM,
	      "a hole was punched in an attached segment");
	CHECK(ftruncate(s.fd, 0) < 0 && errno == EPERM, "an attached segment was truncated");
	/* the client rewrites its header: nothing the dataplane keeps moves */
	s.h->slot_count = 1u << 30;
	s.h->act_slot_size = 1ull << 40;
	s.h->res_offset = 1ull << 50;
	CHECK(c->layout.slot_count == 4 && c->res == (uint8_t *)c->base + s.size - 4 * 4096,
	      "the private layout moved");
	/* the same memfd again: refused, before anything is mapped */
	CHECK(attach(&clients[1], &s) < 0 && strstr(dp_error(), "already attached"), "%s",
	      dp_error());
	detach(&clients[0]);
	unmake(&s);
}

static void test_everything_else_is_refused(void)
{
	struct {
		const char *name;
		unsigned seals;
		bool populate;
		const char *why;
	} bad[] = {
		{ "duckpipe-test-unsealed", 0, true, "not sealed" },
		{ "duckpipe-test-shrinks", F_SEAL_GROW, true, "not sealed" },
		{ "duckpipe-test-sealed", F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, true, "sealed" },
		{ "someone-else", F_SEAL_SHRINK | F_SEAL_GROW, true, "not a duckpipe memfd" },
		{ "duckpipe-test-sparse", F_SEAL_SHRINK | F_SEAL_GROW, false, "pre-fault" },
	};
	for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
		struct seg s = make(bad[i].name, 4, bad[i].seals, bad[i].populate);
		CHECK(attach(&clients[0], &s) < 0 && strstr(dp_error(), bad[i].why), "%s: %s",
		      bad[i].name, dp_error());
		unmake(&s);
	}
	struct dp_client *c = &clients[0];
	CHECK(dp_client_map(c, self_pidfd, (uint32_t)getpid(), (uint32_t)geteuid(), -1) < 0, "fd -1");
	CHECK(dp_client_map(c, self_pidfd, (uint32_t)getpid(), (uint32_t)geteuid(), 9999) < 0, "no fd 9999");
	struct seg s = make("duckpipe-test-uid", 4, F_SEAL_SHRINK | F_SEAL_GROW, true);
	/* a file of another user: refused, and nothing of it is described (owner, type) */
	CHECK(dp_client_map(c, self_pidfd, (uint32_t)getpid(), (uint32_t)geteuid() + 1, s.fd) < 0 &&
		      strstr(dp_error(), "not a duckpipe segment of yours") &&
		      !strstr(dp_error(), "owned by") && !strstr(dp_error(), "regular"),
	      "another uid: %s", dp_error());
	CHECK(dp_client_map(c, self_pidfd, (uint32_t)getpid() + 1, (uint32_t)geteuid(), s.fd) < 0,
	      "another pid");
	unmake(&s);
}

/* The descriptor is taken from the process behind the pidfd, whatever pid is named: a
 * process that has exited gives nothing, and the pid named plays no part. */
static void test_descriptors_come_from_the_pidfds_process_only(void)
{
	struct seg s = make("duckpipe-test-pidfd", 4, F_SEAL_SHRINK | F_SEAL_GROW, true);
	pid_t child = fork();
	if (child == 0)
		_exit(0);
	int gone = (int)syscall(SYS_pidfd_open, child, 0);
	waitpid(child, NULL, 0);
	struct dp_client *c = &clients[0];
	memset(c, 0, sizeof(*c));
	CHECK(gone >= 0 &&
		      dp_client_map(c, gone, (uint32_t)getpid(), (uint32_t)geteuid(), s.fd) < 0 &&
		      strstr(dp_error(), "has exited"),
	      "an exited process: %s", dp_error());
	CHECK(dp_client_open_doorbell(c, gone, (uint32_t)getpid(), (uint32_t)geteuid(), 0) < 0 &&
		      strstr(dp_error(), "has exited"),
	      "an exited process's doorbell: %s", dp_error());
	if (gone >= 0)
		close(gone);
	/* a pipe only the child holds, at a number this process has not open */
	int hold[2], ready[2];
	if (pipe(hold) < 0 || pipe(ready) < 0)
		return;
	child = fork();
	if (child == 0) {
		char b;
		int p[2];
		close(hold[1]);
		if (pipe(p) < 0 || dup2(p[0], 200) < 0 || write(ready[1], "r", 1) != 1)
			_exit(1);
		while (read(hold[0], &b, 1) < 0 && errno == EINTR)
			;
		_exit(0);
	}
	close(hold[0]);
	close(ready[1]);
	char b;
	int other = (int)syscall(SYS_pidfd_open, child, 0);
	CHECK(read(ready[0], &b, 1) == 1 && fcntl(200, F_GETFD) < 0, "the child's pipe");
	CHECK(other >= 0 &&
		      dp_client_open_doorbell(c, other, (uint32_t)getpid(), (uint32_t)geteuid(), 200) == 0,
	      "a pipe the pidfd's process holds: %s", dp_error());
	dp_client_close_doorbell(c);
	CHECK(dp_client_open_doorbell(c, self_pidfd, (uint32_t)child, (uint32_t)geteuid(), 200) < 0,
	      "a pipe only the named pid holds");
	close(hold[1]);
	waitpid(child, NULL, 0);
	close(other);
	close(ready[0]);
	unmake(&s);
}

static void test_headers_that_disagree_with_the_plan_or_the_limits_are_refused(void)
{
	const struct {
		const char *what;
		size_t offset;
		uint64_t value;
		unsigned width;
	} lies[] = {
		{ "slot_count", offsetof(struct dp_seg_header, slot_count), 8, 4 },
		{ "ring_capacity", offsetof(struct dp_seg_header, ring_capacity), 3, 4 },
		{ "res_slot_size", offsetof(struct dp_seg_header, res_slot_size), 1ull << 40, 8 },
		{ "act_offset", offsetof(struct dp_seg_header, act_offset), 64, 8 },
		{ "segment_size", offsetof(struct dp_seg_header, segment_size), 1ull << 30, 8 },
		{ "desc_size", offsetof(struct dp_seg_header, desc_size), 64, 4 },
		{ "abi_major", offsetof(struct dp_seg_header, abi_major), 99, 2 },
		{ "magic", offsetof(struct dp_seg_header, magic), 0, 8 },
	};
	for (size_t i = 0; i < DP_ARRAY_LEN(lies); i++) {
		struct seg s = make("duckpipe-test-lie", 4, F_SEAL_SHRINK | F_SEAL_GROW, true);
		memcpy((uint8_t *)s.h + lies[i].offset, &lies[i].value, lies[i].width);
		CHECK(attach(&clients[0], &s) < 0, "a header lying about %s attached", lies[i].what);
		unmake(&s);
	}
	/* 16 slots: over a client_max_slots of 8 */
	struct seg s = make("duckpipe-test-big", 16, F_SEAL_SHRINK | F_SEAL_GROW, true);
	CHECK(attach(&clients[0], &s) < 0 && strstr(dp_error(), "client_max_slots"), "%s",
	      dp_error());
	unmake(&s);
}

int main(void)
{
	int probe = memfd_create("probe", MFD_ALLOW_SEALING);
	if (probe < 0) {
		printf("test_client: no memfd_create here (%s); skipped\n", strerror(errno));
		return 77;
	}
	close(probe);
	self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (self_pidfd < 0) {
		printf("test_client: no pidfd_open here (%s); skipped\n", strerror(errno));
		return 77;
	}
	cfg.client_max_slots = 8;
	cfg.client_max_segment_bytes = 1u << 20;
	dp_client_set_limits(&cfg, clients, DP_ARRAY_LEN(clients));
	test_a_good_segment_attaches_once_with_a_private_layout();
	test_everything_else_is_refused();
	test_descriptors_come_from_the_pidfds_process_only();
	test_headers_that_disagree_with_the_plan_or_the_limits_are_refused();
	return test_result("test_client");
}
