/* abi_c11: the shared-memory ABI headers (gen/dp_abi.h, dp_ring.h, dp_routing.h) compile
 * alone as strict ISO C11 (-std=c11, no _GNU_SOURCE, no other include directory: what a
 * client written in C would include), their _Static_asserts hold, and a ring round trip
 * works. tests/tools/test_generated_files.py runs it; that test also compiles these
 * headers once more with static asserts it renders from the schema itself.
 * Exit 0 pass, 1 fail.
 */
#include "dp_abi.h"
#include "dp_ring.h"
#include "dp_routing.h"

static struct {
	struct dp_ring_header hdr;
	struct dp_desc descs[4];
} ring;
static struct dp_desc in, out;

int main(void)
{
	for (uint64_t id = 1; id <= 10; id++) {
		in.forward_id = id;
		in.ducks[3] = ~id;
		if (dp_ring_push(&ring.hdr, ring.descs, 4, &in) != 0)
			return 1;
		if (dp_ring_pop(&ring.hdr, ring.descs, 4, &out) != 0)
			return 1;
		if (out.forward_id != id || out.ducks[3] != ~id)
			return 1;
	}
	if (dp_ring_pop(&ring.hdr, ring.descs, 4, &out) != -1)
		return 1;
	return ring.hdr.head == 10 && ring.hdr.tail == 10 ? 0 : 1;
}
