/* dp_main.c: duckpipe-dataplane, the standalone dataplane process.
 *
 *   duckpipe-dataplane --config FILE [-v] [-- BACKEND OPTIONS]
 *
 * FILE is the msgpack configuration `duckpipe dataplane` writes from the TOML
 * topology. The agents (control, dispatcher, one worker per NIC) either share
 * one thread (the default on small machines) or get a thread each, pinned to
 * the configured cores; with a thread each, the worker of a dpdk NIC runs on an EAL
 * worker lcore instead (rte_eal_remote_launch: the n-th dpdk NIC on the n-th worker
 * lcore of the EAL's -l / --lcores list, pinned by the EAL; dp_lcore.h).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dp_accept_guard.h"
#include "dp_agent.h"
#include "dp_client.h"
#include "dp_control.h"
#include "dp_dispatch.h"
#include "dp_fwd.h"
#include "dp_lcore.h"
#include "dp_stats.h"
#include "dp_tsan.h"
#include "dp_worker.h"
#include "dp_world.h"

#define MAX_AGENTS (2 + DP_MAX_NICS)

static struct dp_world world;

static void on_signal(int sig)
{
	(void)sig;
	dp_world_stop(&world);
}

static void pin(int core, const char *name)
{
	if (core < 0)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(core, &set);
	int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	if (rc)
		DP_WARN("%s: cannot pin to core %d: %s", name, core, strerror(rc));
}

struct runner {
	struct dp_agent *agents;
	uint32_t n;
	struct dp_idle idle;
	struct dp_waker waker;
	int core;
	int lcore; /* the EAL worker lcore it was launched on, or -1: a thread of its own */
	const char *name;
};

/* Every agent idle for a while: arm the waker, let each agent look once more (and say
 * when its next timer is due), then sleep until an fd, a kick or the nearest timer. */
static void park(struct runner *r, int64_t cap)
{
	dp_waker_arm(&r->waker);
	uint64_t now = dp_now_ns();
	int64_t timeout = cap;
	bool work = false;
	for (uint32_t i = 0; i < r->n && !work; i++) {
		const struct dp_agent *a = &r->agents[i];
		int64_t t = a->park ? a->park(&world, a->self, now) : 0;
		work = t < 0;
		if (t < timeout)
			timeout = t;
	}
	if (!work && dp_load_acquire_u32(&world.running))
		dp_waker_wait(&r->waker, timeout);
	dp_waker_disarm(&r->waker);
	for (uint32_t i = 0; i < r->n; i++)
		if (r->agents[i].unpark)
			r->agents[i].unpark(&world, r->agents[i].self);
	dp_idle_reset(&r->idle);
}

/* The shortest park until replies are due worth taking. A park and its wake-up cost
 * about 25-30 us of CPU on the development VM, but on a loaded shared core the wake-up
 * can come later than the replies: parks of 50-150 us (a one-token routed forward to 8
 * or 32 ducks) cost its p50 1.0 -> 1.4-1.7x the floor's for 10-20 % of the CPU; from
 * 8 tokens (parks of a millisecond and more) the p50 did not move. */
#define PARK_MIN_NS 250000

/* Right after a send, rather than spin while the ducks compute (a forward of one token
 * to 8 ducks: about 110 us of sched_yield a call, most of the dataplane's CPU) or park
 * and wake for each reply as it trickles in (idle_spin_us=0: 3-4 wake-ups a call, each
 * about as dear): when every worker of this runner waits only on replies due, by their
 * ducks' measured reply times, further off than idle_spin_us + PARK_MIN_NS, sleep until
 * idle_spin_us before the first is due, those workers' sockets muted (early replies wait
 * there: one wake-up takes them all), then spin as after work. Doorbells, ZeroMQ and
 * kicks still wake it. False: not now (the runner backs off as before). */
static bool park_expecting(struct runner *r, uint64_t now)
{
	int fds[DP_MAX_NICS];
	uint32_t nfds = 0;
	int64_t quiet = 0;
	for (uint32_t i = 0; i < r->n; i++) {
		const struct dp_agent *a = &r->agents[i];
		int fd = -1;
		int64_t t = a->expect ? a->expect(&world, a->self, now, &fd) : 0;
		if (t < 0)
			return false;
		if (t == 0 || nfds == DP_MAX_NICS)
			continue;
		quiet = !quiet || t < quiet ? t : quiet;
		fds[nfds++] = fd;
	}
	int64_t spin = (int64_t)r->idle.spin_ns;
	if (!nfds || quiet <= spin + PARK_MIN_NS)
		return false;
	uint32_t muted = 0;
	while (muted < nfds && dp_waker_mute(&r->waker, fds[muted], true) == 0)
		muted++;
	if (muted == nfds) {
		dp_store_relaxed_u64(&r->waker.expecting, r->waker.expecting + 1); /* Stats */
		park(r, quiet - spin);
	}
	for (uint32_t i = 0; i < muted; i++)
		if (dp_waker_mute(&r->waker, fds[i], false) < 0) /* EPOLL_CTL_MOD of an fd it holds */
			DP_WARN("%s: %s", r->name, dp_error());
	if (muted < nfds) {
		DP_WARN("%s: %s; backing off instead", r->name, dp_error());
		return false;
	}
	dp_idle_resume(&r->idle);
	return true;
}

/* The agent runner: every agent's do_work in turn, the idle strategy on no work. */
static void *run(void *arg)
{
	struct runner *r = arg;
	dp_set_thread_name(r->name);
	pin(r->core, r->name);
	/* a park until replies are due (park_expecting) wakes on its timer: the default 50 us
	 * of slack would let it wake that late, as late as the spin it stands for */
	(void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	while (dp_load_acquire_u32(&world.running)) {
		int work = 0;
		uint64_t now = dp_now_ns();
		for (uint32_t i = 0; i < r->n; i++)
			work += r->agents[i].do_work(&world, r->agents[i].self, now);
		if (!work && dp_idle_starts(&r->idle) && park_expecting(r, now))
			continue;
		if (dp_idle_idle(&r->idle, work, now))
			park(r, DP_PARK_FOREVER);
	}
	return NULL;
}

/* A runner on an EAL worker lcore (rte_eal_remote_launch's lcore_function_t). The
 * EAL hands over through its lcore state in libdpdk, which ThreadSanitizer does not
 * see: DP_TSAN_* draw those two edges (launch, and rte_eal_wait_lcore's return). */
static int run_on_lcore(void *arg)
{
	DP_TSAN_ACQUIRE(arg);
	run(arg);
	DP_TSAN_RELEASE(arg);
	return 0;
}

static bool nic_is_dpdk(uint32_t n)
{
	return !strcmp(world.cfg.nics[n].backend, "dpdk");
}

/* threads = "dedicated": a worker lcore for each dpdk NIC's runner, or say what to pass.
 * Shared: say that the one thread runs the dpdk workers too. The EAL is up (the first
 * dpdk NIC's open started it). */
static int check_lcores(void)
{
	uint32_t ndpdk = 0;
	for (uint32_t n = 0; n < world.cfg.nnics; n++)
		ndpdk += nic_is_dpdk(n);
	if (!ndpdk)
		return 0;
	unsigned have = dp_lcore_workers();
	char lcores[256];
	dp_lcore_describe_all(lcores, sizeof(lcores));
	if (!world.cfg.dedicated_threads) {
		DP_INFO("threads = \"shared\": the %u dpdk NIC worker(s) run on the one dataplane "
			"thread with the other agents%s (EAL lcores: %s)",
			ndpdk, have ? "; the EAL's worker lcores stay unused" : "", lcores);
		return 0;
	}
	if (have < ndpdk) {
		/* the EAL refuses -l past the CPUs it sees; --lcores maps lcores onto CPUs */
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		char map[128] = "";
		size_t used = 0;
		for (uint32_t i = 0; i <= ndpdk && used < sizeof(map); i++) {
			int k = snprintf(map + used, sizeof(map) - used, "%s%u@%ld", i ? "," : "", i,
					 cpus > 0 ? (long)i % cpus : 0L);
			used += k > 0 ? (size_t)k : 0;
		}
		dp_set_error("threads = \"dedicated\" runs each dpdk NIC's worker on an EAL worker "
			     "lcore: the EAL's lcores (%s) give %u worker lcore(s) besides the main "
			     "one; %u dpdk NIC(s) need %u: pass a main lcore and one per NIC after "
			     "--, e.g. -l 0-%u (%u CPUs), or --lcores='%s' (lcore@CPU, on %ld CPUs)",
			     lcores, have, ndpdk, ndpdk, ndpdk, ndpdk + 1, map, cpus);
		return -1;
	}
	return 0;
}

/* The k-th dpdk NIC's runner goes to the k-th worker lcore, whose CPUs the EAL chose:
 * the topology's `cores` entry for it, if any, is not applied. */
static void place_on_lcore(struct runner *r, unsigned k)
{
	r->lcore = (int)dp_lcore_worker(k);
	char cpus[64];
	dp_lcore_cpus((unsigned)r->lcore, cpus, sizeof(cpus));
	if (r->core >= 0 && !dp_lcore_is_only_cpu((unsigned)r->lcore, r->core))
		DP_WARN("%s: the topology's cores entry (%d) is ignored: the worker runs on EAL "
			"lcore %d, CPU %s, as the EAL's -l / --lcores place it",
			r->name, r->core, r->lcore, cpus);
	r->core = -1; /* the EAL pinned the lcore's thread */
	DP_INFO("%s: worker on EAL lcore %d (CPU %s), launched by rte_eal_remote_launch", r->name,
		r->lcore, cpus);
}

/* Each agent waits on its runner's waker; a ring fed from another runner kicks it. */
static int setup_runner(struct runner *r)
{
	if (dp_waker_init(&r->waker) < 0)
		return -1;
	world.wakers[world.nwakers++] = &r->waker;
	for (uint32_t i = 0; i < r->n; i++) {
		struct dp_agent *a = &r->agents[i];
		if (a->wait_on && a->wait_on(&world, a->self, &r->waker) < 0)
			return -1;
	}
	return 0;
}

/* With a thread per agent, a push into another agent's ring kicks that agent's runner
 * (agents: control, dispatcher, workers, in that order). Sharing one thread, nobody
 * kicks: whoever pushes is awake, and so is the consumer. */
static void connect_rings(struct runner *runners, uint32_t nrunners)
{
	if (nrunners == 1)
		return;
	struct dp_waker *control = &runners[0].waker, *dispatch = &runners[1].waker;
	world.dispatch_waker = dispatch;
	world.free_ring.consumer = dispatch;
	world.dispatch_done.consumer = control;
	for (uint32_t n = 0; n < world.cfg.nnics; n++) {
		world.workers[n]->in.consumer = &runners[2 + n].waker;
		world.workers[n]->done.consumer = control;
	}
}

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s --config FILE [--remove-config] [-v] [-- BACKEND OPTIONS]\n"
		"       %s --backends (prints the backends this build has)\n"
		"  FILE: msgpack configuration written by `duckpipe dataplane`\n"
		"  --remove-config: FILE is this launch's own: remove it when the process exits\n"
		"  BACKEND OPTIONS: passed to the backend (EAL options for dpdk)\n",
		prog, prog);
}

/* The launchers' per-launch config file (--remove-config), removed on every orderly exit,
 * a failed start included; a crash leaves it to the next launch, which removes the files
 * of launches whose process is gone (duckpipe/launch/dataplane.py). */
static const char *config_to_remove;

static void remove_config(void)
{
	if (unlink(config_to_remove) < 0 && errno != ENOENT)
		DP_WARN("cannot remove the config file %s: %s", config_to_remove, strerror(errno));
}

/* File descriptors kept for everything but control connections: sockets of the NICs and
 * ZeroMQ (its I/O thread, mailboxes), memfds while they are checked at attach, /proc. */
#define DP_FD_RESERVE 256

/* libzmq 4.3 aborts the process when accept() fails with EMFILE: take every descriptor
 * the hard limit allows, then refuse a max_connections that does not fit well under it
 * (twice: connections past the limit hold an fd until the control agent closes them). */
static int raise_fd_limit(const struct dp_config *cfg)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		dp_set_error("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
		return -1;
	}
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t soft = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			DP_WARN("cannot raise RLIMIT_NOFILE from %lu to %lu: %s", (unsigned long)soft,
				(unsigned long)rl.rlim_max, strerror(errno));
			rl.rlim_cur = soft;
		}
	}
	uint64_t need = 2ull * cfg->max_connections + DP_FD_RESERVE;
	if (rl.rlim_cur != RLIM_INFINITY && need > (uint64_t)rl.rlim_cur) {
		dp_set_error("max_connections %u needs %lu file descriptors (twice it, and %d more); "
			     "RLIMIT_NOFILE is %lu: lower max_connections or raise the limit "
			     "(ulimit -Hn, LimitNOFILE=)",
			     cfg->max_connections, (unsigned long)need, DP_FD_RESERVE,
			     (unsigned long)rl.rlim_cur);
		return -1;
	}
	return 0;
}

static int init_world(struct dp_world *w)
{
	memset(w->duck_index, 0xff, sizeof(w->duck_index));
	for (uint32_t i = 0; i < w->cfg.nducks; i++)
		w->duck_index[w->cfg.ducks[i].id] = (int16_t)i;
	if (getrandom(&w->session, sizeof(w->session), 0) != sizeof(w->session))
		w->session = (uint64_t)dp_now_ns() ^ ((uint64_t)getpid() << 32);
	w->session &= 0x7fffffffffffffffull; /* a positive msgpack int for every client */
	w->epoch = 1;
	w->running = 1;
	dp_client_set_limits(&w->cfg, w->clients, DP_MAX_CLIENTS);
	w->nfwds = w->cfg.max_inflight;
	w->fwds = calloc(w->nfwds, sizeof(struct dp_fwd));
	if (!w->fwds)
		return -1;
	for (uint32_t i = 0; i < w->nfwds; i++) {
		w->fwds[i].index = i;
		w->fwds[i].rx = calloc(w->cfg.nducks, sizeof(struct dp_duck_rx));
		if (!w->fwds[i].rx)
			return -1;
	}
	if (dp_spsc_init(&w->free_ring, w->nfwds) < 0 || dp_spsc_init(&w->dispatch_done, w->nfwds) < 0)
		return -1;
	return 0;
}

/* Options, as DPDK's samples take them: ours, then "--" and the backend's (EAL) ones.
 * -1: go on with *config set; else the exit code (usage, --help, --backends). */
static int parse_args(int argc, char **argv, const char **config)
{
	static const struct option opts[] = { { "config", required_argument, NULL, 'c' },
					      { "verbose", no_argument, NULL, 'v' },
					      { "help", no_argument, NULL, 'h' },
					      { "backends", no_argument, NULL, 'B' },
					      { "remove-config", no_argument, NULL, 'R' },
					      { NULL, 0, NULL, 0 } };
	bool own_config = false;
	int opt;
	while ((opt = getopt_long(argc, argv, "c:vh", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			*config = optarg;
			break;
		case 'v':
			dp_log_min = DP_LOG_DEBUG;
			break;
		case 'R':
			own_config = true;
			break;
		case 'B': /* which backends this build has (tests skip dpdk without it) */
			printf("%s\n", dp_backend_names());
			return 0;
		default:
			usage(argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (!*config) {
		usage(argv[0]);
		return 2;
	}
	if (own_config) {
		config_to_remove = *config;
		atexit(remove_config);
	}
	/* everything after "--" belongs to the backend (EAL options for dpdk) */
	if (optind < argc) {
		world.backend_argc = argc - optind;
		world.backend_argv = argv + optind;
	}
	return -1;
}

/* The topology, and backend options only where a backend takes them: a typo after "--"
 * meant for the EAL fails here, not as a socket NIC that ignores it. 0, or the exit code. */
static int load_config(const char *config)
{
	if (dp_config_load(config, &world.cfg) < 0) {
		fprintf(stderr, "duckpipe-dataplane: config %s: %s\n", config, dp_error());
		return 1;
	}
	bool dpdk = false;
	for (uint32_t n = 0; n < world.cfg.nnics; n++)
		dpdk |= !strcmp(world.cfg.nics[n].backend, "dpdk");
	if (world.backend_argc && !dpdk) {
		fprintf(stderr, "duckpipe-dataplane: the %s backend takes no options "
				"(got '%s' after --); they are for the dpdk backend\n",
			world.cfg.nnics ? world.cfg.nics[0].backend : "socket", world.backend_argv[0]);
		return 2;
	}
	return 0;
}

/* Process-wide setup before any port or socket opens: the run directory, the backend's
 * arguments, file descriptors and the shared world. 0, or the exit code. */
static int init_process(const char *config)
{
	/* the run directory before any port: its refusal names the directory, whatever else
	 * holds this topology's ports (another user's dataplane on the default ones) */
	if (dp_stats_check(world.cfg.control) < 0) {
		fprintf(stderr, "duckpipe-dataplane: %s\n", dp_error());
		return 1;
	}
	/* the dpdk backend's first open hands them to rte_eal_init */
	dp_backend_args = (struct dp_backend_args){ .argc = world.backend_argc,
						    .argv = world.backend_argv };
	dp_accept_guard_init(); /* before anything can use up the descriptors */
	if (raise_fd_limit(&world.cfg) < 0) {
		fprintf(stderr, "duckpipe-dataplane: config %s: %s\n", config, dp_error());
		return 1;
	}
	if (init_world(&world) < 0) {
		fprintf(stderr, "duckpipe-dataplane: init: %s\n", dp_error());
		return 1;
	}
	return 0;
}

/* One worker per NIC: each opens its NIC's backend (the first dpdk one starts the EAL). */
static int init_workers(struct dp_worker **out)
{
	struct dp_worker *workers = calloc(world.cfg.nnics, sizeof(struct dp_worker));
	*out = workers;
	for (uint32_t n = 0; n < world.cfg.nnics; n++) {
		world.workers[n] = &workers[n];
		if (dp_worker_init(&workers[n], &world, n) < 0) {
			fprintf(stderr, "duckpipe-dataplane: dp_worker_init: %s\n", dp_error());
			return -1;
		}
	}
	return 0;
}

/* The agents in a fixed order (control, dispatcher, one worker per NIC): connect_rings
 * and the topology's cores[i] count on it. Returns how many. */
static uint32_t make_agents(struct dp_agent *agents, struct dp_control *control,
			    struct dp_dispatcher *dispatcher, struct dp_worker *workers)
{
	uint32_t nagents = 0;
	agents[nagents++] = (struct dp_agent){ .name = "control",
					       .do_work = dp_control_do_work,
					       .wait_on = dp_control_wait_on,
					       .park = dp_control_park,
					       .unpark = dp_control_unpark,
					       .self = control };
	agents[nagents++] = (struct dp_agent){ .name = "dispatch",
					       .do_work = dp_dispatch_do_work,
					       .wait_on = dp_dispatch_wait_on,
					       .park = dp_dispatch_park,
					       .unpark = dp_dispatch_unpark,
					       .self = dispatcher };
	static char names[DP_MAX_NICS][16];
	for (uint32_t n = 0; n < world.cfg.nnics; n++) {
		snprintf(names[n], sizeof(names[n]), "nic-%s", world.cfg.nics[n].name);
		agents[nagents++] = (struct dp_agent){ .name = names[n],
						       .do_work = dp_worker_do_work,
						       .wait_on = dp_worker_wait_on,
						       .park = dp_worker_park,
						       .unpark = dp_worker_unpark,
						       .expect = dp_worker_expect,
						       .self = &workers[n] };
	}
	return nagents;
}

/* The one line launchers wait for on stdout: the dataplane is up. */
static void print_banner(void)
{
	char shown_control[4 * sizeof(world.cfg.control)];
	printf("duckpipe-dataplane: %u ducks on %u NIC(s), control %s, %s threads (pid %d)\n",
	       world.cfg.nducks, world.cfg.nnics,
	       dp_printable(world.cfg.control, shown_control, sizeof(shown_control)),
	       world.cfg.dedicated_threads ? "dedicated" : "shared", getpid());
	fflush(stdout);
}

/* One shared thread runs control last: in a pass after a wake-up, the dispatcher and
 * the workers pick up the descriptor or complete the forward before control asks
 * ZeroMQ's sockets (a poll and a getpid each: docs/benchmarks.md, issue 19), and the
 * workers' completions reach control in the same pass. With a thread per agent the
 * array keeps its order: runner i takes the topology's cores[i]. */
static void order_shared(struct dp_agent *shared, const struct dp_agent *agents, uint32_t nagents)
{
	memcpy(shared, agents + 1, (nagents - 1) * sizeof(*agents));
	shared[nagents - 1] = agents[0];
}

/* A dpdk NIC's dedicated runner on its EAL worker lcore; its worker records where, for
 * Stats, as the EAL placed it. */
static void place_worker(struct runner *r, struct dp_worker *worker, unsigned k)
{
	place_on_lcore(r, k);
	/* for Stats: where it runs, as the EAL placed it */
	char cpus[64], *end;
	dp_lcore_cpus((unsigned)r->lcore, cpus, sizeof(cpus));
	long cpu = strtol(cpus, &end, 10);
	worker->lcore = r->lcore;
	worker->cpu = cpus[0] && !*end ? (int)cpu : -1;
}

/* A runner per agent (dedicated) or one for all (shared): its core, idle strategy and
 * waker. Returns how many, or -1 after saying which failed. */
static int init_runners(struct runner *runners, struct dp_agent *agents,
			struct dp_agent *shared, uint32_t nagents, struct dp_worker *workers)
{
	uint32_t nrunners = world.cfg.dedicated_threads ? nagents : 1;
	unsigned nlcores = 0;
	for (uint32_t i = 0; i < nrunners; i++) {
		runners[i] = (struct runner){ .agents = world.cfg.dedicated_threads ? &agents[i] : shared,
					      .n = world.cfg.dedicated_threads ? 1 : nagents,
					      .core = i < world.cfg.ncores ? world.cfg.cores[i] : -1,
					      .lcore = -1,
					      .name = world.cfg.dedicated_threads ? agents[i].name
										  : "dataplane" };
		if (world.cfg.dedicated_threads && i >= 2 && nic_is_dpdk(i - 2))
			place_worker(&runners[i], &workers[i - 2], nlcores++);
		/* a core of its own (cores, or an EAL lcore) spins; a shared one yields */
		dp_idle_init(&runners[i].idle, world.cfg.idle, world.cfg.idle_spin_us,
			     runners[i].core < 0 && runners[i].lcore < 0);
		if (setup_runner(&runners[i]) < 0) {
			fprintf(stderr, "duckpipe-dataplane: %s: %s\n", runners[i].name, dp_error());
			return -1;
		}
	}
	return (int)nrunners;
}

/* Every runner but the first on its thread or EAL lcore; the first is this thread's. */
static int launch_runners(struct runner *runners, pthread_t *threads, uint32_t nrunners)
{
	for (uint32_t i = 1; i < nrunners; i++) {
		if (runners[i].lcore >= 0) {
			DP_TSAN_RELEASE(&runners[i]);
			if (dp_lcore_launch((unsigned)runners[i].lcore, run_on_lcore, &runners[i]) < 0) {
				fprintf(stderr, "duckpipe-dataplane: %s: %s\n", runners[i].name, dp_error());
				return -1;
			}
		} else if (pthread_create(&threads[i], NULL, run, &runners[i])) {
			fprintf(stderr, "duckpipe-dataplane: pthread_create %s failed\n", runners[i].name);
			return -1;
		}
	}
	return 0;
}

/* After a stop signal: wait for every other runner to leave its loop. */
static void join_runners(struct runner *runners, pthread_t *threads, uint32_t nrunners)
{
	for (uint32_t i = 1; i < nrunners; i++) {
		if (runners[i].lcore >= 0) {
			dp_lcore_wait((unsigned)runners[i].lcore); /* rte_eal_wait_lcore */
			DP_TSAN_ACQUIRE(&runners[i]);
		} else {
			pthread_join(threads[i], NULL);
		}
	}
}

/* An orderly exit frees what it made (the last dpdk NIC's close ends the EAL), so that
 * sanitizers see no leak. */
static void fini_world(struct dp_control *control, struct dp_dispatcher *dispatcher,
		       struct dp_worker *workers)
{
	dp_control_free(control);
	dp_dispatch_free(dispatcher);
	for (uint32_t n = 0; n < world.cfg.nnics; n++)
		dp_worker_fini(&workers[n]);
	free(workers);
	for (uint32_t i = 0; i < world.nfwds; i++)
		free(world.fwds[i].rx);
	free(world.fwds);
	dp_spsc_free(&world.free_ring);
	dp_spsc_free(&world.dispatch_done);
}

int main(int argc, char **argv)
{
	const char *config = NULL;
	int rc = parse_args(argc, argv, &config);
	if (rc >= 0)
		return rc;
	if ((rc = load_config(config)) != 0 || (rc = init_process(config)) != 0)
		return rc;
	struct dp_worker *workers;
	if (init_workers(&workers) < 0)
		return 1;
	if (check_lcores() < 0) {
		fprintf(stderr, "duckpipe-dataplane: %s\n", dp_error());
		return 1;
	}
	struct dp_dispatcher *dispatcher = dp_dispatch_new(&world);
	struct dp_control *control = dp_control_new(&world);
	if (!dispatcher || !control) {
		fprintf(stderr, "duckpipe-dataplane: %s\n", dp_error());
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);

	struct dp_agent agents[MAX_AGENTS], shared[MAX_AGENTS];
	uint32_t nagents = make_agents(agents, control, dispatcher, workers);
	print_banner();
	order_shared(shared, agents, nagents);

	struct runner runners[MAX_AGENTS];
	pthread_t threads[MAX_AGENTS];
	int nrunners = init_runners(runners, agents, shared, nagents, workers);
	if (nrunners < 0)
		return 1;
	connect_rings(runners, (uint32_t)nrunners);
	if (launch_runners(runners, threads, (uint32_t)nrunners) < 0)
		return 1;
	run(&runners[0]);
	join_runners(runners, threads, (uint32_t)nrunners);
	fini_world(control, dispatcher, workers);
	fprintf(stderr, "duckpipe-dataplane: stopped\n");
	return 0;
}
