/* dp_access.c: who may talk to the control socket.
 *
 * ipc:// endpoints admit the dataplane's own user, and the members of
 * control_group when one is configured, by the peer's SO_PEERCRED (libzmq's
 * ZMQ_IPC_FILTER_UID/GID, set before bind); the socket file's mode is the first
 * fence. Every message then carries its sender's uid, gid and pid in the
 * "Peer-Address" property, which the handlers use for roles and for Attach.
 * tcp:// endpoints are served only with CURVE keys, and a ZAP handler in the
 * control agent's loop admits the public keys of curve_clients_file.
 *
 * The pid in those credentials is the one that called connect(): the process may have
 * exited since and, the connection handed on, its pid be another process's (root's).
 * So whatever touches a client's process (Attach) goes through a pidfd of the process
 * that connected, from the connection itself (dp_peer_pidfd), never through the pid.
 */
#include "dp_access.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zmq.h>

#include "dp_client.h"
#include "dp_common.h"

/* "...:uid:gid:pid", the tail libzmq appends to an ipc peer's Peer-Address (SO_PEERCRED).
 * Only there: a tcp:// peer's Peer-Address is its IP address, and an IPv6 one such as
 * "2001:db8::0:7:5" has the same shape (uid 0 would make it the admin). */
bool dp_peer_credentials(const char *endpoint, const char *pa, uint32_t *uid, uint32_t *gid,
			 uint32_t *pid)
{
	unsigned long v[3];
	if (!endpoint || strncmp(endpoint, "ipc://", 6) != 0 || !pa)
		return false;
	const char *end = pa + strlen(pa);
	for (int k = 2; k >= 0; k--) {
		const char *colon = end;
		while (colon > pa && colon[-1] != ':')
			colon--;
		if (colon == pa || colon == end)
			return false;
		char num[16];
		size_t n = (size_t)(end - colon);
		if (n >= sizeof(num))
			return false;
		memcpy(num, colon, n);
		num[n] = '\0';
		for (size_t i = 0; i < n; i++)
			if (!isdigit((unsigned char)num[i]))
				return false;
		v[k] = strtoul(num, NULL, 10);
		if (v[k] > UINT32_MAX)
			return false;
		end = colon - 1;
	}
	*uid = (uint32_t)v[0];
	*gid = (uint32_t)v[1];
	*pid = (uint32_t)v[2];
	return true;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif

int dp_peer_pidfd(int sockfd, uint32_t uid, uint32_t gid, uint32_t pid)
{
	/* libzmq may have closed the connection since the request was read, and the number
	 * been given to another one: it must still be a socket with the request's peer */
	struct ucred cr;
	socklen_t len = sizeof(cr);
	if (sockfd < 0 || getsockopt(sockfd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
	    cr.uid != uid || cr.gid != gid || (uint32_t)cr.pid != pid) {
		dp_set_error("the connection this request came on has closed; reconnect");
		return -1;
	}
	/* the kernel keeps the peer's struct pid from connect(): SO_PEERPIDFD names the
	 * process that connected even after its pid is reused (it fails, or polls readable,
	 * once that process is gone). Before Linux 6.5 there is only the pid, taken here,
	 * at the request: a pid reused between connect and Attach is not caught there. */
	int pidfd = -1;
	len = sizeof(pidfd);
	if (getsockopt(sockfd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0) {
		pidfd = -1;
		if (errno == ENOPROTOOPT)
			pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	}
	if (pidfd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM)) {
		dp_set_error("cannot take a pidfd for pid %u: %s; retry", pid, strerror(errno));
		return -1;
	}
	if (pidfd < 0 || dp_pidfd_exited(pidfd)) {
		if (pidfd >= 0)
			dp_close_untracked(pidfd);
		dp_set_error("the process that opened this connection (pid %u) has exited: a "
			     "connection serves the process that made it; connect from this one",
			     pid);
		return -1;
	}
	return pidfd;
}

/* The ZAP requests libzmq makes for each CURVE handshake (RFC 27): admit the public keys
 * of curve_clients_file, refuse the rest. Runs in the control agent's loop. */
int dp_access_serve_zap(struct dp_access *a)
{
	int work = 0;
	while (a->zap) {
		char frames[8][64];
		int sizes[8], nf = 0, more = 1;
		size_t sz = sizeof(more);
		int len = zmq_recv(a->zap, frames[0], sizeof(frames[0]), ZMQ_DONTWAIT);
		if (len < 0)
			break;
		sizes[nf++] = len;
		zmq_getsockopt(a->zap, ZMQ_RCVMORE, &more, &sz);
		while (more) {
			char junk[64];
			char *dst = nf < 8 ? frames[nf] : junk;
			len = zmq_recv(a->zap, dst, 64, 0);
			if (nf < 8)
				sizes[nf++] = len;
			zmq_getsockopt(a->zap, ZMQ_RCVMORE, &more, &sz);
		}
		work++;
		/* version, request id, domain, address, routing id, mechanism, key */
		bool ok = false;
		if (nf >= 7 && sizes[5] == 5 && !memcmp(frames[5], "CURVE", 5) && sizes[6] == 32)
			for (uint32_t k = 0; k < a->ncurve_clients && !ok; k++)
				ok = !memcmp(a->curve_clients[k], frames[6], 32);
		if (!ok) {
			a->refused++;
			DP_WARN("refused a CURVE client whose key is not in %s",
				a->cfg->curve_clients_file);
		}
		int idlen = nf >= 2 && sizes[1] >= 0 && sizes[1] <= 64 ? sizes[1] : 0;
		zmq_send(a->zap, "1.0", 3, ZMQ_SNDMORE);
		zmq_send(a->zap, frames[1], (size_t)idlen, ZMQ_SNDMORE);
		zmq_send(a->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
		zmq_send(a->zap, ok ? "OK" : "unknown key", ok ? 2 : 11, ZMQ_SNDMORE);
		zmq_send(a->zap, "", 0, ZMQ_SNDMORE); /* user id */
		zmq_send(a->zap, "", 0, 0);           /* metadata */
	}
	return work;
}

/* One z85 key (40 characters) from a file, decoded. */
static int read_key(const char *path, uint8_t key[32])
{
	char text[128];
	FILE *f = fopen(path, "r");
	if (!f) {
		dp_set_error("cannot read CURVE key %s: %s", path, strerror(errno));
		return -1;
	}
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	while (n && isspace((unsigned char)text[n - 1]))
		n--;
	text[n] = '\0';
	if (n != 40 || !zmq_z85_decode(key, text)) {
		dp_set_error("%s does not hold one z85 CURVE key (40 characters)", path);
		return -1;
	}
	return 0;
}

static int setup_curve(struct dp_access *a, void *zctx, void *router)
{
	const struct dp_config *cfg = a->cfg;
	uint8_t secret[32], public[32];
	if (!cfg->curve_secret_key_file[0] || !cfg->curve_public_key_file[0] ||
	    !cfg->curve_clients_file[0]) {
		dp_set_error("tcp:// control needs CURVE: set curve_secret_key_file, "
			     "curve_public_key_file and curve_clients_file (or use ipc://)");
		return -1;
	}
	if (!zmq_has("curve")) {
		dp_set_error("this libzmq has no CURVE support; tcp:// control cannot be secured");
		return -1;
	}
	if (read_key(cfg->curve_secret_key_file, secret) < 0 ||
	    read_key(cfg->curve_public_key_file, public) < 0)
		return -1;
	FILE *f = fopen(cfg->curve_clients_file, "r");
	if (!f) {
		dp_set_error("cannot read %s: %s", cfg->curve_clients_file, strerror(errno));
		return -1;
	}
	char line[256];
	uint32_t lineno = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		size_t n = strlen(line);
		while (n && isspace((unsigned char)line[n - 1]))
			line[--n] = '\0';
		if (n == 0 || line[0] == '#')
			continue;
		if (n != 40 || a->ncurve_clients == DP_MAX_CURVE_CLIENTS ||
		    !zmq_z85_decode(a->curve_clients[a->ncurve_clients], line)) {
			fclose(f);
			dp_set_error("%s line %u: not a z85 public key (or more than %d keys)",
				     cfg->curve_clients_file, lineno, DP_MAX_CURVE_CLIENTS);
			return -1;
		}
		a->ncurve_clients++;
	}
	fclose(f);
	/* the handler must be bound before the first handshake can ask it */
	a->zap = zmq_socket(zctx, ZMQ_REP);
	int zero = 0, one = 1;
	zmq_setsockopt(a->zap, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_bind(a->zap, "inproc://zeromq.zap.01") < 0) {
		dp_set_error("cannot bind the ZAP handler: %s", zmq_strerror(errno));
		return -1;
	}
	if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, secret, 32) < 0 ||
	    zmq_setsockopt(router, ZMQ_CURVE_PUBLICKEY, public, 32) < 0 ||
	    zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, "duckpipe", 8) < 0) {
		dp_set_error("cannot make the control socket a CURVE server: %s",
			     zmq_strerror(errno));
		return -1;
	}
	memset(secret, 0, sizeof(secret));
	return 0;
}

int dp_access_setup(struct dp_access *a, const struct dp_config *cfg, void *zctx, void *router)
{
	memset(a, 0, sizeof(*a));
	a->cfg = cfg;
	a->euid = (uint32_t)geteuid();
	if (cfg->control_group[0]) {
		struct group *g = getgrnam(cfg->control_group);
		if (!g) {
			dp_set_error("control_group '%s' is not a group here", cfg->control_group);
			return -1;
		}
		a->has_group = true;
		a->group_gid = (uint32_t)g->gr_gid;
	}
	if (!strncmp(cfg->control, "ipc://", 6)) {
		a->ipc = true;
		int uid = (int)a->euid;
		if (zmq_setsockopt(router, ZMQ_IPC_FILTER_UID, &uid, sizeof(uid)) < 0) {
			dp_set_error("ZMQ_IPC_FILTER_UID: %s", zmq_strerror(errno));
			return -1;
		}
		if (a->has_group) {
			int gid = (int)a->group_gid;
			if (zmq_setsockopt(router, ZMQ_IPC_FILTER_GID, &gid, sizeof(gid)) < 0) {
				dp_set_error("ZMQ_IPC_FILTER_GID: %s", zmq_strerror(errno));
				return -1;
			}
		}
		return 0;
	}
	if (!strncmp(cfg->control, "tcp://", 6))
		return setup_curve(a, zctx, router);
	dp_set_error("control endpoint %s: only ipc:// (or tcp:// with CURVE keys) is served",
		     cfg->control);
	return -1;
}


void dp_access_close(struct dp_access *a)
{
	if (a->zap)
		zmq_close(a->zap);
	a->zap = NULL;
}
