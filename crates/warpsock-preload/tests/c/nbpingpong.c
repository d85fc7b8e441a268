/* Ping-pong with non-blocking receives, the way event loops and the
 * benchmark suite receive: each side waits in poll() (or, in the busy
 * rounds, spins on MSG_DONTWAIT receives) and then receives until EAGAIN.
 * Checks that readiness is exact on this path: a poll that reports the
 * descriptor readable is followed by a receive that returns the datagram
 * at once, and the drain that follows ends in EAGAIN with the descriptor
 * no longer readable. (Under the preload the counters of the run show
 * what each round trip cost: see preload.rs.) Ports: a b [event|busy|all
 * [one [idle]]]: the third argument runs only the poll rounds or only the busy ones
 * (to count instructions per round trip of one kind, e.g. under callgrind);
 * "one" leaves out the echo side's greeting, so that each socket has one
 * connection, as in the benchmark suite; "idle" polls an idle pipe beside
 * the socket. */
#include <pthread.h>

#include "common.h"

enum { ROUNDS = 1000, SPIN_MS = 10000 };

static int pa, pb, sa, sb;
/* The rounds run: busy = first .. last - 1 (0: poll, 1: busy). */
static int first = 0, last = 2;

/* Waits until `s` is readable (poll, bounded) or, with `busy`, spins on
 * non-blocking receives until one returns; returns the datagram's length
 * and checks that the drain to EAGAIN finds nothing more. */
/* With "idle": the read end of a pipe nothing writes, polled beside the
 * socket (an event loop's other descriptors; the suite's has its control
 * connection there). */
static int idle = -1;

static ssize_t take(int s, int busy, char *buf, size_t cap) {
    ssize_t n;
    if (busy) {
        long end = now_ms() + SPIN_MS;
        while ((n = recv(s, buf, cap, MSG_DONTWAIT)) < 0) {
            CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
            CHECK(now_ms() < end);
        }
    } else {
        struct pollfd p[2] = {{s, POLLIN, 0}, {idle, POLLIN, 0}};
        CHECK(poll(p, idle < 0 ? 1 : 2, 5000) == 1);
        CHECK(p[0].revents & POLLIN);
        /* Readable means a datagram is there now. */
        n = recv(s, buf, cap, MSG_DONTWAIT);
        CHECK(n >= 0);
    }
    char more[64];
    CHECK(recv(s, more, sizeof more, MSG_DONTWAIT) < 0);
    CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
    struct pollfd p[2] = {{s, POLLIN, 0}, {idle, POLLIN, 0}};
    CHECK(poll(p, idle < 0 ? 1 : 2, 0) == 0);
    return n;
}

static void *echo(void *arg) {
    (void)arg;
    char buf[256];
    for (int busy = first; busy < last; busy++) {
        for (int i = 0; i < ROUNDS; i++) {
            ssize_t n = take(sb, busy, buf, sizeof buf);
            CHECK(n > 0);
            send_to(sb, pa, buf, (size_t)n);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    pa = port_arg(argc, argv, 1);
    pb = port_arg(argc, argv, 2);
    if (argc > 3 && strcmp(argv[3], "all") != 0) {
        CHECK(strcmp(argv[3], "event") == 0 || strcmp(argv[3], "busy") == 0);
        first = argv[3][0] == 'b';
        last = first + 1;
    }
    int one = argc > 4 && strcmp(argv[4], "one") == 0;
    int pipefd[2];
    if (argc > 5 && strcmp(argv[5], "idle") == 0) {
        CHECK(pipe(pipefd) == 0);
        idle = pipefd[0];
    }
    sa = udp_bound(pa);
    sb = udp_bound(pb);
    /* Set up the route both ways before the echo thread starts: each side
     * sends before it receives, so each opens its own connection and each
     * socket then has two, one of them idle (a program whose two ends both
     * speak first, as a pair of peers does). With "one", only a speaks
     * first: b's replies go back over a's connection. */
    char out[64], in[256];
    send_to(sa, pb, "hi a", 4);
    if (!one)
        send_to(sb, pa, "hi b", 4);
    CHECK(recv(sb, in, sizeof in, 0) == 4 && memcmp(in, "hi a", 4) == 0);
    if (!one)
        CHECK(recv(sa, in, sizeof in, 0) == 4 && memcmp(in, "hi b", 4) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, echo, NULL) == 0);
    for (int busy = first; busy < last; busy++) {
        for (int i = 0; i < ROUNDS; i++) {
            int len = snprintf(out, sizeof out, "ping %d %d", busy, i);
            send_to(sa, pb, out, (size_t)len);
            ssize_t n = take(sa, busy, in, sizeof in);
            CHECK(n == len && memcmp(in, out, (size_t)len) == 0);
        }
    }
    CHECK(pthread_join(t, NULL) == 0);
    printf("ok %d rounds\n", (last - first) * ROUNDS);
    return 0;
}
