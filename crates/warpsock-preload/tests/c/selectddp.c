/* select and pselect over a DDP-mode pair (issue 12): made as a poll
 * (interpose::wait::select::polled) when the sets name a DDP socket, they
 * must answer as Linux's select does over TCP:
 *   - nothing readable: 0 after the timeout, the read set cleared, the
 *     time left written back (0);
 *   - writable at once (write set), the peer's bytes readable (read set),
 *     a plain pipe beside it in the same call reported too, and bits of
 *     numbers not asked for (past n) never set;
 *   - only a hang-up of an except-only pipe (which poll reports, select
 *     not): 0 after the whole timeout;
 *   - a number not open in a set: -1 EBADF, every set as it was;
 *   - the peer's close: readable (the end of stream), and the read gives 0;
 *   - pselect with a mask that lets SIGUSR1 in, the signal blocked
 *     otherwise: EINTR once the signal is sent during the wait.
 * Run preloaded; WARPSOCK_DDP_SELECT_DIRECT=0 runs the same checks
 * through the doorbells. An argument, if any, only names the run in its
 * last line: "selectddp[ NAME]: ok". */
#include "ddppair.h"

#include <sys/select.h>
#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t got_usr1;
static void on_usr1(int sig) { (void)sig; got_usr1 = 1; }

struct kick { pthread_t target; };
static void *kick_later(void *arg) {
    struct kick *k = arg;
    /* The signal comes while the main thread waits (its pselect has a
     * 10 s bound); sent until it was handled. */
    for (int i = 0; i < 1000 && !got_usr1; i++) {
        usleep(10000);
        pthread_kill(k->target, SIGUSR1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int c, s;
    ddp_pair(&c, &s);
    int p[2];
    CHECK(pipe(p) == 0);
    int top = c > s ? c : s;
    if (p[0] > top) top = p[0];

    /* Nothing to read: a timeout of 50 ms, the set cleared, no time left. */
    fd_set rd, wr, ex;
    FD_ZERO(&rd); FD_SET(c, &rd);
    struct timeval tv = {0, 50000};
    CHECK(select(c + 1, &rd, NULL, NULL, &tv) == 0);
    CHECK(!FD_ISSET(c, &rd));
    CHECK(tv.tv_sec == 0 && tv.tv_usec == 0);

    /* Writable at once; the peer's bytes and the pipe's readable in one call. */
    FD_ZERO(&wr); FD_SET(s, &wr);
    tv = (struct timeval){5, 0};
    CHECK(select(s + 1, NULL, &wr, NULL, &tv) == 1 && FD_ISSET(s, &wr));
    CHECK(send(s, "hello", 5, 0) == 5);
    CHECK(write(p[1], "x", 1) == 1);
    /* The bytes' arrival first (the doorbell path hears of it from the
     * progress thread), then both in one call. */
    FD_ZERO(&rd); FD_SET(c, &rd);
    tv = (struct timeval){5, 0};
    CHECK(select(c + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(c, &rd));
    FD_ZERO(&rd); FD_SET(c, &rd); FD_SET(p[0], &rd);
    FD_ZERO(&ex); FD_SET(c, &ex);
    tv = (struct timeval){5, 0};
    CHECK(select(top + 1, &rd, NULL, &ex, &tv) == 2);
    CHECK(FD_ISSET(c, &rd) && FD_ISSET(p[0], &rd) && !FD_ISSET(c, &ex));
    char b[16];
    CHECK(recv(c, b, sizeof b, 0) == 5 && memcmp(b, "hello", 5) == 0);
    CHECK(read(p[0], b, 1) == 1);

    /* Only what select does not report: an except-only pipe whose writer
     * is closed (poll always reports its hang-up) beside the DDP socket
     * (nothing to read): the call sleeps its whole timeout and answers 0,
     * as Linux's. */
    int hp[2];
    CHECK(pipe(hp) == 0);
    CHECK(close(hp[1]) == 0);
    int hhi = hp[0] > c ? hp[0] : c;
    FD_ZERO(&rd); FD_SET(c, &rd);
    FD_ZERO(&ex); FD_SET(hp[0], &ex);
    struct timespec t0, t1;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t0) == 0);
    tv = (struct timeval){0, 200000};
    CHECK(select(hhi + 1, &rd, NULL, &ex, &tv) == 0);
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t1) == 0);
    long waited_ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    CHECK(waited_ms >= 190);
    CHECK(!FD_ISSET(c, &rd) && !FD_ISSET(hp[0], &ex));
    close(hp[0]);

    /* A number not open beside the DDP socket: EBADF, the sets untouched. */
    int closed = dup(p[0]);
    CHECK(closed >= 0);
    CHECK(close(closed) == 0);
    int hi = closed > c ? closed : c;
    FD_ZERO(&rd); FD_SET(c, &rd); FD_SET(closed, &rd);
    fd_set before = rd;
    tv = (struct timeval){5, 0};
    errno = 0;
    CHECK(select(hi + 1, &rd, NULL, NULL, &tv) == -1 && errno == EBADF);
    CHECK(memcmp(&rd, &before, sizeof rd) == 0);

    /* pselect: SIGUSR1 blocked but let in by the wait's mask: EINTR. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    sigset_t block, open_mask;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    CHECK(pthread_sigmask(SIG_BLOCK, &block, &open_mask) == 0);
    sigdelset(&open_mask, SIGUSR1);
    struct kick k = {pthread_self()};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, kick_later, &k) == 0);
    FD_ZERO(&rd); FD_SET(c, &rd);
    struct timespec ts = {10, 0};
    errno = 0;
    CHECK(pselect(c + 1, &rd, NULL, NULL, &ts, &open_mask) == -1 && errno == EINTR);
    CHECK(got_usr1);
    CHECK(pthread_join(t, NULL) == 0);

    /* The peer's close: readable, and the read says end of stream. */
    CHECK(close(s) == 0);
    FD_ZERO(&rd); FD_SET(c, &rd);
    tv = (struct timeval){10, 0};
    CHECK(select(c + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(c, &rd));
    CHECK(recv(c, b, sizeof b, 0) == 0);
    close(c);
    printf("selectddp%s%s: ok\n", argc > 1 ? " " : "", argc > 1 ? argv[1] : "");
    return 0;
}
