/* dp_weight.h: reliable weight transfer to one duck (dp_weight.c). A leaf: the worker
 * hands over the context and its acks through a narrow view of itself (struct
 * dp_weight_view), calls dp_weight_pump from its timers, and ends the part when a call
 * says it is over (dp_worker.c). */
#ifndef DP_WEIGHT_H
#define DP_WEIGHT_H

#include <stdint.h>

struct dp_counters;
struct dp_fwd;
struct dp_tx_batch;
struct dp_wire_header;
struct dp_world;

/* What weight transfer sees of its NIC worker, which owns it (and everything it points
 * at) and passes it to every call. */
struct dp_weight_view {
	const struct dp_world *w;     /* the config, the duck table, the session, the
				       * dispatcher's waker */
	uint32_t nic;
	uint32_t payload;             /* bytes per datagram after the header */
	struct dp_counters *counters; /* the worker's */
	struct dp_tx_batch *tx;       /* the worker's transmit batch (dp_tx.h) */
	struct dp_wire_header *hdrs;  /* [contexts][max_chunks]: each one's WEIGHT headers */
	uint64_t *sent_ns;            /* [contexts][max_chunks]: last send of each datagram */
	uint32_t max_chunks;
};

/* Take f in: its WEIGHT headers; nothing goes out before dp_weight_pump. */
void dp_weight_accept(const struct dp_weight_view *v, struct dp_fwd *f);
/* Send what is due (the LAYER announcement first): retransmissions within budget, new
 * datagrams within *room too, which it lowers. Returns the datagrams sent. */
uint32_t dp_weight_pump(const struct dp_weight_view *v, struct dp_fwd *f, uint64_t now,
			uint32_t budget, uint32_t *room);
/* A WEIGHT_ACK for f. Returns DP_STATUS_PENDING, or DP_STATUS_OK once the last chunk
 * is acknowledged: its bytes are counted acknowledged and the part is over. */
uint32_t dp_weight_on_ack(const struct dp_weight_view *v, struct dp_fwd *f,
			  const struct dp_wire_header *h);
/* f's deadline passed unacknowledged: its layer failed on its duck. Returns
 * DP_STATUS_DATAPLANE_ERROR: the part is over. */
uint32_t dp_weight_timeout(const struct dp_weight_view *v, struct dp_fwd *f);

#endif /* DP_WEIGHT_H */
