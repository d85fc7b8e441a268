/* stdio streams on DDP-mode sockets (issue 12): `fdopen` of a switched
 * socket reads, writes and closes through the library (glibc's own stdio
 * calls its internal __read/__write, which the preload does not see: the
 * bytes went to the doorbell, never to the peer). One case per run,
 * `stdio CASE [plain]` (plain: neither end switches, plain TCP, the
 * behaviour asked for). Every read is bounded (SO_RCVTIMEO 10 s): a lost
 * byte fails a check, never hangs.
 *   lines   fdopen "r+" on each end, fprintf + fflush one way, fgets the
 *           other, then back; fileno(f) == fd; fseek fails with ESPIPE;
 *   bulk    1 MiB by fwrite (one thread) read back by fread, checksummed;
 *   order   send() and fprintf + fflush mixed keep their order;
 *   close   fclose of a stream with unflushed bytes: the peer reads every
 *           byte, then the end of the stream;
 *   modes   a bad mode fails with EINVAL; an "r" stream cannot write, a
 *           "w" stream cannot read, an "a" stream writes;
 *   dprintf dprintf and vdprintf reach the peer;
 *   cancel  pthread_cancel of a thread blocked in fgets: PTHREAD_CANCELED,
 *           the stream's lock given back;
 *   policy  policy mode (WARPSOCK_DDP_PORTS, port in STDIO_PORT): streams
 *           on the connected and the accepted end, both ways, then EOF;
 *   exit    a child's stream left unflushed at exit(): the parent reads
 *           every byte, then the end of the stream;
 *   forked  a forked child's exit() with its copy of the parent's unflushed
 *           stream: the child exits 0, the parent's stream goes on;
 *   forkedflush  the same, the child's fflush of the copy first: it
 *           succeeds (plain) or fails with EPIPE, no SIGPIPE (DDP);
 *   locked  a child's stream another thread holds locked at exit(): the
 *           child exits 0; the parent reads its tail (plain) or nothing
 *           (DDP: glibc's late flush fails quietly), then the end;
 *   unswitched  a socket left out of DDP mode (the other pair of the
 *           run is switched): the real fdopen, bytes both ways;
 *   reopen  freopen(NULL) and freopen64(path) of a socket's stream with
 *           bytes buffered: the peer reads them, then the end; the NULL
 *           one fails with ENXIO (glibc's, plain: a socket's /proc/self/fd
 *           link cannot be opened), the path one succeeds (plain) or fails
 *           with EINVAL (DDP: glibc's freopen of a fopencookie stream
 *           crashes); a failed one leaves the stream closed (fileno -1,
 *           fclose EOF, errno untouched), and its fclose frees what the
 *           library kept of it (the freed FILE scribbled on, then exit
 *           0: no listed stream left on it);
 *   reopenforked  a forked child's freopen(NULL) of its copy of the
 *           parent's stream: ENXIO, the copy closed, the child exits 0;
 *           the parent's stream goes on. */
#include "ddppair.h"

#include <malloc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/wait.h>

static int plain;
static int c, s;

/* A connected pair, both ends switched unless plain, with SO_RCVTIMEO. */
static void *switch_end(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

static void pair(int *a, int *b, int do_switch) {
    tcp_pair(a, b);
    set_rcvtimeo(*a, 10000);
    set_rcvtimeo(*b, 10000);
    if (!do_switch) return;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_end, b) == 0);
    ddp_mode(*a);
    CHECK(pthread_join(t, NULL) == 0);
}

/* fgets a line from f into buf; it must be want. */
static void line_is(FILE *f, const char *want) {
    char buf[256];
    CHECK(fgets(buf, sizeof buf, f) != NULL);
    if (strcmp(buf, want) != 0) {
        fprintf(stderr, "read line [%s], want [%s]\n", buf, want);
        exit(1);
    }
}

static void case_lines(void) {
    FILE *fc = fdopen(c, "r+");
    FILE *fs = fdopen(s, "r+");
    CHECK(fc && fs);
    CHECK(fileno(fc) == c && fileno(fs) == s);
    for (int i = 0; i < 3; i++) {
        CHECK(fprintf(fc, "line %d from the client\n", i) > 0);
        CHECK(fflush(fc) == 0);
        char want[64];
        snprintf(want, sizeof want, "line %d from the client\n", i);
        line_is(fs, want);
        CHECK(fprintf(fs, "answer %d\n", i) > 0);
        CHECK(fflush(fs) == 0);
        snprintf(want, sizeof want, "answer %d\n", i);
        line_is(fc, want);
    }
    errno = 0;
    CHECK(fseek(fc, 0, SEEK_SET) == -1 && errno == ESPIPE);
    CHECK(fclose(fc) == 0);
    CHECK(fgetc(fs) == EOF && feof(fs));
    CHECK(fclose(fs) == 0);
}

#define BULK (1 << 20)

static unsigned char pattern(size_t i) {
    return (unsigned char)(i * 2654435761u >> 13);
}

static void *bulk_writer(void *arg) {
    FILE *f = arg;
    unsigned char *b = malloc(BULK);
    CHECK(b);
    for (size_t i = 0; i < BULK; i++) b[i] = pattern(i);
    CHECK(fwrite(b, 1, BULK, f) == BULK);
    CHECK(fflush(f) == 0);
    free(b);
    return NULL;
}

static void case_bulk(void) {
    FILE *fc = fdopen(c, "w");
    FILE *fs = fdopen(s, "r");
    CHECK(fc && fs);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, bulk_writer, fc) == 0);
    unsigned char *b = malloc(BULK);
    CHECK(b);
    CHECK(fread(b, 1, BULK, fs) == BULK);
    CHECK(pthread_join(t, NULL) == 0);
    unsigned long sum = 0, want = 0;
    for (size_t i = 0; i < BULK; i++) {
        sum = sum * 31 + b[i];
        want = want * 31 + pattern(i);
    }
    CHECK(sum == want);
    free(b);
    CHECK(fclose(fc) == 0);
    char x;
    CHECK(fread(&x, 1, 1, fs) == 0 && feof(fs));
    CHECK(fclose(fs) == 0);
}

static void case_order(void) {
    FILE *fc = fdopen(c, "r+");
    FILE *fs = fdopen(s, "r+");
    CHECK(fc && fs);
    for (int i = 0; i < 20; i++) {
        char m[32];
        int n = snprintf(m, sizeof m, "send %d\n", i);
        CHECK(send(c, m, (size_t)n, 0) == n);
        CHECK(fprintf(fc, "stream %d\n", i) > 0);
        CHECK(fflush(fc) == 0);
    }
    for (int i = 0; i < 20; i++) {
        char want[32];
        snprintf(want, sizeof want, "send %d\n", i);
        line_is(fs, want);
        snprintf(want, sizeof want, "stream %d\n", i);
        line_is(fs, want);
    }
    CHECK(fclose(fc) == 0);
    CHECK(fclose(fs) == 0);
}

static void case_close(void) {
    FILE *fc = fdopen(c, "w");
    CHECK(fc);
    /* 100000 bytes: several buffers' worth written on the way, a tail
     * left in the buffer for fclose. */
    enum { LINES = 10000, TOTAL = LINES * 10 };
    for (int i = 0; i < LINES; i++) CHECK(fprintf(fc, "%09d\n", i) == 10);
    CHECK(fclose(fc) == 0);
    char *got = malloc(TOTAL + 1);
    CHECK(got);
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(s, got + n, TOTAL + 1 - n, 0);
        CHECK(r >= 0);
        if (r == 0) break;
        n += (size_t)r;
        CHECK(n <= TOTAL);
    }
    CHECK(n == TOTAL);
    for (int i = 0; i < LINES; i++) {
        char want[16];
        snprintf(want, sizeof want, "%09d\n", i);
        CHECK(memcmp(got + (size_t)i * 10, want, 10) == 0);
    }
    free(got);
    close(s);
}

static void case_modes(void) {
    errno = 0;
    CHECK(fdopen(c, "q") == NULL && errno == EINVAL);
    errno = 0;
    CHECK(fdopen(c, "") == NULL && errno == EINVAL);
    FILE *r = fdopen(c, "r");
    CHECK(r && fileno(r) == c);
    CHECK(fputs("x", r) == EOF && ferror(r));
    clearerr(r);
    /* A duplicate's "w" stream: its fclose closes the duplicate only. */
    int s2 = dup(s);
    CHECK(s2 >= 0);
    FILE *w = fdopen(s2, "w");
    CHECK(w && fileno(w) == s2);
    CHECK(fgetc(w) == EOF && ferror(w));
    CHECK(fclose(w) == 0);
    FILE *a = fdopen(s, "ab");
    CHECK(a && fileno(a) == s);
    CHECK(fputs("appended\n", a) >= 0 && fflush(a) == 0);
    line_is(r, "appended\n");
    CHECK(fclose(a) == 0);
    CHECK(fgetc(r) == EOF && feof(r));
    CHECK(fclose(r) == 0);
}

static int vdp(int fd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vdprintf(fd, fmt, ap);
    va_end(ap);
    return n;
}

static void case_dprintf(void) {
    CHECK(dprintf(c, "%s %d %.1f|", "dprintf", 42, 2.5) == 15);
    CHECK(vdp(c, "%s %ld|", "vdprintf", 7L) == 11);
    char want[] = "dprintf 42 2.5|vdprintf 7|";
    char buf[64];
    size_t got = 0;
    while (got < sizeof want - 1) {
        ssize_t r = recv(s, buf + got, sizeof want - 1 - got, 0);
        CHECK(r > 0);
        got += (size_t)r;
    }
    CHECK(memcmp(buf, want, sizeof want - 1) == 0);
    close(c);
    close(s);
}

static void case_unswitched(void) {
    int pc, ps;
    pair(&pc, &ps, 0);
    FILE *fc = fdopen(pc, "r+");
    FILE *fs = fdopen(ps, "r+");
    CHECK(fc && fs);
    CHECK(fileno(fc) == pc && fileno(fs) == ps);
    CHECK(fprintf(fc, "plain %d\n", 1) > 0 && fflush(fc) == 0);
    line_is(fs, "plain 1\n");
    CHECK(fprintf(fs, "plain %d\n", 2) > 0 && fflush(fs) == 0);
    line_is(fc, "plain 2\n");
    CHECK(fclose(fc) == 0);
    CHECK(fgetc(fs) == EOF && feof(fs));
    CHECK(fclose(fs) == 0);
    /* The switched pair of the run still talks. */
    CHECK(write(c, "ok", 2) == 2);
    char b[2];
    CHECK(recv(s, b, 2, MSG_WAITALL) == 2 && memcmp(b, "ok", 2) == 0);
    close(c);
    close(s);
}

/* A child's stream left unflushed at exit(): glibc flushes it after the
 * exit handlers. The parent reads every byte, then the end. */
static void case_exit(void) {
    int pc, ps;
    tcp_pair(&pc, &ps);
    set_rcvtimeo(ps, 10000);
    enum { LINES = 1000, TOTAL = LINES * 10 };
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(ps);
        if (!plain) ddp_mode(pc);
        FILE *f = fdopen(pc, "w");
        CHECK(f);
        for (int i = 0; i < LINES; i++) CHECK(fprintf(f, "%09d\n", i) == 10);
        exit(0);
    }
    close(pc);
    if (!plain) ddp_mode(ps);
    char *got = malloc(TOTAL + 1);
    CHECK(got);
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(ps, got + n, TOTAL + 1 - n, 0);
        CHECK(r >= 0);
        if (r == 0) break;
        n += (size_t)r;
        CHECK(n <= TOTAL);
    }
    if (n != TOTAL) fprintf(stderr, "read %zu bytes of %d\n", n, TOTAL);
    CHECK(n == TOTAL);
    for (int i = 0; i < LINES; i++) {
        char want[16];
        snprintf(want, sizeof want, "%09d\n", i);
        CHECK(memcmp(got + (size_t)i * 10, want, 10) == 0);
    }
    free(got);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(ps);
}

/* A forked child's exit() with its copy of the parent's stream, a tail
 * unflushed: over TCP glibc flushes the copy into the shared socket (the
 * usual stdio duplication after fork); a DDP-mode socket's copy in the
 * child is refused by design, and the copy's flush fails quietly. The
 * child exits 0 either way, and the parent's stream goes on. flush: the
 * child flushes the copy before its exit. */
static void case_forked(int flush) {
    FILE *fc = fdopen(c, "w");
    FILE *fs = fdopen(s, "r");
    CHECK(fc && fs);
    CHECK(fputs("parent tail\n", fc) >= 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (flush) {
            errno = 0;
            int r = fflush(fc);
            if (plain) CHECK(r == 0);
            else CHECK(r == EOF && errno == EPIPE && ferror(fc));
        }
        exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "child status %#x\n", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (plain) line_is(fs, "parent tail\n"); /* the child's copy */
    CHECK(fputs("after the fork\n", fc) >= 0 && fflush(fc) == 0);
    line_is(fs, "parent tail\n");
    line_is(fs, "after the fork\n");
    CHECK(fclose(fc) == 0);
    CHECK(fgetc(fs) == EOF && feof(fs));
    CHECK(fclose(fs) == 0);
}

static FILE *held_stream;
static atomic_int held;

static void *hold_stream(void *arg) {
    (void)arg;
    flockfile(held_stream);
    atomic_store(&held, 1);
    for (;;) pause();
    return NULL;
}

/* A child's stream another thread holds locked at exit(): the library's
 * exit flush leaves it (ftrylockfile), glibc flushes it after the exit
 * handlers without its lock. Over DDP that is after the socket's exit
 * close: the write must fail quietly (EPIPE, no SIGPIPE) and the child
 * exit 0, as over TCP (where the flush succeeds); the tail is lost. */
static void case_locked(void) {
    static const char tail[] = "locked tail\n";
    enum { TAIL = sizeof tail - 1 };
    int pc, ps;
    tcp_pair(&pc, &ps);
    set_rcvtimeo(ps, 10000);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(ps);
        if (!plain) ddp_mode(pc);
        held_stream = fdopen(pc, "w");
        CHECK(held_stream);
        CHECK(fputs(tail, held_stream) >= 0);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, hold_stream, NULL) == 0);
        for (int k = 0; !atomic_load(&held); k++) {
            CHECK(k < 10000000);
            sched_yield();
        }
        exit(0);
    }
    close(pc);
    if (!plain) ddp_mode(ps);
    char got[TAIL + 1];
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(ps, got + n, sizeof got - n, 0);
        CHECK(r >= 0);
        if (r == 0) break;
        n += (size_t)r;
        CHECK(n <= TAIL);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "child status %#x, read %zu\n", st, n);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(n == (plain ? TAIL : 0));
    CHECK(memcmp(got, tail, n) == 0);
    close(ps);
}

static atomic_int fgets_tid; /* the thread blocked in fgets */

/* Its buffer in static storage: ASan does not unpoison the redzones of
 * stack frames a cancellation unwinds (as in cancel.c). */
static char fgets_buf[64];

static void *blocked_fgets(void *arg) {
    atomic_store(&fgets_tid, (int)syscall(SYS_gettid));
    /* Its result unused (a fortified build warns of an ignored one). */
    if (fgets(fgets_buf, sizeof fgets_buf, arg) == NULL) return NULL;
    return NULL;
}

/* pthread_cancel of a thread blocked in fgets on a stream: it ends with
 * PTHREAD_CANCELED, the stream's lock given back (the main thread's
 * fprintf on it goes on). */
static void case_cancel(void) {
    FILE *fs = fdopen(s, "r+");
    FILE *fc = fdopen(c, "r+");
    CHECK(fs && fc);
    set_rcvtimeo(s, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, blocked_fgets, fs) == 0);
    /* Asleep: in the library's wait, or (plain) glibc's read. */
    for (int k = 0; atomic_load(&fgets_tid) == 0 || !(thread_asleep(atomic_load(&fgets_tid)) ||
                                                       thread_syscall(atomic_load(&fgets_tid)) == SYS_read);
         k++) {
        CHECK(k < 10000000);
        sched_yield();
    }
    CHECK(pthread_cancel(t) == 0);
    void *r;
    CHECK(pthread_join(t, &r) == 0 && r == PTHREAD_CANCELED);
    CHECK(fprintf(fs, "after\n") > 0 && fflush(fs) == 0);
    line_is(fc, "after\n");
    CHECK(fclose(fc) == 0);
    CHECK(fclose(fs) == 0);
}

static int policy_port;

static void *policy_connect(void *arg) {
    int *fd = arg;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(*fd >= 0);
    struct sockaddr_in a = lo(policy_port);
    CHECK(connect(*fd, (struct sockaddr *)&a, sizeof a) == 0);
    return NULL;
}

/* Policy mode (WARPSOCK_DDP_PORTS the port in STDIO_PORT, set by the
 * test): an unmodified program's connect and accept switch, then its
 * streams on both ends talk both ways and fclose ends the stream. */
static void case_policy(void) {
    const char *p = getenv("STDIO_PORT");
    CHECK(p != NULL);
    policy_port = atoi(p);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    int one = 1;
    CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    struct sockaddr_in a = lo(policy_port);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 1) == 0);
    int pc = -1;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, policy_connect, &pc) == 0);
    int ps = accept(l, NULL, NULL);
    CHECK(ps >= 0);
    CHECK(pthread_join(t, NULL) == 0);
    close(l);
    set_rcvtimeo(pc, 10000);
    set_rcvtimeo(ps, 10000);
    FILE *fc = fdopen(pc, "r+");
    FILE *fs = fdopen(ps, "r+");
    CHECK(fc && fs);
    CHECK(fprintf(fc, "GET %s\n", "/policy") > 0 && fflush(fc) == 0);
    line_is(fs, "GET /policy\n");
    CHECK(fprintf(fs, "200 %d\n", 42) > 0 && fflush(fs) == 0);
    line_is(fc, "200 42\n");
    CHECK(fclose(fs) == 0);
    CHECK(fgetc(fc) == EOF && feof(fc));
    CHECK(fclose(fc) == 0);
}

/* Reads from fd until the end: it must be want. */
static void reads_then_end(int fd, const char *want) {
    char buf[64];
    size_t n = 0, len = strlen(want);
    for (;;) {
        ssize_t r = recv(fd, buf + n, sizeof buf - n, 0);
        CHECK(r >= 0);
        if (r == 0) break;
        n += (size_t)r;
        CHECK(n <= len);
    }
    CHECK(n == len && memcmp(buf, want, len) == 0);
}

/* fclose(f), which must return want, then the FILE's freed memory taken
 * back by malloc and scribbled on (kept till the exit): a stream the
 * library still listed would make the exit flush lock that garbage. Built
 * without ASan, glibc's malloc hands the chunk just freed back (tcache):
 * checked; ASan's quarantine keeps it (no check). */
static void *volatile scribbled[2];

static void fclose_then_scribble(FILE *f, int want) {
    size_t size = malloc_usable_size(f);
    uintptr_t was = (uintptr_t)f;
    errno = 0;
    CHECK(fclose(f) == want);
    if (want == EOF) CHECK(errno == 0);
    unsigned char *p = malloc(size);
    CHECK(p);
#ifndef __SANITIZE_ADDRESS__
    CHECK((uintptr_t)p == was);
#else
    (void)was;
#endif
    memset(p, 0x41, size);
    /* Kept where the compiler cannot prove it unread (else the store goes). */
    scribbled[scribbled[0] != NULL] = p;
}

static void case_reopen(void) {
    FILE *f = fdopen(c, "w");
    CHECK(f);
    CHECK(fputs("tail one\n", f) >= 0);
    errno = 0;
    CHECK(freopen(NULL, "w", f) == NULL && errno == ENXIO);
    reads_then_end(s, "tail one\n");
    errno = 0;
    CHECK(fileno(f) == -1 && errno == EBADF);
    fclose_then_scribble(f, EOF);
    close(s);
    int pc, ps;
    pair(&pc, &ps, !plain);
    f = fdopen(pc, "w");
    CHECK(f);
    CHECK(fputs("tail two\n", f) >= 0);
    errno = 0;
    FILE *r = freopen64("/dev/null", "w", f);
    if (plain) {
        CHECK(r == f && fileno(f) == pc);
        CHECK(fputs("gone\n", f) >= 0 && fflush(f) == 0);
        fclose_then_scribble(f, 0);
    } else {
        CHECK(r == NULL && errno == EINVAL);
        CHECK(fileno(f) == -1);
        fclose_then_scribble(f, EOF);
    }
    reads_then_end(ps, "tail two\n");
    close(ps);
}

static void case_reopenforked(void) {
    FILE *f = fdopen(c, "w");
    CHECK(f);
    CHECK(fputs("before\n", f) >= 0 && fflush(f) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        errno = 0;
        CHECK(freopen(NULL, "w", f) == NULL && errno == ENXIO);
        CHECK(fileno(f) == -1 && fclose(f) == EOF);
        exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "child status %#x\n", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(fputs("after\n", f) >= 0 && fclose(f) == 0);
    reads_then_end(s, "before\nafter\n");
    close(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE [plain]\n", argv[0]);
        return 2;
    }
    plain = argc > 2 && !strcmp(argv[2], "plain");
    const char *cs = argv[1];
    /* "exit" and "locked" make a pair of their own, an end in each
     * process; "policy" one the policy switches. */
    if (strcmp(cs, "exit") != 0 && strcmp(cs, "locked") != 0 && strcmp(cs, "policy") != 0)
        pair(&c, &s, !plain);
    if (!strcmp(cs, "lines")) {
        case_lines();
    } else if (!strcmp(cs, "bulk")) {
        case_bulk();
    } else if (!strcmp(cs, "order")) {
        case_order();
    } else if (!strcmp(cs, "close")) {
        case_close();
    } else if (!strcmp(cs, "modes")) {
        case_modes();
    } else if (!strcmp(cs, "dprintf")) {
        case_dprintf();
    } else if (!strcmp(cs, "cancel")) {
        case_cancel();
    } else if (!strcmp(cs, "policy")) {
        case_policy();
    } else if (!strcmp(cs, "exit")) {
        case_exit();
    } else if (!strcmp(cs, "forked")) {
        case_forked(0);
    } else if (!strcmp(cs, "forkedflush")) {
        case_forked(1);
    } else if (!strcmp(cs, "locked")) {
        case_locked();
    } else if (!strcmp(cs, "reopen")) {
        case_reopen();
    } else if (!strcmp(cs, "reopenforked")) {
        case_reopenforked();
    } else if (!strcmp(cs, "unswitched")) {
        case_unswitched();
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    return 0;
}
