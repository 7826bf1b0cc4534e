/* dp_client.h: mapping a client's segment, checking it, and telling whether the
 * client still lives. */
#ifndef DP_CLIENT_H
#define DP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_abi.h"
#include "dp_common.h"
#include "dp_config.h"
#include "dp_desc_check.h" /* struct dp_client_layout: the descriptor check reads it too */
#include "dp_mem.h"

struct dp_reaper; /* dp_reaper.h */
struct dp_waker;  /* dp_waker.h */

enum dp_client_state {
	DP_CLIENT_FREE = 0,
	DP_CLIENT_ACTIVE,    /* control -> ACTIVE after mapping; the dispatcher polls it */
	DP_CLIENT_CLOSING,   /* control: stop polling */
	DP_CLIENT_QUIESCED,  /* dispatcher: I stopped; control unmaps once inflight is 0 */
	DP_CLIENT_ATTACHING, /* control only: mapped, being faulted in a step at a time */
	DP_CLIENT_UNMAPPING, /* control only: being unmapped by the reaper (dp_client_let_go) */
};


/* One attached client, a slot of struct dp_world's table (dp_world.h). Who writes each
 * field is said beside it: the control agent maps, steps and reclaims, the dispatcher
 * consumes the ring. */
struct dp_client {
	uint32_t state; /* enum dp_client_state, release/acquire */
	uint32_t id;
	uint32_t pid;
	uint32_t uid;   /* the peer's, from the control socket */
	bool dead;      /* its process died (counted as reclaimed) rather than detached */
	uint64_t start_ticks; /* the process's start, from /proc/<pid>/stat at attach */
	uint8_t identity[256];
	size_t identity_len;
	char name[64];
	char path[256]; /* the memfd's name, for people */
	uint64_t st_dev, st_ino; /* the memfd itself: one file is attached once */
	int doorbell_fd;    /* control opens and closes it (-1: none); the dispatcher reads it */
	uint8_t *base;
	size_t size;
	size_t stepped;     /* control: bytes faulted in (ATTACHING) */
	bool reaping;       /* control: its unmap is the reaper's (UNMAPPING) */
	bool was_registered; /* control: registered for zero copy until let go */
	uint32_t reaped;    /* the reaper: 1 once it unmapped it (release; control acquires) */
	uint64_t attach_rid; /* control: the Attach request answered once faulted in */
	/* control, before ATTACHING (release): when its Attach arrived. No submit stamp of
	 * an honest client is older (the dispatcher's dp_fwd_client_prepare) */
	uint64_t attach_ns;
	struct dp_mem mem; /* the segment, registered for zero copy (dp_backend_mem_register) */
	struct dp_client_layout layout;
	/* Pointers below were computed at attach from the private plan. Through hdr the
	 * dataplane only writes its own line and reads the client's heartbeat. */
	struct dp_seg_header *hdr;
	struct dp_ring_header *ring;
	struct dp_desc *descs;
	struct dp_slot_header *slots;
	uint8_t *act;
	uint8_t *res;
	uint64_t ring_tail;      /* dispatcher: the consumer index; shm's tail is only a copy */
	uint64_t ring_head_seen; /* dispatcher: head never moves back */
	uint32_t nlayers;        /* control: layers it owns */
	uint64_t weight_bytes;   /* control: their weight_bytes */
	/* control: its layers replaced or unloaded but not freed yet (forwards or chunks in
	 * flight may hold them): they count against its quotas until freed */
	uint32_t retired_layers;
	uint64_t retired_bytes;
	/* dispatcher adds, control subtracts; control adds one back for each completion it
	 * holds for a full socket, until it leaves (dp_control_outbox.c) */
	uint64_t inflight dp_cache_aligned;
	uint64_t submitted dp_cache_aligned; /* dispatcher */
	uint64_t completed dp_cache_aligned; /* control */
};

/* Limits for dp_client_map and the client table it checks for duplicates; once, at start. */
void dp_client_set_limits(const struct dp_config *cfg, const struct dp_client *all, uint32_t n);
/* The reaper that unmaps segments and closes their descriptors (dp_reaper.h); once, at
 * start. Without one (NULL: the C unit tests) the caller's thread does it. */
void dp_client_set_reaper(struct dp_reaper *r);
/* Check a copy of a segment header against dp_seg_plan(), the limits and the file size;
 * fills the layout. 0 or -1 with dp_error(). */
int dp_client_check_header(const struct dp_seg_header *h, uint64_t file_size,
			   struct dp_client_layout *out);
/* Take the peer's memfd segment_fd from the process behind pidfd (the one that connected:
 * dp_peer_pidfd), check it (a sealed duckpipe memfd of peer_uid, made by peer_pid, not
 * attached yet) and its header, map it and keep a private copy of its layout in c. 0 or
 * -1 with dp_error(), which says nothing of a file that is not peer_uid's. Its pages are
 * not faulted in yet: dp_client_populate does that, a step at a time. */
int dp_client_map(struct dp_client *c, int pidfd, uint32_t peer_pid, uint32_t peer_uid,
		  int32_t segment_fd);
/* Take the peer's doorbell, the read end of a pipe it made (its descriptor doorbell_fd),
 * from the same process, into c->doorbell_fd (a description of our own); the client keeps
 * the write end. 0 or -1 with dp_error(). */
int dp_client_open_doorbell(struct dp_client *c, int pidfd, uint32_t peer_pid,
			    uint32_t peer_uid, int32_t doorbell_fd);
/* Close c->doorbell_fd, if open: once the dispatcher no longer listens (it let go of c). */
void dp_client_close_doorbell(struct dp_client *c);
/* Fault in up to `step` more bytes of a mapped segment (MADV_POPULATE_WRITE), and once all
 * are in, register it for zero copy: 1 when done, 0 while more remain, -1 with dp_error()
 * (the segment stays mapped: dp_client_unmap). */
int dp_client_populate(struct dp_client *c, size_t step);
/* Let go of a detached client's segment, once none of its forwards is in flight: the
 * first call unregisters it (dp_backend_mem_unregister: before the unmap) and hands the
 * unmap to the reaper, which kicks `kick` when it is done. 1 once the segment is
 * unmapped, 0 while the reaper has it (dp_client_reaping). */
int dp_client_let_go(struct dp_client *c, struct dp_waker *kick);
/* Is the reaper unmapping it still? (Then the control agent may park: it is kicked.) */
bool dp_client_reaping(const struct dp_client *c);
/* Unregister, and unmap through the reaper without waiting: a refused attach (nothing of
 * it was in flight), and at exit. */
void dp_client_unmap(struct dp_client *c);

/* True once the process behind pidfd has exited (its pidfd polls readable), or when the
 * kernel cannot say: a caller refuses rather than guess. */
bool dp_pidfd_exited(int pidfd);
/* A process's start time (clock ticks since boot, /proc/<pid>/stat field 22), 0 when it
 * cannot be read. With the pid it names one process: pids are reused, start times not. */
uint64_t dp_process_start_ticks(uint32_t pid);
/* False once pid has exited, is a zombie, or is a newer process reusing the pid (its start
 * ticks differ from start_ticks, read at attach by dp_process_start_ticks). */
bool dp_process_alive(uint32_t pid, uint64_t start_ticks);

#endif /* DP_CLIENT_H */
