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
 *   - close_range's own errors: first > last and an unknown flag are
 *     EINVAL, and close nothing;
 *   - the library's descriptors made under a lower limit (the first
 *     pairs under a soft RLIMIT_NOFILE of 1,024, the later ones after it
 *     is raised back) survive a closefrom of the program's numbers;
 *   - a forked child's closefrom(3) leaves it 0, 1 and 2 alone (its
 *     copies of the library's descriptors closed too).
 * With "plain" (no preload) the same over TCP: the kernel's answers.
 * Prints "closerange: ok". */
#include "ddppair.h"

#include <dirent.h>
#include <sys/resource.h>
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

/* The number of open descriptors (/proc/self/fd, less the directory's
 * own). */
static int open_count(void) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;
}

int main(int argc, char **argv) {
    plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    signal(SIGPIPE, SIG_IGN);
    /* The first pairs under a soft limit of 1,024 (the library's floor
     * then 512), the later ones under the limit raised back, as redis
     * raises it: the library's descriptors made first stay low. */
    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0);
    struct rlimit low_lim = lim;
    if (low_lim.rlim_cur > 1024) low_lim.rlim_cur = 1024;
    CHECK(setrlimit(RLIMIT_NOFILE, &low_lim) == 0);
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
    /* An unknown flag: EINVAL, and nothing closed (the pair made next
     * still carries bytes). */
    int k1, k2;
    pair(&k1, &k2);
    errno = 0;
    CHECK(close_range((unsigned)k1, (unsigned)k1, 1u << 5) == -1 && errno == EINVAL);
    char kb[4];
    CHECK(write(k2, "k", 1) == 1 && read(k1, kb, sizeof kb) == 1 && kb[0] == 'k');
    close(k1);
    close(k2);
    CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    /* A range wholly at the top of the table: 0 (the library may hold
     * that part: it leaves the program's number there open, README). */
    int top = (int)(lim.rlim_cur > 4096 ? 4000 : lim.rlim_cur - 2);
    CHECK(dup2(0, top) == top);
    CHECK(close_range((unsigned)top, (unsigned)top, 0) == 0);
    close(top);

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
    /* A forked child's closefrom(3) closes everything from 3 on, the
     * parent's descriptors the library holds too (they are the child's
     * copies); the parent's pair still works after. */
    int c4, s4;
    pair(&c4, &s4);
    pid_t k = fork();
    CHECK(k >= 0);
    if (k == 0) {
        closefrom(3);
        _exit(open_count() == 3 ? 0 : 1);
    }
    int st;
    CHECK(waitpid(k, &st, 0) == k && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(write(s4, "four", 4) == 4);
    CHECK(read(c4, b, sizeof b) == 4 && memcmp(b, "four", 4) == 0);
    close(c4);
    close(s4);
    printf("closerange: ok\n");
    return 0;
}
