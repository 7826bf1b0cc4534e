/* dp_client.c: client segments as the dataplane sees them.
 *
 * A segment is a sealed memfd the client made (duckpipe/client/shm.py). At attach the
 * dataplane takes it from the process that connected (pidfd_getfd on the connection's
 * pidfd, take_fd), refuses anything that is not
 * a duckpipe memfd of that user that can neither shrink nor grow, reads the
 * header with pread (before mapping a byte), checks it against dp_seg_plan()
 * and its limits, maps it, seals it against hole punching and pre-faults it,
 * and keeps its own copy of the layout: after that nothing is read from the
 * header but the client's heartbeat. Nothing is ever unlinked: the memory goes
 * when the last mapping and descriptor do.
 *
 * Seals: the client adds F_SEAL_SHRINK | F_SEAL_GROW (a segment that cannot
 * shrink cannot SIGBUS us). Those do not stop fallocate(PUNCH_HOLE), and a
 * punched hugepage is allocated again on the next touch, which faults when the
 * pool is empty; so once mapped, the dataplane adds F_SEAL_FUTURE_WRITE (no hole
 * punching, no new writable mapping; the two existing ones stay writable) and
 * F_SEAL_SEAL, then faults every page in with MADV_POPULATE_WRITE, which fails
 * instead of raising SIGBUS if a page went missing before the seal.
 *
 * Letting go: the segment's memory is freed where its last reference goes, and a client
 * that closed its memfd before detaching leaves that to the dataplane's unmap: 40-70 ms
 * of the kernel's for 512 MiB of 4 KiB pages. So every unmap of a segment and every close
 * of a segment's descriptor that may be its last reference is the reaper's (dp_reaper.h),
 * a thread that serves no forwards; only the unregistration (rte_extmem_unregister, which
 * must see the segment still mapped) stays on the control agent's thread.
 */
#include "dp_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "dp_backend.h"
#include "dp_config_gen.h"
#include "dp_reaper.h"
#include "dp_seg_plan.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define MEMFD_PREFIX "/memfd:duckpipe"

/* dp_client_map's signature is the contract with the control agent; the limits and
 * the other clients (to refuse a second attach of one file) are set once here. */
static struct {
	uint32_t max_slots;
	uint64_t max_segment_bytes;
	const struct dp_client *all;
	uint32_t n;
} limits = { DP_CFG_DEFAULT_CLIENT_MAX_SLOTS, DP_CFG_DEFAULT_CLIENT_MAX_SEGMENT_BYTES, NULL,
	      0 };

void dp_client_set_limits(const struct dp_config *cfg, const struct dp_client *all, uint32_t n)
{
	limits.max_slots = cfg->client_max_slots;
	limits.max_segment_bytes = cfg->client_max_segment_bytes;
	limits.all = all;
	limits.n = n;
}

/* Who unmaps and closes segments (dp_client_set_reaper): NULL, the caller's thread. */
static struct dp_reaper *reaper;

void dp_client_set_reaper(struct dp_reaper *r)
{
	reaper = r;
}

/* A mapping (or NULL) and a descriptor (or -1) of a segment nobody waits for: the reaper's. */
static void discard(void *base, size_t size, int fd)
{
	dp_reaper_give(reaper, &(struct dp_reap_job){ .base = base, .size = size, .fd = fd });
}

/* The layout a header claims, checked by dp_seg_check() (the rule shm.py calls too)
 * against the plan, the limits and the file; 0 or -1 with the reason in words. */
int dp_client_check_header(const struct dp_seg_header *h, uint64_t file_size,
			   struct dp_client_layout *out)
{
	struct dp_seg_plan p;
	int rc = dp_seg_check(h, file_size, limits.max_slots, limits.max_segment_bytes, &p);
	switch (rc) {
	case 0:
		break;
	case DP_SEG_CHECK_ABI_MAJOR:
		dp_set_error("segment ABI %u.%u, this dataplane speaks %u.x", h->abi_major,
			     h->abi_minor, DP_ABI_MAJOR);
		return -1;
	case DP_SEG_CHECK_BACKING:
		dp_set_error("unknown backing %u", h->backing);
		return -1;
	case DP_SEG_CHECK_OVER_LIMITS: /* which limit, and both ways past it (shm.py says the same) */
		if (h->slot_count > limits.max_slots)
			dp_set_error("%u slots: over this dataplane's client_max_slots %u; connect with "
				     "fewer (slots=), or raise client_max_slots in its topology",
				     h->slot_count, limits.max_slots);
		else
			/* short: the refusal carries 255 characters, "segment fd F of pid P: " too */
			dp_set_error("%u slots take %.1f MiB: over this dataplane's "
				     "client_max_segment_bytes %lu (%.1f MiB); connect with fewer or "
				     "smaller slots (slots=, slot_size=), or raise "
				     "client_max_segment_bytes in its topology",
				     h->slot_count, (double)file_size / (1 << 20),
				     (unsigned long)limits.max_segment_bytes,
				     (double)limits.max_segment_bytes / (1 << 20));
		return -1;
	case DP_SEG_CHECK_NO_MAGIC:
	case DP_SEG_CHECK_STRUCT_SIZES:
	case DP_SEG_CHECK_LAYOUT:
		dp_set_error("%s", dp_seg_plan_strerror(rc));
		return -1;
	default: /* the plan's own refusal */
		dp_set_error("%s (slots %u, ring %u)", dp_seg_plan_strerror(rc), h->slot_count,
			     h->ring_capacity);
		return -1;
	}
	out->slot_count = h->slot_count;
	out->ring_capacity = h->ring_capacity;
	out->act_slot_size = p.act_slot_size;
	out->res_slot_size = p.res_slot_size;
	return 0;
}

/* fd is a regular file of uid; 0 or -1. Owner first: of a file that is not the client
 * user's, neither its owner nor its type is said (a process can hold another user's
 * files: a setuid program's, or inherited). */
static int check_owned_regular(int fd, uint32_t uid, struct stat *st)
{
	if (fstat(fd, st) < 0) {
		dp_set_error("cannot fstat it: %s", strerror(errno));
		return -1;
	}
	if (st->st_uid != uid) {
		dp_set_error("not a duckpipe segment of yours (uid %u)", uid);
		return -1;
	}
	if (!S_ISREG(st->st_mode)) {
		dp_set_error("not a regular file");
		return -1;
	}
	return 0;
}

/* fd is a memfd a peer of this uid made for duckpipe, sealed against resizing; 0 or -1. */
static int check_memfd(int fd, uint32_t uid, struct stat *st, char *name, size_t namelen)
{
	char link[64], target[256];
	if (check_owned_regular(fd, uid, st) < 0)
		return -1;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n < 0 || strncmp(target, MEMFD_PREFIX, strlen(MEMFD_PREFIX)) != 0) {
		dp_set_error("not a duckpipe memfd");
		return -1;
	}
	target[n] = '\0';
	char *deleted = strstr(target, " (deleted)");
	if (deleted)
		*deleted = '\0';
	snprintf(name, namelen, "%.200s", target + strlen("/memfd:"));
	/* the client chose the name, and the stats segment, duckpipe-top and the logs show it:
	 * printable ASCII only, as for Attach.name (check_printable in dp_ctl_rt.h) */
	for (size_t i = 0; name[i]; i++) {
		unsigned char ch = (unsigned char)name[i];
		if (ch < 0x20 || ch > 0x7e) {
			dp_set_error("the memfd's name must be printable ASCII (0x20-0x7e): byte %zu "
				     "is 0x%02x",
				     i, ch);
			return -1;
		}
	}
	for (uint32_t i = 0; i < limits.n; i++) {
		const struct dp_client *o = &limits.all[i];
		if (dp_load_acquire_u32(&o->state) != DP_CLIENT_FREE && o->base &&
		    o->st_dev == (uint64_t)st->st_dev && o->st_ino == (uint64_t)st->st_ino) {
			dp_set_error("memfd %s is already attached (client %u)", name, o->id);
			return -1;
		}
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		dp_set_error("memfd %s is not sealed against shrinking and growing", name);
		return -1;
	}
	if (seals & (F_SEAL_SEAL | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
		dp_set_error("memfd %s is sealed against writes or further seals (0x%x): it is "
			     "attached elsewhere, or its maker sealed it too far",
			     name, (unsigned)seals);
		return -1;
	}
	return 0;
}

/* The client's descriptor `fd` as one of ours, taken from the process behind pidfd (the
 * one that connected, dp_peer_pidfd) with pidfd_getfd: never through /proc/<pid>, whose
 * pid may name another process by now (root's, whose files the dataplane would open).
 * pidfd_getfd opens nothing: a device or FIFO the peer named has no side effect. Where the
 * kernel refuses it (EPERM: Yama's ptrace_scope, or no CAP_SYS_PTRACE over the client), the
 * descriptor is looked up through /proc/<pid>/fd with O_PATH (opens nothing either) and
 * kept only if the pidfd still says the process is alive afterwards: a live process holds
 * its pid, so the path named it. -1 with dp_error(), which describes nothing it found. */
static int take_fd(int pidfd, uint32_t pid, int32_t fd, const char *what)
{
	if (dp_pidfd_exited(pidfd)) {
		dp_set_error("the client (pid %u) has exited", pid);
		return -1;
	}
	int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
	if (got < 0 && errno == EPERM) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, fd);
		got = open(path, O_PATH | O_CLOEXEC);
		if (got < 0 && errno == EACCES)
			errno = EPERM;
	}
	if (got >= 0 && dp_pidfd_exited(pidfd)) {
		discard(NULL, 0, got); /* it may be the last reference: the reaper frees it */
		got = -1;
		errno = ESRCH;
	}
	if (got >= 0)
		return got;
	if (errno == ESRCH)
		dp_set_error("the client (pid %u) has exited", pid);
	else if (errno == EBADF || errno == ENOENT)
		dp_set_error("cannot open %s fd %d: pid %u has no such descriptor", what, fd, pid);
	else if (errno == EPERM)
		dp_set_error("cannot take %s fd %d from pid %u: not permitted; run the dataplane "
			     "as the client's user or as root",
			     what, fd, pid);
	else
		dp_set_error("cannot open %s fd %d of pid %u: %s", what, fd, pid, strerror(errno));
	return -1;
}

/* A descriptor of ours, reopened through /proc/self (our own table: no race) into a new
 * description of the same inode with our flags, so nothing the client does to its own
 * (O_NONBLOCK cleared on a pipe, say) reaches ours. */
static int reopen_own(int fd, int flags)
{
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	return open(self, flags | O_CLOEXEC | O_NOCTTY);
}

int dp_client_map(struct dp_client *c, int pidfd, uint32_t peer_pid, uint32_t peer_uid,
		  int32_t segment_fd)
{
	char name[256];
	if (segment_fd < 0 || peer_pid == 0) {
		dp_set_error("no segment descriptor (pid %u, fd %d): this client predates memfd "
			     "segments; upgrade it",
			     peer_pid, segment_fd);
		return -1;
	}
	/* the kernel's start time of the peer, never the header's start_ns (the client writes
	 * that one: a date in the future would hide a reused pid from dp_process_alive); read
	 * before take_fd's look at the pidfd, so they are the connected process's */
	uint64_t start_ticks = dp_process_start_ticks(peer_pid);
	int fd = -1, got = take_fd(pidfd, peer_pid, segment_fd, "segment");
	if (got < 0)
		return -1;
	if (!start_ticks) {
		discard(NULL, 0, got); /* the client is gone: ours may be the last reference */
		dp_set_error("cannot read /proc/%u/stat: is the client alive?", peer_pid);
		return -1;
	}
	struct stat st;
	/* owner, then type, of our handle on the client's file; only a regular file of the
	 * client's user is opened for real (reopen_own) */
	if (check_owned_regular(got, peer_uid, &st) < 0) {
		discard(NULL, 0, got); /* the client may have closed its own meanwhile */
		goto described;
	}
	fd = reopen_own(got, O_RDWR);
	if (fd < 0) {
		dp_set_error("cannot open it read-write: %s", strerror(errno));
		discard(NULL, 0, got); /* the client may have closed its own meanwhile */
		goto described;
	}
	dp_close_untracked(got); /* fd holds the file */
	struct dp_seg_header h;
	struct dp_client_layout lay;
	if (check_memfd(fd, peer_uid, &st, name, sizeof(name)) < 0)
		goto refuse;
	/* pread, not mmap: a bad header costs nothing, and a huge file is never faulted in */
	if (st.st_size < (off_t)sizeof(h) || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
		dp_set_error("%ld bytes, too small to be a segment", (long)st.st_size);
		goto refuse;
	}
	if (dp_client_check_header(&h, (uint64_t)st.st_size, &lay) < 0)
		goto refuse;
	if (h.creator_pid != peer_pid) {
		dp_set_error("made by pid %u, not by the client (pid %u)", h.creator_pid, peer_pid);
		goto refuse;
	}
	size_t size = (size_t)st.st_size; /* sealed: it stays this size */
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		dp_set_error("mmap of %ld bytes: %s", (long)st.st_size, strerror(errno));
		goto refuse;
	}
	/* no hole can be punched from now on (see the top of this file) */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
		dp_set_error("cannot seal memfd %s against hole punching: %s", name, strerror(errno));
		discard(base, size, fd);
		fd = -1;
		goto refuse;
	}
	/* every page must exist already: its maker pre-faults it, and a sparse segment would
	 * have the dataplane allocate (and be charged for) the client's memory */
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size) {
		dp_set_error("memfd %s holds %lu of its %lu bytes: its maker must pre-fault it", name,
			     (unsigned long)st.st_blocks * 512, (unsigned long)st.st_size);
		discard(base, size, fd);
		fd = -1;
		goto refuse;
	}
	/* the page size the kernel backs it with, never the header's word for it: with IOVA
	 * as PA, a 4 KiB-page segment registered as 2 MiB pages would have a NIC read
	 * whatever memory follows each page's first 4 KiB */
	size_t huge = (size_t)dp_seg_page_size(DP_BACKING_HUGETLBFS);
	c->mem.page_sz = (size_t)st.st_blksize == huge && (uintptr_t)base % huge == 0
				 ? huge
				 : (size_t)dp_seg_page_size(DP_BACKING_DEVSHM);
	c->stepped = 0;
	close(fd); /* the mapping holds the file: never its last reference here */
	c->base = base;
	c->size = size;
	c->layout = lay;
	c->st_dev = (uint64_t)st.st_dev;
	c->st_ino = (uint64_t)st.st_ino;
	c->hdr = base;
	/* every pointer from the checked plan in h (our copy), none from the mapping */
	c->ring = (struct dp_ring_header *)(c->base + h.ring_offset);
	c->descs = (struct dp_desc *)(c->base + h.ring_offset + sizeof(struct dp_ring_header));
	c->slots = (struct dp_slot_header *)(c->base + h.res_hdr_offset);
	c->act = c->base + h.act_offset;
	c->res = c->base + h.res_offset;
	/* the consumer index is ours from now on; shm's tail is a copy for the producer */
	c->ring_tail = dp_load_acquire_u64(&c->ring->tail);
	c->ring_head_seen = c->ring_tail;
	c->pid = peer_pid;
	c->start_ticks = start_ticks;
	snprintf(c->path, sizeof(c->path), "%.200s", name);
	return 0;
refuse:
	discard(NULL, 0, fd); /* a client that closed its own made it the last */
described:
	dp_add_error_context("segment fd %d of pid %u", segment_fd, peer_pid);
	return -1;
}

/* The doorbell is the client's own anonymous pipe, never a socket of the dataplane's.
 * An abstract socket's name is listed in /proc/net/unix and reachable by every user
 * of the host (one flooding 1-byte datagrams cost the dataplane 2.2 s of CPU per 5 s);
 * a filesystem socket would need a directory the control group may enter but nobody
 * else, and a sender check (SO_PASSCRED) still wakes us for every datagram it drops.
 * ZeroMQ cannot pass a descriptor, but the dataplane takes the segment from the client's
 * process already (take_fd): it takes the pipe's read end the same way. Only holders of
 * the write end (the client, and whoever it hands it to) can ring, and taking it from
 * the client needs ptrace rights over it, which already give its memory.
 * One pipe per client, so one client's ringing is its own to pay for: the dispatcher
 * drains a ready pipe whole per wake-up, whatever its size, and mutes for a while a pipe
 * whose rings bring no new descriptors (dp_dispatch.c). */
int dp_client_open_doorbell(struct dp_client *c, int pidfd, uint32_t peer_pid,
			    uint32_t peer_uid, int32_t doorbell_fd)
{
	c->doorbell_fd = -1;
	if (doorbell_fd < 0 || doorbell_fd == DP_NO_DOORBELL) {
		dp_set_error("no doorbell pipe (Attach.doorbell_fd): this client predates "
			     "protocol 4; upgrade it");
		return -1;
	}
	int got = take_fd(pidfd, peer_pid, doorbell_fd, "doorbell");
	if (got < 0)
		return -1;
	struct stat st;
	struct statfs fs;
	/* the client's own (else nothing about it is said), and an anonymous pipe (pipefs, mode
	 * 0600 from pipe(2)), not a named FIFO others may open */
	if (fstat(got, &st) < 0 || st.st_uid != peer_uid) {
		dp_close_untracked(got);
		dp_set_error("doorbell fd %d is not an anonymous pipe of yours (uid %u)",
			     doorbell_fd, peer_uid);
		return -1;
	}
	if (!S_ISFIFO(st.st_mode) || fstatfs(got, &fs) < 0 || fs.f_type != PIPEFS_MAGIC) {
		dp_close_untracked(got);
		dp_set_error("doorbell fd %d of pid %u is not an anonymous pipe of uid %u",
			     doorbell_fd, peer_pid, peer_uid);
		return -1;
	}
	/* a description of our own: the dispatcher's reads must never block, whatever the
	 * client sets on its end (the one pidfd_getfd shares) */
	c->doorbell_fd = reopen_own(got, O_RDONLY | O_NONBLOCK);
	dp_close_untracked(got);
	if (c->doorbell_fd < 0) {
		dp_set_error("cannot open doorbell fd %d of pid %u: %s", doorbell_fd, peer_pid,
			     strerror(errno));
		return -1;
	}
	return 0;
}

void dp_client_close_doorbell(struct dp_client *c)
{
	if (c->doorbell_fd >= 0)
		close(c->doorbell_fd);
	c->doorbell_fd = -1;
}

/* Every page is faulted in before the client turns ACTIVE, never on a forward (the size is
 * capped by the limits); a page punched before the seal that cannot come back is an error
 * here, not a SIGBUS later. In steps: on small pages a GiB takes 0.3 s, which in one call
 * would stall every agent sharing the control agent's thread (README, "Threat model"). */
int dp_client_populate(struct dp_client *c, size_t step)
{
	size_t left = c->size - c->stepped;
	size_t n = left < step ? left : step;
	if (n && madvise(c->base + c->stepped, n, MADV_POPULATE_WRITE) < 0 && errno != EINVAL) {
		dp_set_error("cannot fault in memfd %s: %s", c->path, strerror(errno));
		return -1;
	}
	c->stepped += n;
	if (c->stepped < c->size)
		return 0;
	dp_backend_mem_register(&c->mem, c->base, c->size, c->mem.page_sz);
	return 1;
}

int dp_client_let_go(struct dp_client *c, struct dp_waker *kick)
{
	if (c->base && !c->reaping) {
		c->was_registered = c->mem.registered;
		dp_backend_mem_unregister(&c->mem); /* before the unmap: it must see it mapped */
		c->reaping = true;
		dp_reaper_give(reaper, &(struct dp_reap_job){ .base = c->base, .size = c->size,
							      .fd = -1, .done = &c->reaped,
							      .kick = kick });
	}
	/* acquire: pairs with the reaper's release once the range is unmapped */
	if (c->base && !dp_load_acquire_u32(&c->reaped))
		return 0;
	c->base = NULL;
	c->hdr = NULL;
	return 1;
}

bool dp_client_reaping(const struct dp_client *c)
{
	return c->base && c->reaping && !dp_load_acquire_u32(&c->reaped);
}

/* Only once no forward of c is in flight: each one's completion waited until the ports
 * freed every buffer that pointed into the segment (dp_release.c). Nobody waits for the
 * unmap: the reaper does it whenever it can. */
void dp_client_unmap(struct dp_client *c)
{
	dp_client_close_doorbell(c);
	dp_backend_mem_unregister(&c->mem);
	if (c->base && !c->reaping) /* else the reaper has it already */
		discard(c->base, c->size, -1);
	c->base = NULL;
	c->hdr = NULL;
}

/* State (field 3) and starttime (field 22, clock ticks since boot) of a process, from
 * /proc/<pid>/stat. 1: read; 0: no such process (the kernel said so: ENOENT or ESRCH);
 * -1: cannot tell (no descriptor left, no memory, a read that failed, a line that does
 * not parse): the caller must not take that for a death. */
static int proc_stat(uint32_t pid, char *state, uint64_t *start_ticks)
{
	char path[64], buf[1024];
	if (pid == 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return errno == ENOENT || errno == ESRCH ? 0 : -1;
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	int read_errno = ferror(f) ? errno : 0;
	fclose(f);
	if (read_errno) /* ESRCH: the process was reaped since the open */
		return read_errno == ESRCH || read_errno == ENOENT ? 0 : -1;
	buf[len] = '\0';
	/* the command name may hold spaces and parentheses; a space follows the last ')'
	 * (else p + 2 would be past what was read) */
	char *p = strrchr(buf, ')');
	unsigned long long ticks = 0;
	if (!p || p[1] != ' ')
		return -1;
	/* fields after the name: 3 state ... 22 starttime */
	if (sscanf(p + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
			  "%*s %*s %llu",
		   state, &ticks) != 2)
		return -1;
	*start_ticks = ticks;
	return 1;
}

bool dp_pidfd_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	return pidfd < 0 || poll(&p, 1, 0) != 0;
}

uint64_t dp_process_start_ticks(uint32_t pid)
{
	char state;
	uint64_t ticks;
	return proc_stat(pid, &state, &ticks) > 0 ? ticks : 0;
}

bool dp_process_alive(uint32_t pid, uint64_t start_ticks)
{
	if (pid == 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH))
		return false;
	char state;
	uint64_t ticks;
	int rc = proc_stat(pid, &state, &ticks);
	if (rc < 0) /* out of descriptors, say (a connection flood): the pid exists; look again later */
		return true;
	if (rc == 0)
		return false;
	if (state == 'Z' || state == 'X')
		return false;
	/* the kernel's start time, read at attach: a newer process took the pid */
	return ticks == start_ticks;
}
