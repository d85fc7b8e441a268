/* Readiness after a reset (issue 12): the peer closes abortively
 * (SO_LINGER {1, 0}), and this end's poll, select and epoll (level and
 * edge) print what they report, before and after the error is taken. Run
 * over plain TCP and in DDP mode: the lines must be the same. Linux's
 * tcp_poll shows POLLERR while sk_err is pending, beside POLLHUP (the
 * socket is shut both ways), POLLIN and POLLRDHUP; getsockopt(SO_ERROR)
 * or a call that fails with the error takes it, and POLLERR goes away.
 * Usage: pollerr CASE [plain], CASE one of
 *   poll      a poll waits for the reset; polls, SO_ERROR, polls
 *   pollrecv  the same with a recv taking the error (ECONNRESET), then 0
 *   epoll     a level-triggered epoll (POLLIN|POLLRDHUP asked) waits;
 *             EPOLLERR comes unasked; SO_ERROR; epoll again
 *   epollout  the same with EPOLLOUT alone asked (the wait is after a
 *             poll saw the reset): EPOLLERR and EPOLLHUP are unasked
 *   epollet   edge-triggered (IN|OUT|RDHUP): the edge before the reset,
 *             none after it, one at the reset with EPOLLERR, none after
 *             it nor after SO_ERROR
 *   select    select waits for the reset (read set); the read, write and
 *             exceptional sets, before and after SO_ERROR
 *   pollfin   the peer's end of stream first (this end reads 0), then
 *             its reset: polled until POLLHUP shows (TCP's CLOSE_WAIT:
 *             SO_ERROR is EPIPE), as poll. What polls show between the two
 *             is not printed: TCP's POLLRDHUP after the end of stream
 *             alone, a DDP-mode socket shows only once hung up.
 *   sendshut  this end sends, shuts its sending side, then the peer
 *             closes with those bytes unread (a reset): a send fails with
 *             ECONNRESET (the pending error before the shutdown's EPIPE,
 *             as tcp_sendmsg's sk_stream_error; a DDP socket said EPIPE
 *             and left the error pending), SO_ERROR is then 0, a send
 *             after it EPIPE
 *   pollasleep, epolletasleep  poll, epollet with the reset made by
 *             another thread once this one sleeps in the wait
 *             (/proc/self/task/TID/syscall): the wake-up itself shows it
 *   pollnone, pollnoneasleep  a poll asking POLLERR alone waits for the
 *             reset (it went to the doorbell alone, which nothing drove:
 *             a DDP socket timed out; diffuzz seed 292)
 *   pollnonefin  the peer closes (TCP's CLOSE_WAIT here, this end reads
 *             0); a poll asking nothing (events 0) waits its 300 ms out
 *             and shows nothing, without spinning (CPU under half the
 *             wall time: a DDP socket's engine socket, readable for good
 *             after the FIN, woke it again and again; helper 61) */
#include "ddppair.h"

#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

static int plain;

static void *switch_peer(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

/* A connected pair, switched unless plain. */
static void pair(int *c, int *s) {
    tcp_pair(c, s);
    if (plain) return;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_peer, s) == 0);
    ddp_mode(*c);
    CHECK(pthread_join(t, NULL) == 0);
}

/* The peer's abortive close. */
static void reset_by(int s) {
    struct linger l = {1, 0};
    CHECK(setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
    CHECK(close(s) == 0);
}

struct later {
    pid_t tid;
    int s;
};

static void *reset_later(void *arg) {
    struct later *l = arg;
    for (long k = 0; !thread_asleep(l->tid); k++) {
        CHECK(k < 100000000);
        sched_yield();
    }
    reset_by(l->s);
    return NULL;
}

/* reset_by(s) now, or (asleep) from a thread once this one sleeps in a
 * wait; *t is that thread (joined by the caller). */
static int reset_soon(int s, int asleep, pthread_t *t) {
    if (!asleep) {
        reset_by(s);
        return 0;
    }
    static struct later l;
    l.tid = (pid_t)syscall(SYS_gettid);
    l.s = s;
    CHECK(pthread_create(t, NULL, reset_later, &l) == 0);
    return 1;
}

static void bits(const char *what, unsigned v) {
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{POLLIN, "IN"},         {POLLPRI, "PRI"},       {POLLOUT, "OUT"},
                 {POLLERR, "ERR"},       {POLLHUP, "HUP"},       {POLLRDHUP, "RDHUP"},
                 {POLLRDNORM, "RDNORM"}, {POLLWRNORM, "WRNORM"}, {POLLWRBAND, "WRBAND"},
                 {EPOLLET, "ET"}};
    printf("%s:", what);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (v & names[i].bit) {
            printf(" %s", names[i].name);
            v &= ~names[i].bit;
        }
    if (v) printf(" 0x%x", v);
    printf("\n");
}

static void poll_now(int c, const char *what) {
    struct pollfd p = {c, POLLIN | POLLOUT | POLLRDHUP | POLLPRI, 0};
    int n = poll(&p, 1, 0);
    CHECK(n >= 0);
    bits(what, p.revents);
}

/* Waits (10 s at most) for the reset through poll(POLLIN|POLLRDHUP): the
 * revents of that wait. */
static void poll_wait(int c, const char *what) {
    struct pollfd p = {c, POLLIN | POLLRDHUP, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    bits(what, p.revents);
}

static void so_error(int c) {
    printf("SO_ERROR %d\n", sol_int(c, SO_ERROR));
    printf("SO_ERROR again %d\n", sol_int(c, SO_ERROR));
}

static void epoll_now(int ep, int ms, const char *what) {
    struct epoll_event ev[2];
    int n = epoll_wait(ep, ev, 2, ms);
    CHECK(n >= 0 && n <= 1);
    if (n == 0)
        printf("%s: none\n", what);
    else
        bits(what, ev[0].events);
}

static void sets_now(int c, int ms, int only_read, const char *what) {
    fd_set r, w, e;
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_ZERO(&e);
    FD_SET(c, &r);
    if (!only_read) {
        FD_SET(c, &w);
        FD_SET(c, &e);
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    int n = select(c + 1, &r, &w, &e, &tv);
    CHECK(n >= 0);
    printf("%s: %d%s%s%s\n", what, n, FD_ISSET(c, &r) ? " read" : "",
           FD_ISSET(c, &w) ? " write" : "", FD_ISSET(c, &e) ? " except" : "");
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    const char *cs = argv[1];
    plain = argc > 2 && !strcmp(argv[2], "plain");
    int asleep = strstr(cs, "asleep") != NULL;
    pthread_t t;
    int c, s;
    pair(&c, &s);
    poll_now(c, "before");
    if (!strcmp(cs, "sendshut")) {
        CHECK(send(c, "0123456789", 10, 0) == 10);
        int n = 0;
        for (long k = 0; n < 10; k++) {
            CHECK(ioctl(s, FIONREAD, &n) == 0);
            CHECK(k < 10000000);
            if (n < 10) sched_yield();
        }
        CHECK(shutdown(c, SHUT_WR) == 0);
        struct pollfd p = {s, POLLRDHUP, 0};
        CHECK(poll(&p, 1, 10000) == 1);
        CHECK(close(s) == 0);
        poll_wait(c, "wait");
        ssize_t r = send(c, "abcde", 5, MSG_NOSIGNAL);
        printf("send %zd errno %d\n", r, r < 0 ? errno : 0);
        poll_now(c, "taken");
        printf("SO_ERROR %d\n", sol_int(c, SO_ERROR));
        r = send(c, "abcde", 5, MSG_NOSIGNAL);
        printf("send again %zd errno %d\n", r, r < 0 ? errno : 0);
    } else if (!strcmp(cs, "pollfin")) {
        CHECK(shutdown(s, SHUT_WR) == 0);
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, 10000) == 1);
        char b[8];
        CHECK(recv(c, b, sizeof b, 0) == 0);
        reset_by(s);
        /* Readable all along: polled until the reset shows. */
        for (long k = 0;; k++) {
            struct pollfd p = {c, POLLIN | POLLRDHUP, 0};
            CHECK(poll(&p, 1, 10000) == 1);
            if (p.revents & POLLHUP) {
                bits("wait", p.revents);
                break;
            }
            CHECK(k < 10000000);
            sched_yield();
        }
        poll_now(c, "pending");
        so_error(c);
        poll_now(c, "taken");
    } else if (!strcmp(cs, "poll") || !strcmp(cs, "pollrecv") || !strcmp(cs, "pollasleep")) {
        int joined = reset_soon(s, asleep, &t);
        poll_wait(c, "wait");
        if (joined) CHECK(pthread_join(t, NULL) == 0);
        poll_now(c, "pending");
        poll_now(c, "pending again");
        if (strcmp(cs, "pollrecv")) {
            so_error(c);
        } else {
            char b[8];
            ssize_t r = recv(c, b, sizeof b, 0);
            printf("recv %zd errno %d\n", r, r < 0 ? errno : 0);
            printf("SO_ERROR %d\n", sol_int(c, SO_ERROR));
        }
        poll_now(c, "taken");
        char b[8];
        ssize_t r = recv(c, b, sizeof b, 0);
        printf("recv %zd\n", r);
        poll_now(c, "after");
    } else if (!strcmp(cs, "epoll") || !strcmp(cs, "epollout") || !strcmp(cs, "epollet") ||
               !strcmp(cs, "epolletasleep")) {
        int ep = epoll_create1(0);
        CHECK(ep >= 0);
        unsigned mask = !strcmp(cs, "epoll")      ? EPOLLIN | EPOLLRDHUP
                        : !strcmp(cs, "epollout") ? EPOLLOUT
                                                  : EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
        struct epoll_event ev = {.events = mask, .data.fd = c};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
        if (mask & EPOLLET) {
            epoll_now(ep, 0, "edge before");
            epoll_now(ep, 0, "edge before again");
        }
        int joined = reset_soon(s, asleep, &t);
        if (!strcmp(cs, "epollout")) poll_wait(c, "poll wait");
        epoll_now(ep, 10000, "wait");
        if (joined) CHECK(pthread_join(t, NULL) == 0);
        if (joined && (mask & EPOLLET)) {
            /* Not printed: with the reset made while this thread sleeps,
             * Linux's TCP gives one edge or two as the scheduler has it
             * (tcp_reset's error report wakes the wait; tcp_done's state
             * change, when it comes after the wait returned, is a second
             * edge: CI of 6d7bac0, under load). Taken, so the lines after
             * it compare. */
            struct epoll_event ev[2];
            CHECK(epoll_wait(ep, ev, 2, 0) >= 0);
            printf("pending: (one edge or two, as TCP's)\n");
        } else {
            epoll_now(ep, 0, "pending");
        }
        so_error(c);
        epoll_now(ep, 0, "taken");
        poll_now(c, "taken poll");
        close(ep);
    } else if (!strcmp(cs, "pollnone") || !strcmp(cs, "pollnoneasleep")) {
        int joined = reset_soon(s, asleep, &t);
        struct pollfd p = {c, POLLERR, 0};
        CHECK(poll(&p, 1, 10000) == 1);
        bits("wait", p.revents);
        if (joined) CHECK(pthread_join(t, NULL) == 0);
        so_error(c);
    } else if (!strcmp(cs, "pollnonefin")) {
        CHECK(close(s) == 0);
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, 10000) == 1);
        char b[8];
        CHECK(recv(c, b, sizeof b, 0) == 0);
        struct rusage u0, u1;
        struct timespec t0, t1;
        CHECK(getrusage(RUSAGE_THREAD, &u0) == 0);
        CHECK(clock_gettime(CLOCK_MONOTONIC, &t0) == 0);
        p.events = 0;
        int n = poll(&p, 1, 300);
        CHECK(clock_gettime(CLOCK_MONOTONIC, &t1) == 0);
        CHECK(getrusage(RUSAGE_THREAD, &u1) == 0);
        printf("poll nothing after the close: %d\n", n);
        bits("shows", p.revents);
        double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        double cpu = (double)(u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) +
                     (double)(u1.ru_utime.tv_usec - u0.ru_utime.tv_usec) / 1e6 +
                     (double)(u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) +
                     (double)(u1.ru_stime.tv_usec - u0.ru_stime.tv_usec) / 1e6;
        fprintf(stderr, "pollnonefin: %.3f s CPU in %.3f s\n", cpu, wall);
        CHECK(cpu < wall / 2);
    } else if (!strcmp(cs, "select")) {
        reset_by(s);
        sets_now(c, 10000, 1, "wait");
        sets_now(c, 0, 0, "pending");
        so_error(c);
        sets_now(c, 0, 0, "taken");
    } else {
        fprintf(stderr, "pollerr: unknown case %s\n", cs);
        return 2;
    }
    close(c);
    return 0;
}
