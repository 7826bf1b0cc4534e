/* dp_control.c: the control agent.
 *
 * One ZeroMQ ROUTER carries the control protocol of duckpipe/schema/control.py
 * (msgpack maps whose "type" names the message): attach and detach, topology,
 * layers, weight-load plans, epochs, stats, shutdown. It also sends every
 * completion the other agents queue, heartbeats into every attached segment,
 * and reclaims the segments of clients that died.
 */
#include "dp_control.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "dp_client.h"
#include "dp_ctl_gen.h"
#include "dp_mp.h"
#include "dp_reduce.h"
#include "dp_worker.h"

#define HOUSEKEEPING_NS 50000000ull /* 50 ms */
#define MAX_MESSAGES_PER_LOOP 64
#define MAX_CURVE_CLIENTS 256

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
	/* who may talk: the dataplane's own user (admin), members of control_group (clients),
	 * and over tcp:// the CURVE keys of curve_clients_file (clients) */
	uint32_t euid;
	bool ipc;                       /* the endpoint is ipc://: peers have uid, gid, pid */
	bool has_group;
	uint32_t group_gid;
	void *zap;                      /* ZAP handler (REP) when CURVE is on */
	uint8_t curve_clients[MAX_CURVE_CLIENTS][32];
	uint32_t ncurve_clients;
	struct dp_layer *retired;       /* unpublished layers, freed once nobody can hold them */
};

struct dp_layer dp_layer_tombstone;

const char *const dp_counter_names[DP_NCOUNTERS] = {
#define DP_COUNTER_NAME(name) #name,
	DP_COUNTER_LIST(DP_COUNTER_NAME)
#undef DP_COUNTER_NAME
};

/* --- replies ----------------------------------------------------------------------- */

static void begin(struct dp_control *c, const char *type, uint32_t fields)
{
	msgpack_sbuffer_clear(&c->sbuf);
	msgpack_pack_map(&c->pk, fields + 1);
	dp_mp_kv_str(&c->pk, "type", type);
}

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
	begin(c, "Error", 3);
	dp_mp_kv_u64(&c->pk, "req_id", req_id);
	dp_mp_kv_u64(&c->pk, "code", code);
	dp_mp_kv_str(&c->pk, "message", message);
	send_to(c, id, idlen);
}

static void reply_ack(struct dp_control *c, const uint8_t *id, size_t idlen, uint64_t req_id)
{
	begin(c, "Ack", 1);
	dp_mp_kv_u64(&c->pk, "req_id", req_id);
	send_to(c, id, idlen);
}

/* --- completions ---------------------------------------------------------------------- */

static void send_completion(struct dp_control *c, struct dp_fwd *f)
{
	struct dp_world *w = c->w;
	struct dp_client *cl = f->client;
	uint32_t answered, missing;
	dp_fwd_counts(w, f, &answered, &missing);
	uint64_t send = 0, wait = 0, fetch = 0, first = UINT64_MAX, last = 0;
	for (uint32_t n = 0; n < DP_MAX_NICS; n++)
		if (f->nic_mask & (1u << n) && f->kind == DP_FWD_FORWARD) {
			const struct dp_nic_part *p = &f->part[n];
			send = p->send_ns > send ? p->send_ns : send;
			wait = p->wait_ns > wait ? p->wait_ns : wait;
			fetch += p->fetch_ns;
			if (p->first_ns && p->first_ns < first)
				first = p->first_ns;
			if (p->last_ns > last)
				last = p->last_ns;
		}
	begin(c, "Completion", 10);
	dp_mp_kv_u64(&c->pk, "forward_id", f->desc.forward_id);
	dp_mp_kv_u64(&c->pk, "slot", f->desc.slot);
	dp_mp_kv_u64(&c->pk, "generation", f->desc.generation);
	dp_mp_kv_u64(&c->pk, "epoch", f->desc.epoch);
	dp_mp_kv_u64(&c->pk, "status", f->status);
	dp_mp_key(&c->pk, "answered");
	msgpack_pack_array(&c->pk, answered);
	for (uint32_t d = 0; d < 256 && f->kind == DP_FWD_FORWARD; d++)
		if (dp_targets_has(f->targets, d) && f->rx[w->duck_index[d]].state == 1)
			msgpack_pack_uint32(&c->pk, d);
	dp_mp_key(&c->pk, "missing");
	msgpack_pack_array(&c->pk, missing);
	for (uint32_t d = 0; d < 256 && f->kind == DP_FWD_FORWARD; d++)
		if (dp_targets_has(f->targets, d) && f->rx[w->duck_index[d]].state != 1)
			msgpack_pack_uint32(&c->pk, d);
	dp_mp_key(&c->pk, "timings");
	msgpack_pack_map(&c->pk, 7);
	uint64_t submit = f->desc.submit_ns;
	dp_mp_kv_u64(&c->pk, "prepare_ns", submit && submit < f->pickup_ns ? f->pickup_ns - submit : 0);
	dp_mp_kv_u64(&c->pk, "send_ns", send);
	dp_mp_kv_u64(&c->pk, "wait_ns", wait);
	dp_mp_kv_u64(&c->pk, "fetch_ns", fetch);
	dp_mp_kv_u64(&c->pk, "reduce_ns", f->reduce_ns);
	dp_mp_kv_u64(&c->pk, "spread_ns", last > first && first != UINT64_MAX ? last - first : 0);
	dp_mp_key(&c->pk, "duck_compute_ns");
	msgpack_pack_array(&c->pk, answered);
	for (uint32_t d = 0; d < 256 && f->kind == DP_FWD_FORWARD; d++)
		if (dp_targets_has(f->targets, d) && f->rx[w->duck_index[d]].state == 1)
			msgpack_pack_uint64(&c->pk, f->rx[w->duck_index[d]].compute_ns);
	if (!f->message[0] && f->status == DP_STATUS_TIMEOUT)
		snprintf(f->message, sizeof(f->message), "no complete partial within the deadline");
	dp_mp_kv_str(&c->pk, "message", f->message);
	dp_mp_kv_u64(&c->pk, "current_epoch", dp_load_acquire_u64(&w->epoch));
	send_to(c, cl->identity, cl->identity_len);
	if (f->layer) {
		dp_layer_put(f->layer); /* taken by the dispatcher */
		f->layer = NULL;
	}
	dp_count(c->counters, DP_C_completions_sent, 1);
	dp_store_relaxed_u64(&cl->completed, cl->completed + 1);
	dp_fetch_add_u64(&cl->inflight, -1);
	dp_spsc_push(&w->free_ring, (void **)&f, 1);
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

/* "...:uid:gid:pid", the tail libzmq appends to an ipc peer's Peer-Address (SO_PEERCRED). */
static bool parse_peer_address(const char *pa, uint32_t *uid, uint32_t *gid, uint32_t *pid)
{
	unsigned long v[3];
	const char *end = pa ? pa + strlen(pa) : NULL;
	if (!pa)
		return false;
	for (int k = 2; k >= 0; k--) {
		const char *colon = end;
		while (colon > pa && colon[-1] != ':')
			colon--;
		if (colon == pa || colon == end)
			return false;
		char num[16];
		size_t n = (size_t)(end - colon);
		if (n >= sizeof(num))
			return false;
		memcpy(num, colon, n);
		num[n] = '\0';
		for (size_t i = 0; i < n; i++)
			if (!isdigit((unsigned char)num[i]))
				return false;
		v[k] = strtoul(num, NULL, 10);
		if (v[k] > UINT32_MAX)
			return false;
		end = colon - 1;
	}
	*uid = (uint32_t)v[0];
	*gid = (uint32_t)v[1];
	*pid = (uint32_t)v[2];
	return true;
}

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
		if (cl->state == DP_CLIENT_ACTIVE && cl->identity_len == len &&
		    !memcmp(cl->identity, id, len))
			return cl;
	}
	return NULL;
}

/* --- layers: owned, counted, unpublished, then freed ---------------------------------- */

static void layer_free(struct dp_layer *l)
{
	free(l->b_down_raw);
	free(l->b_down);
	free(l);
}

/* Take the layer in table slot i out of the table; it is freed later (free_retired). */
static void layer_unpublish(struct dp_control *c, uint32_t slot)
{
	struct dp_world *w = c->w;
	struct dp_layer *l = w->layers[slot];
	dp_store_release_ptr((void **)&w->layers[slot], DP_LAYER_GONE);
	/* seq_cst: the dispatcher's pass that ends after this read cannot have missed the store */
	l->retired_pass = __atomic_load_n(&w->dispatch_passes, __ATOMIC_SEQ_CST);
	l->next_retired = c->retired;
	c->retired = l;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		struct dp_client *cl = &w->clients[i];
		if (cl->state != DP_CLIENT_FREE && cl->id == l->owner) {
			cl->nlayers--;
			cl->weight_bytes -= l->weight_bytes;
		}
	}
}

/* Free the unpublished layers no forward holds and no dispatcher pass can still see. */
static void free_retired(struct dp_control *c, bool all)
{
	uint64_t passes = __atomic_load_n(&c->w->dispatch_passes, __ATOMIC_ACQUIRE);
	for (struct dp_layer **pl = &c->retired; *pl;) {
		struct dp_layer *l = *pl;
		if (all || (passes > l->retired_pass &&
			    __atomic_load_n(&l->refs, __ATOMIC_ACQUIRE) == 0)) {
			*pl = l->next_retired;
			layer_free(l);
			dp_count(c->counters, DP_C_layers_freed, 1);
		} else {
			pl = &l->next_retired;
		}
	}
}

/* The table slot holding layer id, or -1. */
static int layer_slot(struct dp_world *w, uint32_t id)
{
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		uint32_t k = dp_layer_hash(id, i);
		struct dp_layer *l = w->layers[k];
		if (!l)
			return -1;
		if (l != DP_LAYER_GONE && l->id == id)
			return (int)k;
	}
	return -1;
}

/* Every layer client id owned goes (it detached or died). */
static void unload_layers_of(struct dp_control *c, uint32_t owner)
{
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		struct dp_layer *l = c->w->layers[i];
		if (l && l != DP_LAYER_GONE && l->owner == owner)
			layer_unpublish(c, i);
	}
}

/* Bytes a layer plan stands for: every duck's shards and b_down (raw and float);
 * UINT64_MAX when that does not fit (a config may raise max_hidden and max_ffn to 2^32). */
static uint64_t plan_bytes(const struct dp_ctl_load_weights *m)
{
	uint64_t item = m->dtype == DP_DTYPE_F16 ? 2 : 4, h = m->hidden, total = 0, hf, t;
	for (uint32_t i = 0; i < m->shard_sizes_len; i++) {
		uint64_t f = m->shard_sizes[i];
		uint64_t mats = m->kind == DP_MLP_KIND_GELU ? 2 : 3; /* b_up: f more for GELU */
		if (__builtin_mul_overflow(h, f, &hf) || __builtin_mul_overflow(hf, mats, &t) ||
		    __builtin_add_overflow(t, m->kind == DP_MLP_KIND_GELU ? f : 0, &t) ||
		    __builtin_mul_overflow(t, item, &t) || __builtin_add_overflow(total, t, &total))
			return UINT64_MAX;
	}
	return m->has_b_down && __builtin_add_overflow(total, h * 8, &total) ? UINT64_MAX : total;
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
	if (dp_client_map(cl, m->segment, p->pid) < 0) {
		refuse(c, p, DP_ERROR_CODE_BAD_SEGMENT, "%s", dp_error());
		return;
	}
	cl->id = c->next_client_id++;
	cl->uid = p->uid;
	memcpy(cl->identity, p->id, p->idlen);
	cl->identity_len = p->idlen;
	snprintf(cl->name, sizeof(cl->name), "%s", m->name);
	cl->hdr->dataplane_pid = (uint32_t)getpid();
	cl->hdr->client_id = cl->id;
	dp_store_relaxed_u64(&cl->hdr->dataplane_heartbeat_ns, dp_now_ns());
	/* release: the dispatcher that sees ACTIVE sees the mapping */
	dp_store_release_u32(&cl->state, DP_CLIENT_ACTIVE);
	dp_count(c->counters, DP_C_clients_attached, 1);
	DP_INFO("client %u (pid %u uid %u, %s) attached %s", cl->id, p->pid, p->uid, m->name,
		m->segment);
	begin(c, "Attached", 9);
	dp_mp_kv_u64(&c->pk, "req_id", p->rid);
	dp_mp_kv_u64(&c->pk, "client_id", cl->id);
	dp_mp_kv_u64(&c->pk, "epoch", dp_load_acquire_u64(&c->w->epoch));
	dp_mp_kv_u64(&c->pk, "session", c->w->session);
	dp_mp_kv_u64(&c->pk, "dataplane_pid", (uint64_t)getpid());
	dp_mp_kv_str(&c->pk, "mode", c->w->cfg.nics[0].backend);
	dp_mp_kv_u64(&c->pk, "ducks", c->w->cfg.nducks);
	dp_mp_kv_u64(&c->pk, "default_timeout_us", c->w->cfg.default_timeout_us);
	dp_mp_kv_u64(&c->pk, "max_forward_bytes", c->w->cfg.max_forward_bytes);
	send_to(c, p->id, p->idlen);
}

static void on_detach(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	(void)r;
	struct dp_client *cl = client_by_identity(c, p->id, p->idlen);
	if (cl) {
		unload_layers_of(c, cl->id); /* now: its layer ids are free for the next client */
		dp_store_release_u32(&cl->state, DP_CLIENT_CLOSING);
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
	char addr[INET_ADDRSTRLEN];
	uint64_t now = dp_now_ns();
	(void)r;
	begin(c, "Topology", 3);
	dp_mp_kv_u64(&c->pk, "req_id", p->rid);
	dp_mp_key(&c->pk, "nics");
	msgpack_pack_array(&c->pk, w->cfg.nnics);
	for (uint32_t n = 0; n < w->cfg.nnics; n++) {
		const struct dp_nic_cfg *nic = &w->cfg.nics[n];
		msgpack_pack_map(&c->pk, 4);
		dp_mp_kv_str(&c->pk, "name", nic->name);
		dp_mp_kv_str(&c->pk, "backend", nic->backend);
		inet_ntop(AF_INET, &nic->host.sin_addr, addr, sizeof(addr));
		dp_mp_kv_str(&c->pk, "address", addr);
		if (nic->use_broadcast)
			inet_ntop(AF_INET, &nic->broadcast.sin_addr, addr, sizeof(addr));
		dp_mp_kv_str(&c->pk, "broadcast", nic->use_broadcast ? addr : "");
	}
	dp_mp_key(&c->pk, "ducks");
	msgpack_pack_array(&c->pk, w->cfg.nducks);
	for (uint32_t i = 0; i < w->cfg.nducks; i++) {
		const struct dp_duck_cfg *d = &w->cfg.ducks[i];
		uint64_t seen = dp_load_relaxed_u64(&w->duck_seen_ns[d->id]);
		msgpack_pack_map(&c->pk, 5);
		dp_mp_kv_u64(&c->pk, "id", d->id);
		dp_mp_kv_str(&c->pk, "nic", w->cfg.nics[d->nic].name);
		inet_ntop(AF_INET, &d->addr.sin_addr, addr, sizeof(addr));
		dp_mp_kv_str(&c->pk, "address", addr);
		dp_mp_kv_u64(&c->pk, "port", ntohs(d->addr.sin_port));
		dp_mp_kv_bool(&c->pk, "alive",
			      seen && now - seen < 3ull * w->cfg.ping_ms * 1000000ull);
	}
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
	uint32_t n = 0;
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	(void)r;
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++)
		n += layer_visible(c->w->layers[i], p, me);
	begin(c, "Layers", 2);
	dp_mp_kv_u64(&c->pk, "req_id", p->rid);
	dp_mp_key(&c->pk, "layers");
	msgpack_pack_array(&c->pk, n);
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		const struct dp_layer *l = c->w->layers[i];
		if (!layer_visible(l, p, me))
			continue;
		msgpack_pack_map(&c->pk, 9);
		dp_mp_kv_u64(&c->pk, "layer", l->id);
		dp_mp_kv_u64(&c->pk, "kind", l->kind);
		dp_mp_kv_u64(&c->pk, "dtype", l->dtype);
		dp_mp_kv_u64(&c->pk, "hidden", l->hidden);
		dp_mp_kv_u64(&c->pk, "ffn", l->ffn);
		dp_mp_key(&c->pk, "ducks");
		msgpack_pack_array(&c->pk, l->nducks);
		for (uint32_t k = 0; k < l->nducks; k++)
			msgpack_pack_uint32(&c->pk, l->ducks[k]);
		dp_mp_key(&c->pk, "shard_sizes");
		msgpack_pack_array(&c->pk, l->nducks);
		for (uint32_t k = 0; k < l->nducks; k++)
			msgpack_pack_uint32(&c->pk, l->shard[k]);
		dp_mp_kv_bool(&c->pk, "has_b_down", l->has_b_down);
		dp_mp_kv_bool(&c->pk, "ready", dp_load_acquire_u32(&l->ready));
	}
	send_to(c, p->id, p->idlen);
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
	int old = layer_slot(w, m->layer);
	const struct dp_layer *prev = old >= 0 ? w->layers[old] : NULL;
	if (prev && prev->owner != me->id) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "layer %u belongs to another client",
		       m->layer);
		return;
	}
	uint64_t bytes = plan_bytes(m);
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
			layer_free(l);
			refuse(c, p, DP_ERROR_CODE_DATAPLANE_ERROR, "out of memory");
			return;
		}
	}
	if (prev)
		layer_unpublish(c, (uint32_t)slot); /* forwards in flight keep the old one */
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
	int slot = layer_slot(c->w, m->layer);
	if (slot < 0) {
		refuse(c, p, DP_ERROR_CODE_UNKNOWN_LAYER, "layer %u is not loaded", m->layer);
		return;
	}
	if (!p->admin && (!me || c->w->layers[slot]->owner != me->id)) {
		refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "layer %u belongs to another client",
		       m->layer);
		return;
	}
	layer_unpublish(c, (uint32_t)slot);
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
	begin(c, "EpochChanged", 2);
	dp_mp_kv_u64(&c->pk, "req_id", p->rid);
	dp_mp_kv_u64(&c->pk, "epoch", next);
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
	uint32_t nclients = 0;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		nclients += w->clients[i].state == DP_CLIENT_ACTIVE;
	begin(c, "Stats", 5);
	dp_mp_kv_u64(&c->pk, "req_id", p->rid);
	dp_mp_kv_str(&c->pk, "mode", w->cfg.nics[0].backend);
	dp_mp_kv_u64(&c->pk, "epoch", dp_load_acquire_u64(&w->epoch));
	dp_mp_key(&c->pk, "counters");
	msgpack_pack_map(&c->pk, DP_NCOUNTERS);
	for (uint32_t i = 0; i < DP_NCOUNTERS; i++)
		dp_mp_kv_u64(&c->pk, dp_counter_names[i], sum[i]);
	dp_mp_key(&c->pk, "clients");
	msgpack_pack_array(&c->pk, nclients);
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *cl = &w->clients[i];
		if (cl->state != DP_CLIENT_ACTIVE)
			continue;
		/* where another client's segment is, and who it is, is the admin's business */
		bool shown = p->admin || cl == me;
		msgpack_pack_map(&c->pk, 6);
		dp_mp_kv_u64(&c->pk, "client_id", cl->id);
		dp_mp_kv_u64(&c->pk, "pid", shown ? cl->pid : 0);
		dp_mp_kv_str(&c->pk, "name", shown ? cl->name : "");
		dp_mp_kv_str(&c->pk, "segment", shown ? cl->path : "");
		dp_mp_kv_u64(&c->pk, "submitted", dp_load_relaxed_u64(&cl->submitted));
		dp_mp_kv_u64(&c->pk, "completed", cl->completed);
	}
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
	dp_store_release_u32(&c->w->running, 0);
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
	if (c->ipc && !p->creds) {
		/* libzmq gives every ipc peer's SO_PEERCRED; without it we cannot tell who asks */
		dp_count(c->counters, DP_C_control_refused, 1);
		reply_error(c, p->id, p->idlen, 0, DP_ERROR_CODE_NO_CREDENTIALS,
			    "the sender's credentials could not be read");
		return;
	}
	if (c->ipc && p->uid != c->euid && !c->has_group) {
		/* the socket filter admits only our user; this is the second fence */
		dp_count(c->counters, DP_C_control_refused, 1);
		return;
	}
	p->admin = p->creds && p->uid == c->euid;
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
		peer.creds = parse_peer_address(zmq_msg_gets(&msg, "Peer-Address"), &peer.uid,
						&peer.gid, &peer.pid);
		handle(c, &peer, zmq_msg_data(&msg), zmq_msg_size(&msg));
		zmq_msg_close(&msg);
	}
	return n;
}

static int serve_zap(struct dp_control *c);

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
			if (!dp_process_alive(cl->pid, cl->start_ns) || (beat < now && now - beat > stale)) {
				DP_WARN("client %u (pid %u) is gone; reclaiming %s", cl->id, cl->pid,
					cl->path);
				cl->dead = true;
				dp_store_release_u32(&cl->state, DP_CLIENT_CLOSING);
			}
		} else if (state == DP_CLIENT_QUIESCED &&
			   __atomic_load_n(&cl->inflight, __ATOMIC_ACQUIRE) == 0) {
			dp_client_unmap(cl);
			unload_layers_of(c, cl->id); /* its layers go with it */
			if (cl->dead) {
				unlink(cl->path);
				dp_count(c->counters, DP_C_clients_reclaimed, 1);
			}
			dp_store_release_u32(&cl->state, DP_CLIENT_FREE);
		}
	}
}

static void housekeeping_layers(struct dp_control *c)
{
	free_retired(c, false);
}

int dp_control_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_control *c = self;
	(void)w;
	int work = serve_zap(c);
	work += poll_control(c);
	work += drain_completions(c);
	if (now >= c->next_house) {
		housekeeping(c, now);
		housekeeping_layers(c);
		c->next_house = now + HOUSEKEEPING_NS;
	}
	return work;
}

/* --- access: socket filters, CURVE and its ZAP handler ------------------------------------ */

/* Answer the ZAP requests libzmq makes for each CURVE handshake (RFC 27): admit the
 * public keys of curve_clients_file, refuse the rest. Runs in the control agent's loop. */
static int serve_zap(struct dp_control *c)
{
	int work = 0;
	while (c->zap) {
		char frames[8][64];
		int sizes[8], nf = 0, more = 1;
		size_t sz = sizeof(more);
		int len = zmq_recv(c->zap, frames[0], sizeof(frames[0]), ZMQ_DONTWAIT);
		if (len < 0)
			break;
		sizes[nf++] = len;
		zmq_getsockopt(c->zap, ZMQ_RCVMORE, &more, &sz);
		while (more) {
			char junk[64];
			char *dst = nf < 8 ? frames[nf] : junk;
			len = zmq_recv(c->zap, dst, 64, 0);
			if (nf < 8)
				sizes[nf++] = len;
			zmq_getsockopt(c->zap, ZMQ_RCVMORE, &more, &sz);
		}
		work++;
		/* version, request id, domain, address, routing id, mechanism, key */
		bool ok = false;
		if (nf >= 7 && sizes[5] == 5 && !memcmp(frames[5], "CURVE", 5) && sizes[6] == 32)
			for (uint32_t k = 0; k < c->ncurve_clients && !ok; k++)
				ok = !memcmp(c->curve_clients[k], frames[6], 32);
		if (!ok) {
			dp_count(c->counters, DP_C_curve_refused, 1);
			DP_WARN("refused a CURVE client whose key is not in %s",
				c->w->cfg.curve_clients_file);
		}
		int idlen = nf >= 2 && sizes[1] >= 0 && sizes[1] <= 64 ? sizes[1] : 0;
		zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
		zmq_send(c->zap, frames[1], (size_t)idlen, ZMQ_SNDMORE);
		zmq_send(c->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
		zmq_send(c->zap, ok ? "OK" : "unknown key", ok ? 2 : 11, ZMQ_SNDMORE);
		zmq_send(c->zap, "", 0, ZMQ_SNDMORE); /* user id */
		zmq_send(c->zap, "", 0, 0);           /* metadata */
	}
	return work;
}

/* One z85 key (40 characters) from a file, decoded. */
static int read_key(const char *path, uint8_t key[32])
{
	char text[128];
	FILE *f = fopen(path, "r");
	if (!f) {
		dp_set_error("cannot read CURVE key %s: %s", path, strerror(errno));
		return -1;
	}
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	while (n && isspace((unsigned char)text[n - 1]))
		n--;
	text[n] = '\0';
	if (n != 40 || !zmq_z85_decode(key, text)) {
		dp_set_error("%s does not hold one z85 CURVE key (40 characters)", path);
		return -1;
	}
	return 0;
}

static int setup_curve(struct dp_control *c)
{
	const struct dp_config *cfg = &c->w->cfg;
	uint8_t secret[32], public[32];
	if (!cfg->curve_secret_key_file[0] || !cfg->curve_public_key_file[0] ||
	    !cfg->curve_clients_file[0]) {
		dp_set_error("tcp:// control needs CURVE: set curve_secret_key_file, "
			     "curve_public_key_file and curve_clients_file (or use ipc://)");
		return -1;
	}
	if (!zmq_has("curve")) {
		dp_set_error("this libzmq has no CURVE support; tcp:// control cannot be secured");
		return -1;
	}
	if (read_key(cfg->curve_secret_key_file, secret) < 0 ||
	    read_key(cfg->curve_public_key_file, public) < 0)
		return -1;
	FILE *f = fopen(cfg->curve_clients_file, "r");
	if (!f) {
		dp_set_error("cannot read %s: %s", cfg->curve_clients_file, strerror(errno));
		return -1;
	}
	char line[256];
	uint32_t lineno = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		size_t n = strlen(line);
		while (n && isspace((unsigned char)line[n - 1]))
			line[--n] = '\0';
		if (n == 0 || line[0] == '#')
			continue;
		if (n != 40 || c->ncurve_clients == MAX_CURVE_CLIENTS ||
		    !zmq_z85_decode(c->curve_clients[c->ncurve_clients], line)) {
			fclose(f);
			dp_set_error("%s line %u: not a z85 public key (or more than %d keys)",
				     cfg->curve_clients_file, lineno, MAX_CURVE_CLIENTS);
			return -1;
		}
		c->ncurve_clients++;
	}
	fclose(f);
	/* the handler must be bound before the first handshake can ask it */
	c->zap = zmq_socket(c->zctx, ZMQ_REP);
	int zero = 0, one = 1;
	zmq_setsockopt(c->zap, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_bind(c->zap, "inproc://zeromq.zap.01") < 0) {
		dp_set_error("cannot bind the ZAP handler: %s", zmq_strerror(errno));
		return -1;
	}
	if (zmq_setsockopt(c->router, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(c->router, ZMQ_CURVE_SECRETKEY, secret, 32) < 0 ||
	    zmq_setsockopt(c->router, ZMQ_CURVE_PUBLICKEY, public, 32) < 0 ||
	    zmq_setsockopt(c->router, ZMQ_ZAP_DOMAIN, "duckpipe", 8) < 0) {
		dp_set_error("cannot make the control socket a CURVE server: %s",
			     zmq_strerror(errno));
		return -1;
	}
	memset(secret, 0, sizeof(secret));
	return 0;
}

/* Before bind: who may connect. ipc:// admits our user (and control_group) by SO_PEERCRED;
 * tcp:// admits the CURVE keys listed; nothing else is served. */
static int setup_access(struct dp_control *c)
{
	const struct dp_config *cfg = &c->w->cfg;
	c->euid = (uint32_t)geteuid();
	if (cfg->control_group[0]) {
		struct group *g = getgrnam(cfg->control_group);
		if (!g) {
			dp_set_error("control_group '%s' is not a group here", cfg->control_group);
			return -1;
		}
		c->has_group = true;
		c->group_gid = (uint32_t)g->gr_gid;
	}
	if (!strncmp(cfg->control, "ipc://", 6)) {
		c->ipc = true;
		int uid = (int)c->euid;
		if (zmq_setsockopt(c->router, ZMQ_IPC_FILTER_UID, &uid, sizeof(uid)) < 0) {
			dp_set_error("ZMQ_IPC_FILTER_UID: %s", zmq_strerror(errno));
			return -1;
		}
		if (c->has_group) {
			int gid = (int)c->group_gid;
			if (zmq_setsockopt(c->router, ZMQ_IPC_FILTER_GID, &gid, sizeof(gid)) < 0) {
				dp_set_error("ZMQ_IPC_FILTER_GID: %s", zmq_strerror(errno));
				return -1;
			}
		}
		return 0;
	}
	if (!strncmp(cfg->control, "tcp://", 6))
		return setup_curve(c);
	dp_set_error("control endpoint %s: only ipc:// (or tcp:// with CURVE keys) is served",
		     cfg->control);
	return -1;
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
	zmq_setsockopt(c->router, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	if (setup_access(c) < 0)
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
	if (c->ipc && !c->has_group && chmod(ep + 6, 0600) < 0) {
		dp_set_error("cannot chmod %s: %s", ep + 6, strerror(errno));
		goto fail;
	}
	if (c->ipc && c->has_group &&
	    (chown(ep + 6, (uid_t)-1, (gid_t)c->group_gid) < 0 || chmod(ep + 6, 0660) < 0)) {
		dp_set_error("cannot give %s to group %s: %s", ep + 6, w->cfg.control_group,
			     strerror(errno));
		goto fail;
	}
	return c;
fail:
	if (c->zap)
		zmq_close(c->zap);
	if (c->router)
		zmq_close(c->router);
	zmq_ctx_term(c->zctx);
	msgpack_sbuffer_destroy(&c->sbuf);
	free(c);
	return NULL;
}

void dp_control_free(struct dp_control *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		if (c->w->clients[i].base)
			dp_client_unmap(&c->w->clients[i]); /* live clients own their segments */
	zmq_close(c->router);
	if (c->zap)
		zmq_close(c->zap);
	zmq_ctx_term(c->zctx);
	if (!strncmp(c->w->cfg.control, "ipc://", 6))
		unlink(c->w->cfg.control + 6);
	/* every agent has stopped: nothing holds a layer any more */
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++)
		if (c->w->layers[i] && c->w->layers[i] != DP_LAYER_GONE)
			layer_free(c->w->layers[i]);
	free_retired(c, true);
	msgpack_sbuffer_destroy(&c->sbuf);
	free(c);
}
