/* dp_dpdk_intr.c: RX interrupts, so that a parked worker sleeps until a frame comes
 * instead of polling the port every DP_BACKEND_POLL_NS (l3fwd-power's interrupt mode).
 *
 *   which ports  those whose PMD gives RX queue 0 an event fd once the port is
 *                configured with intr_conf.rxq = 1 (rte_eth_dev_rx_intr_ctl_q_get_fd):
 *                net_tap (the fd is the queue's own tap fd: readable while frames wait,
 *                level-triggered, no enable needed), PCI NICs bound to vfio-pci (an
 *                eventfd per queue: ice, i40e, ixgbe...). net_af_packet and net_af_xdp
 *                (DPDK 22.11) have none: their parked workers keep polling.
 *   when         only where a worker can park (idle is not "spin"): a spinning worker
 *                never sleeps, and a NIC without the interrupt vectors is left as it was.
 *   arm          before the runner sleeps (dp_worker_park -> rx_arm): the queue's
 *                interrupt enabled (rte_eth_dev_rx_intr_enable; ENOTSUP on tap, whose fd
 *                needs none), then one look at the ring (rte_eth_rx_queue_count, where the
 *                PMD has it) for a frame that came between the last rx_burst and the
 *                enable: an eventfd fires on new frames only, and that one would wait for
 *                the next. The fd sits in the runner's epoll set from start (wait_fd).
 *   disarm       after the runner woke (dp_worker_unpark -> rx_disarm): the interrupt off
 *                again (a busy port must not interrupt), an eventfd read empty (tap's fd is
 *                the queue: reading it would take a frame), and rx_interrupt_wakeups
 *                counts the parks that ended with the fd readable.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <rte_ethdev.h>
#include <rte_log.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* Before rte_eth_dev_configure: ask for the RX queue's interrupt where a worker parks. */
void dp_dpdk_intr_conf(const struct dp_backend *b, struct rte_eth_conf *conf)
{
	conf->intr_conf.rxq = b->config->idle != DP_IDLE_SPIN;
}

static bool is_eventfd(int fd)
{
	char path[64], target[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = '\0';
	return strcmp(target, "anon_inode:[eventfd]") == 0;
}

/* After rte_eth_dev_start: the queue's fd, or -1 (a poll-mode port); logged either way. */
void dp_dpdk_intr_start(struct dp_backend *b, struct dpdk_priv *p, const struct rte_eth_conf *conf)
{
	p->rx_intr_fd = -1;
	if (!conf->intr_conf.rxq) {
		DP_INFO("nic %s: no RX interrupts (idle = \"spin\": the worker never parks)",
			b->cfg->name);
		return;
	}
	/* ethdev logs an error for every port without an interrupt handle (af_packet): here
	 * that is an answer, not an error */
	uint32_t level = (uint32_t)rte_log_get_level(rte_eth_dev_logtype);
	rte_log_set_level(rte_eth_dev_logtype, RTE_LOG_CRIT);
	int fd = rte_eth_dev_rx_intr_ctl_q_get_fd(p->port, 0);
	rte_log_set_level(rte_eth_dev_logtype, level);
	if (fd < 0) {
		DP_INFO("nic %s: port %u has no RX interrupts: a parked worker polls it every %llu us",
			b->cfg->name, p->port, DP_BACKEND_POLL_NS / 1000);
		return;
	}
	p->rx_intr_fd = fd;
	p->rx_intr_eventfd = is_eventfd(fd);
	(void)rte_eth_dev_rx_intr_disable(p->port, 0); /* armed only while parked */
	DP_INFO("nic %s: port %u RX interrupts: a parked worker sleeps on fd %d (%s)", b->cfg->name,
		p->port, fd, p->rx_intr_eventfd ? "eventfd" : "the queue's own fd");
}

int dp_dpdk_wait_fd(struct dp_backend *b)
{
	const struct dpdk_priv *p = b->priv;
	return p->rx_intr_fd;
}

bool dp_dpdk_rx_arm(struct dp_backend *b)
{
	struct dpdk_priv *p = b->priv;
	if (p->rx_intr_fd < 0)
		return false;
	int rc = rte_eth_dev_rx_intr_enable(p->port, 0);
	if (rc != 0 && rc != -ENOTSUP) {
		/* the interrupt will not come: poll from now on (wait_fd says -1) */
		DP_WARN("nic %s: rte_eth_dev_rx_intr_enable: err=%d, port=%u; polling it instead",
			b->cfg->name, rc, p->port);
		p->rx_intr_fd = -1;
		return true;
	}
	p->rx_intr_armed = true;
	return rte_eth_rx_queue_count(p->port, 0) > 0; /* -ENOTSUP: the fd is level-triggered */
}

void dp_dpdk_rx_disarm(struct dp_backend *b)
{
	struct dpdk_priv *p = b->priv;
	if (!p->rx_intr_armed)
		return;
	p->rx_intr_armed = false;
	(void)rte_eth_dev_rx_intr_disable(p->port, 0);
	struct pollfd pfd = { .fd = p->rx_intr_fd, .events = POLLIN };
	if (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN)) {
		dp_count(b->counters, DP_C_rx_interrupt_wakeups, 1);
		uint64_t events;
		if (p->rx_intr_eventfd)
			(void)!read(p->rx_intr_fd, &events, sizeof(events));
	}
}
