/* dp_counters.c: the counters' names, in enum dp_counter's order (dp_counters.h), for
 * the Stats reply and the stats segment. */
#include "dp_counters.h"

const char *const dp_counter_names[DP_NCOUNTERS] = {
#define DP_COUNTER_NAME(name) #name,
	DP_COUNTER_LIST(DP_COUNTER_NAME)
#undef DP_COUNTER_NAME
};
