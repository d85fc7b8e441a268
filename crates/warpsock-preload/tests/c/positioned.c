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
 *     count: EINVAL.
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
    /* Nothing of those went: the next bytes are these. */
    CHECK(write(s, "end", 3) == 3);
    CHECK(read(c, y, sizeof y) == 3 && memcmp(y, "end", 3) == 0);
    close(c);
    close(s);
    printf("positioned: ok\n");
    return 0;
}
