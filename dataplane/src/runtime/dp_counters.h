/* dp_counters.h: every event a person would ask about, per agent.
 *
 * Each agent owns one struct dp_counters and is its only writer (relaxed
 * stores); the control agent sums them for Stats without stopping anyone.
 */
#ifndef DP_COUNTERS_H
#define DP_COUNTERS_H

#include <stdint.h>

#include "dp_barrier.h"
#include "dp_common.h"

#define DP_COUNTER_LIST(X)                                                                  \
	X(descriptors)          /* descriptors taken from client rings */                   \
	X(forwards)             /* forwards started */                                      \
	X(forwards_ok)                                                                      \
	X(timeouts)             /* forwards that hit their deadline */                      \
	X(duck_lost)            /* forwards failed by a duck without the layer */           \
	X(stale_epoch)          /* descriptors from an old epoch */                         \
	X(bad_requests)         /* descriptors refused */                                   \
	X(dataplane_errors)                                                                 \
	X(weight_chunks)        /* WEIGHT_CHUNK descriptors completed */                    \
	X(weight_bytes)                                                                     \
	X(layers_loaded)                                                                    \
	X(tx_packets)                                                                       \
	X(tx_bytes)                                                                         \
	X(tx_errors)                                                                        \
	X(gso_sends)            /* sends the kernel cut into datagrams (UDP_SEGMENT) */     \
	X(tx_zero_copy)         /* dpdk: payloads sent from client memory (extbuf chain) */ \
	X(tx_copied)            /* dpdk: payloads copied: the port can't chain (af_xdp) */  \
	X(tx_release_deferred)  /* parts whose end waited for the port to free their slot */ \
	X(extmem_registered)    /* dpdk: client segments registered (rte_extmem_register) */ \
	X(extmem_registered_bytes)                                                          \
	X(extmem_unregistered)  /* dpdk: ... and unregistered at detach */                  \
	X(rx_packets)                                                                       \
	X(rx_bytes)                                                                         \
	X(rx_malformed)         /* bad magic, version, op or length */                      \
	X(rx_unknown_sender)    /* source address not a duck of this NIC */                 \
	X(rx_bad_session)                                                                   \
	X(rx_stale_epoch)                                                                   \
	X(rx_late)              /* for a forward no longer in flight */                     \
	X(rx_duplicates)        /* chunks already received */                               \
	X(rxq_overflows)        /* datagrams the kernel dropped: socket buffer full */      \
	X(rx_not_ours)          /* dpdk: frames for another address, port or protocol */    \
	X(rx_fragments)         /* dpdk: IPv4 fragments (never reassembled) */              \
	X(tx_no_mac)            /* dpdk: datagrams dropped, the duck's MAC not known yet */ \
	X(arp_requests)         /* dpdk: ARP requests sent for duck addresses */            \
	X(arp_replies)          /* dpdk: ARP requests for the host address answered */      \
	X(arp_learned)          /* dpdk: duck MACs learned or changed */                    \
	X(nacks_sent)                                                                       \
	X(nacks_received)                                                                   \
	X(retransmits)          /* activation chunks resent on a duck's NACK */             \
	X(nack_resends_suppressed) /* chunks a NACK asked for again within nack_us */      \
	X(rto_samples)          /* duck reply times taken into its NACK timeout (RTO) */    \
	X(nacks_avoided)        /* ducks that answered un-NACKed after more than nack_us */ \
	X(rto_backoffs)         /* NACK timeouts that doubled a duck's RTO */              \
	X(weight_datagrams)                                                                 \
	X(weight_retransmits)                                                               \
	X(pings)                                                                            \
	X(pongs)                                                                            \
	X(no_layer_replies)     /* a duck said it holds no such layer */                    \
	X(control_messages)                                                                 \
	X(bad_control_messages)                                                             \
	X(control_refused)      /* no credentials, or a role that may not ask that */       \
	X(quota_refused)        /* LoadWeights or Attach past a client's or a pid's quota */\
	X(connections_refused)  /* control connections past max_connections, closed */     \
	X(connections_shed)     /* accepted and closed at once: no descriptor left (EMFILE) */\
	X(layers_freed)                                                                     \
	X(curve_refused)        /* tcp:// handshakes with a key not in curve_clients_file */\
	X(clients_attached)                                                                 \
	X(clients_detached)                                                                 \
	X(clients_reclaimed)    /* dead clients whose segments were unmapped */             \
	X(clients_evicted)      /* clients detached for breaking their ring */              \
	X(client_quota_waits)   /* passes a client at client_max_inflight was skipped */    \
	X(parks)                /* times a runner thread slept (dp_waker.h) */             \
	X(kicks)                /* of those, woken by another thread's push */             \
	X(doorbells)            /* doorbell datagrams from clients that found us parked */ \
	X(futex_wakes)          /* completions that woke a client sleeping on its slot */  \
	X(completions_sent)                                                                 \
	X(completion_flushes)   /* bursts the outbox sent them in (completion_flush_us) */

enum dp_counter {
#define DP_COUNTER_ENUM(name) DP_C_##name,
	DP_COUNTER_LIST(DP_COUNTER_ENUM)
#undef DP_COUNTER_ENUM
	DP_NCOUNTERS
};

extern const char *const dp_counter_names[DP_NCOUNTERS];

struct dp_counters {
	uint64_t v[DP_NCOUNTERS];
} dp_cache_aligned;

static inline void dp_count(struct dp_counters *c, enum dp_counter which, uint64_t n)
{
	dp_store_relaxed_u64(&c->v[which], c->v[which] + n);
}

#endif /* DP_COUNTERS_H */
