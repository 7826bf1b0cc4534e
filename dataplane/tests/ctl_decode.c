/* ctl_decode: the generated control decoder (dp_ctl_decode, include/gen/dp_ctl_gen.c) as a
 * filter, for tests/dataplane/test_control_codec.py, which holds msgspec's verdict (the
 * mock dataplane's) to each line: the two must accept and refuse the same requests, for
 * the same reason.
 *
 *   ctl_decode < MESSAGES
 *
 * MESSAGES is a stream of (u32 length, little-endian; that many bytes of msgpack). Each
 * message gives one line: "0 TYPE REQ_ID" when decoded, "RC WHY" (the ErrorCode and the
 * decoder's reason) when refused. Exit 0 at the end of the stream, 2 on a length beyond
 * the buffer or a truncated message (the test's framing is broken, not the decoder).
 * Built by dataplane/tests/meson.build with the runtime role's include directories.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dp_ctl_gen.h"

int main(void)
{
	static char buf[1 << 17];
	static struct dp_ctl_request r;
	uint32_t len;
	while (fread(&len, 4, 1, stdin) == 1) {
		if (len > sizeof(buf) || fread(buf, 1, len, stdin) != len)
			return 2;
		char why[256];
		int rc = dp_ctl_decode(buf, len, &r, why, sizeof(why));
		if (rc == 0)
			printf("0 %s %llu\n", dp_ctl_type_names[r.type], (unsigned long long)r.req_id);
		else
			printf("%d %s\n", rc, why);
	}
	return 0;
}
