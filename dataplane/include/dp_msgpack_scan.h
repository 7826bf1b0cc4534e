/* dp_msgpack_scan.h: a bounded pre-scan of raw msgpack, before any decoder allocates.
 *
 * msgpack-c (and any decoder that trusts declared lengths) reserves memory for the
 * count a container declares: a 150-byte control message once asked for ~240 GiB.
 * This walks one object without allocating and refuses every length that cannot be
 * true. Header-only so that the dataplane, the cffi module (the mock dataplane) and
 * the fuzz harnesses run the one rule.
 */
#ifndef DP_MSGPACK_SCAN_H
#define DP_MSGPACK_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Deepest nesting dp_msgpack_prescan can follow. */
#define DP_MSGPACK_MAX_DEPTH 32

/* Big-endian unsigned of n bytes. */
static inline uint64_t dp_msgpack_be(const uint8_t *p, uint32_t n)
{
	uint64_t v = 0;
	for (uint32_t i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* Walk one msgpack object in buf without allocating: 0 when it is exactly len bytes,
 * every declared str/bin/ext length fits the bytes left, every array or map declares
 * no more elements than bytes left (each takes one at least), and maps and arrays nest
 * at most max_depth deep; else -1 with why. */
static inline int dp_msgpack_prescan(const char *buf, size_t len, uint32_t max_depth, char *why,
				size_t n)
{
	/* left[d]: objects still owed to the container open at depth d (a map owes 2 per entry) */
	uint64_t left[DP_MSGPACK_MAX_DEPTH + 1];
	uint32_t depth = 0;
	const uint8_t *p = (const uint8_t *)buf, *end = p + len;
	if (max_depth > DP_MSGPACK_MAX_DEPTH)
		max_depth = DP_MSGPACK_MAX_DEPTH;
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
				count = dp_msgpack_be(p, b == 0xdc ? 2 : 4);
				p += b == 0xdc ? 2 : 4;
				break;
			case 0xde: case 0xdf: /* map 16/32 */
				if (rest < (b == 0xde ? 2u : 4u))
					goto short_header;
				count = dp_msgpack_be(p, b == 0xde ? 2 : 4);
				p += b == 0xde ? 2 : 4;
				map = true;
				break;
			}
		}
		if (lenbytes) {
			if (rest < lenbytes)
				goto short_header;
			body += dp_msgpack_be(p, lenbytes);
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

#endif /* DP_MSGPACK_SCAN_H */
