/* glibc's second names of the interposed calls over a DDP-mode pair
 * (issue 12; interpose/aliases.rs): a program that calls __poll,
 * __select, __read, __write, __send, __connect, __close, __fcntl or
 * __dup2 (exported by glibc as the same functions as poll, select, ...)
 * must get what the first names give:
 *   - __send and __write carry bytes over the DDP stream (not raw into
 *     the carrier's byte stream), __read reads them;
 *   - __fcntl's O_NONBLOCK reaches the socket: a read of nothing fails
 *     with EAGAIN at once (not a blocking wait);
 *   - __dup2's copy names the socket: bytes read through it;
 *   - __poll and __select see the peer's bytes arrive (within 10 s: not
 *     the doorbell nobody rings, which waits its whole bound);
 *   - __close is an orderly close the peer reads as end of stream;
 *   - __connect to 127.0.0.2, in policy mode (the test sets every port
 *     and WARPSOCK_DDP_ADDRS=127.0.0.2/32; the pair above is on 127.0.0.1,
 *     switched by setsockopt), switches: both ends read
 *     WARPSOCK_DDP_MODE 1.
 * Prints "aliasddp: ok". Run preloaded. */
#include "ddppair.h"

#include <poll.h>
#include <sys/select.h>

extern int __poll(struct pollfd *, nfds_t, int);
extern int __select(int, fd_set *, fd_set *, fd_set *, struct timeval *);
extern ssize_t __read(int, void *, size_t);
extern ssize_t __write(int, const void *, size_t);
extern ssize_t __send(int, const void *, size_t, int);
extern int __connect(int, const struct sockaddr *, socklen_t);
extern int __close(int);
extern int __fcntl(int, int, ...);
extern int __dup2(int, int);

/* fd's WARPSOCK_DDP_MODE. */
static int ddp_mode_of(int fd) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &v, &len) == 0 && len == sizeof v);
    return v;
}

/* Reads exactly n bytes of fd with __read into b, each wait a __poll. */
static void read_all(int fd, char *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        CHECK(__poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
        ssize_t k = __read(fd, b + got, n - got);
        CHECK(k > 0);
        got += (size_t)k;
    }
}

int main(void) {
    int c, s;
    ddp_pair(&c, &s);
    /* __fcntl's O_NONBLOCK: a read of nothing fails at once. */
    CHECK(__fcntl(c, F_SETFL, __fcntl(c, F_GETFL) | O_NONBLOCK) == 0);
    char nb;
    CHECK(__read(c, &nb, 1) == -1 && errno == EAGAIN);

    /* __send and __write, read back with __read after __poll. */
    CHECK(__send(s, "hello ", 6, 0) == 6);
    CHECK(__write(s, "world", 5) == 5);
    char b[16] = {0};
    read_all(c, b, 11);
    CHECK(memcmp(b, "hello world", 11) == 0);

    /* __select sees the next bytes arrive. */
    CHECK(__write(s, "again", 5) == 5);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(c, &rd);
    struct timeval tv = {10, 0};
    CHECK(__select(c + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(c, &rd));
    CHECK(tv.tv_sec > 0);
    read_all(c, b, 5);
    CHECK(memcmp(b, "again", 5) == 0);

    /* __dup2's copy names the socket. */
    int d = __dup2(c, 100);
    CHECK(d == 100);
    CHECK(__write(s, "dup", 3) == 3);
    read_all(d, b, 3);
    CHECK(memcmp(b, "dup", 3) == 0);
    CHECK(close(d) == 0);

    /* __close: an orderly close, the peer's end of stream. */
    CHECK(__close(s) == 0);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(__poll(&p, 1, 10000) == 1);
    CHECK(__read(c, b, sizeof b) == 0);
    CHECK(close(c) == 0);

    /* __connect to a policy-mode address switches the connection. */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in a = lo(0);
    a.sin_addr.s_addr = htonl(0x7f000002);
    socklen_t alen = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(k >= 0);
    /* From 127.0.0.2 too: the accepting end's peer is in the prefix. */
    struct sockaddr_in from = a;
    from.sin_port = 0;
    CHECK(bind(k, (struct sockaddr *)&from, sizeof from) == 0);
    CHECK(__connect(k, (struct sockaddr *)&a, sizeof a) == 0);
    int t = accept(l, NULL, NULL);
    CHECK(t >= 0);
    CHECK(__send(k, "x", 1, 0) == 1);
    CHECK(recv(t, b, 1, MSG_WAITALL) == 1 && b[0] == 'x');
    CHECK(ddp_mode_of(k) == 1 && ddp_mode_of(t) == 1);
    close(k);
    close(t);
    close(l);
    printf("aliasddp: ok\n");
    return 0;
}
