/* desc_verdicts: what the dataplane decides about each fuzz_desc input, one JSON line each.
 *
 *   desc_verdicts FILE...
 *
 * Each FILE is decoded exactly as the fuzz_desc harness decodes it (this file includes
 * fuzz_desc.c) and checked as the dispatcher checks a descriptor (check(): dp_desc_check
 * on the layer read through dp_desc_layer_of). A line gives the layer, layout and limits
 * the input decoded to, the verdict (rc 0 or -1), the reason, and the plan of a
 * descriptor that passed; an input shorter than a descriptor gives {"file", "short":
 * true}. tests/hostile/test_desc_verdicts.py holds the mock dataplane's path to every
 * line. Plain C, no libFuzzer: dataplane/tests/meson.build builds it in every build dir,
 * with the dataplane's flags and the forward role's include directories.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_desc.c"

/* s as a JSON string, quotes included. */
static void put_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void put_layer(const struct dp_layer *l)
{
	if (!l) {
		printf("null");
		return;
	}
	printf("{\"id\": %u, \"kind\": %u, \"dtype\": %u, \"has_b_down\": %s, \"ready\": %s, "
	       "\"failed\": %s, \"hidden\": %u, \"ducks\": [",
	       l->id, l->kind, l->dtype, l->has_b_down ? "true" : "false",
	       l->ready ? "true" : "false", l->failed ? "true" : "false", l->hidden);
	for (uint32_t i = 0; i < l->nducks; i++)
		printf("%s%u", i ? ", " : "", l->ducks[i]);
	printf("], \"shard_sizes\": [");
	for (uint32_t i = 0; i < l->nducks; i++)
		printf("%s%u", i ? ", " : "", l->shard[i]);
	printf("]}");
}

static void put_plan(const struct dp_desc_plan *p)
{
	printf("{\"bytes\": %" PRIu64 ", \"timeout_us\": %" PRIu64 ", \"rows\": %u, "
	       "\"duck_index\": %d, \"targets\": [",
	       p->bytes, p->timeout_us, p->rows, p->duck_index);
	for (size_t i = 0; i < sizeof(p->targets) / sizeof(p->targets[0]); i++)
		printf("%s%" PRIu64, i ? ", " : "", p->targets[i]);
	printf("]}");
}

/* The whole file in a malloc'd buffer (*size bytes), or NULL. */
static uint8_t *slurp(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	uint8_t *buf = NULL;
	size_t cap = 0, n = 0, got;
	do {
		if (n == cap) {
			uint8_t *bigger = realloc(buf, cap = cap ? 2 * cap : 4096);
			if (!bigger) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = bigger;
		}
		got = fread(buf + n, 1, cap - n, f);
		n += got;
	} while (got);
	fclose(f);
	*size = n;
	return buf;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		size_t size;
		uint8_t *data = slurp(argv[i], &size);
		if (!data) {
			fprintf(stderr, "desc_verdicts: cannot read %s\n", argv[i]);
			return 1;
		}
		struct fuzz_desc_input in;
		printf("{\"file\": ");
		put_string(argv[i]);
		if (decode(data, size, &in) < 0) {
			printf(", \"short\": true}\n");
			free(data);
			continue;
		}
		struct dp_desc_plan plan;
		char why[DP_DESC_WHY_LEN] = "";
		memset(&plan, 0, sizeof(plan));
		int rc = check(&in, &plan, why, sizeof(why));
		printf(", \"rc\": %d, \"why\": ", rc);
		put_string(why);
		printf(", \"plan\": ");
		if (rc == 0)
			put_plan(&plan);
		else
			printf("null");
		printf(", \"layer\": ");
		put_layer(in.l);
		printf(", \"layout\": {\"slot_count\": %u, \"ring_capacity\": %u, \"act_slot_size\": "
		       "%" PRIu64 ", \"res_slot_size\": %" PRIu64 "}",
		       in.c.slot_count, in.c.ring_capacity, in.c.act_slot_size, in.c.res_slot_size);
		printf(", \"limits\": {\"max_forward_bytes\": %" PRIu64 ", \"default_timeout_us\": %u, "
		       "\"max_timeout_us\": %u}}\n",
		       in.lim.max_forward_bytes, in.lim.default_timeout_us, in.lim.max_timeout_us);
		free(data);
	}
	return 0;
}
