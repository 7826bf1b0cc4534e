/* dp_mem.h: client memory as the backends see it, for zero-copy transmit. */
#ifndef DP_MEM_H
#define DP_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Memory a backend may send from in place (zero copy): a client's segment, registered
 * with the backend's device layer at attach (dp_backend_mem_register: DPDK's
 * rte_extmem_register and rte_dev_dma_map) and unregistered at detach, once no
 * forward of the client is in flight (so no buffer of a port points into it). */
struct dp_mem {
	uint8_t *va;
	size_t len;
	size_t page_sz;    /* 2 MiB (hugetlbfs) or 4 KiB */
	uint32_t n_pages;
	bool registered;   /* the device layer knows it: a NIC that DMAs may send from it */
	bool iova_va;      /* IOVA as VA: an address is its own IOVA */
	uint64_t *iova;    /* else each page's IOVA (physical address), n_pages of them, or
			    * NULL: none known (DMA-ing ports copy) */
	uint32_t dma_mapped; /* the backend's bookkeeping: ports it DMA-mapped it for (the
				* others copy from it) */
};

#endif /* DP_MEM_H */
