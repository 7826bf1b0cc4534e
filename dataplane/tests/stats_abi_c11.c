/* stats_abi_c11: the stats segment's generated header (gen/dp_stats_abi.h) compiles alone as
 * strict ISO C11 (-std=c11, include/gen only), as a reader written in C would include it,
 * and its _Static_asserts, which pin every offset of the segment, hold.
 * tests/dataplane/test_stats.py runs it (exit 0) beside its check that the header's
 * plan is the one the Python readers use.
 */
#include "dp_stats_abi.h"

int main(void)
{
	return 0;
}
