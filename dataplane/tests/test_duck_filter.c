/* test_duck_filter.c: the socket backend's duck filter (dp_duck_filter.h), run by the
 * kernel. Senders bound to loopback addresses play the ducks of two NICs; a receiver with
 * NIC 0's filter attached must get exactly its ducks' datagrams, and the kernel must
 * count the others in the socket's drops (SO_MEMINFO), where SO_RXQ_OVFL reads them.
 * One address holds 150 ducks: its block is longer than a conditional jump reaches.
 *
 * Standalone: exit 0 pass, 1 fail, 77 skip (no loopback addresses or socket filters).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/sock_diag.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dp_duck_filter.h"
#include "test_check.h"

#define CROWD 150 /* ducks on 127.0.0.2 */
#define MAX_SENDERS (CROWD + 8)

struct sender {
	int fd;
	struct sockaddr_in addr;
	int wanted; /* a duck of NIC 0 */
};

static struct sender senders[MAX_SENDERS];
static uint32_t nsenders;

/* A socket bound to ip (port chosen by the kernel); -1 when the address is missing. */
static int add_sender(const char *ip, int wanted)
{
	struct sender *s = &senders[nsenders];
	s->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	s->addr = (struct sockaddr_in){ .sin_family = AF_INET };
	inet_pton(AF_INET, ip, &s->addr.sin_addr);
	socklen_t len = sizeof(s->addr);
	if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&s->addr, sizeof(s->addr)) < 0 ||
	    getsockname(s->fd, (struct sockaddr *)&s->addr, &len) < 0)
		return -1;
	s->wanted = wanted;
	nsenders++;
	return 0;
}

static void add_duck(struct dp_config *cfg, const struct sender *s, uint16_t nic)
{
	struct dp_duck_cfg *d = &cfg->ducks[cfg->nducks];
	d->id = (uint16_t)cfg->nducks;
	d->nic = nic;
	d->addr = s->addr;
	cfg->nducks++;
}

static uint32_t drops(int fd)
{
	uint32_t mem[SK_MEMINFO_VARS] = { 0 };
	socklen_t len = sizeof(mem);
	if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) < 0)
		return UINT32_MAX;
	return mem[SK_MEMINFO_DROPS];
}

int main(void)
{
	static struct dp_config cfg;
	/* NIC 0: 150 ducks on 127.0.0.2, one on .3, two on .4; NIC 1: one on .5 */
	int missing = 0;
	for (int i = 0; i < CROWD; i++)
		missing |= add_sender("127.0.0.2", 1);
	missing |= add_sender("127.0.0.3", 1);
	missing |= add_sender("127.0.0.4", 1) | add_sender("127.0.0.4", 1);
	missing |= add_sender("127.0.0.5", 0); /* NIC 1's duck */
	uint32_t ducks = nsenders;
	/* no duck's: another port of a duck's address, an address of no duck */
	missing |= add_sender("127.0.0.2", 0) | add_sender("127.0.0.1", 0);
	if (missing) {
		printf("SKIP: cannot bind to 127.0.0.2-5 (%s)\n", strerror(errno));
		return 77;
	}
	for (uint32_t i = 0; i < ducks; i++)
		add_duck(&cfg, &senders[i], senders[i].wanted ? 0 : 1);

	static struct sock_filter code[DP_DUCK_FILTER_MAX];
	uint32_t n = dp_duck_filter_build(&cfg, 0, code);
	CHECK(n <= DP_DUCK_FILTER_MAX, "%u instructions", n);
	CHECK(n == 3 + 3 * 4 + 2 * (CROWD + 3) + 1, "%u instructions for 3 addresses", n);

	int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	struct sockaddr_in at = { .sin_family = AF_INET };
	inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
	socklen_t len = sizeof(at);
	struct sock_fprog prog = { .len = (unsigned short)n, .filter = code };
	if (setsockopt(rx, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0) {
		printf("SKIP: SO_ATTACH_FILTER: %s\n", strerror(errno));
		return 77;
	}
	if (bind(rx, (struct sockaddr *)&at, sizeof(at)) < 0 ||
	    getsockname(rx, (struct sockaddr *)&at, &len) < 0) {
		printf("FAIL: bind the receiver: %s\n", strerror(errno));
		return 1;
	}
	uint32_t want = 0;
	for (uint32_t i = 0; i < nsenders; i++) {
		CHECK(sendto(senders[i].fd, &i, sizeof(i), 0, (struct sockaddr *)&at, sizeof(at)) ==
			      sizeof(i), "send %u: %s", i, strerror(errno));
		want += (uint32_t)senders[i].wanted;
	}
	uint8_t got[MAX_SENDERS] = { 0 };
	uint32_t ngot = 0;
	struct pollfd p = { .fd = rx, .events = POLLIN };
	while (poll(&p, 1, ngot < want ? 2000 : 100) > 0) {
		uint32_t i;
		struct sockaddr_in src;
		socklen_t sl = sizeof(src);
		if (recvfrom(rx, &i, sizeof(i), 0, (struct sockaddr *)&src, &sl) != sizeof(i))
			break;
		CHECK(i < nsenders && src.sin_port == senders[i].addr.sin_port, "datagram %u", i);
		if (i < nsenders) {
			got[i]++;
			ngot++;
		}
	}
	for (uint32_t i = 0; i < nsenders; i++)
		CHECK(got[i] == senders[i].wanted, "sender %u (%s:%u, %s): got %u", i,
		      inet_ntoa(senders[i].addr.sin_addr), ntohs(senders[i].addr.sin_port),
		      senders[i].wanted ? "a duck of the NIC" : "not", got[i]);
	CHECK(drops(rx) == nsenders - want, "the kernel counted %u drops, %u were refused",
	      drops(rx), nsenders - want);

	/* a NIC without ducks refuses everything */
	CHECK(dp_duck_filter_build(&cfg, 2, code) == 4, "NIC 2: not just the refusal");
	for (uint32_t i = 0; i < nsenders; i++)
		close(senders[i].fd);
	close(rx);
	if (failures)
		return 1;
	printf("ok: %u of %u datagrams let through, %u instructions\n", want, nsenders, n);
	return 0;
}
