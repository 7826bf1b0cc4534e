/* dp_control_requests.c: the control protocol's requests (duckpipe/schema/control.py:
 * msgpack maps whose "type" names the message), read off the ZeroMQ ROUTER, decoded by
 * the generated dp_ctl_gen.c and answered by one handler each: attach and detach,
 * topology, layers and weight-load plans, epochs, stats, faults, shutdown. Every handler
 * checks the sender's role first (dp_access.c: the admin is the dataplane's own user).
 * Called by the control agent's do_work (dp_control.c); an Attach is answered later, by
 * dp_control_attach_steps (dp_control_housekeeping.c), once the segment is faulted in.
 */
#include "dp_control_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "dp_accept_guard.h"
#include "dp_backend.h"
#include "dp_client.h"
#include "dp_layers.h"
#include "dp_waker.h"
#include "dp_worker.h"

#define MAX_MESSAGES_PER_LOOP 64

typedef void (*dp_ctl_handler)(struct dp_control *c, const struct dp_peer *p,
			       const struct dp_ctl_request *r);

static void reply_ack(struct dp_control *c, const uint8_t *id, size_t idlen, uint64_t req_id)
{
	PACK(c, ack, .req_id = req_id);
	dp_control_send_to(c, id, idlen);
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

/* The client table as this Attach sees it (dp_attach_admit's rules). A slot being let go
 * still counts for its user: it is not free yet. */
static void attach_census(const struct dp_control *c, const struct dp_peer *p,
			  struct dp_attach_census *out)
{
	*out = (struct dp_attach_census){ .pid = p->pid, .uid = p->uid, .admin = p->admin };
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *o = &c->w->clients[i];
		uint32_t state = dp_load_acquire_u32(&o->state);
		if (state == DP_CLIENT_FREE)
			continue;
		out->taken++;
		out->of_pid += (state == DP_CLIENT_ACTIVE || state == DP_CLIENT_ATTACHING) &&
			       o->pid == p->pid;
		out->of_uid += o->uid == p->uid;
		out->not_admin += o->uid != c->access.euid;
	}
}

/* True when p may not take a client slot (refused and counted). */
static bool may_not_attach(struct dp_control *c, const struct dp_peer *p)
{
	const struct dp_config *cfg = &c->w->cfg;
	const struct dp_attach_limits lim = {
		.client_max_per_pid = cfg->client_max_per_pid,
		.client_max_per_uid = cfg->client_max_per_uid,
		.admin_reserved_clients = cfg->admin_reserved_clients,
	};
	struct dp_attach_census census;
	char why[DP_CTL_WHY_LEN];
	bool quota;
	attach_census(c, p, &census);
	int code = dp_attach_admit(&census, &lim, &quota, why, sizeof(why));
	if (!code)
		return false;
	if (quota)
		dp_count(c->counters, DP_C_quota_refused, 1);
	dp_control_refuse(c, p, (enum dp_error_code)code, "%s", why);
	return true;
}

static void on_attach(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	const struct dp_ctl_attach *m = &r->u.attach;
	if (m->protocol != DP_PROTOCOL_VERSION || m->abi_major != DP_ABI_MAJOR) {
		dp_control_refuse(c, p, DP_ERROR_CODE_ABI_MISMATCH,
		                  "client speaks protocol %u / ABI %u, this dataplane %d / %d",
		                  m->protocol, m->abi_major, DP_PROTOCOL_VERSION, DP_ABI_MAJOR);
		return;
	}
	if (!p->creds) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "shared memory needs a local peer: "
		                  "attach over ipc://, not tcp://");
		return;
	}
	if (m->pid != p->pid) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_SEGMENT,
		                  "Attach.pid %u is not the sender's pid %u: attach your own segment",
		                  m->pid, p->pid);
		return;
	}
	if (p->idlen > sizeof(c->w->clients[0].identity)) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST, "ZeroMQ identity too long");
		return;
	}
	if (client_by_identity(c, p->id, p->idlen)) {
		dp_control_refuse(c, p, DP_ERROR_CODE_ALREADY_ATTACHED, "this socket is attached");
		return;
	}
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *o = &c->w->clients[i];
		if (dp_load_acquire_u32(&o->state) == DP_CLIENT_ATTACHING &&
		    o->identity_len == p->idlen &&
		    !memcmp(o->identity, p->id, p->idlen)) {
			dp_control_refuse(c, p, DP_ERROR_CODE_ALREADY_ATTACHED,
			                  "this socket is attaching");
			return;
		}
	}
	if (may_not_attach(c, p))
		return;
	struct dp_client *cl = NULL;
	for (uint32_t i = 0; i < DP_MAX_CLIENTS && !cl; i++)
		if (dp_load_acquire_u32(&c->w->clients[i].state) == DP_CLIENT_FREE)
			cl = &c->w->clients[i];
	if (!cl) { /* may_not_attach counted the slots: only this thread takes one */
		dp_control_refuse(c, p, DP_ERROR_CODE_TOO_MANY_CLIENTS,
		                  "every client slot is taken");
		return;
	}
	/* the process that connected, from the connection: its pid may be another
	 * process's by now (the connection handed on, the connector gone) */
	int pidfd = dp_peer_pidfd(p->srcfd, p->uid, p->gid, p->pid);
	if (pidfd < 0) {
		dp_count(c->counters, DP_C_peers_gone, 1);
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED, "%s", dp_error());
		return;
	}
	memset(cl, 0, sizeof(*cl));
	cl->doorbell_fd = -1;
	/* the segment and doorbell are taken from that process, never by the message's pid */
	int rc = dp_client_map(cl, pidfd, p->pid, p->uid, m->segment_fd);
	if (rc == 0 && dp_client_open_doorbell(cl, pidfd, p->pid, p->uid, m->doorbell_fd) < 0) {
		dp_client_unmap(cl);
		rc = -1;
	}
	dp_close_untracked(pidfd);
	if (rc < 0) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_SEGMENT, "%s", dp_error());
		return;
	}
	cl->id = c->next_client_id++;
	cl->uid = p->uid;
	memcpy(cl->identity, p->id, p->idlen);
	cl->identity_len = p->idlen;
	snprintf(cl->name, sizeof(cl->name), "%s", m->name);
	cl->attach_rid = p->rid;
	cl->attach_ns = dp_now_ns();
	/* faulted in by dp_control_attach_steps, a step per pass, and answered when done */
	dp_store_release_u32(&cl->state, DP_CLIENT_ATTACHING);
	DP_DEBUG("client %u (pid %u uid %u, %s): attaching %s (%s), %zu bytes", cl->id, p->pid,
		 p->uid, m->name, m->segment, cl->path, cl->size);
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
	dp_control_send_to(c, p->id, p->idlen);
}

/* Layers a peer may see: its own and shared ones; all of them for the admin. */
static bool layer_visible(const struct dp_layer *l, const struct dp_peer *p,
			  const struct dp_client *me)
{
	return l && l != DP_LAYER_GONE && (p->admin || l->shared || (me && l->owner == me->id));
}

/* A MOE layer's placement in its LayerInfo: what a client that did not load it (a shared
 * layer) needs to route on it, flattened into words; the words it took. */
static size_t list_moe(struct dp_ctl_layer_info *info, const struct dp_layer *l, uint32_t *words)
{
	struct dp_moe_listing ls;
	dp_layer_moe_list(l, words, &ls);
	info->expert_ffn = l->moe->expert_ffn;
	info->expert_replicas = ls.replicas;
	info->expert_replicas_len = ls.n_experts;
	info->expert_ducks = ls.ducks;
	info->expert_ducks_len = ls.n_placed;
	info->shared_ducks = ls.shared;
	info->shared_ducks_len = ls.n_shared;
	info->shared_sets = ls.sets;
	info->shared_sets_len = ls.n_sets;
	return dp_layer_moe_list_words(l);
}

/* Words the placements of the MOE layers a Layers reply lists take (list_moe). */
static size_t moe_words(struct dp_control *c, const struct dp_peer *p, const struct dp_client *me)
{
	size_t words = 0;
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		const struct dp_layer *l = c->w->layers[i];
		if (layer_visible(l, p, me) && l->moe)
			words += dp_layer_moe_list_words(l);
	}
	return words;
}

static void on_layers(struct dp_control *c, const struct dp_peer *p, const struct dp_ctl_request *r)
{
	dp_control_settle_moves(c); /* a move committed shows its placement */
	uint32_t n = 0, nfailed = 0;
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	(void)r;
	/* the placements live only as long as this reply: the layers keep them in the form
	 * the workers read, and a layer's state stays what its owner is charged for */
	size_t nwords = moe_words(c, p, me), used = 0;
	uint32_t *words = nwords ? malloc(nwords * sizeof(*words)) : NULL;
	if (nwords && !words) {
		dp_control_reply_error(c, p->id, p->idlen, p->rid, DP_ERROR_CODE_DATAPLANE_ERROR,
				       "out of memory listing the layers' expert placements");
		return;
	}
	for (uint32_t i = 0; i < DP_LAYER_TABLE; i++) {
		const struct dp_layer *l = c->w->layers[i];
		if (!layer_visible(l, p, me))
			continue;
		for (uint32_t k = 0; k < l->nducks; k++)
			c->layer_ducks[n][k] = l->ducks[k];
		/* acquire: failed_ducks was written before failed */
		bool failed = dp_load_acquire_u32(&l->failed);
		uint32_t nmissing = 0, *missing = NULL, nlost = 0, *lost = NULL;
		if (failed && nfailed < FAILED_LAYERS_LISTED) {
			missing = c->layer_missing[nfailed++];
			for (uint32_t k = 0; k < l->nducks; k++) {
				uint32_t d = l->ducks[k];
				if (__atomic_load_n(&l->failed_ducks[d >> 6], __ATOMIC_RELAXED) >> (d & 63) & 1)
					missing[nmissing++] = d;
			}
		}
		/* ducks that said NO_LAYER since the commit (restarted): a committed layer is
		 * not ready on them. A failed layer never runs a forward, so one list from the
		 * same pool serves either. */
		for (uint32_t k = 0; k < l->nducks && !failed; k++) {
			uint32_t d = l->ducks[k];
			if (!(__atomic_load_n(&l->lost_ducks[d >> 6], __ATOMIC_RELAXED) >> (d & 63) & 1))
				continue;
			if (!lost && nfailed == FAILED_LAYERS_LISTED)
				break;
			if (!lost)
				lost = c->layer_missing[nfailed++];
			lost[nlost++] = d;
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
			.ready = dp_load_acquire_u32(&l->ready) && !nlost,
			.failed = failed,
			.missing = missing,
			.missing_len = nmissing,
			.lost = lost,
			.lost_len = nlost,
			.owner = l->owner,
			.shared = l->shared,
		};
		if (l->moe)
			used += list_moe(&c->layer_infos[n], l, words + used);
		n++;
	}
	PACK(c, layers, .req_id = p->rid, .layers = c->layer_infos, .layers_len = n);
	free(words);
	dp_control_send_to(c, p->id, p->idlen);
}

/* Refuse a load onto ducks the dataplane knows are unreachable (silent for the last 3
 * pings; since start for one never heard from), before a byte is sent: else the load
 * waits weight_timeout_ms and fails anyway. 1 when it refused. */
static int refuse_unreachable(struct dp_control *c, const struct dp_peer *p,
			      const uint32_t *ducks, uint32_t nducks)
{
	struct dp_world *w = c->w;
	uint64_t now = dp_now_ns(), window = 3ull * w->cfg.ping_ms * 1000000ull;
	char list[96];
	size_t used = 0;
	uint32_t dead = 0;
	for (uint32_t i = 0; i < nducks; i++) {
		uint32_t d = ducks[i];
		if (d >= DP_MAX_DUCKS || w->duck_index[d] < 0)
			continue; /* not in the topology: dp_load_check refused it already */
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
	dp_control_refuse(c, p, DP_ERROR_CODE_DUCKS_UNREACHABLE,
	                  "ducks [%s] did not answer the dataplane's last 3 pings: nothing was "
	                  "sent; start them, or load the layer onto ducks that answer "
	                  "(ducks=[...])", list);
	return 1;
}

/* Who may load this layer, and is the request whole, before anything is allocated. The
 * client, or NULL after a refusal; *old is the layer's slot if it is loaded already (a reload). */
static struct dp_client *check_load(struct dp_control *c, const struct dp_peer *p,
				    const struct dp_ctl_load_weights *m, int *old)
{
	struct dp_world *w = c->w;
	const struct dp_config *cfg = &w->cfg;
	struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	if (!me) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_ATTACHED,
		                  "LoadWeights needs an attached client");
		return NULL;
	}
	if (m->shared && !p->admin) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "a shared layer needs the admin role (the dataplane's user)");
		return NULL;
	}
	const struct dp_load_limits lim = { .max_hidden = cfg->max_hidden,
					    .max_ffn = cfg->max_ffn };
	char why[DP_CTL_WHY_LEN];
	int code = dp_load_check(m, &lim, w->duck_index, why, sizeof(why));
	if (code) {
		dp_control_refuse(c, p, (enum dp_error_code)code, "%s", why);
		return NULL;
	}
	if (refuse_unreachable(c, p, m->ducks, m->ducks_len))
		return NULL;
	*old = dp_layer_slot(w, m->layer);
	if (*old >= 0 && w->layers[*old]->owner != me->id) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "layer %u belongs to another client", m->layer);
		return NULL;
	}
	return me;
}

/* The client's quota (layers, weight bytes), counting what it holds after this load. The
 * layer this one replaces is retired, not counted (a reload at the quota works); those
 * retired before and not freed yet are: first free what nobody holds. 1 when it refused. */
static int refuse_over_quota(struct dp_control *c, const struct dp_peer *p,
			     const struct dp_ctl_load_weights *m, struct dp_client *me,
			     const struct dp_layer *prev, uint64_t bytes)
{
	struct dp_world *w = c->w;
	const struct dp_config *cfg = &w->cfg;
	if (me->retired_layers)
		dp_count(c->counters, DP_C_layers_freed, dp_layers_free_retired(w, &c->retired, false));
	const struct dp_load_holding held = {
		.nlayers = me->nlayers - (prev != NULL) + me->retired_layers,
		.bytes = me->weight_bytes - (prev ? prev->weight_bytes : 0) + me->retired_bytes,
		.retired = me->retired_layers,
		.max_layers = cfg->client_max_layers,
		.max_bytes = cfg->client_max_weight_bytes,
	};
	char why[DP_CTL_WHY_LEN];
	int code = dp_load_quota_check(m, &held, bytes, why, sizeof(why));
	if (!code)
		return 0;
	dp_count(c->counters, DP_C_quota_refused, 1);
	dp_control_refuse(c, p, (enum dp_error_code)code, "%s", why);
	return 1;
}

/* The layer's slot in the open-addressed table: its own on a reload, else the first free
 * or tombstoned one on its probe sequence; -1 when the table is full. */
static int layer_slot_for(const struct dp_world *w, uint32_t layer, int old)
{
	int slot = old;
	for (uint32_t i = 0; i < DP_LAYER_TABLE && slot < 0; i++) {
		uint32_t k = dp_layer_hash(layer, i);
		if (!w->layers[k] || w->layers[k] == DP_LAYER_GONE)
			slot = (int)k;
	}
	return slot;
}

/* The layer as the dispatcher and workers will read it (dp_layer_build), owned by me.
 * NULL after a refusal. */
static struct dp_layer *build_layer(struct dp_control *c, const struct dp_peer *p,
				    const struct dp_ctl_load_weights *m,
				    const struct dp_client *me, uint64_t bytes)
{
	char why[DP_CTL_WHY_LEN];
	int code;
	struct dp_layer *l = dp_layer_build(m, &code, why, sizeof(why));
	if (!l) {
		dp_control_refuse(c, p, (enum dp_error_code)code, "%s", why);
		return NULL;
	}
	l->owner = me->id;
	l->shared = m->shared;
	l->weight_bytes = bytes;
	return l;
}

static void on_load_weights(struct dp_control *c, const struct dp_peer *p,
			    const struct dp_ctl_request *r)
{
	struct dp_world *w = c->w;
	const struct dp_ctl_load_weights *m = &r->u.load_weights;
	int old = -1;
	struct dp_client *me = check_load(c, p, m, &old);
	if (!me)
		return;
	const struct dp_layer *prev = old >= 0 ? w->layers[old] : NULL;
	uint64_t bytes = dp_load_plan_bytes(m);
	if (refuse_over_quota(c, p, m, me, prev, bytes))
		return;
	int slot = layer_slot_for(w, m->layer, old);
	if (slot < 0) {
		dp_control_refuse(c, p, DP_ERROR_CODE_TOO_MANY_LAYERS, "the layer table is full");
		return;
	}
	struct dp_layer *l = build_layer(c, p, m, me, bytes);
	if (!l)
		return;
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
		dp_control_refuse(c, p, DP_ERROR_CODE_UNKNOWN_LAYER, "layer %u is not loaded",
		                  m->layer);
		return;
	}
	if (!p->admin && (!me || c->w->layers[slot]->owner != me->id)) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "layer %u belongs to another client", m->layer);
		return;
	}
	dp_layer_unpublish(c->w, (uint32_t)slot, &c->retired);
	reply_ack(c, p->id, p->idlen, p->rid);
}

/* The committed layer a RepairLayer may repair, each duck one of its own and lost: NULL
 * after a refusal. */
static struct dp_layer *check_repair(struct dp_control *c, const struct dp_peer *p,
				     const struct dp_ctl_repair_layer *m)
{
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	int slot = dp_layer_slot(c->w, m->layer);
	struct dp_layer *l = slot >= 0 ? c->w->layers[slot] : NULL;
	if (!me) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_ATTACHED,
		                  "RepairLayer needs an attached client");
	} else if (!l) {
		dp_control_refuse(c, p, DP_ERROR_CODE_UNKNOWN_LAYER, "layer %u is not loaded",
		                  m->layer);
	} else if (l->owner != me->id) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "layer %u belongs to another client: its owner repairs it",
		                  m->layer);
	} else if (dp_load_acquire_u32(&l->failed) || !dp_load_acquire_u32(&l->ready)) {
		/* its weights never all landed: there is no committed bank to restore */
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is %s: load it (LoadWeights), a repair restores only a "
		                  "committed layer's lost ducks", m->layer,
		                  dp_load_acquire_u32(&l->failed) ? "failed" : "still loading");
	} else if (dp_load_acquire_u32(&l->repairing)) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is being repaired already: commit that repair first",
		                  m->layer);
	} else if (l->moving) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is being moved to a new placement: repair it after the "
		                  "move's commit", m->layer);
	} else {
		uint64_t seen[DP_MAX_DUCKS / 64] = { 0 };
		for (uint32_t i = 0; i < m->ducks_len; i++) {
			uint32_t d = m->ducks[i]; /* < DP_MAX_DUCKS: the decoder's DuckId */
			const char *why = l->index[d] < 0 ? "is not one of its ducks"
					  : dp_targets_has(seen, d) ? "is named twice"
					  : !(__atomic_load_n(&l->lost_ducks[d >> 6], __ATOMIC_RELAXED) >>
					      (d & 63) & 1) ? "did not lose it (LayerInfo.lost)"
					  : NULL;
			if (why) {
				dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
				                  "layer %u: duck %u %s", m->layer, d, why);
				return NULL;
			}
			seen[d >> 6] |= 1ull << (d & 63);
		}
		return refuse_unreachable(c, p, m->ducks, m->ducks_len) ? NULL : l;
	}
	return NULL;
}

/* Open a repair: the ducks' books start over (nothing is in flight for a committed
 * layer's ducks with no repair open, and the dispatcher reads them only once it sees
 * repairing), each stamped with the repair's number, then repairing (release). */
static void on_repair_layer(struct dp_control *c, const struct dp_peer *p,
			    const struct dp_ctl_request *r)
{
	const struct dp_ctl_repair_layer *m = &r->u.repair_layer;
	dp_control_settle_moves(c); /* a committed move's layer is the one to repair */
	struct dp_layer *l = check_repair(c, p, m);
	if (!l)
		return;
	uint32_t n = l->repairs + 1;
	for (uint32_t k = 0; k < m->ducks_len; k++) {
		uint32_t d = m->ducks[k], i = (uint32_t)l->index[d];
		memset(l->next_offset[i], 0, sizeof(l->next_offset[i]));
		for (uint32_t t = 0; t < DP_SHARD_TENSORS; t++)
			__atomic_store_n(&l->acked[i][t], 0, __ATOMIC_RELAXED);
		l->announced[i] = 0; /* its LAYER goes out again first */
		__atomic_fetch_and(&l->failed_ducks[d >> 6], ~(1ull << (d & 63)), __ATOMIC_RELAXED);
		l->repair_ducks[d >> 6] |= 1ull << (d & 63);
		__atomic_store_n(&l->repaired_at[i], n, __ATOMIC_RELAXED);
	}
	/* release, both: a forward that sees the number sees the stamps; a dispatcher that
	 * sees repairing sees the books reset */
	__atomic_store_n(&l->repairs, n, __ATOMIC_RELEASE);
	dp_store_release_u32(&l->repairing, 1);
	reply_ack(c, p->id, p->idlen, p->rid);
}

static void on_set_epoch(struct dp_control *c, const struct dp_peer *p,
			 const struct dp_ctl_request *r)
{
	const struct dp_ctl_set_epoch *m = &r->u.set_epoch;
	if (!p->admin) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "SetEpoch needs the admin role");
		return;
	}
	uint64_t now = dp_load_acquire_u64(&c->w->epoch);
	uint64_t next = m->has_epoch ? m->epoch : now + 1;
	if (next == now) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST, "already in epoch %lu",
		                  (unsigned long)now);
		return;
	}
	dp_store_release_u64(&c->w->epoch, next);
	PACK(c, epoch_changed, .req_id = p->rid, .epoch = next);
	dp_control_send_to(c, p->id, p->idlen);
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
		sum[DP_C_parks_expecting] += dp_load_relaxed_u64(&w->wakers[k]->expecting);
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
	dp_control_send_to(c, p->id, p->idlen);
}

static void on_set_faults(struct dp_control *c, const struct dp_peer *p,
			  const struct dp_ctl_request *r)
{
	(void)r;
	if (!p->admin) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "SetFaults needs the admin role");
		return;
	}
	dp_control_refuse(c, p, DP_ERROR_CODE_UNSUPPORTED,
	                  "fault knobs live in the duck emulator here: duckpipe ducks --drop, "
	                  "--delay-us, --stop-after, --restart-after");
}

static void on_shutdown(struct dp_control *c, const struct dp_peer *p,
			const struct dp_ctl_request *r)
{
	(void)r;
	if (!p->admin) {
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "Shutdown needs the admin role");
		return;
	}
	DP_INFO("shutdown asked by pid %u", p->pid);
	reply_ack(c, p->id, p->idlen, p->rid);
	dp_world_stop(c->w);
}

/* The moves the control agent has open: settle those whose commit is in (dp_layer_settle_move:
 * the table takes the moved layer, or the failed one is dropped), before anything reads
 * the table for a client, and at each housekeeping tick. */
void dp_control_settle_moves(struct dp_control *c)
{
	if (!c->moves_open)
		return;
	uint32_t open = 0;
	for (uint32_t s = 0; s < DP_LAYER_TABLE; s++) {
		struct dp_layer *l = c->w->layers[s];
		if (l && l != DP_LAYER_GONE && l->moving)
			open += (uint32_t)dp_layer_settle_move(c->w, s, &c->retired);
	}
	c->moves_open = open;
}

/* The committed MOE layer a MoveLayer may move, as the mock refuses it: NULL after a
 * refusal. */
static struct dp_layer *check_move(struct dp_control *c, const struct dp_peer *p,
				   const struct dp_ctl_move_layer *m)
{
	const struct dp_client *me = client_by_identity(c, p->id, p->idlen);
	int slot = dp_layer_slot(c->w, m->layer);
	struct dp_layer *l = slot >= 0 ? c->w->layers[slot] : NULL;
	bool lost = false;
	for (uint32_t k = 0; l && k < DP_MAX_DUCKS / 64; k++)
		lost |= __atomic_load_n(&l->lost_ducks[k], __ATOMIC_RELAXED) != 0;
	if (!me)
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_ATTACHED,
		                  "MoveLayer needs an attached client");
	else if (!l)
		dp_control_refuse(c, p, DP_ERROR_CODE_UNKNOWN_LAYER, "layer %u is not loaded",
		                  m->layer);
	else if (l->owner != me->id)
		dp_control_refuse(c, p, DP_ERROR_CODE_NOT_PERMITTED,
		                  "layer %u belongs to another client: only its owner moves it "
		                  "to a new placement", m->layer);
	else if (!l->moe)
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is dense: a move places a MOE layer's experts anew",
		                  m->layer);
	else if (dp_load_acquire_u32(&l->failed) || !dp_load_acquire_u32(&l->ready))
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is %s: a move places a committed layer anew; load it "
		                  "(LoadWeights) with the placement instead", m->layer,
		                  dp_load_acquire_u32(&l->failed) ? "failed" : "still loading");
	else if (dp_load_acquire_u32(&l->repairing))
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is being repaired: a move waits for the repair's commit; "
		                  "move it after", m->layer);
	else if (l->moving)
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is being moved already: commit that move first",
		                  m->layer);
	else if (lost)
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u is lost on a duck: repair it (Client.repair) before "
		                  "moving it", m->layer);
	else
		return l;
	return NULL;
}

/* 1 when an older layer of this id is still retired: forwards on it may still need the
 * old banks that this move's new banks would free on the ducks (they keep two a layer). */
static int draining(const struct dp_control *c, uint32_t id)
{
	for (const struct dp_layer *r = c->retired; r; r = r->next_retired)
		if (r->id == id)
			return 1;
	return 0;
}

/* The LoadWeights that would load l with the move's placement: l's own fields, the new
 * placement and bank widths, its shared sets as its Layers reply lists them (set by set,
 * each in its ducks' order: dp_layer_moe_list). -1 when out of memory. */
static int move_request(const struct dp_layer *l, const struct dp_ctl_move_layer *m,
			struct dp_ctl_load_weights *out)
{
	uint32_t *words = malloc(dp_layer_moe_list_words(l) * sizeof(uint32_t));
	if (!words)
		return -1;
	struct dp_moe_listing ls;
	dp_layer_moe_list(l, words, &ls);
	memset(out, 0, sizeof(*out));
	out->shared_ducks_len = ls.n_shared;
	memcpy(out->shared_ducks, ls.shared, ls.n_shared * sizeof(uint32_t));
	out->shared_sets_len = ls.n_sets;
	memcpy(out->shared_sets, ls.sets, ls.n_sets * sizeof(uint32_t));
	free(words);
	out->layer = l->id;
	out->kind = l->kind;
	out->dtype = l->dtype;
	out->hidden = l->hidden;
	out->weight_dtype = l->weight_dtype;
	out->shared = l->shared;
	out->expert_ffn = l->moe->expert_ffn;
	out->ducks_len = l->nducks;
	for (uint32_t i = 0; i < l->nducks; i++)
		out->ducks[i] = l->ducks[i];
	out->shard_sizes_len = m->shard_sizes_len;
	for (uint32_t i = 0; i < m->shard_sizes_len; i++) {
		out->shard_sizes[i] = m->shard_sizes[i];
		out->ffn += m->shard_sizes[i]; /* each below 2^32, at most 256: no wrap in u64 */
	}
	out->expert_replicas_len = m->expert_replicas_len;
	memcpy(out->expert_replicas, m->expert_replicas, m->expert_replicas_len * sizeof(uint32_t));
	out->expert_ducks_len = m->expert_ducks_len;
	memcpy(out->expert_ducks, m->expert_ducks, m->expert_ducks_len * sizeof(uint32_t));
	return 0;
}

/* Whether duck d holds expert e under placement pl. */
static bool holds(const struct dp_routing_placement *pl, uint32_t e, uint32_t d)
{
	for (uint32_t r = 0; r < pl->replicas[e]; r++)
		if (pl->ducks[e * DP_MAX_REPLICAS + r] == d)
			return true;
	return false;
}

/* The ducks whose set of experts differs between l and n (bits into changed); -1 when
 * the move changes what it must keep (the expert count, a duck's shared columns). */
static int changed_ducks(const struct dp_layer *l, const struct dp_layer *n, uint64_t *changed)
{
	const struct dp_routing_placement *a = &l->moe->pl, *b = &n->moe->pl;
	if (a->n_experts != b->n_experts)
		return -1;
	for (uint32_t i = 0; i < l->nducks; i++) {
		uint32_t d = l->ducks[i], f = l->moe->expert_ffn;
		if (l->shard[i] - l->moe->experts_on[d] * f != n->shard[i] - n->moe->experts_on[d] * f)
			return -1;
		for (uint32_t e = 0; e < a->n_experts; e++)
			if (holds(a, e, d) != holds(b, e, d)) {
				changed[d >> 6] |= 1ull << (d & 63);
				break;
			}
	}
	return 0;
}

/* The ducks whose banks the move takes, into `want` (which holds the changed ones): the
 * request's, each one of l's, holding every changed duck and every duck a failed move
 * tainted; or those alone when it names none. -1 after a refusal. */
static int move_ducks(struct dp_control *c, const struct dp_peer *p, const struct dp_layer *l,
		      const struct dp_ctl_move_layer *m, uint64_t *want)
{
	for (uint32_t k = 0; k < DP_MAX_DUCKS / 64; k++)
		want[k] |= l->tainted[k];
	if (!m->ducks_len)
		return 0;
	uint64_t named[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t i = 0; i < m->ducks_len; i++) {
		uint32_t d = m->ducks[i]; /* < DP_MAX_DUCKS: the decoder's DuckId */
		if (l->index[d] < 0) {
			dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
			                  "layer %u: duck %u is not one of its ducks", l->id, d);
			return -1;
		}
		named[d >> 6] |= 1ull << (d & 63);
	}
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		if ((want[d >> 6] >> (d & 63) & 1) && !(named[d >> 6] >> (d & 63) & 1)) {
			dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
			                  "layer %u: the move must send duck %u a bank (%s)", l->id, d,
			                  l->tainted[d >> 6] >> (d & 63) & 1
				                  ? "a failed move left it a stale one"
				                  : "its experts change");
			return -1;
		}
	memcpy(want, named, sizeof(named));
	return 0;
}

/* Open a move: the layer as it will be (dp_layer_build of l's LoadWeights with the new
 * placement), a bank generation on, taking chunks for the changed ducks only, published
 * as l->moving (release). l serves on until its commit (dp_layers.h). */
static void on_move_layer(struct dp_control *c, const struct dp_peer *p,
			  const struct dp_ctl_request *r)
{
	const struct dp_ctl_move_layer *m = &r->u.move_layer;
	dp_control_settle_moves(c);
	struct dp_layer *l = check_move(c, p, m);
	if (!l)
		return;
	/* the layer the last move replaced goes as soon as nothing holds it */
	dp_count(c->counters, DP_C_layers_freed, dp_layers_free_retired(c->w, &c->retired, false));
	if (draining(c, m->layer)) {
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u's forwards on its placement before the last move are "
		                  "still in flight: move it again once they finished", m->layer);
		return;
	}
	struct dp_ctl_load_weights *req = malloc(sizeof(*req)); /* 40 KiB: not on the stack */
	if (!req || move_request(l, m, req) < 0) {
		free(req);
		dp_control_refuse(c, p, DP_ERROR_CODE_DATAPLANE_ERROR, "out of memory");
		return;
	}
	const struct dp_load_limits lim = { .max_hidden = c->w->cfg.max_hidden,
					    .max_ffn = c->w->cfg.max_ffn };
	char why[DP_CTL_WHY_LEN];
	int code = dp_load_check(req, &lim, c->w->duck_index, why, sizeof(why));
	struct dp_layer *n = code ? NULL : dp_layer_build(req, &code, why, sizeof(why));
	uint64_t bytes = dp_load_plan_bytes(req);
	free(req);
	if (!n) {
		dp_control_refuse(c, p, (enum dp_error_code)code, "%s", why);
		return;
	}
	uint64_t changed[DP_MAX_DUCKS / 64] = { 0 };
	if (changed_ducks(l, n, changed) < 0) {
		dp_layer_free(n);
		dp_control_refuse(c, p, DP_ERROR_CODE_BAD_REQUEST,
		                  "layer %u: a move keeps the shared expert's ducks and each one's "
		                  "shared columns; load the layer anew (LoadWeights) to change them",
		                  m->layer);
		return;
	}
	if (move_ducks(c, p, l, m, changed) < 0) {
		dp_layer_free(n);
		return;
	}
	uint32_t list[DP_MAX_DUCKS], nlist = 0;
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		if (changed[d >> 6] >> (d & 63) & 1)
			list[nlist++] = d;
	if (refuse_unreachable(c, p, list, nlist)) {
		dp_layer_free(n);
		return;
	}
	n->owner = l->owner;
	n->shared = l->shared;
	n->weight_bytes = bytes;
	n->bank = (uint16_t)(l->bank + 1);
	n->is_move = true;
	memcpy(n->move_ducks, changed, sizeof(changed));
	/* release: the dispatcher that follows it sees it whole */
	dp_store_release_ptr((void **)&l->moving, n);
	c->moves_open++;
	reply_ack(c, p->id, p->idlen, p->rid);
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
	[DP_CTL_REPAIR_LAYER] = on_repair_layer,
	[DP_CTL_MOVE_LAYER] = on_move_layer,
};

int dp_control_check_handlers(void)
{
	for (int t = 0; t < DP_CTL_NTYPES; t++)
		if (!handlers[t]) {
			dp_set_error("control message %s has no handler", dp_ctl_type_names[t]);
			return -1;
		}
	return 0;
}

static void handle(struct dp_control *c, struct dp_peer *p, const char *data, size_t len)
{
	char why[256];
	if (c->access.ipc && !p->creds) {
		/* libzmq gives every ipc peer's SO_PEERCRED; without it we cannot tell who asks */
		dp_count(c->counters, DP_C_control_refused, 1);
		dp_control_reply_error(c, p->id, p->idlen, 0, DP_ERROR_CODE_NO_CREDENTIALS,
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
		dp_control_reply_error(c, p->id, p->idlen, p->rid, (enum dp_error_code)rc, why);
		return;
	}
	handlers[c->req.type](c, p, &c->req);
}

int dp_control_poll_requests(struct dp_control *c)
{
	int n = 0;
	uint8_t id[256];
	while (n < MAX_MESSAGES_PER_LOOP) {
		int idlen = zmq_recv(c->router, id, sizeof(id), ZMQ_DONTWAIT);
		if (idlen < 0) { /* it asked libzmq after the replies: the fd says "look" again */
			c->zmq_unsure &= ~(1u << DP_ZMQ_ROUTER);
			break;
		}
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
		struct dp_peer peer = { .id = id, .idlen = (size_t)idlen,
					.srcfd = zmq_msg_get(&msg, ZMQ_SRCFD) };
		peer.creds = dp_peer_credentials(c->w->cfg.control,
						 zmq_msg_gets(&msg, "Peer-Address"), &peer.uid,
						 &peer.gid, &peer.pid);
		handle(c, &peer, zmq_msg_data(&msg), zmq_msg_size(&msg));
		zmq_msg_close(&msg);
	}
	return n;
}
