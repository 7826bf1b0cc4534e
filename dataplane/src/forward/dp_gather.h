/* dp_gather.h: a forward on one NIC (dp_gather.c): send its activation, gather and
 * sum its ducks' partials, NACK those that stall, end the NIC's part. The worker
 * hands over the context, the datagrams it has checked and the timers. */
#ifndef DP_GATHER_H
#define DP_GATHER_H

#include <stdint.h>

struct dp_worker;
struct dp_fwd;
struct dp_wire_header;

/* Take f in: its headers, its sum, its ducks' state; send the activation; arm the
 * NACK timer (wk->next_nack). */
void dp_gather_accept(struct dp_worker *wk, struct dp_fwd *f);
/* A PARTIAL from duck, one of f's targets: add it in; the last chunk of the last duck
 * ends the NIC's part. */
void dp_gather_on_partial(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
			  uint32_t duck, uint64_t now);
/* A NACK from duck about f (a forward or a weight chunk): resend the activation
 * chunks it lists, or, flagged NO_LAYER, the duck lost the layer. */
void dp_gather_on_nack(struct dp_worker *wk, struct dp_fwd *f, const struct dp_wire_header *h,
		       uint32_t duck, uint64_t now);
/* The NACK timer: NACK the ducks of f whose partial made no progress for their RTO;
 * returns when the next one is due (UINT64_MAX: none is waited for). */
uint64_t dp_gather_send_nacks(struct dp_worker *wk, struct dp_fwd *f, uint64_t now);
/* End this NIC's part of f with status (DP_STATUS_TIMEOUT at the deadline). */
void dp_gather_finish(struct dp_worker *wk, struct dp_fwd *f, uint32_t status, uint64_t now);

#endif /* DP_GATHER_H */
