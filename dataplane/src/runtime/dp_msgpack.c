/* dp_msgpack.c: msgpack helpers shared by the config reader and the control agent. */
#include "dp_msgpack.h"

#include <stdio.h>
#include <string.h>

#include "dp_common.h"

const msgpack_object *dp_msgpack_get(const msgpack_object *map, const char *key)
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

int dp_msgpack_u64(const msgpack_object *map, const char *key, uint64_t *out, uint64_t dflt,
	      uint64_t max)
{
	const msgpack_object *o = dp_msgpack_get(map, key);
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

int dp_msgpack_u32(const msgpack_object *map, const char *key, uint32_t *out, uint32_t dflt)
{
	uint64_t v;
	if (dp_msgpack_u64(map, key, &v, dflt, UINT32_MAX) < 0)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int dp_msgpack_bool(const msgpack_object *map, const char *key, bool *out, bool dflt)
{
	const msgpack_object *o = dp_msgpack_get(map, key);
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

int dp_msgpack_str(const msgpack_object *map, const char *key, char *out, size_t cap, const char *dflt)
{
	const msgpack_object *o = dp_msgpack_get(map, key);
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

void dp_msgpack_key(msgpack_packer *pk, const char *key)
{
	size_t n = strlen(key);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, key, n);
}

void dp_msgpack_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
	size_t n = strlen(val);
	dp_msgpack_key(pk, key);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, val, n);
}

void dp_msgpack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val)
{
	dp_msgpack_key(pk, key);
	msgpack_pack_uint64(pk, val);
}
