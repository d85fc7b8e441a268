/* A socket whose lock a thread holds for good must not stop the other
 * sockets' progress.
 *
 *   ddpstuck [plain]
 *
 * Two connected pairs, a and b, in this process (DDP mode unless plain).
 * The program waits in select() first, so that every DDP socket is on the
 * library's progress thread's watch (select sees a DDP socket only through
 * the doorbell that thread rings). A second thread then receives on a's
 * client end into a buffer it cannot write (PROT_NONE): in DDP mode the
 * library's copy faults under the socket's lock, and the thread's SIGSEGV
 * handler says so and waits for ever, the lock held (over TCP the kernel
 * returns EFAULT and the thread waits the same way). a's server end then
 * sends more bytes: an event on the stuck socket's connection for the
 * progress thread. Then ROUNDS ping-pongs on b, each end waiting in
 * select() with a bound of LIMIT_MS: the progress thread must still ring
 * b's doorbells. Before, it waited for a's lock on that event, for ever,
 * and the first select on b timed out. Exit 0 if every round came back;
 * the process ends with _exit (its exit would close a, whose lock is
 * held: ddpexitsig's stopped mode covers that). */
#include "ddppair.h"

#include <signal.h>
#include <sys/mman.h>

#define ROUNDS 50
#define LIMIT_MS 10000

static int told_fd = -1;

/* The stuck thread's SIGSEGV handler: says so, then never returns. */
static void stop_here(int sig) {
    (void)sig;
    char b = 's';
    (void)!write(told_fd, &b, 1);
    for (;;) pause();
}

static void *stuck(void *arg) {
    int c = *(int *)arg;
    long page = sysconf(_SC_PAGESIZE);
    char *b = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(b != MAP_FAILED);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, LIMIT_MS) == 1 && (p.revents & POLLIN));
    ssize_t r = recv(c, b, 8, 0);
    /* Over TCP: EFAULT, no signal. */
    CHECK(r == -1 && errno == EFAULT);
    stop_here(0);
    return NULL;
}

/* select() for input on fd, bounded; 1 if readable. */
static int select_in(int fd, int ms) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(fd, &r);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    int n = select(fd + 1, &r, NULL, NULL, &tv);
    CHECK(n >= 0);
    return n == 1 && FD_ISSET(fd, &r);
}

/* One hop: a byte sent on from, waited for in select() on to and read. */
static int hop(int from, int to, int round) {
    char x = (char)round, y = 0;
    CHECK(send(from, &x, 1, MSG_NOSIGNAL) == 1);
    if (!select_in(to, LIMIT_MS)) {
        fprintf(stderr, "ddpstuck: round %d: select saw nothing in %d ms (the progress thread is stopped)\n",
                round, LIMIT_MS);
        return 1;
    }
    CHECK(recv(to, &y, 1, 0) == 1 && y == x);
    return 0;
}

int main(int argc, char **argv) {
    int plain = argc > 1 && strcmp(argv[1], "plain") == 0;
    int ac, as, bc, bs;
    if (plain) {
        tcp_pair(&ac, &as);
        tcp_pair(&bc, &bs);
    } else {
        ddp_pair(&ac, &as);
        ddp_pair(&bc, &bs);
    }
    /* A select first: from here on every DDP socket is watched. */
    if (hop(bc, bs, 0)) return 1;

    int told[2];
    CHECK(pipe(told) == 0);
    told_fd = told[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop_here;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0 && sigaction(SIGBUS, &sa, NULL) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, stuck, &ac) == 0);
    CHECK(send(as, "8 bytes!", 8, MSG_NOSIGNAL) == 8);
    char s;
    CHECK(read(told[0], &s, 1) == 1);

    /* An event on the stuck socket's connection for the progress thread. */
    CHECK(send(as, "and more", 8, MSG_NOSIGNAL) == 8);
    for (int i = 1; i <= ROUNDS; i++) {
        if (hop(bc, bs, i) || hop(bs, bc, i)) _exit(1);
    }
    printf("ddpstuck%s: %d rounds on b with a's lock held\n", plain ? " plain" : "", ROUNDS);
    fflush(stdout);
    _exit(0);
}
