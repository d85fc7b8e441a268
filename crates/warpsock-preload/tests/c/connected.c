/* Connected UDP sockets (send/write/read, getpeername, filtering of other
 * senders), getsockname, and sendmmsg/recvmmsg batches. Ports: a b. */
#include "common.h"

int main(int argc, char **argv) {
    int pa = port_arg(argc, argv, 1), pb = port_arg(argc, argv, 2);
    int a = udp_bound(pa), b = udp_bound(pb);
    struct sockaddr_in aa = lo(pa), ba = lo(pb), got;
    socklen_t gl = sizeof got;
    CHECK(getsockname(a, (struct sockaddr *)&got, &gl) == 0 && got.sin_port == aa.sin_port);
    gl = sizeof got;
    CHECK(getpeername(a, (struct sockaddr *)&got, &gl) == -1 && errno == ENOTCONN);
    CHECK(write(a, "x", 1) == -1 && (errno == EDESTADDRREQ || errno == ENOTCONN));

    CHECK(connect(a, (struct sockaddr *)&ba, sizeof ba) == 0);
    CHECK(connect(b, (struct sockaddr *)&aa, sizeof aa) == 0);
    gl = sizeof got;
    CHECK(getpeername(a, (struct sockaddr *)&got, &gl) == 0 && got.sin_port == ba.sin_port);
    char buf[100];
    CHECK(send(a, "one", 3, 0) == 3);
    CHECK(write(a, "two", 3) == 3);
    CHECK(read(b, buf, sizeof buf) == 3 && memcmp(buf, "one", 3) == 0);
    gl = sizeof got;
    CHECK(recvfrom(b, buf, sizeof buf, 0, (struct sockaddr *)&got, &gl) == 3);
    CHECK(memcmp(buf, "two", 3) == 0 && got.sin_port == aa.sin_port);
    CHECK(write(b, "back", 4) == 4);
    CHECK(recv(a, buf, sizeof buf, 0) == 4 && memcmp(buf, "back", 4) == 0);

    /* A third socket's datagrams do not reach a socket connected elsewhere. */
    int c = udp_new();
    send_to(c, pa, "intruder", 8);
    CHECK(send(b, "legit", 5, 0) == 5);
    CHECK(recv(a, buf, sizeof buf, 0) == 5 && memcmp(buf, "legit", 5) == 0);
    CHECK(recv(a, buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN);

    /* sendmmsg / recvmmsg: 8 datagrams in one call each way. */
    enum { N = 8 };
    struct mmsghdr mm[N];
    struct iovec iov[N];
    char out[N][16], in[N][16];
    memset(mm, 0, sizeof mm);
    for (int i = 0; i < N; i++) {
        snprintf(out[i], sizeof out[i], "msg-%d", i);
        iov[i].iov_base = out[i];
        iov[i].iov_len = strlen(out[i]);
        mm[i].msg_hdr.msg_iov = &iov[i];
        mm[i].msg_hdr.msg_iovlen = 1;
    }
    CHECK(sendmmsg(a, mm, N, 0) == N);
    for (int i = 0; i < N; i++) CHECK(mm[i].msg_len == strlen(out[i]));
    sleep_ms(100);
    memset(mm, 0, sizeof mm);
    struct sockaddr_in names[N];
    for (int i = 0; i < N; i++) {
        iov[i].iov_base = in[i];
        iov[i].iov_len = sizeof in[i];
        mm[i].msg_hdr.msg_iov = &iov[i];
        mm[i].msg_hdr.msg_iovlen = 1;
        mm[i].msg_hdr.msg_name = &names[i];
        mm[i].msg_hdr.msg_namelen = sizeof names[i];
    }
    int n = recvmmsg(b, mm, N, MSG_WAITFORONE, NULL);
    CHECK(n == N);
    for (int i = 0; i < N; i++) {
        CHECK(mm[i].msg_len == strlen(out[i]) && memcmp(in[i], out[i], mm[i].msg_len) == 0);
        CHECK(names[i].sin_port == aa.sin_port);
    }
    /* Disconnect (AF_UNSPEC): b hears everyone again. */
    struct sockaddr un = {.sa_family = AF_UNSPEC};
    CHECK(connect(b, &un, sizeof un) == 0);
    send_to(c, pb, "any", 3);
    CHECK(recv(b, buf, sizeof buf, 0) == 3 && memcmp(buf, "any", 3) == 0);
    /* shutdown(SHUT_WR): later sends fail with EPIPE; the socket still
     * receives. (Under the preload the hidden kernel socket keeps sending
     * the offload's own datagrams: socat shuts its socket down at EOF.) */
    CHECK(shutdown(a, SHUT_WR) == 0);
    CHECK(send(a, "late", 4, MSG_NOSIGNAL) == -1 && errno == EPIPE);
    CHECK(sendto(b, "still", 5, 0, (struct sockaddr *)&aa, sizeof aa) == 5);
    CHECK(recv(a, buf, sizeof buf, 0) == 5 && memcmp(buf, "still", 5) == 0);
    puts("connected: ok");
    return 0;
}
