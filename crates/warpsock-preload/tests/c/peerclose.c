/* A peer's close is invisible to a UDP receiver: after a sender that the
 * receiver heard from closes its socket (under the preload, its TCP
 * connection ends and the receiver's side reads end-of-stream), the
 * receiver's descriptor must not turn readable, a non-blocking receive
 * must say EAGAIN, and a blocking one must time out (never return 0 as if
 * an empty datagram had come); and the next sender is heard as before.
 * Checked for each way of waiting: poll, select, epoll, a blocking recv.
 * Port: a. */
#include "common.h"
#include <sys/epoll.h>
#include <sys/select.h>

enum { QUIET_MS = 300 };

static int port, r, ep;

static int poll_in(int ms) { return poll_readable(r, ms); }

static int select_in(int ms) { return select_readable(r, ms); }

static int epoll_in(int ms) {
    struct epoll_event ev;
    int n = epoll_wait(ep, &ev, 1, ms);
    CHECK(n >= 0);
    return n == 1 && (ev.events & EPOLLIN);
}

/* Blocking receive bounded by SO_RCVTIMEO: 1 if a datagram came (and is
 * checked), 0 if the call timed out. */
static int recv_in(int ms, int want) {
    set_rcvtimeo(r, ms);
    int v = -1;
    ssize_t n = recv(r, &v, sizeof v, 0);
    set_rcvtimeo(r, 5000);
    if (n < 0) {
        CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
        return 0;
    }
    CHECK(n == sizeof v); /* never 0: the peer's close is no datagram */
    CHECK(v == want);
    return 1;
}

static void recv_one(int want) {
    int v = -1;
    ssize_t n = recv(r, &v, sizeof v, MSG_DONTWAIT);
    if (n != sizeof v) fprintf(stderr, "datagram %d: readable, but recv returned %zd\n", want, n);
    CHECK(n == sizeof v);
    CHECK(v == want);
}

static void nothing_now(void) {
    int v;
    CHECK(recv(r, &v, sizeof v, MSG_DONTWAIT) < 0);
    CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
}

int main(int argc, char **argv) {
    port = port_arg(argc, argv, 1);
    r = udp_bound(port);
    ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, r, &ev) == 0);
    int (*waits[])(int) = {poll_in, select_in, epoll_in, NULL};
    for (int k = 0; k < 4; k++) {
        /* A sender the receiver hears from, a few times (its connection
         * is set up, proved, then read by the receive calls). */
        int s = udp_new();
        for (int i = 0; i < 3; i++) {
            int tag = k * 10 + i;
            send_to(s, port, &tag, sizeof tag);
            if (waits[k]) {
                CHECK(waits[k](5000));
                recv_one(tag);
            } else {
                CHECK(recv_in(5000, tag));
            }
            nothing_now();
        }
        CHECK(close(s) == 0);
        /* Its close: nothing to receive, however the receiver waits. */
        if (waits[k]) {
            int w = waits[k](QUIET_MS);
            if (w) {
                int v;
                ssize_t n = recv(r, &v, sizeof v, MSG_DONTWAIT);
                fprintf(stderr, "wait %d: readable after the sender's close (recv: %zd, errno %d; then poll: %d)\n", k, n, errno, poll_in(0));
            }
            CHECK(!w);
        } else {
            CHECK(!recv_in(QUIET_MS, -1));
        }
        nothing_now();
        CHECK(!poll_in(0));
        /* The next sender is heard. */
        int s2 = udp_new();
        int tag = 100 + k;
        send_to(s2, port, &tag, sizeof tag);
        CHECK(poll_in(5000));
        recv_one(tag);
        CHECK(!poll_in(0));
        CHECK(close(s2) == 0);
        /* Its close too, seen by the next round's first wait. */
    }
    printf("ok\n");
    return 0;
}
