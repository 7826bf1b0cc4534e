/* test_gro.c: cutting UDP GRO receives into datagrams (dp_gro.h), hostile sizes and cmsgs
 * included: every datagram handed out lies inside the receive, and is read whole here
 * from a buffer of exactly that size (so ASan, in the sanitizer build, sees any byte
 * past it).
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_gro.h"
#include "test_check.h"

#define MAX_OUT 4096

struct cut {
	uint32_t n;
	uint32_t len[MAX_OUT];
	uint32_t off[MAX_OUT];
	uint64_t sum; /* of every byte handed out: reads them all */
};

/* Cut a receive of len bytes (a heap buffer of exactly len, filled) with size seg. */
static struct cut cut(uint32_t len, uint32_t seg, bool truncated)
{
	static struct cut c;
	memset(&c, 0, sizeof(c));
	uint8_t *buf = malloc(len ? len : 1);
	for (uint32_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	struct dp_gro_cursor cur;
	dp_gro_start(&cur, buf, len, seg, truncated);
	uint8_t *p;
	uint32_t l;
	while (c.n < MAX_OUT && dp_gro_next(&cur, &p, &l)) {
		CHECK(p >= buf && l <= len && (uint32_t)(p - buf) <= len - l,
		      "len %u seg %u: datagram [%td, +%u) outside the receive", len, seg,
		      p - buf, l);
		if (!(p >= buf && l <= len && (uint32_t)(p - buf) <= len - l))
			break;
		c.off[c.n] = (uint32_t)(p - buf);
		c.len[c.n++] = l;
		for (uint32_t i = 0; i < l; i++)
			c.sum += p[i];
	}
	CHECK(c.n < MAX_OUT, "len %u seg %u: the cursor never ended", len, seg);
	CHECK(!dp_gro_next(&cur, &p, &l), "len %u seg %u: a datagram after the end", len, seg);
	free(buf);
	return c;
}

static void test_plain_cuts(void)
{
	/* ten 1,400-byte datagrams: what one GSO send of them gives on loopback */
	struct cut c = cut(14000, 1400, false);
	CHECK(c.n == 10, "14000 / 1400: %u datagrams", c.n);
	for (uint32_t i = 0; i < c.n; i++)
		CHECK(c.off[i] == 1400 * i && c.len[i] == 1400, "datagram %u at %u, %u bytes", i,
		      c.off[i], c.len[i]);
	/* a short last one: 3 x 1480 + 7 */
	c = cut(3 * 1480 + 7, 1480, false);
	CHECK(c.n == 4 && c.len[3] == 7 && c.off[3] == 3 * 1480, "short tail: %u, last %u at %u",
	      c.n, c.len[3], c.off[3]);
	/* no cmsg: the receive is one datagram */
	c = cut(1480, 0, false);
	CHECK(c.n == 1 && c.len[0] == 1480 && c.off[0] == 0, "no size: %u, %u", c.n, c.len[0]);
	/* a size of exactly the receive: one datagram */
	c = cut(1480, 1480, false);
	CHECK(c.n == 1 && c.len[0] == 1480, "size = receive: %u, %u", c.n, c.len[0]);
	/* a one-byte size cuts 65535 datagrams? no: MAX_OUT is smaller; 300 bytes do */
	c = cut(300, 1, false);
	CHECK(c.n == 300 && c.len[299] == 1 && c.off[299] == 299, "size 1: %u", c.n);
}

static void test_hostile_sizes(void)
{
	/* a size larger than the buffer: one datagram, never a read past it */
	struct cut c = cut(1000, 65535, false);
	CHECK(c.n == 1 && c.len[0] == 1000, "size > receive: %u, %u", c.n, c.len[0]);
	c = cut(1000, UINT32_MAX, false);
	CHECK(c.n == 1 && c.len[0] == 1000, "size 2^32-1: %u, %u", c.n, c.len[0]);
	/* an empty receive, with or without a size: one empty datagram (refused by the wire
	 * check), nothing read */
	c = cut(0, 0, false);
	CHECK(c.n == 1 && c.len[0] == 0, "empty: %u", c.n);
	c = cut(0, 1400, false);
	CHECK(c.n == 1 && c.len[0] == 0, "empty with a size: %u", c.n);
	/* truncated: the whole datagrams, then one empty entry for the one cut */
	c = cut(65536, 1480, true);
	CHECK(c.n == 65536 / 1480 + 1, "truncated: %u entries", c.n);
	CHECK(c.len[c.n - 1] == 0 && c.len[c.n - 2] == 1480, "truncated: last %u, before %u",
	      c.len[c.n - 1], c.len[c.n - 2]);
	/* truncated single datagram (no size): one empty entry, as the plain path's len 0 */
	c = cut(9216, 0, true);
	CHECK(c.n == 1 && c.len[0] == 0, "truncated single: %u, %u", c.n, c.len[0]);
	/* truncated, the size a divisor of the length: no partial one, still the marker */
	c = cut(4000, 1000, true);
	CHECK(c.n == 5 && c.len[3] == 1000 && c.len[4] == 0, "truncated even: %u", c.n);
}

/* The size dp_gro_cmsg_size finds in a control buffer of exactly len bytes (on the heap,
 * where ASan sees a read past it) holding the first len bytes the test wrote. */
static uint32_t size_from(const void *control, size_t len)
{
	void *buf = malloc(len ? len : 1);
	memcpy(buf, control, len);
	struct msghdr m = { .msg_control = buf, .msg_controllen = len };
	uint32_t size = dp_gro_cmsg_size(&m);
	free(buf);
	return size;
}

static void put_cmsg(char *at, int level, int type, size_t cmsg_len, int value)
{
	struct cmsghdr h = { .cmsg_len = cmsg_len, .cmsg_level = level, .cmsg_type = type };
	memcpy(at, &h, sizeof(h));
	memcpy(at + CMSG_LEN(0), &value, sizeof(value));
}

static void test_cmsgs(void)
{
	union {
		char buf[2 * CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, CMSG_LEN(sizeof(int)), 1480);
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(int))) == 1480, "a UDP_GRO cmsg");
	/* behind an SO_RXQ_OVFL one, as the socket gets them */
	memset(&u, 0, sizeof(u));
	put_cmsg(u.buf, SOL_SOCKET, SO_RXQ_OVFL, CMSG_LEN(sizeof(uint32_t)), 3);
	put_cmsg(u.buf + CMSG_SPACE(sizeof(uint32_t)), SOL_UDP, UDP_GRO, CMSG_LEN(sizeof(int)),
		 1400);
	CHECK(size_from(u.buf, sizeof(u.buf)) == 1400, "UDP_GRO second");
	/* none, a zero, a negative size, a cmsg too short to hold the int, an empty control */
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(uint32_t))) == 0, "only SO_RXQ_OVFL");
	memset(&u, 0, sizeof(u));
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, CMSG_LEN(sizeof(int)), 0);
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(int))) == 0, "size 0");
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, CMSG_LEN(sizeof(int)), -5);
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(int))) == 0, "negative size");
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, CMSG_LEN(1), 1480);
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(int))) == 0, "cmsg_len too short");
	CHECK(size_from(u.buf, 0) == 0, "no control");
	CHECK(size_from(u.buf, sizeof(struct cmsghdr) - 1) == 0, "control shorter than a header");
	/* a whole header but no room for its int: nothing read past the control buffer */
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, CMSG_LEN(sizeof(int)), 1480);
	CHECK(size_from(u.buf, CMSG_LEN(0)) == 0, "the int past the control buffer");
	/* a cmsg_len past the control buffer: the int itself is inside, so it counts */
	put_cmsg(u.buf, SOL_UDP, UDP_GRO, 4096, 1480);
	CHECK(size_from(u.buf, CMSG_SPACE(sizeof(int))) == 1480, "cmsg_len past the buffer");
}

int main(void)
{
	test_plain_cuts();
	test_hostile_sizes();
	test_cmsgs();
	return test_result("test_gro");
}
