/* A writer that exits without closing its connection while its reader is
 * still to read the last of the stream: over TCP the kernel sends every
 * byte and a FIN after the process, and the reader reads them all, then
 * 0. In DDP mode the preload's exit closes the socket as close() would
 * (every byte, the end of stream, then the linger for the reader's FIN);
 * before, the process ended with its engine's socket, whose kernel still
 * held the tail (the reader's receive window was full): the reader's
 * credit returns met a closed socket, whose reset dropped the tail —
 * ECONNRESET before the end (issue 12).
 *
 *   ddpexitopen live|silent|close [plain]
 *     The writer writes LEN bytes and exits (no close); its reader reads
 *     all but the last TAIL bytes as they come, then waits: the tail sits
 *     in the kernels (the reader's receive buffer is small, and its
 *     engine reads only in its calls). Once the writer is in its exit
 *     (its own exit handler says so) and its connection left ESTABLISHED
 *     (its FIN is queued: the exit's close, or the process's end), the
 *     reader reads the tail and must get every byte, then 0.
 *     live: the reader exits then (its own exit closes its end: the
 *           writer's exit sees its FIN and ends).
 *     silent: the reader holds its end open until the writer is gone
 *           (a pipe the writer holds reads 0): the writer's exit waits
 *           for a FIN that never comes, WARPSOCK_LINGER_MS at most.
 *     close: as live, the writer closes its end before it exits: the
 *           exit waits for the library's close (its linger for the FIN
 *           included), which ends with the process.
 *     plain: no switch, both ends TCP (the comparison).
 *
 *   ddpexitopen thread [plain]
 *     The writer's second thread writes without end; its main thread
 *     exits once the reader read 1 MiB. The exit's close shuts the
 *     socket's write side under the writing thread, whose send fails:
 *     it must not die of SIGPIPE (over TCP its sends go on until the
 *     process ends): the writer exits with status 0, and the reader
 *     reads the pattern to a clean end (0).
 *
 *   ddpexitopen unread [plain]
 *     The reader sends 8 B; the writer exits once poll says they came,
 *     without reading them: its exit's close resets the connection, as
 *     TCP's close with data unread (RFC 2525 2.17): the reader's read
 *     fails with ECONNRESET.
 *
 *   ddpexitopen abort [plain]
 *     The writer sets SO_LINGER {1, 0}, sends 8 B and exits once the
 *     reader says it read them: its exit's close is abortive, as TCP's:
 *     the reader's next read fails with ECONNRESET.
 * exit 0 if the reader got every byte and then 0. */
#include "ddppair.h"

#include <sys/wait.h>

#define LEN (4 << 20)
#define TAIL (64 << 10)

static int plain;
static int bye_fd = -1;

static unsigned char at(size_t i) {
    return (unsigned char)((i * 131 + (i >> 12)) & 0xff);
}

/* Reads fd until *got reaches want (0: to its end); 4 KiB reads. Returns
 * 0, or the errno of a failed read. */
static int read_to(int fd, size_t *got, size_t want) {
    static unsigned char buf[4096];
    while (want == 0 || *got < want) {
        size_t n = sizeof buf;
        if (want && want - *got < n) n = want - *got;
        ssize_t k = read(fd, buf, n);
        if (k < 0) return errno;
        if (k == 0) {
            CHECK(want == 0);
            return 0;
        }
        for (ssize_t j = 0; j < k; j++) CHECK(buf[j] == at(*got + (size_t)j));
        *got += (size_t)k;
    }
    return 0;
}

/* The writer's own exit handler: it runs before the library's (registered
 * later), so the writer is in its exit, the connection still open. */
static void in_exit(void) {
    CHECK(write(bye_fd, "b", 1) == 1);
}

static void writer(int c, int bye, int gone, int closing) {
    (void)gone; /* held open to the process's end */
    int big = 1 << 20;
    CHECK(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof big) == 0);
    if (!plain) ddp_mode(c);
    static unsigned char b[LEN];
    for (size_t i = 0; i < LEN; i++) b[i] = at(i);
    write_every(c, b, LEN);
    if (closing) CHECK(close(c) == 0);
    bye_fd = bye;
    CHECK(atexit(in_exit) == 0);
    exit(0);
}

static int reader(int s, int go, int gone, int silent, const char *mode) {
    if (!plain) ddp_mode(s);
    size_t got = 0;
    CHECK(read_to(s, &got, LEN - TAIL) == 0);
    char g;
    CHECK(read(go, &g, 1) == 1);
    int e = read_to(s, &got, 0);
    if (e != 0 || got != LEN) {
        fprintf(stderr, "ddpexitopen %s: %zu of %d bytes, then %s\n", mode, got, LEN,
                e ? strerror(e) : "0");
        return 1;
    }
    printf("ddpexitopen %s: every byte, then 0\n", mode);
    fflush(stdout);
    /* silent: the end stays open until the writer is gone. */
    if (silent) CHECK(read(gone, &g, 1) == 0);
    return 0;
}

static int wfd;

static void *write_forever(void *a) {
    (void)a;
    static unsigned char b[65536];
    for (size_t off = 0;; off += sizeof b) {
        for (size_t i = 0; i < sizeof b; i++) b[i] = at(off + i);
        write_every(wfd, b, sizeof b);
    }
    return NULL;
}

/* Forks the reader of the thread and abort modes, on the accepted end s:
 * it switches s (unless plain), reads the first `first` bytes of the
 * pattern and says so on told[1] (a pipe made here, told[0] for the
 * writer). Returns as fork does: 0 in the reader, its count read in *got;
 * the reader's pid in the parent, which closes s and told[1]. */
static pid_t fork_reader(int c, int s, int told[2], size_t first, size_t *got) {
    CHECK(pipe(told) == 0);
    pid_t r = fork();
    CHECK(r >= 0);
    if (r == 0) {
        close(c);
        close(told[0]);
        if (!plain) ddp_mode(s);
        *got = 0;
        CHECK(read_to(s, got, first) == 0);
        CHECK(write(told[1], "r", 1) == 1);
        return 0;
    }
    close(s);
    close(told[1]);
    return r;
}

/* Waits for the writer w, which must exit with status 0, and the reader
 * r: the reader's exit status. */
static int reap(pid_t w, pid_t r) {
    int ws, rs;
    CHECK(waitpid(w, &ws, 0) == w && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(waitpid(r, &rs, 0) == r && WIFEXITED(rs));
    return WEXITSTATUS(rs);
}

/* The reader's last read of the unread and abort modes, on s: exits 0 if
 * it fails with ECONNRESET (a reset), else 1. */
static void exit_reset(int s, const char *mode) {
    char b[8];
    ssize_t k = read(s, b, sizeof b);
    printf("ddpexitopen %s%s: the read %zd errno %d\n", mode, plain ? " plain" : "", k,
           k < 0 ? errno : 0);
    exit(k == -1 && errno == ECONNRESET ? 0 : 1);
}

/* The thread mode (see the top). */
static int threaded(int c, int s) {
    int told[2];
    size_t got;
    pid_t r = fork_reader(c, s, told, 1 << 20, &got);
    if (r == 0) {
        int e = read_to(s, &got, 0);
        if (e != 0) {
            fprintf(stderr, "ddpexitopen thread: %zu bytes, then %s\n", got, strerror(e));
            exit(1);
        }
        printf("ddpexitopen thread%s: %zu bytes, then 0\n", plain ? " plain" : "", got);
        exit(0);
    }
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        if (!plain) ddp_mode(c);
        wfd = c;
        pthread_t t;
        CHECK(pthread_create(&t, NULL, write_forever, NULL) == 0);
        char x;
        CHECK(read(told[0], &x, 1) == 1);
        exit(0);
    }
    close(c);
    close(told[0]);
    int ws, rs;
    CHECK(waitpid(w, &ws, 0) == w);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        fprintf(stderr, "ddpexitopen thread: the writer ended with status %#x (signal %d)\n", ws,
                WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
        return 1;
    }
    CHECK(waitpid(r, &rs, 0) == r && WIFEXITED(rs));
    return WEXITSTATUS(rs);
}

/* The unread mode (see the top). */
static int unread(int c, int s) {
    pid_t r = fork();
    CHECK(r >= 0);
    if (r == 0) {
        close(c);
        if (!plain) ddp_mode(s);
        CHECK(write(s, "unread!!", 8) == 8);
        exit_reset(s, "unread");
    }
    close(s);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        if (!plain) ddp_mode(c);
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, -1) == 1 && (p.revents & POLLIN));
        exit(0);
    }
    close(c);
    return reap(w, r);
}

/* The abort mode (see the top). */
static int abortive(int c, int s) {
    int told[2];
    size_t got;
    pid_t r = fork_reader(c, s, told, 8, &got);
    if (r == 0) exit_reset(s, "abort");
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        struct linger l = {1, 0};
        if (!plain) ddp_mode(c);
        CHECK(setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
        unsigned char b[8];
        for (int i = 0; i < 8; i++) b[i] = at((size_t)i);
        CHECK(write(c, b, 8) == 8);
        char x;
        CHECK(read(told[0], &x, 1) == 1);
        exit(0);
    }
    close(c);
    close(told[0]);
    return reap(w, r);
}

/* /proc/net/tcp's state (hex, as there) of the IPv4 connection from local
 * port lport to remote port rport, or -1 if there is none. */
static int tcp_state(int lport, int rport) {
    FILE *f = fopen("/proc/net/tcp", "r");
    CHECK(f != NULL);
    char line[512];
    int st = -1;
    CHECK(fgets(line, sizeof line, f) != NULL);
    while (fgets(line, sizeof line, f)) {
        unsigned la, lp, ra, rp, s;
        if (sscanf(line, " %*d: %x:%x %x:%x %x", &la, &lp, &ra, &rp, &s) != 5) continue;
        if ((int)lp == lport && (int)rp == rport) st = (int)s;
    }
    fclose(f);
    return st;
}

static int port_of(int fd, int peer) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    CHECK((peer ? getpeername(fd, (struct sockaddr *)&a, &len)
                : getsockname(fd, (struct sockaddr *)&a, &len)) == 0);
    return ntohs(a.sin_port);
}

int main(int argc, char **argv) {
    CHECK(argc == 2 || (argc == 3 && strcmp(argv[2], "plain") == 0));
    plain = argc == 3;
    if (strcmp(argv[1], "thread") == 0 || strcmp(argv[1], "unread") == 0 ||
        strcmp(argv[1], "abort") == 0) {
        int c, s;
        tcp_pair(&c, &s);
        if (argv[1][0] == 't') return threaded(c, s);
        return argv[1][0] == 'u' ? unread(c, s) : abortive(c, s);
    }
    int silent = strcmp(argv[1], "silent") == 0;
    int closing = strcmp(argv[1], "close") == 0;
    CHECK(silent || closing || strcmp(argv[1], "live") == 0);
    char mode[32];
    snprintf(mode, sizeof mode, "%s%s", argv[1], plain ? " plain" : "");
    int c, s, go[2], bye[2], gone[2];
    CHECK(pipe(go) == 0 && pipe(bye) == 0 && pipe(gone) == 0);
    /* The reader's receive buffer small: the tail waits in the writer's
     * kernel (set on both ends: the writer only receives credits). */
    tcp_pair_small(&c, &s, 4096);
    int lport = port_of(c, 0), rport = port_of(c, 1);
    pid_t r = fork();
    CHECK(r >= 0);
    if (r == 0) {
        close(c);
        close(go[1]);
        close(bye[0]);
        close(bye[1]);
        close(gone[1]);
        exit(reader(s, go[0], gone[0], silent, mode));
    }
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(s);
        close(go[0]);
        close(go[1]);
        close(bye[0]);
        close(gone[0]);
        writer(c, bye[1], gone[1], closing);
    }
    close(c);
    close(s);
    close(go[0]);
    close(bye[1]);
    close(gone[0]);
    close(gone[1]);
    /* The writer is in its exit... */
    char b;
    CHECK(read(bye[0], &b, 1) == 1);
    /* ... and its FIN is queued: its connection left ESTABLISHED (1). A
     * look every millisecond, 30 s at most. */
    int st = 1;
    for (int i = 0; i < 30000 && (st = tcp_state(lport, rport)) == 1; i++) poll(NULL, 0, 1);
    CHECK(st != 1);
    CHECK(write(go[1], "g", 1) == 1);
    return reap(w, r);
}
