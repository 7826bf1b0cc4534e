/* dp_floor.h: what duckpipe-floor's two loops share (dp_floor.c: the dense floor, and
 * main; dp_floor_moe.c: the routed floor, `--moe`). */
#ifndef DP_FLOOR_H
#define DP_FLOOR_H

#include <stdint.h>
#include <stdio.h>

#include <netinet/in.h>

#include "dp_abi.h"

#define PROG "duckpipe-floor"
#define FLOOR_MAX_DUCKS 32u
#define FLOOR_MTU 1500u
#define FLOOR_RX_BUF 2048u
#define FLOOR_SOCK_BUF (32 << 20)

uint64_t floor_now_ns(void);
/* user + system CPU of this process so far (getrusage), ns */
uint64_t floor_cpu_ns(void);
void floor_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
uint64_t floor_parse_u64(const char *name, const char *val, uint64_t lo, uint64_t hi);
/* A UDP socket bound to 127.0.0.1:0 with 32 MiB buffers (forced where allowed). */
int floor_socket(void);
/* Announce layer `layer` (its shape in *w) to the duck with wire id `id` at *addr and
 * wait for its ack, up to five tries; exits saying so when it never comes. */
void floor_announce(int fd, const struct sockaddr_in *addr, uint32_t id, uint32_t layer,
		    uint64_t session, const struct dp_wire_layer *w);

/* duckpipe-floor --moe ... (dp_floor_moe.c) */
int floor_moe_main(int argc, char **argv);

#endif /* DP_FLOOR_H */
