/* dp_tx.c: a NIC worker's transmit batch.
 *
 * Everything a worker sends goes through here. Messages collect in the worker's batch
 * (struct dp_tx_batch: dp_tx entries, their iovecs, and the headers and payloads of
 * the control datagrams, which must live until the flush) and go to the backend in
 * bursts, one tx_burst per flush (a sendmmsg for the socket backend). Activation
 * chunks are grouped into one GSO send where the backend can cut it into datagrams.
 * The backend is an ops table (dp_backend.h): the DPDK backend plugs in under this
 * layer, and what decides what to send (dp_gather.c, dp_weight.c, the worker's
 * PINGs) stays as it is.
 */
#include "dp_tx.h"

#include "dp_wire.h"

#define GSO_MAX_BYTES 65000u

/* --- transmit scratch ------------------------------------------------------------- */

void dp_tx_flush(struct dp_tx_batch *tx)
{
	if (tx->ntx)
		tx->be->ops->tx_burst(tx->be, tx->tx, tx->ntx);
	tx->ntx = tx->niov = tx->nctl = 0;
}

/* Room for `datagrams` more single-datagram messages; flushes first if needed. */
static void tx_reserve(struct dp_tx_batch *tx, uint32_t datagrams)
{
	if (tx->ntx + datagrams > DP_TX_BATCH || tx->niov + 2 * datagrams > DP_TX_IOV ||
	    tx->nctl + datagrams > DP_TX_BATCH)
		dp_tx_flush(tx);
}

/* A header (and DP_TX_CTL_PAYLOAD bytes behind *payload) that live until the flush. */
struct dp_wire_header *dp_tx_ctl_header(struct dp_tx_batch *tx, uint8_t op, uint64_t epoch,
					void **payload)
{
	tx_reserve(tx, 1);
	uint32_t i = tx->nctl++;
	struct dp_wire_header *h = &tx->ctl[i];
	dp_wire_init(h, op, tx->session, epoch);
	if (payload)
		*payload = tx->ctl_payload[i];
	return h;
}

/* One datagram: header + len payload bytes (ctl headers reserved their room already). */
void dp_tx_one(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
	       const struct dp_wire_header *h, const void *payload, uint32_t len)
{
	dp_tx_owned(tx, dst, h, payload, len, NULL);
}

void dp_tx_owned(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		 const struct dp_wire_header *h, const void *payload, uint32_t len,
		 struct dp_tx_owner *owner)
{
	if (tx->ntx + 1 > DP_TX_BATCH || tx->niov + 2 > DP_TX_IOV)
		dp_tx_flush(tx);
	struct iovec *iov = &tx->iov[tx->niov];
	iov[0].iov_base = (void *)h;
	iov[0].iov_len = DP_WIRE_HDR_LEN;
	iov[1].iov_base = (void *)payload;
	iov[1].iov_len = len;
	tx->tx[tx->ntx++] = (struct dp_tx){ .dst = dst, .iov = iov, .iovcnt = len ? 2 : 1,
					   .gso_size = 0, .datagrams = 1, .owner = owner };
	tx->niov += 2;
}

/* Chunks [first, first + n) of an activation to dst, cut by the kernel where it can. */
void dp_tx_activation(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		      const struct dp_wire_header *hdrs, const uint8_t *act,
		      struct dp_tx_owner *owner, uint32_t first, uint32_t n)
{
	uint32_t per = tx->payload + DP_WIRE_HDR_LEN;
	uint32_t group = 1;
	if (tx->be->gso) {
		group = GSO_MAX_BYTES / per;
		if (group > tx->be->max_gso_segments)
			group = tx->be->max_gso_segments;
		if (group == 0)
			group = 1; /* datagrams near 64 KiB (mtu 65535): one per send, never zero */
	}
	for (uint32_t c = first; c < first + n; c += group) {
		uint32_t k = first + n - c < group ? first + n - c : group;
		if (tx->ntx + 1 > DP_TX_BATCH || tx->niov + 2 * k > DP_TX_IOV)
			dp_tx_flush(tx);
		struct iovec *iov = &tx->iov[tx->niov];
		for (uint32_t j = 0; j < k; j++) {
			const struct dp_wire_header *h = &hdrs[c + j];
			iov[2 * j].iov_base = (void *)h;
			iov[2 * j].iov_len = DP_WIRE_HDR_LEN;
			iov[2 * j + 1].iov_base = (void *)(act + h->offset);
			iov[2 * j + 1].iov_len = h->length;
		}
		tx->tx[tx->ntx++] = (struct dp_tx){ .dst = dst, .iov = iov, .iovcnt = 2 * k,
						   .gso_size = k > 1 ? per : 0, .datagrams = k,
						   .owner = owner };
		tx->niov += 2 * k;
	}
}
