/* dp_control.c: the control agent.
 *
 * One ZeroMQ ROUTER carries the control protocol of duckpipe/schema/control.py. The
 * agent's work is cut in parts (dp_control_internal.h lists them): requests and their
 * handlers (dp_control_requests.c), completions, batched in an outbox
 * (dp_control_outbox.c), the connections' count (dp_control_connections.c) and
 * housekeeping: heartbeats into every attached segment, reclaiming the segments of
 * clients that died and freeing the layers they owned (dp_control_housekeeping.c).
 * This file holds what ties them together: the socket's setup and teardown
 * (dp_control_new, dp_control_free), the pass that calls each part (dp_control_do_work),
 * parking, and dp_control_send_to, through which every reply leaves. dp_main.c runs it
 * as an agent (struct dp_agent) on the control runner.
 */
#include "dp_control.h"

#include <errno.h>
#include <msgpack.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "dp_access.h"
#include "dp_client.h"
#include "dp_control_internal.h"
#include "dp_layers.h"
#include "dp_spsc.h"
#include "dp_stats.h"
#include "dp_waker.h"
#include "dp_worker.h"

#define HOUSEKEEPING_NS 50000000ull /* 50 ms */
/* a connection that has not finished its ZMTP greeting by then is closed (libzmq's
 * default is 30 s: raw connections held that long once exhausted the fd table) */
#define HANDSHAKE_IVL_MS 2000
/* messages queued for one peer that does not read them, so that with max_connections
 * peers what unread messages can cost is bounded. The socket is ROUTER_MANDATORY: a send
 * past it fails (EAGAIN) rather than vanishing, so a reply past it is dropped and counted
 * (replies_dropped), and a completion is held until the peer reads (dp_control_outbox.c) */
#define ROUTER_SNDHWM 256
#define MONITOR_ENDPOINT "inproc://duckpipe-control-monitor"
#define FLOOD_SLACK 8 /* connections beyond the attached clients' that still let it park */
/* Asking a ZeroMQ socket that holds nothing costs libzmq a poll() of its mailbox and a
 * getpid() (zmq_recv's process_commands is not throttled): three sockets, six syscalls a
 * pass, 160 a forward while the runner spun between a send and its reply (docs/
 * benchmarks.md, CPU per forward). Control is not latency-critical: while nothing comes,
 * the pass asks at most this often; at once after a sleep ZeroMQ's fd ended
 * (dp_control_unpark) and again the next pass after one that found something. */
#define ZMQ_LOOK_NS 50000ull /* 50 us */

/* --- the pass ---------------------------------------------------------------------- */

/* Each part in turn; housekeeping and the stats segment on their timers. */
int dp_control_do_work(struct dp_world *w, void *self, uint64_t now)
{
	struct dp_control *c = self;
	(void)w;
	int work = 0;
	if (now >= c->next_zmq_look) {
		uint64_t refused = c->access.refused;
		work += dp_access_serve_zap(&c->access); /* it stops at a receive that found none */
		c->zmq_unsure &= ~(1u << DP_ZMQ_ZAP);
		dp_count(c->counters, DP_C_curve_refused, c->access.refused - refused);
		work += dp_control_poll_monitor(c);
		work += dp_control_poll_requests(c);
		c->next_zmq_look = work ? now : now + ZMQ_LOOK_NS;
	}
	work += dp_control_drain_completions(c);
	if (c->nheld && now >= c->held_retry)
		work += dp_control_retry_held(c, now);
	work += dp_control_attach_steps(c);
	if (c->noutbox && dp_now_ns() >= dp_control_outbox_due(c)) {
		dp_control_flush_outbox(c);
		work++;
	} else if (c->noutbox && dp_control_outbox_wanted(c)) { /* queued before it asked */
		dp_control_flush_outbox(c);
		dp_count(c->counters, DP_C_completion_flushes_wanted, 1);
		work++;
	}
	if (now >= c->next_house) {
		dp_control_housekeeping(c, now);
		c->next_house = now + HOUSEKEEPING_NS;
	}
	if (now >= c->next_stats) { /* parked, it ticks with housekeeping instead */
		dp_stats_tick(c->stats, now);
		c->next_stats = now + DP_STATS_TICK_NS;
	}
	return work;
}

/* --- parking ------------------------------------------------------------------------- */

/* ZeroMQ's fd only says "look": ZMQ_EVENTS says whether a message waits, and re-arms the
 * fd (zmq_getsockopt(3), ZMQ_FD). After a receive that found nothing (which asks the same
 * way) the fd is faithful until the next send, so only a socket sent on since (its bit in
 * zmq_unsure) is asked before a park: each ask is a getpid() and a poll() in libzmq, and
 * a parked 64 B round trip paid twelve of them (docs/benchmarks.md, issue 19 goal 4). */
static bool zmq_may_hold(struct dp_control *c, uint32_t which, void *s)
{
	if (!s || !(c->zmq_unsure & (1u << which)))
		return false;
	int ev = 0;
	size_t sz = sizeof(ev);
	if (zmq_getsockopt(s, ZMQ_EVENTS, &ev, &sz) == 0 && !(ev & ZMQ_POLLIN)) {
		c->zmq_unsure &= ~(1u << which);
		return false;
	}
	return true;
}

static int add_zmq_fd(struct dp_control *c, struct dp_waker *wk, uint32_t which, void *s)
{
	int fd;
	size_t sz = sizeof(fd);
	c->zmq_fds[which] = -1;
	if (!s)
		return 0;
	if (zmq_getsockopt(s, ZMQ_FD, &fd, &sz) < 0) {
		dp_set_error("ZMQ_FD: %s", zmq_strerror(errno));
		return -1;
	}
	c->zmq_fds[which] = fd;
	c->zmq_unsure |= 1u << which; /* nobody has asked it yet */
	return dp_waker_add(wk, fd);
}

int dp_control_wait_on(struct dp_world *w, void *self, struct dp_waker *wk)
{
	struct dp_control *c = self;
	(void)w;
	c->waker = wk;
	if (add_zmq_fd(c, wk, DP_ZMQ_ROUTER, c->router) < 0 ||
	    add_zmq_fd(c, wk, DP_ZMQ_MONITOR, c->monitor) < 0 ||
	    add_zmq_fd(c, wk, DP_ZMQ_ZAP, c->access.zap) < 0)
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
	if (zmq_may_hold(c, DP_ZMQ_ROUTER, c->router) ||
	    zmq_may_hold(c, DP_ZMQ_MONITOR, c->monitor) ||
	    zmq_may_hold(c, DP_ZMQ_ZAP, c->access.zap)) {
		c->next_zmq_look = 0; /* a message waits: the next pass reads it */
		return -1;
	}
	if (dp_control_outbox_wanted(c)) /* the next pass sends it */
		return -1;
	/* a segment half faulted in, or one to hand to the reaper or free once it is done
	 * (while it unmaps one, it kicks this runner when done) */
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		const struct dp_client *cl = &w->clients[i];
		uint32_t state = dp_load_acquire_u32(&cl->state);
		if (state == DP_CLIENT_ATTACHING ||
		    (state == DP_CLIENT_UNMAPPING && !dp_client_reaping(cl)))
			return -1;
	}
	/* a connection flood: libzmq aborts the process on EMFILE, so while more connections
	 * are open than clients attached (and a few tools), every accepted one past the limit
	 * must be shut down as soon as it is seen, not after a wake-up: a parked control
	 * agent lost that race to libzmq's accepting I/O thread under load in CI */
	if (c->over_limit || c->connections > attached_clients(c->w) + FLOOD_SLACK)
		return -1;
	uint64_t due = dp_control_outbox_due(c), held = dp_control_held_due(c);
	if (held < due)
		due = held;
	uint64_t next = due < c->next_house ? due : c->next_house;
	return next > now ? (int64_t)(next - now) : 0;
}

/* After a sleep woken by ZeroMQ's fd: look in the first pass. Woken by anything else (a
 * doorbell, a reply, a kick), ZeroMQ has nothing new: every socket was asked or
 * faithful when it slept, so the pass keeps to its 50 us, unless a look was already
 * asked for (0). A park that did not sleep (an agent had work) changes nothing: were it
 * to put the look off, a runner kept from sleeping (a connection flood) would put it
 * off for ever, and answer no request (tests/hostile: a ping after 20 idle peers). */
void dp_control_unpark(struct dp_world *w, void *self)
{
	struct dp_control *c = self;
	(void)w;
	if (!c->waker->waited) /* set by wait_on, before any park */
		return;
	bool zmq_woke = false;
	for (uint32_t i = 0; i < DP_ZMQ_SOCKETS; i++)
		zmq_woke |= c->zmq_fds[i] >= 0 && dp_waker_fired(c->waker, c->zmq_fds[i]);
	if (zmq_woke) {
		c->next_zmq_look = 0;
		/* perhaps a client read: libzmq's word that its pipe drained comes this way */
		c->held_retry = 0;
	}
	else if (c->next_zmq_look)
		c->next_zmq_look = dp_now_ns() + ZMQ_LOOK_NS;
}

/* --- setup and teardown --------------------------------------------------------------- */

/* With the runners pinned (topology `cores`), ZeroMQ's I/O thread goes to the CPUs this
 * process may use that no runner was given, if there are any: then a burst of completions
 * never lands on a runner's core (p99 of a one-duck forward 150 -> 125 us when moved;
 * docs/benchmarks.md, issue 19 goal 2). Only allowed CPUs are added: libzmq aborts when
 * it cannot set the affinity it was told. */
static void zmq_io_off_runner_cores(void *zctx, const struct dp_config *cfg)
{
	cpu_set_t allowed;
	if (!cfg->ncores || sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
		return;
	for (uint32_t i = 0; i < cfg->ncores; i++)
		if (cfg->cores[i] >= 0 && cfg->cores[i] < CPU_SETSIZE)
			CPU_CLR(cfg->cores[i], &allowed);
	if (!CPU_COUNT(&allowed))
		return; /* every CPU runs a runner: leave it where it starts */
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &allowed))
			zmq_ctx_set(zctx, ZMQ_THREAD_AFFINITY_CPU_ADD, cpu);
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
	/* ZeroMQ's I/O thread, started with the first socket, runs SCHED_BATCH: woken for a
	 * burst of completions it does not preempt a runner or a client on their core, it
	 * waits for the next tick (p99 of a one-duck forward 201-214 -> 150-157 us, both
	 * sides so; docs/benchmarks.md, issue 19 goal 2). Control is not latency-critical. */
	if (zmq_ctx_set(c->zctx, ZMQ_THREAD_SCHED_POLICY, SCHED_BATCH) < 0)
		DP_WARN("ZeroMQ's I/O thread keeps the default scheduling: %s",
			zmq_strerror(errno));
	zmq_io_off_runner_cores(c->zctx, &w->cfg);
	const char *ep = w->cfg.control;
	if (!strncmp(ep, "ipc://", 6) && access(ep + 6, F_OK) == 0) {
		if (someone_answers(c->zctx, ep)) {
			dp_set_error("a dataplane is already running at %s; stop it (duckpipe shutdown) "
				     "or choose another control address", ep);
			goto fail;
		}
		unlink(ep + 6); /* left behind by a dataplane that died */
	}
	if (dp_control_check_handlers() < 0)
		goto fail;
	c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
	int zero = 0;
	/* a longer message disconnects its sender before libzmq buffers it */
	int64_t maxmsg = DP_MAX_MESSAGE_BYTES;
	int handshake = HANDSHAKE_IVL_MS, sndhwm = ROUTER_SNDHWM, one = 1;
	zmq_setsockopt(c->router, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	zmq_setsockopt(c->router, ZMQ_HANDSHAKE_IVL, &handshake, sizeof(handshake));
	zmq_setsockopt(c->router, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm));
	/* a send to a full or gone peer fails instead of being dropped without a word: no
	 * completion is lost uncounted (dp_control_outbox.c) */
	if (zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0) {
		dp_set_error("ZMQ_ROUTER_MANDATORY: %s", zmq_strerror(errno));
		goto fail;
	}
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
	/* before the first attach: every segment let go is unmapped there (dp_reaper.h) */
	if (dp_reaper_start(&c->reaper, &w->cfg) < 0)
		goto fail;
	dp_client_set_reaper(&c->reaper);
	const struct dp_counters *nic_counters[DP_MAX_NICS];
	for (uint32_t k = 0; k < w->cfg.nnics; k++)
		nic_counters[k] = &w->workers[k]->counters;
	c->stats = dp_stats_open(w, nic_counters);
	if (!c->stats)
		goto fail;
	DP_INFO("stats segment %s", dp_stats_file(c->stats));
	return c;
fail:
	dp_client_set_reaper(NULL);
	dp_reaper_stop(&c->reaper);
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
	dp_control_flush_outbox(c); /* the last completions still go out */
	dp_control_free_held(c);
	dp_stats_close(c->stats);
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		if (c->w->clients[i].base)
			dp_client_unmap(&c->w->clients[i]); /* live clients own their segments */
	dp_client_set_reaper(NULL);
	dp_reaper_stop(&c->reaper); /* once it unmapped every segment given */
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
