/* Many DDP-mode closes whose peers never close (a silent peer: it never
 * reads nor closes, so each close lingers for a FIN that never comes),
 * then one more whose peer reads: the library finishes every close in one
 * thread of its own (its reaper), not one per close.
 *
 *   ddpreaper N HELD [keep]
 *     N silent connections, then one the peer reads; HELD: the closes the
 *     library may hold (WARPSOCK_DDP_CLOSING_MAX, which the test sets;
 *     the linger, WARPSOCK_LINGER_MS, outlasts the run); keep: the
 *     program holds a copy of every engine socket (the process's TCP
 *     sockets after the switches but its own descriptors), so a close
 *     the library drops leaves its socket open
 *
 * The writer closes the N silent ones, then writes LEN bytes into the
 * last one (most wait in its send buffer: the peer's window is smaller)
 * and closes it. Its peer reads every byte and the end of stream, then
 * closes, and tells the writer, which then checks:
 *   - its thread count grew by at most 2 with the N closes and after (a
 *     thread per close: N more);
 *   - the engine sockets it still holds for the silent closes (sockets in
 *     /proc/self/fd: the program closed every descriptor) are
 *     min(N, HELD), give or take the last close's, more than the sockets
 *     it had before its first connection (a socket inherited from the
 *     runner is none of them; review r25-a item 13b): the silent ones
 *     linger still while the last one's close completed, and never more
 *     than HELD are held;
 *   - the reaper's epoll set (the library's set with an entry whose data
 *     is "wsreaper", xsock/reaper.rs WAKE_TOKEN) watches those sockets, give
 *     or take one (review r25-a item 14: it polled all of them at every
 *     wake before; a close is added to the set as it begins) — and
 *     with keep, the cut closes are not (a close leaves the set as it
 *     drops: an entry stays while another descriptor names its socket).
 * exit 0 if so.
 *
 *   ddpreaper fork
 *     a process whose reaper runs (it closed a DDP socket) forks a child
 *     that writes LEN bytes on a connection of its own and closes it: the
 *     child's close completes (its peer reads every byte and the end of
 *     stream) — the parent's reaper thread is not the child's, which
 *     starts its own; and the child holds none of the parent's reaper's
 *     descriptors (its epoll set, its eventfd: one fewer of each than the
 *     parent just before the fork).
 *
 *   ddpreaper forkexit
 *     the same, the child's bytes held in its engine (small kernel
 *     buffers, no send buffer: WARPSOCK_DDP_SNDBUF=0, which the test
 *     sets), and the peer reads only once the child closed: the child's
 *     exit waits while its close still sends (the closes under way are
 *     counted), so the peer reads every byte and the end of stream. */
#include "ddppair.h"

#include <dirent.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define LEN (256 << 10)

/* Entries of directory path (not . or ..); sockets only: their links
 * read "socket:[...]". */
static int count(const char *path, int sockets) {
    DIR *d = opendir(path);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (sockets) {
            char p[512], l[64];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            ssize_t k = readlink(p, l, sizeof l - 1);
            if (k < 0) continue;
            l[k] = 0;
            if (strncmp(l, "socket:", 7) != 0) continue;
        }
        n++;
    }
    closedir(d);
    return n;
}

/* The entries of the reaper's epoll set but its eventfd's: -1 if no set
 * of the process has an entry with data "wsreaper" (big-endian). */
static int reaper_watches(void) {
    DIR *d = opendir("/proc/self/fdinfo");
    CHECK(d != NULL);
    int found = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char p[512], line[256];
        snprintf(p, sizeof p, "/proc/self/fdinfo/%s", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        int n = 0, wake = 0;
        while (fgets(line, sizeof line, f)) {
            int tfd;
            unsigned ev;
            unsigned long long data;
            if (sscanf(line, "tfd: %d events: %x data: %llx", &tfd, &ev, &data) != 3) continue;
            if (data == 0x7773726561706572ULL)
                wake = 1;
            else
                n++;
        }
        fclose(f);
        if (wake) {
            CHECK(found < 0); /* one reaper */
            found = n;
        }
    }
    closedir(d);
    return found;
}

/* keep: a copy (close-on-exec) of every TCP socket of the process but
 * the program's n descriptors c: the engines' sockets. Returns the count. */
static int keep_engine_sockets(const int *c, int n) {
    int fds[8192], k = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name), mine = fd == dirfd(d);
        for (int i = 0; i < n && !mine; i++) mine = fd == c[i];
        int dom = 0, type = 0;
        socklen_t l = sizeof dom;
        if (mine || getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) != 0 || dom != AF_INET) continue;
        l = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM) continue;
        CHECK(k < (int)(sizeof fds / sizeof fds[0]));
        fds[k++] = fd;
    }
    closedir(d);
    for (int i = 0; i < k; i++) CHECK(fcntl(fds[i], F_DUPFD_CLOEXEC, 0) >= 0);
    CHECK(k >= n); /* one at least per connection */
    return k;
}

/* Descriptors of the process whose link reads name exactly
 * ("anon_inode:[eventfd]", "anon_inode:[eventpoll]"). */
static int count_links(const char *name) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char p[512], l[64];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(p, l, sizeof l - 1);
        if (k < 0) continue;
        l[k] = 0;
        n += strcmp(l, name) == 0;
    }
    closedir(d);
    return n;
}

static unsigned char at(size_t i) {
    return (unsigned char)((i * 131 + (i >> 9)) & 0xff);
}

/* Reads fd to its end: LEN bytes of the pattern, then 0. */
static void read_all(int fd, size_t len) {
    static unsigned char buf[65536];
    size_t got = 0;
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        CHECK(k >= 0);
        if (k == 0) break;
        for (ssize_t j = 0; j < k; j++) CHECK(buf[j] == at(got + (size_t)j));
        got += (size_t)k;
    }
    CHECK(got == len);
}

/* Writes len (at most LEN) bytes of the pattern to fd. */
static void write_all(int fd, size_t len) {
    static unsigned char b[LEN];
    for (size_t i = 0; i < len; i++) b[i] = at(i);
    write_every(fd, b, len);
}

/* exit_wait: the forkexit case (small buffers; the peer reads once the
 * child closed, told through a pipe). */
static int forked(int exit_wait) {
    int c0, s0, c1, s1;
    /* forkexit: 64 KiB in the window (4 slots of 16 KiB), most of it held
     * by the child's engine behind the small kernel buffers. */
    size_t len = exit_wait ? 48 << 10 : LEN;
    tcp_pair(&c0, &s0);
    tcp_pair_small(&c1, &s1, exit_wait ? 4096 : 0);
    if (exit_wait) set_sol_int(c1, SO_SNDBUF, 4096);
    int closed[2];
    CHECK(pipe(closed) == 0);
    pid_t a = fork();
    CHECK(a >= 0);
    if (a == 0) {
        /* The peer of both. */
        close(c0);
        close(c1);
        close(closed[1]);
        ddp_mode(s0);
        ddp_mode(s1);
        read_all(s0, 0);
        char x;
        if (exit_wait) CHECK(read(closed[0], &x, 1) == 1);
        read_all(s1, len);
        exit(0);
    }
    close(s0);
    close(s1);
    ddp_mode(c0);
    /* The parent's reaper starts (its epoll set is there). */
    CHECK(close(c0) == 0);
    CHECK(reaper_watches() >= 0);
    int efds = count_links("anon_inode:[eventfd]"), eps = count_links("anon_inode:[eventpoll]");
    pid_t b = fork();
    CHECK(b >= 0);
    if (b == 0) {
        /* The parent's reaper's eventfd and epoll set are not the child's:
         * closed in its fork handler, not carried (review r26-b item 6). */
        CHECK(reaper_watches() < 0);
        CHECK(count_links("anon_inode:[eventfd]") == efds - 1);
        CHECK(count_links("anon_inode:[eventpoll]") == eps - 1);
        close(closed[0]);
        ddp_mode(c1);
        write_all(c1, len);
        CHECK(close(c1) == 0);
        CHECK(write(closed[1], "c", 1) == 1);
        exit(0);
    }
    close(c1);
    close(closed[0]);
    close(closed[1]);
    int st;
    CHECK(waitpid(b, &st, 0) == b && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(waitpid(a, &st, 0) == a && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("ddpreaper %s: the child's close completed\n", exit_wait ? "forkexit" : "fork");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "fork") == 0) return forked(0);
    if (argc == 2 && strcmp(argv[1], "forkexit") == 0) return forked(1);
    CHECK(argc == 3 || (argc == 4 && strcmp(argv[3], "keep") == 0));
    int n = atoi(argv[1]), held = atoi(argv[2]), keep = argc == 4;
    CHECK(n > 0 && held > 0);
    /* Each connection is some descriptors at each end (8 seen, 10 with
     * keep; the test's N fits the hard limit, tests/ddp_reaper.rs conns). */
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = rl.rlim_max;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    rlim_t need = (rlim_t)(n + 1) * 12 + 64;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        fprintf(stderr, "ddpreaper: %d connections need about %lu descriptors, RLIMIT_NOFILE's hard limit is %lu\n",
                n, (unsigned long)need, (unsigned long)rl.rlim_max);
        return 1;
    }
    /* Sockets that are none of the test's (inherited, the library's). */
    int socks0 = count("/proc/self/fd", 1);
    int *c = calloc((size_t)n + 1, sizeof *c), *s = calloc((size_t)n + 1, sizeof *s);
    CHECK(c && s);
    for (int i = 0; i <= n; i++) tcp_pair(&c[i], &s[i]);
    int told[2], done[2];
    CHECK(pipe(told) == 0 && pipe(done) == 0);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        /* The peers: silent but the last, which reads all, then closes. */
        close(told[0]);
        close(done[1]);
        for (int i = 0; i <= n; i++) close(c[i]);
        for (int i = 0; i <= n; i++) ddp_mode(s[i]);
        read_all(s[n], LEN);
        CHECK(close(s[n]) == 0);
        CHECK(write(told[1], "r", 1) == 1);
        /* Until the writer checked (its end closes as it exits). */
        char x;
        CHECK(read(done[0], &x, 1) == 0);
        exit(0);
    }
    close(told[1]);
    close(done[0]);
    for (int i = 0; i <= n; i++) close(s[i]);
    for (int i = 0; i <= n; i++) ddp_mode(c[i]);
    int kept = keep ? keep_engine_sockets(c, n + 1) : 0;
    int threads0 = count("/proc/self/task", 0);
    for (int i = 0; i < n; i++) CHECK(close(c[i]) == 0);
    int threads1 = count("/proc/self/task", 0);
    write_all(c[n], LEN);
    CHECK(close(c[n]) == 0);
    /* The peer read every byte and the end of stream (bounded: the
     * silent closes' linger is longer). */
    struct pollfd pf = {.fd = told[0], .events = POLLIN};
    CHECK(poll(&pf, 1, 30000) == 1);
    char r;
    CHECK(read(told[0], &r, 1) == 1 && r == 'r');
    int threads2 = count("/proc/self/task", 0);
    /* The library's two dead ends (made at the first switch, kept for
     * the process: xsock/sock.rs `dead_end`) are none of the closes'. */
    int socks = count("/proc/self/fd", 1) - socks0 - kept - 2;
    int watched = reaper_watches();
    int want = n < held ? n : held;
    printf("ddpreaper %d %d%s: threads %d -> %d -> %d, sockets held %d (%d before, %d kept), "
           "the reaper watches %d\n",
           n, held, keep ? " keep" : "", threads0, threads1, threads2, socks, socks0, kept,
           watched);
    fflush(stdout);
    CHECK(threads1 <= threads0 + 2);
    CHECK(threads2 <= threads0 + 2);
    /* The silent closes linger (the last one's may be held still). */
    CHECK(socks >= want - 1 && socks <= want + 1);
    /* Each held close is in the reaper's epoll set. */
    CHECK(watched >= socks - 1 && watched <= socks + 1);
    close(done[1]);
    int st;
    CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return 0;
}
