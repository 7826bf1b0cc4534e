/* fuzz_control: one raw control message, as any peer of the ROUTER socket sends it.
 *
 * The input is the payload frame (the control agent reads at most 64 KiB of it).
 * decode_one() is everything the control agent does with those bytes before it acts
 * on them: the generated codec's dp_ctl_decode (include/gen/dp_ctl_gen.h and .c). A
 * LoadWeights that decodes then meets the control plane's rules (include/dp_ctl_rules.h)
 * as on_load_weights calls them: its bounds, its weight bytes, its MoE plan.
 * Run with an allocation cap (fuzz_control.options: -malloc_limit_mb): a decoder that
 * believes a declared length and reserves memory for it fails here as
 * "out-of-memory (malloc(...))", however much memory the machine has.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dp_ctl_gen.h"
#include "dp_ctl_rules.h"

/* The rules on a decoded LoadWeights, with a topology of every duck and the largest
 * limits: whatever they say, a reason is a terminated string that fits, and a MoE plan
 * they accept holds only the request's ducks. */
static void load_rules(const struct dp_ctl_load_weights *m)
{
	static int16_t topology[DP_MAX_DUCKS];
	static struct dp_layer_moe moe; /* ~34 KiB: not on the stack */
	static const struct dp_load_limits lim = { UINT32_MAX, UINT32_MAX };
	char why[DP_CTL_WHY_LEN];
	for (uint32_t d = 0; d < DP_MAX_DUCKS; d++)
		topology[d] = (int16_t)d;
	memset(why, 0, sizeof(why));
	if (dp_load_check(m, &lim, topology, why, sizeof(why)) != 0) {
		if (memchr(why, '\0', sizeof(why)) == NULL)
			abort();
		return;
	}
	(void)dp_load_plan_bytes(m);
	if (dp_load_moe_plan(m, &moe, why, sizeof(why)) != 0) {
		if (memchr(why, '\0', sizeof(why)) == NULL)
			abort();
		return;
	}
	for (uint32_t e = 0; m->kind == DP_MLP_KIND_MOE && e < moe.pl.n_experts; e++)
		for (uint32_t r = 0; r < moe.pl.replicas[e]; r++) {
			uint32_t d = moe.pl.ducks[e * DP_MAX_REPLICAS + r], i = 0;
			while (i < m->ducks_len && m->ducks[i] != d)
				i++;
			if (i == m->ducks_len)
				abort(); /* an expert placed off the layer's ducks was let through */
		}
}

static void decode_one(const char *buf, size_t len)
{
	struct dp_ctl_request r;
	char why[256];
	memset(why, 0, sizeof(why));
	int rc = dp_ctl_decode(buf, len, &r, why, sizeof(why));
	/* whatever failed, the reason is a terminated string that fits */
	if (rc != 0 && memchr(why, '\0', sizeof(why)) == NULL)
		abort();
	if (rc == 0 && r.type == DP_CTL_LOAD_WEIGHTS)
		load_rules(&r.u.load_weights);
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
