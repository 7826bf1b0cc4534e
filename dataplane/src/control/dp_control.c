/* dp_control.c: the control agent.
 *
 * One ZeroMQ ROUTER carries the control protocol of duckpipe/schema/control.py
 * (msgpack maps whose "type" names the message): attach and detach, topology,
 * layers, weight-load plans, epochs, stats, shutdown. Requests are decoded by
 * the generated dp_ctl_gen.c; this file holds the handlers, which check the
 * sender's role (dp_access.c: the admin is the dataplane's own user). It also
 * sends every completion the other agents queue (its numbers and the context's
 * return to the dispatcher: dp_fwd.c), heartbeats into every attached segment,
 * reclaims the segments of clients that died and frees the layers they owned
 * (dp_layers.c).
 */
#include "dp_control.h"

#include <arpa/inet.h>
#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "dp_accept_guard.h"
#include "dp_access.h"
#include "dp_client.h"
#include "dp_ctl_gen.h"
#include "dp_fwd.h"
#include "dp_layers.h"
#include "dp_msgpack.h"
#include "dp_reduce.h"
#include "dp_stats.h"
#include "dp_worker.h"

#define HOUSEKEEPING_NS 50000000ull /* 50 ms */
#define ATTACH_STEP (8u << 20)      /* bytes faulted in or unmapped per pass (attach_steps) */
#define MAX_MESSAGES_PER_LOOP 64
/* a connection that has not finished its ZMTP greeting by then is closed (libzmq's
 * default is 30 s: raw connections held that long once exhausted the fd table) */
#define HANDSHAKE_IVL_MS 2000
/* replies queued for one peer that does not read them: past it replies (and completions,
 * sent DONTWAIT; the slot's done word still carries the status) are dropped, so with
 * max_connections peers what unread replies can cost is bounded */
#define ROUTER_SNDHWM 256
#define MONITOR_ENDPOINT "inproc://duckpipe-control-monitor"
#define FLOOD_SLACK 8 /* connections beyond the attached clients' that still let it park */
/* completions held back to leave together (completion_flush_us): at most this many */
#define OUTBOX_MAX 32
#define OUTBOX_BYTES (OUTBOX_MAX * 8192)

/* A packed completion waiting in the outbox, and who it is for. */
struct outbox_entry {
	uint8_t identity[256];
	uint32_t identity_len;
	size_t off, len; /* in the outbox buffer */
};

/* Failed layers whose missing ducks one Layers reply lists (the rest: failed, no list). */
#define FAILED_LAYERS_LISTED 64

struct dp_control {
	struct dp_world *w;
	void *zctx;
	void *router;
	uint64_t next_house;
	uint32_t next_client_id;
	msgpack_sbuffer sbuf;
	msgpack_packer pk;
	struct dp_counters *counters;
	struct dp_ctl_request req;      /* the request being handled (large: not on the stack) */
	struct dp_access access;        /* who may talk, and as what (dp_access.c) */
	void *monitor;                  /* PAIR: the router's accept/disconnect events */
	uint32_t connections;           /* live control connections (accepted - disconnected) */
	bool over_limit;                /* refusing connections: logged once per episode */
	struct dp_layer *retired;       /* unpublished layers, freed once nobody can hold them */
	struct dp_ctl_layer_info *layer_infos; /* Layers reply: one per table slot */
	uint32_t (*layer_ducks)[256];
	uint32_t (*layer_missing)[256]; /* Layers reply: the missing ducks of failed layers */
	uint64_t started_ns;            /* a duck silent since then for 3 pings is unreachable */
	/* the outbox: completions packed as they come, sent together (flush_outbox) */
	struct outbox_entry outbox[OUTBOX_MAX];
	uint32_t noutbox;
	uint8_t *outbox_buf;
	size_t outbox_used;
	uint64_t outbox_since; /* when the oldest waiting completion was packed */
	struct dp_stats_seg *stats; /* the stats segment: this agent is its only writer */
	uint64_t next_stats;
};

const char *const dp_counter_names[DP_NCOUNTERS] = {
#define DP_COUNTER_NAME(name) #name,
	DP_COUNTER_LIST(DP_COUNTER_NAME)
#undef DP_COUNTER_NAME
};

/* --- replies ----------------------------------------------------------------------- */

/* Every reply is packed by its generated encoder (dp_ctl_pack_*) into c->sbuf, emptied
 * first, then sent. */
#define PACK(c, name, ...)                                                         \
	do {                                                                       \
		msgpack_sbuffer_clear(&(c)->sbuf);                                 \
		dp_ctl_pack_##name(&(c)->pk, &(struct dp_ctl_##name){ __VA_ARGS__ }); \
	} while (0)

static void send_to(struct dp_control *c, const uint8_t *id, size_t idlen)
{
	/* DONTWAIT: a client that stopped reading must not stall the dataplane */
	if (zmq_send(c->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(c->router, c->sbuf.data, c->sbuf.size, ZMQ_DONTWAIT) < 0)
		DP_DEBUG("reply dropped: %s", zmq_strerror(errno));
}

static void reply_error(struct dp_control *c, const uint8_t *id, size_t idlen, uint64_t req_id,
			enum dp_error_code code, const char *message)
{
	PACK(c, error, .req_id = req_id, .code = code, .message = message);
	send_to(c, id, idlen);
}

static void reply_ack(struct dp_control *c, const uint8_t *id, size_t idlen, uint64_t req_id)
{
	PACK(c, ack, .req_id = req_id);
	send_to(c, id, idlen);
}

/* --- completions ---------------------------------------------------------------------- */

/* Send every completion in the outbox, oldest first, in one burst: ZeroMQ wakes its I/O
 * thread (and the client's) once for the burst, not once a message. On a shared core those
 * wake-ups cost a forward more than everything else the handoff does (README). */
static void flush_outbox(struct dp_control *c)
{
	for (uint32_t i = 0; i < c->noutbox; i++) {
		const struct outbox_entry *e = &c->outbox[i];
		if (zmq_send(c->router, e->identity, e->identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
		    zmq_send(c->router, c->outbox_buf + e->off, e->len, ZMQ_DONTWAIT) < 0)
			DP_DEBUG("completion dropped: %s", zmq_strerror(errno));
	}
	dp_count(c->counters, DP_C_completions_sent, c->noutbox);
	if (c->noutbox)
		dp_count(c->counters, DP_C_completion_flushes, 1);
	c->noutbox = 0;
	c->outbox_used = 0;
}

/* The completion just packed into c->sbuf, for client cl: into the outbox. The slot's done
 * word already told the client; this carries the timings and duck lists, a little later. */
static void queue_completion(struct dp_control *c, const struct dp_client *cl)
{
	if (c->noutbox == OUTBOX_MAX || c->outbox_used + c->sbuf.size > OUTBOX_BYTES)
		flush_outbox(c);
	if (c->sbuf.size > OUTBOX_BYTES || c->w->cfg.completion_flush_us == 0) {
		send_to(c, cl->identity, cl->identity_len); /* no waiting asked for */
		dp_count(c->counters, DP_C_completions_sent, 1);
		return;
	}
	struct outbox_entry *e = &c->outbox[c->noutbox++];
	memcpy(e->identity, cl->identity, cl->identity_len);
	e->identity_len = cl->identity_len;
	e->off = c->outbox_used;
	e->len = c->sbuf.size;
	memcpy(c->outbox_buf + e->off, c->sbuf.data, e->len);
	c->outbox_used += e->len;
	if (c->noutbox == 1)
		c->outbox_since = dp_now_ns();
}

/* When the outbox must be flushed (UINT64_MAX: it is empty). */
static uint64_t outbox_due(const struct dp_control *c)
{
	return c->noutbox ? c->outbox_since + (uint64_t)c->w->cfg.completion_flush_us * 1000
			  : UINT64_MAX;
}

static void send_completion(struct dp_control *c, struct dp_fwd *f)
{
	struct dp_world *w = c->w;
	struct dp_client *cl = f->client;
	struct dp_fwd_summary s;
	dp_fwd_summarize(w, f, &s);
	dp_stats_completion(c->stats, f, &s, dp_now_ns());
	PACK(c, completion, .forward_id = f->desc.forward_id, .slot = f->desc.slot,
	     .generation = f->desc.generation, .epoch = f->desc.epoch, .status = f->status,
	     .answered = s.answered, .answered_len = s.nanswered, .missing = s.missing,
	     .missing_len = s.nmissing,
	     .timings = {
		     .prepare_ns = s.prepare_ns,
		     .send_ns = s.send_ns,
		     .wait_ns = s.wait_ns,
		     .fetch_ns = s.fetch_ns,
		     .reduce_ns = s.reduce_ns,
		     .spread_ns = s.spread_ns,
		     .duck_compute_ns = s.compute_ns,
		     .duck_compute_ns_len = s.nanswered,
	     },
	     .message = f->message, .current_epoch = dp_load_acquire_u64(&w->epoch));
	queue_completion(c, cl);
	dp_fwd_release(w, f);
}

static int drain_completions(struct dp_control *c)
{
	struct dp_world *w = c->w;
	void *done[DP_BURST];
	int work = 0;
	uint32_t n;
	while ((n = dp_spsc_pop(&w->dispatch_done, done, DP_BURST)) > 0) {
		for (uint32_t i = 0; i < n; i++)
			send_completion(c, done[i]);
		work += (int)n;
	}
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		while ((n = dp_spsc_pop(&w->workers[k]->done, done, DP_BURST)) > 0) {
			for (uint32_t i = 0; i < n; i++)
				send_completion(c, done[i]);
			work += (int)n;
		}
	return work;
}

/* --- requests ---------------------------------------------------------------------------- */

/* Who sent the request being handled. */
struct dp_peer {
	const uint8_t *id; /* ZeroMQ routing id */
	size_t idlen;
	uint64_t rid;      /* req_id, echoed in the reply */
	bool creds;        /* uid, gid, pid read from the socket (ipc:// only) */
	uint32_t uid, gid, pid;
	bool admin;        /* the dataplane's own user */
};

typedef void (*dp_ctl_handler)(struct dp_control *c, const struct dp_peer *p,
			       const struct dp_ctl_request *r);

static void refuse(struct dp_control *c, const struct dp_peer *p, enum dp_error_code code,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void refuse(struct dp_control *c, const struct dp_peer *p, enum dp_error_code code,
		   const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (code == DP_ERROR_CODE_NOT_PERMITTED)
		dp_count(c->counters, DP_C_control_refused, 1);
	reply_error(c, p->id, p->idlen, p->rid, code, msg);
}

static struct dp_client *client_by_identity(struct dp_control *c, const uint8_t *id, size_t len)
{
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &c->w->clients[i];
		if (dp_load_acquire_u32(&cl->state) == DP_CLIENT_ACTIVE && cl->identity_len == len &&
		    !memcmp(cl->identity, id, len))
			return cl;
	}
	return NULL;
}

static void on_attach(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	const struct dp_ctl_attach *m = &r->u.attach;
	if (m->protocol != DP_PROTOCOL_VERSION || m->abi_major != DP_ABI_MAJOR) {
		refuse(c, p, DP_ERROR_CODE_ABI_MISMATCH,
		       "client speaks protocol %u / ABI %u, this dataplane %d / %d", m->protocol,
		       m->abi_major, DP_PROTOCOL_VERSION, DP_ABI_MAJOR);
		return;
	}
	if (!p->creds) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		       "shared memory needs a local peer: attach over ipc://, not tcp://");
		return;
	}
	if (m->pid != p->pid) {
		refuse(c, p, DP_ERROR_CODE_BAD_SEGMENT,
		       "Attach.pid %u is not the sender's pid %u: attach your own segment", m->pid,
		       p->pid);
		return;
	}
	if (p->idlen > sizeof(c->w->clients[0].identity)) {
		refuse(c, p, DP_ERROR_CODE_BAD_REQUEST, "ZeroMQ identity too long");
		return;
	}
	if (client_by_identity(c, p->id, p->idlen)) {
		refuse(c, p, DP_ERROR_CODE_ALREADY_ATTACHED, "this socket is attached");
		return;
	}
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *o = &c->w->clients[i];
		if (dp_load_acquire_u32(&o->state) == DP_CLIENT_ATTACHING &&
		    o->identity_len == p->idlen &&
		    !memcmp(o->identity, p->id, p->idlen)) {
			refuse(c, p, DP_ERROR_CODE_ALREADY_ATTACHED, "this socket is attaching");
			return;
		}
	}
	/* one process cannot take every client slot */
	uint32_t mine = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		uint32_t state = dp_load_acquire_u32(&c->w->clients[i].state);
		mine += (state == DP_CLIENT_ACTIVE || state == DP_CLIENT_ATTACHING) &&
			c->w->clients[i].pid == p->pid;
	}
	if (mine >= c->w->cfg.client_max_per_pid) {
		dp_count(c->counters, DP_C_quota_refused, 1);
		refuse(c, p, DP_ERROR_CODE_QUOTA_EXCEEDED,
		       "pid %u has %u clients attached, client_max_per_pid is %u: close one first",
		       p->pid, mine, c->w->cfg.client_max_per_pid);
		return;
	}
	struct dp_client *cl = NULL;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && !cl; i++)
		if (dp_load_acquire_u32(&c->w->clients[i].state) == DP_CLIENT_FREE)
			cl = &c->w->clients[i];
	if (!cl) {
		refuse(c, p, DP_ERROR_CODE_TOO_MANY_CLIENTS, "every client slot is taken");
		return;
	}
	memset(cl, 0, sizeof(*cl));
	/* the peer's pid from the socket, never the message's */
	if (dp_client_map(cl, p->pid, p->uid, m->segment_fd) < 0) {
		refuse(c, p, DP_ERROR_CODE_BAD_SEGMENT, "%s", dp_error());
		return;
	}
	cl->id = c->next_client_id++;
	cl->uid = p->uid;
	memcpy(cl->identity, p->id, p->idlen);
	cl->identity_len = p->idlen;
	snprintf(cl->name, sizeof(cl->name), "%s", m->name);
	cl->attach_rid = p->rid;
	/* faulted in by attach_steps, a step per pass, and answered when done */
	dp_store_release_u32(&cl->state, DP_CLIENT_ATTACHING);
	DP_DEBUG("client %u (pid %u uid %u, %s): attaching %s (%s), %zu bytes", cl->id, p->pid,
		 p->uid, m->name, m->segment, cl->path, cl->size);
}

/* The segment is in: the client turns ACTIVE and hears Attached. */
static void attach_done(struct dp_control *c, struct dp_client *cl)
{
	cl->hdr->dataplane_pid = (uint32_t)getpid();
	cl->hdr->client_id = cl->id;
	dp_store_relaxed_u64(&cl->hdr->dataplane_heartbeat_ns, dp_now_ns());
	/* release: the dispatcher that sees ACTIVE sees the mapping */
	dp_store_release_u32(&cl->state, DP_CLIENT_ACTIVE);
	dp_count(c->counters, DP_C_clients_attached, 1);
	if (cl->mem.registered) {
		dp_count(c->counters, DP_C_extmem_registered, 1);
		dp_count(c->counters, DP_C_extmem_registered_bytes, cl->mem.len);
	}
	DP_INFO("client %u (pid %u uid %u, %s) attached %s, %zu MiB", cl->id, cl->pid, cl->uid,
		cl->name, cl->path, cl->size >> 20);
	PACK(c, attached, .req_id = cl->attach_rid, .client_id = cl->id,
	     .epoch = dp_load_acquire_u64(&c->w->epoch), .session = c->w->session,
	     .dataplane_pid = (uint64_t)getpid(), .mode = c->w->cfg.nics[0].backend,
	     .ducks = c->w->cfg.nducks, .default_timeout_us = c->w->cfg.default_timeout_us,
	     .max_forward_bytes = c->w->cfg.max_forward_bytes, .doorbell = c->w->doorbell);
	send_to(c, cl->identity, cl->identity_len);
	dp_waker_kick(c->w->dispatch_waker); /* a parked dispatcher arms the new ring too */
}

/* Segments are faulted in at attach and unmapped after detach ATTACH_STEP bytes per
 * pass, so that a large one on small pages (0.3 s per GiB to fault in, 0.2 s to unmap)
 * never stalls the dispatcher and workers sharing this thread for longer than a step:
 * about 2 ms on 4 KiB pages. Returns the work done. */
static int attach_steps(struct dp_control *c)
{
	int work = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &c->w->clients[i];
		uint32_t state = dp_load_acquire_u32(&cl->state); /* only this agent moves these two */
		if (state == DP_CLIENT_ATTACHING) {
			work++;
			int rc = dp_client_populate(cl, ATTACH_STEP);
			if (rc > 0) {
				attach_done(c, cl);
			} else if (rc < 0) {
				struct dp_peer p = { .id = cl->identity, .idlen = cl->identity_len,
						     .rid = cl->attach_rid, .pid = cl->pid, .uid = cl->uid };
				refuse(c, &p, DP_ERROR_CODE_BAD_SEGMENT, "%s", dp_error());
				dp_client_unmap(cl);
				dp_store_release_u32(&cl->state, DP_CLIENT_FREE);
			}
		} else if (state == DP_CLIENT_UNMAPPING) {
			work++;
			if (dp_client_unmap_step(cl, ATTACH_STEP) > 0) {
				dp_layers_unload_owner(c->w, cl->id, &c->retired); /* its layers go with it */
				if (cl->dead)
					dp_count(c->counters, DP_C_clients_reclaimed, 1);
				dp_store_release_u32(&cl->state, DP_CLIENT_FREE);
			}
		}
	}
	return work;
}

static void on_detach(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	(void)r;
	struct dp_client *cl = client_by_identity(c, p->id, p->idlen);
	if (cl) {
		dp_layers_unload_owner(c->w, cl->id, &c->retired); /* now: its layer ids are free for the next client */
		dp_store_release_u32(&cl->state, DP_CLIENT_CLOSING);
		dp_waker_kick(c->w->dispatch_waker); /* it acknowledges CLOSING in a pass */
		dp_count(c->counters, DP_C_clients_detached, 1);
	}
	reply_ack(c, p->id, p->idlen, p->rid);
}

static void on_heartbeat(struct dp_control *c, const struct dp_peer *p,
			 const struct dp_ctl_request *r)
{
	(void)r;
	reply_ack(c, p->id, p->idlen, p->rid);
}

static void on_topology(struct dp_control *c, const struct dp_peer *p,
			const struct dp_ctl_request *r)
{
	struct dp_world *w = c->w;
	static char addrs[DP_MAX_NICS * 2 + 256][INET_ADDRSTRLEN];
	struct dp_ctl_nic_info nics[DP_MAX_NICS];
	struct dp_ctl_duck_info ducks[256];
	uint64_t now = dp_now_ns();
	(void)r;
	for (uint32_t n = 0; n < w->cfg.nnics; n++) {
		const struct dp_nic_cfg *nic = &w->cfg.nics[n];
		char *host = addrs[2 * n], *bcast = addrs[2 * n + 1];
		inet_ntop(AF_INET, &nic->host.sin_addr, host, INET_ADDRSTRLEN);
		inet_ntop(AF_INET, &nic->broadcast.sin_addr, bcast, INET_ADDRSTRLEN);
		nics[n] = (struct dp_ctl_nic_info){ .name = nic->name, .backend = nic->backend,
						    .address = host,
						    .broadcast = nic->use_broadcast ? bcast : "" };
	}
	for (uint32_t i = 0; i < w->cfg.nducks; i++) {
		const struct dp_duck_cfg *d = &w->cfg.ducks[i];
		uint64_t seen = dp_load_relaxed_u64(&w->duck_seen_ns[d->id]);
		char *addr = addrs[2 * DP_MAX_NICS + i];
		inet_ntop(AF_INET, &d->addr.sin_addr, addr, INET_ADDRSTRLEN);
		ducks[i] = (struct dp_ctl_duck_info){
			.id = d->id,
			.nic = w->cfg.nics[d->nic].name,
			.address = addr,
			.port = ntohs(d->addr.sin_port),
			.alive = seen && now - seen < 3ull * w->cfg.ping_ms * 1000000ull,
		};
	}
	PACK(c, topology, .req_id = p->rid, .nics = nics, .nics_len = w->cfg.nnics,
	     .ducks = ducks, .ducks_len = w->cfg.nducks);
	send_to(c, p->id, p->idlen);
}

/* Layers a peer may see: its own and shared ones; all of them for the admin. */
static bool layer_visible(const struct dp_layer *l, const struct dp_peer *p,
			  const struct dp_client *me)
{
	return l && l != DP_LAYER_GONE && (p->admin || l->shared || (me && l->owner == me->id));
}

static void on_layers(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	uint32_t n = 0, nfailed = 0;
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	(void)r;
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		const struct dp_layer *l = c->w->layers[i];
		if (!layer_visible(l, p, me))
			continue;
		for (uint32_t k = 0; k < l->nducks; k++)
			c->layer_ducks[n][k] = l->ducks[k];
		/* acquire: failed_ducks was written before failed */
		bool failed = dp_load_acquire_u32(&l->failed);
		uint32_t nmissing = 0, *missing = NULL;
		if (failed && nfailed < FAILED_LAYERS_LISTED) {
			missing = c->layer_missing[nfailed++];
			for (uint32_t k = 0; k < l->nducks; k++) {
				uint32_t d = l->ducks[k];
				if (__atomic_load_n(&l->failed_ducks[d >> 6], __ATOMIC_RELAXED) >> (d & 63) & 1)
					missing[nmissing++] = d;
			}
		}
		c->layer_infos[n] = (struct dp_ctl_layer_info){
			.layer = l->id,
			.kind = l->kind,
			.dtype = l->dtype,
			.hidden = l->hidden,
			.ffn = l->ffn,
			.ducks = c->layer_ducks[n],
			.ducks_len = l->nducks,
			.shard_sizes = l->shard,
			.shard_sizes_len = l->nducks,
			.has_b_down = l->has_b_down,
			.ready = dp_load_acquire_u32(&l->ready),
			.failed = failed,
			.missing = missing,
			.missing_len = nmissing,
		};
		n++;
	}
	PACK(c, layers, .req_id = p->rid, .layers = c->layer_infos, .layers_len = n);
	send_to(c, p->id, p->idlen);
}

/* Refuse a load onto ducks the dataplane knows are unreachable (silent for the last 3
 * pings; since start for one never heard from), before a byte is sent: else the load
 * waits weight_timeout_ms and fails anyway. 1 when it refused. */
static int refuse_unreachable(struct dp_control *c, const struct dp_peer *p,
			      const struct dp_ctl_load_weights *m)
{
	struct dp_world *w = c->w;
	uint64_t now = dp_now_ns(), window = 3ull * w->cfg.ping_ms * 1000000ull;
	char list[96];
	size_t used = 0;
	uint32_t dead = 0;
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		uint32_t d = m->ducks[i];
		if (d >= DP_MAX_DUCKS || w->duck_index[d] < 0)
			continue; /* not in the topology: refused below, with its own message */
		uint64_t seen = dp_load_relaxed_u64(&w->duck_seen_ns[d]);
		uint64_t since = seen > c->started_ns ? seen : c->started_ns;
		if (now < since || now - since < window)
			continue;
		if (used < sizeof(list) - 12) {
			int k = snprintf(list + used, sizeof(list) - used, "%s%u", dead ? ", " : "", d);
			used += k > 0 ? (size_t)k : 0;
		} else if (used < sizeof(list) - 6) {
			int k = snprintf(list + used, sizeof(list) - used, ", ...");
			used += k > 0 ? (size_t)k : 0;
		}
		dead++;
	}
	if (!dead)
		return 0;
	refuse(c, p, DP_ERROR_CODE_DUCKS_UNREACHABLE,
	       "ducks [%s] did not answer the dataplane's last 3 pings: nothing was sent; start "
	       "them, or load the layer onto ducks that answer (ducks=[...])",
	       list);
	return 1;
}

static void on_load_weights(struct dp_control *c, const struct dp_peer *p,
			    const struct dp_ctl_request *r)
{
	struct dp_world *w = c->w;
	const struct dp_config *cfg = &w->cfg;
	const struct dp_ctl_load_weights *m = &r->u.load_weights;
	struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	if (!me) {
		refuse(c, p, DP_ERROR_CODE_NOT_ATTACHED, "LoadWeights needs an attached client");
		return;
	}
	if (m->shared && !p->admin) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		       "a shared layer needs the admin role (the dataplane's user)");
		return;
	}
	/* every bound before any allocation: hidden 2^32-1 once reserved two 16 GiB buffers */
	if (m->hidden > cfg->max_hidden || m->ffn > cfg->max_ffn) {
		refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		       "hidden %u / ffn %u exceed this dataplane's max_hidden %u / max_ffn %u",
		       m->hidden, m->ffn, cfg->max_hidden, cfg->max_ffn);
		return;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < m->shard_sizes_len; i++)
		total += m->shard_sizes[i];
	if (m->ducks_len != m->shard_sizes_len || total != m->ffn) {
		refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		       "LoadWeights needs one shard size per duck, summing to ffn");
		return;
	}
	if (refuse_unreachable(c, p, m))
		return;
	int old = dp_layer_slot(w, m->layer);
	const struct dp_layer *prev = old >= 0 ? w->layers[old] : NULL;
	if (prev && prev->owner != me->id) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "layer %u belongs to another client",
		       m->layer);
		return;
	}
	uint64_t bytes = dp_layer_plan_bytes(m);
	uint32_t nlayers = me->nlayers - (prev != NULL);
	uint64_t held = me->weight_bytes - (prev ? prev->weight_bytes : 0);
	if (nlayers + 1 > cfg->client_max_layers || bytes > cfg->client_max_weight_bytes - held ||
	    held > cfg->client_max_weight_bytes) {
		dp_count(c->counters, DP_C_quota_refused, 1);
		refuse(c, p, DP_ERROR_CODE_QUOTA_EXCEEDED,
		       "layer %u (%lu bytes) would pass this client's quota: %u of %u layers, "
		       "%lu of %lu weight bytes held; unload layers first",
		       m->layer, (unsigned long)bytes, nlayers, cfg->client_max_layers,
		       (unsigned long)held, (unsigned long)cfg->client_max_weight_bytes);
		return;
	}
	int slot = old;
	for (uint32_t i = 0; i < DP_LAYER_TABLE && slot < 0; i++) {
		uint32_t k = dp_layer_hash(m->layer, i);
		if (!w->layers[k] || w->layers[k] == DP_LAYER_GONE)
			slot = (int)k;
	}
	if (slot < 0) {
		refuse(c, p, DP_ERROR_CODE_TOO_MANY_LAYERS, "the layer table is full");
		return;
	}
	struct dp_layer *l = calloc(1, sizeof(*l));
	if (!l) {
		refuse(c, p, DP_ERROR_CODE_DATAPLANE_ERROR, "out of memory");
		return;
	}
	memset(l->index, 0xff, sizeof(l->index));
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		uint32_t duck = m->ducks[i];
		if (w->duck_index[duck] < 0 || l->index[duck] >= 0) {
			free(l);
			refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
			       "duck %u is not in the topology or is listed twice", duck);
			return;
		}
		l->ducks[i] = (uint16_t)duck;
		l->shard[i] = m->shard_sizes[i];
		l->index[duck] = (int16_t)i;
	}
	l->id = m->layer;
	l->owner = me->id;
	l->shared = m->shared;
	l->weight_bytes = bytes;
	l->kind = (uint8_t)m->kind;
	l->dtype = (uint8_t)m->dtype;
	l->hidden = m->hidden;
	l->ffn = m->ffn;
	l->nducks = m->ducks_len;
	l->has_b_down = m->has_b_down;
	if (m->has_b_down) {
		l->b_down_raw = calloc(m->hidden, 4);
		l->b_down = calloc(m->hidden, sizeof(float));
		if (!l->b_down_raw || !l->b_down) {
			dp_layer_free(l);
			refuse(c, p, DP_ERROR_CODE_DATAPLANE_ERROR, "out of memory");
			return;
		}
	}
	if (prev)
		dp_layer_unpublish(c->w, (uint32_t)slot, &c->retired); /* forwards in flight keep the old one */
	/* release: the dispatcher that finds the layer sees it whole */
	dp_store_release_ptr((void **)&w->layers[slot], l);
	me->nlayers++;
	me->weight_bytes += bytes;
	reply_ack(c, p->id, p->idlen, p->rid);
}

static void on_unload_layer(struct dp_control *c, const struct dp_peer *p,
			    const struct dp_ctl_request *r)
{
	const struct dp_ctl_unload_layer *m = &r->u.unload_layer;
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	int slot = dp_layer_slot(c->w, m->layer);
	if (slot < 0) {
		refuse(c, p, DP_ERROR_CODE_UNKNOWN_LAYER, "layer %u is not loaded", m->layer);
		return;
	}
	if (!p->admin && (!me || c->w->layers[slot]->owner != me->id)) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "layer %u belongs to another client",
		       m->layer);
		return;
	}
	dp_layer_unpublish(c->w, (uint32_t)slot, &c->retired);
	reply_ack(c, p->id, p->idlen, p->rid);
}

static void on_set_epoch(struct dp_control *c, const struct dp_peer *p,
			 const struct dp_ctl_request *r)
{
	const struct dp_ctl_set_epoch *m = &r->u.set_epoch;
	if (!p->admin) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "SetEpoch needs the admin role");
		return;
	}
	uint64_t now = dp_load_acquire_u64(&c->w->epoch);
	uint64_t next = m->has_epoch ? m->epoch : now + 1;
	if (next == now) {
		refuse(c, p, DP_ERROR_CODE_BAD_REQUEST, "already in epoch %lu", (unsigned long)now);
		return;
	}
	dp_store_release_u64(&c->w->epoch, next);
	PACK(c, epoch_changed, .req_id = p->rid, .epoch = next);
	send_to(c, p->id, p->idlen);
}

static void on_stats(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	struct dp_world *w = c->w;
	uint64_t sum[DP_NCOUNTERS] = { 0 };
	const struct dp_counters *all[DP_MAX_NICS + 2];
	uint32_t nall = 0;
	(void)r;
	all[nall++] = &w->control_counters;
	all[nall++] = &w->dispatch_counters;
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		all[nall++] = &w->workers[k]->counters;
	for (uint32_t a = 0; a < nall; a++)
		for (uint32_t i = 0; i < DP_NCOUNTERS; i++)
			sum[i] += dp_load_relaxed_u64(&all[a]->v[i]);
	for (uint32_t k = 0; k < w->nwakers; k++) { /* each runner writes its own */
		sum[DP_C_parks] += dp_load_relaxed_u64(&w->wakers[k]->parks);
		sum[DP_C_kicks] += dp_load_relaxed_u64(&w->wakers[k]->kicked);
	}
	sum[DP_C_connections_shed] = dp_accept_guard_shed(); /* libzmq's I/O thread */
	struct dp_ctl_client_stats clients[DP_MAX_CLIENTS];
	uint32_t n = 0;
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *cl = &w->clients[i];
		if (dp_load_acquire_u32(&cl->state) != DP_CLIENT_ACTIVE)
			continue;
		/* where another client's segment is, and who it is, is the admin's business */
		bool shown = p->admin || cl == me;
		clients[n++] = (struct dp_ctl_client_stats){
			.client_id = cl->id,
			.pid = shown ? cl->pid : 0,
			.name = shown ? cl->name : "",
			.segment = shown ? cl->path : "",
			.submitted = dp_load_relaxed_u64(&cl->submitted),
			.completed = cl->completed,
		};
	}
	/* each NIC's port counters (DPDK xstats; none for socket and null), read here on
	 * the control thread as DPDK's telemetry does: dp_backend_xstats keeps the read
	 * out of the port's close. Static: one control thread, and 36 KiB off its stack. */
	static struct dp_xstat xs[DP_MAX_NICS][DP_MAX_XSTATS];
	static const char *xkeys[DP_MAX_NICS][DP_MAX_XSTATS];
	static uint64_t xvals[DP_MAX_NICS][DP_MAX_XSTATS];
	struct dp_ctl_nic_stats nics[DP_MAX_NICS];
	for (uint32_t k = 0; k < w->cfg.nnics; k++) {
		uint64_t left_out = 0;
		uint32_t nx = dp_backend_xstats(&w->workers[k]->be, xs[k], DP_MAX_XSTATS, &left_out);
		for (uint32_t i = 0; i < nx; i++) {
			xkeys[k][i] = xs[k][i].name;
			xvals[k][i] = xs[k][i].value;
		}
		nics[k] = (struct dp_ctl_nic_stats){ .name = w->cfg.nics[k].name,
						     .backend = w->cfg.nics[k].backend,
						     .xstats_keys = xkeys[k],
						     .xstats_values = xvals[k],
						     .xstats_len = nx,
						     .xstats_left_out = left_out };
	}
	PACK(c, stats, .req_id = p->rid, .mode = w->cfg.nics[0].backend,
	     .epoch = dp_load_acquire_u64(&w->epoch), .counters_keys = dp_counter_names,
	     .counters_values = sum, .counters_len = DP_NCOUNTERS, .clients = clients,
	     .clients_len = n, .nics = nics, .nics_len = w->cfg.nnics);
	send_to(c, p->id, p->idlen);
}

static void on_set_faults(struct dp_control *c, const struct dp_peer *p,
			  const struct dp_ctl_request *r)
{
	(void)r;
	if (!p->admin) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "SetFaults needs the admin role");
		return;
	}
	refuse(c, p, DP_ERROR_CODE_UNSUPPORTED,
	       "fault knobs live in the duck emulator here: duckpipe ducks --drop, --delay-us, "
	       "--stop-after, --restart-after");
}

static void on_shutdown(struct dp_control *c, const struct dp_peer *p,
			const struct dp_ctl_request *r)
{
	(void)r;
	if (!p->admin) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "Shutdown needs the admin role");
		return;
	}
	DP_INFO("shutdown asked by pid %u", p->pid);
	reply_ack(c, p->id, p->idlen, p->rid);
	dp_world_stop(c->w);
}

/* The generated decoder names the type; this table names its handler. */
static const dp_ctl_handler handlers[DP_CTL_NTYPES] = {
	[DP_CTL_ATTACH] = on_attach,
	[DP_CTL_DETACH] = on_detach,
	[DP_CTL_HEARTBEAT] = on_heartbeat,
	[DP_CTL_GET_TOPOLOGY] = on_topology,
	[DP_CTL_GET_LAYERS] = on_layers,
	[DP_CTL_LOAD_WEIGHTS] = on_load_weights,
	[DP_CTL_UNLOAD_LAYER] = on_unload_layer,
	[DP_CTL_SET_EPOCH] = on_set_epoch,
	[DP_CTL_GET_STATS] = on_stats,
	[DP_CTL_SET_FAULTS] = on_set_faults,
	[DP_CTL_SHUTDOWN] = on_shutdown,
};

static void handle(struct dp_control *c, struct dp_peer *p, const char *data, size_t len)
{
	char why[256];
	if (c->access.ipc && !p->creds) {
		/* libzmq gives every ipc peer's SO_PEERCRED; without it we cannot tell who asks */
		dp_count(c->counters, DP_C_control_refused, 1);
		reply_error(c, p->id, p->idlen, 0, DP_ERROR_CODE_NO_CREDENTIALS,
			    "the sender's credentials could not be read");
		return;
	}
	if (c->access.ipc && p->uid != c->access.euid && !c->access.has_group) {
		/* the socket filter admits only our user; this is the second fence */
		dp_count(c->counters, DP_C_control_refused, 1);
		return;
	}
	p->admin = p->creds && p->uid == c->access.euid;
	int rc = dp_ctl_decode(data, len, &c->req, why, sizeof(why));
	p->rid = c->req.req_id;
	if (rc != 0) {
		dp_count(c->counters, DP_C_bad_control_messages, 1);
		reply_error(c, p->id, p->idlen, p->rid, (enum dp_error_code)rc, why);
		return;
	}
	handlers[c->req.type](c, p, &c->req);
}

static int poll_control(struct dp_control *c)
{
	int n = 0;
	uint8_t id[256];
	while (n < MAX_MESSAGES_PER_LOOP) {
		int idlen = zmq_recv(c->router, id, sizeof(id), ZMQ_DONTWAIT);
		if (idlen < 0)
			break;
		int more;
		size_t sz = sizeof(more);
		zmq_getsockopt(c->router, ZMQ_RCVMORE, &more, &sz);
		if (!more) {
			dp_count(c->counters, DP_C_bad_control_messages, 1);
			continue;
		}
		zmq_msg_t msg;
		zmq_msg_init(&msg);
		int len = zmq_msg_recv(&msg, c->router, ZMQ_DONTWAIT);
		/* drain any further frames: a request is exactly identity + one payload */
		bool extra = false;
		zmq_getsockopt(c->router, ZMQ_RCVMORE, &more, &sz);
		while (more) {
			char junk[64];
			extra = true;
			(void)zmq_recv(c->router, junk, sizeof(junk), ZMQ_DONTWAIT);
			zmq_getsockopt(c->router, ZMQ_RCVMORE, &more, &sz);
		}
		n++;
		dp_count(c->counters, DP_C_control_messages, 1);
		if (len < 0 || extra || idlen > (int)sizeof(id)) {
			dp_count(c->counters, DP_C_bad_control_messages, 1);
			zmq_msg_close(&msg);
			continue;
		}
		struct dp_peer peer = { .id = id, .idlen = (size_t)idlen };
		peer.creds = dp_peer_credentials(c->w->cfg.control,
						 zmq_msg_gets(&msg, "Peer-Address"), &peer.uid,
						 &peer.gid, &peer.pid);
		handle(c, &peer, zmq_msg_data(&msg), zmq_msg_size(&msg));
		zmq_msg_close(&msg);
	}
	return n;
}

/* --- connections ------------------------------------------------------------------------ */

/* Count the router's connections from its monitor and close the ones past max_connections
 * as soon as they are accepted. libzmq 4.3 aborts the whole process when accept() fails
 * with EMFILE, so the number of connections anyone can hold must stay far below the fd
 * limit (checked at start, dp_main.c). zmq_unbind cannot pause accepting: it also drops
 * every connection accepted on the endpoint, attached clients' included. */
static int poll_monitor(struct dp_control *c)
{
	int work = 0;
	const uint32_t max = c->w->cfg.max_connections;
	for (;;) {
		uint8_t ev[6];
		int n = zmq_recv(c->monitor, ev, sizeof(ev), ZMQ_DONTWAIT);
		if (n < 0)
			break;
		int more = 0;
		size_t sz = sizeof(more);
		zmq_getsockopt(c->monitor, ZMQ_RCVMORE, &more, &sz);
		while (more) { /* the endpoint's address: not needed */
			char junk[64];
			(void)zmq_recv(c->monitor, junk, sizeof(junk), 0);
			zmq_getsockopt(c->monitor, ZMQ_RCVMORE, &more, &sz);
		}
		work++;
		if (n != 6)
			continue;
		uint16_t event;
		int32_t fd;
		memcpy(&event, ev, 2);
		memcpy(&fd, ev + 2, 4);
		if (event == ZMQ_EVENT_ACCEPTED) {
			c->connections++;
			if (c->connections > max) {
				/* libzmq owns the fd: shutdown, never close, makes its engine see the
				 * end of the stream and close it (DISCONNECTED then counts it off).
				 * Had libzmq closed it already, the number could name a connection
				 * accepted since, normally past the limit too; a ZeroMQ peer whose
				 * connection is closed reconnects by itself. */
				shutdown(fd, SHUT_RDWR);
				dp_count(c->counters, DP_C_connections_refused, 1);
				if (!c->over_limit)
					DP_WARN("%u control connections: max_connections is %u; closing "
						"new ones until fewer than %u are open",
						c->connections - 1, max, max - max / 10);
				c->over_limit = true;
			}
		} else if (event == ZMQ_EVENT_DISCONNECTED && c->connections > 0) {
			c->connections--;
			if (c->over_limit && c->connections < max - max / 10) {
				DP_INFO("%u control connections: accepting again", c->connections);
				c->over_limit = false;
			}
		}
	}
	return work;
}

/* --- housekeeping ---------------------------------------------------------------------- */

static void housekeeping(struct dp_control *c, uint64_t now)
{
	struct dp_world *w = c->w;
	uint64_t stale = (uint64_t)w->cfg.client_timeout_ms * 1000000ull;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&cl->state);
		if (state == DP_CLIENT_ACTIVE) {
			dp_store_relaxed_u64(&cl->hdr->dataplane_heartbeat_ns, now);
			uint64_t beat = dp_load_relaxed_u64(&cl->hdr->client_heartbeat_ns);
			if (!dp_process_alive(cl->pid, cl->start_ticks) || (beat < now && now - beat > stale)) {
				DP_WARN("client %u (pid %u) is gone; reclaiming %s", cl->id, cl->pid,
					cl->path);
				cl->dead = true;
				dp_store_release_u32(&cl->state, DP_CLIENT_CLOSING);
			}
		} else if (state == DP_CLIENT_QUIESCED &&
			   __atomic_load_n(&cl->inflight, __ATOMIC_ACQUIRE) == 0) {
			/* a memfd needs no unlink: its memory goes with the last mapping, which
			 * attach_steps takes away a step at a time */
			if (cl->mem.registered)
				dp_count(c->counters, DP_C_extmem_unregistered, 1);
			cl->stepped = 0;
			dp_store_release_u32(&cl->state, DP_CLIENT_UNMAPPING);
		}
	}
}

static void housekeeping_layers(struct dp_control *c)
{
	dp_count(c->counters, DP_C_layers_freed, dp_layers_free_retired(c->w, &c->retired, false));
}

/* A parked dispatcher makes no passes: wake it when a client waits for it to let go
 * (CLOSING) or a retired layer for its next pass (dp_layers_free_retired). */
static void nudge_dispatcher(struct dp_control *c)
{
	bool waits = c->retired != NULL;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && !waits; i++)
		waits = dp_load_acquire_u32(&c->w->clients[i].state) == DP_CLIENT_CLOSING;
	if (waits)
		dp_waker_kick(c->w->dispatch_waker);
}

int dp_control_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_control *c = self;
	(void)w;
	uint64_t refused = c->access.refused;
	int work = dp_access_serve_zap(&c->access);
	dp_count(c->counters, DP_C_curve_refused, c->access.refused - refused);
	work += poll_monitor(c);
	work += poll_control(c);
	work += drain_completions(c);
	work += attach_steps(c);
	if (c->noutbox && dp_now_ns() >= outbox_due(c)) {
		flush_outbox(c);
		work++;
	}
	if (now >= c->next_house) {
		housekeeping(c, now);
		housekeeping_layers(c);
		nudge_dispatcher(c);
		c->next_house = now + HOUSEKEEPING_NS;
	}
	if (now >= c->next_stats) { /* parked, it ticks with housekeeping instead */
		dp_stats_tick(c->stats, now);
		c->next_stats = now + DP_STATS_TICK_NS;
	}
	return work;
}

/* --- parking ------------------------------------------------------------------------- */

/* ZeroMQ's fd only says "look": ZMQ_EVENTS says whether a message waits (and re-arms
 * the fd), so it is asked before every park (zmq_getsockopt(3), ZMQ_FD). */
static bool zmq_readable(void *s)
{
	int ev = 0;
	size_t sz = sizeof(ev);
	return s && zmq_getsockopt(s, ZMQ_EVENTS, &ev, &sz) == 0 && (ev & ZMQ_POLLIN);
}

static int add_zmq_fd(struct dp_waker *wk, void *s)
{
	int fd;
	size_t sz = sizeof(fd);
	if (!s)
		return 0;
	if (zmq_getsockopt(s, ZMQ_FD, &fd, &sz) < 0) {
		dp_set_error("ZMQ_FD: %s", zmq_strerror(errno));
		return -1;
	}
	return dp_waker_add(wk, fd);
}

int dp_control_wait_on(struct dp_world *w, void *self, struct dp_waker *wk)
{
	struct dp_control *c = self;
	(void)w;
	if (add_zmq_fd(wk, c->router) < 0 || add_zmq_fd(wk, c->monitor) < 0 ||
	    add_zmq_fd(wk, c->access.zap) < 0)
		return -1;
	return 0;
}

static uint32_t attached_clients(struct dp_world *w)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		n += dp_load_acquire_u32(&w->clients[i].state) != DP_CLIENT_FREE;
	return n;
}

int64_t dp_control_park(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_control *c = self;
	if (!dp_spsc_empty(&w->dispatch_done))
		return -1;
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		if (!dp_spsc_empty(&w->workers[k]->done))
			return -1;
	if (zmq_readable(c->router) || zmq_readable(c->monitor) || zmq_readable(c->access.zap))
		return -1;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) { /* a segment half faulted in or unmapped */
		uint32_t state = dp_load_acquire_u32(&w->clients[i].state);
		if (state == DP_CLIENT_ATTACHING || state == DP_CLIENT_UNMAPPING)
			return -1;
	}
	/* a connection flood: libzmq aborts the process on EMFILE, so while more connections
	 * are open than clients attached (and a few tools), every accepted one past the limit
	 * must be shut down as soon as it is seen, not after a wake-up: a parked control
	 * agent lost that race to libzmq's accepting I/O thread under load in CI */
	if (c->over_limit || c->connections > attached_clients(c->w) + FLOOD_SLACK)
		return -1;
	uint64_t next = outbox_due(c) < c->next_house ? outbox_due(c) : c->next_house;
	return next > now ? (int64_t)(next - now) : 0;
}

/* Is a dataplane already answering at this endpoint? */
static bool someone_answers(void *zctx, const char *endpoint)
{
	void *s = zmq_socket(zctx, ZMQ_DEALER);
	int zero = 0;
	bool yes = false;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_connect(s, endpoint) == 0) {
		static const char ping[] = "\x82\xa4type\xa8GetStats\xa6req_id\x01";
		zmq_send(s, ping, sizeof(ping) - 1, 0);
		zmq_pollitem_t item = { .socket = s, .events = ZMQ_POLLIN };
		yes = zmq_poll(&item, 1, 300) == 1;
	}
	zmq_close(s);
	return yes;
}

struct dp_control *dp_control_new(struct dp_world *w)
{
	struct dp_control *c = calloc(1, sizeof(*c));
	if (!c) {
		dp_set_error("out of memory");
		return NULL;
	}
	c->w = w;
	c->counters = &w->control_counters;
	c->layer_infos = calloc(DP_LAYER_TABLE, sizeof(*c->layer_infos));
	c->layer_ducks = calloc(DP_LAYER_TABLE, sizeof(*c->layer_ducks));
	c->layer_missing = calloc(FAILED_LAYERS_LISTED, sizeof(*c->layer_missing));
	c->outbox_buf = malloc(OUTBOX_BYTES);
	c->started_ns = dp_now_ns();
	if (!c->layer_infos || !c->layer_ducks || !c->layer_missing || !c->outbox_buf) {
		free(c->layer_infos);
		free(c->layer_ducks);
	free(c->layer_missing);
		free(c->outbox_buf);
		free(c);
		dp_set_error("out of memory");
		return NULL;
	}
	c->next_client_id = 1;
	msgpack_sbuffer_init(&c->sbuf);
	msgpack_packer_init(&c->pk, &c->sbuf, msgpack_sbuffer_write);
	c->zctx = zmq_ctx_new();
	const char *ep = w->cfg.control;
	if (!strncmp(ep, "ipc://", 6) && access(ep + 6, F_OK) == 0) {
		if (someone_answers(c->zctx, ep)) {
			dp_set_error("a dataplane is already running at %s; stop it (duckpipe shutdown) "
				     "or choose another control address", ep);
			goto fail;
		}
		unlink(ep + 6); /* left behind by a dataplane that died */
	}
	for (int t = 0; t < DP_CTL_NTYPES; t++)
		if (!handlers[t]) {
			dp_set_error("control message %s has no handler", dp_ctl_type_names[t]);
			goto fail;
		}
	c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
	int zero = 0;
	/* a longer message disconnects its sender before libzmq buffers it */
	int64_t maxmsg = DP_MAX_MESSAGE_BYTES;
	int handshake = HANDSHAKE_IVL_MS, sndhwm = ROUTER_SNDHWM;
	zmq_setsockopt(c->router, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	zmq_setsockopt(c->router, ZMQ_HANDSHAKE_IVL, &handshake, sizeof(handshake));
	zmq_setsockopt(c->router, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm));
	/* before bind: every accepted connection is counted */
	if (zmq_socket_monitor(c->router, MONITOR_ENDPOINT,
			       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) < 0) {
		dp_set_error("cannot monitor the control socket: %s", zmq_strerror(errno));
		goto fail;
	}
	c->monitor = zmq_socket(c->zctx, ZMQ_PAIR);
	zmq_setsockopt(c->monitor, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_connect(c->monitor, MONITOR_ENDPOINT) < 0) {
		dp_set_error("cannot read the control socket's monitor: %s", zmq_strerror(errno));
		goto fail;
	}
	if (dp_access_setup(&c->access, &w->cfg, c->zctx, c->router) < 0)
		goto fail;
	/* the socket's mode is the first fence: created 0600 (umask), opened to the group after */
	mode_t old = umask(0077);
	int rc = zmq_bind(c->router, ep);
	umask(old);
	if (rc < 0) {
		dp_set_error("cannot listen on %s: %s; is the address in use?", ep,
			     zmq_strerror(errno));
		goto fail;
	}
	/* created 0700 under that umask; a socket needs no x bit */
	if (c->access.ipc && !c->access.has_group && chmod(ep + 6, 0600) < 0) {
		dp_set_error("cannot chmod %s: %s", ep + 6, strerror(errno));
		goto fail;
	}
	if (c->access.ipc && c->access.has_group &&
	    (chown(ep + 6, (uid_t)-1, (gid_t)c->access.group_gid) < 0 || chmod(ep + 6, 0660) < 0)) {
		dp_set_error("cannot give %s to group %s: %s", ep + 6, w->cfg.control_group,
			     strerror(errno));
		goto fail;
	}
	const struct dp_counters *nic_counters[DP_MAX_NICS];
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		nic_counters[k] = &w->workers[k]->counters;
	c->stats = dp_stats_open(w, nic_counters);
	if (!c->stats)
		goto fail;
	DP_INFO("stats segment %s", dp_stats_file(c->stats));
	return c;
fail:
	dp_access_close(&c->access);
	if (c->monitor)
		zmq_close(c->monitor);
	if (c->router) {
		zmq_socket_monitor(c->router, NULL, 0);
		zmq_close(c->router);
	}
	zmq_ctx_term(c->zctx);
	msgpack_sbuffer_destroy(&c->sbuf);
	free(c->layer_infos);
	free(c->layer_ducks);
	free(c->layer_missing);
	free(c->outbox_buf);
	free(c);
	return NULL;
}

void dp_control_free(struct dp_control *c)
{
	if (!c)
		return;
	flush_outbox(c); /* the last completions still go out */
	dp_stats_close(c->stats);
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		if (c->w->clients[i].base)
			dp_client_unmap(&c->w->clients[i]); /* live clients own their segments */
	zmq_socket_monitor(c->router, NULL, 0);
	zmq_close(c->monitor);
	zmq_close(c->router);
	dp_access_close(&c->access);
	zmq_ctx_term(c->zctx);
	if (!strncmp(c->w->cfg.control, "ipc://", 6))
		unlink(c->w->cfg.control + 6);
	/* every agent has stopped: nothing holds a layer any more */
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++)
		if (c->w->layers[i] && c->w->layers[i] != DP_LAYER_GONE)
			dp_layer_free(c->w->layers[i]);
	dp_layers_free_retired(c->w, &c->retired, true);
	msgpack_sbuffer_destroy(&c->sbuf);
	free(c->layer_infos);
	free(c->layer_ducks);
	free(c->layer_missing);
	free(c->outbox_buf);
	free(c);
}
