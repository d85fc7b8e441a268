/* stripes PORT_A PORT_B COUNT: run with WARPSOCK_STRIPES=4, datagrams
 * travel over several connections per destination and may arrive in any
 * order (UDP promises none); readiness and exactly-once delivery must hold.
 * 1. A sends COUNT numbered datagrams to B in batches of 64; B waits with
 *    edge-triggered epoll and drains with MSG_DONTWAIT until EAGAIN after
 *    every wake-up. Each datagram must arrive exactly once, and once all
 *    have, B must not poll readable (no stale doorbell).
 * 2. 500 ping-pongs A -> B -> A with blocking recvfrom on both sides (the
 *    caller-driven receive path); B's replies travel back striped too, and
 *    each must match its ping.
 * Prints "reordered N": datagrams that arrived after a later-sent one. */
#include "common.h"
#include <sys/epoll.h>

int main(int argc, char **argv) {
    int pa = port_arg(argc, argv, 1), pb = port_arg(argc, argv, 2);
    int count = atoi(argv[3]);
    CHECK(count > 0);
    int a = udp_bound(pa), b = udp_bound(pb);
    int fl = fcntl(b, F_GETFL);
    CHECK(fl >= 0);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data = {.fd = b}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) == 0);
    char *seen = calloc((size_t)count, 1);
    CHECK(seen != NULL);
    char buf[256];
    int got = 0, max = -1, reordered = 0, sent = 0;
    while (got < count) {
        for (int i = 0; i < 64 && sent < count; i++, sent++) {
            memset(buf, 'x', 100);
            memcpy(buf, &sent, sizeof sent);
            send_to(a, pb, buf, 100);
        }
        while (got < sent) {
            struct epoll_event out;
            int n = epoll_wait(ep, &out, 1, 5000);
            CHECK(n == 1);
            for (;;) {
                struct sockaddr_in from;
                socklen_t fl2 = sizeof from;
                ssize_t k = recvfrom(b, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from,
                                     &fl2);
                if (k < 0) {
                    CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
                    break;
                }
                CHECK(k == 100);
                CHECK(ntohs(from.sin_port) == pa);
                int seq;
                memcpy(&seq, buf, sizeof seq);
                CHECK(seq >= 0 && seq < sent);
                CHECK(!seen[seq]);
                seen[seq] = 1;
                got++;
                if (seq < max) reordered++;
                if (seq > max) max = seq;
            }
        }
    }
    struct pollfd p = {.fd = b, .events = POLLIN};
    CHECK(poll(&p, 1, 50) == 0);
    for (int i = 0; i < 500; i++) {
        int len = snprintf(buf, sizeof buf, "ping %d", i);
        send_to(a, pb, buf, (size_t)len);
        char in[256];
        struct sockaddr_in from;
        socklen_t flen = sizeof from;
        ssize_t k = recvfrom(b, in, sizeof in, 0, (struct sockaddr *)&from, &flen);
        CHECK(k == len && memcmp(in, buf, (size_t)len) == 0);
        in[0] = 'P';
        CHECK(sendto(b, in, (size_t)k, 0, (struct sockaddr *)&from, flen) == k);
        char back[256];
        k = recv(a, back, sizeof back, 0);
        CHECK(k == len && memcmp(back, in, (size_t)len) == 0);
    }
    CHECK(poll(&p, 1, 0) == 0);
    printf("received %d reordered %d\n", got, reordered);
    return 0;
}
