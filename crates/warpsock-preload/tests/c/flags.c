/* MSG_PEEK, MSG_TRUNC (recv and recvmsg), MSG_DONTWAIT, O_NONBLOCK via fcntl
 * and FIONBIO, SO_RCVTIMEO, FIONREAD, and getsockopt on the socket. */
#include "common.h"
#include <sys/ioctl.h>

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int r = udp_bound(port);
    int s = udp_new();
    char b[64];
    int v;

    /* Socket identity as the program sees it. */
    socklen_t l = sizeof v;
    CHECK(getsockopt(r, SOL_SOCKET, SO_TYPE, &v, &l) == 0 && v == SOCK_DGRAM);
    l = sizeof v;
    CHECK(getsockopt(r, SOL_SOCKET, SO_DOMAIN, &v, &l) == 0 && v == AF_INET);

    send_to(s, port, "hello world", 11);
    /* PEEK twice, then read: the same datagram three times. */
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    CHECK(recvfrom(r, b, sizeof b, MSG_PEEK, (struct sockaddr *)&from, &fl) == 11);
    CHECK(memcmp(b, "hello world", 11) == 0);
    CHECK(from.sin_addr.s_addr == htonl(INADDR_LOOPBACK));
    memset(b, 0, sizeof b);
    CHECK(recv(r, b, 5, MSG_PEEK) == 5 && memcmp(b, "hello", 5) == 0);
    /* FIONREAD: the size of the next datagram. */
    int avail = -1;
    CHECK(ioctl(r, FIONREAD, &avail) == 0 && avail == 11);
    CHECK(recv(r, b, sizeof b, 0) == 11);

    /* Truncation: the rest of the datagram is discarded. */
    send_to(s, port, "0123456789", 10);
    send_to(s, port, "next", 4);
    CHECK(recv(r, b, 4, 0) == 4 && memcmp(b, "0123", 4) == 0);
    CHECK(recv(r, b, sizeof b, 0) == 4 && memcmp(b, "next", 4) == 0);
    /* MSG_TRUNC returns the real length. */
    send_to(s, port, "0123456789", 10);
    CHECK(recv(r, b, 3, MSG_TRUNC) == 10);
    /* recvmsg flags MSG_TRUNC in msg_flags. */
    send_to(s, port, "0123456789", 10);
    struct iovec iov = {b, 6};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    CHECK(recvmsg(r, &m, 0) == 6);
    CHECK(m.msg_flags & MSG_TRUNC);
    /* A gather into two iovecs. */
    send_to(s, port, "abcdefgh", 8);
    char p1[3], p2[10];
    struct iovec two[2] = {{p1, 3}, {p2, 10}};
    m.msg_iov = two;
    m.msg_iovlen = 2;
    m.msg_flags = 0;
    CHECK(recvmsg(r, &m, 0) == 8);
    CHECK(memcmp(p1, "abc", 3) == 0 && memcmp(p2, "defgh", 5) == 0 && m.msg_flags == 0);
    /* Sends gathered from three iovecs and from six (one empty): under the
     * preload a write to an idle connection puts the frame header and the
     * first few on the stack, more on the heap. */
    for (int many = 0; many < 2; many++) {
        struct iovec g[6] = {{"ab", 2}, {"cde", 3}, {"f", 1}, {"", 0}, {"ghij", 4}, {"k", 1}};
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct msghdr sm;
        memset(&sm, 0, sizeof sm);
        sm.msg_name = &to;
        sm.msg_namelen = sizeof to;
        sm.msg_iov = g;
        sm.msg_iovlen = many ? 6 : 3;
        ssize_t want = many ? 11 : 6;
        CHECK(sendmsg(s, &sm, 0) == want);
        memset(b, 0, sizeof b);
        CHECK(recv(r, b, sizeof b, 0) == want);
        CHECK(memcmp(b, many ? "abcdefghijk" : "abcdef", (size_t)want) == 0);
    }

    /* MSG_DONTWAIT on an empty socket. */
    CHECK(recv(r, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    /* O_NONBLOCK through fcntl. */
    int fl0 = fcntl(r, F_GETFL);
    CHECK(fcntl(r, F_SETFL, fl0 | O_NONBLOCK) == 0);
    CHECK(fcntl(r, F_GETFL) & O_NONBLOCK);
    CHECK(recv(r, b, sizeof b, 0) == -1 && errno == EAGAIN);
    send_to(s, port, "nb", 2);
    long t0 = now_ms();
    ssize_t k;
    while ((k = recv(r, b, sizeof b, 0)) == -1 && errno == EAGAIN && now_ms() - t0 < 3000) sleep_ms(1);
    CHECK(k == 2);
    CHECK(fcntl(r, F_SETFL, fl0) == 0);
    /* FIONBIO. */
    int on = 1;
    CHECK(ioctl(r, FIONBIO, &on) == 0);
    CHECK(recv(r, b, sizeof b, 0) == -1 && errno == EAGAIN);
    on = 0;
    CHECK(ioctl(r, FIONBIO, &on) == 0);

    /* SO_RCVTIMEO: a blocking receive gives up after about the timeout. */
    set_rcvtimeo(r, 200);
    struct timeval tv;
    l = sizeof tv;
    CHECK(getsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) == 0 && tv.tv_sec == 0 && tv.tv_usec == 200000);
    t0 = now_ms();
    CHECK(recv(r, b, sizeof b, 0) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK));
    long took = now_ms() - t0;
    CHECK(took >= 150 && took < 2000);
    /* ...and still returns data that does arrive. */
    send_to(s, port, "late", 4);
    CHECK(recv(r, b, sizeof b, 0) == 4);
    puts("flags: ok");
    return 0;
}
