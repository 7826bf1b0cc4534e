/* dp_tx.h: a NIC worker's transmit batch (dp_tx.c). Messages queue in a struct
 * dp_tx_batch, which the worker owns and hands to the modules that send (dp_gather.c,
 * dp_weight.c), until dp_tx_flush gives them to the backend as one burst; what they
 * point at (headers, payloads) must live until then. A leaf: it knows the backend and
 * the wire header, not the worker nor forward contexts. */
#ifndef DP_TX_H
#define DP_TX_H

#include <stdint.h>
#include <sys/uio.h>

#include "dp_abi.h"
#include "dp_backend.h"

#define DP_TX_BATCH 1024        /* messages per flush */
#define DP_TX_IOV 4096          /* their pieces: a header and a payload per datagram */
#define DP_TX_CTL_PAYLOAD 256   /* a NACK lists up to 64 chunks; the next NACK the rest */

struct dp_tx_batch {
	struct dp_backend *be; /* the worker's: tx_burst, and whether it cuts GSO sends */
	uint64_t session;      /* the wire's session cookie (fixed before the workers start) */
	uint32_t payload;      /* bytes per datagram after the header: a GSO send's cut */
	uint32_t ntx, niov, nctl;
	struct dp_tx tx[DP_TX_BATCH];
	struct iovec iov[DP_TX_IOV];
	struct dp_wire_header ctl[DP_TX_BATCH]; /* headers of NACK, PING and LAYER datagrams */
	uint8_t ctl_payload[DP_TX_BATCH][DP_TX_CTL_PAYLOAD];
};

/* Send what is queued (the backend's tx_burst) and empty the batch. */
void dp_tx_flush(struct dp_tx_batch *tx);
/* A header for op (and DP_TX_CTL_PAYLOAD bytes behind *payload, if asked) that live
 * until the flush, with room for its datagram reserved. */
struct dp_wire_header *dp_tx_ctl_header(struct dp_tx_batch *tx, uint8_t op, uint64_t epoch,
					void **payload);
/* Queue one datagram: header + len payload bytes. */
void dp_tx_one(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
	       const struct dp_wire_header *h, const void *payload, uint32_t len);
/* The same, with a payload in a client's slot that owner (a context's part on this NIC)
 * answers for: the backend may send it in place (zero copy, dp_backend.h). */
void dp_tx_owned(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		 const struct dp_wire_header *h, const void *payload, uint32_t len,
		 struct dp_tx_owner *owner);
/* Queue chunks [first, first + n) of an activation to dst: hdrs are its prepared
 * headers (one per chunk), act its bytes (chunk c at hdrs[c].offset), owner its part on
 * this NIC; in GSO sends where the backend can cut them. */
void dp_tx_activation(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		      const struct dp_wire_header *hdrs, const uint8_t *act,
		      struct dp_tx_owner *owner, uint32_t first, uint32_t n);

#endif /* DP_TX_H */
