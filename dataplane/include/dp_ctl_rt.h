/* dp_ctl_rt.h: the checked field readers the generated control decoder (dp_ctl_gen.c,
 * from tools/codegen/ctlgen.py) is written against: each refuses a wrong type or a
 * value outside the schema's bounds and names the field in `why`. Written once, here,
 * rather than pasted into every generated file. */
#ifndef DP_CTL_RT_H
#define DP_CTL_RT_H

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp_why.h"

/* The generated decoder's refusal: -1, the field named in why (dp_why.h). */
static inline int fail(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int fail(char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = dp_vrefuse(-1, why, n, fmt, ap);
	va_end(ap);
	return rc;
}

static inline int get_uint(const msgpack_object *o, uint64_t lo, uint64_t hi, uint64_t *v,
			const char *field, char *why, size_t n)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 < lo || o->via.u64 > hi)
		return fail(why, n, "%s must be an integer in [%llu, %llu]", field,
				(unsigned long long)lo, (unsigned long long)hi);
	*v = o->via.u64;
	return 0;
}

static inline int get_float(const msgpack_object *o, double lo, double hi, double *v, const char *field,
			 char *why, size_t n)
{
	double x;
	if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
		x = o->via.f64;
	else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		x = (double)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		x = (double)o->via.i64;
	else
		return fail(why, n, "%s must be a number", field);
	if (!(x >= lo && x <= hi)) /* NaN fails too */
		return fail(why, n, "%s must be a number in [%g, %g]", field, lo, hi);
	*v = x;
	return 0;
}

static inline int get_str(const msgpack_object *o, uint32_t min, uint32_t max, char *out,
		   const char *field, char *why, size_t n)
{
	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size < min || o->via.str.size > max)
		return fail(why, n, "%s must be a string of %u to %u bytes", field, min, max);
	if (memchr(o->via.str.ptr, '\0', o->via.str.size))
		return fail(why, n, "%s must not hold a NUL byte", field);
	memcpy(out, o->via.str.ptr, o->via.str.size);
	out[o->via.str.size] = '\0';
	return 0;
}

/* control.PRINTABLE_ASCII: a client-chosen string (a name) reaches the admin's terminal
 * through duckpipe-top, duckpipe stats and the logs, so it holds 0x20-0x7e only. */
static inline int check_printable(const char *s, const char *field, char *why, size_t n)
{
	for (size_t i = 0; s[i]; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch < 0x20 || ch > 0x7e)
			return fail(why, n, "%s must be printable ASCII (0x20-0x7e): byte %zu is 0x%02x",
				    field, i, ch);
	}
	return 0;
}

static inline int get_list(const msgpack_object *o, uint32_t min, uint32_t max, const char *field,
			char *why, size_t n)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < min || o->via.array.size > max)
		return fail(why, n, "%s must be a list of %u to %u items", field, min, max);
	return 0;
}

static inline bool key_is(const msgpack_object *k, const char *name, size_t len)
{
	return k->via.str.size == len && !memcmp(k->via.str.ptr, name, len);
}

#endif /* DP_CTL_RT_H */
