/* dp_client.h: mapping a client's segment, checking it, and telling whether the
 * client still lives. */
#ifndef DP_CLIENT_H
#define DP_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "dp_dataplane.h"

/* Limits for dp_client_map and the client table it checks for duplicates; once, at start. */
void dp_client_set_limits(const struct dp_config *cfg, const struct dp_client *all, uint32_t n);
/* Check a copy of a segment header against dp_seg_plan(), the limits and the file size;
 * fills the layout. 0 or -1 with dp_error(). */
int dp_client_check_header(const struct dp_seg_header *h, uint64_t file_size,
			   struct dp_client_layout *out);
/* Open the peer's memfd segment_fd through /proc, check it (a sealed duckpipe memfd of
 * peer_uid, made by peer_pid, not attached yet) and its header, map it and keep a private
 * copy of its layout in c. 0 or -1 with dp_error(). Its pages are not faulted in yet:
 * dp_client_populate does that, a step at a time. */
int dp_client_map(struct dp_client *c, uint32_t peer_pid, uint32_t peer_uid, int32_t segment_fd);
/* Fault in up to `step` more bytes of a mapped segment (MADV_POPULATE_WRITE), and once all
 * are in, register it for zero copy: 1 when done, 0 while more remain, -1 with dp_error()
 * (the segment stays mapped: dp_client_unmap). */
int dp_client_populate(struct dp_client *c, size_t step);
/* Unmap up to `step` more bytes (the first call also unregisters it): 1 when all are
 * unmapped, 0 while more remain. */
int dp_client_unmap_step(struct dp_client *c, size_t step);
void dp_client_unmap(struct dp_client *c);

/* A process's start time (clock ticks since boot, /proc/<pid>/stat field 22), 0 when it
 * cannot be read. With the pid it names one process: pids are reused, start times not. */
uint64_t dp_process_start_ticks(uint32_t pid);
/* False once pid has exited, is a zombie, or is a newer process reusing the pid (its start
 * ticks differ from start_ticks, read at attach by dp_process_start_ticks). */
bool dp_process_alive(uint32_t pid, uint64_t start_ticks);

#endif /* DP_CLIENT_H */
