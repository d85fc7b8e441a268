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
 *     reset, the thread's recv would fail with ECONNRESET).
 * Each writer must end within LIMIT_MS with status 7; one that does not
 * is killed (SIGKILL, by its pid) and the run fails: exit 0 if every
 * writer ended so. */
#include "ddppair.h"

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

static void exit_7(int sig) {
    (void)sig;
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
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop_here;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0 && sigaction(SIGBUS, &sa, NULL) == 0);
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
    /* The first peer reads to the end, then closes; the second never. */
    pid_t p1 = fork();
    CHECK(p1 >= 0);
    if (p1 == 0) {
        close(c1);
        close(c2);
        close(s2);
        if (!plain) ddp_mode(s1);
        char b[256];
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
        for (;;) pause();
    }
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
        while (!thread_asleep(atomic_load(&wake_tid))) sched_yield();
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
        int how = strcmp(mode, "wake_poll") == 0 ? 1 : strcmp(mode, "wake_epoll") == 0 ? 2 : 0;
        wake_reset = strcmp(mode, "wake_reset") == 0;
        CHECK(how > 0 || wake_reset || strcmp(mode, "wake_recv") == 0);
        if (wake(how)) return 1;
        printf("ddpexitsig %s%s: the writer ended with status 7\n", mode, plain ? " plain" : "");
        return 0;
    }
    int spin_mode = strcmp(mode, "spin") == 0;
    int stopped = strcmp(mode, "stopped") == 0;
    CHECK(spin_mode || stopped || strcmp(mode, "fault") == 0);
    int rounds = spin_mode ? ROUNDS : 1;
    for (int i = 0; i < rounds; i++)
        if (round_(spin_mode, stopped, i)) return 1;
    printf("ddpexitsig %s%s: %d writers ended with status 7\n", argv[1], plain ? " plain" : "",
           rounds);
    return 0;
}
