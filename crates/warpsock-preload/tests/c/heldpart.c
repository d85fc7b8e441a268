/* Message mode's held part and the descriptor's readiness (issue 12,
 * review r19-xdead item 6), one switched pair in one process, a window of
 * 16 slots of 1 KiB, no send buffer (WARPSOCK_DDP_SLOTS=16
 * WARPSOCK_DDP_SLOT_KB=1 WARPSOCK_DDP_SNDBUF=0, set by tests/ddp_ready.rs). The sender's non-blocking send of a 32 KiB message
 * stops at its last credit; the reader, in message mode, reads 4 KiB of it
 * (a part: the sender is short), which gives the sender credits back: the
 * rest of the held part is no longer due, and a read would block. Then no
 * poll, select or level-triggered epoll_wait may say readable (an event
 * loop woken for it spun on EAGAIN). The rest of the message comes: an
 * edge-triggered epoll_wait fires for it, and every read after a poll that
 * said readable returns bytes, up to the message's end (MSG_EOR).
 *
 *   heldpart    exit 0 if every check holds */
#include "ddppair.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>

#define LEN (32 << 10)

static unsigned char msg[LEN];
static int c, s;
static size_t sent;

static void *switch_peer(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

static void *send_rest(void *arg) {
    (void)arg;
    size_t off = sent;
    while (off < LEN) {
        ssize_t n = send(c, msg + off, LEN - off, 0);
        CHECK(n > 0);
        off += (size_t)n;
    }
    return NULL;
}

static int polled_readable(void) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    int n = poll(&p, 1, 0);
    CHECK(n >= 0);
    return n == 1 && (p.revents & POLLIN);
}

int main(void) {
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_peer, &c) == 0);
    ddp_mode(s);
    CHECK(pthread_join(t, NULL) == 0);
    int one = 1;
    CHECK(setsockopt(s, SOL_WARPSOCK, WARPSOCK_MSG_MODE, &one, sizeof one) == 0);
    for (size_t i = 0; i < LEN; i++) msg[i] = (unsigned char)(i * 131 + 7);

    ssize_t n = send(c, msg, LEN, MSG_DONTWAIT);
    CHECK(n > 4096 && n < LEN);
    sent = (size_t)n;
    /* Everything sent arrives (each wait is on an event, bounded). */
    for (int k = 0;; k++) {
        int q = 0;
        CHECK(ioctl(s, FIONREAD, &q) == 0);
        if ((size_t)q >= sent) break;
        CHECK(k < 500);
        struct pollfd p = {.fd = s, .events = POLLIN};
        CHECK(poll(&p, 1, 10) >= 0);
    }
    CHECK(polled_readable()); /* the sender is short: the part is due */
    static unsigned char got[LEN];
    CHECK(recv(s, got, 4096, 0) == 4096);
    CHECK(memcmp(got, msg, 4096) == 0);
    size_t have = 4096;

    /* Held, not due: a read would block, and nothing says readable. */
    static unsigned char big[64 << 10];
    CHECK(recv(s, big, sizeof big, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    CHECK(!polled_readable());
    int lt = epoll_create1(EPOLL_CLOEXEC), et = epoll_create1(EPOLL_CLOEXEC);
    CHECK(lt >= 0 && et >= 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
    CHECK(epoll_ctl(lt, EPOLL_CTL_ADD, s, &ev) == 0);
    ev.events = EPOLLIN | EPOLLET;
    CHECK(epoll_ctl(et, EPOLL_CTL_ADD, s, &ev) == 0);
    CHECK(epoll_wait(lt, &ev, 1, 0) == 0);
    CHECK(epoll_wait(et, &ev, 1, 0) == 0);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(s, &rd);
    struct timeval zero = {0, 0};
    CHECK(select(s + 1, &rd, NULL, NULL, &zero) == 0);
    CHECK(!polled_readable());

    /* The rest: an edge for it; a read after a poll that said readable
     * returns bytes (edge-triggered, reads until EAGAIN). */
    CHECK(pthread_create(&t, NULL, send_rest, NULL) == 0);
    int eor = 0;
    while (!eor) {
        CHECK(epoll_wait(et, &ev, 1, 5000) == 1 && (ev.events & EPOLLIN));
        for (;;) {
            int ready = polled_readable();
            struct iovec iov = {big, sizeof big};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
            ssize_t r = recvmsg(s, &m, MSG_DONTWAIT);
            if (r < 0) {
                CHECK(errno == EAGAIN && !ready);
                break;
            }
            CHECK(r > 0 && have + (size_t)r <= LEN);
            memcpy(got + have, big, (size_t)r);
            have += (size_t)r;
            if (m.msg_flags & MSG_EOR) {
                eor = 1;
                break;
            }
        }
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(have == LEN && memcmp(got, msg, LEN) == 0);
    puts("heldpart: ok");
    return 0;
}
