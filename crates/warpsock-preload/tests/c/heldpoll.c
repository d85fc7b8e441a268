/* A poll that reports a datagram, then every way a program can go on
 * without receiving it at once: the datagram must stay receivable and the
 * descriptor readable whatever the program waits in next. Under the
 * preload the poll reads the datagram into its connection's buffer (the
 * read the receive would make), so that the receive makes no system call;
 * nothing but the library then knows the datagram is there (see preload's
 * udp::recv, `Conn::held`). Per round, after a poll said readable:
 *   0: receive (non-blocking), then EAGAIN;
 *   1: poll again (must say readable at once), then receive;
 *   2: epoll_wait (must say readable), then receive;
 *   3: select (must say readable), then receive;
 *   4: a blocking receive (must return it, not wait for the next);
 *   5: MSG_PEEK, then receive: the same datagram twice;
 *   6: two datagrams behind one poll: both received, then EAGAIN;
 *   7: the receive in another thread (blocking);
 *   8: no call on the socket for 30 ms (past the parking's grace, which
 *      the test sets to 1 ms: the connection goes back to the progress
 *      thread with the datagram in its buffer), then poll and epoll_wait.
 * Every wait is bounded (5 s) and every outcome is the same whatever the
 * scheduling: the sleep only makes the grace's end likely.
 * Ports: a b. */
#include <pthread.h>
#include <sys/epoll.h>

#include "common.h"

enum { ROUNDS = 40, KINDS = 9 };

static int sb;

static void readable_now(int s, int ms) {
    struct pollfd p = {s, POLLIN, 0};
    CHECK(poll(&p, 1, ms) == 1);
    CHECK(p.revents & POLLIN);
}

static void drained(int s) {
    char b[64];
    CHECK(recv(s, b, sizeof b, MSG_DONTWAIT) < 0);
    CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
    struct pollfd p = {s, POLLIN, 0};
    CHECK(poll(&p, 1, 0) == 0);
}

static void expect(int s, int flags, const char *want) {
    char b[256];
    ssize_t n = recv(s, b, sizeof b, flags);
    CHECK(n == (ssize_t)strlen(want) && memcmp(b, want, (size_t)n) == 0);
}

static void *receiver(void *arg) {
    expect(sb, 0, (const char *)arg);
    return NULL;
}

int main(int argc, char **argv) {
    int pa = port_arg(argc, argv, 1), pb = port_arg(argc, argv, 2);
    int sa = udp_bound(pa);
    sb = udp_bound(pb);
    /* The route, and a first datagram over it. */
    send_to(sa, pb, "hi", 2);
    expect(sb, 0, "hi");
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = sb};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, sb, &ev) == 0);
    char m[64], m2[64];
    for (int i = 0; i < ROUNDS * KINDS; i++) {
        int kind = i % KINDS;
        snprintf(m, sizeof m, "round %d kind %d", i, kind);
        snprintf(m2, sizeof m2, "round %d second", i);
        send_to(sa, pb, m, strlen(m));
        if (kind == 6) {
            send_to(sa, pb, m2, strlen(m2));
        }
        readable_now(sb, 5000);
        switch (kind) {
        case 0:
            break;
        case 1:
            readable_now(sb, 0);
            readable_now(sb, 5000);
            break;
        case 2: {
            struct epoll_event out;
            CHECK(epoll_wait(ep, &out, 1, 5000) == 1);
            CHECK(out.data.fd == sb && (out.events & EPOLLIN));
            break;
        }
        case 3: {
            fd_set r;
            FD_ZERO(&r);
            FD_SET(sb, &r);
            struct timeval tv = {5, 0};
            CHECK(select(sb + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(sb, &r));
            break;
        }
        case 4:
            /* Blocking (its SO_RCVTIMEO is 5 s): must not wait. */
            expect(sb, 0, m);
            drained(sb);
            continue;
        case 5:
            expect(sb, MSG_PEEK | MSG_DONTWAIT, m);
            readable_now(sb, 0);
            break;
        case 6:
            expect(sb, MSG_DONTWAIT, m);
            /* The second may still be on its way under kernel UDP: wait. */
            readable_now(sb, 5000);
            expect(sb, MSG_DONTWAIT, m2);
            drained(sb);
            continue;
        case 7: {
            pthread_t t;
            CHECK(pthread_create(&t, NULL, receiver, m) == 0);
            CHECK(pthread_join(t, NULL) == 0);
            drained(sb);
            continue;
        }
        case 8: {
            /* No call on the socket for 30 ms: the parking's grace (set to
             * 1 ms by the test) ends meanwhile. Correct either way. */
            struct timespec ts = {0, 30 * 1000 * 1000};
            nanosleep(&ts, NULL);
            readable_now(sb, 5000);
            struct epoll_event out;
            CHECK(epoll_wait(ep, &out, 1, 5000) == 1);
            break;
        }
        }
        expect(sb, MSG_DONTWAIT, m);
        drained(sb);
    }
    printf("ok %d rounds\n", ROUNDS * KINDS);
    return 0;
}
