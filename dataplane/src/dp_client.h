/* dp_client.h: mapping a client's segment, checking it, and telling whether the
 * client still lives. */
#ifndef DP_CLIENT_H
#define DP_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_dataplane.h"

/* Map and validate the segment at path (made by pid); 0 or -1 with dp_error(). */
int dp_client_map(struct dp_client *c, const char *path, uint32_t pid);
void dp_client_unmap(struct dp_client *c);

/* False once pid has exited, is a zombie, or is a newer process reusing the pid. */
bool dp_process_alive(uint32_t pid, uint64_t started_realtime_ns);

#endif /* DP_CLIENT_H */
