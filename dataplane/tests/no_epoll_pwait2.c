/* no_epoll_pwait2.so: an LD_PRELOAD shim whose epoll_pwait2 fails with ENOSYS, as glibc's
 * wrapper does on a kernel before 5.11 (EPERM under an older seccomp profile).
 * tests/dataplane/test_wakeups.py starts the dataplane under it: park() once returned at
 * once there, and an idle dataplane spun a whole core. Built without sanitizers (it only
 * adds a symbol; a sanitizer build's dataplane brings its own runtime).
 */
#include <errno.h>
#include <signal.h>
#include <sys/epoll.h>
#include <time.h>

int epoll_pwait2(int epfd, struct epoll_event *ev, int n, const struct timespec *t,
		 const sigset_t *sigmask)
{
	(void)epfd;
	(void)ev;
	(void)n;
	(void)t;
	(void)sigmask;
	errno = ENOSYS; /* a kernel before 5.11, or a seccomp filter that predates it */
	return -1;
}
