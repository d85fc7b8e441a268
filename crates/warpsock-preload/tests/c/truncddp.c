/* recv with MSG_TRUNC on a DDP-mode stream socket (issue 12;
 * xsock/sock/calls.rs recv_discarding), as tcp(7) answers it: the bytes
 * are dropped, not copied, and the buffer may be null (a program drains a
 * connection with recv(fd, NULL, n, MSG_TRUNC)); with MSG_PEEK, the count
 * there, none taken. Before, a null buffer returned 0: the end of stream
 * to the program. Checked (also over TCP with "plain", no preload):
 *   - with 200,000 bytes queued: MSG_TRUNC|MSG_PEEK of 100,000 into NULL
 *     is 100,000 and takes none; MSG_TRUNC|MSG_WAITALL of 150,000 into
 *     NULL is 150,000; a plain read then gets the stream's bytes from
 *     150,000 on; MSG_TRUNC into a buffer leaves it untouched;
 *   - nothing queued, MSG_DONTWAIT: EAGAIN; after the peer's shutdown: 0;
 *   - without MSG_TRUNC, a null buffer of 10 bytes: EFAULT for recv (a
 *     byte queued), recvmsg and send, nothing taken or sent (it read as
 *     the end of stream, and a send of it as 0 bytes sent); recvmsg with
 *     MSG_TRUNC counts a null iovec's length; with nothing queued EAGAIN,
 *     at the end of the stream 0, for recv and recvmsg (both were EFAULT
 *     at once).
 * Prints "truncddp: ok". */
#include "ddppair.h"

#include <sys/ioctl.h>

#define TOTAL 200000

static unsigned char pat(size_t i) {
    return (unsigned char)(i * 7 + 3);
}

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    int c, s;
    /* Room for the whole stream at c over TCP too. */
    tcp_pair_small(&c, &s, 1 << 20);
    if (!plain) ddp_switch(&c, &s);
    static unsigned char b[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) b[i] = pat(i);
    write_every(s, b, TOTAL);
    /* All of it queued at c (bounded: 10 s). */
    for (int k = 0;; k++) {
        int q = 0;
        CHECK(ioctl(c, FIONREAD, &q) == 0);
        if (q >= TOTAL) break;
        CHECK(k < 1000);
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, 10) >= 0);
    }
    CHECK(recv(c, NULL, 100000, MSG_TRUNC | MSG_PEEK) == 100000);
    CHECK(recv(c, NULL, 150000, MSG_TRUNC | MSG_WAITALL) == 150000);
    size_t got = 150000;
    unsigned char r[4096];
    memset(r, 0xee, sizeof r);
    CHECK(recv(c, r, 10, MSG_TRUNC) == 10);
    CHECK(r[0] == 0xee && r[9] == 0xee);
    got += 10;
    while (got < TOTAL) {
        ssize_t n = read(c, r, sizeof r);
        CHECK(n > 0);
        for (ssize_t i = 0; i < n; i++) CHECK(r[i] == pat(got + (size_t)i));
        got += (size_t)n;
    }
    errno = 0;
    CHECK(recv(c, NULL, 10, MSG_TRUNC | MSG_DONTWAIT) == -1 && errno == EAGAIN);
    /* Without MSG_TRUNC a null buffer with nothing queued is EAGAIN (the
     * receive's own answer: no byte to fault on), for recvmsg too. */
    struct iovec nv = {NULL, 1};
    struct msghdr nm;
    memset(&nm, 0, sizeof nm);
    nm.msg_iov = &nv;
    nm.msg_iovlen = 1;
    errno = 0;
    CHECK(recv(c, NULL, 10, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    errno = 0;
    CHECK(recvmsg(c, &nm, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    /* With a byte queued it faults (not the end of stream), and a send
     * from one too; nothing is taken or sent. */
    CHECK(write(s, "xy", 2) == 2);
    struct pollfd q = {c, POLLIN, 0};
    CHECK(poll(&q, 1, 10000) == 1);
    errno = 0;
    CHECK(recv(c, NULL, 10, 0) == -1 && errno == EFAULT);
    errno = 0;
    CHECK(send(s, NULL, 10, MSG_NOSIGNAL) == -1 && errno == EFAULT);
    /* recvmsg alike: null bases fault without MSG_TRUNC; with it their
     * lengths count (one byte of the two dropped). */
    errno = 0;
    CHECK(recvmsg(c, &nm, 0) == -1 && errno == EFAULT);
    CHECK(recvmsg(c, &nm, MSG_TRUNC) == 1);
    CHECK(read(c, r, sizeof r) == 1 && r[0] == 'y');
    CHECK(shutdown(s, SHUT_WR) == 0);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    CHECK(recv(c, NULL, 10, MSG_TRUNC) == 0);
    /* At the end of the stream a null buffer reads 0, as any. */
    CHECK(recv(c, NULL, 10, 0) == 0);
    CHECK(recvmsg(c, &nm, 0) == 0);
    close(c);
    close(s);
    printf("truncddp: ok\n");
    return 0;
}
