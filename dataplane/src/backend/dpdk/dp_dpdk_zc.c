/* dp_dpdk_zc.c: zero-copy transmit: client memory as external-buffer mbufs, and the
 * rule that no slot is released while the port may still read it.
 *
 *   which ports  those that send mbuf chains (MULTI_SEGS; af_xdp does not, and sends
 *                the wrong bytes) and either read frames through the CPU (the virtual
 *                devices net_af_packet and net_tap: they copy into the kernel inside
 *                rte_eth_tx_burst) or sit on the PCI bus (a NIC that DMAs: it may send
 *                in place only from memory registered with DPDK, dp_dpdk_mem.c, at the
 *                IOVA the registration gave). Every other port copies.
 *   a piece      an extbuf mbuf pointing into the client's slot, its shared info in
 *                that mbuf's own (unused) data room, outside the tensor memory, alive
 *                exactly as long as the mbuf; its free callback counts the piece off the
 *                owner (the forward's or weight chunk's part on this NIC, dp_backend.h).
 *   release      asynchronous: a part whose pieces the port still holds is completed
 *                later, when the callbacks ran (dp_release.c); the worker asks the port
 *                with rte_eth_tx_done_cleanup meanwhile (dp_dpdk_tx_reclaim). On
 *                af_packet and tap the count is 0 when tx_burst returns: nothing waits.
 *   idle bound   a NIC frees a sent buffer only once it has reported the descriptor
 *                done, and ice reports (the RS bit) every tx_rs_thresh descriptors: the
 *                last buffers of a burst on a queue that then falls idle stay held until
 *                more traffic comes, and rte_eth_tx_done_cleanup cannot free what was
 *                never reported. So when the port still holds buffers and nothing has been
 *                sent for the NIC's zc_hold_max_us, tx_reclaim sends a flush burst:
 *                FLUSH_FRAMES minimal frames (to the port's own MAC, ethertype 0x88B5, the
 *                IEEE's local experimental one: a switch does not send a frame back out of
 *                the port it came in on, a directly attached peer drops it as not its
 *                MAC), at least one RS interval's worth of descriptors past the held ones,
 *                then asks for the cleanup again (tx_flush_frames counts them). Copying
 *                a burst's tail instead would not do: the driver frees a batch only when
 *                the whole batch is reported, and it cannot know which burst is the last.
 *                The thresholds are set explicitly on PCI ports (dp_dpdk_zc_txconf).
 *   test knob    DUCKPIPE_DPDK_TX_HOLD_US=N in the dataplane's environment holds a
 *                reference to every extbuf for N microseconds after it was sent, as a
 *                NIC that frees on completion does; "forever" holds them until close;
 *                "traffic:N" until N more frames went out after it, as a NIC that frees
 *                only on later traffic (ice's RS interval) does.
 *                For tests only: it makes the deferred release visible on a veth.
 */
#include <stdlib.h>
#include <string.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_ethdev.h>

#include "dp_common.h"
#include "dp_dpdk.h"

/* What the free callback needs, kept in the extbuf mbuf's own data room. */
struct zc_piece {
	struct rte_mbuf_ext_shared_info sh;
	struct dpdk_priv *p;
	struct dp_tx_owner *owner;
};
_Static_assert(sizeof(struct zc_piece) <= RTE_MBUF_DEFAULT_BUF_SIZE,
	       "the shared info lives in the mbuf's own data room");

/* Whether the port sends in place, before it is configured (MULTI_SEGS). */
void dp_dpdk_zc_open(struct dpdk_priv *p, const struct rte_eth_dev_info *info)
{
	const char *bus = info->device ? rte_bus_name(rte_dev_bus(info->device)) : NULL;
	bool vdev = bus && strcmp(bus, "vdev") == 0, pci = bus && strcmp(bus, "pci") == 0;
	/* Only the virtual devices known to read a frame through its virtual address
	 * (they copy it into the kernel): net_ring, say, passes the mbuf on as it is */
	bool cpu_copy = vdev && info->driver_name &&
			(strcmp(info->driver_name, "net_af_packet") == 0 ||
			 strcmp(info->driver_name, "net_tap") == 0);
	p->zero_copy = (info->tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) && (cpu_copy || pci);
	p->zc_dma = p->zero_copy && pci;
}

/* The port started: client segments are DMA-mapped for it from now on (dp_dpdk_mem.c). */
void dp_dpdk_zc_start(struct dp_backend *b, struct dpdk_priv *p,
		      const struct rte_eth_dev_info *info)
{
	dp_dpdk_mem_add_port(p->port, info->device);
	p->zc_port_bit = dp_dpdk_mem_port_bit(p->port);
	if (p->zc_dma && !p->zc_port_bit)
		p->zero_copy = p->zc_dma = false; /* no slot for its DMA mappings: it copies */
	p->zc_hold_max_ns = (uint64_t)b->cfg->zc_hold_max_us * 1000;
	const char *hold = getenv("DUCKPIPE_DPDK_TX_HOLD_US");
	if (p->zero_copy && hold && hold[0]) {
		if (strncmp(hold, "traffic:", 8) == 0) {
			p->zc_hold_frames = strtoull(hold + 8, NULL, 10);
			p->zc_hold_ns = p->zc_hold_frames ? UINT64_MAX : 0;
		} else {
			p->zc_hold_ns = strcmp(hold, "forever") == 0 ? UINT64_MAX
								      : strtoull(hold, NULL, 10) * 1000;
		}
		p->zc_hold = calloc(ZC_HOLD_MAX, sizeof(*p->zc_hold));
		if (!p->zc_hold)
			p->zc_hold_ns = 0;
		if (p->zc_hold_ns)
			DP_WARN("nic %s: test knob DUCKPIPE_DPDK_TX_HOLD_US=%s: every external buffer "
				"is held after tx_burst (for tests only)",
				b->cfg->name, hold);
	}
}

/* Let go of held extbufs: those held longer than the knob says (all with force). In
 * "traffic:N" mode h->ns is the count of frames sent when it was held, not a time. */
static void release_holds(struct dpdk_priv *p, bool force)
{
	if (p->zc_hold_head == p->zc_hold_tail)
		return;
	uint64_t now = dp_now_ns();
	while (p->zc_hold_head != p->zc_hold_tail) {
		struct zc_hold *h = &p->zc_hold[p->zc_hold_head % ZC_HOLD_MAX];
		bool due = p->zc_hold_frames ? p->zc_frames_sent - h->ns >= p->zc_hold_frames
					     : p->zc_hold_ns != UINT64_MAX && now - h->ns >= p->zc_hold_ns;
		if (!force && !due)
			break;
		rte_pktmbuf_free_seg(h->m); /* the port freed it already, or frees it later */
		p->zc_hold_head++;
	}
}

/* The test knob's holds that are due (dp_dpdk_tx_reclaim, while a part waits). */
void dp_dpdk_zc_release_due(struct dpdk_priv *p)
{
	if (p->zc_hold)
		release_holds(p, false);
}

void dp_dpdk_zc_close(struct dpdk_priv *p)
{
	if (p->zc_hold)
		release_holds(p, true);
	free(p->zc_hold);
	p->zc_hold = NULL;
	dp_dpdk_mem_del_port(p->port);
}

/* One writer at a time: a plain add, no locked RMW (two per piece each way). The free
 * callback runs on the thread that frees the mbuf, which for the ports that send in
 * place (af_packet and tap inside tx_burst, PCI PMDs in tx_burst or tx_done_cleanup) is
 * the worker that sent it, or the closing thread once the worker has stopped. Atomic
 * (relaxed) all the same, so that a reader elsewhere (none today) is no data race. */
static inline void count(uint32_t *n, int32_t by)
{
	__atomic_store_n(n, __atomic_load_n(n, __ATOMIC_RELAXED) + (uint32_t)by, __ATOMIC_RELAXED);
}

/* An extbuf's free callback: the port is done reading that piece of client memory. */
static void zc_free(void *addr, void *opaque)
{
	(void)addr;
	struct zc_piece *z = opaque;
	count(&z->owner->held, -1);
	count(&z->p->zc_out, -1);
}

/* Non-blocking, after each tx burst of `sent` frames: when the port last sent, and the
 * test knob's holds that are due. The time is read only while extbufs are out (the one
 * reader, dp_dpdk_tx_reclaim, looks only then; a burst that puts one out is stamped as
 * it goes): a clock read per burst of copied frames cost 4% of duckpipe-pps at 122
 * bytes. */
void dp_dpdk_zc_reclaim(struct dp_backend *b, struct dpdk_priv *p, uint16_t sent)
{
	(void)b;
	if (sent) {
		if (__atomic_load_n(&p->zc_out, __ATOMIC_RELAXED))
			p->zc_last_tx_ns = dp_now_ns();
		p->zc_frames_sent += sent;
	}
	if (p->zc_hold)
		release_holds(p, false);
}

/* PCI ports, before rte_eth_tx_queue_setup: the completion report interval and the
 * cleanup threshold, explicit rather than the PMD's defaults (ice: 32 and 32).
 * tx_rs_thresh = FLUSH_FRAMES (32): one descriptor write-back per 32, and the most
 * descriptors a queue gone idle can leave unreported, which the flush burst covers.
 * tx_free_thresh = nb_desc - 32 (ice wants rs + free <= nb_desc, free < nb_desc - 3):
 * the driver frees what was reported on every burst once more than 32 descriptors are
 * in use, instead of only when the ring is nearly full, so held slots go back as soon
 * as the NIC reported them. Virtual devices have no thresholds: left as they are. */
void dp_dpdk_zc_txconf(const struct dpdk_priv *p, struct rte_eth_txconf *txq, uint16_t ntx)
{
	if (!p->zc_dma || ntx <= 2 * FLUSH_FRAMES || ntx % FLUSH_FRAMES)
		return;
	txq->tx_rs_thresh = FLUSH_FRAMES;
	txq->tx_free_thresh = (uint16_t)(ntx - FLUSH_FRAMES);
}

/* An mbuf whose data is len bytes of client memory at from (not copied), counted on
 * owner until the port frees it; NULL when the piece must be copied: no owner, not in
 * the owner's memory, a DMA-ing port without an IOVA for it (dp_dpdk_mem_iova), or the
 * pool is empty. */
struct rte_mbuf *dp_dpdk_zc_attach(struct dpdk_priv *p, struct dp_tx_owner *owner,
				   const uint8_t *from, uint16_t len)
{
	const struct dp_mem *mem = owner ? owner->mem : NULL;
	if (!mem || !mem->va || from < mem->va || (size_t)(from - mem->va) + len > mem->len)
		return NULL;
	rte_iova_t iova = RTE_BAD_IOVA; /* a CPU reader (af_packet, tap) never looks at it */
	if (p->zc_dma || mem->registered) {
		iova = dp_dpdk_mem_iova(mem, p->zc_dma ? p->zc_port_bit : 0, from, len);
		if (p->zc_dma && iova == RTE_BAD_IOVA)
			return NULL;
	}
	struct rte_mbuf *ext = rte_pktmbuf_alloc(p->pool);
	if (!ext)
		return NULL;
	struct zc_piece *z = rte_pktmbuf_mtod(ext, struct zc_piece *);
	z->p = p;
	z->owner = owner;
	z->sh.free_cb = zc_free;
	z->sh.fcb_opaque = z;
	rte_mbuf_ext_refcnt_set(&z->sh, 1);
	rte_pktmbuf_attach_extbuf(ext, (void *)(uintptr_t)from, iova, len, &z->sh);
	count(&owner->held, 1);
	count(&p->zc_out, 1);
	/* attach_extbuf resets the lengths: the piece starts at the buffer's first byte */
	ext->data_off = 0;
	ext->data_len = len;
	ext->pkt_len = len;
	if (p->zc_hold && p->zc_hold_tail - p->zc_hold_head < ZC_HOLD_MAX) {
		rte_mbuf_refcnt_update(ext, 1); /* the test knob's reference */
		uint64_t when = p->zc_hold_frames ? p->zc_frames_sent : dp_now_ns();
		p->zc_hold[p->zc_hold_tail++ % ZC_HOLD_MAX] = (struct zc_hold){ ext, when };
	}
	return ext;
}
