/* dp_dpdk_flow.c: flow isolation, and rte_flow rules that steer the ducks' traffic to
 * the worker's RX queue.
 *
 * Isolation first (rte_flow_isolate, before rte_eth_dev_configure, as mlx5 wants): the
 * port's queue then receives only what a rule sends it. Then two ingress rules, made at
 * open and destroyed at close:
 *
 *   replies  ETH / IPV4 dst = host_ip / UDP dst = host_port  ->  QUEUE 0
 *   ARP      ETH type = 0x0806                               ->  QUEUE 0
 *
 * Isolated, the worker sees the ducks' replies and ARP and nothing else: on a bifurcated
 * driver (mlx5) the kernel keeps the rest of the port's traffic; on ice (flow director /
 * switch rules, with its DDP package) and net_tap the unmatched frames are dropped by
 * the port instead of costing the worker a parse each (rx_not_ours). Not isolated, queue
 * 0, the only one, gets every frame anyway and the rules change nothing there; they
 * matter only where the port spreads frames over more queues.
 *
 * Most virtual devices have neither (af_packet, af_xdp, null); net_tap has both through
 * TC (multiq, flower, skbedit), which the kernel must have. NIC's flow_steering:
 * "auto" isolates and steers where the port takes both, else logs once why and goes on
 * with every frame (a port isolated whose rules then failed is un-isolated again);
 * "require" fails the open naming the call and the port's reason unless both work;
 * "off" asks for nothing.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include <rte_byteorder.h>
#include <rte_flow.h>

#include "dp_common.h"
#include "dp_dpdk.h"

#define FLOW_QUEUE 0 /* the worker's RX queue */

static const char *why(const struct rte_flow_error *e)
{
	return e->message ? e->message : "no reason given";
}

/* Validate, then create, one rule; NULL with `err` filled in on failure. */
static struct rte_flow *make_rule(uint16_t port, const struct rte_flow_item *pattern,
				  const char *what, char *err, size_t errlen)
{
	static const struct rte_flow_attr attr = { .ingress = 1 };
	static const struct rte_flow_action_queue queue = { .index = FLOW_QUEUE };
	const struct rte_flow_action actions[] = {
		{ .type = RTE_FLOW_ACTION_TYPE_QUEUE, .conf = &queue },
		{ .type = RTE_FLOW_ACTION_TYPE_END },
	};
	struct rte_flow_error e = { 0 };
	int rc = rte_flow_validate(port, &attr, pattern, actions, &e);
	if (rc != 0) {
		snprintf(err, errlen, "rte_flow_validate(%s): %s (err=%d, type=%d), port=%u", what,
			 why(&e), rc, (int)e.type, port);
		return NULL;
	}
	memset(&e, 0, sizeof(e));
	struct rte_flow *f = rte_flow_create(port, &attr, pattern, actions, &e);
	if (!f)
		snprintf(err, errlen, "rte_flow_create(%s): %s (err=%d, type=%d), port=%u", what,
			 why(&e), rte_errno, (int)e.type, port);
	return f;
}

int dp_dpdk_flow_isolate(struct dp_backend *b, struct dpdk_priv *p)
{
	enum dp_flow_steering mode = b->cfg->flow_steering;
	if (mode == DP_FLOW_OFF)
		return 0;
	struct rte_flow_error e = { 0 };
	int rc = rte_flow_isolate(p->port, 1, &e);
	if (rc == 0) {
		p->flow_isolated = true;
		return 0;
	}
	if (mode == DP_FLOW_REQUIRE) {
		dp_set_error("flow_steering = \"require\", and the port cannot isolate: "
			     "rte_flow_isolate: %s (err=%d, type=%d), port=%u (\"auto\" goes on "
			     "without it)",
			     why(&e), rc, (int)e.type, p->port);
		return -1;
	}
	DP_INFO("nic %s: no flow isolation (flow_steering = \"auto\"): rte_flow_isolate: %s "
		"(err=%d), port=%u; the worker's queue gets every frame the port receives",
		b->cfg->name, why(&e), rc, p->port);
	return 0;
}

/* The rules failed on an isolated port ("auto"): give it its frames back (stopped, as
 * mlx5 wants). A port that will not leave isolation is warned about, not refused: net_tap
 * on a kernel without TC takes isolation as a flag it cannot act on, and gets every
 * frame all the same; a NIC that really isolates keeps its rules (the ARP one too). */
static int unisolate(struct dp_backend *b, struct dpdk_priv *p)
{
	struct rte_flow_error e = { 0 };
	int rc = rte_eth_dev_stop(p->port);
	if (rc == 0) {
		rc = rte_flow_isolate(p->port, 0, &e);
		int started = rte_eth_dev_start(p->port);
		if (started != 0) {
			dp_set_error("rte_eth_dev_start after leaving flow isolation: err=%d, port=%u",
				     started, p->port);
			return -1;
		}
	}
	if (rc != 0) {
		DP_WARN("nic %s: the port took flow isolation, refused the rules, and will not leave "
			"isolation: %s (err=%d), port=%u; if the ducks' replies do not arrive, set "
			"flow_steering = \"off\"",
			b->cfg->name, why(&e), rc, p->port);
		return 0;
	}
	p->flow_isolated = false;
	DP_INFO("nic %s: flow isolation undone: the port refused the rules", b->cfg->name);
	return 0;
}

int dp_dpdk_flow_open(struct dp_backend *b, struct dpdk_priv *p)
{
	enum dp_flow_steering mode = b->cfg->flow_steering;
	if (mode == DP_FLOW_OFF)
		return 0;
	const struct rte_flow_item_ipv4 ip_spec = { .hdr.dst_addr = p->host_ip };
	const struct rte_flow_item_ipv4 ip_mask = { .hdr.dst_addr = RTE_BE32(UINT32_MAX) };
	const struct rte_flow_item_udp udp_spec = { .hdr.dst_port = p->host_port };
	const struct rte_flow_item_udp udp_mask = { .hdr.dst_port = RTE_BE16(UINT16_MAX) };
	const struct rte_flow_item replies[] = {
		{ .type = RTE_FLOW_ITEM_TYPE_ETH },
		{ .type = RTE_FLOW_ITEM_TYPE_IPV4, .spec = &ip_spec, .mask = &ip_mask },
		{ .type = RTE_FLOW_ITEM_TYPE_UDP, .spec = &udp_spec, .mask = &udp_mask },
		{ .type = RTE_FLOW_ITEM_TYPE_END },
	};
	const struct rte_flow_item_eth arp_spec = { .hdr.ether_type = RTE_BE16(RTE_ETHER_TYPE_ARP) };
	const struct rte_flow_item_eth arp_mask = { .hdr.ether_type = RTE_BE16(UINT16_MAX) };
	const struct rte_flow_item arp[] = {
		{ .type = RTE_FLOW_ITEM_TYPE_ETH, .spec = &arp_spec, .mask = &arp_mask },
		{ .type = RTE_FLOW_ITEM_TYPE_END },
	};
	char err[256];
	p->flow_replies = make_rule(p->port, replies, "ETH/IPV4 dst/UDP dst -> QUEUE 0", err,
				    sizeof(err));
	if (p->flow_replies)
		p->flow_arp = make_rule(p->port, arp, "ETH type ARP -> QUEUE 0", err, sizeof(err));
	if (p->flow_replies && p->flow_arp) {
		DP_INFO("nic %s: rte_flow steers UDP to %s:%u and ARP to RX queue %u%s", b->cfg->name,
			inet_ntoa((struct in_addr){ .s_addr = p->host_ip }),
			rte_be_to_cpu_16(p->host_port), FLOW_QUEUE,
			p->flow_isolated ? ", isolated: the port drops or leaves to the kernel the rest"
					 : "");
		return 0;
	}
	dp_dpdk_flow_close(b, p); /* the one made, if any: both or none */
	if (mode == DP_FLOW_REQUIRE) {
		dp_set_error("flow_steering = \"require\", and the port has no such rule: %s "
			     "(\"auto\" goes on without it)",
			     err);
		return -1;
	}
	if (p->flow_isolated && unisolate(b, p) < 0)
		return -1;
	DP_INFO("nic %s: no rte_flow steering (flow_steering = \"auto\"): %s; every frame "
		"reaches the worker's one RX queue anyway",
		b->cfg->name, err);
	return 0;
}

void dp_dpdk_flow_close(struct dp_backend *b, struct dpdk_priv *p)
{
	struct rte_flow **rules[] = { &p->flow_arp, &p->flow_replies };
	for (size_t i = 0; i < DP_ARRAY_LEN(rules); i++) {
		if (!*rules[i])
			continue;
		struct rte_flow_error e = { 0 };
		if (rte_flow_destroy(p->port, *rules[i], &e) != 0)
			DP_WARN("nic %s: rte_flow_destroy: %s, port=%u", b->cfg->name, why(&e),
				p->port);
		*rules[i] = NULL;
	}
}
