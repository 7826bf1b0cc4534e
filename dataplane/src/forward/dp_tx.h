/* dp_tx.h: a NIC worker's transmit batch (dp_tx.c). Messages queue in the worker's
 * tx scratch (struct dp_worker) until dp_tx_flush hands them to the backend as one
 * burst; what they point at (headers, payloads) must live until then. */
#ifndef DP_TX_H
#define DP_TX_H

#include <stdint.h>

struct dp_worker;
struct dp_fwd;
struct dp_wire_header;
struct sockaddr_in;
struct dp_tx_owner;

/* Send what is queued (the backend's tx_burst) and empty the scratch. */
void dp_tx_flush(struct dp_worker *wk);
/* A header for op (and DP_WORKER_CTL_PAYLOAD bytes behind *payload, if asked) that live
 * until the flush, with room for its datagram reserved. */
struct dp_wire_header *dp_tx_ctl_header(struct dp_worker *wk, uint8_t op, uint64_t epoch,
					void **payload);
/* Queue one datagram: header + len payload bytes. */
void dp_tx_one(struct dp_worker *wk, const struct sockaddr_in *dst,
	       const struct dp_wire_header *h, const void *payload, uint32_t len);
/* The same, with a payload in a client's slot that owner (a context's part on this NIC)
 * answers for: the backend may send it in place (zero copy, dp_backend.h). */
void dp_tx_owned(struct dp_worker *wk, const struct sockaddr_in *dst,
		 const struct dp_wire_header *h, const void *payload, uint32_t len,
		 struct dp_tx_owner *owner);
/* Queue chunks [first, first + n) of f's activation (its prepared headers) to dst, in
 * GSO sends where the backend can cut them; owned by f's part on this NIC. */
void dp_tx_activation(struct dp_worker *wk, struct dp_fwd *f, const struct sockaddr_in *dst,
		      uint32_t first, uint32_t n);

#endif /* DP_TX_H */
