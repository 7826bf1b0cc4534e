/* dp_why.h: a refusal's reason, written once. Every checker of input from someone else
 * (routing tables, control messages, descriptors, the control decoder's fields) returns
 * a code and says why in a caller's buffer; this is that one line of vsnprintf. */
#ifndef DP_WHY_H
#define DP_WHY_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Write the reason into why (n bytes; nothing when why is NULL or n is 0), return rc. */
static inline int dp_vrefuse(int rc, char *why, size_t n, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));
static inline int dp_vrefuse(int rc, char *why, size_t n, const char *fmt, va_list ap)
{
	if (why && n)
		vsnprintf(why, n, fmt, ap);
	return rc;
}

static inline int dp_refuse(int rc, char *why, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static inline int dp_refuse(int rc, char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	dp_vrefuse(rc, why, n, fmt, ap);
	va_end(ap);
	return rc;
}

#endif /* DP_WHY_H */
