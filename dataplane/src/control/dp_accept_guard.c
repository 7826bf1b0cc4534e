/* dp_accept_guard.c: the control socket survives running out of file descriptors.
 *
 * libzmq (4.3.4, Debian 12's, and master as of 2026) asserts when accept4() on a
 * listening socket fails with EMFILE (src/ipc_listener.cpp: errno_assert lists EAGAIN,
 * EINTR, ECONNABORTED, EPROTO and ENFILE, not EMFILE), so a local peer that opens
 * connections faster than the control agent closes them could abort the dataplane.
 * The control agent's max_connections check runs after libzmq's I/O thread accepted,
 * which is too late: the race is lost under a flood.
 *
 * The fix sits under libzmq: this executable defines accept4(), which the dynamic
 * linker binds libzmq's calls to (an executable's symbols come first), and calls the
 * next definition (libc's, or a sanitizer's interceptor). On EMFILE it sheds the
 * connection with the classic reserve descriptor (libev, nginx): close the spare fd,
 * accept the pending connection into it, close that at once, take the spare again; and
 * tells libzmq ECONNABORTED, which it ignores (the peer sees its connection closed).
 * Without shedding, the connection would stay in the backlog and libzmq's epoll would
 * report it again at once: a busy loop until some descriptor is freed.
 *
 * Counted as connections_shed (dp_accept_guard_shed()). main() takes the reserve at start
 * (dp_accept_guard_init), while descriptors are plentiful; the first accept4() otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dp_accept_guard.h"
#include "dp_barrier.h"

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);

static accept4_fn next_accept4;
static int reserve = -1;
static uint64_t shed;
/* libzmq may run several I/O threads: one of them at a time juggles the reserve */
static pthread_mutex_t reserve_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
	next_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
	reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void dp_accept_guard_init(void)
{
	pthread_once(&once, resolve);
}

uint64_t dp_accept_guard_shed(void)
{
	return dp_load_relaxed_u64(&shed);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
	pthread_once(&once, resolve);
	if (!next_accept4) {
		errno = ENOSYS;
		return -1;
	}
	int s = next_accept4(fd, addr, addrlen, flags);
	if (s >= 0 || errno != EMFILE)
		return s;
	pthread_mutex_lock(&reserve_lock);
	if (reserve >= 0) {
		close(reserve);
		s = next_accept4(fd, NULL, NULL, SOCK_CLOEXEC);
		if (s >= 0)
			close(s);
		reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	dp_store_relaxed_u64(&shed, shed + 1); /* one writer at a time: the lock */
	pthread_mutex_unlock(&reserve_lock);
	errno = ECONNABORTED;
	return -1;
}
