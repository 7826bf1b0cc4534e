/* dp_idle.h: what an agent does after a loop that found no work (Aeron's idle strategies). */
#ifndef DP_IDLE_H
#define DP_IDLE_H

#include <stdint.h>

enum dp_idle_kind { DP_IDLE_SPIN, DP_IDLE_YIELD, DP_IDLE_BACKOFF };

struct dp_idle {
	enum dp_idle_kind kind;
	uint32_t count;
	uint32_t park_ns;
};

int dp_idle_parse(const char *name, enum dp_idle_kind *out);
void dp_idle_init(struct dp_idle *s, enum dp_idle_kind kind);
/* work > 0 resets; else spin, then yield, then sleep for growing periods (backoff). */
void dp_idle_idle(struct dp_idle *s, int work);

#endif /* DP_IDLE_H */
