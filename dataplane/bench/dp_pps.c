/* dp_pps.c: duckpipe-pps, the transmit side of `duckpipe bench pps` (issue 9 item 6).
 *
 * One NIC worker's transmit path, timed on its own: the dpdk backend opened through
 * its ops table (dp_backend_dpdk.c, EAL included) for a NIC whose `interface` is a
 * DPDK port (net_null0 in the bench), the worker's transmit batch (struct dp_tx_batch)
 * over it, and a forward's activation (its prepared headers and bytes) sent with the
 * calls the worker makes (dp_tx.c): dp_tx_activation queues its CHUNKS chunks
 * (GSO groups of up to 64), dp_tx_flush hands them to the backend, which builds each
 * Ethernet/IPv4/UDP frame to the NIC's broadcast address (ff:ff:ff:ff:ff:ff), copies
 * the wire header and payload into an mbuf and rte_eth_tx_burst's bursts of 32. The
 * activation is sent round and round: no frame is built from bytes the previous frame
 * brought into L1. --one sends each chunk as a message of its own (dp_tx_one, the path
 * of NACKs and PINGs), 32 per flush. Not in the number: the dispatcher, the client
 * rings, gathering replies (nothing answers on net_null).
 *
 *   duckpipe-pps [--cpu N] [--seconds S] [--mtu M] [--one] PAYLOAD... -- EAL options
 *
 * PAYLOAD is the UDP payload after the 80-byte wire header, in bytes, or "mtu" for
 * the largest one datagram of the NIC's mtu holds. Each is sent for S seconds (after
 * a 0.1 s warm-up); one line each on stdout:
 *   pps PAYLOAD_BYTES FRAME_BYTES PACKETS NANOSECONDS TX_ERRORS CPU_NANOSECONDS
 * (FRAME_BYTES: Ethernet header to the end of the UDP payload, no FCS; CPU_NANOSECONDS:
 * the sending thread's CPU time over the same NANOSECONDS of wall time).
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>

#include "dp_backend.h"
#include "dp_common.h"
#include "dp_config.h"
#include "dp_tx.h"
#include "dp_wire.h"

#define BATCH 32u   /* datagrams per dp_tx_flush: one rte_eth_tx_burst */
#define CHUNKS 2048u /* datagrams of the activation sent over and over (MTU: 2.8 MB) */
#define ETH_IP_UDP (14u + 20u + 8u)

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* This thread's CPU time: packets per CPU second hold still when other work shares the
 * CPU, where packets per wall second do not. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(void)
{
	fprintf(stderr, "usage: duckpipe-pps [--cpu N] [--seconds S] [--mtu M] [--one] PAYLOAD|mtu... "
			"-- EAL options (--no-pci --vdev=net_null0 ...)\n");
	exit(2);
}

/* Send the CHUNKS chunks of an activation (len payload bytes each, behind its own wire
 * header) over and over for ns nanoseconds; returns datagrams sent. As the worker sends a
 * forward: dp_tx_activation queues all its chunks (GSO groups of up to 64 datagrams),
 * dp_tx_flush hands them to the backend, which sends them in tx bursts of 32. With one,
 * each chunk is a message of its own (dp_tx_one, as NACKs and PINGs go), flushed every
 * BATCH. */
static uint64_t blast(struct dp_tx_batch *tx, const struct dp_wire_header *hdrs,
		      const uint8_t *act, struct dp_tx_owner *owner, const struct sockaddr_in *dst,
		      bool one, uint64_t ns, uint64_t *took)
{
	struct dp_counters *c = tx->be->counters;
	uint64_t before = c->v[DP_C_tx_packets];
	uint64_t start = now_ns(), now = start;
	do {
		if (one) {
			for (uint32_t i = 0; i < CHUNKS; i++) {
				dp_tx_one(tx, dst, &hdrs[i], act + hdrs[i].offset, tx->payload);
				if ((i + 1) % BATCH == 0)
					dp_tx_flush(tx);
			}
		} else {
			dp_tx_activation(tx, dst, hdrs, act, owner, 0, CHUNKS);
		}
		dp_tx_flush(tx);
		now = now_ns();
	} while (now - start < ns);
	*took = now - start;
	return c->v[DP_C_tx_packets] - before;
}

int main(int argc, char **argv)
{
	int cpu = -1;
	double seconds = 1.0;
	uint32_t mtu = 1500;
	const char *sizes[16];
	bool one = false;
	int nsizes = 0, i;
	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (!strcmp(argv[i], "--cpu") && i + 1 < argc)
			cpu = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--mtu") && i + 1 < argc)
			mtu = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--one"))
			one = true;
		else if (argv[i][0] != '-' && nsizes < 16)
			sizes[nsizes++] = argv[i];
		else
			usage();
	}
	if (i == argc || nsizes == 0 || seconds <= 0 || mtu < 576 || mtu > 9000)
		usage();
	dp_backend_args.argc = argc - i - 1;
	dp_backend_args.argv = argv + i + 1;

	static struct dp_config config;
	config.max_inflight = 1;
	config.max_forward_bytes = 1 << 16;
	struct dp_nic_cfg *nic = &config.nics[0];
	config.nnics = 1;
	snprintf(nic->name, sizeof(nic->name), "pps");
	snprintf(nic->backend, sizeof(nic->backend), "dpdk");
	snprintf(nic->interface, sizeof(nic->interface), "net_null0");
	nic->host.sin_family = AF_INET;
	nic->host.sin_addr.s_addr = inet_addr("10.99.0.1");
	nic->host.sin_port = htons(47000);
	nic->broadcast.sin_family = AF_INET;
	nic->broadcast.sin_addr.s_addr = inet_addr("10.99.0.255");
	nic->broadcast.sin_port = htons(47001);
	nic->use_broadcast = true;
	nic->mtu = mtu;

	static struct dp_counters counters;
	static struct dp_backend be;
	struct dp_tx_batch *tx = calloc(1, sizeof(*tx));
	if (!tx) {
		fprintf(stderr, "duckpipe-pps: out of memory\n");
		return 1;
	}
	be = (struct dp_backend){ .ops = &dp_backend_dpdk, .cfg = nic, .config = &config,
				  .nic = 0, .counters = &counters };
	tx->be = &be;
	if (be.ops->open(&be) < 0) {
		fprintf(stderr, "duckpipe-pps: opening the dpdk backend: %s\n", dp_error());
		return 1;
	}
	if (cpu >= 0) { /* the backend put the EAL's pinning back: pin here */
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0)
			fprintf(stderr, "duckpipe-pps: sched_setaffinity(%d): %s\n", cpu,
				strerror(errno));
	}
	uint32_t max_payload = mtu - 20u - 8u - DP_WIRE_HDR_LEN; /* mtu >= 576: > 0 */
	/* an activation and its chunks' wire headers: no frame reads bytes the previous
	 * one did (the payload comes from L3 or beyond at MTU, as a client's would) */
	uint8_t *act = malloc((size_t)CHUNKS * max_payload);
	struct dp_wire_header *hdrs = calloc(CHUNKS, sizeof(*hdrs));
	if (!act || !hdrs) {
		fprintf(stderr, "duckpipe-pps: out of memory\n");
		return 1;
	}
	for (size_t k = 0; k < (size_t)CHUNKS * max_payload; k++)
		act[k] = (uint8_t)(k * 7);
	for (uint32_t k = 0; k < CHUNKS; k++)
		dp_wire_init(&hdrs[k], DP_WIRE_OP_FORWARD, 1, 1);
	/* the owner a forward's part on the NIC would be; it names no memory, so the port
	 * copies every payload (dp_dpdk_zc_attach) */
	static struct dp_tx_owner owner;
	int rc = 0;
	for (int s = 0; s < nsizes; s++) {
		uint32_t len = !strcmp(sizes[s], "mtu") ? max_payload : (uint32_t)atoi(sizes[s]);
		if (len > max_payload) {
			fprintf(stderr, "duckpipe-pps: payload %u is more than mtu %u carries (%u)\n",
				len, mtu, max_payload);
			rc = 2;
			break;
		}
		for (uint32_t k = 0; k < CHUNKS; k++) {
			hdrs[k].chunk = k;
			hdrs[k].chunks = CHUNKS;
			hdrs[k].offset = (uint64_t)k * len;
			hdrs[k].total = (uint64_t)CHUNKS * len;
			hdrs[k].length = len;
		}
		tx->payload = len;
		uint64_t took, errors = counters.v[DP_C_tx_errors];
		(void)blast(tx, hdrs, act, &owner, &nic->broadcast, one, 100000000ull, &took);
		uint64_t cpu0 = thread_cpu_ns();
		uint64_t sent = blast(tx, hdrs, act, &owner, &nic->broadcast, one,
				      (uint64_t)(seconds * 1e9), &took);
		printf("pps %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", len,
		       ETH_IP_UDP + DP_WIRE_HDR_LEN + len, sent, took,
		       counters.v[DP_C_tx_errors] - errors, thread_cpu_ns() - cpu0);
		fflush(stdout);
	}
	be.ops->close(&be);
	free(act);
	free(hdrs);
	free(tx);
	return rc;
}
