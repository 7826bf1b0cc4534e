/* test_dpdk_txcount.c: the dpdk backend's tx_packets, tx_bytes and tx_errors are
 * exact when the port takes only part of a burst, and an open that fails after the port
 * started closes it (issue 18 point 7).
 *
 * The port is net_ring0: its TX enqueues on an rte_ring of 1023 frames that its RX
 * dequeues, and nothing dequeues until the end, so the ring fills part-way through a
 * burst and refuses the rest. Each message is a GSO group of 32 datagrams, 31 of 1000
 * bytes and a 10-byte tail: one burst each, and the burst the ring cuts leaves the short
 * tail out. What the ring holds (read back at the end, each frame's UDP length) is what
 * the counters must say. The failed open: net_ring1 with flow_steering = "require"
 * (net_ring has no rte_flow) fails after rte_eth_dev_start; the port must be closed
 * after, which for a vdev releases it (its name no longer finds a port). Exit 0 pass, 1 fail, 77 skip (no DPDK, or the EAL cannot start).
 */
#include <stdio.h>

#include "test_check.h"

#ifndef DP_HAVE_DPDK
int main(void)
{
	printf("test_dpdk_txcount: built without DPDK: skipped\n");
	return 77;
}
#else
#include <arpa/inet.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_backend.h"
#include "dp_common.h"
#include "dp_config.h"
#include "dp_dpdk.h"

#define SEG 1000u
#define TAIL 10u
#define PER_MSG 32u
#define MSGS 40u /* 1280 datagrams: more than the ring's 1023 */

/* The EAL's runtime directory, which it leaves behind (as test_extmem.c). */
static void remove_runtime_dir(const char *prefix)
{
	char dir[256], path[512];
	const char *base = getenv("XDG_RUNTIME_DIR");
	if (geteuid() == 0)
		snprintf(dir, sizeof(dir), "/var/run/dpdk/%s", prefix);
	else
		snprintf(dir, sizeof(dir), "%s/dpdk/%s", base ? base : "/tmp", prefix);
	DIR *d = opendir(dir);
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	closedir(d);
	rmdir(dir);
}

int main(void)
{
	char name[48], prefix[64];
	snprintf(name, sizeof(name), "dp-test-txcount-%d", (int)getpid());
	snprintf(prefix, sizeof(prefix), "--file-prefix=%s", name);
	char *eal[] = { "--no-pci", "--no-shconf", "--no-telemetry", "--log-level=error", "-l", "0",
			"--no-huge", "-m", "64", "--vdev=net_ring0", "--vdev=net_ring1", prefix };
	dp_backend_args = (struct dp_backend_args){ (int)DP_ARRAY_LEN(eal), eal };
	dp_log_min = DP_LOG_WARN;
	if (dp_dpdk_eal_get() < 0) { /* held: the failed open's put leaves the EAL up */
		remove_runtime_dir(name);
		printf("test_dpdk_txcount: the EAL does not start here (%s): skipped\n", dp_error());
		return 77;
	}

	static struct dp_config config;
	config.max_inflight = 1;
	config.max_forward_bytes = 1 << 16;
	config.nnics = 1;
	struct dp_nic_cfg *nic = &config.nics[0];
	snprintf(nic->name, sizeof(nic->name), "ring");
	snprintf(nic->backend, sizeof(nic->backend), "dpdk");
	snprintf(nic->interface, sizeof(nic->interface), "net_ring0");
	nic->host.sin_family = AF_INET;
	nic->host.sin_addr.s_addr = inet_addr("10.98.0.1");
	nic->host.sin_port = htons(47000);
	nic->broadcast.sin_family = AF_INET;
	nic->broadcast.sin_addr.s_addr = inet_addr("10.98.0.255");
	nic->broadcast.sin_port = htons(47001);
	nic->use_broadcast = true;
	nic->mtu = 1500;
	static struct dp_counters counters;
	static struct dp_backend be;

	/* an open that fails leaves no port behind (here at rte_flow_isolate, which "require"
	 * needs and net_ring lacks: the same close as every failure after configure) */
	snprintf(nic->interface, sizeof(nic->interface), "net_ring1");
	nic->flow_steering = DP_FLOW_REQUIRE;
	be = (struct dp_backend){ .ops = &dp_backend_dpdk, .cfg = nic, .config = &config,
				  .nic = 0, .counters = &counters };
	uint16_t port;
	CHECK(rte_eth_dev_get_port_by_name("net_ring1", &port) == 0, "no net_ring1 to start with");
	CHECK(be.ops->open(&be) < 0, "flow_steering = require opened on net_ring1 (no rte_flow)");
	CHECK(rte_eth_dev_get_port_by_name("net_ring1", &port) != 0,
	      "the failed open left net_ring1 open (port %u): rte_eth_dev_close skipped", port);
	printf("test_dpdk_txcount: the failed open said: %s\n", dp_error());

	snprintf(nic->interface, sizeof(nic->interface), "net_ring0");
	nic->flow_steering = DP_FLOW_AUTO;
	if (be.ops->open(&be) < 0) {
		dp_dpdk_eal_put();
		remove_runtime_dir(name);
		printf("test_dpdk_txcount: net_ring0 does not open here (%s): skipped\n", dp_error());
		return 77;
	}
	struct dpdk_priv *p = be.priv;

	static uint8_t payload[(PER_MSG - 1) * SEG + TAIL];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7);
	struct iovec iov = { payload, sizeof(payload) };
	uint64_t built = 0;
	for (uint32_t i = 0; i < MSGS; i++) {
		struct dp_tx tx = { .dst = &nic->broadcast, .iov = &iov, .iovcnt = 1,
				    .gso_size = SEG, .datagrams = PER_MSG };
		dp_dpdk_tx_burst(&be, &tx, 1);
		built += PER_MSG;
	}

	/* what the port took: the ring, read back through the port's RX */
	uint64_t frames = 0, bytes = 0;
	struct rte_mbuf *m[BURST];
	for (uint16_t got; (got = rte_eth_rx_burst(p->port, 0, m, BURST));) {
		for (uint16_t i = 0; i < got; i++) {
			const struct rte_udp_hdr *udp = rte_pktmbuf_mtod_offset(
				m[i], const struct rte_udp_hdr *,
				RTE_ETHER_HDR_LEN + sizeof(struct rte_ipv4_hdr));
			bytes += rte_be_to_cpu_16(udp->dgram_len) - sizeof(*udp);
			frames++;
		}
		rte_pktmbuf_free_bulk(m, got);
	}
	const uint64_t *c = counters.v;
	printf("test_dpdk_txcount: %lu datagrams built, the ring took %lu (%lu bytes); "
	       "tx_packets %lu tx_bytes %lu tx_errors %lu\n",
	       (unsigned long)built, (unsigned long)frames, (unsigned long)bytes,
	       (unsigned long)c[DP_C_tx_packets], (unsigned long)c[DP_C_tx_bytes],
	       (unsigned long)c[DP_C_tx_errors]);
	CHECK(frames > 0 && frames < built, "the ring took %lu of %lu: no partial burst to test",
	      (unsigned long)frames, (unsigned long)built);
	CHECK(frames % PER_MSG != 0, "the ring cut no burst part-way (%lu frames)",
	      (unsigned long)frames);
	CHECK(c[DP_C_tx_packets] == frames, "tx_packets %lu, the port took %lu",
	      (unsigned long)c[DP_C_tx_packets], (unsigned long)frames);
	CHECK(c[DP_C_tx_bytes] == bytes, "tx_bytes %lu, the port took %lu",
	      (unsigned long)c[DP_C_tx_bytes], (unsigned long)bytes);
	CHECK(c[DP_C_tx_errors] == built - frames, "tx_errors %lu, refused %lu",
	      (unsigned long)c[DP_C_tx_errors], (unsigned long)(built - frames));
	be.ops->close(&be);
	dp_dpdk_eal_put();
	remove_runtime_dir(name);
	return test_result("test_dpdk_txcount");
}
#endif
