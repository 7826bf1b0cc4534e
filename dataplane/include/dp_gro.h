/* dp_gro.h: cutting a UDP GRO receive back into its datagrams (the socket backend).
 *
 * With setsockopt(SOL_UDP, UDP_GRO, 1) one recvmsg may return several datagrams of one
 * sender glued together (a GSO send, or datagrams the kernel merged on the way in), and
 * a UDP_GRO cmsg (an int) says how long each was: every one is that long but the last,
 * which may be shorter. Without the cmsg the buffer is one datagram.
 *
 * The cmsg and the length are the kernel's, but they are read like a packet: a size of
 * 0, one past the buffer, or a cmsg too short to hold it all leave the buffer one
 * datagram; a truncated receive (MSG_TRUNC: more than the buffer held) gives its whole
 * datagrams and then one empty entry for what was cut, which the wire check refuses and
 * counts. Nothing here reads the payload: it hands out [ptr, ptr + len) ranges that lie
 * inside [buf, buf + len) of the receive, and test_gro.c checks that they do.
 */
#ifndef DP_GRO_H
#define DP_GRO_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "dp_udp.h"

/* The datagram size a UDP_GRO cmsg of m gives, or 0 (no cmsg, or a malformed one). */
static inline uint32_t dp_gro_cmsg_size(struct msghdr *m)
{
	if (m->msg_controllen < sizeof(struct cmsghdr))
		return 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
		if (c->cmsg_level != SOL_UDP || c->cmsg_type != UDP_GRO)
			continue;
		/* its int must be in the cmsg and the cmsg in the control buffer */
		const char *end = (const char *)m->msg_control + m->msg_controllen;
		if (c->cmsg_len < CMSG_LEN(sizeof(int)) ||
		    (size_t)(end - (const char *)CMSG_DATA(c)) < sizeof(int))
			return 0;
		int size;
		memcpy(&size, CMSG_DATA(c), sizeof(size));
		return size > 0 ? (uint32_t)size : 0;
	}
	return 0;
}

/* One receive being handed out datagram by datagram. */
struct dp_gro_cursor {
	uint8_t *buf;
	uint32_t len;  /* bytes received (whole datagrams only, when truncated) */
	uint32_t seg;  /* datagram size; 0: the buffer is one datagram */
	uint32_t off;  /* the next datagram starts here */
	bool cut_tail; /* truncated: one empty entry follows the whole datagrams */
	bool done;
};

/* buf holds len bytes of one receive; seg is dp_gro_cmsg_size's; truncated: MSG_TRUNC. */
static inline void dp_gro_start(struct dp_gro_cursor *c, uint8_t *buf, uint32_t len,
				uint32_t seg, bool truncated)
{
	c->buf = buf;
	c->off = 0;
	c->done = false;
	c->cut_tail = false;
	/* a size that cuts nothing (0, or the whole buffer or more) leaves one datagram */
	c->seg = seg && seg < len ? seg : 0;
	c->len = len;
	if (truncated) {
		/* one datagram cut short: refused as a whole (the plain path's len 0); several:
		 * the whole ones stand, the one the buffer ended in is lost */
		c->len = c->seg ? len - len % c->seg : 0;
		c->cut_tail = c->seg != 0;
	}
}

/* The next datagram: true with *ptr and *len set, false once the receive is used up. */
static inline bool dp_gro_next(struct dp_gro_cursor *c, uint8_t **ptr, uint32_t *len)
{
	if (c->done)
		return false;
	if (!c->seg) { /* one datagram: the whole (or empty) buffer */
		*ptr = c->buf;
		*len = c->len;
		c->done = true;
		return true;
	}
	if (c->off < c->len) {
		uint32_t left = c->len - c->off;
		*ptr = c->buf + c->off;
		*len = left < c->seg ? left : c->seg;
		c->off += *len;
		if (c->off == c->len && !c->cut_tail)
			c->done = true;
		return true;
	}
	/* only a truncated receive gets here: its cut datagram, empty */
	*ptr = c->buf + c->len;
	*len = 0;
	c->done = true;
	return true;
}

#endif /* DP_GRO_H */
