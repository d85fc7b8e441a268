/* The program's descriptor numbers with DDP-mode sockets open: as dense
 * as without the library (issue 12). The library's own descriptors (five
 * a DDP connection, less the program's one) live from a floor up (half
 * the soft RLIMIT_NOFILE, warpsock_engine::fds), so a program that sizes
 * an array by its connections (wrk: 10 + 3 x connections) still finds
 * each new number inside it.
 *
 *   fdnumbers dense [plain]    8 pairs; every program number is the one
 *                              plain TCP gives, and the lowest free number
 *                              after them too
 *   fdnumbers crowded [plain]  a soft limit of 100: the library's
 *                              descriptors overflow the room above the
 *                              floor (50) and are placed low; 6 pairs
 *                              still switch and carry their bytes
 *
 *   fdnumbers perend [plain]   prints how many descriptors each end of a
 *                              pair holds ("per_end N"), from the count
 *                              of /proc/self/fd around 4 pairs (one pair
 *                              first: the library's own threads' and
 *                              tables' descriptors are made once)
 *   fdnumbers cloexec [plain]  ioctl FIOCLEX / FIONCLEX on a pair's end set
 *                              and clear close-on-exec on the program's
 *                              number (F_GETFD), as on a TCP socket's
 *
 * "plain": no switch (the numbering is the kernel's; run without the
 * preload). */
#include "ddppair.h"

#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

/* The lowest free number now. */
static int lowest_free(void) {
    int fd = dup(2);
    CHECK(fd >= 0);
    close(fd);
    return fd;
}

/* The n lowest free numbers now, in order, into `out` (numbers inherited
 * open are skipped, as the kernel skips them). */
static void free_numbers(int *out, int n) {
    for (int i = 0; i < n; i++) CHECK((out[i] = dup(2)) >= 0);
    for (int i = 0; i < n; i++) close(out[i]);
}

/* How many numbers below `below` are open. */
static int open_below(int below) {
    int n = 0;
    for (int i = 0; i < below; i++) n += fcntl(i, F_GETFD) >= 0;
    return n;
}

/* A byte each way on a pair. */
static void carries(int c, int s) {
    char b = 0;
    CHECK(send(c, "x", 1, MSG_NOSIGNAL) == 1);
    CHECK(recv(s, &b, 1, 0) == 1 && b == 'x');
    CHECK(send(s, "y", 1, MSG_NOSIGNAL) == 1);
    CHECK(recv(c, &b, 1, 0) == 1 && b == 'y');
}

/* n pairs (switched unless plain), each checked to carry bytes; with
 * `dense`, each end's number checked against plain TCP's; with `spill`
 * (a floor), the library's descriptors checked to have overflowed below
 * it (its room above full) rather than failed. */
static int pairs(int n, int plain, int dense, int spill) {
    int open0 = spill ? open_below(spill) : 0;
    int c[8], s[8], f[17];
    CHECK(n <= 8);
    free_numbers(f, 2 * n + 1);
    int base = f[0];
    for (int i = 0; i < n; i++) {
        if (plain)
            tcp_pair(&c[i], &s[i]);
        else
            ddp_pair(&c[i], &s[i]);
        /* tcp_pair: the listener takes `base` and is closed after the
         * accept; the connecting end and the accepted one take the next
         * two free numbers. */
        if (dense && (c[i] != f[1 + 2 * i] || s[i] != f[2 + 2 * i])) {
            fprintf(stderr, "fdnumbers: pair %d got %d and %d, plain TCP gives %d and %d\n", i,
                    c[i], s[i], f[1 + 2 * i], f[2 + 2 * i]);
            return 1;
        }
    }
    for (int i = 0; i < n; i++) carries(c[i], s[i]);
    if (spill && !plain && open_below(spill) - open0 <= 2 * n) {
        fprintf(stderr, "fdnumbers: no library descriptor below the floor %d with %d pairs "
                        "under a limit of 100: the case does not test the overflow\n", spill, n);
        return 1;
    }
    if (dense && lowest_free() != base) {
        fprintf(stderr, "fdnumbers: the lowest free number is %d after %d pairs, plain TCP's "
                        "is %d\n", lowest_free(), n, base);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        CHECK(close(c[i]) == 0);
        CHECK(close(s[i]) == 0);
    }
    return 0;
}

/* Open descriptors now (the directory's own counted in each call alike). */
static int open_count(void) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Prints the descriptors each end of a pair holds. */
static int per_end(int plain) {
    int c[5], s[5];
    pair_unless_plain(plain, &c[0], &s[0]);
    carries(c[0], s[0]);
    int before = open_count();
    for (int i = 1; i < 5; i++) {
        pair_unless_plain(plain, &c[i], &s[i]);
        carries(c[i], s[i]);
    }
    int held = open_count() - before;
    if (held % 8 != 0) {
        fprintf(stderr, "fdnumbers: 4 pairs hold %d descriptors, not a multiple of 8\n", held);
        return 1;
    }
    printf("per_end %d\n", held / 8);
    for (int i = 0; i < 5; i++) {
        CHECK(close(c[i]) == 0);
        CHECK(close(s[i]) == 0);
    }
    return 0;
}

/* FIOCLEX and FIONCLEX act on the number they are called on. */
static int cloexec(int plain) {
    int c, s;
    pair_unless_plain(plain, &c, &s);
    CHECK((fcntl(c, F_GETFD) & FD_CLOEXEC) == 0);
    CHECK(ioctl(c, FIOCLEX) == 0);
    if ((fcntl(c, F_GETFD) & FD_CLOEXEC) == 0) {
        fprintf(stderr, "fdnumbers: FIOCLEX left the number inheritable\n");
        return 1;
    }
    CHECK(ioctl(c, FIONCLEX) == 0);
    if ((fcntl(c, F_GETFD) & FD_CLOEXEC) != 0) {
        fprintf(stderr, "fdnumbers: FIONCLEX left the number close-on-exec\n");
        return 1;
    }
    carries(c, s);
    CHECK(close(c) == 0);
    CHECK(close(s) == 0);
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    int plain = argc > 2 && strcmp(argv[2], "plain") == 0;
    if (strcmp(argv[1], "dense") == 0) return pairs(8, plain, 1, 0);
    if (strcmp(argv[1], "perend") == 0) return per_end(plain);
    if (strcmp(argv[1], "cloexec") == 0) return cloexec(plain);
    if (strcmp(argv[1], "crowded") == 0) {
        struct rlimit l;
        CHECK(getrlimit(RLIMIT_NOFILE, &l) == 0);
        CHECK(l.rlim_max >= 100);
        l.rlim_cur = 100;
        CHECK(setrlimit(RLIMIT_NOFILE, &l) == 0);
        /* The floor: half the limit (warpsock_engine::fds). */
        return pairs(6, plain, 0, 50);
    }
    fprintf(stderr, "fdnumbers: no case %s\n", argv[1]);
    return 2;
}
