/* dp_stats.c: the stats segment, written by the control agent (dp_stats.h says who
 * writes what). Aeron's counters file is the model: a header with pid, start time and
 * a heartbeat, then regions a reader maps read-only without telling anyone.
 */
#include "dp_stats.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dp_accept_guard.h"
#include "dp_client.h"
#include "dp_fwd.h"
#include "dp_layers.h"
#include "dp_stats_moe.h"
#include "dp_worker.h"

#define STATS_PATH_MAX 320 /* bytes of the stats path, its NUL included */

struct dp_stats_seg {
	struct dp_world *w;
	const struct dp_counters *nic_counters[DP_MAX_NICS]; /* each NIC worker's, by NIC */
	uint8_t *base;
	char path[STATS_PATH_MAX];
	struct dp_stats_header *hdr;
	struct dp_stats_agent *agents;
	struct dp_stats_client *clients;
	struct dp_stats_nic *nics;
	struct dp_stats_duck *ducks;
	struct dp_stats_hist *hists;
	struct dp_stats_moe_seg *moe; /* the MoE region's writer (dp_stats_moe.c) */
	/* the control agent's own memory */
	uint8_t missed_last[DP_MAX_DUCKS]; /* by topology index: missed its latest forward */
	uint32_t client_id[DP_MAX_CLIENTS]; /* whose entry each client slot holds now */
	uint32_t generation;
};

_Static_assert(DP_NCOUNTERS <= DP_STATS_MAX_COUNTERS, "more counters than the segment has");
_Static_assert(DP_MAX_NICS == DP_STATS_MAX_NICS, "DP_MAX_NICS != STATS_MAX_NICS");
_Static_assert(DP_STATS_NHISTS == 7, "the histograms recorded below");

enum { H_END_TO_END, H_PREPARE, H_SEND, H_WAIT, H_FETCH, H_REDUCE, H_REPLY_SPREAD };

/* src (NUL-ended) into a char[len] field, truncated, NUL-ended */
static void put(char *dst, size_t len, const char *src)
{
	size_t n = 0;
	for (; src && n + 1 < len && src[n]; n++)
		dst[n] = src[n];
	dst[n] = 0;
}

static void set64(uint64_t *p, uint64_t v)
{
	dp_store_relaxed_u64(p, v);
}

static void add64(uint64_t *p, uint64_t n)
{
	dp_store_relaxed_u64(p, *p + n);
}

int dp_stats_path(const char *control, char *out, size_t len)
{
	int n;
	if (!strncmp(control, "ipc://", 6)) {
		const char *sock = control + 6;
		const char *slash = strrchr(sock, '/');
		const char *name = slash ? slash + 1 : sock;
		int dirlen = slash ? (int)(slash - sock) : 0;
		if (!strcmp(name, "control"))
			n = snprintf(out, len, "%.*s%sstats", dirlen, sock, slash ? "/" : "");
		else
			n = snprintf(out, len, "%s.stats", sock);
	} else { /* duckpipe.runtime.run_dir() */
		char dir[256], safe[256];
		const char *env = getenv("DUCKPIPE_RUN_DIR"), *xdg = getenv("XDG_RUNTIME_DIR");
		if (env && *env)
			snprintf(dir, sizeof(dir), "%s", env);
		else if (xdg && *xdg)
			snprintf(dir, sizeof(dir), "%s/duckpipe", xdg);
		else
			snprintf(dir, sizeof(dir), "/tmp/duckpipe-%u", (unsigned)geteuid());
		/* 0700 when we make it; one that was there is checked by dp_stats_open
		 * (check_dir): ours, and nobody else may write to it */
		mkdir(dir, 0700);
		size_t i = 0;
		for (; control[i] && i < sizeof(safe) - 1; i++) {
			char ch = control[i];
			bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
				  (ch >= '0' && ch <= '9') || ch == '.' || ch == '-';
			safe[i] = ok ? ch : '_';
		}
		safe[i] = 0;
		n = snprintf(out, len, "%s/stats-%s", dir, safe);
	}
	if (n < 0 || (size_t)n >= len) {
		dp_set_error("the stats path of %s is too long", control);
		return -1;
	}
	return 0;
}

/* The directory of path (the stats segment's; for ipc:// the control socket's too) must
 * be ours and closed to others: where another user can write, they could plant the file
 * first (a FIFO hangs an open, a symlink aims our writes at their choice). 0 or -1. */
static int check_dir(const char *path)
{
	char dir[320];
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	struct stat st;
	if (stat(dir, &st) < 0) {
		dp_set_error("cannot use the directory %s: %s", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		dp_set_error("%s is not a directory", dir);
		return -1;
	}
	if (st.st_uid != geteuid()) {
		dp_set_error("the directory %s belongs to uid %u, not to this dataplane's uid %u: "
			     "put the control socket in a directory of your own (mode 0700)",
			     dir, (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		dp_set_error("the directory %s is writable by others (mode %04o): another user "
			     "could plant the stats segment or the socket there first; put the "
			     "control socket in a directory only you can write (mode 0700)",
			     dir, (unsigned)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}

/* What is at path before we publish there: nothing, or a regular file of ours (a stats
 * segment left behind: with say, log whose, so the log keeps the evidence). Opened without
 * following a symlink and without blocking, since a FIFO's open waits for a writer that
 * may never come. 0 or -1. */
static int check_stale(const char *path, bool say)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		dp_set_error("cannot open %s, where the stats segment goes: %s%s", path,
			     strerror(errno), errno == ELOOP ? " (a symlink: remove it)" : "");
		return -1;
	}
	struct stat st = { 0 };
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		dp_set_error("%s, where the stats segment goes, is %s: remove it", path,
			     !S_ISREG(st.st_mode) ? "not a regular file (a FIFO, a socket, a device?)"
						  : "owned by another user");
		close(fd);
		return -1;
	}
	struct dp_stats_header h;
	if (say && pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) && h.magic == DP_STATS_MAGIC) {
		bool alive = h.pid && kill((pid_t)h.pid, 0) == 0;
		DP_WARN("replacing the stats segment %s of pid %u (%s)", path, h.pid,
			alive ? "still alive, but not at this control endpoint" : "gone");
	}
	close(fd);
	return 0;
}

int dp_stats_check(const char *control)
{
	char path[STATS_PATH_MAX];
	if (dp_stats_path(control, path, sizeof(path)) < 0)
		return -1;
	/* quiet: dp_stats_open says whose stale segment it replaces */
	return check_dir(path) < 0 || check_stale(path, false) < 0 ? -1 : 0;
}

static int core_of(const struct dp_config *cfg, uint32_t agent)
{
	uint32_t i = cfg->dedicated_threads ? agent : 0;
	return i < cfg->ncores ? cfg->cores[i] : -1;
}

struct dp_stats_seg *dp_stats_open(struct dp_world *w,
				   const struct dp_counters *const *nic_counters)
{
	struct dp_stats_seg *s = calloc(1, sizeof(*s));
	if (!s) {
		dp_set_error("out of memory");
		return NULL;
	}
	s->w = w;
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		s->nic_counters[k] = nic_counters[k];
	char tmp[340];
	if (dp_stats_path(w->cfg.control, s->path, sizeof(s->path)) < 0)
		goto fail;
	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", s->path, (int)getpid());
	/* again: main's dp_stats_check was before the NICs opened, and the directory may
	 * have changed since */
	if (check_dir(s->path) < 0 || check_stale(s->path, true) < 0)
		goto fail;
	unlink(tmp);
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		dp_set_error("cannot create the stats segment %s: %s", tmp, strerror(errno));
		goto fail;
	}
	if (fchmod(fd, 0600) < 0 || ftruncate(fd, DP_STATS_SEGMENT_SIZE) < 0) {
		dp_set_error("cannot size the stats segment %s: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		goto fail;
	}
	s->base = mmap(NULL, DP_STATS_SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (s->base == MAP_FAILED) {
		s->base = NULL;
		dp_set_error("cannot map the stats segment %s: %s", tmp, strerror(errno));
		unlink(tmp);
		goto fail;
	}
	s->hdr = (struct dp_stats_header *)s->base;
	s->agents = (struct dp_stats_agent *)(s->base + DP_STATS_AGENTS_OFFSET);
	s->clients = (struct dp_stats_client *)(s->base + DP_STATS_CLIENTS_OFFSET);
	s->nics = (struct dp_stats_nic *)(s->base + DP_STATS_NICS_OFFSET);
	s->ducks = (struct dp_stats_duck *)(s->base + DP_STATS_DUCKS_OFFSET);
	s->hists = (struct dp_stats_hist *)(s->base + DP_STATS_HISTS_OFFSET);
	s->moe = dp_stats_moe_open(s->base, dp_now_ns());
	if (!s->moe) {
		unlink(tmp);
		goto fail;
	}
	struct dp_stats_name *names = (struct dp_stats_name *)(s->base + DP_STATS_NAMES_OFFSET);
	for (uint32_t i = 0; i < DP_NCOUNTERS; i++)
		put(names[i].name, sizeof(names[i].name), dp_counter_names[i]);
	const struct dp_config *cfg = &w->cfg;
	put(s->agents[0].name, sizeof(s->agents[0].name), "control");
	put(s->agents[1].name, sizeof(s->agents[1].name), "dispatcher");
	for (uint32_t k = 0; k < cfg->nnics; k++) {
		put(s->agents[2 + k].name, sizeof(s->agents[2 + k].name), cfg->nics[k].name);
		struct dp_stats_nic *n = &s->nics[k];
		n->agent = 2 + k;
		int core = core_of(cfg, 2 + k);
		n->core = core < 0 ? 0xffffffffu : (uint32_t)core;
		n->lcore = 0xffffffffu; /* publish_nics: once the EAL placed it */
		put(n->name, sizeof(n->name), cfg->nics[k].name);
		put(n->backend, sizeof(n->backend), cfg->nics[k].backend);
		put(n->interface, sizeof(n->interface), cfg->nics[k].interface);
	}
	for (uint32_t t = 0; t < cfg->nducks && t < DP_MAX_DUCKS; t++) {
		struct dp_stats_duck *d = &s->ducks[t];
		char a[INET_ADDRSTRLEN] = "";
		inet_ntop(AF_INET, &cfg->ducks[t].addr.sin_addr, a, sizeof(a));
		d->id = cfg->ducks[t].id;
		d->nic = cfg->ducks[t].nic;
		d->state = DP_DUCK_STATE_UP;
		snprintf(d->address, sizeof(d->address), "%s:%u", a,
			 (unsigned)ntohs(cfg->ducks[t].addr.sin_port));
	}
	struct dp_stats_bounds *b = (struct dp_stats_bounds *)(s->base + DP_STATS_BOUNDS_OFFSET);
	for (uint32_t i = 0; i < DP_STATS_BUCKETS; i++)
		b->bounds_ns[i] = dp_stats_bound(i);
	struct dp_stats_header *h = s->hdr;
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	h->version_major = DP_STATS_VERSION_MAJOR;
	h->version_minor = DP_STATS_VERSION_MINOR;
	h->header_size = sizeof(*h);
	h->segment_size = DP_STATS_SEGMENT_SIZE;
	h->pid = (uint32_t)getpid();
	h->writer_kind = DP_WRITER_KIND_C;
	h->threads = cfg->dedicated_threads ? DP_THREADS_DEDICATED : DP_THREADS_SHARED;
	h->start_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
	h->start_mono_ns = dp_now_ns();
	h->names_offset = DP_STATS_NAMES_OFFSET;
	h->agents_offset = DP_STATS_AGENTS_OFFSET;
	h->clients_offset = DP_STATS_CLIENTS_OFFSET;
	h->nics_offset = DP_STATS_NICS_OFFSET;
	h->ducks_offset = DP_STATS_DUCKS_OFFSET;
	h->bounds_offset = DP_STATS_BOUNDS_OFFSET;
	h->hists_offset = DP_STATS_HISTS_OFFSET;
	h->ncounters = DP_NCOUNTERS;
	h->nagents = 2 + cfg->nnics;
	h->nclients = DP_MAX_CLIENTS;
	h->nnics = cfg->nnics;
	h->nducks = DP_MAX_DUCKS;
	h->buckets = DP_STATS_BUCKETS;
	h->nhists = DP_STATS_NHISTS;
	h->moe_offset = DP_STATS_MOE_OFFSET;
	h->moe_layers = DP_STATS_MOE_LAYERS;
	h->heartbeat_ns = h->start_mono_ns;
	put(h->control, sizeof(h->control), cfg->control);
	dp_store_release_u64(&h->magic, DP_STATS_MAGIC); /* last: readers check it first */
	if (rename(tmp, s->path) < 0) {
		dp_set_error("cannot publish the stats segment %s: %s", s->path, strerror(errno));
		unlink(tmp);
		goto fail;
	}
	dp_stats_tick(s, dp_now_ns());
	return s;
fail:
	dp_stats_moe_close(s->moe);
	if (s->base)
		munmap(s->base, DP_STATS_SEGMENT_SIZE);
	free(s);
	return NULL;
}

void dp_stats_close(struct dp_stats_seg *s)
{
	if (!s)
		return;
	/* only our own file: a dataplane started after us at this endpoint replaced it */
	struct stat st;
	int fd = open(s->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd >= 0) {
		struct dp_stats_header h;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
		    pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
		    h.pid == (uint32_t)getpid())
			unlink(s->path);
		close(fd);
	}
	dp_stats_moe_close(s->moe);
	munmap(s->base, DP_STATS_SEGMENT_SIZE);
	free(s);
}

const char *dp_stats_file(const struct dp_stats_seg *s)
{
	return s->path;
}

/* --- every tick ------------------------------------------------------------------------ */

static void publish_counters(struct dp_stats_seg *s)
{
	struct dp_world *w = s->w;
	const struct dp_counters *src[DP_STATS_MAX_AGENTS];
	uint32_t n = 0;
	src[n++] = &w->control_counters;
	src[n++] = &w->dispatch_counters;
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		src[n++] = s->nic_counters[k];
	for (uint32_t a = 0; a < n; a++)
		for (uint32_t i = 0; i < DP_NCOUNTERS; i++)
			set64(&s->agents[a].v[i], dp_load_relaxed_u64(&src[a]->v[i]));
	/* parks and kicks are each runner thread's (dp_waker.h), connections_shed libzmq's
	 * I/O thread's (dp_accept_guard.c): shown under control, so the sum over agents is
	 * what GetStats reports */
	uint64_t parks = 0, kicks = 0, expecting = 0;
	for (uint32_t k = 0; k < w->nwakers; k++) {
		parks += dp_load_relaxed_u64(&w->wakers[k]->parks);
		kicks += dp_load_relaxed_u64(&w->wakers[k]->kicked);
		expecting += dp_load_relaxed_u64(&w->wakers[k]->expecting);
	}
	set64(&s->agents[0].v[DP_C_parks], dp_load_relaxed_u64(&src[0]->v[DP_C_parks]) + parks);
	set64(&s->agents[0].v[DP_C_kicks], dp_load_relaxed_u64(&src[0]->v[DP_C_kicks]) + kicks);
	set64(&s->agents[0].v[DP_C_parks_expecting],
	      dp_load_relaxed_u64(&src[0]->v[DP_C_parks_expecting]) + expecting);
	set64(&s->agents[0].v[DP_C_connections_shed], dp_accept_guard_shed());
}

/* Descriptors waiting in a ring, head - tail bounded to [0, capacity]: a head behind the
 * tail counts 0, one too far ahead counts capacity (the dispatcher evicts that client). */
static uint32_t ring_pending(uint64_t head, uint64_t tail, uint32_t capacity)
{
	if (head < tail)
		return 0;
	return head - tail > capacity ? capacity : (uint32_t)(head - tail);
}

/* The entry of client slot i, filled when another client took the slot (ids are never
 * reused). */
static struct dp_stats_client *client_entry(struct dp_stats_seg *s, const struct dp_client *cl)
{
	uint32_t i = (uint32_t)(cl - s->w->clients);
	struct dp_stats_client *e = &s->clients[i];
	if (s->client_id[i] == cl->id)
		return e;
	s->client_id[i] = cl->id;
	dp_store_release_u32(&e->state, DP_STATS_CLIENT_STATE_FREE);
	e->id = cl->id;
	e->pid = cl->pid;
	e->page_size = cl->hdr ? dp_load_acquire_u32(&cl->hdr->page_size) : 0;
	e->capacity = cl->layout.ring_capacity;
	e->slot_count = cl->layout.slot_count;
	e->generation = ++s->generation;
	e->pending = 0;
	set64(&e->head, 0);
	set64(&e->tail, 0);
	set64(&e->inflight, 0);
	set64(&e->submits, 0);
	set64(&e->completions, 0);
	set64(&e->bytes_in, 0);
	set64(&e->bytes_out, 0);
	set64(&e->ring_full, 0);
	set64(&e->errors, 0);
	put(e->name, sizeof(e->name), cl->name);
	put(e->segment, sizeof(e->segment), cl->path);
	dp_store_release_u32(&e->state, DP_STATS_CLIENT_STATE_ATTACHED);
	return e;
}

static void publish_clients(struct dp_stats_seg *s)
{
	struct dp_world *w = s->w;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *cl = &w->clients[i];
		struct dp_stats_client *e = &s->clients[i];
		if (dp_load_acquire_u32(&cl->state) != DP_CLIENT_ACTIVE) {
			if (e->state != DP_STATS_CLIENT_STATE_FREE)
				dp_store_release_u32(&e->state, DP_STATS_CLIENT_STATE_FREE);
			continue;
		}
		e = client_entry(s, cl);
		/* the ring's indices as the segment shows them: head is the client's, tail our
		 * published copy; the control agent maps the segment while the slot is active */
		uint64_t head = dp_load_acquire_u64(&cl->ring->head);
		uint64_t tail = dp_load_acquire_u64(&cl->ring->tail);
		set64(&e->head, head);
		set64(&e->tail, tail);
		/* the tools' only view of the ring (they never map a client's segment): bounded
		 * here, since the client may write any head */
		__atomic_store_n(&e->pending, ring_pending(head, tail, e->capacity),
				 __ATOMIC_RELAXED);
		set64(&e->inflight, __atomic_load_n(&cl->inflight, __ATOMIC_ACQUIRE));
		set64(&e->submits, dp_load_relaxed_u64(&cl->submitted));
		set64(&e->completions, cl->completed);
	}
}

/* Ducks that just turned lost, one log line for all of them: the user's first mistake is
 * most often a duck count, port or address that does not match the running ducks, and
 * the log is where they look first. */
static void log_newly_lost(struct dp_stats_seg *s, const uint32_t *ts, uint32_t n,
			   uint32_t reason, uint64_t window_ns)
{
	char list[512];
	size_t used = 0;
	for (uint32_t i = 0; i < n && used + 48 < sizeof(list); i++) {
		const struct dp_stats_duck *d = &s->ducks[ts[i]];
		int k = snprintf(list + used, sizeof(list) - used, "%s%u (%s)", i ? ", " : "",
				 d->id, d->address);
		used += k > 0 ? (size_t)k : 0;
	}
	if (n && used + 48 >= sizeof(list))
		snprintf(list + used, sizeof(list) - used, ", ...");
	if (reason == DP_DUCK_REASON_NEVER_ANSWERED)
		DP_WARN("ducks lost: %u never answered a PING or a LAYER in %.1f s: %s; check that "
			"that many ducks run (the topology names %u), on the port and address "
			"the topology gives each",
			n, (double)window_ns / 1e9, list, s->w->cfg.nducks);
	else
		DP_WARN("ducks lost: %u went silent for more than %.1f s: %s; did they stop or "
			"restart?",
			n, (double)window_ns / 1e9, list);
}

static void publish_ducks(struct dp_stats_seg *s, uint64_t now)
{
	struct dp_world *w = s->w;
	uint32_t layers[DP_MAX_DUCKS] = { 0 };
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) { /* control owns the table */
		const struct dp_layer *l = w->layers[i];
		if (!l || l == DP_LAYER_GONE || !dp_load_acquire_u32(&l->ready))
			continue;
		for (uint32_t k = 0; k < l->nducks; k++) {
			uint32_t d = l->ducks[k];
			int16_t t = w->duck_index[d];
			/* not one it lost (it said NO_LAYER: restarted) */
			if (t >= 0 && !(__atomic_load_n(&l->lost_ducks[d >> 6], __ATOMIC_RELAXED) >>
						(d & 63) & 1))
				layers[t]++;
		}
	}
	uint64_t lost = (uint64_t)w->cfg.ping_ms * 3000000ull;
	uint64_t floor_ns = (uint64_t)w->cfg.duck_lost_ms * 1000000ull;
	lost = lost > floor_ns ? lost : floor_ns;
	uint64_t known_lost[DP_MAX_DUCKS / 64] = { 0 };
	uint64_t start = s->hdr->start_mono_ns;
	bool pinged_long_enough = now > start && now - start > lost;
	uint32_t never[DP_MAX_DUCKS], silent[DP_MAX_DUCKS], nnever = 0, nsilent = 0;
	for (uint32_t t = 0; t < w->cfg.nducks && t < DP_MAX_DUCKS; t++) {
		struct dp_stats_duck *d = &s->ducks[t];
		uint64_t seen = dp_load_relaxed_u64(&w->duck_seen_ns[d->id]);
		uint32_t state = DP_DUCK_STATE_UP, reason = DP_DUCK_REASON_NONE;
		/* never heard from: every PING since start (or a forward's deadline) went
		 * unanswered, whether or not anything was asked of it since */
		if (!seen && (pinged_long_enough || d->timeouts > 0)) {
			state = DP_DUCK_STATE_LOST;
			reason = DP_DUCK_REASON_NEVER_ANSWERED;
		} else if (seen && now > seen && now - seen > lost) {
			state = DP_DUCK_STATE_LOST;
			reason = DP_DUCK_REASON_SILENT;
		} else if (s->missed_last[t]) {
			state = DP_DUCK_STATE_LATE;
			reason = DP_DUCK_REASON_MISSED_FORWARD;
		}
		uint32_t was = __atomic_load_n(&d->reason, __ATOMIC_RELAXED);
		if (reason != was && reason == DP_DUCK_REASON_NEVER_ANSWERED)
			never[nnever++] = t;
		else if (reason != was && reason == DP_DUCK_REASON_SILENT)
			silent[nsilent++] = t;
		else if (was == DP_DUCK_REASON_NEVER_ANSWERED || was == DP_DUCK_REASON_SILENT)
			if (state == DP_DUCK_STATE_UP)
				DP_INFO("duck %u (%s) answers again", d->id, d->address);
		if (state == DP_DUCK_STATE_LOST && d->id < DP_MAX_DUCKS) {
			/* routed around before any view says lost: a client that saw it
			 * lost and then submits is not sent to it */
			known_lost[d->id >> 6] |= 1ull << (d->id & 63);
			__atomic_fetch_or(&w->lost_ducks[d->id >> 6], 1ull << (d->id & 63),
					  __ATOMIC_RELAXED);
		}
		__atomic_store_n(&d->reason, reason, __ATOMIC_RELAXED);
		__atomic_store_n(&d->state, state, __ATOMIC_RELAXED);
		__atomic_store_n(&d->layers, layers[t], __ATOMIC_RELAXED);
		set64(&d->seen_ns, seen);
	}
	/* what the dispatcher routes around (dp_world.h): the ducks back are cleared, a
	 * word at a time, relaxed */
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
		__atomic_store_n(&w->lost_ducks[k], known_lost[k], __ATOMIC_RELAXED);
	if (nnever)
		log_newly_lost(s, never, nnever, DP_DUCK_REASON_NEVER_ANSWERED, lost);
	if (nsilent)
		log_newly_lost(s, silent, nsilent, DP_DUCK_REASON_SILENT, lost);
}

/* Each NIC's link (its worker's backend writes it) and, for a worker on an EAL lcore,
 * that lcore and its CPU (dp_main.c places it after the segment is made). */
static void publish_nics(struct dp_stats_seg *s)
{
	struct dp_world *w = s->w;
	for (uint32_t k = 0; k < w->cfg.nnics; k++) {
		const struct dp_worker *wk = w->workers[k];
		struct dp_stats_nic *n = &s->nics[k];
		if (!wk)
			continue;
		dp_store_release_u32(&n->link, dp_load_acquire_u32(&wk->be.link));
		dp_store_release_u32(&n->link_speed_mbps, dp_load_acquire_u32(&wk->be.link_speed_mbps));
		if (wk->lcore >= 0) {
			dp_store_release_u32(&n->lcore, (uint32_t)wk->lcore);
			dp_store_release_u32(&n->core, wk->cpu < 0 ? 0xffffffffu : (uint32_t)wk->cpu);
		}
	}
}

void dp_stats_tick(struct dp_stats_seg *s, uint64_t now)
{
	if (!s)
		return;
	publish_counters(s);
	publish_nics(s);
	publish_clients(s);
	publish_ducks(s, now);
	dp_stats_moe_tick(s->moe, s->w, now);
	set64(&s->hdr->epoch, dp_load_acquire_u64(&s->w->epoch));
	set64(&s->hdr->heartbeat_ns, now);
}

/* --- every completion ---------------------------------------------------------------- */

void dp_stats_completion(struct dp_stats_seg *s, const struct dp_fwd *f,
			 const struct dp_fwd_summary *sum, uint64_t now)
{
	if (!s)
		return;
	struct dp_world *w = s->w;
	const struct dp_client *cl = f->client;
	bool ok = f->status == DP_STATUS_OK;
	uint32_t ci = cl ? (uint32_t)(cl - w->clients) : 0;
	/* a client that detached since keeps its numbers, and no entry is made for it */
	if (cl && (s->client_id[ci] == cl->id || dp_load_acquire_u32(&cl->state) == DP_CLIENT_ACTIVE)) {
		struct dp_stats_client *e = client_entry(s, cl);
		if (f->kind == DP_FWD_FORWARD) {
			add64(&e->bytes_in, f->bytes);
			if (ok)
				add64(&e->bytes_out, f->bytes);
		} else if (f->kind == DP_FWD_WEIGHT && ok) {
			add64(&e->bytes_in, f->desc.nbytes);
		}
		if (!ok)
			add64(&e->errors, 1);
	}
	if (f->kind != DP_FWD_FORWARD)
		return;
	/* every client's forwards share these: only the dataplane's own clock goes in, never
	 * the client-written submit stamp (submit_ns = 1 once moved every reader's mean to
	 * 1.2e12 ns); the stamp's prepare_ns is the client's own, in its Completion */
	struct dp_stats_hist *h = s->hists;
	uint64_t e2e = now > f->pickup_ns ? now - f->pickup_ns : 0;
	dp_stats_record(h[H_END_TO_END].counts, &h[H_END_TO_END].sum_ns, e2e);
	dp_stats_record(h[H_PREPARE].counts, &h[H_PREPARE].sum_ns, dp_fwd_own_prepare_ns(f));
	dp_stats_record(h[H_SEND].counts, &h[H_SEND].sum_ns, sum->phases.send_ns);
	dp_stats_record(h[H_WAIT].counts, &h[H_WAIT].sum_ns, sum->phases.wait_ns);
	dp_stats_record(h[H_FETCH].counts, &h[H_FETCH].sum_ns, sum->phases.fetch_ns);
	dp_stats_record(h[H_REDUCE].counts, &h[H_REDUCE].sum_ns, sum->phases.reduce_ns);
	if (sum->nanswered > 1)
		dp_stats_record(h[H_REPLY_SPREAD].counts, &h[H_REPLY_SPREAD].sum_ns,
				sum->phases.spread_ns);
	for (uint32_t i = 0; i < sum->nanswered; i++) {
		int16_t t = w->duck_index[sum->answered[i]];
		if (t < 0)
			continue;
		const struct dp_duck_rx *rx = &f->rx[t];
		struct dp_stats_duck *d = &s->ducks[t];
		uint64_t r = rx->done_ns > f->pickup_ns ? rx->done_ns - f->pickup_ns : 0;
		dp_stats_record(d->reply, &d->reply_sum_ns, r);
		set64(&d->last_reply_ns, r);
		add64(&d->replies, 1);
		add64(&d->nacks, rx->nacks);
		if (f->desc.flags & DP_DESC_FLAG_ROUTED) { /* what it computed for this forward */
			add64(&d->moe_tokens, rx->moe_rows);
			add64(&d->moe_expert_rows, rx->moe_entries);
		}
		s->missed_last[t] = 0;
	}
	for (uint32_t i = 0; i < sum->nmissing; i++) {
		int16_t t = w->duck_index[sum->missing[i]];
		if (t < 0)
			continue;
		const struct dp_duck_rx *rx = &f->rx[t];
		struct dp_stats_duck *d = &s->ducks[t];
		if (f->status == DP_STATUS_TIMEOUT)
			add64(&d->timeouts, 1);
		/* chunks still missing; a duck that sent nothing counts one */
		uint32_t want = rx->reasm.chunks, have = rx->reasm.have;
		add64(&d->missing_chunks, want > have ? want - have : 1);
		add64(&d->nacks, rx->nacks);
		if (rx->state == 3) /* silent: its rows went to another replica (dp_moe.c) */
			add64(&d->moe_failovers, 1);
		s->missed_last[t] = 1;
	}
	dp_stats_moe_forward(s->moe, w, f, sum); /* a routed forward's expert and duck load */
}
