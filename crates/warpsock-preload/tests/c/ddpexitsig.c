/* A signal handler that calls exit() while its thread is inside a call on
 * a DDP-mode socket: the process must end, as over TCP (review r25-c item
 * 3). The exit's closes of the sockets left open take each socket's lock;
 * the interrupted call may hold that lock (or the engine's, or the list of
 * sockets'), and a second take by the same thread waits for ever.
 *
 *   ddpexitsig fault [plain]
 *     The writer's receive of 8 B that came lands in a buffer it cannot
 *     write (PROT_NONE): in DDP mode the library's copy faults under the
 *     socket's lock, and the program's SIGSEGV handler calls exit(7) (over
 *     TCP the kernel returns EFAULT, and the program calls exit(7)). Every
 *     run, the same place.
 *   ddpexitsig spin [plain]
 *     ROUNDS times: the writer's second thread spins in send and
 *     recv(MSG_DONTWAIT) against an echoing peer; once it has had replies,
 *     the test sends the writer SIGTERM (the main thread blocks it: the
 *     spinning thread takes it, wherever it is), whose handler calls
 *     exit(7). Where the signal lands is the scheduler's: inside the
 *     library in many rounds, outside in others.
 *   ddpexitsig faultnow|spinnow [plain]
 *     As fault and spin, the handler calling _exit(7): an _exit over a
 *     stretch of a call of the library that may hold a lock flushes with
 *     every lock only tried and nothing allocated (faultnow_tail; over a
 *     sleep that holds no lock, sleep_sendnow, as from outside), so it
 *     ends as over TCP.
 *   ddpexitsig stopped [plain]
 *     As fault, in the writer's second thread, whose SIGSEGV handler says
 *     so and then waits for ever (the socket's lock held for good, in DDP
 *     mode); the main thread then calls exit(7): its exit's close of the
 *     socket cannot have the lock, and leaves the socket to the kernel.
 *   ddpexitsig wake_recv|wake_reset|wake_poll|wake_epoll [plain]
 *     The writer's second thread waits on its first connection (a blocking
 *     recv, poll for POLLIN|POLLRDHUP, or epoll_wait for EPOLLIN|EPOLLRDHUP:
 *     the doorbell) and ends the process with
 *     _exit(3) if that wait ends ("the peer closed"); its main thread calls
 *     exit(7) once that thread sleeps. Over TCP the peers' FINs come after
 *     the process. In DDP mode the exit's close of the first connection
 *     makes its peer read the end and close its own (a FIN back) while the
 *     exit still waits (the second connection's peer never closes: the
 *     exit's wait for its FIN lasts WARPSOCK_LINGER_MS): that FIN must not
 *     end the thread's wait (review r25-c item 4). wake_reset: as
 *     wake_recv, the first peer's close abortive (SO_LINGER {1, 0}: a
 *     reset, the thread's recv would fail with ECONNRESET). wake_send: the
 *     thread sends (MSG_NOSIGNAL) to a first peer that reads nothing, till
 *     it sleeps out of credits; that peer resets its connection (SO_LINGER
 *     {1, 0}) once the second peer read its end (the exit's close of the
 *     second connection, in DDP mode; the process's end, over TCP): the
 *     thread's send that meets that reset must not fail (ECONNRESET;
 *     review r26-a item 4).
 *   ddpexitsig sleep_recv|sleep_send [plain]
 *     The writer's SIGTERM handler calls exit(7) over its main thread's
 *     sleep in the library that holds no lock (review r26-a item 1):
 *     sleep_recv: it wrote a tail on its second connection (non-blocking
 *     sends, up to TAIL bytes) and then sleeps in a blocking recv on its
 *     first; sleep_send: it sleeps in a blocking send on the second, out
 *     of credits (its peer does not read yet). The second peer starts
 *     reading once the signal is sent: it must read every byte the
 *     writer's sends returned for (all of them and no more, sleep_recv),
 *     in order, then a clean end (0, not ECONNRESET), and closes; the first
 *     peer must read a clean end, then closes: the exit's close of the
 *     connection slept on must see that FIN (its wait's parked read
 *     given back: else the exit waits WARPSOCK_LINGER_MS, longer than
 *     LIMIT_MS in the test).
 *   ddpexitsig sleep_sendnow [plain]
 *     As sleep_send, the handler calling _exit(7) (review r26-d item 5):
 *     _exit flushes the send buffers over that sleep (it holds no lock),
 *     its wait given back first, so the flush sees the peer's credits and
 *     ends when the bytes are gone (the preload's test build says so on
 *     stderr), not after WARPSOCK_LINGER_MS (longer than LIMIT_MS: a hang).
 *     _exit closes nothing: what the peers read then is the kernels' (over
 *     TCP every byte and 0; in DDP mode the credits the second peer
 *     returns after the process may meet a closed socket, a reset): the
 *     second peer must read, in order, at least every byte the sends
 *     returned for, then 0 (or, in DDP mode, ECONNRESET).
 *   ddpexitsig sleep_poll|jump_poll [plain]
 *     As sleep_recv, the main thread sleeping in poll (POLLIN) on its
 *     first connection (review r26-d item 4: the exit over the poll's
 *     sleep leaves its wait's marks, the poll count and the watch, on
 *     that socket). jump_poll: the writer is sent SIGUSR1, whose handler
 *     siglongjmps out of the poll (the library's call never returns: its
 *     guard and its sleep's mark stay set), and the main thread then
 *     sleeps in pause() until the SIGTERM whose handler calls exit(7),
 *     over no call of the library: that exit holds no lock and must close
 *     the sockets as from outside (review r26-d item 3).
 *   ddpexitsig sleep_stdio [plain]
 *     As sleep_poll, the tail written to the second connection through a
 *     stdio stream (fdopen, a buffer larger than the tail, no fflush):
 *     the SIGTERM handler's exit over the poll must flush that stream
 *     before the sockets close, as glibc's exit does over TCP; the second
 *     peer reads the whole tail, then 0 (review r27-b item 1: the
 *     library's stdio flush skipped every stream over a sleep, and the
 *     tail was lost, a clean end after nothing).
 *   ddpexitsig sleep_stdio_send
 *     As sleep_send, the sends a stdio stream's (fdopen, an 8 MiB buffer,
 *     fflush of 4 MiB): the SIGTERM handler's exit lands in the stream's
 *     write (the library's send asleep out of credits, inside the
 *     stream's write callback, the stream's lock held by this thread):
 *     the exit flush must leave that stream alone (a second flush of its
 *     buffer would send its prefix again); the second peer reads a prefix
 *     of the stream, in order, then its end (DDP mode only: over TCP the
 *     kernel may take 4 MiB without a sleep).
 *   ddpexitsig faultnow_tail [plain]
 *     As sleep_recv, the writer's receive on its first connection the
 *     fault mode's (the first peer sends 8 B first), its SIGSEGV handler
 *     saying so on a pipe and calling _exit(7): in DDP mode an _exit over
 *     a stretch that holds a lock (the socket's, the copy's), as a
 *     handler's over the first 10 ms of a blocking receive. The second
 *     peer starts reading once the handler said so: it must read at least
 *     every byte the writer's sends returned for, in order, then 0 (or,
 *     in DDP mode, ECONNRESET: see sleep_sendnow) (review r27-b item 2:
 *     the _exit flushed nothing there, the buffered tail lost).
 *   ddpexitsig faultnow_close [plain]
 *     As faultnow_tail, the second connection closed (an ordinary close,
 *     handed to the library's background) once its tail was sent, before
 *     the faulting receive, and both its ends' kernel buffers small
 *     (SO_SNDBUF 4096 on the writer's end before the switch, SO_RCVBUF
 *     4096 at both), so the close still holds most of the tail in its
 *     engine when the _exit comes: the _exit over the locked stretch must
 *     wait for that close, its sending and its peer's kernel's
 *     acknowledgement, as from outside; the second peer must read every
 *     byte the sends returned for, in order, then 0 (or, in DDP mode,
 *     ECONNRESET) (review r28-c item 9: that _exit waited for the send
 *     buffers and the live sockets' engines alone, and the close's bytes
 *     were lost).
 * Each writer must end within LIMIT_MS with status 7; one that does not
 * is killed (SIGKILL, by its pid) and the run fails: exit 0 if every
 * writer ended so. */
#include "ddppair.h"

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define ROUNDS 20
#define LIMIT_MS 20000

static int plain;
static const char *mode;
/* faultnow, spinnow: the handlers call _exit, not exit. */
static int exit_now;
/* sleep_stdio: the tail goes through a stdio stream. */
static int stdio_mode;
/* faultnow_tail: the handler writes a byte here before its _exit. */
static int fault_told = -1;
/* faultnow_close: the second connection is closed after its tail. */
static int close_tail;

static void exit_7(int sig) {
    (void)sig;
    if (fault_told >= 0) CHECK(write(fault_told, "f", 1) == 1);
    if (exit_now) _exit(7);
    exit(7);
}

static void on(int sig) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_7;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(sig, &sa, NULL) == 0);
}

/* The echoing (spin) or sending (fault) peer, on s; at the writer's end
 * it waits to be killed (no exit of its own: the writer's is the only
 * report of the run's counters, WARPSOCK_STATS). */
static void peer(int s, int echo) {
    if (!plain) ddp_mode(s);
    static char b[4096];
    if (!echo) CHECK(write(s, "8 bytes!", 8) == 8);
    for (;;) {
        ssize_t n = read(s, b, sizeof b);
        if (n <= 0 || (echo && send(s, b, (size_t)n, MSG_NOSIGNAL) < 0))
            for (;;) pause();
    }
}

static int stopped_fd = -1;

/* The stopped mode's handler: says it runs, then never returns. */
static void stop_here(int sig) {
    (void)sig;
    char b = 's';
    (void)!write(stopped_fd, &b, 1);
    for (;;) pause();
}

/* The fault mode's receive (and the stopped mode's thread's). */
static void fault_recv(int c) {
    long page = sysconf(_SC_PAGESIZE);
    char *b = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(b != MAP_FAILED);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, -1) == 1 && (p.revents & POLLIN));
    ssize_t r = recv(c, b, 8, 0);
    /* Over TCP: EFAULT, no signal. */
    CHECK(r == -1 && errno == EFAULT);
}

static void *stopped_thread(void *a) {
    fault_recv(*(int *)a);
    stop_here(0);
    return NULL;
}

/* The stopped mode's writer (see the top). */
static void stopped_writer(int c) {
    if (!plain) ddp_mode(c);
    int told[2];
    CHECK(pipe(told) == 0);
    stopped_fd = told[1];
    on_fault(stop_here);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, stopped_thread, &c) == 0);
    char x;
    CHECK(read(told[0], &x, 1) == 1);
    exit(7);
}

static void fault_writer(int c) {
    if (!plain) ddp_mode(c);
    on(SIGSEGV);
    on(SIGBUS);
    fault_recv(c);
    exit(7);
}

static int wfd;
static int ready_fd;
static atomic_long replies;

static void *spin(void *a) {
    (void)a;
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    CHECK(pthread_sigmask(SIG_UNBLOCK, &term, NULL) == 0);
    static char b[4096];
    memset(b, 'x', 64);
    for (;;) {
        (void)send(wfd, b, 64, MSG_DONTWAIT | MSG_NOSIGNAL);
        ssize_t n = recv(wfd, b, sizeof b, MSG_DONTWAIT);
        if (n > 0 && atomic_fetch_add(&replies, 1) == 100) CHECK(write(ready_fd, "r", 1) == 1);
    }
    return NULL;
}

/* The spin mode's writer: says on ready when its thread had 100 replies,
 * then waits for SIGTERM (blocked here: the spinning thread takes it). */
static void spin_writer(int c, int ready) {
    if (!plain) ddp_mode(c);
    on(SIGTERM);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    CHECK(pthread_sigmask(SIG_BLOCK, &term, NULL) == 0);
    wfd = c;
    ready_fd = ready;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, spin, NULL) == 0);
    for (;;) pause();
}

static int wake_fd;
static int wake_poll;
static int wake_reset;
static atomic_int wake_tid;

static void *wake_wait(void *a) {
    (void)a;
    atomic_store(&wake_tid, (int)syscall(SYS_gettid));
    if (wake_poll == 2) {
        int ep = epoll_create1(0);
        CHECK(ep >= 0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = wake_fd};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, wake_fd, &ev) == 0);
        int n = epoll_wait(ep, &ev, 1, -1);
        fprintf(stderr, "ddpexitsig wake: epoll_wait %d events %#x during the exit\n", n,
                ev.events);
    } else if (wake_poll == 3) {
        static char b[65536];
        for (;;) {
            ssize_t n = send(wake_fd, b, sizeof b, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN) {
                fprintf(stderr, "ddpexitsig wake: send errno %d during the exit\n", errno);
                break;
            }
        }
    } else if (wake_poll) {
        struct pollfd p = {wake_fd, POLLIN | POLLRDHUP, 0};
        int n = poll(&p, 1, -1);
        fprintf(stderr, "ddpexitsig wake: poll %d revents %#x during the exit\n", n, p.revents);
    } else {
        char b[64];
        ssize_t n = recv(wake_fd, b, sizeof b, 0);
        fprintf(stderr, "ddpexitsig wake: recv %zd errno %d during the exit\n", n,
                n < 0 ? errno : 0);
    }
    _exit(3);
    return NULL;
}

/* The wake modes (see the top): returns 0 if the writer ended within
 * LIMIT_MS with status 7. */
static int wake(int poll_mode) {
    int c1, s1, c2, s2;
    tcp_pair(&c1, &s1);
    tcp_pair(&c2, &s2);
    /* The first peer reads to the end, then closes; the second never
     * (wake_send: the first reads nothing, and resets once the second
     * read its end, the exit's close of its connection). */
    int told[2];
    CHECK(pipe(told) == 0);
    pid_t p1 = fork();
    CHECK(p1 >= 0);
    if (p1 == 0) {
        close(c1);
        close(c2);
        close(s2);
        if (!plain) ddp_mode(s1);
        char b[256];
        if (poll_mode == 3)
            CHECK(read(told[0], b, 1) == 1);
        else
            while (read(s1, b, sizeof b) > 0) {
            }
        if (wake_reset) {
            struct linger l = {1, 0};
            CHECK(setsockopt(s1, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
        }
        close(s1);
        for (;;) pause();
    }
    pid_t p2 = fork();
    CHECK(p2 >= 0);
    if (p2 == 0) {
        close(c1);
        close(s1);
        close(c2);
        if (!plain) ddp_mode(s2);
        if (poll_mode == 3) {
            char b[256];
            while (read(s2, b, sizeof b) > 0) {
            }
            CHECK(write(told[1], "e", 1) == 1);
        }
        for (;;) pause();
    }
    close(told[0]);
    close(told[1]);
    close(s1);
    close(s2);
    int alive[2];
    CHECK(pipe(alive) == 0);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(alive[0]);
        if (!plain) {
            ddp_mode(c1);
            ddp_mode(c2);
        }
        wake_fd = c1;
        wake_poll = poll_mode;
        pthread_t t;
        CHECK(pthread_create(&t, NULL, wake_wait, NULL) == 0);
        while (atomic_load(&wake_tid) == 0) sched_yield();
        pid_t tid = atomic_load(&wake_tid);
        while (!thread_asleep(tid) && !(poll_mode == 3 && thread_syscall(tid) == SYS_sendto))
            sched_yield();
        exit(7);
    }
    close(c1);
    close(c2);
    close(alive[1]);
    struct pollfd pf = {alive[0], POLLIN, 0};
    int n = poll(&pf, 1, LIMIT_MS);
    CHECK(n >= 0);
    close(alive[0]);
    int bad = 0;
    if (n == 0) {
        fprintf(stderr, "ddpexitsig %s: the writer did not end in %d ms (a hang)\n", mode,
                LIMIT_MS);
        kill(w, SIGKILL);
        bad = 1;
    }
    int ws;
    CHECK(waitpid(w, &ws, 0) == w);
    if (!bad && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 7)) {
        fprintf(stderr, "ddpexitsig %s: the writer ended with status %#x\n", mode, ws);
        bad = 1;
    }
    kill(p1, SIGKILL);
    kill(p2, SIGKILL);
    CHECK(waitpid(p1, NULL, 0) == p1 && waitpid(p2, NULL, 0) == p2);
    return bad;
}

#define TAIL (256 * 1024)

/* The sleep modes' ways to sleep on the first connection. */
enum { SLEEP_RECV, SLEEP_SEND, SLEEP_POLL, JUMP_POLL, FAULT_RECV };

/* The pattern's byte at offset i of the stream. */
static char pat(long i) { return (char)(i % 251); }

/* The sleep modes' second peer: waits for the word on go, then reads s to
 * its end and closes it; writes the bytes read in order (negative: a byte
 * out of pattern) and the last read's errno (0: a clean end) on out. */
static void sleep_reader(int s, int go, int out) {
    if (!plain) ddp_mode(s);
    char x;
    CHECK(read(go, &x, 1) == 1);
    static char b[65536];
    long got = 0;
    ssize_t n;
    while ((n = read(s, b, sizeof b)) > 0) {
        for (ssize_t i = 0; i < n; i++)
            if (got >= 0 && b[i] != pat(got + i)) got = -1 - i;
        if (got >= 0) got += n;
    }
    long r[2] = {got, n < 0 ? errno : 0};
    close(s);
    CHECK(write(out, r, sizeof r) == (ssize_t)sizeof r);
    for (;;) pause();
}

/* The sleep modes' first peer: reads s to its end, then closes it;
 * writes that read's result and errno on out. */
static void sleep_closer(int s, int out, int how) {
    if (!plain) ddp_mode(s);
    if (how == FAULT_RECV) CHECK(write(s, "8 bytes!", 8) == 8);
    char b[256];
    ssize_t n;
    while ((n = read(s, b, sizeof b)) > 0) {
    }
    long r[2] = {(long)n, n < 0 ? errno : 0};
    close(s);
    CHECK(write(out, r, sizeof r) == (ssize_t)sizeof r);
    for (;;) pause();
}

static sigjmp_buf jump_env;

static void jump(int sig) {
    (void)sig;
    siglongjmp(jump_env, 1);
}

/* The sleep modes' writer (see the top): reports on sent the bytes its
 * sends returned for so far, after each. */
static void sleep_writer(int c1, int c2, int sent, int how) {
    int send_mode = how == SLEEP_SEND;
    /* faultnow_close: the kernel's send buffer small (carried into the
     * library's at the switch): the engine holds the tail. */
    if (close_tail) set_sol_int(c2, SO_SNDBUF, 4096);
    if (!plain) {
        ddp_mode(c1);
        ddp_mode(c2);
    }
    on(SIGTERM);
    static char b[TAIL];
    for (long i = 0; i < TAIL; i++) b[i] = pat(i);
    long total = 0;
    if (stdio_mode == 2) {
        /* 4 MiB in the stream's buffer, then its flush, which sleeps. */
        FILE *f = fdopen(c2, "w");
        CHECK(f != NULL);
        static char fb[8 << 20];
        CHECK(setvbuf(f, fb, _IOFBF, sizeof fb) == 0);
        for (long t = 0; t < (4 << 20); t += 16384) CHECK(fwrite(b + t % 251, 1, 16384, f) == 16384);
        CHECK(write(sent, &total, sizeof total) == (ssize_t)sizeof total);
        fflush(f);
        fprintf(stderr, "ddpexitsig %s: fflush returned\n", mode);
        _exit(3);
    }
    if (stdio_mode) {
        /* The whole tail in the stream's buffer, none of it sent. */
        FILE *f = fdopen(c2, "w");
        CHECK(f != NULL);
        static char fb[2 * TAIL];
        CHECK(setvbuf(f, fb, _IOFBF, sizeof fb) == 0);
        CHECK(fwrite(b, 1, TAIL, f) == TAIL);
        total = TAIL;
        CHECK(write(sent, &total, sizeof total) == (ssize_t)sizeof total);
    }
    while (!stdio_mode) {
        /* Every send starts at the stream's offset modulo the pattern. */
        long off = total % 251;
        ssize_t n = send(c2, b + off, 16384, send_mode ? 0 : MSG_DONTWAIT);
        if (n < 0 && !send_mode && errno == EAGAIN) break;
        CHECK(n > 0);
        total += n;
        CHECK(write(sent, &total, sizeof total) == (ssize_t)sizeof total);
        if (!send_mode && total >= TAIL) break;
    }
    if (close_tail) CHECK(close(c2) == 0);
    if (how == FAULT_RECV) {
        on(SIGSEGV);
        on(SIGBUS);
        fault_recv(c1);
        exit_7(0); /* over TCP: EFAULT, no signal */
    }
    if (how == SLEEP_POLL || how == JUMP_POLL) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = jump;
        sigemptyset(&sa.sa_mask);
        CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
        if (sigsetjmp(jump_env, 1) != 0)
            for (;;) pause(); /* jumped out: SIGTERM's handler exits */
        struct pollfd p = {c1, POLLIN, 0};
        int r = poll(&p, 1, -1);
        fprintf(stderr, "ddpexitsig %s: poll %d revents %#x\n", mode, r, p.revents);
        _exit(3);
    }
    char r[64];
    ssize_t n = recv(c1, r, sizeof r, 0);
    fprintf(stderr, "ddpexitsig %s: recv %zd errno %d\n", mode, n, n < 0 ? errno : 0);
    _exit(3);
}

/* The system call process pid's main thread sleeps in (thread_syscall's,
 * of another process), or -1. */
static long pid_syscall(pid_t pid) {
    char path[64], buf[128];
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    return end == buf ? -1 : nr;
}

/* Whether nr is the system call pause() sleeps in: pause on x86-64;
 * rt_sigsuspend where the kernel has no pause (asm-generic: aarch64),
 * glibc's pause there. */
static int is_pause(long nr) {
#ifdef SYS_pause
    if (nr == SYS_pause) return 1;
#endif
    return nr == SYS_rt_sigsuspend;
}

/* Whether pid's main thread sleeps where a blocking receive (or a send,
 * a poll: how) does: over TCP in the call itself; in DDP mode in the
 * library's poll or epoll, where a wait sleeps past its first slice (the
 * first slice's blocking read is no sleep an exit may take from under it:
 * its bytes may have come). */
static int pid_asleep(pid_t pid, int how) {
    long nr = pid_syscall(pid);
    if (plain && how <= SLEEP_SEND)
        return nr == SYS_recvfrom || (how == SLEEP_SEND && nr == SYS_sendto);
    if (plain && nr == SYS_epoll_pwait) return 0;
    return nr == SYS_epoll_pwait || nr == SYS_ppoll
#ifdef SYS_epoll_wait
           || nr == SYS_epoll_wait
#endif
#ifdef SYS_poll
           || nr == SYS_poll
#endif
        ;
}

/* The sleep modes (see the top): returns 0 if the writer ended within
 * LIMIT_MS with status 7 and both peers read what they must. */
static int sleepy(int how) {
    int send_mode = how == SLEEP_SEND;
    int c1, s1, c2, s2;
    tcp_pair(&c1, &s1);
    tcp_pair_small(&c2, &s2, close_tail ? 4096 : 0);
    int go[2], out1[2], out2[2], sent[2], alive[2];
    CHECK(pipe(go) == 0 && pipe(out1) == 0 && pipe(out2) == 0 && pipe(sent) == 0);
    CHECK(pipe(alive) == 0);
    pid_t p1 = fork();
    CHECK(p1 >= 0);
    if (p1 == 0) {
        close(c1);
        close(c2);
        close(s2);
        close(alive[1]);
        close(sent[1]);
        sleep_closer(s1, out1[1], how);
    }
    pid_t p2 = fork();
    CHECK(p2 >= 0);
    if (p2 == 0) {
        close(c1);
        close(c2);
        close(s1);
        close(alive[1]);
        close(sent[1]);
        sleep_reader(s2, go[0], out2[1]);
    }
    close(s1);
    close(s2);
    int faulted[2];
    CHECK(pipe(faulted) == 0);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(alive[0]);
        close(sent[0]);
        close(faulted[0]);
        if (how == FAULT_RECV) fault_told = faulted[1];
        sleep_writer(c1, c2, sent[1], how);
    }
    close(c1);
    close(c2);
    close(alive[1]);
    close(sent[1]);
    close(faulted[1]);
    /* The writer's main thread (tid w) sleeps in its recv (or send),
     * after at least one send returned. */
    long total = 0;
    CHECK(read(sent[0], &total, sizeof total) == (ssize_t)sizeof total);
    /* Each wait bounded by LIMIT_MS (a writer that died reads -1 for
     * ever): past it the run goes on, and fails below. */
    long end = now_ms() + LIMIT_MS;
    if (how == FAULT_RECV) {
        /* The writer's SIGSEGV handler said so (or the writer ended). */
        struct pollfd fp = {faulted[0], POLLIN, 0};
        CHECK(poll(&fp, 1, LIMIT_MS) >= 0);
    }
    while (how != FAULT_RECV && !pid_asleep(w, how) && now_ms() < end) sched_yield();
    if (how == JUMP_POLL) {
        /* Out of the poll by the handler's siglongjmp, into pause(). */
        CHECK(kill(w, SIGUSR1) == 0);
        while (!is_pause(pid_syscall(w)) && now_ms() < end) sched_yield();
    }
    if (how != FAULT_RECV) CHECK(kill(w, SIGTERM) == 0);
    CHECK(write(go[1], "g", 1) == 1);
    struct pollfd pf = {alive[0], POLLIN, 0};
    int n = poll(&pf, 1, LIMIT_MS);
    CHECK(n >= 0);
    int bad = 0;
    if (n == 0) {
        fprintf(stderr, "ddpexitsig %s: the writer did not end in %d ms (a hang)\n", mode,
                LIMIT_MS);
        kill(w, SIGKILL);
        bad = 1;
    }
    int ws;
    CHECK(waitpid(w, &ws, 0) == w);
    if (!bad && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 7)) {
        fprintf(stderr, "ddpexitsig %s: the writer ended with status %#x\n", mode, ws);
        bad = 1;
    }
    /* The last count the writer's sends reported (it is gone: the pipe
     * ends). */
    long t;
    while (read(sent[0], &t, sizeof t) == (ssize_t)sizeof t) total = t;
    long r1[2], r2[2];
    if (!bad) {
        CHECK(read(out2[0], r2, sizeof r2) == (ssize_t)sizeof r2);
        CHECK(read(out1[0], r1, sizeof r1) == (ssize_t)sizeof r1);
        /* The second peer's last errno as it was, for the messages (the
         * _exit modes' check below takes a DDP ECONNRESET as an end). */
        long seen = r2[1];
        int short_ = send_mode ? r2[0] < total : r2[0] != total;
        /* sleep_stdio_send: a prefix, not empty (the sleep began past
         * the credits). */
        if (stdio_mode == 2) short_ = r2[0] <= 0;
        if (exit_now) {
            /* _exit closes nothing: every byte the sends returned for,
             * in order, then over TCP the end (0); in DDP mode the
             * credits the peer returns after the process may meet a
             * closed socket, whose kernel resets: ECONNRESET after the
             * bytes allowed (review r27-b item 3). What the first peer
             * reads is the kernels'. */
            short_ = r2[0] < total;
            if (!plain && r2[1] == ECONNRESET) r2[1] = 0;
            r1[0] = 0;
        }
        if (short_ || r2[1] != 0) {
            fprintf(stderr,
                    "ddpexitsig %s: the second peer read %ld of %ld bytes in order, then "
                    "errno %ld\n",
                    mode, r2[0], total, seen);
            bad = 1;
        }
        if (r1[0] != 0) {
            fprintf(stderr, "ddpexitsig %s: the first peer's read ended %ld errno %ld\n", mode,
                    r1[0], r1[1]);
            bad = 1;
        }
        if (!bad)
            printf("ddpexitsig %s%s: %ld bytes sent before the signal, %ld read, then %s\n",
                   mode, plain ? " plain" : "", total, r2[0], seen ? strerror((int)seen) : "0");
    }
    close(faulted[0]);
    kill(p1, SIGKILL);
    kill(p2, SIGKILL);
    CHECK(waitpid(p1, NULL, 0) == p1 && waitpid(p2, NULL, 0) == p2);
    return bad;
}

/* One round: a fresh pair, the peer and the writer; returns 0 if the
 * writer ended within LIMIT_MS with status 7. */
static int round_(int spin_mode, int stopped, int i) {
    int c, s;
    tcp_pair(&c, &s);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        close(c);
        peer(s, spin_mode);
    }
    close(s);
    int alive[2], ready[2];
    CHECK(pipe(alive) == 0 && pipe(ready) == 0);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(alive[0]);
        close(ready[0]);
        if (spin_mode) spin_writer(c, ready[1]);
        if (stopped) stopped_writer(c);
        fault_writer(c);
    }
    close(c);
    close(alive[1]);
    close(ready[1]);
    if (spin_mode) {
        char r;
        CHECK(read(ready[0], &r, 1) == 1);
        CHECK(kill(w, SIGTERM) == 0);
    }
    close(ready[0]);
    /* The writer's end closes alive[1] (it alone holds it). */
    struct pollfd pf = {alive[0], POLLIN, 0};
    int n = poll(&pf, 1, LIMIT_MS);
    CHECK(n >= 0);
    close(alive[0]);
    int bad = 0;
    if (n == 0) {
        fprintf(stderr, "ddpexitsig %s round %d: the writer did not end in %d ms (a hang)\n",
                mode, i, LIMIT_MS);
        kill(w, SIGKILL);
        bad = 1;
    }
    int ws;
    CHECK(waitpid(w, &ws, 0) == w);
    if (!bad && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 7)) {
        fprintf(stderr, "ddpexitsig %s round %d: the writer ended with status %#x\n",
                mode, i, ws);
        bad = 1;
    }
    kill(p, SIGKILL);
    CHECK(waitpid(p, NULL, 0) == p);
    return bad;
}

int main(int argc, char **argv) {
    CHECK(argc == 2 || (argc == 3 && strcmp(argv[2], "plain") == 0));
    plain = argc == 3;
    mode = argv[1];
    if (strncmp(mode, "wake_", 5) == 0) {
        int how = strcmp(mode, "wake_poll") == 0    ? 1
                  : strcmp(mode, "wake_epoll") == 0 ? 2
                  : strcmp(mode, "wake_send") == 0  ? 3
                                                    : 0;
        wake_reset = strcmp(mode, "wake_reset") == 0 || how == 3;
        CHECK(how > 0 || wake_reset || strcmp(mode, "wake_recv") == 0);
        if (wake(how)) return 1;
        printf("ddpexitsig %s%s: the writer ended with status 7\n", mode, plain ? " plain" : "");
        return 0;
    }
    if (strncmp(mode, "sleep_", 6) == 0 || strcmp(mode, "jump_poll") == 0) {
        exit_now = strcmp(mode, "sleep_sendnow") == 0;
        stdio_mode = strcmp(mode, "sleep_stdio") == 0           ? 1
                     : strcmp(mode, "sleep_stdio_send") == 0 ? 2
                                                             : 0;
        int how = strcmp(mode, "sleep_send") == 0 || exit_now || stdio_mode == 2 ? SLEEP_SEND
                  : strcmp(mode, "sleep_poll") == 0 || stdio_mode == 1 ? SLEEP_POLL
                  : strcmp(mode, "jump_poll") == 0  ? JUMP_POLL
                                                    : SLEEP_RECV;
        CHECK(how != SLEEP_RECV || strcmp(mode, "sleep_recv") == 0);
        return sleepy(how);
    }
    if (strcmp(mode, "faultnow_tail") == 0 || strcmp(mode, "faultnow_close") == 0) {
        exit_now = 1;
        close_tail = strcmp(mode, "faultnow_close") == 0;
        return sleepy(FAULT_RECV);
    }
    exit_now = strcmp(mode, "faultnow") == 0 || strcmp(mode, "spinnow") == 0;
    int spin_mode = strcmp(mode, "spin") == 0 || strcmp(mode, "spinnow") == 0;
    int stopped = strcmp(mode, "stopped") == 0;
    CHECK(spin_mode || stopped || strcmp(mode, "fault") == 0 || strcmp(mode, "faultnow") == 0);
    int rounds = spin_mode ? ROUNDS : 1;
    for (int i = 0; i < rounds; i++)
        if (round_(spin_mode, stopped, i)) return 1;
    printf("ddpexitsig %s%s: %d writers ended with status 7\n", argv[1], plain ? " plain" : "",
           rounds);
    return 0;
}
