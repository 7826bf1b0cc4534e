/* dp_common.c: logging and the per-thread error message. */
#include "dp_common.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

int dp_log_min = DP_LOG_INFO;

static __thread char errbuf[512];
static __thread char thread_name[16] = "main";

__attribute__((noinline)) void dp_close_untracked(int fd)
{
	close(fd);
}

void dp_set_thread_name(const char *name)
{
	snprintf(thread_name, sizeof(thread_name), "%s", name);
	pthread_setname_np(pthread_self(), thread_name);
}

const char *dp_printable(const char *in, char *out, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	for (size_t i = 0; in[i] && o + 5 < len; i++) {
		unsigned char ch = (unsigned char)in[i];
		if (ch >= 0x20 && ch <= 0x7e) {
			out[o++] = (char)ch;
			continue;
		}
		out[o++] = '\\';
		out[o++] = 'x';
		out[o++] = hex[ch >> 4];
		out[o++] = hex[ch & 15];
	}
	out[o] = '\0';
	return out;
}

void dp_log(enum dp_log_level level, const char *fmt, ...)
{
	static const char *const names[] = { "debug", "info", "warn", "error" };
	char line[1024], shown[4 * sizeof(line)];
	va_list ap;
	if ((int)level < dp_log_min)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	dp_printable(line, shown, sizeof(shown));
	fprintf(stderr, "duckpipe-dataplane[%s] %s: %s\n", thread_name, names[level], shown);
}

void dp_set_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
}

void dp_add_error_context(const char *fmt, ...)
{
	char ctx[256];
	char old[sizeof(errbuf)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ctx, sizeof(ctx), fmt, ap);
	va_end(ap);
	memcpy(old, errbuf, sizeof(old));
	size_t n = strlen(ctx);
	if (n > sizeof(errbuf) - 3)
		n = sizeof(errbuf) - 3;
	memcpy(errbuf, ctx, n);
	memcpy(errbuf + n, ": ", 2);
	size_t rest = sizeof(errbuf) - n - 3;
	size_t olen = strnlen(old, rest);
	memcpy(errbuf + n + 2, old, olen);
	errbuf[n + 2 + olen] = '\0';
}

const char *dp_error(void)
{
	return errbuf[0] ? errbuf : "unknown error";
}
