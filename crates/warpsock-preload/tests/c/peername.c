/* A server's names of an accepted connection, read at once, as redis's
 * protected mode does (its peer must be a loopback address): binds
 * 127.0.0.1 port 0, prints "ready PORT", accepts one connection, prints
 * "accepted", checks
 * that getpeername and getsockname give 127.0.0.1 and the ports the
 * connection has, echoes one read and exits 0. Under a preload in policy
 * mode the accepted connection is still switching when the names are read
 * (tests/ddp_accept_stall.rs). Bounded: SO_RCVTIMEO 60 s, and the test
 * kills it by pid. */
#include "common.h"

static void check_loopback(const char *what, int r, const struct sockaddr_storage *ss) {
    if (r != 0) {
        fprintf(stderr, "peername: %s failed: %s\n", what, strerror(errno));
        exit(1);
    }
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    if (ss->ss_family != AF_INET || a->sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
        fprintf(stderr, "peername: %s gave family %d, not 127.0.0.1\n", what, ss->ss_family);
        exit(1);
    }
}

int main(void) {
    int l = tcp_listener_ready(8);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    int c = accept(l, (struct sockaddr *)&from, &fl);
    CHECK(c >= 0);
    /* The test's client writes only once it has read this: the names are
     * looked up while the connection still switches. */
    printf("accepted\n");
    fflush(stdout);
    struct sockaddr_storage peer, mine;
    socklen_t pl = sizeof peer, ml = sizeof mine;
    check_loopback("getpeername", getpeername(c, (struct sockaddr *)&peer, &pl), &peer);
    check_loopback("getsockname", getsockname(c, (struct sockaddr *)&mine, &ml), &mine);
    CHECK(((struct sockaddr_in *)&peer)->sin_port == from.sin_port);
    CHECK(((struct sockaddr_in *)&mine)->sin_port == a.sin_port);
    set_rcvtimeo(c, 60000);
    char b[64];
    ssize_t r = read(c, b, sizeof b);
    CHECK(r > 0);
    CHECK(write(c, b, (size_t)r) == r);
    close(c);
    printf("names ok\n");
    return 0;
}
