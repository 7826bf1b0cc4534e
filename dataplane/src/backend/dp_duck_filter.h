/* dp_duck_filter.h: the classic BPF program that admits, on a NIC's UDP socket, only
 * datagrams from one of that NIC's ducks (source address and port, from the topology).
 * The socket backend attaches it (SO_ATTACH_FILTER), so the kernel drops anyone else's
 * datagrams before the worker wakes; dataplane/tests/test_duck_filter.c runs it. */
#ifndef DP_DUCK_FILTER_H
#define DP_DUCK_FILTER_H

#include <linux/filter.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_config.h"

/* Header 3, per distinct duck address 4, per duck 2, the final refusal 1 */
#define DP_DUCK_FILTER_MAX (3 + 6 * DP_MAX_DUCKS + 1)
_Static_assert(DP_DUCK_FILTER_MAX <= BPF_MAXINSNS, "a filter of every duck fits the kernel's limit");

/* Write nic's program into f (room for DP_DUCK_FILTER_MAX); how many instructions. */
uint32_t dp_duck_filter_build(const struct dp_config *cfg, uint32_t nic, struct sock_filter *f);

#endif /* DP_DUCK_FILTER_H */
