/* Signals interrupt blocking calls on DDP-mode sockets as on TCP (issue 12;
 * signal(7), "Interruption of system calls and library functions by signal
 * handlers"). One case per run: eintr CASE.
 *
 *   read      an 8 B read, handler without SA_RESTART: EINTR; the peer's
 *             bytes are read next (nothing lost).
 *   restart   the same read with SA_RESTART: the signals land and the read
 *             returns the peer's bytes.
 *   rcvtimeo  SO_RCVTIMEO set, SA_RESTART: EINTR all the same.
 *   waitall   an 8 B MSG_WAITALL read with 4 B there: returns the 4 B;
 *             the other 4 are read next.
 *   sink      a 1 MiB read (a sink offer) with the peer parked in its own
 *             read of the socket: EINTR; then 4 MiB from the peer arrive
 *             intact (a pattern checked byte by byte).
 *   placed    the sink case's read with SO_RCVTIMEO 600 s (no sink offered:
 *             its posted receives are pointed at the buffer, io/placed.rs):
 *             EINTR; the receives are pointed back and the 4 MiB arrive
 *             intact.
 *   send      32 KiB sends (copied: under the zero-copy size) until one
 *             blocks on credits and send-buffer room (the peer does not
 *             read): it fails with EINTR or returns a partial count; the
 *             rest of 16 MiB is sent after, the peer reads every byte in
 *             order. (A zero-copy send, 64 KiB and more, returns only once
 *             the engine has written out what it posted from the
 *             program's buffer: it may wait for the peer; README.)
 *   poll      poll(POLLIN, no timeout): EINTR.
 *   resethand an 8 B read, SIGUSR1's handler SA_RESETHAND without
 *             SA_RESTART (it is SIG_DFL again once it ran), SIGUSR2's with
 *             SA_RESTART: EINTR (Linux decides on the flags the handler had
 *             when it was delivered). SIGUSR1 once, SIGUSR2 for the
 *             retries (a signal between the engine's sleeps is lost;
 *             a second SIGUSR1 would kill the program).
 *   removed   SIGALRM's handler without SA_RESTART (no SA_RESETHAND) at
 *             the switch, removed by the program (SIG_DFL) before the
 *             read; SIGUSR1's with SA_RESTART: the read goes on and
 *             returns the peer's bytes (a handler removed on purpose is
 *             not one that reset itself as it ran; review r22-d item 3).
 *   errqueue  not a signal case: SO_TIMESTAMPING (transmit stamps) and
 *             IP_RECVERR set on the DDP socket, 8 B sent, then a read with
 *             nothing coming and SO_RCVTIMEO 1 s: EAGAIN, and the thread's
 *             CPU time under half the wall time (review r22-d item 2: the
 *             options were passed on to the engine's TCP socket, whose
 *             stamp poll reported as POLLERR, and the engine's polled sleep
 *             spun at 100 % on poll and EAGAIN). Since r22-e item 2 they
 *             stay in the library (sockopt.c stamps), so no entry reaches
 *             that queue here: the engine's answer to one is tested in its
 *             driver/rx.rs.
 *   two       two threads block in an 8 B recv of the one socket, handler
 *             without SA_RESTART: one drives the engine (asleep in its
 *             wait), the other waits for it (asleep in futex). Each is
 *             signalled in turn, the waiting one first (only while it sleeps
 *             in futex with the other in the engine's wait): each fails with
 *             EINTR; then the peer's two 8 B messages are read (the socket
 *             works on). Before the fix the waiter's std Condvar slept on
 *             through the handler, and 200 signals that landed did not end
 *             its call: the check fails there, it does not hang.
 *   tworestart the same two readers with SA_RESTART: 3 signals land in
 *             each one's sleep (the waiter's in futex first), both calls
 *             go on (Linux restarts recv) and return one of the peer's two
 *             messages each.
 *   tworcvtimeo the two case under SA_RESTART with SO_RCVTIMEO set: EINTR
 *             for both all the same.
 *
 * Synchronised on events, no sleeps: a signaller thread sends SIGUSR1 to
 * the main thread only while it is asleep in a system call (read from
 * /proc/self/task/TID/syscall), waits for the handler to have run (it
 * writes a pipe), and repeats until the call returned (a signal that lands
 * between the engine's sleeps runs its handler and the wait goes on, as one
 * that lands just before a TCP call's sleep). After a bounded number of
 * signals it lets the peer send instead, so a wrong answer fails the check
 * rather than hanging. The restart case sends 3 signals that landed in a
 * sleep, then lets the peer send. */
#include "ddppair.h"

#include <pthread.h>
#include <signal.h>
#include <linux/net_tstamp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>

static int c, s;
static int hpipe[2];  /* handler -> signaller: one byte per handler run */
static int gpipe[2];  /* signaller -> peer: go */
static int apipe[2];  /* main -> signaller: start signalling */
static pid_t main_tid;
static pthread_t main_thread;
static atomic_int done;  /* main's call returned */
static atomic_int handled;
static int restart_case;
static int resethand_case;

static void on_usr1(int sig) {
    (void)sig;
    int e = errno;
    char b = 1;
    atomic_fetch_add(&handled, 1);
    (void)!write(hpipe[1], &b, 1);
    errno = e;
}

static void handler(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
}

static void go_peer(void) {
    char b = 1;
    CHECK(write(gpipe[1], &b, 1) == 1);
}

/* The signaller: see the file's comment. */
static void *signaller(void *a) {
    (void)a;
    char armed;
    CHECK(read(apipe[0], &armed, 1) == 1);
    int landed = 0;
    for (int k = 0; k < 200 && !atomic_load(&done); k++) {
        /* Until the main thread sleeps (bounded: 10^7 looks). */
        long spins = 0;
        while (!thread_asleep(main_tid) && !atomic_load(&done) && spins++ < 10000000) sched_yield();
        if (atomic_load(&done)) break;
        CHECK(pthread_kill(main_thread, resethand_case && landed > 0 ? SIGUSR2 : SIGUSR1) == 0);
        char b;
        CHECK(read(hpipe[0], &b, 1) == 1);
        landed++;
        if (restart_case && landed == 3) break;
    }
    go_peer();
    return NULL;
}

static void arm(void) {
    char b = 1;
    CHECK(write(apipe[1], &b, 1) == 1);
}

static void wait_go(void) {
    char b;
    CHECK(read(gpipe[0], &b, 1) == 1);
}

static void *peer_small(void *a) {
    (void)a;
    ddp_mode(s);
    wait_go();
    CHECK(write(s, "abcdefgh", 8) == 8);
    return NULL;
}

static void *peer_halves(void *a) {
    (void)a;
    ddp_mode(s);
    CHECK(write(s, "abcd", 4) == 4);
    wait_go();
    CHECK(write(s, "efgh", 4) == 4);
    return NULL;
}

/* Reads the 8 B, says so (hpipe: no handler runs in its case), then
 * waits for the go. */
static void *peer_read8(void *a) {
    (void)a;
    ddp_mode(s);
    char b[8];
    CHECK(read(s, b, 8) == 8);
    char k = 1;
    CHECK(write(hpipe[1], &k, 1) == 1);
    wait_go();
    return NULL;
}

static double secs(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec / 1e6; }

static unsigned char pat(size_t off) { return (unsigned char)(off * 7 + (off >> 12)); }

#define BIG (4u << 20)
static void *peer_sink(void *a) {
    (void)a;
    ddp_mode(s);
    /* Parked in its own read: its engine answers the sink's cancel. */
    char b;
    CHECK(read(s, &b, 1) == 1 && b == 'r');
    unsigned char *buf = malloc(BIG);
    CHECK(buf != NULL);
    for (size_t i = 0; i < BIG; i++) buf[i] = pat(i);
    size_t off = 0;
    while (off < BIG) {
        ssize_t r = write(s, buf + off, BIG - off);
        CHECK(r > 0);
        off += (size_t)r;
    }
    free(buf);
    wait_go();
    return NULL;
}

#define SEND (16u << 20)
static void *peer_send(void *a) {
    (void)a;
    ddp_mode(s);
    wait_go();
    unsigned char *buf = malloc(1 << 16);
    CHECK(buf != NULL);
    size_t got = 0;
    while (got < SEND) {
        ssize_t r = read(s, buf, 1 << 16);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++) CHECK(buf[i] == pat(got + (size_t)i));
        got += (size_t)r;
    }
    free(buf);
    char b = 'k';
    CHECK(write(s, &b, 1) == 1);
    return NULL;
}

/* The two-reader cases: the readers' thread ids (0: not started yet),
 * handles, and results once done. */
static atomic_int rtid[2];
static pthread_t rth[2];
static atomic_int rdone[2];
static ssize_t rres[2];
static int rerr[2];
static char rbuf[2][8];

/* Reader i: an 8 B recv of c with SIGUSR1 unblocked (its creator blocks
 * it). */
static void *reader(void *a) {
    int i = (int)(intptr_t)a;
    atomic_store(&rtid[i], (int)syscall(SYS_gettid));
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    CHECK(pthread_sigmask(SIG_UNBLOCK, &m, NULL) == 0);
    ssize_t r = recv(c, rbuf[i], sizeof rbuf[i], 0);
    rerr[i] = errno;
    rres[i] = r;
    atomic_store(&rdone[i], 1);
    return NULL;
}

/* Whether reader i waits for the other: asleep in futex while the other
 * sleeps in the engine's wait (thread_asleep). */
static int reader_waits(int i) {
    pid_t t = atomic_load(&rtid[i]), o = atomic_load(&rtid[1 - i]);
    return t && o && !atomic_load(&rdone[1 - i]) && thread_syscall(t) == SYS_futex &&
           thread_asleep(o);
}

/* Whether reader i sleeps in its call: in futex or the engine's wait, the
 * other reader asleep in one of those too, or returned. */
static int reader_asleep(int i) {
    pid_t t = atomic_load(&rtid[i]), o = atomic_load(&rtid[1 - i]);
    if (!t || !o) return 0;
    long nr = thread_syscall(t);
    if (nr != SYS_futex && !thread_asleep(t)) return 0;
    return atomic_load(&rdone[1 - i]) || thread_syscall(o) == SYS_futex || thread_asleep(o);
}

/* The reader that waits for the other (reader_waits), looked for until
 * one does (bounded: 10^6 looks). */
static int waiting_reader(void) {
    for (long k = 0; k < 1000000; k++) {
        for (int i = 0; i < 2; i++)
            if (reader_waits(i)) return i;
        sched_yield();
    }
    fprintf(stderr, "no reader waited for the other\n");
    exit(1);
}

/* Sends reader i SIGUSR1 while it sleeps (`waiting`: only while it waits
 * for the other, reader_waits; else reader_asleep), waits for the handler
 * to have run, and repeats until its call returned, or `upto` signals
 * landed (0: no such limit). At most 200 (then the call is taken for one
 * that never returns: the case fails, it does not hang). A signal that
 * lands between sleeps, or in a short wait for the socket's lock, runs
 * its handler and the call goes on, as one just before a TCP call's
 * sleep: hence the repeats. Returns the signals that landed. */
static int signal_reader(int i, int waiting, int upto) {
    int landed = 0;
    while (!atomic_load(&rdone[i]) && (!upto || landed < upto)) {
        if (landed == 200) {
            fprintf(stderr, "reader %d: its call went on through %d signals\n", i, landed);
            exit(1);
        }
        long k = 0;
        while (!atomic_load(&rdone[i]) && !(waiting ? reader_waits(i) : reader_asleep(i))) {
            if (++k == 1000000) {
                fprintf(stderr, "reader %d: never asleep (waiting %d)\n", i, waiting);
                exit(1);
            }
            sched_yield();
        }
        if (atomic_load(&rdone[i])) break;
        CHECK(pthread_kill(rth[i], SIGUSR1) == 0);
        char b;
        CHECK(read(hpipe[0], &b, 1) == 1);
        landed++;
    }
    return landed;
}

/* The peer of the two-reader cases: two 8 B messages after the go. */
static void *peer_two(void *a) {
    (void)a;
    ddp_mode(s);
    wait_go();
    CHECK(write(s, "abcdefgh", 8) == 8);
    CHECK(write(s, "ijklmnop", 8) == 8);
    return NULL;
}

/* A two-reader case (see the file's comment): `restart`, the handler's
 * SA_RESTART; `rcvtimeo`, SO_RCVTIMEO 600 s on c. */
static void two_readers(const char *cs, int restart, int rcvtimeo) {
    handler(restart);
    if (rcvtimeo) set_rcvtimeo(c, 600000);
    /* SIGUSR1 only in the readers: this thread and the peer block it. */
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    CHECK(pthread_sigmask(SIG_BLOCK, &m, NULL) == 0);
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_two, NULL) == 0);
    ddp_mode(c);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&rth[i], NULL, reader, (void *)(intptr_t)i) == 0);
    int w = waiting_reader(), d = 1 - w;
    /* SA_RESTART without SO_RCVTIMEO: the calls go on. */
    int goes_on = restart && !rcvtimeo;
    int lw = signal_reader(w, 1, goes_on ? 3 : 0);
    int ld = signal_reader(d, 0, goes_on ? 3 : 0);
    fprintf(stderr, "%s: waiting reader %zd errno %d after %d signals, driving reader %zd errno %d after %d\n",
            cs, rres[w], rerr[w], lw, rres[d], rerr[d], ld);
    if (goes_on) {
        /* Both calls went on: the peer's two messages, one each. */
        CHECK(!atomic_load(&rdone[w]) && !atomic_load(&rdone[d]));
        go_peer();
        for (int i = 0; i < 2; i++) CHECK(pthread_join(rth[i], NULL) == 0);
        for (int i = 0; i < 2; i++) CHECK(rres[i] == 8);
        CHECK((!memcmp(rbuf[0], "abcdefgh", 8) && !memcmp(rbuf[1], "ijklmnop", 8)) ||
              (!memcmp(rbuf[1], "abcdefgh", 8) && !memcmp(rbuf[0], "ijklmnop", 8)));
    } else {
        for (int i = 0; i < 2; i++) {
            CHECK(pthread_join(rth[i], NULL) == 0);
            CHECK(rres[i] == -1 && rerr[i] == EINTR);
        }
        go_peer();
        char b[8];
        CHECK(read(c, b, sizeof b) == 8 && memcmp(b, "abcdefgh", 8) == 0);
        CHECK(read(c, b, sizeof b) == 8 && memcmp(b, "ijklmnop", 8) == 0);
    }
    CHECK(pthread_join(pt, NULL) == 0);
}

/* Starts the peer and the signaller, and switches; `armed`: the
 * signaller may signal at once (else after arm()). */
static void start(void *(*peer)(void *), pthread_t *pt, pthread_t *st, int armed) {
    /* SIGUSR1 only in the main thread: the others block it. */
    sigset_t m, old;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    sigaddset(&m, SIGUSR2);
    CHECK(pthread_sigmask(SIG_BLOCK, &m, &old) == 0);
    CHECK(pthread_create(pt, NULL, peer, NULL) == 0);
    ddp_mode(c);
    CHECK(pthread_create(st, NULL, signaller, NULL) == 0);
    CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0);
    if (armed) arm();
}

/* The case's 8 B read of c while the signaller signals, which stops once
 * it returned (done). Either (restarted) it went on through 3 or more
 * handled signals and returned the peer's bytes, or it failed with EINTR
 * and the connection still works: the peer's bytes come next. */
static void read8(const char *cs, int restarted) {
    char b[8];
    ssize_t r = read(c, b, sizeof b);
    int e = errno;
    atomic_store(&done, 1);
    fprintf(stderr, "%s: read %zd errno %d after %d signals\n", cs, r, e, atomic_load(&handled));
    if (restarted) {
        CHECK(r == 8 && memcmp(b, "abcdefgh", 8) == 0);
        CHECK(atomic_load(&handled) >= 3);
    } else {
        CHECK(r == -1 && e == EINTR);
        r = read(c, b, sizeof b);
        CHECK(r == 8 && memcmp(b, "abcdefgh", 8) == 0);
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *cs = argv[1];
    main_tid = (pid_t)syscall(SYS_gettid);
    main_thread = pthread_self();
    CHECK(pipe(hpipe) == 0 && pipe(gpipe) == 0 && pipe(apipe) == 0);
    tcp_pair(&c, &s);
    pthread_t pt, st;
    char b[8];
    if (!strcmp(cs, "read") || !strcmp(cs, "restart") || !strcmp(cs, "rcvtimeo")) {
        restart_case = !strcmp(cs, "restart");
        handler(strcmp(cs, "read") != 0);
        if (!strcmp(cs, "rcvtimeo")) set_rcvtimeo(c, 600000);
        start(peer_small, &pt, &st, 1);
        read8(cs, restart_case);
        pthread_join(st, NULL);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "resethand")) {
        /* The handlers before the switch: the library's first reading of
         * the dispositions sees SIGUSR1's. */
        resethand_case = 1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
        sa.sa_flags = SA_RESTART;
        CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);
        start(peer_small, &pt, &st, 1);
        read8(cs, 0);
        pthread_join(st, NULL);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "removed")) {
        /* SIGALRM's handler is there at the switch (the library's first
         * reading sees it without SA_RESTART), then removed, as after an
         * alarm-bounded connect. */
        restart_case = 1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sigemptyset(&sa.sa_mask);
        CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
        handler(1);
        start(peer_small, &pt, &st, 0);
        CHECK(signal(SIGALRM, SIG_DFL) != SIG_ERR);
        arm();
        read8(cs, 1);
        pthread_join(st, NULL);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "errqueue")) {
        start(peer_read8, &pt, &st, 0);
        int f = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
        CHECK(setsockopt(c, SOL_SOCKET, SO_TIMESTAMPING, &f, sizeof f) == 0);
        int on = 1;
        CHECK(setsockopt(c, IPPROTO_IP, IP_RECVERR, &on, sizeof on) == 0);
        CHECK(write(c, "abcdefgh", 8) == 8);
        char k;
        CHECK(read(hpipe[0], &k, 1) == 1);
        set_rcvtimeo(c, 1000);
        struct rusage u0, u1;
        struct timespec t0, t1;
        CHECK(getrusage(RUSAGE_THREAD, &u0) == 0);
        CHECK(clock_gettime(CLOCK_MONOTONIC, &t0) == 0);
        ssize_t r = read(c, b, sizeof b);
        int e = errno;
        CHECK(clock_gettime(CLOCK_MONOTONIC, &t1) == 0);
        CHECK(getrusage(RUSAGE_THREAD, &u1) == 0);
        double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        double cpu = secs(u1.ru_utime) - secs(u0.ru_utime) + secs(u1.ru_stime) - secs(u0.ru_stime);
        fprintf(stderr, "errqueue: read %zd errno %d, %.3f s CPU in %.3f s\n", r, e, cpu, wall);
        CHECK(r == -1 && (e == EAGAIN || e == EWOULDBLOCK));
        CHECK(cpu < wall / 2);
        atomic_store(&done, 1);
        arm();
        pthread_join(st, NULL);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "waitall")) {
        handler(0);
        start(peer_halves, &pt, &st, 0);
        /* The first half is there before the signals start. */
        CHECK(recv(c, b, 4, MSG_PEEK | MSG_WAITALL) == 4);
        arm();
        ssize_t r = recv(c, b, 8, MSG_WAITALL);
        int e = errno;
        atomic_store(&done, 1);
        fprintf(stderr, "waitall: recv %zd errno %d after %d signals\n", r, e, atomic_load(&handled));
        CHECK(r == 4 && memcmp(b, "abcd", 4) == 0);
        pthread_join(st, NULL);
        CHECK(recv(c, b, 4, MSG_WAITALL) == 4 && memcmp(b, "efgh", 4) == 0);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "sink") || !strcmp(cs, "placed")) {
        handler(0);
        if (!strcmp(cs, "placed")) set_rcvtimeo(c, 600000);
        start(peer_sink, &pt, &st, 1);
        size_t len = 1u << 20;
        unsigned char *buf = malloc(BIG);
        CHECK(buf != NULL);
        ssize_t r = read(c, buf, len);
        int e = errno;
        atomic_store(&done, 1);
        fprintf(stderr, "%s: read %zd errno %d after %d signals\n", cs, r, e, atomic_load(&handled));
        /* The peer sends nothing before 'r': nothing can be placed. */
        CHECK(r == -1 && e == EINTR);
        pthread_join(st, NULL);
        CHECK(write(c, "r", 1) == 1);
        size_t got = 0;
        while (got < BIG) {
            r = read(c, buf + got, BIG - got);
            CHECK(r > 0);
            got += (size_t)r;
        }
        for (size_t i = 0; i < BIG; i++) CHECK(buf[i] == pat(i));
        free(buf);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "send")) {
        handler(0);
        unsigned char *buf = malloc(SEND);
        CHECK(buf != NULL);
        for (size_t i = 0; i < SEND; i++) buf[i] = pat(i);
        start(peer_send, &pt, &st, 1);
        const size_t chunk = 32 << 10;
        size_t off = 0;
        ssize_t r;
        int e;
        for (;;) {
            CHECK(off < SEND);
            size_t n = SEND - off < chunk ? SEND - off : chunk;
            r = write(c, buf + off, n);
            e = errno;
            if (r != (ssize_t)n) break;
            off += n;
        }
        atomic_store(&done, 1);
        fprintf(stderr, "send: write %zd errno %d at %zu after %d signals\n", r, e, off, atomic_load(&handled));
        CHECK((r == -1 && e == EINTR) || (r > 0 && (size_t)r < chunk));
        pthread_join(st, NULL);
        if (r > 0) off += (size_t)r;
        while (off < SEND) {
            r = write(c, buf + off, SEND - off);
            CHECK(r > 0);
            off += (size_t)r;
        }
        char k;
        CHECK(read(c, &k, 1) == 1 && k == 'k');
        free(buf);
        pthread_join(pt, NULL);
    } else if (!strcmp(cs, "two") || !strcmp(cs, "tworestart") || !strcmp(cs, "tworcvtimeo")) {
        two_readers(cs, strcmp(cs, "two") != 0, !strcmp(cs, "tworcvtimeo"));
    } else if (!strcmp(cs, "poll")) {
        handler(0);
        start(peer_small, &pt, &st, 1);
        struct pollfd p = {c, POLLIN, 0};
        int r = poll(&p, 1, -1);
        int e = errno;
        atomic_store(&done, 1);
        fprintf(stderr, "poll: %d errno %d after %d signals\n", r, e, atomic_load(&handled));
        CHECK(r == -1 && e == EINTR);
        pthread_join(st, NULL);
        CHECK(read(c, b, sizeof b) == 8 && memcmp(b, "abcdefgh", 8) == 0);
        pthread_join(pt, NULL);
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    close(c);
    close(s);
    printf("eintr %s: ok\n", cs);
    return 0;
}
