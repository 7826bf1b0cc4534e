/* dp_control_reply.c: every message the control agent sends goes out here, on the
 * ROUTER: a reply PACK put in c->sbuf, a completion from the outbox, an Error.
 *
 * A leaf of the control agent: the agent (dp_control.c), its requests, outbox and
 * housekeeping all call it, and it calls none of them, so the agent's parts form no
 * circle (tests/tools/test_layering.py).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <zmq.h>

#include "dp_common.h"
#include "dp_control_internal.h"

int dp_control_send_msg(struct dp_control *c, const uint8_t *id, size_t idlen,
			const void *msg, size_t len)
{
	dp_control_router_sent(c);
	/* DONTWAIT: a client that stopped reading must not stall the dataplane. Under
	 * ROUTER_MANDATORY the routing id's frame is the one refused, with nothing queued,
	 * when the peer is full (EAGAIN) or gone (EHOSTUNREACH); once it is taken the body
	 * goes to the same pipe, whose high-water mark it was checked against */
	if (zmq_send(c->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return -1;
	return zmq_send(c->router, msg, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

void dp_control_send_to(struct dp_control *c, const uint8_t *id, size_t idlen)
{
	if (dp_control_send_msg(c, id, idlen, c->sbuf.data, c->sbuf.size) < 0) {
		DP_DEBUG("reply dropped: %s", zmq_strerror(errno));
		dp_count(c->counters, DP_C_replies_dropped, 1);
	}
}

void dp_control_reply_error(struct dp_control *c, const uint8_t *id, size_t idlen,
			    uint64_t req_id, enum dp_error_code code, const char *message)
{
	PACK(c, error, .req_id = req_id, .code = code, .message = message);
	dp_control_send_to(c, id, idlen);
}

void dp_control_refuse(struct dp_control *c, const struct dp_peer *p, enum dp_error_code code,
		       const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (code == DP_ERROR_CODE_NOT_PERMITTED)
		dp_count(c->counters, DP_C_control_refused, 1);
	dp_control_reply_error(c, p->id, p->idlen, p->rid, code, msg);
}
