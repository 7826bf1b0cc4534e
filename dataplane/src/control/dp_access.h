/* dp_access.h: peer credentials, socket filters, CURVE and its ZAP handler. */
#ifndef DP_ACCESS_H
#define DP_ACCESS_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_config.h"

#define DP_MAX_CURVE_CLIENTS 256

struct dp_access {
	const struct dp_config *cfg;
	uint32_t euid;     /* the admin: the user who started the dataplane */
	bool ipc;          /* the endpoint is ipc://: peers have uid, gid, pid */
	bool has_group;    /* control_group: its members are clients, not admins */
	uint32_t group_gid;
	void *zap;         /* ZAP handler (REP) when CURVE is on */
	uint8_t curve_clients[DP_MAX_CURVE_CLIENTS][32];
	uint32_t ncurve_clients;
	uint64_t refused;  /* CURVE handshakes refused (the control agent counts them) */
};

/* Before bind: set the router's filters (ipc://) or make it a CURVE server with a ZAP
 * handler (tcp://); any other transport is refused. 0, or -1 with dp_error(). */
int dp_access_setup(struct dp_access *a, const struct dp_config *cfg, void *zctx, void *router);

/* Answer pending ZAP requests (call from the control agent's loop); how many. */
int dp_access_serve_zap(struct dp_access *a);

void dp_access_close(struct dp_access *a);

/* uid, gid, pid from the ":uid:gid:pid" tail libzmq gives an ipc peer's Peer-Address
 * (SO_PEERCRED); false when there is none (no credentials), and always when the control
 * endpoint is not ipc:// (a tcp:// peer's address is an IP, which may end in ":0:7:5"). */
bool dp_peer_credentials(const char *endpoint, const char *peer_address, uint32_t *uid,
			 uint32_t *gid, uint32_t *pid);

/* A pidfd for the process that connected on sockfd (the connection a request came in on,
 * ZMQ_SRCFD), whose credentials libzmq gave as uid, gid, pid: never the process that holds
 * pid now. -1 with dp_error() when the connection is closed, or that process has exited. */
int dp_peer_pidfd(int sockfd, uint32_t uid, uint32_t gid, uint32_t pid);

#endif /* DP_ACCESS_H */
