/* close_range(2) and closefrom(3) over DDP-mode sockets (issue 12;
 * interpose/ranges.rs). Both closed below the interposer: the DDP
 * socket's connection stayed open (the peer never read the end of
 * stream) and its number stayed in the library's table, so a new socket
 * given that number wrote to the old peer. Checked:
 *   - close_range(c, c, 0): the peer reads the end of stream (0) within
 *     10 s; a new socket made next gets the number, and a write on it,
 *     unconnected, fails with EPIPE (no byte reaches the old peer: its
 *     next read is the end again);
 *   - closefrom(n) with two DDP sockets at n and above: both numbers are
 *     free after, both peers read the end of stream, and a DDP pair made
 *     after works (the library's own descriptors, above its floor, were
 *     not closed from under it);
 *   - close_range's own errors: first > last is EINVAL.
 * With "plain" (no preload) the same over TCP: the kernel's answers.
 * Prints "closerange: ok". */
#include "ddppair.h"

#include <sys/wait.h>

static int plain;

static void pair(int *c, int *s) {
    pair_unless_plain(plain, c, s);
}

/* fd reads the end of stream within 10 s. */
static void reads_end(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    char b[8];
    CHECK(read(fd, b, sizeof b) == 0);
}

int main(int argc, char **argv) {
    plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    signal(SIGPIPE, SIG_IGN);
    int c, s;
    pair(&c, &s);
    /* Every number below c taken (the pair's listener left a hole): the
     * next new descriptor after c's close is c. */
    int fill[64], nfill = 0;
    for (;;) {
        int x = open("/dev/null", O_RDONLY);
        CHECK(x >= 0 && nfill < 64);
        if (x > c) {
            close(x);
            break;
        }
        fill[nfill++] = x;
    }
    CHECK(close_range((unsigned)c, (unsigned)c, 0) == 0);
    reads_end(s);
    int f = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(f == c);
    errno = 0;
    CHECK(write(f, "zz", 2) == -1 && errno == EPIPE);
    reads_end(s);
    close(f);
    close(s);
    for (int i = 0; i < nfill; i++) close(fill[i]);

    errno = 0;
    CHECK(close_range(5, 4, 0) == -1 && errno == EINVAL);

    /* Two pairs; closefrom from the lowest number of the second's two
     * ends made last: c2 and s2 (the first pair's ends stay open). */
    int c1, s1, c2, s2;
    pair(&c1, &s1);
    pair(&c2, &s2);
    int low = c2 < s2 ? c2 : s2;
    CHECK(low > c1 && low > s1);
    /* Both ends of the second pair closed: the first pair's peers read
     * nothing of it; its own ends are gone. */
    closefrom(low);
    errno = 0;
    CHECK(fcntl(c2, F_GETFD) == -1 && errno == EBADF);
    errno = 0;
    CHECK(fcntl(s2, F_GETFD) == -1 && errno == EBADF);
    /* The first pair still carries bytes, and a pair made now works. */
    char b[8];
    CHECK(write(c1, "one", 3) == 3);
    CHECK(read(s1, b, sizeof b) == 3 && memcmp(b, "one", 3) == 0);
    int c3, s3;
    pair(&c3, &s3);
    CHECK(write(s3, "three", 5) == 5);
    CHECK(read(c3, b, sizeof b) == 5 && memcmp(b, "three", 5) == 0);
    /* closefrom of the first pair's lower end: its peer reads the end. */
    int hi1 = c1 > s1 ? c1 : s1, lo1 = c1 < s1 ? c1 : s1;
    CHECK(dup2(hi1, 200) == 200 && close(hi1) == 0);
    CHECK(c3 < 200 && s3 < 200);
    close(c3);
    close(s3);
    closefrom(lo1 + 1);
    /* 200 (the duplicate of the higher end) closed: the lower reads the
     * end of stream. */
    errno = 0;
    CHECK(fcntl(200, F_GETFD) == -1 && errno == EBADF);
    reads_end(lo1);
    close(lo1);
    printf("closerange: ok\n");
    return 0;
}
