/* preadv2(2) and pwritev2(2) (and their 64-bit names) on a DDP-mode
 * socket (issue 12; interpose/io.rs): at the current position (-1) they
 * are readv and writev for a socket, which the kernel made on the file
 * the number names (the doorbell's end). Checked, as Linux's TCP
 * answers (with "plain", no preload):
 *   - pwritev2 at -1 of two buffers, preadv2 at -1 into two buffers:
 *     the bytes, in order; the 64-bit names alike;
 *   - preadv2 at -1 with RWF_NOWAIT and nothing to read: EAGAIN (the
 *     socket blocking);
 *   - any other offset: ESPIPE, for both calls; below -1, or a negative
 *     count: EINVAL;
 *   - readv/writev/preadv2 counts below 0 or above 1,024: EINVAL;
 *     recvmsg/sendmsg/recvmmsg/sendmmsg vectors above it: EMSGSIZE
 *     (the library read a negative count as 0 buffers, and walked a
 *     longer vector: a crash past the caller's array).
 * Prints "positioned: ok". */
#include "ddppair.h"

#include <sys/uio.h>

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    int c, s;
    pair_unless_plain(plain, &c, &s);
    char a[] = "hello ", b[] = "world";
    struct iovec out[2] = {{a, 6}, {b, 5}};
    CHECK(pwritev2(s, out, 2, -1, 0) == 11);
    char x[4], y[16];
    struct iovec in[2] = {{x, sizeof x}, {y, sizeof y}};
    size_t got = 0;
    char all[16];
    while (got < 11) {
        ssize_t n = preadv2(c, in, 2, -1, 0);
        CHECK(n > 0);
        size_t k = (size_t)n < sizeof x ? (size_t)n : sizeof x;
        memcpy(all + got, x, k);
        memcpy(all + got + k, y, (size_t)n - k);
        got += (size_t)n;
    }
    CHECK(got == 11 && memcmp(all, "hello world", 11) == 0);
    /* The 64-bit names. */
    CHECK(pwritev64v2(c, out, 1, -1, 0) == 6);
    struct iovec one = {y, sizeof y};
    CHECK(preadv64v2(s, &one, 1, -1, 0) == 6 && memcmp(y, "hello ", 6) == 0);
    /* Nothing to read, RWF_NOWAIT: EAGAIN at once. */
    errno = 0;
    CHECK(preadv2(c, &one, 1, -1, RWF_NOWAIT) == -1 && errno == EAGAIN);
    /* A position: a socket has none. */
    errno = 0;
    CHECK(preadv2(c, &one, 1, 0, 0) == -1 && errno == ESPIPE);
    errno = 0;
    CHECK(pwritev2(s, out, 1, 5, 0) == -1 && errno == ESPIPE);
    /* Below -1, or a negative count: EINVAL. */
    errno = 0;
    CHECK(preadv2(c, &one, 1, -2, 0) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pwritev2(s, out, -1, -1, 0) == -1 && errno == EINVAL);
    /* Vector bounds, checked before the vector is read: readv and writev
     * below 0 or above UIO_MAXIOV (1,024) buffers are EINVAL (a negative
     * count read 0 bytes; one past the bound walked the vector);
     * recvmsg, sendmsg and their mmsg forms are EMSGSIZE. */
    static struct iovec many[1025];
    for (int i = 0; i < 1025; i++) many[i] = (struct iovec){y, 1};
    volatile int negative = -1;
    errno = 0;
    CHECK(readv(c, many, negative) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(readv(c, many, 1025) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(writev(s, many, negative) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(writev(s, many, 1025) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(preadv2(c, many, 1025, -1, 0) == -1 && errno == EINVAL);
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = many;
    m.msg_iovlen = 1025;
    errno = 0;
    CHECK(sendmsg(s, &m, MSG_NOSIGNAL) == -1 && errno == EMSGSIZE);
    errno = 0;
    CHECK(recvmsg(c, &m, MSG_DONTWAIT) == -1 && errno == EMSGSIZE);
    struct mmsghdr mm;
    memset(&mm, 0, sizeof mm);
    mm.msg_hdr = m;
    errno = 0;
    CHECK(sendmmsg(s, &mm, 1, MSG_NOSIGNAL) == -1 && errno == EMSGSIZE);
    errno = 0;
    CHECK(recvmmsg(c, &mm, 1, MSG_DONTWAIT, NULL) == -1 && errno == EMSGSIZE);
    /* 1,024 is taken. */
    CHECK(writev(s, many, 1024) == 1024);
    size_t left = 1024;
    while (left > 0) {
        ssize_t n = readv(c, many, (int)left);
        CHECK(n > 0);
        left -= (size_t)n;
    }
    /* Nothing of those went: the next bytes are these. */
    CHECK(write(s, "end", 3) == 3);
    CHECK(read(c, y, sizeof y) == 3 && memcmp(y, "end", 3) == 0);
    close(c);
    close(s);
    printf("positioned: ok\n");
    return 0;
}
