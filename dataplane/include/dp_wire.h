/* dp_wire.h: building and checking duckpipe datagrams (host and duck emulator alike).
 *
 * Every datagram is one struct dp_wire_header followed by `length` payload
 * bytes. The protocol is little-endian; so are all hosts duckpipe runs on.
 */
#ifndef DP_WIRE_H
#define DP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dp_abi.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "duckpipe's wire format is little-endian and so must the host be"
#endif

#define DP_WIRE_HDR_LEN ((uint32_t)sizeof(struct dp_wire_header))
#define DP_IPV4_UDP_OVERHEAD 28u
#define DP_WIRE_MAX_DATAGRAM 65507u

/* Payload bytes per datagram for an MTU, rounded down to whole float32 values. */
static inline uint32_t dp_wire_payload_max(uint32_t mtu)
{
	uint32_t room = mtu - DP_IPV4_UDP_OVERHEAD - DP_WIRE_HDR_LEN;
	if (mtu > DP_WIRE_MAX_DATAGRAM + DP_IPV4_UDP_OVERHEAD)
		room = DP_WIRE_MAX_DATAGRAM - DP_WIRE_HDR_LEN;
	return room & ~3u;
}

/* Chunks needed for `total` bytes (a message always has at least one). */
static inline uint32_t dp_wire_chunk_count(uint64_t total, uint32_t payload)
{
	return total == 0 ? 1 : (uint32_t)((total + payload - 1) / payload);
}

/* Bytes in chunk `i` of a message of `total` bytes. */
static inline uint32_t dp_wire_chunk_len(uint64_t total, uint32_t payload, uint32_t i)
{
	uint64_t off = (uint64_t)i * payload;
	if (off >= total)
		return 0;
	return total - off < payload ? (uint32_t)(total - off) : payload;
}

static inline void dp_wire_init(struct dp_wire_header *h, uint8_t op, uint64_t session,
				uint64_t epoch)
{
	memset(h, 0, sizeof(*h));
	h->magic = DP_WIRE_MAGIC;
	h->version = DP_WIRE_VERSION;
	h->op = op;
	h->session = session;
	h->epoch = epoch;
}

/* Why a datagram was refused; each has a counter on the receiving side. */
enum dp_wire_verdict {
	DP_WIRE_OK = 0,
	DP_WIRE_SHORT,       /* shorter than a header */
	DP_WIRE_BAD_MAGIC,
	DP_WIRE_BAD_VERSION,
	DP_WIRE_BAD_OP,
	DP_WIRE_BAD_LENGTH,  /* length field disagrees with the datagram, or chunk geometry is wrong */
};

static inline const char *dp_wire_verdict_name(enum dp_wire_verdict v)
{
	static const char *const names[] = { "ok", "short", "bad_magic", "bad_version",
					      "bad_op", "bad_length" };
	return (unsigned)v < sizeof(names) / sizeof(names[0]) ? names[v] : "unknown";
}

/* The header of the datagram at buf copied into *h, and what can be checked of it
 * without state: framing and chunk geometry (*h is not filled when buf is SHORT).
 * Session, epoch, sender and forward id are the caller's to check. buf may sit at any
 * address: a DPDK port hands the payload up 2 bytes past an 8-byte boundary (behind
 * 42 bytes of Ethernet/IPv4/UDP headers), where reading the header in place as a
 * struct would be a misaligned access; the copy is 80 bytes in cache. */
static inline enum dp_wire_verdict dp_wire_read(const void *buf, size_t len,
						struct dp_wire_header *h)
{
	if (len < DP_WIRE_HDR_LEN)
		return DP_WIRE_SHORT;
	memcpy(h, buf, sizeof(*h));
	if (h->magic != DP_WIRE_MAGIC)
		return DP_WIRE_BAD_MAGIC;
	if (h->version != DP_WIRE_VERSION)
		return DP_WIRE_BAD_VERSION;
	if (h->op < DP_WIRE_OP_FORWARD || h->op > DP_WIRE_OP_LAYER)
		return DP_WIRE_BAD_OP;
	if ((uint64_t)h->length + DP_WIRE_HDR_LEN != len)
		return DP_WIRE_BAD_LENGTH;
	switch (h->op) {
	case DP_WIRE_OP_FORWARD:
	case DP_WIRE_OP_PARTIAL:
	case DP_WIRE_OP_WEIGHT:
		if (h->chunks == 0 || h->chunk >= h->chunks || h->offset > h->total ||
		    h->length > h->total - h->offset)
			return DP_WIRE_BAD_LENGTH;
		break;
	case DP_WIRE_OP_NACK:
		if (h->length % 4)
			return DP_WIRE_BAD_LENGTH;
		break;
	case DP_WIRE_OP_LAYER:
		if (h->length != sizeof(struct dp_wire_layer))
			return DP_WIRE_BAD_LENGTH;
		break;
	default:
		break;
	}
	return DP_WIRE_OK;
}

/* dp_wire_read, for a caller that needs only the verdict. */
static inline enum dp_wire_verdict dp_wire_check(const void *buf, size_t len)
{
	struct dp_wire_header h;
	return dp_wire_read(buf, len, &h);
}

/* The chunk size a data datagram implies (every chunk but the last is this long),
 * or 0 when its chunk, chunks, offset, length and total cannot all be true of one
 * message cut into equal chunks. A receiver keeps the first answer per sender and
 * message and refuses datagrams that imply another, so that one lying datagram
 * cannot poison a reassembly. Call after dp_wire_check() said OK. */
static inline uint32_t dp_wire_chunk_size(const struct dp_wire_header *h)
{
	uint64_t p;
	if (h->chunk + 1 < h->chunks) {
		p = h->length;
		if (p == 0 || h->offset != (uint64_t)h->chunk * p)
			return 0;
	} else { /* the last chunk: it ends the message, and may be short */
		if (h->offset + h->length != h->total)
			return 0;
		if (h->chunk == 0)
			return h->chunks == 1 && h->offset == 0 ? (h->length ? h->length : 1) : 0;
		if (h->offset % h->chunk)
			return 0;
		p = h->offset / h->chunk;
		if (p == 0 || h->length > p)
			return 0;
	}
	if (p > UINT32_MAX || (h->total + p - 1) / p != h->chunks)
		return 0;
	return (uint32_t)p;
}

/* The payload behind the header of the datagram at buf (not behind a copied header). */
static inline const void *dp_wire_payload(const void *buf)
{
	return (const uint8_t *)buf + DP_WIRE_HDR_LEN;
}

#endif /* DP_WIRE_H */
