/* dp_msgpack.h: reading msgpack maps (msgpack-c object API) with typed, named errors. */
#ifndef DP_MSGPACK_H
#define DP_MSGPACK_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_msgpack_scan.h" /* dp_msgpack_prescan: run it before msgpack_unpack_next */

/* The value of `key` in map, or NULL (also when map is not a map). */
const msgpack_object *dp_msgpack_get(const msgpack_object *map, const char *key);

/* Each returns 0, or -1 with dp_error() naming the key. A missing key or nil takes dflt. */
int dp_msgpack_u64(const msgpack_object *map, const char *key, uint64_t *out, uint64_t dflt,
	      uint64_t max);
int dp_msgpack_u32(const msgpack_object *map, const char *key, uint32_t *out, uint32_t dflt);
int dp_msgpack_bool(const msgpack_object *map, const char *key, bool *out, bool dflt);
int dp_msgpack_str(const msgpack_object *map, const char *key, char *out, size_t cap, const char *dflt);

/* Packing helpers (the replies use the generated dp_ctl_pack_* encoders). */
void dp_msgpack_key(msgpack_packer *pk, const char *key);
void dp_msgpack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void dp_msgpack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);

#endif /* DP_MSGPACK_H */
