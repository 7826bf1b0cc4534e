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
	tx->ntx = tx->niov = tx->nctl = tx->nhdr = tx->nbounce = 0;
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

/* --- a message from where its bytes are ------------------------------------------------ */

/* The pieces of bytes [off, off + len) of m into iov (at most max): 0 when they take more
 * (the caller copies them). Rows next to each other in memory make one piece. */
static uint32_t msg_pieces(const struct dp_tx_msg *m, uint64_t off, uint64_t len,
			   struct iovec *iov, uint32_t max)
{
	uint32_t n = 0;
	if (off < m->tsize) {
		uint64_t k = m->tsize - off < len ? m->tsize - off : len;
		iov[n++] = (struct iovec){ (void *)(m->table + off), k };
		off += k;
		len -= k;
	}
	off -= m->tsize; /* now in the rows */
	if (len && !m->map) {
		if (n == max)
			return 0;
		iov[n++] = (struct iovec){ (void *)(m->rows + off), len };
		return n;
	}
	while (len) {
		uint64_t r = off / m->row_bytes, in = off % m->row_bytes;
		uint64_t k = m->row_bytes - in < len ? m->row_bytes - in : len;
		const uint8_t *at = m->rows + (uint64_t)m->map[r] * m->row_bytes + in;
		if (n && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == at) {
			iov[n - 1].iov_len += k; /* the next row in the slot too: one piece */
		} else {
			if (n == max)
				return 0;
			iov[n++] = (struct iovec){ (void *)at, k };
		}
		off += k;
		len -= k;
	}
	return n;
}

/* Copy bytes [off, off + len) of m to out. */
static void msg_copy(const struct dp_tx_msg *m, uint64_t off, uint64_t len, uint8_t *out)
{
	struct iovec one;
	while (len) {
		uint64_t k = len;
		if (off >= m->tsize && m->map) /* up to the end of the row */
			k = m->row_bytes - (off - m->tsize) % m->row_bytes;
		if (off < m->tsize)
			k = m->tsize - off;
		if (k > len)
			k = len;
		msg_pieces(m, off, k, &one, 1); /* one piece: within the table or one row */
		memcpy(out, one.iov_base, k);
		out += k;
		off += k;
		len -= k;
	}
}

uint64_t dp_tx_message(struct dp_tx_batch *tx, const struct sockaddr_in *dst,
		       const struct dp_tx_msg *m, struct dp_tx_owner *owner, uint32_t first,
		       uint32_t n)
{
	uint32_t per = tx->payload + DP_WIRE_HDR_LEN;
	uint32_t group = 1;
	uint64_t copied = 0, total = m->tpl.total;
	if (tx->be->gso) {
		group = GSO_MAX_BYTES / per;
		if (group > tx->be->max_gso_segments)
			group = tx->be->max_gso_segments;
		if (group == 0)
			group = 1;
	}
	struct dp_tx *cur = NULL; /* the GSO send being filled */
	for (uint32_t c = first; c < first + n; c++) {
		uint32_t len = dp_wire_chunk_len(total, tx->payload, c);
		uint64_t off = (uint64_t)c * tx->payload;
		/* room for the worst datagram: a header, its pieces, its copy */
		if (tx->ntx + 1 > DP_TX_BATCH || tx->niov + 1 + DP_TX_MSG_PIECES > DP_TX_IOV ||
		    tx->nhdr == DP_TX_MSG_HDRS || tx->nbounce + tx->payload > DP_TX_BOUNCE) {
			dp_tx_flush(tx);
			cur = NULL;
		}
		struct dp_wire_header *h = &tx->hdr[tx->nhdr++];
		*h = m->tpl;
		h->chunk = c;
		h->offset = off;
		h->length = len;
		struct iovec *iov = &tx->iov[tx->niov];
		iov[0] = (struct iovec){ h, DP_WIRE_HDR_LEN };
		uint32_t k = len ? msg_pieces(m, off, len, iov + 1, DP_TX_MSG_PIECES) : 0;
		if (len && !k) {
			uint8_t *b = tx->bounce + tx->nbounce;
			msg_copy(m, off, len, b);
			tx->nbounce += len;
			iov[1] = (struct iovec){ b, len };
			k = 1;
			copied += len;
		}
		/* a GSO send takes up to `group` datagrams of `per` bytes, but its last, and
		 * DP_TX_SEND_IOV pieces at most (cur is closed after a short datagram) */
		if (cur && (cur->datagrams == group || cur->iovcnt + 1 + k > DP_TX_SEND_IOV))
			cur = NULL;
		if (!cur) {
			cur = &tx->tx[tx->ntx++];
			*cur = (struct dp_tx){ .dst = dst, .iov = iov, .owner = owner };
		}
		cur->iovcnt += 1 + k;
		cur->gso_size = cur->datagrams++ ? per : 0;
		tx->niov += 1 + k;
		if ((uint64_t)DP_WIRE_HDR_LEN + len != per)
			cur = NULL;
	}
	return copied;
}
