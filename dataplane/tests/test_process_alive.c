/* test_process_alive.c: dp_process_alive() calls a client dead only when the kernel says
 * so (its /proc/<pid>/stat is gone: ENOENT, ESRCH; it is a zombie; a newer process has
 * its pid), never because /proc could not be read or parsed just then (no descriptor
 * left, a read that failed, a line that does not parse): the control agent reclaims the
 * segment of a client it calls dead, and a live client's forwards would fail with it.
 *
 * The kernel cannot be made to fail those reads on demand, so this program replaces
 * /proc/<pid>/stat of the pid under test: it defines fopen, which the dataplane's objects
 * linked into it call (dp_client.c reads the file with fopen), and hands every other path
 * to the C library's. Exit 0 pass, 1 fail, 77 skip.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_client.h"
#include "test_check.h"

/* What /proc/<fake.pid>/stat reads as while fake.pid is set. */
static struct {
	pid_t pid;
	int open_errno; /* fopen fails with this */
	int read_errno; /* else the first read fails with this */
	char text[512]; /* else this is its content */
	int opened;     /* times dp_client.c asked for it */
} fake;

static ssize_t failing_read(void *cookie, char *buf, size_t size)
{
	(void)cookie, (void)buf, (void)size;
	errno = fake.read_errno;
	return -1;
}

FILE *fopen(const char *path, const char *mode)
{
	char stat_path[64];
	snprintf(stat_path, sizeof(stat_path), "/proc/%d/stat", (int)fake.pid);
	if (fake.pid && !strcmp(path, stat_path)) {
		fake.opened++;
		if (fake.open_errno) {
			errno = fake.open_errno;
			return NULL;
		}
		if (fake.read_errno)
			return fopencookie(NULL, mode, (cookie_io_functions_t){ .read = failing_read });
		return fmemopen(fake.text, strlen(fake.text), mode);
	}
	FILE *(*libc_fopen)(const char *, const char *);
	*(void **)&libc_fopen = dlsym(RTLD_NEXT, "fopen");
	return libc_fopen(path, mode);
}

/* A stat line of a process in `state` started at `ticks` (field 22), its name holding
 * what fooled parsers before: spaces and a closing parenthesis. */
static void fake_stat(pid_t pid, char state, unsigned long long ticks)
{
	memset(&fake, 0, sizeof(fake));
	fake.pid = pid;
	snprintf(fake.text, sizeof(fake.text),
		 "%d (py thon) x) %c 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 %llu 19 20\n",
		 (int)pid, state, ticks);
}

static void fake_text(pid_t pid, const char *text)
{
	memset(&fake, 0, sizeof(fake));
	fake.pid = pid;
	snprintf(fake.text, sizeof(fake.text), "%s", text);
}

static void fake_errors(pid_t pid, int open_errno, int read_errno)
{
	memset(&fake, 0, sizeof(fake));
	fake.pid = pid;
	fake.open_errno = open_errno;
	fake.read_errno = read_errno;
}

int main(void)
{
	pid_t me = getpid();
	uint64_t ticks = dp_process_start_ticks((uint32_t)me);
	if (!ticks) {
		printf("test_process_alive: SKIP: cannot read /proc/%d/stat (no /proc?)\n", (int)me);
		return 77;
	}

	/* the real /proc: this process lives; one with another start time took its pid */
	CHECK(dp_process_alive((uint32_t)me, ticks), "this process is alive");
	CHECK(!dp_process_alive((uint32_t)me, ticks + 1), "another start time: a reused pid");
	pid_t child = fork();
	if (child == 0)
		_exit(0);
	uint64_t child_ticks = dp_process_start_ticks((uint32_t)child); /* 0 if it exited already */
	waitpid(child, NULL, 0);
	CHECK(!dp_process_alive((uint32_t)child, child_ticks), "a reaped child is dead");

	/* the file as the kernel writes it */
	fake_stat(me, 'S', 4242);
	CHECK(dp_process_start_ticks((uint32_t)me) == 4242, "starttime is field 22");
	CHECK(dp_process_alive((uint32_t)me, 4242), "sleeping, same start: alive");
	CHECK(fake.opened == 2, "the stat file was read through this fopen (%d times)",
	      fake.opened);
	if (fake.opened == 0) {
		printf("test_process_alive: dp_client.c does not read /proc through fopen any more: "
		       "fake its reads another way\n");
		return 1;
	}
	fake_stat(me, 'Z', 4242);
	CHECK(!dp_process_alive((uint32_t)me, 4242), "a zombie is dead");
	fake_stat(me, 'X', 4242);
	CHECK(!dp_process_alive((uint32_t)me, 4242), "a dying process is dead");

	/* gone: the kernel says so */
	fake_errors(me, ENOENT, 0);
	CHECK(!dp_process_alive((uint32_t)me, 4242), "no stat file (ENOENT): dead");
	fake_errors(me, ESRCH, 0);
	CHECK(!dp_process_alive((uint32_t)me, 4242), "ESRCH at open: dead");
	fake_errors(me, 0, ESRCH);
	CHECK(!dp_process_alive((uint32_t)me, 4242), "ESRCH at read (reaped after the open): dead");

	/* cannot tell: look again at the next housekeeping, never reclaim */
	fake_errors(me, EMFILE, 0);
	CHECK(dp_process_alive((uint32_t)me, 4242), "no descriptor left (EMFILE): not dead");
	fake_errors(me, ENOMEM, 0);
	CHECK(dp_process_alive((uint32_t)me, 4242), "no memory at open (ENOMEM): not dead");
	fake_errors(me, 0, EIO);
	CHECK(dp_process_alive((uint32_t)me, 4242), "a read that failed (EIO): not dead");
	fake_errors(me, 0, ENOMEM);
	CHECK(dp_process_alive((uint32_t)me, 4242), "no memory at read (ENOMEM): not dead");
	fake_text(me, "");
	CHECK(dp_process_alive((uint32_t)me, 4242), "an empty read: not dead");
	fake_text(me, "4242 python S 1 2 3\n");
	CHECK(dp_process_alive((uint32_t)me, 4242), "no ')' after the name: not dead");
	fake_text(me, "4242 (python)");
	CHECK(dp_process_alive((uint32_t)me, 4242), "nothing after the name: not dead");
	fake_text(me, "4242 (python) S 1 2 3\n");
	CHECK(dp_process_alive((uint32_t)me, 4242), "a line cut short: not dead");
	/* at attach, though, a start time that cannot be read refuses the client (0) */
	CHECK(dp_process_start_ticks((uint32_t)me) == 0, "no start time from a short line");

	memset(&fake, 0, sizeof(fake));
	return test_result("test_process_alive");
}
