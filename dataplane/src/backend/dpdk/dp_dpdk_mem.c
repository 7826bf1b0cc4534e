/* dp_dpdk_mem.c: client segments registered with DPDK, so that a port that DMAs (a PCI
 * NIC) may send activation chunks from them in place (dp_dpdk_zc.c).
 *
 *   who      the control agent, at attach (dp_client_map), before the client turns
 *            ACTIVE: no worker can send from a segment before it is registered. The
 *            EAL is up by then if any NIC is dpdk (the workers open their ports before
 *            the control agent starts); without a dpdk port nothing is registered.
 *   what     the whole segment, page by page: rte_extmem_register(va, len, iova[],
 *            n_pages, page_sz) with 2 MiB pages for a hugetlbfs segment and 4 KiB pages
 *            for a /dev/shm one (both page-aligned: mmap'ed whole, sized in pages).
 *            IOVA as VA: each page's IOVA is its address. IOVA as PA: each page's
 *            physical address from /proc/self/pagemap (root; hugetlbfs pages never
 *            move, and the segment is sealed and populated: see below for 4 KiB). Without
 *            physical addresses (not root) the segment is registered without IOVAs and
 *            a DMA-ing port copies from it.
 *   DMA      rte_dev_dma_map(dev, va, iova, len) for every dpdk port's device, page by
 *            page with IOVA as PA (VFIO maps it in the IOMMU and pins it). The vdev bus
 *            takes it as a no-op for drivers without a dma_map of their own (af_packet
 *            and tap read through the CPU); a bus without dma_map says ENOTSUP, logged
 *            once, which is fine; any other failure is logged and that port copies.
 *   release  at detach (dp_client_let_go, before the reaper unmaps it), once the client
 *            has no forward in flight:
 *            every forward's completion waits until the port freed its external
 *            buffers (dp_release.c), so no mbuf points into the segment any more.
 *            rte_dev_dma_unmap, then rte_extmem_unregister; the same range can be
 *            registered again (the next client's mapping often lands there).
 *
 * 4 KiB pages (a /dev/shm segment): registered too, with 4 KiB pages (a 1 GiB segment
 * is 262,144 of them in DPDK's memseg list, about 5 ms per 128 MiB here). With IOVA as
 * VA their IOVA is their address (VFIO pins them when it maps them) and they go in
 * place everywhere. With IOVA as PA they get no IOVAs: nothing pins a shmem page to its
 * physical address (swap, compaction may move it, where hugetlbfs pages stay put), so a
 * port that DMAs copies from such a segment; the virtual devices, which read through
 * the CPU, still send from it in place. Hugepages are the production setting.
 */
/* rte_dev_dma_map / unmap are experimental in DPDK 22.11: allowed in this file only */
#define ALLOW_EXPERIMENTAL_API

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_memory.h>

#include "dp_common.h"
#include "dp_dpdk.h"

#define MEM_PORTS 32 /* dpdk ports a segment is DMA-mapped for (dp_mem.dma_mapped) */

/* The dpdk ports, added at open (main thread, before the control agent runs) and read
 * by the control agent afterwards; removed at close (after the control agent stopped). */
static struct {
	uint16_t port;
	struct rte_device *dev;
} ports[MEM_PORTS];
static uint32_t nports, nopen; /* slots used; ports open (the EAL is up while > 0) */
static bool said_enotsup;

void dp_dpdk_mem_add_port(uint16_t port, struct rte_device *dev)
{
	if (nports < MEM_PORTS)
		ports[nports++] = (typeof(ports[0])){ .port = port, .dev = dev };
	nopen++;
}

void dp_dpdk_mem_del_port(uint16_t port)
{
	for (uint32_t i = 0; i < nports; i++)
		if (ports[i].port == port && ports[i].dev) {
			ports[i].dev = NULL; /* slots keep their bits (dp_mem.dma_mapped) */
			nopen--;
			break;
		}
}

/* Each page's physical address from /proc/self/pagemap into m->iova; false when the
 * kernel hides them (not CAP_SYS_ADMIN: the PFNs read as 0) or a page is missing. */
static bool physical_addresses(struct dp_mem *m)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	uint64_t *iova = malloc((size_t)m->n_pages * sizeof(uint64_t));
	bool ok = iova != NULL;
	for (uint32_t i = 0; ok && i < m->n_pages; i++) {
		uint64_t e = 0, va = (uint64_t)(uintptr_t)m->va + (uint64_t)i * m->page_sz;
		ok = pread(fd, &e, sizeof(e), (off_t)(va / 4096 * sizeof(e))) == (ssize_t)sizeof(e);
		uint64_t pfn = e & ((1ull << 55) - 1);
		ok = ok && (e >> 63) && pfn; /* present, and not hidden from us */
		if (ok)
			iova[i] = pfn * 4096;
	}
	close(fd);
	if (!ok) {
		free(iova);
		return false;
	}
	m->iova = iova;
	return true;
}

/* DMA-map m for every port's device (rte_dev_dma_map); dma_mapped says which took it. */
static void dma_map(struct dp_mem *m)
{
	for (uint32_t d = 0; d < nports; d++) {
		if (!ports[d].dev)
			continue;
		int rc = 0;
		uint32_t done = 0;
		if (m->iova_va) {
			rc = rte_dev_dma_map(ports[d].dev, m->va, (uint64_t)(uintptr_t)m->va, m->len);
		} else {
			for (; done < m->n_pages && rc == 0; done++)
				rc = rte_dev_dma_map(ports[d].dev, m->va + (size_t)done * m->page_sz,
						     m->iova[done], m->page_sz);
			if (rc != 0)
				done--;
		}
		if (rc == 0) {
			m->dma_mapped |= 1u << d;
			continue;
		}
		int err = rte_errno;
		/* undo the pages mapped before the failure */
		for (uint32_t i = 0; i < done; i++)
			(void)rte_dev_dma_unmap(ports[d].dev, m->va + (size_t)i * m->page_sz,
						m->iova[i], m->page_sz);
		if (err == ENOTSUP) {
			if (!said_enotsup)
				DP_INFO("dpdk: port %u's bus maps no DMA (rte_dev_dma_map: not "
					"supported); fine for a device that reads through the CPU",
					ports[d].port);
			said_enotsup = true;
		} else {
			DP_WARN("dpdk: rte_dev_dma_map of %zu bytes for port %u: %s (err=%d); that "
				"port copies from this segment",
				m->len, ports[d].port, rte_strerror(err), err);
		}
	}
}

static void dma_unmap(struct dp_mem *m)
{
	for (uint32_t d = 0; d < nports; d++) {
		if (!(m->dma_mapped & (1u << d)) || !ports[d].dev)
			continue;
		int rc = 0;
		if (m->iova_va)
			rc = rte_dev_dma_unmap(ports[d].dev, m->va, (uint64_t)(uintptr_t)m->va, m->len);
		else
			for (uint32_t i = 0; i < m->n_pages; i++)
				rc |= rte_dev_dma_unmap(ports[d].dev, m->va + (size_t)i * m->page_sz,
							m->iova[i], m->page_sz);
		if (rc != 0)
			DP_WARN("dpdk: rte_dev_dma_unmap of %zu bytes for port %u: %s", m->len,
				ports[d].port, rte_strerror(rte_errno));
	}
	m->dma_mapped = 0;
}

void dp_dpdk_mem_register(struct dp_mem *m)
{
	if (!nopen || !m->va || !m->n_pages)
		return; /* no dpdk port, so no EAL: nothing to register with */
	uint64_t t0 = dp_now_ns();
	m->iova_va = rte_eal_iova_mode() == RTE_IOVA_VA;
	rte_iova_t *iova = NULL;
	if (m->iova_va) {
		iova = malloc((size_t)m->n_pages * sizeof(rte_iova_t));
		for (uint32_t i = 0; iova && i < m->n_pages; i++)
			iova[i] = (rte_iova_t)(uintptr_t)(m->va + (size_t)i * m->page_sz);
	} else if (m->page_sz > 4096 && physical_addresses(m)) {
		iova = m->iova; /* hugepages never move; 4 KiB shmem pages may (below) */
	}
	if (rte_extmem_register(m->va, m->len, iova, iova ? m->n_pages : 0, m->page_sz) != 0) {
		DP_WARN("dpdk: rte_extmem_register(%p, %zu bytes, %u pages of %zu): %s (err=%d); "
			"this client's chunks are copied on ports that DMA",
			(void *)m->va, m->len, m->n_pages, m->page_sz, rte_strerror(rte_errno),
			rte_errno);
		if (m->iova_va)
			free(iova);
		free(m->iova);
		m->iova = NULL;
		return;
	}
	if (m->iova_va)
		free(iova); /* DPDK copied them into its memsegs; VA needs no table here */
	m->registered = true;
	if (iova)
		dma_map(m);
	DP_INFO("dpdk: registered %zu bytes at %p with DPDK (rte_extmem_register: %u pages of "
		"%zu KiB, IOVA as %s%s; %lu us)",
		m->len, (void *)m->va, m->n_pages, m->page_sz >> 10, m->iova_va ? "VA" : "PA",
		iova ? "" : m->page_sz > 4096 ? ", physical addresses unknown: DMA-ing ports copy"
					      : ", no IOVAs for 4 KiB pages: DMA-ing ports copy",
		(unsigned long)((dp_now_ns() - t0) / 1000));
}

void dp_dpdk_mem_unregister(struct dp_mem *m)
{
	if (!m->registered)
		return;
	dma_unmap(m);
	if (rte_extmem_unregister(m->va, m->len) != 0)
		DP_WARN("dpdk: rte_extmem_unregister(%p, %zu bytes): %s (err=%d)", (void *)m->va,
			m->len, rte_strerror(rte_errno), rte_errno);
	else
		DP_DEBUG("dpdk: unregistered %zu bytes at %p", m->len, (void *)m->va);
	m->registered = false;
}

/* The IOVA of [from, from + len) in m, or RTE_BAD_IOVA when it has none: not registered,
 * no IOVAs (no physical addresses, or 4 KiB pages with IOVA as PA), not DMA-mapped for
 * the port that asks (dma_port_bit, dp_dpdk_mem_port_bit; 0 for a port that reads
 * through the CPU), or (IOVA as PA) a piece that crosses a page: the next page need not
 * be physically adjacent. */
rte_iova_t dp_dpdk_mem_iova(const struct dp_mem *m, uint32_t dma_port_bit, const uint8_t *from,
			    uint32_t len)
{
	if (!m->registered || (dma_port_bit && !(m->dma_mapped & dma_port_bit)))
		return RTE_BAD_IOVA;
	if (m->iova_va)
		return (rte_iova_t)(uintptr_t)from;
	if (!m->iova)
		return RTE_BAD_IOVA;
	size_t off = (size_t)(from - m->va);
	size_t page = off / m->page_sz;
	if ((off + len - 1) / m->page_sz != page)
		return RTE_BAD_IOVA;
	return m->iova[page] + off % m->page_sz;
}

/* The bit of port among the registered ports (dp_mem.dma_mapped), 0 if not there. */
uint32_t dp_dpdk_mem_port_bit(uint16_t port)
{
	for (uint32_t i = 0; i < nports; i++)
		if (ports[i].port == port && ports[i].dev)
			return 1u << i;
	return 0;
}
