/* POLLRDHUP and EPOLLRDHUP on a DDP-mode stream socket (issue 12;
 * xsock/sock/calls.rs readable_bits, Doorbell::shut_reading): TCP's poll
 * shows them from the peer's FIN on, an event loop's sign of a
 * half-closed connection (nginx, mio); a DDP socket showed POLLIN alone
 * until the connection was finished both ways. Checked (also over TCP
 * with "plain", no preload), for each way a wait sees the socket:
 *   - poll(POLLIN|POLLRDHUP): POLLIN with bytes queued; after the peer's
 *     shutdown(SHUT_WR) POLLIN|POLLRDHUP, before and after the bytes are
 *     read; the end of stream reads 0; this end still sends;
 *   - epoll, edge-triggered EPOLLIN|EPOLLRDHUP (a registration the
 *     library reports itself), and EPOLLONESHOT (one the doorbell shows):
 *     the peer's shutdown is an event with both bits, after a poll saw
 *     it (a poll's round took the set's edge: the set then heard nothing
 *     — with bytes readable too, xsock/sock.rs wait_end);
 *   - epoll level-triggered for EPOLLIN alone: no EPOLLRDHUP reported;
 *     for both, one event a wait (not the library's and the doorbell's);
 *   - a poll for POLLRDHUP alone sees the half-close (it waited on the
 *     doorbell, which nothing shut), POLLRDNORM with it;
 *   - after the peer's close, poll for in, out and RDHUP: all three;
 *   - the peer's close alone (TCP's CLOSE_WAIT): one event for an
 *     edge-triggered set, and no POLLHUP (a DDP socket's set got a second
 *     event, with EPOLLHUP, when the queue pair closed after the end of
 *     stream: its flushed receives counted as arrivals), and getpeername
 *     still names the peer (it failed with ENOTCONN);
 *   - this end's own shutdown(SHUT_RD): POLLRDHUP; SHUT_RDWR: POLLHUP
 *     too (poll and an edge-triggered set);
 *   - DDP mode only: an asynchronous completion after the half-close is
 *     an edge-triggered set's event.
 * Prints "rdhupddp: ok". */
#include "ddppair.h"

#include <sys/epoll.h>
#include <sys/mman.h>

/* One epoll_wait of up to 10 s on ep: its one event's bits (0: none). */
static unsigned one_event(int ep, int ms) {
    struct epoll_event ev[4];
    int n = epoll_wait(ep, ev, 4, ms);
    CHECK(n >= 0 && n <= 1);
    return n == 1 ? ev[0].events : 0;
}

static short polled(int fd, short events) {
    struct pollfd p = {fd, events, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    return p.revents;
}

/* A pair with `registration` for c in its own set (0: none). */
static void half_closed(int plain, unsigned registration) {
    int c, s;
    pair_unless_plain(plain, &c, &s);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    struct epoll_event ev = {registration, {.fd = c}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
    CHECK(write(s, "ab", 2) == 2);
    CHECK(polled(c, POLLIN | POLLRDHUP) == POLLIN);
    CHECK(one_event(ep, 10000) == EPOLLIN);
    CHECK(shutdown(s, SHUT_WR) == 0);
    /* A poll for the half-close alone waits for it (it went to the
     * doorbell alone, which nothing shut: 10 s). */
    CHECK(polled(c, POLLRDHUP) == POLLRDHUP);
    /* The FIN seen (a DDP socket's end of stream comes through its
     * connection's framing, after the shutdown returned: a poll waits
     * for it here, 10 s at most). */
    long until = now_ms() + 10000;
    while (polled(c, POLLIN | POLLRDHUP) != (POLLIN | POLLRDHUP)) CHECK(now_ms() < until);
    if (registration & EPOLLONESHOT) {
        ev.events = registration;
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev) == 0);
    }
    /* The set's event: both bits if asked for, the poll's look before
     * it notwithstanding (a DDP poll's round took the edge the set's
     * watch of the connection waited for); EPOLLIN alone if not. */
    unsigned want = EPOLLIN | (registration & EPOLLRDHUP);
    CHECK(one_event(ep, 10000) == want);
    CHECK(polled(c, POLLIN | POLLRDHUP) == (POLLIN | POLLRDHUP));
    CHECK(polled(c, POLLIN | POLLRDNORM | POLLRDHUP) == (POLLIN | POLLRDNORM | POLLRDHUP));
    char b[4];
    CHECK(recv(c, b, 4, MSG_WAITALL) == 2 && memcmp(b, "ab", 2) == 0);
    CHECK(polled(c, POLLIN | POLLRDHUP) == (POLLIN | POLLRDHUP));
    CHECK(read(c, b, 4) == 0);
    /* This end still sends. */
    CHECK(write(c, "cd", 2) == 2);
    CHECK(recv(s, b, 2, MSG_WAITALL) == 2 && memcmp(b, "cd", 2) == 0);
    close(s);
    /* The peer's close: readable, writable (a send fails then), RDHUP;
     * a send's EPIPE or the peer's reset may add POLLHUP/POLLERR. */
    short all = polled(c, POLLIN | POLLOUT | POLLRDHUP);
    CHECK((all & (POLLIN | POLLOUT | POLLRDHUP)) == (POLLIN | POLLOUT | POLLRDHUP));
    close(ep);
    close(c);
}

/* This end's own shutdown: SHUT_RD shows POLLRDHUP (TCP's RCV_SHUTDOWN,
 * whoever made it), SHUT_RDWR POLLHUP too; poll and an edge-triggered
 * set alike (a DDP socket showed POLLIN|POLLOUT alone). */
static void own_shutdown(int plain) {
    const int hows[2] = {SHUT_RD, SHUT_RDWR};
    const short polls[2] = {POLLIN | POLLOUT | POLLRDHUP, POLLIN | POLLOUT | POLLHUP | POLLRDHUP};
    const unsigned edges[2] = {EPOLLIN | EPOLLRDHUP, EPOLLIN | EPOLLHUP | EPOLLRDHUP};
    for (int i = 0; i < 2; i++) {
        int c, s;
        pair_unless_plain(plain, &c, &s);
        CHECK(shutdown(c, hows[i]) == 0);
        CHECK(polled(c, POLLIN | POLLOUT | POLLRDHUP) == polls[i]);
        int ep = epoll_create1(EPOLL_CLOEXEC);
        CHECK(ep >= 0);
        struct epoll_event ev = {EPOLLIN | EPOLLRDHUP | EPOLLET, {.u64 = 1}};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
        CHECK(one_event(ep, 10000) == edges[i]);
        close(ep);
        close(c);
        close(s);
    }
}

/* The peer's close with nothing sent either way, for an edge-triggered
 * set registered for `events`: one event, the end of stream's, and none
 * after it within 300 ms (the queue pair's close, which followed, made a
 * second one with EPOLLHUP: a bound that can only miss, never fail, on a
 * slow machine); poll then shows no POLLHUP (TCP's CLOSE_WAIT). */
static void peer_closed(int plain, unsigned events) {
    int c, s;
    pair_unless_plain(plain, &c, &s);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    struct epoll_event ev = {events | EPOLLRDHUP | EPOLLET, {.fd = c}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
    if (events & EPOLLOUT) CHECK(one_event(ep, 10000) == EPOLLOUT);
    struct sockaddr_in peer, named;
    socklen_t plen = sizeof peer, nlen = sizeof named;
    CHECK(getsockname(s, (struct sockaddr *)&peer, &plen) == 0);
    CHECK(close(s) == 0);
    CHECK(one_event(ep, 10000) == (events | EPOLLRDHUP));
    CHECK(one_event(ep, 300) == 0);
    CHECK(polled(c, POLLIN | POLLOUT | POLLRDHUP) == (POLLIN | POLLOUT | POLLRDHUP));
    /* Still connected to the program (a DDP socket's engine ended its TCP
     * connection: getpeername failed with ENOTCONN). */
    CHECK(getpeername(c, (struct sockaddr *)&named, &nlen) == 0);
    CHECK(nlen == plen && named.sin_port == peer.sin_port);
    char b[4];
    CHECK(read(c, b, sizeof b) == 0);
    CHECK(one_event(ep, 0) == 0);
    close(ep);
    close(c);
}

/* DDP mode only (the extended calls): an asynchronous completion after
 * the peer's half-close is an edge of its own for an edge-triggered set
 * (no bell can ring once the doorbell shows the end of stream: the
 * shutdown made again wakes the waiters; the completion's wait heard
 * nothing, 3 s). */
static void completion_after_half_close(void) {
    off_t (*riomap)(int, void *, size_t, int, int, off_t) =
        preload_sym("rdhupddp", "warpsock_riomap");
    int (*aio_read)(int, void *, size_t, off_t, uint64_t) =
        preload_sym("rdhupddp", "warpsock_aio_read");
    int (*aio_poll)(int, struct warpsock_aio_completion *, int) =
        preload_sym("rdhupddp", "warpsock_aio_poll");
    int c, s;
    ddp_pair(&c, &s);
    static char src[4096] = "hello";
    off_t off = riomap(s, src, sizeof src, PROT_READ, 0, 0);
    CHECK(off == 0);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP | EPOLLET, {.u64 = 1}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
    CHECK(shutdown(s, SHUT_WR) == 0);
    CHECK(one_event(ep, 10000) == (EPOLLIN | EPOLLRDHUP));
    char b[4];
    CHECK(read(c, b, sizeof b) == 0);
    CHECK(one_event(ep, 0) == 0);
    static char dst[8];
    CHECK(aio_read(c, dst, 5, off, 9) == 0);
    CHECK(one_event(ep, 10000) != 0);
    struct warpsock_aio_completion k[2];
    CHECK(aio_poll(c, k, 2) == 1 && k[0].result == 5 && memcmp(dst, "hello", 5) == 0);
    close(ep);
    close(c);
    close(s);
}

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    half_closed(plain, EPOLLIN | EPOLLRDHUP | EPOLLET);
    half_closed(plain, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT);
    half_closed(plain, EPOLLIN);
    half_closed(plain, EPOLLIN | EPOLLRDHUP);
    own_shutdown(plain);
    peer_closed(plain, EPOLLIN);
    peer_closed(plain, EPOLLIN | EPOLLOUT);
    if (!plain) completion_after_half_close();
    printf("rdhupddp: ok\n");
    return 0;
}
