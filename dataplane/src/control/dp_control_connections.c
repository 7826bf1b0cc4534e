/* dp_control_connections.c: the control socket's connections, counted from the ROUTER's
 * monitor (accepted, disconnected), and those past max_connections shut down as soon as
 * they are accepted. Called by the control agent's do_work (dp_control.c), which also
 * keeps the agent from parking during a flood (dp_control_park).
 */
#include "dp_control_internal.h"

#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

/* Count the router's connections from its monitor and close the ones past max_connections
 * as soon as they are accepted. libzmq 4.3 aborts the whole process when accept() fails
 * with EMFILE, so the number of connections anyone can hold must stay far below the fd
 * limit (checked at start, dp_main.c). zmq_unbind cannot pause accepting: it also drops
 * every connection accepted on the endpoint, attached clients' included. */
int dp_control_poll_monitor(struct dp_control *c)
{
	int work = 0;
	const uint32_t max = c->w->cfg.max_connections;
	for (;;) {
		uint8_t ev[6];
		int n = zmq_recv(c->monitor, ev, sizeof(ev), ZMQ_DONTWAIT);
		if (n < 0) {
			c->zmq_unsure &= ~(1u << DP_ZMQ_MONITOR); /* its fd says "look" again */
			break;
		}
		int more = 0;
		size_t sz = sizeof(more);
		zmq_getsockopt(c->monitor, ZMQ_RCVMORE, &more, &sz);
		while (more) { /* the endpoint's address: not needed */
			char junk[64];
			(void)zmq_recv(c->monitor, junk, sizeof(junk), 0);
			zmq_getsockopt(c->monitor, ZMQ_RCVMORE, &more, &sz);
		}
		work++;
		if (n != 6)
			continue;
		uint16_t event;
		int32_t fd;
		memcpy(&event, ev, 2);
		memcpy(&fd, ev + 2, 4);
		if (event == ZMQ_EVENT_ACCEPTED) {
			c->connections++;
			if (c->connections > max) {
				/* libzmq owns the fd: shutdown, never close, makes its engine see the
				 * end of the stream and close it (DISCONNECTED then counts it off).
				 * Had libzmq closed it already, the number could name a connection
				 * accepted since, normally past the limit too; a ZeroMQ peer whose
				 * connection is closed reconnects by itself. */
				shutdown(fd, SHUT_RDWR);
				dp_count(c->counters, DP_C_connections_refused, 1);
				if (!c->over_limit)
					DP_WARN("%u control connections: max_connections is %u; closing "
						"new ones until fewer than %u are open",
						c->connections - 1, max, max - max / 10);
				c->over_limit = true;
			}
		} else if (event == ZMQ_EVENT_DISCONNECTED && c->connections > 0) {
			c->connections--;
			if (c->over_limit && c->connections < max - max / 10) {
				DP_INFO("%u control connections: accepting again", c->connections);
				c->over_limit = false;
			}
		}
	}
	return work;
}
