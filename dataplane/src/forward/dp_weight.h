/* dp_weight.h: reliable weight transfer to one duck (dp_weight.c). The worker hands
 * over the context and its acks, and calls dp_weight_pump from its timers. */
#ifndef DP_WEIGHT_H
#define DP_WEIGHT_H

#include <stdint.h>

struct dp_worker;
struct dp_fwd;
struct dp_wire_header;

/* Take f in: its WEIGHT headers; nothing goes out before dp_weight_pump. */
void dp_weight_accept(struct dp_worker *wk, struct dp_fwd *f);
/* Send what is due (the LAYER announcement first): retransmissions within budget, new
 * datagrams within *room too, which it lowers. Returns the datagrams sent. */
uint32_t dp_weight_pump(struct dp_worker *wk, struct dp_fwd *f, uint64_t now, uint32_t budget,
			uint32_t *room);
/* A WEIGHT_ACK for f: the last chunk acknowledged ends f with DP_STATUS_OK. */
void dp_weight_on_ack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h);
/* End f on this worker: DP_STATUS_OK counts its bytes acknowledged, else its layer failed. */
void dp_weight_finish(struct dp_worker *wk, struct dp_fwd *f, uint32_t status);

#endif /* DP_WEIGHT_H */
