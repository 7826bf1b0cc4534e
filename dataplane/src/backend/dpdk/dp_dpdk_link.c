/* dp_dpdk_link.c: the port's link: waited for at open, watched while running.
 *
 * DPDK's l2fwd checks every port's link after rte_eth_dev_start (check_all_ports_link_
 * status: rte_eth_link_get_nowait every 100 ms for 9 s at most). Here, per NIC:
 *
 *   at open   up to the NIC's link_wait_ms for the link (an E810 negotiating takes
 *             seconds), logged with the time it took, or a warning when it did not come
 *             up: the NIC starts anyway, its forwards failing at once until it does.
 *   watching  a port that raises link interrupts (dev_flags RTE_ETH_DEV_INTR_LSC: ice,
 *             i40e...) gets intr_conf.lsc and an RTE_ETH_EVENT_INTR_LSC callback, which
 *             runs on the EAL's interrupt thread and only raises a flag; the worker reads
 *             the link (rte_eth_link_get_nowait) on its next rx_burst. Other ports are
 *             polled from rx_burst every LINK_POLL_MS.
 *   kernel    net_af_packet and net_af_xdp (22.11) say "up" from rte_eth_dev_start on,
 *             whatever their interface does (their link_update does nothing). Such a port
 *             names its kernel interface (dev_info.if_index): its IFF_UP and IFF_RUNNING
 *             (carrier) flags are read too (SIOCGIFFLAGS, about a microsecond), and its
 *             speed and duplex from /sys/class/net at a transition.
 *   down      b->link = DOWN (dp_backend.h): the backend sends nothing (tx_link_down
 *             counts the datagrams), the worker fails this NIC's forward parts at once
 *             naming the NIC (dp_worker.c), link_downs counts the transitions.
 *   up        logged with speed and duplex; a gratuitous ARP for host_ip and a fresh
 *             request for every duck (dp_dpdk_arp_refresh): a switch relearns the port,
 *             the ducks relearn the host, and a duck that moved is found.
 */
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_cycles.h>
#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"

#define LINK_POLL_MS 10      /* a port without link interrupts: read this often */
#define LINK_WAIT_STEP_US 10000 /* at open: between two reads */

struct link_now {
	bool up;
	uint32_t speed_mbps; /* 0: unknown */
	bool full_duplex;
};

/* RTE_ETH_EVENT_INTR_LSC, on the EAL's interrupt thread: only a flag for the worker. */
static int lsc_event(uint16_t port, enum rte_eth_event_type type, void *arg, void *ret)
{
	struct dpdk_priv *p = arg;
	(void)port;
	(void)type;
	(void)ret;
	dp_store_release_u32(&p->link_event, 1);
	return 0;
}

/* The kernel interface's speed (Mb/s) and duplex, from sysfs; false where it has none. */
static bool kernel_speed(const struct dpdk_priv *p, struct link_now *l)
{
	char path[64 + IF_NAMESIZE], buf[32];
	snprintf(path, sizeof(path), "/sys/class/net/%s/speed", p->link_ifname);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	long speed = fgets(buf, sizeof(buf), f) ? strtol(buf, NULL, 10) : -1;
	fclose(f);
	if (speed <= 0)
		return false;
	l->speed_mbps = (uint32_t)speed;
	snprintf(path, sizeof(path), "/sys/class/net/%s/duplex", p->link_ifname);
	if ((f = fopen(path, "r"))) {
		l->full_duplex = fgets(buf, sizeof(buf), f) && !strncmp(buf, "full", 4);
		fclose(f);
	}
	return true;
}

static struct link_now link_read(const struct dpdk_priv *p, bool with_speed)
{
	struct link_now now = { 0 };
	struct rte_eth_link l;
	memset(&l, 0, sizeof(l));
	if (rte_eth_link_get_nowait(p->port, &l) != 0)
		return now; /* taken as down: the port cannot say */
	now.up = l.link_status == RTE_ETH_LINK_UP;
	now.full_duplex = l.link_duplex == RTE_ETH_LINK_FULL_DUPLEX;
	now.speed_mbps = l.link_speed == RTE_ETH_SPEED_NUM_UNKNOWN ? 0 : l.link_speed;
	if (p->link_fd >= 0) {
		struct ifreq ifr;
		memset(&ifr, 0, sizeof(ifr));
		memcpy(ifr.ifr_name, p->link_ifname, sizeof(ifr.ifr_name));
		if (ioctl(p->link_fd, SIOCGIFFLAGS, &ifr) == 0)
			now.up = now.up && (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING);
		else
			now.up = false; /* the interface is gone */
		if (now.up && with_speed && !kernel_speed(p, &now))
			now.speed_mbps = 0;
	}
	if (!now.up)
		now.speed_mbps = 0;
	return now;
}

static void link_store(struct dp_backend *b, const struct link_now *l)
{
	dp_store_release_u32(&b->link_speed_mbps, l->speed_mbps);
	dp_store_release_u32(&b->link, l->up ? DP_LINK_STATE_UP : DP_LINK_STATE_DOWN);
}

static const char *describe(const struct dpdk_priv *p, char *out, size_t size)
{
	if (p->link_fd >= 0)
		snprintf(out, size, "port %u, kernel interface %s", p->port, p->link_ifname);
	else
		snprintf(out, size, "port %u, %s", p->port, p->link_lsc ? "link interrupts" : "polled");
	return out;
}

void dp_dpdk_link_conf(struct dpdk_priv *p, const struct rte_eth_dev_info *info,
		       struct rte_eth_conf *conf)
{
	p->link_fd = -1;
	p->link_lsc = info->dev_flags && (*info->dev_flags & RTE_ETH_DEV_INTR_LSC);
	conf->intr_conf.lsc = p->link_lsc ? 1 : 0;
	if (info->if_index > 0 && if_indextoname(info->if_index, p->link_ifname)) {
		p->link_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (p->link_fd < 0)
			DP_WARN("port %u: socket for SIOCGIFFLAGS: %s; the link of %s is not watched",
				p->port, strerror(errno), p->link_ifname);
	}
}

void dp_dpdk_link_start(struct dp_backend *b, struct dpdk_priv *p)
{
	const struct dp_nic_cfg *cfg = b->cfg;
	char what[96];
	int rc;
	if (p->link_lsc &&
	    (rc = rte_eth_dev_callback_register(p->port, RTE_ETH_EVENT_INTR_LSC, lsc_event, p)) != 0) {
		DP_WARN("nic %s: rte_eth_dev_callback_register(LSC): err=%d, port=%u; the link is "
			"polled instead", cfg->name, rc, p->port);
		p->link_lsc = false;
	}
	p->link_registered = p->link_lsc;
	uint64_t start = dp_now_ns(), waited;
	struct link_now l = link_read(p, false);
	while (!l.up && (waited = dp_now_ns() - start) < (uint64_t)cfg->link_wait_ms * 1000000) {
		rte_delay_us_sleep(LINK_WAIT_STEP_US);
		l = link_read(p, false);
	}
	waited = dp_now_ns() - start;
	if (l.up) {
		l = link_read(p, true);
		DP_INFO("nic %s: link up after %lu ms: %u Mb/s %s-duplex (%s)", cfg->name,
			(unsigned long)(waited / 1000000), l.speed_mbps,
			l.full_duplex ? "full" : "half", describe(p, what, sizeof(what)));
	} else {
		DP_WARN("nic %s: link down after waiting %u ms (link_wait_ms): starting anyway; "
			"forwards to its ducks fail at once until it comes up (%s)",
			cfg->name, cfg->link_wait_ms, describe(p, what, sizeof(what)));
		p->link_down_ns = dp_now_ns();
	}
	link_store(b, &l);
	p->link_next_ns = dp_now_ns() + (uint64_t)LINK_POLL_MS * 1000000;
}

void dp_dpdk_link_poll(struct dp_backend *b, struct dpdk_priv *p, uint64_t now)
{
	if (p->link_lsc) {
		if (!dp_load_acquire_u32(&p->link_event))
			return;
		dp_store_release_u32(&p->link_event, 0); /* before the read: a later event stays */
	} else {
		if (now < p->link_next_ns)
			return;
		p->link_next_ns = now + (uint64_t)LINK_POLL_MS * 1000000;
	}
	bool was_up = !dp_backend_link_down(b);
	struct link_now l = link_read(p, false);
	if (l.up == was_up)
		return;
	char what[96];
	if (!l.up) {
		link_store(b, &l);
		p->link_down_ns = now;
		dp_count(b->counters, DP_C_link_downs, 1);
		DP_WARN("nic %s: link down (%s): nothing is sent on it, and forwards to its ducks "
			"fail at once until it is up", b->cfg->name, describe(p, what, sizeof(what)));
		return;
	}
	l = link_read(p, true);
	link_store(b, &l);
	DP_INFO("nic %s: link up: %u Mb/s %s-duplex, after %lu ms down (%s); gratuitous ARP "
		"for the host, ARP requests for %u duck address(es)", b->cfg->name, l.speed_mbps,
		l.full_duplex ? "full" : "half",
		(unsigned long)(p->link_down_ns ? (now - p->link_down_ns) / 1000000 : 0),
		describe(p, what, sizeof(what)), dp_dpdk_arp_refresh(b, p, now));
}

void dp_dpdk_link_close(struct dpdk_priv *p)
{
	if (p->link_registered)
		(void)rte_eth_dev_callback_unregister(p->port, RTE_ETH_EVENT_INTR_LSC, lsc_event, p);
	p->link_registered = false;
	if (p->link_fd >= 0)
		close(p->link_fd);
	p->link_fd = -1;
}
