/* dp_dpdk_tx.c: frames from dp_tx messages, handed to the transmit queue (dp_dpdk_txq.c;
 * dp_backend_dpdk.c says how).
 *
 * Per frame, the least work that keeps every frame's checksums right:
 *   - mbufs come BURST at a time (rte_mempool_get_bulk), not one by one, each set up
 *     with a store or two (mbuf_rearm) rather than rte_pktmbuf_reset;
 *   - the Ethernet/IPv4/UDP headers are a template per destination (p->tmpl, rebuilt
 *     when the destination or its MAC changes) copied as 42 bytes, then lengths, IP id
 *     and checksums patched in; the checksums start from the template's precomputed
 *     raw sums (IPv4 header; UDP pseudo header and ports), so only what differs per
 *     frame is added;
 *   - a piece that is copied into the mbuf is summed in the same pass (one read of the
 *     payload for the copy and the UDP checksum); a zero-copy piece is only summed; the
 *     80-byte wire header by an add-with-carry chain (dp_cksum_copy80);
 *   - the common message, datagrams each one wire header and its payload (a forward's
 *     chunks), is cut by frames_paired a run of frames at a time, without the general
 *     walk over pieces (frame(), which zero copy and any other cut take);
 *   - counters once per tx_burst call or per rte_eth_tx_burst, not per frame.
 * Where the port offloads checksums, the pseudo-header sum is all that is written.
 *
 * The UDP checksum stays on, in software, where the port cannot offload it: the wire
 * header carries no checksum of its own, so it is the datagram's only end-to-end check
 * (Ethernet's FCS covers one link), and folded into the copy it costs nothing measurable
 * at MTU (the copy from the client's memory is the cost: duckpipe-pps at 1514 bytes ran
 * as fast with the sum skipped, 2026-12-03). Measured, not adopted: zero copy on
 * net_null (an extbuf mbuf and its free callback per frame cost what the copy saves),
 * prefetching the next message's pieces (no gain: the reads are sequential); the next
 * mbuf's data prefetched (it cost ~5%: the pool's cache hands back the mbufs the port
 * freed a burst ago, still in L1, and the prefetch's address was a load of buf_addr);
 * the wire header's sum updated from the previous chunk's (the backend would have to
 * know which header fields a worker varies, and comparing costs what summing does).
 */
#include <arpa/inet.h>
#include <string.h>

#include <rte_ethdev.h>
#include <rte_prefetch.h>

#include "dp_common.h"
#include "dp_dpdk.h"
#include "dp_dpdk_cksum.h"

#define ETH_OFF 0u
#define IP_OFF RTE_ETHER_HDR_LEN
#define UDP_OFF (IP_OFF + (uint32_t)sizeof(struct rte_ipv4_hdr))

/* --- headers ------------------------------------------------------------------------ */

/* p->tmpl for mac / dst unless it is that already. */
static __rte_always_inline void tmpl_set(struct dpdk_priv *p, const struct rte_ether_addr *mac,
			    const struct sockaddr_in *dst)
{
	uint8_t *h = p->tmpl.hdrs;
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)(void *)(h + ETH_OFF);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(void *)(h + IP_OFF);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(void *)(h + UDP_OFF);
	if (p->tmpl.valid && rte_is_same_ether_addr(&eth->dst_addr, mac) &&
	    ip->dst_addr == dst->sin_addr.s_addr && udp->dst_port == dst->sin_port)
		return;
	memset(h, 0, sizeof(p->tmpl.hdrs));
	eth->dst_addr = *mac;
	eth->src_addr = p->mac;
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = p->host_ip;
	ip->dst_addr = dst->sin_addr.s_addr;
	udp->src_port = p->host_port;
	udp->dst_port = dst->sin_port;
	/* total_length, packet_id, hdr_checksum, dgram_len, dgram_cksum: per frame */
	p->tmpl.ip_sum = rte_raw_cksum(ip, sizeof(*ip));
	uint8_t proto[2] = { 0, IPPROTO_UDP };
	p->tmpl.phdr_sum = (uint32_t)rte_raw_cksum(h + IP_OFF + 12, 8) + rte_raw_cksum(proto, 2);
	p->tmpl.udp_sum = p->tmpl.phdr_sum + rte_raw_cksum(udp, 4);
	p->tmpl.valid = true;
}

/* A frame's headers but for its IP id and checksums: the template with the lengths of a
 * UDP payload of len bytes in, and the raw sums with them. A GSO message's frames but
 * its last all have the one size: frames_paired sizes the headers once per message. */
struct sized_hdrs {
	alignas(16) uint8_t hdrs[48]; /* HDRS_LEN used */
	uint32_t ip_sum;  /* the IPv4 header's, id and checksum zero */
	uint32_t udp_sum; /* the pseudo header and UDP header's (offloading: the pseudo
			   * header's only), checksum zero */
};

static __rte_always_inline void hdrs_size(const struct dpdk_priv *p, struct sized_hdrs *h,
					  uint32_t len, bool offload)
{
	memcpy(h->hdrs, p->tmpl.hdrs, sizeof(h->hdrs));
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(void *)(h->hdrs + IP_OFF);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(void *)(h->hdrs + UDP_OFF);
	/* htons (a builtin the compiler can schedule), not rte_cpu_to_be_16 (inline asm on
	 * x86 for a value that is not a constant) */
	uint16_t tl = htons((uint16_t)(sizeof(*ip) + sizeof(*udp) + len));
	uint16_t ul = htons((uint16_t)(sizeof(*udp) + len));
	ip->total_length = tl;
	udp->dgram_len = ul;
	h->ip_sum = p->tmpl.ip_sum + tl;
	/* the UDP length is in the pseudo header and in the UDP header; an offloading port
	 * wants the pseudo header's sum only (as rte_ipv4_phdr_cksum) */
	h->udp_sum = offload ? p->tmpl.phdr_sum + ul : p->tmpl.udp_sum + 2u * ul;
}

/* h's headers at at, with the next IP id, for a UDP payload whose raw sum is sum. */
static __rte_always_inline void hdrs_put(struct dpdk_priv *p, const struct sized_hdrs *h,
					 struct rte_mbuf *m, uint8_t *at, uint64_t sum, bool offload)
{
	memcpy(at, h->hdrs, HDRS_LEN);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(void *)(at + IP_OFF);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(void *)(at + UDP_OFF);
	uint16_t id = htons(p->ip_id++);
	ip->packet_id = id;
	if (offload) { /* the pseudo header, not inverted */
		m->tx_offload = rte_mbuf_tx_offload(RTE_ETHER_HDR_LEN, sizeof(*ip), 0, 0, 0, 0, 0);
		m->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
		udp->dgram_cksum = dp_cksum_fold32(h->udp_sum);
		return;
	}
	/* the template's sums are of a few words: the IPv4 one stays below 2^32, the UDP
	 * one below 2^48 with a datagram's sum (below 2^34: dp_dpdk_cksum.h) */
	ip->hdr_checksum = (uint16_t)~dp_cksum_fold32(h->ip_sum + id);
	uint16_t c = (uint16_t)~dp_cksum_fold48((uint64_t)h->udp_sum + sum);
	udp->dgram_cksum = c ? c : 0xffff; /* 0 would say "no checksum" */
}

/* The template's headers at at, for a UDP payload of len bytes whose raw sum is sum. */
static __rte_always_inline void hdrs_write(struct dpdk_priv *p, struct rte_mbuf *m, uint8_t *at,
					   uint32_t len, uint64_t sum)
{
	struct sized_hdrs h;
	hdrs_size(p, &h, len, p->tx_cksum_offload);
	hdrs_put(p, &h, m, at, sum, p->tx_cksum_offload);
}

/* --- frames ------------------------------------------------------------------------- */

/* Per tx_burst call: mbufs allocated BURST at a time, what the counters will add. */
struct build {
	struct rte_mbuf *m[BURST];
	uint16_t n, next;
	uint32_t want; /* datagrams still to build, as the messages announced them */
	uint64_t zero_copy, copied;
};

/* data_off, refcnt, nb_segs and port of a fresh frame, as one 64-bit word */
static uint64_t mbuf_rearm_word(const struct dpdk_priv *p)
{
	struct rte_mbuf mb = { .data_off = RTE_PKTMBUF_HEADROOM, .nb_segs = 1, .port = p->port };
	rte_mbuf_refcnt_set(&mb, 1);
	uint64_t w;
	memcpy(&w, &mb.rearm_data, sizeof(w));
	return w;
}

/* An mbuf from the pool, set up as a frame, as vector PMDs rearm theirs: one store of
 * p->tx_rearm (data_off, refcnt 1, nb_segs 1, port) and ol_flags 0, not
 * rte_pktmbuf_reset's field by field. A pool's mbuf has refcnt 1, next NULL and nb_segs
 * 1 already (rte_pktmbuf_free leaves them so, __rte_mbuf_raw_sanity_check); lengths are
 * written by the caller, tx_offload where offloading (hdrs_write), packet_type here. */
static __rte_always_inline void mbuf_rearm(const struct dpdk_priv *p, struct rte_mbuf *m)
{
	RTE_BUILD_BUG_ON(offsetof(struct rte_mbuf, ol_flags) !=
			 offsetof(struct rte_mbuf, rearm_data) + 8);
	memcpy(&m->rearm_data, &p->tx_rearm, sizeof(p->tx_rearm));
	m->ol_flags = 0;
	m->packet_type = 0;
}

/* bd->m, used up, refilled with as many mbufs as the datagrams still announced want
 * (1 to BURST); false where the pool is empty. */
static __rte_always_inline bool mbuf_refill(struct dpdk_priv *p, struct build *bd)
{
	uint32_t k = bd->want < 1 ? 1 : bd->want > BURST ? BURST : bd->want;
	bd->next = bd->n = 0;
	if (unlikely(!p->tx_rearm)) {
		p->tx_rearm = mbuf_rearm_word(p);
		p->tx_data_at = (uint32_t)(sizeof(struct rte_mbuf) + rte_pktmbuf_priv_size(p->pool) +
					   RTE_PKTMBUF_HEADROOM);
	}
	if (rte_mempool_get_bulk(p->pool, (void **)bd->m, k) != 0) {
		/* the pool is (nearly) empty: one at a time what is left */
		struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
		if (!m)
			return false;
		bd->m[0] = m;
		k = 1;
	}
	bd->n = (uint16_t)k;
	return true;
}

static __rte_always_inline struct rte_mbuf *mbuf_get(struct dpdk_priv *p, struct build *bd)
{
	if (bd->next == bd->n && !mbuf_refill(p, bd))
		return NULL;
	if (bd->want)
		bd->want--;
	struct rte_mbuf *m = bd->m[bd->next++];
	mbuf_rearm(p, m);
	return m;
}

/* One frame: the template's headers, then len payload bytes gathered from iov starting
 * at (*piece, *off), which advance past them. Pieces are copied behind the headers,
 * except a last piece of ZC_MIN bytes or more behind a copied one (an activation chunk
 * or weight bytes behind their wire header, from owner's memory): on a port that chains
 * mbufs it goes out in place, as an external buffer (tx_zero_copy, counted on owner
 * until the port frees it: dp_dpdk_zc.c), else copied (tx_copied). */
static __rte_always_inline struct rte_mbuf *frame(struct dpdk_priv *p, struct build *bd,
						  const struct iovec *iov, uint32_t iovcnt,
						  uint32_t *piece, size_t *off, uint32_t len,
						  struct dp_tx_owner *owner)
{
	struct rte_mbuf *m = mbuf_get(p, bd);
	if (!m)
		return NULL;
	uint8_t *at = rte_pktmbuf_mtod(m, uint8_t *);
	uint8_t *to = at + HDRS_LEN;
	struct rte_mbuf *ext = NULL;
	uint64_t sum = 0;
	uint32_t copied = 0;
	const bool cksum = !p->tx_cksum_offload;
	while (copied < len) {
		while (*piece < iovcnt && *off == iov[*piece].iov_len) {
			(*piece)++;
			*off = 0;
		}
		size_t k = iov[*piece].iov_len - *off;
		if (k > len - copied)
			k = len - copied;
		const uint8_t *from = (const uint8_t *)iov[*piece].iov_base + *off;
		bool last = copied + k == len;
		if (last && copied && k >= ZC_MIN && owner) {
			if (p->zero_copy && (ext = dp_dpdk_zc_attach(p, owner, from, (uint16_t)k))) {
				bd->zero_copy++;
			} else {
				bd->copied++;
			}
		}
		uint64_t s;
		if (ext)
			s = cksum ? dp_cksum_sum_copy(NULL, from, k, false) : 0;
		else if (cksum)
			s = dp_cksum_sum_copy(to, from, k, true);
		else {
			memcpy(to, from, k);
			s = 0;
		}
		if (cksum && (copied & 1)) /* a piece at an odd offset: its bytes swap places */
			s = rte_bswap16(dp_cksum_fold(s));
		sum += s;
		*off += k;
		copied += (uint32_t)k;
		if (ext)
			break;
		to += k;
	}
	uint16_t head = (uint16_t)(to - at);
	m->data_len = head;
	m->pkt_len = head;
	if (ext) {
		m->next = ext;
		m->nb_segs = 2;
		m->pkt_len += ext->data_len;
	}
	hdrs_write(p, m, at, len, sum);
	return m;
}

/* The common case, cut without frame()'s general walk: a message whose datagrams are
 * each one wire header (iov[2j], DP_WIRE_HDR_LEN bytes) and its payload (iov[2j + 1],
 * maybe empty), each gso_size bytes but the last (a forward's chunks from
 * dp_tx_activation, or one dp_tx_one datagram with a payload; a lone header is frame()'s). Built a run at a time (as many as
 * the tx burst has room for and bd holds mbufs), the bookkeeping once per run; the
 * header and payload copied and summed in one pass each, the header's at its constant
 * length. Builds datagrams while the pieces are so cut; returns how many, *done their
 * bytes, *empty set where the pool ran dry. Not for zero copy (frame() decides per
 * piece). */
_Static_assert(DP_WIRE_HDR_LEN == 80, "frames_paired sums the wire header as 80 bytes");
static __rte_always_inline uint32_t frames_paired(struct dp_backend *b, struct dpdk_priv *p,
						  struct build *bd, const struct dp_tx *t,
						  uint32_t seg, size_t *done, bool *empty)
{
	const struct iovec *iov = t->iov;
	const uint32_t iovcnt = t->iovcnt;
	const bool cksum = !p->tx_cksum_offload;
	uint32_t made = 0, j = 0;
	size_t bytes = 0;
	if (!t->gso_size && iovcnt > 2)
		return 0;
	const bool offload = p->tx_cksum_offload;
	struct sized_hdrs full; /* a frame of seg bytes: every one but maybe the last */
	hdrs_size(p, &full, seg, offload);
	while (j + 1 < iovcnt) {
		if (bd->next == bd->n && !mbuf_refill(p, bd)) {
			*empty = true;
			break;
		}
		uint32_t run = BURST - p->ntxq, pairs = (iovcnt - j) / 2;
		if (run > (uint32_t)(bd->n - bd->next))
			run = bd->n - bd->next;
		if (run > pairs)
			run = pairs;
		struct rte_mbuf **mbufs = bd->m + bd->next;
		struct rte_mbuf **q = p->txq + p->ntxq;
		uint32_t *qlen = p->txq_len + p->ntxq;
		uint64_t run_bytes = 0;
		uint32_t i;
		for (i = 0; i < run; i++, j += 2) {
			if (iov[j].iov_len != DP_WIRE_HDR_LEN)
				break;
			uint32_t pl = (uint32_t)iov[j + 1].iov_len;
			uint32_t len = DP_WIRE_HDR_LEN + pl;
			/* without GSO, seg is the one datagram's length */
			if (len != seg && !(j + 2 == iovcnt && len < seg))
				break;
			struct rte_mbuf *m = mbufs[i];
			mbuf_rearm(p, m);
			/* a pool's mbuf is direct: its data is where the pool put it, no
			 * buf_addr load */
			uint8_t *at = (uint8_t *)m + p->tx_data_at;
			uint8_t *to = at + HDRS_LEN;
			uint64_t sum;
			if (cksum) {
				sum = dp_cksum_copy80(to, iov[j].iov_base);
				if (pl) /* behind an even number of bytes: no swap */
					sum += dp_cksum_sum_copy(to + DP_WIRE_HDR_LEN,
								 iov[j + 1].iov_base, pl, true);
			} else {
				sum = 0;
				memcpy(to, iov[j].iov_base, DP_WIRE_HDR_LEN);
				if (pl)
					memcpy(to + DP_WIRE_HDR_LEN, iov[j + 1].iov_base, pl);
			}
			if (pl >= ZC_MIN && t->owner)
				bd->copied++;
			uint16_t head = (uint16_t)(HDRS_LEN + len);
			m->data_len = head;
			m->pkt_len = head;
			if (likely(len == seg)) {
				hdrs_put(p, &full, m, at, sum, offload);
			} else {
				struct sized_hdrs last;
				hdrs_size(p, &last, len, offload);
				hdrs_put(p, &last, m, at, sum, offload);
			}
			q[i] = m;
			qlen[i] = len;
			run_bytes += len;
		}
		bd->next = (uint16_t)(bd->next + i);
		bd->want = bd->want > i ? bd->want - i : 0;
		p->ntxq = (uint16_t)(p->ntxq + i);
		p->txq_datagrams = (uint16_t)(p->txq_datagrams + i);
		p->txq_bytes += run_bytes;
		made += i;
		bytes += run_bytes;
		if (p->ntxq == BURST)
			dp_dpdk_txq_flush(b, p);
		if (i < run)
			break; /* a pair cut otherwise: frame() takes it from here */
	}
	*done = bytes;
	return made;
}

/* Datagrams message t makes: its bytes cut at seg (total: its bytes, where known). */
static uint32_t message_datagrams(const struct dp_tx *t, uint32_t seg, size_t *total,
				  bool *known)
{
	if (!*known)
		for (uint32_t j = 0; j < t->iovcnt; j++)
			*total += t->iov[j].iov_len;
	*known = true;
	return !seg ? 1 : t->gso_size ? (uint32_t)((*total + seg - 1) / seg) : 1;
}

uint32_t dp_dpdk_tx_burst(struct dp_backend *b, struct dp_tx *tx, uint32_t n)
{
	struct dpdk_priv *p = b->priv;
	if (dp_backend_link_down(b)) { /* dp_dpdk_link.c: the worker fails the forwards */
		uint64_t datagrams = 0;
		for (uint32_t i = 0; i < n; i++)
			datagrams += tx[i].datagrams;
		dp_count(b->counters, DP_C_tx_link_down, datagrams);
		return 0;
	}
	struct build bd;
	bd.n = bd.next = 0;
	bd.want = 0;
	bd.zero_copy = bd.copied = 0;
	for (uint32_t i = 0; i < n; i++)
		bd.want += tx[i].datagrams;
	uint64_t no_mac = 0, errors = 0, gso = 0;
	uint32_t whole = 0; /* messages all of whose datagrams were handed to the port */
	const struct rte_ether_addr *last_mac = NULL;
	uint32_t last_ip = 0;
	uint16_t last_port = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct dp_tx *t = &tx[i];
		/* a GSO message's length is summed only where frames_paired does not take it
		 * all: it walks the same iovs */
		size_t total = 0;
		bool known = !t->gso_size;
		if (known)
			for (uint32_t j = 0; j < t->iovcnt; j++)
				total += t->iov[j].iov_len;
		uint32_t seg = t->gso_size ? t->gso_size : (uint32_t)total;
		/* the previous message's destination again (a forward's chunks): its MAC and
		 * the template stand, as nothing learns MACs during a tx_burst */
		const struct rte_ether_addr *mac = last_mac;
		if (!mac || t->dst->sin_addr.s_addr != last_ip || t->dst->sin_port != last_port) {
			mac = dp_dpdk_dst_mac(b, p, t->dst->sin_addr.s_addr);
			if (mac)
				tmpl_set(p, mac, t->dst);
			last_mac = mac;
			last_ip = t->dst->sin_addr.s_addr;
			last_port = t->dst->sin_port;
		}
		if (!mac || seg > p->max_datagram) {
			uint32_t datagrams = message_datagrams(t, seg, &total, &known);
			if (!mac)
				no_mac += datagrams;
			errors += datagrams;
			bd.want = bd.want > t->datagrams ? bd.want - t->datagrams : 0;
			continue;
		}
		uint32_t piece = 0, made = 0;
		size_t off = 0, done = 0;
		bool empty = false;
		if (!(p->zero_copy && t->owner)) {
			made = frames_paired(b, p, &bd, t, seg, &done, &empty);
			piece = 2 * made;
		}
		uint32_t datagrams = made && piece >= t->iovcnt && !empty
					     ? made
					     : message_datagrams(t, seg, &total, &known);
		if (t->gso_size && datagrams > 1)
			gso++;
		for (; made < datagrams && !empty; made++) {
			uint32_t len = (uint32_t)(total - done < seg ? total - done : seg);
			struct rte_mbuf *m = frame(p, &bd, t->iov, t->iovcnt, &piece, &off, len, t->owner);
			if (!m)
				break; /* the pool is empty: the port still holds what we sent */
			p->txq_len[p->ntxq] = len;
			p->txq[p->ntxq++] = m;
			p->txq_datagrams++;
			p->txq_bytes += len;
			if (p->ntxq == BURST)
				dp_dpdk_txq_flush(b, p);
			done += len;
		}
		if (made < datagrams)
			errors += datagrams - made;
		else
			whole++;
	}
	if (p->ntxq)
		dp_dpdk_txq_flush(b, p);
	if (bd.next < bd.n) /* announced datagrams that were not built: raw, as they came */
		rte_mempool_put_bulk(p->pool, (void **)(bd.m + bd.next), bd.n - bd.next);
	if (no_mac)
		dp_count(b->counters, DP_C_tx_no_mac, no_mac);
	if (errors)
		dp_count(b->counters, DP_C_tx_errors, errors);
	if (gso)
		dp_count(b->counters, DP_C_gso_sends, gso);
	if (bd.zero_copy)
		dp_count(b->counters, DP_C_tx_zero_copy, bd.zero_copy);
	if (bd.copied)
		dp_count(b->counters, DP_C_tx_copied, bd.copied);
	return whole;
}

