/* fuzz_control: one raw control message, as any peer of the ROUTER socket sends it.
 *
 * The input is the payload frame (the control agent reads at most 64 KiB of it).
 * decode_one() is everything the control agent does with those bytes before it acts
 * on them: the generated codec's dp_ctl_decode (include/gen/dp_ctl_gen.h and .c).
 * Run with an allocation cap (fuzz_control.options: -malloc_limit_mb): a decoder that
 * believes a declared length and reserves memory for it fails here as
 * "out-of-memory (malloc(...))", however much memory the machine has.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 1 << 16) /* dp_control_poll_requests: a bigger frame is dropped unread */
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
