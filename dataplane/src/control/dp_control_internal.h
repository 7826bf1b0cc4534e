/* dp_control_internal.h: what the parts of the control agent share, and nothing else
 * includes: the agent's state (struct dp_control), the reply packer (PACK), who sent a
 * request (struct dp_peer) and each part's entry points. The parts:
 *
 *   dp_control.c               the agent: new, free, do_work (which calls the parts in
 *                              turn), parking
 *   dp_control_reply.c         every send on the ROUTER (a leaf: the others call it)
 *   dp_control_requests.c      reads the ROUTER, checks who asks, one handler a message
 *   dp_control_outbox.c        completions from the dispatcher and workers, batched out
 *   dp_control_connections.c   counts connections, sheds those past max_connections
 *   dp_control_housekeeping.c  heartbeats, dead clients, segments faulted in a step at a
 *                              time and handed to the reaper to unmap, retired layers
 *
 * Every function here runs on the control agent's thread. The rest of the dataplane sees
 * dp_control.h only.
 */
#ifndef DP_CONTROL_INTERNAL_H
#define DP_CONTROL_INTERNAL_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_access.h"
#include "dp_control.h"
#include "dp_counters.h"
#include "dp_ctl_gen.h"
#include "dp_reaper.h"
#include "dp_world.h"

struct dp_client;    /* dp_client.h */
struct dp_layer;     /* dp_layers.h */
struct dp_stats_seg; /* dp_stats.h */

/* completions held back to leave together (completion_flush_us): at most this many */
#define OUTBOX_MAX 32
#define OUTBOX_BYTES (OUTBOX_MAX * 8192)

/* A packed completion waiting in the outbox, and who it is for. */
struct dp_outbox_entry {
	struct dp_client *client; /* its completions_wanted says: send now */
	uint8_t identity[256];
	uint32_t identity_len;
	size_t off, len; /* in the outbox buffer */
};

/* A completion a client's full socket refused (ZMQ_ROUTER_MANDATORY: EAGAIN), kept in
 * the control agent's own memory until the socket takes it (dp_control_retry_held). Its
 * forward counts in flight for the client until then, so a client holds at most its
 * quota of these (and an outbox's worth, packed before the refusal). */
struct dp_held {
	struct dp_held *next;
	size_t len;
	uint8_t data[]; /* the packed Completion */
};

/* One client's held completions, oldest first: they leave in that order. */
struct dp_held_list {
	struct dp_held *head, *tail;
	uint32_t n;
};

/* Failed layers whose missing ducks one Layers reply lists (the rest: failed, no list). */
#define FAILED_LAYERS_LISTED 64

/* The control agent's ZeroMQ sockets, as bits of zmq_unsure. */
enum { DP_ZMQ_ROUTER, DP_ZMQ_MONITOR, DP_ZMQ_ZAP, DP_ZMQ_SOCKETS };

struct dp_waker;

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
	uint32_t moves_open;            /* layers with a MoveLayer not settled (dp_control_settle_moves) */
	struct dp_ctl_layer_info *layer_infos; /* Layers reply: one per table slot */
	uint32_t (*layer_ducks)[256];
	uint32_t (*layer_missing)[256]; /* Layers reply: the missing ducks of failed layers */
	uint64_t started_ns;            /* a duck silent since then for 3 pings is unreachable */
	/* the outbox: completions packed as they come, sent together (dp_control_flush_outbox) */
	struct dp_outbox_entry outbox[OUTBOX_MAX];
	uint32_t noutbox;
	uint8_t *outbox_buf;
	size_t outbox_used;
	uint64_t outbox_since; /* when the oldest waiting completion was packed */
	/* completions held for clients whose sockets were full, by client table index */
	struct dp_held_list held[DP_MAX_CLIENTS];
	uint32_t nheld;        /* held, over every client */
	uint64_t held_retry;   /* when they are offered again (0: at the next pass) */
	uint64_t held_backoff; /* ns until the next offer after one that sent nothing */
	struct dp_stats_seg *stats; /* the stats segment: this agent is its only writer */
	uint64_t next_stats;
	uint64_t next_zmq_look; /* when the pass next asks ZeroMQ's sockets (dp_control.c) */
	/* Parking without asking ZeroMQ (dp_control.c): the runner's waker (the reaper kicks
	 * it too), each socket's fd, and which sockets' fds may not announce their next
	 * message (DP_ZMQ_*) */
	struct dp_waker *waker;
	int zmq_fds[DP_ZMQ_SOCKETS];
	uint32_t zmq_unsure;
	struct dp_reaper reaper; /* unmaps detached clients' segments (dp_reaper.h) */
};

/* A send on the router: libzmq may have taken the mailbox's signal for a message that
 * came meanwhile, so its fd no longer says "look" for it (zmq_getsockopt(3), ZMQ_FD). */
static inline void dp_control_router_sent(struct dp_control *c)
{
	c->zmq_unsure |= 1u << DP_ZMQ_ROUTER;
}

/* Every reply is packed by its generated encoder (dp_ctl_pack_*) into c->sbuf, emptied
 * first, then sent. */
#define PACK(c, name, ...)                                                         \
	do {                                                                       \
		msgpack_sbuffer_clear(&(c)->sbuf);                                 \
		dp_ctl_pack_##name(&(c)->pk, &(struct dp_ctl_##name){ __VA_ARGS__ }); \
	} while (0)

/* Who sent the request being handled. */
struct dp_peer {
	const uint8_t *id; /* ZeroMQ routing id */
	size_t idlen;
	uint64_t rid;      /* req_id, echoed in the reply */
	bool creds;        /* uid, gid, pid read from the socket (ipc:// only) */
	uint32_t uid, gid, pid; /* pid: the process that connected, maybe gone (dp_peer_pidfd) */
	int srcfd;         /* the connection's socket (ZMQ_SRCFD), libzmq's: only looked at */
	bool admin;        /* the dataplane's own user */
};

/* dp_control_reply.c */
/* Send what PACK put in c->sbuf to the peer with this routing id; a reply
 * the peer cannot take (gone, or ROUTER_SNDHWM unread) is dropped and counted. */
void dp_control_send_to(struct dp_control *c, const uint8_t *id, size_t idlen);
/* One message to the peer with this routing id, without waiting: 0, or -1 with errno
 * EAGAIN (its socket holds ROUTER_SNDHWM unread: nothing was sent), EHOSTUNREACH (no
 * such peer any more) or another error. */
int dp_control_send_msg(struct dp_control *c, const uint8_t *id, size_t idlen,
			const void *msg, size_t len);

/* An Error to the peer with this routing id, answering req_id. */
void dp_control_reply_error(struct dp_control *c, const uint8_t *id, size_t idlen,
			    uint64_t req_id, enum dp_error_code code, const char *message);
/* Answer p with an Error (counted as refused when code is NOT_PERMITTED). */
void dp_control_refuse(struct dp_control *c, const struct dp_peer *p, enum dp_error_code code,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* dp_control_requests.c */
/* Read and answer up to a pass's worth of requests; how many were read. */
int dp_control_poll_requests(struct dp_control *c);
/* 0 when every control message has a handler, else -1 with dp_error(): checked at start. */
int dp_control_check_handlers(void);

/* Settle the open moves whose commit is in (dp_layer_settle_move). */
void dp_control_settle_moves(struct dp_control *c);

/* dp_control_outbox.c */
/* Take every finished context off the completion rings and queue its Completion. */
int dp_control_drain_completions(struct dp_control *c);
void dp_control_flush_outbox(struct dp_control *c);
uint64_t dp_control_outbox_due(const struct dp_control *c);
bool dp_control_outbox_wanted(const struct dp_control *c);
/* Offer the held completions again, oldest first per client; those of a client that
 * left, or whose connection is gone, are dropped (counted). Returns how many left. */
int dp_control_retry_held(struct dp_control *c, uint64_t now);
/* When the held completions are next offered (UINT64_MAX: none held). */
uint64_t dp_control_held_due(const struct dp_control *c);
/* At exit: one last offer, then the rest are dropped (counted) and freed. */
void dp_control_free_held(struct dp_control *c);

/* dp_control_connections.c */
int dp_control_poll_monitor(struct dp_control *c);

/* dp_control_housekeeping.c */
/* Segments faulted in at attach and unmapped after detach, a step per pass. */
int dp_control_attach_steps(struct dp_control *c);
/* Every HOUSEKEEPING_NS: heartbeats and dead clients, retired layers, the dispatcher. */
void dp_control_housekeeping(struct dp_control *c, uint64_t now);

#endif /* DP_CONTROL_INTERNAL_H */
