/* fuzz_control: one raw control message, as any peer of the ROUTER socket sends it.
 *
 * The input is the payload frame (the control agent reads at most 64 KiB of it).
 * decode_one() is everything the control agent does with those bytes before it acts
 * on them. Two versions:
 *   - with the generated codec (include/dp_ctl_gen.h, dp_ctl_decode), that;
 *   - without it, what dp_control.c's handle() does today: msgpack_unpack_next on
 *     the raw bytes, then the dp_mp.c accessors with the keys, caps and defaults of
 *     each handler (on_attach, on_load_weights, SetEpoch), copied from it.
 * Run with an allocation cap (fuzz_control.options: -malloc_limit_mb): a decoder that
 * believes a declared length and reserves memory for it fails here as
 * "out-of-memory (malloc(...))", however much memory the machine has.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if __has_include("dp_ctl_gen.h")
#include "dp_ctl_gen.h"

static void decode_one(const char *buf, size_t len)
{
	struct dp_ctl_request r;
	char why[256];
	memset(why, 0, sizeof(why));
	int rc = dp_ctl_decode(buf, len, &r, why, sizeof(why));
	/* whatever failed, the reason is a terminated string that fits */
	if (rc != 0 && memchr(why, '\0', sizeof(why)) == NULL)
		abort();
}

#else
#include <msgpack.h>

#include "dp_abi.h"
#include "dp_common.h"
#include "dp_mp.h"

static void decode_one(const char *buf, size_t len)
{
	msgpack_unpacked msg;
	msgpack_unpacked_init(&msg);
	size_t off = 0;
	char type[32];
	uint64_t rid = 0;
	if (msgpack_unpack_next(&msg, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    msg.data.type != MSGPACK_OBJECT_MAP ||
	    dp_mp_str(&msg.data, "type", type, sizeof(type), "") < 0 || !type[0] ||
	    dp_mp_u64(&msg.data, "req_id", &rid, 0, UINT64_MAX) < 0)
		goto out;
	const msgpack_object *m = &msg.data;
	if (!strcmp(type, "Attach")) {
		uint64_t protocol, abi, pid;
		char segment[256], name[64];
		(void)(dp_mp_u64(m, "protocol", &protocol, DP_PROTOCOL_VERSION, UINT32_MAX) < 0 ||
		       dp_mp_u64(m, "abi_major", &abi, 0, UINT32_MAX) < 0 ||
		       dp_mp_u64(m, "pid", &pid, 0, UINT32_MAX) < 0 ||
		       dp_mp_str(m, "segment", segment, sizeof(segment), "") < 0 ||
		       dp_mp_str(m, "name", name, sizeof(name), "") < 0);
	} else if (!strcmp(type, "LoadWeights")) {
		uint32_t layer, kind, dtype, hidden, ffn, nd, ns;
		uint32_t ducks[256], sizes[256];
		bool b_down;
		(void)(dp_mp_u32(m, "layer", &layer, 0) < 0 || dp_mp_u32(m, "kind", &kind, 0) < 0 ||
		       dp_mp_u32(m, "dtype", &dtype, 0) < 0 || dp_mp_u32(m, "hidden", &hidden, 0) < 0 ||
		       dp_mp_u32(m, "ffn", &ffn, 0) < 0 ||
		       dp_mp_bool(m, "has_b_down", &b_down, false) < 0 ||
		       dp_mp_uints(m, "ducks", ducks, 256, &nd, 255) < 0 ||
		       dp_mp_uints(m, "shard_sizes", sizes, 256, &ns, UINT32_MAX) < 0);
	} else if (!strcmp(type, "SetEpoch")) {
		uint64_t next;
		(void)dp_mp_u64(m, "epoch", &next, 1, UINT64_MAX);
	}
out:
	msgpack_unpacked_destroy(&msg);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 1 << 16) /* dp_control.c poll_control: a bigger frame is dropped unread */
		return 0;
	/* in a buffer of its own size, so that reading one byte past the frame is caught */
	char *buf = malloc(size ? size : 1);
	if (!buf)
		abort();
	memcpy(buf, data, size);
	decode_one(buf, size);
	free(buf);
	return 0;
}
