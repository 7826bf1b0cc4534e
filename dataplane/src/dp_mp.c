/* dp_mp.c: msgpack helpers shared by the config reader and the control agent. */
#include "dp_mp.h"

#include <stdio.h>
#include <string.h>

#include "dp_common.h"

const msgpack_object *dp_mp_get(const msgpack_object *map, const char *key)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	size_t klen = strlen(key);
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
		    !memcmp(k->via.str.ptr, key, klen))
			return &map->via.map.ptr[i].val;
	}
	return NULL;
}

int dp_mp_u64(const msgpack_object *map, const char *key, uint64_t *out, uint64_t dflt,
	      uint64_t max)
{
	const msgpack_object *o = dp_mp_get(map, key);
	if (!o || o->type == MSGPACK_OBJECT_NIL) {
		*out = dflt;
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) {
		dp_set_error("'%s' must be an integer in [0, %lu]", key, (unsigned long)max);
		return -1;
	}
	*out = o->via.u64;
	return 0;
}

int dp_mp_u32(const msgpack_object *map, const char *key, uint32_t *out, uint32_t dflt)
{
	uint64_t v;
	if (dp_mp_u64(map, key, &v, dflt, UINT32_MAX) < 0)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int dp_mp_bool(const msgpack_object *map, const char *key, bool *out, bool dflt)
{
	const msgpack_object *o = dp_mp_get(map, key);
	if (!o || o->type == MSGPACK_OBJECT_NIL) {
		*out = dflt;
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_BOOLEAN) {
		dp_set_error("'%s' must be true or false", key);
		return -1;
	}
	*out = o->via.boolean;
	return 0;
}

int dp_mp_str(const msgpack_object *map, const char *key, char *out, size_t cap, const char *dflt)
{
	const msgpack_object *o = dp_mp_get(map, key);
	if (!o || o->type == MSGPACK_OBJECT_NIL) {
		snprintf(out, cap, "%s", dflt);
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap) {
		dp_set_error("'%s' must be a string shorter than %zu bytes", key, cap);
		return -1;
	}
	memcpy(out, o->via.str.ptr, o->via.str.size);
	out[o->via.str.size] = '\0';
	return 0;
}

int dp_mp_uints(const msgpack_object *map, const char *key, uint32_t *out, uint32_t cap,
		uint32_t *n, uint32_t max)
{
	const msgpack_object *o = dp_mp_get(map, key);
	*n = 0;
	if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > cap) {
		dp_set_error("'%s' must be a list of at most %u integers", key, cap);
		return -1;
	}
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];
		if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > max) {
			dp_set_error("'%s'[%u] must be an integer in [0, %u]", key, i, max);
			return -1;
		}
		out[i] = (uint32_t)e->via.u64;
	}
	*n = o->via.array.size;
	return 0;
}

void dp_mp_key(msgpack_packer *pk, const char *key)
{
	size_t n = strlen(key);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, key, n);
}

void dp_mp_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	size_t n = strlen(val);
	dp_mp_key(pk, key);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, val, n);
}

void dp_mp_kv_u64(msgpack_packer *pk, const char *key, uint64_t val)
{
	dp_mp_key(pk, key);
	msgpack_pack_uint64(pk, val);
}

void dp_mp_kv_bool(msgpack_packer *pk, const char *key, bool val)
{
	dp_mp_key(pk, key);
	if (val)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

/* --- the pre-scan --------------------------------------------------------------------- */

static uint64_t be(const uint8_t *p, uint32_t n)
{
	uint64_t v = 0;
	for (uint32_t i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

int dp_mp_prescan(const char *buf, size_t len, uint32_t max_depth, char *why, size_t n)
{
	/* left[d]: objects still owed to the container open at depth d (a map owes 2 per entry) */
	uint64_t left[DP_MP_MAX_DEPTH + 1];
	uint32_t depth = 0;
	const uint8_t *p = (const uint8_t *)buf, *end = p + len;
	if (max_depth > DP_MP_MAX_DEPTH)
		max_depth = DP_MP_MAX_DEPTH;
	left[0] = 1; /* exactly one object at the top */
	while (depth > 0 || left[0] > 0) {
		if (left[depth] == 0) {
			depth--;
			continue;
		}
		if (p >= end) {
			snprintf(why, n, "message ends inside an object (byte %zu)", len);
			return -1;
		}
		left[depth]--;
		uint8_t b = *p++;
		size_t rest = (size_t)(end - p);
		uint64_t body = 0, count = 0; /* bytes this object carries; elements it opens */
		uint32_t lenbytes = 0;
		bool map = false;
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
			body = 0;
		} else if (b <= 0x8f) {
			count = b & 0x0f, map = true;
		} else if (b <= 0x9f) {
			count = b & 0x0f;
		} else if (b <= 0xbf) {
			body = b & 0x1f;
		} else {
			switch (b) {
			case 0xc1:
				snprintf(why, n, "byte 0xc1 is not msgpack (offset %zu)", len - rest - 1);
				return -1;
			case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
			case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
				lenbytes = b <= 0xc6 ? 1u << (b - 0xc4) : 1u << (b - 0xd9);
				break;
			case 0xc7: case 0xc8: case 0xc9: /* ext 8/16/32: length, then a type byte */
				lenbytes = 1u << (b - 0xc7);
				body = 1;
				break;
			case 0xca: body = 4; break;
			case 0xcb: body = 8; break;
			case 0xcc: case 0xcd: case 0xce: case 0xcf: body = 1u << (b - 0xcc); break;
			case 0xd0: case 0xd1: case 0xd2: case 0xd3: body = 1u << (b - 0xd0); break;
			case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
				body = 1 + (1u << (b - 0xd4)); /* fixext: type byte + 1..16 */
				break;
			case 0xdc: case 0xdd: /* array 16/32 */
				if (rest < (b == 0xdc ? 2u : 4u))
					goto short_header;
				count = be(p, b == 0xdc ? 2 : 4);
				p += b == 0xdc ? 2 : 4;
				break;
			case 0xde: case 0xdf: /* map 16/32 */
				if (rest < (b == 0xde ? 2u : 4u))
					goto short_header;
				count = be(p, b == 0xde ? 2 : 4);
				p += b == 0xde ? 2 : 4;
				map = true;
				break;
			}
		}
		if (lenbytes) {
			if (rest < lenbytes)
				goto short_header;
			body += be(p, lenbytes);
			p += lenbytes;
		}
		rest = (size_t)(end - p);
		if (body > rest) {
			snprintf(why, n, "a string or binary at byte %zu declares %llu bytes, %zu are left",
				 len - rest, (unsigned long long)body, rest);
			return -1;
		}
		p += body;
		if (map)
			count *= 2; /* <= 2^33: no overflow in 64 bits */
		if (count) {
			/* every element takes at least one byte: a longer count is a lie */
			if (count > (uint64_t)(end - p)) {
				snprintf(why, n,
					 "a %s at byte %zu declares %llu elements, %zu bytes are left",
					 map ? "map" : "array", len - (size_t)(end - p),
					 (unsigned long long)(map ? count / 2 : count), (size_t)(end - p));
				return -1;
			}
			if (depth + 1 > max_depth) {
				snprintf(why, n, "nesting deeper than %u", max_depth);
				return -1;
			}
			left[++depth] = count;
		}
	}
	if (p != end) {
		snprintf(why, n, "%zu bytes after the message", (size_t)(end - p));
		return -1;
	}
	return 0;
short_header:
	snprintf(why, n, "message ends inside a length (byte %zu)", len);
	return -1;
}
