/* dp_duck_filter.c: the duck filter's program (dp_duck_filter.h).
 *
 * At the filter a UDP socket's packet starts at the UDP header (the kernel has pulled
 * the IP header): offset 0 is the source port; the IPv4 source address is reached
 * through the network header, SKF_NET_OFF + 12. The program:
 *
 *   X = source port; A = source address
 *   per distinct duck address:  A == addr ? (A = X; port == p1 ? keep; ...; refuse) : next
 *   refuse
 *
 * A conditional jump reaches 255 instructions at most: the skip to the next address is a
 * BPF_JA (32-bit offset), and each keep is a return in place. BPF_ABS loads give host
 * order: addresses and ports are compared as such.
 */
#include <arpa/inet.h>
#include <stdbool.h>

#include "dp_duck_filter.h"

#define KEEP 0xFFFFFFFFu /* the whole datagram */

static uint32_t put(struct sock_filter *f, uint32_t n, uint16_t code, uint8_t jt, uint8_t jf,
		    uint32_t k)
{
	f[n] = (struct sock_filter){ .code = code, .jt = jt, .jf = jf, .k = k };
	return n + 1;
}

static bool same_address(const struct dp_duck_cfg *a, const struct dp_duck_cfg *b)
{
	return a->nic == b->nic && a->addr.sin_addr.s_addr == b->addr.sin_addr.s_addr;
}

/* The block of duck i's address (the first duck of the NIC with it): its ducks' ports. */
static uint32_t put_address(const struct dp_config *cfg, uint32_t i, struct sock_filter *f,
			    uint32_t n)
{
	const struct dp_duck_cfg *d = &cfg->ducks[i];
	uint32_t at = n;
	n = put(f, n, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, ntohl(d->addr.sin_addr.s_addr));
	n = put(f, n, BPF_JMP | BPF_JA, 0, 0, 0); /* k: past the block, set below */
	n = put(f, n, BPF_MISC | BPF_TXA, 0, 0, 0);
	for (uint32_t j = i; j < cfg->nducks; j++)
		if (same_address(&cfg->ducks[j], d)) {
			n = put(f, n, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, ntohs(cfg->ducks[j].addr.sin_port));
			n = put(f, n, BPF_RET | BPF_K, 0, 0, KEEP);
		}
	n = put(f, n, BPF_RET | BPF_K, 0, 0, 0); /* a duck's address, no duck's port */
	f[at + 1].k = n - (at + 2);
	return n;
}

uint32_t dp_duck_filter_build(const struct dp_config *cfg, uint32_t nic, struct sock_filter *f)
{
	uint32_t n = 0;
	n = put(f, n, BPF_LD | BPF_H | BPF_ABS, 0, 0, 0);
	n = put(f, n, BPF_MISC | BPF_TAX, 0, 0, 0);
	n = put(f, n, BPF_LD | BPF_W | BPF_ABS, 0, 0, (uint32_t)SKF_NET_OFF + 12);
	for (uint32_t i = 0; i < cfg->nducks; i++) {
		bool first = cfg->ducks[i].nic == nic;
		for (uint32_t j = 0; j < i && first; j++)
			first = !same_address(&cfg->ducks[j], &cfg->ducks[i]);
		if (first)
			n = put_address(cfg, i, f, n);
	}
	return put(f, n, BPF_RET | BPF_K, 0, 0, 0);
}
