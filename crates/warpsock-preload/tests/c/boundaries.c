/* Datagram boundaries, sizes 0..65507, sender address and port as reported
 * by recvfrom/recvmsg, replies over the same path, EMSGSIZE above 65507. */
#include "common.h"

static unsigned char buf[70000], got[70000];

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 31 + i * 7);
}

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int r = udp_bound(port);
    int s = udp_new();
    static const size_t sizes[] = {1, 0, 100, 1472, 9000, 65507, 2, 30000, 65000};
    const size_t n = sizeof sizes / sizeof sizes[0];
    struct sockaddr_in me, from;
    for (size_t i = 0; i < n; i++) {
        /* One at a time: kernel UDP would drop a burst beyond its rcvbuf. */
        fill(buf, sizes[i], (unsigned)i);
        send_to(s, port, buf, sizes[i]);
        socklen_t ml = sizeof me;
        CHECK(getsockname(s, (struct sockaddr *)&me, &ml) == 0);
        CHECK(me.sin_port != 0);
        socklen_t fl = sizeof from;
        memset(&from, 0, sizeof from);
        ssize_t k = recvfrom(r, got, sizeof got, 0, (struct sockaddr *)&from, &fl);
        CHECK(k == (ssize_t)sizes[i]);
        fill(buf, sizes[i], (unsigned)i);
        CHECK(memcmp(buf, got, sizes[i]) == 0);
        CHECK(fl == sizeof(struct sockaddr_in));
        CHECK(from.sin_family == AF_INET);
        CHECK(from.sin_port == me.sin_port);
        CHECK(from.sin_addr.s_addr == htonl(INADDR_LOOPBACK));
    }
    /* recvmsg reports the same, including a short name buffer. */
    send_to(s, port, "abc", 3);
    struct iovec iov = {got, sizeof got};
    char name[4];
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_name = name;
    m.msg_namelen = sizeof name;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    CHECK(recvmsg(r, &m, 0) == 3);
    CHECK(m.msg_namelen == sizeof(struct sockaddr_in)); /* full length, truncated copy */
    CHECK(((struct sockaddr_in *)(void *)name)->sin_family == AF_INET);
    CHECK(m.msg_flags == 0);

    /* Too large for UDP over IPv4. */
    struct sockaddr_in dst = lo(port);
    CHECK(sendto(s, buf, 65508, 0, (struct sockaddr *)&dst, sizeof dst) == -1 && errno == EMSGSIZE);

    /* A reply to the reported source reaches the sender, from the receiver's port. */
    CHECK(sendto(r, "pong", 4, 0, (struct sockaddr *)&from, sizeof from) == 4);
    socklen_t fl = sizeof from;
    CHECK(recvfrom(s, got, sizeof got, 0, (struct sockaddr *)&from, &fl) == 4);
    CHECK(memcmp(got, "pong", 4) == 0);
    CHECK(from.sin_port == htons((unsigned short)port));
    CHECK(from.sin_addr.s_addr == htonl(INADDR_LOOPBACK));

    /* Many small datagrams keep their boundaries and order (one path). */
    for (int batch = 0; batch < 20; batch++) {
        for (int i = 0; i < 50; i++) {
            int v = batch * 50 + i;
            send_to(s, port, &v, sizeof v);
        }
        for (int i = 0; i < 50; i++) {
            int v = -1;
            CHECK(recv(r, &v, sizeof v + 8, 0) == sizeof v);
            CHECK(v == batch * 50 + i);
        }
    }
    puts("boundaries: ok");
    return 0;
}
