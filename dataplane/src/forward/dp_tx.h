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
#define DP_TX_MSG_HDRS 2048     /* headers of dp_tx_message's datagrams per flush */
#define DP_TX_MSG_PIECES 16     /* payload pieces of one datagram sent in place, at most */
#define DP_TX_SEND_IOV 1024     /* pieces of one send (the kernel's UIO_MAXIOV) */
#define DP_TX_BOUNCE (256u << 10) /* bytes of datagrams of more pieces, copied, per flush */

/* A message sent from where its bytes are (no staging copy): `tsize` bytes of table, then
 * rows of `row_bytes` each: rows[0], rows[1], ... contiguous, or with a map, row i at
 * rows + map[i] * row_bytes (a routed unicast: the duck's rows, straight from the slot).
 * Its datagrams' headers are made per send from `tpl` (chunk, offset and length set per
 * chunk). Where a datagram's payload would take more than DP_TX_MSG_PIECES pieces (rows
 * smaller than a datagram / 16), it is copied into the batch (counted by the caller from
 * dp_tx_message's return). */
struct dp_tx_msg {
	struct dp_wire_header tpl; /* chunks and total set; the rest of the FORWARD header */
	const uint8_t *table;
	uint64_t tsize;
	const uint8_t *rows;
	uint64_t row_bytes;
	const uint16_t *map; /* NULL: the rows are contiguous */
};

struct dp_tx_batch {
	struct dp_backend *be; /* the worker's: tx_burst, and whether it cuts GSO sends */
	uint64_t session;      /* the wire's session cookie (fixed before the workers start) */
	uint32_t payload;      /* bytes per datagram after the header: a GSO send's cut */
	uint32_t ntx, niov, nctl;
	struct dp_tx tx[DP_TX_BATCH];
	struct iovec iov[DP_TX_IOV];
	struct dp_wire_header ctl[DP_TX_BATCH]; /* headers of NACK, PING and LAYER datagrams */
	uint8_t ctl_payload[DP_TX_BATCH][DP_TX_CTL_PAYLOAD];
	uint32_t nhdr, nbounce;
	struct dp_wire_header hdr[DP_TX_MSG_HDRS]; /* dp_tx_message's headers */
	uint8_t bounce[DP_TX_BOUNCE];              /* its datagrams of too many pieces */
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

/* Queue chunks [first, first + n) of message m to dst, in GSO sends where the backend can
 * cut them; owner (a context's part on this NIC) answers for the rows (a client's slot)
 * and the table (the context's own), which the backend may send in place. Returns the
 * payload bytes it had to copy (datagrams of more than DP_TX_MSG_PIECES pieces). */
uint64_t dp_tx_message(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		       const struct dp_tx_msg *m, struct dp_tx_owner *owner, uint32_t first,
		       uint32_t n);

#endif /* DP_TX_H */
