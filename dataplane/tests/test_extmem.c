/* test_extmem.c: client segments registered with DPDK for zero-copy transmit
 * (dp_dpdk_mem.c): visible to DPDK while registered, gone after, the same range
 * registered again and again (a detached client's successor often maps there), as many
 * at once as there can be clients, and each page's IOVA right (IOVA as PA: a hugepage's
 * physical address, none for a piece crossing a page or for 4 KiB pages; IOVA as VA:
 * the address). Root with free hugepages: IOVA as PA,
 * 2 MiB and 4 KiB segments; otherwise --no-huge (IOVA as VA), 4 KiB ones.
 * Exit 0 pass, 1 fail, 77 skip (no DPDK in this build, or the EAL cannot start). */
#include <stdio.h>

#include "test_check.h"

#ifndef DP_HAVE_DPDK
int main(void)
{
	printf("test_extmem: built without DPDK: skipped\n");
	return 77;
}
#else
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rte_memory.h>

#include "dp_backend.h"
#include "dp_dpdk.h"

#define SEG_BYTES (4u << 20)

static void *map_memfd(bool huge)
{
	int fd = memfd_create("duckpipe-test-extmem", huge ? MFD_HUGETLB : 0);
	if (fd < 0 || ftruncate(fd, SEG_BYTES) < 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	void *va = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	return va == MAP_FAILED ? NULL : va;
}

static void churn(const char *what, size_t page)
{
	void *va = map_memfd(page != 4096);
	if (!va) {
		printf("test_extmem: no %s segment here: that part skipped\n", what);
		return;
	}
	for (int i = 0; i < 200; i++) {
		struct dp_mem m;
		dp_backend_mem_register(&m, va, SEG_BYTES, page);
		CHECK(m.registered, "%s: registration %d of the same range", what, i);
		CHECK(rte_mem_virt2memseg_list((uint8_t *)va + SEG_BYTES / 2) != NULL,
		      "%s: DPDK does not know the registered range", what);
		if (i == 0 && m.registered && !m.iova_va && page > 4096) {
			CHECK(m.iova != NULL, "%s: no physical addresses as root", what);
			for (uint32_t p = 0; m.iova && p < m.n_pages; p++)
				CHECK(m.iova[p] == rte_mem_virt2phy((uint8_t *)va + (size_t)p * page),
				      "%s: page %u's IOVA", what, p);
			/* a piece inside a page has its IOVA; one across a page boundary none */
			uint8_t *at = (uint8_t *)va + page + 100;
			CHECK(m.iova && dp_dpdk_mem_iova(&m, 0, at, 1400) == m.iova[1] + 100,
			      "%s: a piece's IOVA", what);
			CHECK(dp_dpdk_mem_iova(&m, 0, (uint8_t *)va + page - 700, 1400) == RTE_BAD_IOVA,
			      "%s: a piece across a page has an IOVA", what);
		}
		/* 4 KiB shmem pages may move: with IOVA as PA they get none (DMA-ing ports copy) */
		if (i == 0 && m.registered && !m.iova_va && page == 4096)
			CHECK(!m.iova && dp_dpdk_mem_iova(&m, 0, (uint8_t *)va + 100, 1400) == RTE_BAD_IOVA,
			      "%s: IOVAs for 4 KiB pages with IOVA as PA", what);
		if (i == 0 && m.registered && m.iova_va)
			CHECK(dp_dpdk_mem_iova(&m, 0, (uint8_t *)va + 4000, 1400) ==
				      (rte_iova_t)(uintptr_t)va + 4000,
			      "%s: IOVA as VA", what);
		dp_backend_mem_unregister(&m);
		CHECK(rte_mem_virt2memseg_list(va) == NULL, "%s: still registered after unregister",
		      what);
	}
	munmap(va, SEG_BYTES);
}

/* As many segments registered at once as there can be clients (RTE_MAX_MEMSEG_LISTS). */
static void all_clients(void)
{
	static struct dp_mem m[DP_MAX_CLIENTS];
	static void *va[DP_MAX_CLIENTS];
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++) {
		va[i] = map_memfd(false);
		CHECK(va[i] != NULL, "mapping segment %u", i);
		if (va[i]) {
			dp_backend_mem_register(&m[i], va[i], SEG_BYTES, 4096);
			CHECK(m[i].registered, "segment %u of %u registered", i, DP_MAX_CLIENTS);
		}
	}
	for (uint32_t i = 0; i < DP_MAX_CLIENTS; i++)
		if (va[i]) {
			dp_backend_mem_unregister(&m[i]);
			munmap(va[i], SEG_BYTES);
		}
}

/* The EAL's runtime directory (/var/run/dpdk/<prefix>), which it leaves behind. */
static void remove_runtime_dir(const char *prefix)
{
	char dir[256], path[512];
	const char *base = getenv("XDG_RUNTIME_DIR");
	if (geteuid() == 0)
		snprintf(dir, sizeof(dir), "/var/run/dpdk/%s", prefix);
	else
		snprintf(dir, sizeof(dir), "%s/dpdk/%s", base ? base : "/tmp", prefix);
	DIR *d = opendir(dir);
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	closedir(d);
	rmdir(dir);
}

int main(void)
{
	char name[48], prefix[64];
	snprintf(name, sizeof(name), "dp-test-extmem-%d", (int)getpid());
	snprintf(prefix, sizeof(prefix), "--file-prefix=%s", name);
	/* DP_TEST_IOVA_VA=1: the --no-huge run (IOVA as VA) as root too */
	bool pa = geteuid() == 0 && access("/proc/sys/vm/nr_hugepages", W_OK) == 0 &&
		  !getenv("DP_TEST_IOVA_VA");
	char *huge[] = { "--no-pci", "--in-memory", "--no-telemetry", "--log-level=error", "-l", "0",
			 "-m", "16", prefix };
	char *nohuge[] = { "--no-pci", "--no-shconf", "--no-telemetry", "--log-level=error", "-l",
			   "0", "--no-huge", "-m", "32", prefix };
	dp_backend_args = pa ? (struct dp_backend_args){ (int)DP_ARRAY_LEN(huge), huge }
			     : (struct dp_backend_args){ (int)DP_ARRAY_LEN(nohuge), nohuge };
	if (dp_dpdk_eal_get() < 0) {
		remove_runtime_dir(name);
		printf("test_extmem: the EAL does not start here (%s): skipped\n", dp_error());
		return 77;
	}
	dp_dpdk_mem_add_port(0, NULL); /* a port whose device needs no DMA mapping */
	dp_log_min = DP_LOG_WARN;      /* a line per registration otherwise */
	printf("test_extmem: IOVA as %s\n", rte_eal_iova_mode() == RTE_IOVA_VA ? "VA" : "PA");
	churn("4 KiB-page", 4096);
	churn("2 MiB-page", 2u << 20);
	all_clients();
	dp_dpdk_mem_del_port(0);
	dp_dpdk_eal_put();
	remove_runtime_dir(name);
	return test_result("test_extmem");
}
#endif
