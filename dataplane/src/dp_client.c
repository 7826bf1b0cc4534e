/* dp_client.c: client segments as the dataplane sees them.
 *
 * The layout rules here are duckpipe/shm.py's _plan(): a segment whose header
 * disagrees with them is refused, so a bad header can never aim our pointers.
 */
#include "dp_client.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HUGEPAGE (2u << 20)
#define SMALL_PAGE 4096u

static uint64_t align_up(uint64_t n, uint64_t a)
{
	return (n + a - 1) / a * a;
}

static bool pow2(uint64_t n)
{
	return n && !(n & (n - 1));
}

static int check_layout(const struct dp_seg_header *h, size_t file_size)
{
	uint64_t n = h->slot_count, cap = h->ring_capacity;
	if (h->header_size != sizeof(struct dp_seg_header) || h->desc_size != sizeof(struct dp_desc)) {
		dp_set_error("header or descriptor size differs from this build's");
		return -1;
	}
	if (!pow2(n) || !pow2(cap) || cap < n) {
		dp_set_error("bad slot count %lu or ring capacity %lu", n, cap);
		return -1;
	}
	if (h->backing != DP_BACKING_HUGETLBFS && h->backing != DP_BACKING_DEVSHM) {
		dp_set_error("unknown backing %u", h->backing);
		return -1;
	}
	uint64_t page = h->backing == DP_BACKING_HUGETLBFS ? HUGEPAGE : SMALL_PAGE;
	uint64_t ring = align_up(sizeof(struct dp_seg_header), 128);
	uint64_t descs_end = ring + sizeof(struct dp_ring_header) + cap * sizeof(struct dp_desc);
	uint64_t res_hdr = align_up(descs_end, 64);
	uint64_t act = align_up(res_hdr + n * sizeof(struct dp_slot_header), 4096);
	uint64_t act_slot = align_up(h->act_slot_size, 4096);
	uint64_t res_slot = align_up(h->res_slot_size, 4096);
	uint64_t res = act + n * act_slot;
	uint64_t size = align_up(res + n * res_slot, page);
	if (h->ring_offset != ring || h->res_hdr_offset != res_hdr || h->act_offset != act ||
	    h->res_offset != res || h->act_slot_size != act_slot || h->res_slot_size != res_slot ||
	    h->segment_size != size || size != file_size) {
		dp_set_error("the header's layout is not one this version writes");
		return -1;
	}
	return 0;
}

int dp_client_map(struct dp_client *c, const char *path, uint32_t pid)
{
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		dp_set_error("cannot open segment %s: %s; is the client alive?", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 4096 ||
	    (st.st_uid != geteuid() && geteuid() != 0)) {
		close(fd);
		dp_set_error("%s is not a segment file of uid %u", path, geteuid());
		return -1;
	}
	/* MAP_POPULATE: fault every page now, never on a forward */
	void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
			  MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (base == MAP_FAILED) {
		dp_set_error("mmap %s: %s", path, strerror(errno));
		return -1;
	}
	struct dp_seg_header *h = base;
	/* acquire: the creator stores magic last, with release */
	if (dp_load_acquire_u64(&h->magic) != DP_SEG_MAGIC) {
		munmap(base, (size_t)st.st_size);
		dp_set_error("%s has no duckpipe segment header", path);
		return -1;
	}
	if (h->abi_major != DP_ABI_MAJOR) {
		munmap(base, (size_t)st.st_size);
		dp_set_error("%s uses segment ABI %u.%u, this dataplane speaks %u.x", path,
			     h->abi_major, h->abi_minor, DP_ABI_MAJOR);
		return -1;
	}
	if (check_layout(h, (size_t)st.st_size) < 0 || h->creator_pid != pid) {
		if (h->creator_pid != pid)
			dp_set_error("segment was made by pid %u, not %u", h->creator_pid, pid);
		munmap(base, (size_t)st.st_size);
		dp_add_error_context("%s", path);
		return -1;
	}
	c->base = base;
	c->size = (size_t)st.st_size;
	c->hdr = h;
	c->ring = (struct dp_ring_header *)(c->base + h->ring_offset);
	c->descs = (struct dp_desc *)(c->base + h->ring_offset + sizeof(struct dp_ring_header));
	c->slots = (struct dp_slot_header *)(c->base + h->res_hdr_offset);
	c->act = c->base + h->act_offset;
	c->res = c->base + h->res_offset;
	c->pid = pid;
	c->start_ns = h->start_ns;
	snprintf(c->path, sizeof(c->path), "%s", path);
	return 0;
}

void dp_client_unmap(struct dp_client *c)
{
	if (c->base)
		munmap(c->base, c->size);
	c->base = NULL;
	c->hdr = NULL;
}

/* Boot time (CLOCK_REALTIME seconds), for turning /proc start ticks into a date. */
static uint64_t boot_time_s(void)
{
	static uint64_t btime;
	if (btime)
		return btime;
	FILE *f = fopen("/proc/stat", "r");
	char line[256];
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %lu", &btime) == 1)
			break;
	if (f)
		fclose(f);
	return btime;
}

bool dp_process_alive(uint32_t pid, uint64_t started_realtime_ns)
{
	if (pid == 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH))
		return false;
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!p)
		return true;
	char state;
	unsigned long long start_ticks = 0;
	/* fields after the name: 3 state ... 22 starttime */
	if (sscanf(p + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
			  "%*s %llu",
		   &state, &start_ticks) != 2)
		return true;
	if (state == 'Z' || state == 'X')
		return false;
	if (started_realtime_ns) {
		uint64_t started_s = boot_time_s() + start_ticks / (uint64_t)sysconf(_SC_CLK_TCK);
		if (started_s > started_realtime_ns / 1000000000ull + 1)
			return false; /* a newer process took the pid */
	}
	return true;
}
