/* dp_moe.h: a routed (mixture-of-experts) forward on one NIC (dp_moe.c).
 *
 * The NIC worker's gather (dp_gather.c) hands a routed forward here to be sent, and
 * asks here what each duck's reply must look like and where its rows go. A leaf like
 * dp_gather.c: it sees the worker only through struct dp_gather_view. The pure parts
 * (the mode rule, a duck's row map, the row-mapped sum) take no view, so that the unit
 * tests (dataplane/tests/test_moe.c) run them alone.
 */
#ifndef DP_MOE_H
#define DP_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_routing.h"

struct dp_duck_rx;
struct dp_fwd;
struct dp_gather_view;
struct sockaddr_in;
struct dp_layer;
struct dp_wire_header;

enum dp_moe_mode {
	DP_MOE_MODE_BROADCAST = 0, /* the NIC's wire table and every row, once per NIC */
	DP_MOE_MODE_UNICAST = 1,   /* each routed duck its own table and its rows alone */
};

/* The mode of one NIC part of a routed forward: the descriptor's forced mode (flags:
 * enum dp_desc_flag bits), else unicast only when it puts fewer bytes on the wire than
 * the broadcast. With a shared expert the unicast sends every row to the shared set's
 * ducks and their rows alone to the others, so bytes decide there too. Nothing else
 * decides it: both go out from the slot in place, whatever size. */
enum dp_moe_mode dp_moe_choose(uint32_t flags, uint64_t bytes_broadcast,
			       uint64_t bytes_unicast);

/* Duck's reply row map out of its section s of a wire table (accepted by
 * dp_routing_wire_check): map[i] = the i-th distinct row of its entries, ascending (the
 * order its reply's rows come in). map has room for s->n_rows; returns how many it wrote
 * (s->n_rows for a checked table, never more). */
uint32_t dp_moe_row_map(const void *wire, const struct dp_routing_section *s, uint16_t *map);

/* acc (result rows x hidden float32) += n values of dtype at src, which are elements
 * [first, first + n) of a reply of rows x hidden: reply row i goes to result row map[i]
 * (map NULL: row i). A chunk may start and end anywhere in a row. */
void dp_moe_accumulate(float *acc, uint32_t hidden, const uint16_t *map, uint64_t first,
		       const void *src, uint32_t n, uint8_t dtype);

/* A failover reply's elements [first, first + n) (rows by map, as dp_moe_accumulate),
 * added only where the silent duck it stands in for had not added already: that duck's
 * reply was partly summed when it went silent (the chunks in silent_got, of
 * silent_chunk_bytes each, of its reply of silent_rows rows by silent_map, ascending;
 * NULL: row i is result row i). Result row R's columns c go in unless the silent duck's
 * bytes of (R, c) were in a chunk it delivered, so that each (row, column) of its share
 * is summed once, from it or from the replies standing in for it. */
struct dp_reasm;
void dp_moe_accumulate_rest(float *acc, uint32_t hidden, const uint16_t *map, uint64_t first,
			    const void *src, uint32_t n, uint8_t dtype, const uint16_t *silent_map,
			    uint32_t silent_rows, const struct dp_reasm *silent_got,
			    uint32_t silent_chunk_bytes);

/* The worker's routed send of f on this NIC: the NIC's wire table split out of f's
 * host table with the layer's bank slots, the mode chosen, the table(s) written in the
 * context's table area, each targeted duck's expected reply set in its dp_duck_rx (rows,
 * row map, its message for resends), and the message(s) queued on the transmit batch,
 * rows from the slot in place. 0, or -1 when the split failed (a bug: the table and
 * placement were checked), said in the log and f->message; nothing was then sent and
 * the part waits for its deadline. */
int dp_moe_send(const struct dp_gather_view *v, struct dp_fwd *f);

/* Chunks of the message rx's duck was sent (rx set by dp_moe_send). */
uint32_t dp_moe_chunks(const struct dp_gather_view *v, const struct dp_fwd *f,
		       const struct dp_duck_rx *rx);
/* Queue chunks [first, first + n) of that message again, to dst (a NACK INPUT). */
void dp_moe_resend(const struct dp_gather_view *v, struct dp_fwd *f, const struct dp_duck_rx *rx,
		   const struct sockaddr_in *dst, uint32_t first, uint32_t n);

/* Failover within a forward (docs/architecture.md): routed duck `duck` (rx, f's message to
 * it on this NIC) was silent past its deadline, or answered NO_LAYER (it restarted). Each
 * (row, expert) it was sent goes to the next replica of the expert after it in the
 * placement that is live by f->lost, on this NIC, not gone in f (failed over, silent
 * with nowhere to go, or NO_LAYER) and not in `going` (the ducks due for failover in the
 * same pass; NULL: none), in a unicast message of its own per replacement
 * duck: a one-section table (rows renumbered, slots the replacement's), the rows
 * gathered from the slot, FORWARD headers with forward_id f->wire_id | tag <<
 * DP_WIRE_FORWARD_TAG_SHIFT (tag 1..DP_FO_MAX, this part's fo_n-th), the reply awaited in
 * dp_moe_fo_rx(v, f, tag). A duck of the forward's shared set also has its shared
 * columns computed for every row by the duck of another set that holds the same ones
 * (dp_load_moe_shared_stand_in), in a message of their own. Counted moe_failovers. 0,
 * or -1 when some of its rows have no such replica, its shared columns no stand-in, or
 * the tags ran out: nothing was sent then (the forward waits for its deadline, or ends
 * DUCK_LOST for a NO_LAYER). */
int dp_moe_failover(const struct dp_gather_view *v, struct dp_fwd *f, struct dp_duck_rx *rx,
		    uint16_t duck, const uint64_t *going, uint64_t now);
/* The reply awaited for failover message `tag` (1..fo_n) of f's part on this NIC. */
struct dp_duck_rx *dp_moe_fo_rx(const struct dp_gather_view *v, const struct dp_fwd *f,
				uint32_t tag);

#endif /* DP_MOE_H */
