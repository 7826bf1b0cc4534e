/* dp_mp.h: reading msgpack maps (msgpack-c object API) with typed, named errors. */
#ifndef DP_MP_H
#define DP_MP_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_mp_scan.h" /* dp_mp_prescan: run it before msgpack_unpack_next */

/* The value of `key` in map, or NULL (also when map is not a map). */
const msgpack_object *dp_mp_get(const msgpack_object *map, const char *key);

/* Each returns 0, or -1 with dp_error() naming the key. A missing key or nil takes dflt. */
int dp_mp_u64(const msgpack_object *map, const char *key, uint64_t *out, uint64_t dflt,
	      uint64_t max);
int dp_mp_u32(const msgpack_object *map, const char *key, uint32_t *out, uint32_t dflt);
int dp_mp_bool(const msgpack_object *map, const char *key, bool *out, bool dflt);
int dp_mp_str(const msgpack_object *map, const char *key, char *out, size_t cap, const char *dflt);
/* A list of unsigned integers, each <= max; n is set to the count. */
int dp_mp_uints(const msgpack_object *map, const char *key, uint32_t *out, uint32_t cap,
		uint32_t *n, uint32_t max);

/* Packing helpers (the replies use the generated dp_ctl_pack_* encoders). */
void dp_mp_key(msgpack_packer *pk, const char *key);
void dp_mp_kv_str(msgpack_packer *pk, const char *key, const char *val);
void dp_mp_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);
void dp_mp_kv_bool(msgpack_packer *pk, const char *key, bool val);

#endif /* DP_MP_H */
