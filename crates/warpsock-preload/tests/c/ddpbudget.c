/* The process's budget of live DDP sockets (WARPSOCK_DDP_SOCKETS_MAX;
 * tests/ddp_budget.rs). Runs under the preload only (there is no budget
 * without it); prints "ddpbudget: ok" and exits 0 if every check holds.
 *
 *   ddpbudget explicit      (WARPSOCK_DDP_SOCKETS_MAX=2; one process, so
 *                            each pair's two ends are two sockets)
 *     A pair switched at both ends fills the budget. A third socket's
 *     explicit switch then fails with ENOBUFS at once (no peer needed:
 *     nothing is sent), as does its peer's, and the connection carries
 *     bytes both ways as TCP. A closed DDP socket's close lingering for
 *     its peer's FIN keeps its place. Once the DDP pair is closed — one
 *     end, its peer reading the end of stream, then the other — the
 *     closes finish in the background: the same connection's switch, asked again at
 *     both ends until it is admitted (a bounded number of looks, 10 s at
 *     most), succeeds, and the pair carries bytes in DDP mode.
 *
 *   ddpbudget client PORT   (policy mode, the server's budget 1)
 *     Two connections to the echo server at 127.0.0.1:PORT: the first
 *     switches (both ends DDP) and echoes; the second, made while the
 *     first is still open, stays plain TCP at the server, so the client's
 *     switch falls back — it must still echo every byte, and read as
 *     plain here. */
#include "ddppair.h"

static int ddp_mode_of(int fd) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &v, &len) == 0);
    return v;
}

/* n bytes of msg from `from` arrive whole at `to` (10 s at most). */
static void carries(int from, int to, const char *msg) {
    size_t n = strlen(msg), got = 0;
    char b[64];
    CHECK(n < sizeof b);
    write_every(from, msg, n);
    while (got < n) {
        struct pollfd p = {to, POLLIN, 0};
        CHECK(poll(&p, 1, 10000) == 1);
        ssize_t r = recv(to, b + got, n - got, 0);
        CHECK(r > 0);
        got += (size_t)r;
    }
    CHECK(memcmp(b, msg, n) == 0);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Switches fd, asking again while the budget is full (ENOBUFS: nothing
 * was sent, not the switch's one try) — the closes that free it finish in
 * the background — for 10 s at most, a millisecond between looks. */
static void *switch_when_admitted(void *arg) {
    int fd = *(int *)arg, one = 1;
    double until = now_s() + 10;
    while (setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) != 0) {
        CHECK(errno == ENOBUFS);
        CHECK(now_s() < until);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return NULL;
}

static void case_explicit(void) {
    int c1, s1, c2, s2, one = 1;
    ddp_pair(&c1, &s1);
    CHECK(ddp_mode_of(c1) == 1 && ddp_mode_of(s1) == 1);
    carries(c1, s1, "first pair");

    tcp_pair(&c2, &s2);
    errno = 0;
    CHECK(setsockopt(c2, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == -1);
    CHECK(errno == ENOBUFS);
    errno = 0;
    CHECK(setsockopt(s2, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == -1);
    CHECK(errno == ENOBUFS);
    CHECK(ddp_mode_of(c2) == 0 && ddp_mode_of(s2) == 0);
    carries(c2, s2, "over tcp, there");
    carries(s2, c2, "and back");

    /* One DDP socket closed: its close lingers in the background for the
     * peer's FIN (WARPSOCK_LINGER_MS, 10 s here), its slot memory mapped,
     * so its place is still taken. Then its peer reads the end of stream
     * and closes too. */
    CHECK(close(s1) == 0);
    errno = 0;
    CHECK(setsockopt(c2, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == -1);
    CHECK(errno == ENOBUFS);
    struct pollfd p = {c1, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    char b;
    CHECK(recv(c1, &b, 1, 0) == 0);
    CHECK(close(c1) == 0);

    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_when_admitted, &s2) == 0);
    switch_when_admitted(&c2);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(ddp_mode_of(c2) == 1 && ddp_mode_of(s2) == 1);
    carries(c2, s2, "ddp now, there");
    carries(s2, c2, "and back again");
    CHECK(close(c2) == 0 && close(s2) == 0);
}

/* A connection to 127.0.0.1:port echoing msg; left open. */
static int echoed(int port, const char *msg) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = lo(port);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    carries(fd, fd, msg);
    return fd;
}

static void case_client(int port) {
    int a = echoed(port, "the first connection");
    CHECK(ddp_mode_of(a) == 1);
    int b = echoed(port, "the second, over the budget");
    CHECK(ddp_mode_of(b) == 0);
    /* The first is still served. */
    carries(a, a, "the first again");
    CHECK(close(b) == 0 && close(a) == 0);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "explicit") == 0)
        case_explicit();
    else if (argc >= 3 && strcmp(argv[1], "client") == 0)
        case_client(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: ddpbudget explicit | client PORT\n");
        return 2;
    }
    printf("ddpbudget: ok\n");
    return 0;
}
