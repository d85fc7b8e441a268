/* exit, _exit or exec by a thread with a cancel pending and enabled, while
 * a DDP-mode socket holds bytes its peer never reads: the process ends as
 * without the preload (issue 12: the library's waits before the end were
 * libc cancellation points, and the process aborted, "FATAL: exception
 * not rethrown"; cancel.c: the blocked calls of a switched pair; helpers:
 * cancelpair.h). One case per run: cancelexit CASE [plain]; the process
 * ends in the thread's call (no "ok" line).
 *
 *   exit      exit() by a thread with a cancel pending and enabled (it
 *             enabled cancellation after the cancel came, and made no
 *             cancellation point since), with bytes buffered in the
 *             socket (non-blocking writes until EAGAIN, the peer never
 *             reads): the process ends with the thread's status, 0, after
 *             the exit's wait for those bytes (the library's exit handler
 *             waited in libc's nanosleep, a cancellation point: the
 *             process aborted, "FATAL: exception not rethrown");
 *   exitnow   the same with _exit (the library's flush of the bytes before
 *             it waited in nanosleep too);
 *   exec      the same with execv of /bin/true (the library's wait for
 *             the bytes before an exec likewise): the process becomes
 *             /bin/true, status 0.
 */
#include "cancelpair.h"

/* exit: fills the socket's buffers, then exits with its cancel pending. */
static atomic_int filled;
static int exit_how; /* 0 exit, 1 _exit, 2 execv */
static void *exit_pending(void *a) {
    (void)a;
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL) == 0);
    started();
    static char chunk[32 << 10];
    memset(chunk, 'x', sizeof chunk);
    long spins = 0;
    for (;;) {
        ssize_t r = send(victim, chunk, sizeof chunk, MSG_DONTWAIT);
        if (r < 0) {
            CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
            break;
        }
        CHECK(spins++ < 100000);
    }
    atomic_store(&filled, 1);
    static char b;
    CHECK(read(go[0], &b, 1) == 1);
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL) == 0);
    if (exit_how == 1) _exit(0);
    if (exit_how == 2) {
        static char *const args[] = {"/bin/true", NULL};
        execv(args[0], args);
        _exit(3);
    }
    exit(0);
}

int main(int argc, char **argv) {
    cancel_start(argc, argv, 0);
    const char *cs = argv[1];
    if (!strcmp(cs, "exit") || !strcmp(cs, "exitnow") || !strcmp(cs, "exec")) {
        exit_how = !strcmp(cs, "exitnow") ? 1 : !strcmp(cs, "exec") ? 2 : 0;
        /* The process ends in the thread's exit(0): no "ok" line. */
        CHECK(pipe(go) == 0);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, exit_pending, NULL) == 0);
        long spins = 0;
        while (!atomic_load(&filled)) {
            CHECK(spins++ < 1000000000);
            sched_yield();
        }
        CHECK(pthread_cancel(t) == 0);
        CHECK(write(go[1], "g", 1) == 1);
        pthread_join(t, NULL);
        fprintf(stderr, "the thread returned from exit\n");
        return 1;
    }
    fprintf(stderr, "unknown case %s\n", cs);
    return 2;
}
