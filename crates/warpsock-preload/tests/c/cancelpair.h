/* Helpers of the pthread_cancel test programs (cancel.c: cancels of
 * blocked calls of a DDP-mode socket; cancelswitch.c: cancels in a switch,
 * in a residue socket's wait, a connect's wait; cancelexit.c: exit, _exit
 * and exec with a cancel pending; issue 12): the connected pair c/s and its
 * switch, the blocked thread (its start, its look from /proc until it
 * sleeps in a system call, its cancel and join), a call that must return at
 * once, and the check that the socket still works after. One case per run:
 * PROG CASE [plain] (plain: the same over TCP, no switch, the behaviour to
 * match).
 *
 * The blocked threads keep what they pass by address in static storage:
 * ASan does not unpoison the redzones of stack frames a cancellation
 * unwinds (glibc's unwinder ends in its own longjmp), and its thread exit
 * then reported a stack-buffer-underflow where a later frame reused them.
 *
 * Each: a thread blocks in the call (seen asleep in a system call, from
 * /proc), is cancelled and joined: PTHREAD_CANCELED. Then, from the main
 * thread, the socket still works both ways and nothing is lost: the
 * peer's next bytes are read, a write reaches the peer (after a cancelled
 * send: the peer reads every byte in order — the cancelled call's own
 * bytes, some or none — then the marker written after it).
 */
#include "ddppair.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>

static int c, s;
static int victim;              /* the descriptor the blocked call uses */
static atomic_int tid;          /* the blocked thread's id */

static inline void *peer_switch(void *a) {
    (void)a;
    ddp_mode(s);
    return NULL;
}

static inline void started(void) { atomic_store(&tid, (int)syscall(SYS_gettid)); }

/* A blocked call that returned: its result, for the main thread to print.
 * The thread then returns with no cancellation point on its way (stdio's
 * would act on the pending cancel, and the case would pass for it). */
static atomic_long ret_r, ret_errno;
static inline void *returned(long r) {
    atomic_store(&ret_r, r);
    atomic_store(&ret_errno, errno);
    return (void *)1;
}

static inline void *block_read(void *a) {
    (void)a;
    started();
    static char b[8];
    return returned(read(victim, b, sizeof b));
}

static inline void *block_waitall(void *a) {
    (void)a;
    started();
    static char b[8];
    return returned(recv(victim, b, sizeof b, MSG_WAITALL));
}

/* Whether thread t sleeps in a system call its blocked call (or the
 * library's wait for it) sleeps in: ddppair.h's calls, TCP's own read
 * and write, select, accept. */
static inline int sleeping(pid_t t) {
    if (thread_asleep(t)) return 1;
    long nr = thread_syscall(t);
    return nr == SYS_read || nr == SYS_write || nr == SYS_sendto || nr == SYS_pselect6 ||
           nr == SYS_accept || nr == SYS_accept4
#ifdef SYS_select
           || nr == SYS_select
#endif
        ;
}

/* Whether signal sig is pending for thread t (/proc status SigPnd). */
static inline int sig_pending(pid_t t, int sig) {
    char buf[4096];
    CHECK(task_file(t, "status", buf, sizeof buf) > 0);
    char *p = strstr(buf, "SigPnd:");
    CHECK(p != NULL);
    unsigned long long m = strtoull(p + 7, NULL, 16);
    return (m >> (sig - 1)) & 1;
}

/* Starts fn as the blocked thread and waits until it started (its tid
 * stored) and, if `asleep`, sleeps in a system call (one look). */
static inline pthread_t start_victim(void *(*fn)(void *), int asleep) {
    pthread_t t;
    atomic_store(&tid, 0);
    CHECK(pthread_create(&t, NULL, fn, NULL) == 0);
    long spins = 0;
    while (atomic_load(&tid) == 0 || (asleep && !sleeping(atomic_load(&tid)))) {
        CHECK(spins++ < 100000000);
        sched_yield();
    }
    return t;
}

/* Waits until the blocked thread sleeps in a system call five looks in a
 * row (one may catch a sleep of the first rounds; the call sleeps for
 * good once nothing comes); if `unsignalled`, with signal 32 (the
 * cancel's) not pending either. */
static inline void asleep_for_good(int unsignalled) {
    int asleep = 0;
    long spins = 0;
    while (asleep < 5) {
        CHECK(spins++ < 100000000);
        if ((!unsignalled || !sig_pending(atomic_load(&tid), 32)) && sleeping(atomic_load(&tid)))
            asleep++;
        else
            asleep = 0;
        sched_yield();
    }
}

/* Joins t, which must have ended cancelled (if not, prints what its
 * call, named `what`, returned). */
static inline void joined_cancelled(pthread_t t, const char *what) {
    void *res = NULL;
    CHECK(pthread_join(t, &res) == 0);
    if (res != PTHREAD_CANCELED)
        fprintf(stderr, "the %s returned %ld (errno %ld)\n", what, atomic_load(&ret_r),
                atomic_load(&ret_errno));
    CHECK(res == PTHREAD_CANCELED);
}

static int go[2]; /* pending, exit: main -> thread, the cancel was sent */

/* The pending cases' start: cancellation disabled until main's go (sent
 * once main has cancelled the thread), then enabled. */
static inline void disabled_until_go(void) {
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL) == 0);
    started();
    static char b;
    CHECK(read(go[0], &b, 1) == 1);
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL) == 0);
}

/* Starts `fn` and cancels it once it sleeps in a system call. */
static inline void cancel_blocked(void *(*fn)(void *)) {
    pthread_t t = start_victim(fn, 0);
    asleep_for_good(0);
    CHECK(pthread_cancel(t) == 0);
    joined_cancelled(t, "call");
}

/* The socket still works: the peer's next 8 bytes arrive at `mine`, our
 * 8 bytes arrive at `theirs`. */
static inline void still_works(int mine, int theirs) {
    char b[8];
    CHECK(write(theirs, "ABCDEFGH", 8) == 8);
    CHECK(recv(mine, b, 8, MSG_WAITALL) == 8 && memcmp(b, "ABCDEFGH", 8) == 0);
    CHECK(write(mine, "12345678", 8) == 8);
    CHECK(recv(theirs, b, 8, MSG_WAITALL) == 8 && memcmp(b, "12345678", 8) == 0);
}

/* Whether thread t sleeps (state S, /proc) — 0 once it is gone. */
static inline int sleeps_now(pid_t t) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)t);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && p[2] == 'S';
}

/* watchflags, sendfilezero: one call in a thread (fn, which stores its
 * result and sets call_done). Returns 1 if it returned without ever
 * sleeping for good (joined), 0 if it slept five looks in a row (then it
 * is cancelled and joined: PTHREAD_CANCELED). */
static atomic_int call_done;
static atomic_long call_r, call_errno;
static inline void *call_end(long r) {
    atomic_store(&call_errno, errno);
    atomic_store(&call_r, r);
    atomic_store(&call_done, 1);
    return NULL;
}
static inline int at_once(void *(*fn)(void *)) {
    atomic_store(&call_done, 0);
    atomic_store(&tid, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fn, NULL) == 0);
    int asleep = 0;
    long spins = 0;
    while (!atomic_load(&call_done)) {
        CHECK(spins++ < 100000000);
        pid_t id = atomic_load(&tid);
        asleep = id != 0 && sleeps_now(id) ? asleep + 1 : 0;
        if (asleep >= 5 && !atomic_load(&call_done)) {
            CHECK(pthread_cancel(t) == 0);
            joined_cancelled(t, "call that slept");
            return 0;
        }
        sched_yield();
    }
    CHECK(pthread_join(t, NULL) == 0);
    return 1;
}

/* The run's start (argv: CASE [plain]): the pair c (the connecting end)
 * and s (the accepted one), both switched into DDP mode unless plain or
 * `switching` (the case switches them itself, or leaves them TCP); the
 * victim c. Returns whether the run is plain. */
static inline int cancel_start(int argc, char **argv, int switching) {
    CHECK(argc >= 2);
    int plain = argc > 2 && !strcmp(argv[2], "plain");
    tcp_pair(&c, &s);
    if (!plain && !switching) {
        pthread_t p;
        CHECK(pthread_create(&p, NULL, peer_switch, NULL) == 0);
        ddp_mode(c);
        CHECK(pthread_join(p, NULL) == 0);
    }
    victim = c;
    return plain;
}
