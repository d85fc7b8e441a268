/* A poll of a DDP-mode socket, then an epoll wait over it (issue 12;
 * XSocket::covered): once the process had waited in epoll, a set that
 * watches the socket's connection itself (every registration of a
 * process that waits in epoll) heard of new bytes through the kernel's
 * edge on that connection. A poll that saw the bytes first made the
 * socket's round, which drained the connection: epoll, looking at it
 * again as it reports, dropped the edge, and the wait found nothing for
 * bytes still readable (level-triggered, edge-triggered and one-shot
 * alike: the 10 s wait timed out). Checked (also over TCP with "plain",
 * no preload): for each registration, bytes arrive, poll reports
 * POLLIN, then epoll_wait reports EPOLLIN with the registration's data.
 * Prints "pollepoll: ok". */
#include "ddppair.h"

#include <sys/epoll.h>

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    /* The process waits in epoll from now on. */
    struct epoll_event none[1];
    CHECK(epoll_wait(ep, none, 1, 0) == 0);
    const unsigned regs[3] = {EPOLLIN, EPOLLIN | EPOLLET, EPOLLIN | EPOLLONESHOT};
    for (int i = 0; i < 3; i++) {
        int c, s;
        pair_unless_plain(plain, &c, &s);
        struct epoll_event ev = {regs[i], {.u64 = 1000 + (unsigned)i}};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
        CHECK(write(s, "ab", 2) == 2);
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, 10000) == 1 && p.revents == POLLIN);
        struct epoll_event out[2];
        CHECK(epoll_wait(ep, out, 2, 10000) == 1);
        CHECK(out[0].events == EPOLLIN && out[0].data.u64 == 1000 + (unsigned)i);
        char b[2];
        CHECK(recv(c, b, 2, MSG_WAITALL) == 2 && memcmp(b, "ab", 2) == 0);
        CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL) == 0);
        close(c);
        close(s);
    }
    close(ep);
    printf("pollepoll: ok\n");
    return 0;
}
