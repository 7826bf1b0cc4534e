/* dp_gather_view.h: what the NIC worker shows of itself to the modules that work a
 * forward on its NIC (dp_gather.c, and dp_moe.c for routed forwards): the worker owns
 * everything here and passes it to every call. A header of its own, without a module,
 * so that dp_moe.c can see the view without depending on dp_gather.c, which calls it.
 *
 * Of the shared state (struct dp_world) the view holds only the five things gather
 * reads: the NACK limits (copied), the session, the duck index, the ducks' addresses
 * and this NIC's config; so a view can be made by hand, without a world
 * (dataplane/tests/test_gather.c does). */
#ifndef DP_GATHER_VIEW_H
#define DP_GATHER_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_config.h"

struct dp_counters;
struct dp_duck_rx;
struct dp_reasm;
struct dp_routing_placement;
struct dp_tx_batch;
struct dp_wire_header;

/* A duck's NACK timeout, RFC 6298's estimator over its reply times (ns). */
struct dp_rto {
	uint64_t srtt;
	uint64_t rttvar;
	uint64_t rto;     /* cfg.nack_us until the first sample */
	bool sampled;
};

/* The config's NACK timing (us there) in ns, copied at the worker's start: the per-datagram
 * and per-timer paths read them without going through the config. */
struct dp_gather_limits {
	uint64_t nack_ns;     /* a duck's RTO until its first sample; the least time between
			       * two resends of the activation to one duck (NACK flood guard) */
	uint64_t nack_min_ns; /* the RTO's floor, and RFC 6298's clock granularity G */
	uint64_t nack_max_ns; /* its ceiling, backoff included */
	uint64_t failover_ns; /* a routed duck silent this long (at least): fail over */
};

/* What gather sees of its NIC worker, which owns it (and everything it points at) and
 * passes it to every call. */
struct dp_gather_view {
	struct dp_gather_limits limits;
	uint64_t session;             /* the wire's session cookie (fixed before workers start) */
	const int16_t *duck_index;    /* [DP_MAX_DUCKS] duck id -> topology index (f->rx's) */
	const struct dp_duck_cfg *duck_cfg; /* by topology index: each duck's address */
	const struct dp_nic_cfg *nic_cfg;   /* this NIC's: broadcast, or unicast fan-out */
	uint32_t nic;
	uint32_t payload;             /* bytes per datagram after the header */
	uint32_t nducks;              /* the ducks on this NIC */
	const uint16_t *ducks;
	struct dp_rto *rto;           /* NACK timeouts, by duck id (this NIC's ducks) */
	struct dp_counters *counters; /* the worker's */
	struct dp_tx_batch *tx;       /* the worker's transmit batch (dp_tx.h) */
	struct dp_wire_header *hdrs;  /* [contexts][max_chunks]: each one's FORWARD headers */
	uint32_t max_chunks;
	float *scratch;               /* [contexts][scratch_floats]: sums not made in place */
	uint32_t scratch_floats;
	struct dp_reasm *summed;      /* [contexts]: chunks of a dense sum written once */
	struct dp_reasm *nack_seen;   /* chunks already resent for the NACK being answered */
	/* routed (MoE) forwards (dp_moe.c) */
	const uint64_t *nic_ducks;    /* this NIC's ducks, a DP_MAX_DUCKS-bit set */
	uint8_t *moe_wire;            /* the wire table of the forward being sent */
	uint64_t moe_wire_cap;
	uint8_t *moe_tables;          /* [contexts][moe_table_cap]: the tables they sent */
	uint64_t moe_table_cap;
	uint16_t *moe_maps;           /* [contexts][moe_map_cap]: the ducks' reply row maps */
	uint32_t moe_map_cap;
	/* a forward's placement less its known-lost ducks (f->lost), and their bank slots */
	struct dp_routing_placement *moe_live;
	uint16_t *moe_live_slots;
	/* failover (dp_moe_failover): [contexts][DP_FO_MAX] replies awaited from replacement
	 * ducks, and the tables and row maps of those messages, [contexts][moe_table_cap]
	 * and [contexts][moe_map_cap] (a forward hands over at most every entry it sent) */
	struct dp_duck_rx *fo;
	uint8_t *fo_tables;
	uint16_t *fo_maps;
};

/* The address of duck `id`, one of the topology's (duck_index[id] >= 0). */
static inline const struct sockaddr_in *dp_gather_duck_addr(const struct dp_gather_view *v,
							    uint32_t id)
{
	return &v->duck_cfg[v->duck_index[id]].addr;
}

#endif /* DP_GATHER_VIEW_H */
