/* splice(2) and sendfile(2) with a DDP-mode socket on either side (issue
 * 12; interpose/transfer.rs): the program's number of a DDP socket names
 * a doorbell end, so the kernel's own splice read the doorbell's wake-up
 * bytes as the stream and wrote the program's bytes into the doorbell.
 * Checked, each as Linux's TCP answers (run with "plain", without the
 * preload, the program passes against the kernel: it is the
 * specification):
 *   - socket -> pipe and pipe -> socket carry a 300,000-byte pattern
 *     exactly, in pieces of every size the calls return;
 *   - socket -> pipe with the pipe full and SPLICE_F_NONBLOCK fails with
 *     EAGAIN and takes nothing from the socket;
 *   - a non-blocking socket with nothing to read: EAGAIN; the peer's
 *     shutdown: 0 (end of stream);
 *   - pipe -> non-blocking socket whose peer does not read: the calls
 *     take some, then fail with EAGAIN, and what they did not take stays
 *     in the pipe: the peer reads every byte once, in order;
 *   - pipe -> socket with the pipe empty and SPLICE_F_NONBLOCK: EAGAIN;
 *     with its writer closed: 0;
 *   - neither end a pipe, a file at the other end, an offset on the
 *     socket's side: EINVAL;
 *   - sendfile from a socket, to a file or to another socket, fails
 *     with EINVAL (Linux reads only files there) and takes nothing; into
 *     a pipe it moves the bytes as splice does; from a file to the
 *     socket it carries the file's bytes;
 *   - splice into a pipe whose reader left: EPIPE at once, before the
 *     socket has anything to read.
 * Cases: from_socket, to_socket (two pairs each, one per check),
 * refused (one), sendfile (two). Prints "spliceddp CASE: ok". Run
 * preloaded (every pair switched), or with "plain" after the case
 * without the preload. */
#include "ddppair.h"

#include <sys/sendfile.h>
#include <sys/stat.h>

#define TOTAL 300000

static int ddp;

static unsigned char pat(size_t i) {
    return (unsigned char)((i * 131u + (i >> 9)) & 0xff);
}

/* A connected pair, its receive buffers rcvbuf (0: the kernel's),
 * switched into DDP mode with "ddp". */
static void pair_small(int *c, int *s, int rcvbuf) {
    tcp_pair_small(c, s, rcvbuf);
    if (ddp) ddp_switch(c, s);
}

static void pair(int *c, int *s) {
    pair_small(c, s, 0);
}

/* Writes len pattern bytes (TOTAL if 0) to an fd, in a thread. */
struct writer {
    int fd;
    size_t len;
    pthread_t t;
};

static void *write_pattern(void *arg) {
    struct writer *w = arg;
    static unsigned char b[65536];
    size_t len = w->len ? w->len : TOTAL;
    for (size_t at = 0; at < len; at += sizeof b) {
        size_t n = len - at < sizeof b ? len - at : sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = pat(at + i);
        write_every(w->fd, b, n);
    }
    return NULL;
}

/* Reads until want bytes came, each checked against the pattern from
 * *got on. */
static void read_pattern(int fd, size_t *got, size_t want) {
    static unsigned char b[65536];
    while (*got < want) {
        size_t ask = want - *got < sizeof b ? want - *got : sizeof b;
        ssize_t r = read(fd, b, ask);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++) CHECK(b[i] == pat(*got + (size_t)i));
        *got += (size_t)r;
    }
}

/* socket -> pipe: the pattern, whole, through pipes of odd sizes. */
static void socket_to_pipe(void) {
    int c, s, p[2];
    pair(&c, &s);
    CHECK(pipe(p) == 0);
    struct writer w = {s, 0, 0};
    CHECK(pthread_create(&w.t, NULL, write_pattern, &w) == 0);
    size_t moved = 0, read_back = 0;
    size_t sizes[] = {1, 7, 4096, 65536, 100000, 3};
    for (int k = 0; moved < TOTAL; k++) {
        size_t ask = sizes[k % 6];
        ssize_t n = splice(c, NULL, p[1], NULL, ask, 0);
        CHECK(n > 0 && (size_t)n <= ask);
        moved += (size_t)n;
        read_pattern(p[0], &read_back, moved);
    }
    CHECK(pthread_join(w.t, NULL) == 0);
    /* The peer's end of stream: 0. */
    CHECK(shutdown(s, SHUT_WR) == 0);
    CHECK(splice(c, NULL, p[1], NULL, 4096, 0) == 0);
    close(c);
    close(s);
    close(p[0]);
    close(p[1]);
}

/* A pipe full, SPLICE_F_NONBLOCK: EAGAIN, nothing taken from the socket;
 * the socket non-blocking and empty: EAGAIN. */
static void full_pipe_and_empty_socket(void) {
    int c, s, p[2];
    pair(&c, &s);
    CHECK(pipe2(p, O_NONBLOCK) == 0);
    static unsigned char fill[1 << 20];
    size_t filled = 0;
    for (;;) {
        ssize_t k = write(p[1], fill, sizeof fill);
        if (k < 0) {
            CHECK(errno == EAGAIN);
            break;
        }
        filled += (size_t)k;
    }
    CHECK(fcntl(p[1], F_SETFL, 0) == 0); /* the pipe blocking again */
    CHECK(write(s, "abcdef", 6) == 6);
    struct pollfd pf = {c, POLLIN, 0};
    CHECK(poll(&pf, 1, 10000) == 1);
    errno = 0;
    CHECK(splice(c, NULL, p[1], NULL, 6, SPLICE_F_NONBLOCK) == -1 && errno == EAGAIN);
    /* Nothing was taken: the pipe drained, the six bytes come. */
    static unsigned char drain[1 << 20];
    size_t drained = 0;
    while (drained < filled) {
        ssize_t k = read(p[0], drain, sizeof drain);
        CHECK(k > 0);
        drained += (size_t)k;
    }
    CHECK(splice(c, NULL, p[1], NULL, 6, 0) == 6);
    char b[8];
    CHECK(read(p[0], b, sizeof b) == 6 && memcmp(b, "abcdef", 6) == 0);
    CHECK(fcntl(c, F_SETFL, O_NONBLOCK) == 0);
    errno = 0;
    CHECK(splice(c, NULL, p[1], NULL, 6, 0) == -1 && errno == EAGAIN);
    /* The pipe's reader gone: EPIPE, before any wait for the socket's
     * bytes (blocking again, with nothing to read). */
    CHECK(fcntl(c, F_SETFL, 0) == 0);
    close(p[0]);
    p[0] = -1;
    errno = 0;
    CHECK(splice(c, NULL, p[1], NULL, 6, 0) == -1 && errno == EPIPE);
    close(c);
    close(s);
    close(p[1]);
}

/* pipe -> socket: the pattern, whole. */
static void pipe_to_socket(void) {
    int c, s, p[2];
    pair(&c, &s);
    CHECK(pipe(p) == 0);
    struct writer w = {p[1], 0, 0};
    CHECK(pthread_create(&w.t, NULL, write_pattern, &w) == 0);
    size_t moved = 0, read_back = 0;
    size_t sizes[] = {5, 65536, 1, 30000};
    for (int k = 0; moved < TOTAL; k++) {
        ssize_t n = splice(p[0], NULL, s, NULL, sizes[k % 4], 0);
        CHECK(n > 0 && (size_t)n <= sizes[k % 4]);
        moved += (size_t)n;
        read_pattern(c, &read_back, moved);
    }
    CHECK(pthread_join(w.t, NULL) == 0);
    /* The pipe empty: EAGAIN with SPLICE_F_NONBLOCK; its writer gone: 0. */
    errno = 0;
    CHECK(splice(p[0], NULL, s, NULL, 100, SPLICE_F_NONBLOCK) == -1 && errno == EAGAIN);
    close(p[1]);
    CHECK(splice(p[0], NULL, s, NULL, 100, 0) == 0);
    close(p[0]);
    close(c);
    close(s);
}

/* pipe -> a non-blocking socket nobody reads: some taken, then EAGAIN,
 * the rest left in the pipe; then every byte reaches the peer once. */
static void pipe_to_full_socket(void) {
    int c, s, p[2];
    pair_small(&c, &s, 65536);
    set_sol_int(s, SO_SNDBUF, 65536);
    CHECK(pipe(p) == 0);
    int big = 1 << 20;
    CHECK(fcntl(p[1], F_SETPIPE_SZ, big) >= big);
    const size_t total = 16u << 20;
    struct writer w = {p[1], total, 0};
    CHECK(pthread_create(&w.t, NULL, write_pattern, &w) == 0);
    CHECK(fcntl(s, F_SETFL, O_NONBLOCK) == 0);
    size_t moved = 0;
    int again = 0;
    /* Bounded: the socket's buffers take far less than 10,000 calls. */
    for (int k = 0; k < 10000 && moved < total; k++) {
        ssize_t n = splice(p[0], NULL, s, NULL, 65536, 0);
        if (n < 0) {
            CHECK(errno == EAGAIN);
            again = 1;
            break;
        }
        CHECK(n > 0);
        moved += (size_t)n;
    }
    CHECK(again && moved < total);
    /* The rest, with the peer reading. */
    CHECK(fcntl(s, F_SETFL, 0) == 0);
    size_t read_back = 0;
    read_pattern(c, &read_back, moved);
    while (moved < total) {
        ssize_t n = splice(p[0], NULL, s, NULL, 65536, 0);
        CHECK(n > 0);
        moved += (size_t)n;
        read_pattern(c, &read_back, moved);
    }
    CHECK(pthread_join(w.t, NULL) == 0);
    close(p[0]);
    close(p[1]);
    close(c);
    close(s);
}

/* What the kernel refuses. */
static void refused(void) {
    int c, s, p[2];
    pair(&c, &s);
    CHECK(pipe(p) == 0);
    errno = 0;
    CHECK(splice(c, NULL, s, NULL, 10, 0) == -1 && errno == EINVAL);
    loff_t off = 0;
    errno = 0;
    CHECK(splice(c, &off, p[1], NULL, 10, 0) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(splice(p[0], NULL, s, &off, 10, 0) == -1 && errno == EINVAL);
    char name[] = "/tmp/spliceddp.XXXXXX";
    int f = mkstemp(name);
    CHECK(f >= 0);
    unlink(name);
    errno = 0;
    CHECK(splice(c, NULL, f, NULL, 10, 0) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(splice(f, NULL, s, NULL, 10, 0) == -1 && errno == EINVAL);
    close(f);
    close(p[0]);
    close(p[1]);
    close(c);
    close(s);
}

/* sendfile from a socket, to a file or to another socket: Linux reads
 * only files there (EINVAL; ESPIPE with an offset). Before, the library
 * made the call (to a DDP socket) or the kernel did (from one) over the
 * doorbell's end: its wake-up bytes went out as the stream. */
static void sendfile_from_socket(void) {
    int c, s, c2, s2;
    pair(&c, &s);
    pair(&c2, &s2);
    char name[] = "/tmp/spliceddp.XXXXXX";
    int f = mkstemp(name);
    CHECK(f >= 0);
    unlink(name);
    CHECK(write(s, "xyz", 3) == 3);
    struct pollfd pf = {c, POLLIN, 0};
    CHECK(poll(&pf, 1, 10000) == 1);
    off_t off = 0;
    errno = 0;
    CHECK(sendfile(f, c, NULL, 3) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(sendfile(s2, c, NULL, 3) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(sendfile(f, c, &off, 3) == -1 && errno == ESPIPE);
    /* Nothing taken: the three bytes are c's to read. */
    char b[4];
    CHECK(read(c, b, sizeof b) == 3 && memcmp(b, "xyz", 3) == 0);
    /* Into a pipe: moved as splice moves them (Linux splices into a
     * pipe output; a kernel that does not answers EINVAL, taking none). */
    int pp[2];
    CHECK(pipe(pp) == 0);
    CHECK(write(s, "pqr", 3) == 3);
    CHECK(poll(&pf, 1, 10000) == 1);
    errno = 0;
    ssize_t moved = sendfile(pp[1], c, NULL, 3);
    if (moved == -1 && !ddp) {
        CHECK(errno == EINVAL);
        CHECK(read(c, b, sizeof b) == 3 && memcmp(b, "pqr", 3) == 0);
    } else {
        CHECK(moved == 3);
        CHECK(read(pp[0], b, sizeof b) == 3 && memcmp(b, "pqr", 3) == 0);
    }
    close(pp[0]);
    close(pp[1]);
    /* A file to a socket still goes (the library's send path). */
    CHECK(write(f, "hello", 5) == 5);
    CHECK(sendfile(s2, f, &off, 5) == 5 && off == 5);
    CHECK(read(c2, b, sizeof b) == 4 && memcmp(b, "hell", 4) == 0);
    close(f);
    close(c);
    close(s);
    close(c2);
    close(s2);
}

int main(int argc, char **argv) {
    CHECK(argc == 2 || (argc == 3 && strcmp(argv[2], "plain") == 0));
    ddp = argc == 2;
    signal(SIGPIPE, SIG_IGN);
    const char *c = argv[1];
    if (strcmp(c, "from_socket") == 0) {
        socket_to_pipe();
        full_pipe_and_empty_socket();
    } else if (strcmp(c, "to_socket") == 0) {
        pipe_to_socket();
        pipe_to_full_socket();
    } else if (strcmp(c, "refused") == 0) {
        refused();
    } else if (strcmp(c, "sendfile") == 0) {
        sendfile_from_socket();
    } else {
        CHECK(!"no such case");
    }
    printf("spliceddp %s: ok\n", c);
    return 0;
}
