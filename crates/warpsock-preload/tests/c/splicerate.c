/* The receive rate of a stream read with read(2) or moved with splice(2)
 * (socket -> pipe -> /dev/null), over a TCP pair or a DDP-mode one
 * (scripts/bench-ddp-splice.sh; interpose/transfer.rs). A writer thread
 * writes MIB MiB in 64 KiB writes, then shuts its side; the reader takes
 * 64 KiB a call until the end of stream. Prints "rate MIBPS" (MiB/s,
 * from the first write to the end of stream).
 *   splicerate plain|ddp read|splice MIB
 * ddp: run preloaded (both ends switched in this process). */
#include "ddppair.h"

#include <time.h>

static size_t total;

static void *writer(void *arg) {
    int fd = *(int *)arg;
    static char b[65536];
    for (size_t i = 0; i < sizeof b; i++) b[i] = (char)i;
    size_t sent = 0;
    while (sent < total) {
        ssize_t k = write(fd, b, sizeof b);
        CHECK(k > 0);
        sent += (size_t)k;
    }
    CHECK(shutdown(fd, SHUT_WR) == 0);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 4);
    int ddp = strcmp(argv[1], "ddp") == 0, spliced = strcmp(argv[2], "splice") == 0;
    CHECK(ddp || strcmp(argv[1], "plain") == 0);
    CHECK(spliced || strcmp(argv[2], "read") == 0);
    int mib = atoi(argv[3]);
    CHECK(mib >= 1 && mib <= 65536);
    total = (size_t)mib << 20;
    int c, s;
    pair_unless_plain(!ddp, &c, &s);
    int p[2];
    CHECK(pipe(p) == 0);
    int null = open("/dev/null", O_WRONLY);
    CHECK(null >= 0);
    static char buf[65536];
    struct timespec a, b;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &a) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, writer, &s) == 0);
    size_t got = 0;
    for (;;) {
        ssize_t n;
        if (spliced) {
            n = splice(c, NULL, p[1], NULL, sizeof buf, 0);
            if (n > 0) CHECK(splice(p[0], NULL, null, NULL, (size_t)n, 0) == n);
        } else {
            n = read(c, buf, sizeof buf);
        }
        CHECK(n >= 0);
        if (n == 0) break;
        got += (size_t)n;
    }
    CHECK(clock_gettime(CLOCK_MONOTONIC, &b) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(got == total);
    double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    printf("rate %.0f\n", (double)got / 1048576.0 / secs);
    return 0;
}
