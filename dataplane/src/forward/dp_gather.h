/* dp_gather.h: a forward on one NIC (dp_gather.c): send its activation, gather and
 * sum its ducks' partials, NACK those that stall. A leaf, as Aeron's loss detector is:
 * the worker hands over the context, the datagrams it has checked and the timers,
 * through a narrow view of itself (struct dp_gather_view), and each call returns what
 * happened; when the NIC's part is over it says with which status, and the worker ends
 * the part (dp_worker.c). */
#ifndef DP_GATHER_H
#define DP_GATHER_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_gather_view.h"

struct dp_counters;
struct dp_fwd;
struct dp_reasm;
struct dp_tx_batch;
struct dp_wire_header;

/* Take f in: its headers, its sum, its ducks' state; send the activation. Returns when
 * the first NACK may be due (a lower bound: the worker's timer). */
uint64_t dp_gather_accept(const struct dp_gather_view *v, struct dp_fwd *f);
/* A PARTIAL from duck, one of f's targets: add it in. h is the datagram's header (a
 * copy), payload its h->length bytes behind it, at any alignment; arrived when the
 * kernel took it in (0: unknown, now), for the duck's reply time. Returns
 * DP_STATUS_PENDING, or, when the last of f's ducks on this NIC is done, the part's
 * status (OK, DUCK_LOST). */
uint32_t dp_gather_on_partial(const struct dp_gather_view *v, struct dp_fwd *f,
			      const struct dp_wire_header *h, const uint8_t *payload,
			      uint32_t duck, uint64_t arrived, uint64_t now);
/* A NACK from duck about f (a forward or a weight chunk): resend the activation chunks
 * it lists, or, flagged NO_LAYER, the duck lost the layer. Returns DP_STATUS_PENDING,
 * or the part's status when that ended f's part on this NIC (as dp_gather_on_partial). */
uint32_t dp_gather_on_nack(const struct dp_gather_view *v, struct dp_fwd *f,
			   const struct dp_wire_header *h, const uint8_t *payload, uint32_t duck,
			   uint64_t now);
/* The NACK timer: NACK the ducks of f whose partial made no progress for their RTO;
 * returns when the next one is due (UINT64_MAX: none is waited for). */
uint64_t dp_gather_send_nacks(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now);
/* The failover timer, before the NACKs: each routed duck of f silent past its failover
 * deadline (dp_gather.c: max(8 x its srtt, failover_ms) since the send or its last
 * datagram) has its rows resent to other live replicas (dp_moe_failover), or, when some
 * have none, is waited for until the forward's own deadline (fo_stuck), as without
 * failover. Returns DP_STATUS_PENDING, or the part's status when that ended it. */
uint32_t dp_gather_failover(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now);
/* When f's last partial on this NIC is due by its ducks' measured reply times (the
 * latest wait_start + srtt of those still awaited), adding their reply bytes to *bytes;
 * 0 when one may come any time: a duck not measured yet, streaming its reply, NACKed or
 * sent the activation again. */
uint64_t dp_gather_expected(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t *bytes);
/* f's deadline passed: its wait on this NIC ends now. Returns DP_STATUS_TIMEOUT. */
uint32_t dp_gather_timeout(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now);
/* The NIC's link is down (dp_backend.h): f's wait on this NIC ends now, marked so that
 * its completion names the NIC. Returns DP_STATUS_DATAPLANE_ERROR. */
uint32_t dp_gather_link_down(const struct dp_gather_view *v, struct dp_fwd *f, uint64_t now);

#endif /* DP_GATHER_H */
