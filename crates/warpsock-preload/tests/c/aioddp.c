/* POSIX AIO on a DDP-mode stream socket (issue 12; interpose/aio.rs):
 * glibc runs a request with its internal read, which no preloaded library
 * sees, and on a DDP socket's number (the doorbell's end) that read the
 * doorbell: aio_read waited for ever, and every later request on the
 * number behind it. Checked (also over TCP with "plain", no preload):
 *   - aio_read queued before the bytes come: EINPROGRESS, then
 *     aio_suspend returns, aio_error 0, aio_return the count, the bytes;
 *     aio_write: the peer reads them;
 *   - two reads queued on the socket take its bytes in that order;
 *   - SIGEV_SIGNAL: the signal with SI_ASYNCIO and the value;
 *     SIGEV_THREAD: the function called with the value;
 *   - aio_suspend with nothing done times out (EAGAIN);
 *   - aio_cancel: a queued read behind a running one is canceled
 *     (ECANCELED, -1), the running one is not (AIO_NOTCANCELED), then
 *     completes; a finished one is AIO_ALLDONE; a block naming another
 *     descriptor is EINVAL (the queue's own tests: src/interpose/aio/
 *     queue.rs);
 *   - lio_listio LIO_WAIT with a read and a write; LIO_NOWAIT notifies
 *     its sigevent once both are done; an unknown opcode fails its entry
 *     alone (EINVAL; LIO_NOWAIT still returns 0);
 *   - a SIGEV_THREAD function runs with no signal blocked;
 *   - a read on a second socket whose bytes are in completes while one on
 *     the first waits (it waited behind it: the library's one worker);
 *   - a LIO_NOWAIT list's signal comes when its last request completes,
 *     though the block of one completed before was reused for a request
 *     still waiting (the list looked at the blocks: it waited for that
 *     one too).
 * Prints "aioddp: ok". */
#include "ddppair.h"

#include <aio.h>
#include <semaphore.h>

static struct aiocb request(int fd, void *buf, size_t n) {
    struct aiocb cb;
    memset(&cb, 0, sizeof cb);
    cb.aio_fildes = fd;
    cb.aio_buf = buf;
    cb.aio_nbytes = n;
    cb.aio_sigevent.sigev_notify = SIGEV_NONE;
    return cb;
}

/* Waits (10 s) for cb to complete; returns aio_return. */
static ssize_t finished(struct aiocb *cb) {
    const struct aiocb *l[1] = {cb};
    struct timespec ts = {10, 0};
    for (int k = 0; aio_error(cb) == EINPROGRESS; k++) {
        CHECK(k < 100);
        CHECK(aio_suspend(l, 1, &ts) == 0 || errno == EINTR);
    }
    return aio_return(cb);
}

static sem_t called;
static int called_with;
static int called_masked;

static void on_done(union sigval v) {
    called_with = v.sival_int;
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    called_masked = sigismember(&now, SIGINT);
    sem_post(&called);
}

static int sem_wait_10s(sem_t *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    return sem_timedwait(s, &ts);
}

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    int c, s;
    pair_unless_plain(plain, &c, &s);
    CHECK(sem_init(&called, 0, 0) == 0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGRTMIN + 1);
    CHECK(sigprocmask(SIG_BLOCK, &set, NULL) == 0);

    /* A read queued before the bytes; a write. */
    char b[16] = {0};
    struct aiocb r = request(c, b, 5);
    CHECK(aio_read(&r) == 0);
    CHECK(aio_error(&r) == EINPROGRESS);
    CHECK(write(s, "hello", 5) == 5);
    CHECK(finished(&r) == 5 && aio_error(&r) == 0 && memcmp(b, "hello", 5) == 0);
    struct aiocb w = request(c, "world", 5);
    CHECK(aio_write(&w) == 0);
    CHECK(finished(&w) == 5);
    CHECK(recv(s, b, 5, MSG_WAITALL) == 5 && memcmp(b, "world", 5) == 0);

    /* Two reads in order. */
    char b1[4], b2[4];
    struct aiocb r1 = request(c, b1, 4), r2 = request(c, b2, 4);
    CHECK(aio_read(&r1) == 0 && aio_read(&r2) == 0);
    CHECK(write(s, "abcd", 4) == 4);
    CHECK(finished(&r1) == 4 && memcmp(b1, "abcd", 4) == 0);
    CHECK(write(s, "efgh", 4) == 4);
    CHECK(finished(&r2) == 4 && memcmp(b2, "efgh", 4) == 0);

    /* SIGEV_SIGNAL. */
    struct aiocb rs = request(c, b, 2);
    rs.aio_sigevent.sigev_notify = SIGEV_SIGNAL;
    rs.aio_sigevent.sigev_signo = SIGRTMIN + 1;
    rs.aio_sigevent.sigev_value.sival_int = 42;
    CHECK(aio_read(&rs) == 0);
    CHECK(write(s, "ij", 2) == 2);
    siginfo_t si;
    struct timespec ten = {10, 0};
    CHECK(sigtimedwait(&set, &si, &ten) == SIGRTMIN + 1);
    CHECK(si.si_code == SI_ASYNCIO && si.si_value.sival_int == 42 && si.si_pid == getpid());
    CHECK(aio_error(&rs) == 0 && aio_return(&rs) == 2 && memcmp(b, "ij", 2) == 0);

    /* SIGEV_THREAD. */
    struct aiocb rt = request(c, b, 2);
    rt.aio_sigevent.sigev_notify = SIGEV_THREAD;
    rt.aio_sigevent.sigev_notify_function = on_done;
    rt.aio_sigevent.sigev_value.sival_int = 7;
    CHECK(aio_read(&rt) == 0);
    CHECK(write(s, "kl", 2) == 2);
    CHECK(sem_wait_10s(&called) == 0 && called_with == 7);
    /* Run with no signal blocked (SIGINT: the library's workers block
     * every asynchronous one). */
    CHECK(called_masked == 0);
    CHECK(aio_error(&rt) == 0 && aio_return(&rt) == 2 && memcmp(b, "kl", 2) == 0);

    /* Nothing done: aio_suspend times out. A read runs (no bytes yet),
     * a second is queued behind it. */
    struct aiocb run = request(c, b1, 2), queued = request(c, b2, 2);
    CHECK(aio_read(&run) == 0 && aio_read(&queued) == 0);
    const struct aiocb *both[2] = {&run, &queued};
    struct timespec short_wait = {0, 100 * 1000 * 1000};
    errno = 0;
    CHECK(aio_suspend(both, 2, &short_wait) == -1 && errno == EAGAIN);
    /* The queued one is canceled (it waits behind the first whatever
     * the first's state); the first cannot be once a thread runs it
     * (AIO_NOTCANCELED, as glibc's), which a loaded machine may not have
     * begun yet: then it is canceled too. */
    CHECK(aio_cancel(c, &queued) == AIO_CANCELED);
    CHECK(aio_error(&queued) == ECANCELED && aio_return(&queued) == -1);
    struct aiocb other = request(s, b, 1);
    errno = 0;
    CHECK(aio_cancel(c, &other) == -1 && errno == EINVAL);
    int rc = aio_cancel(c, &run);
    if (rc == AIO_NOTCANCELED) {
        CHECK(write(s, "mn", 2) == 2);
        CHECK(finished(&run) == 2 && memcmp(b1, "mn", 2) == 0);
    } else {
        CHECK(rc == AIO_CANCELED && aio_error(&run) == ECANCELED);
    }
    CHECK(aio_cancel(c, &run) == AIO_ALLDONE);

    /* lio_listio LIO_WAIT: a read and a write. */
    CHECK(write(s, "op", 2) == 2);
    char lb[2];
    struct aiocb lr = request(c, lb, 2), lw = request(c, "qr", 2);
    lr.aio_lio_opcode = LIO_READ;
    lw.aio_lio_opcode = LIO_WRITE;
    struct aiocb *list[3] = {&lr, NULL, &lw};
    CHECK(lio_listio(LIO_WAIT, list, 3, NULL) == 0);
    CHECK(aio_return(&lr) == 2 && memcmp(lb, "op", 2) == 0 && aio_return(&lw) == 2);
    CHECK(recv(s, b, 2, MSG_WAITALL) == 2 && memcmp(b, "qr", 2) == 0);

    /* LIO_NOWAIT: the list's sigevent once both are done. */
    struct aiocb nr = request(c, lb, 2), nw = request(c, "uv", 2);
    nr.aio_lio_opcode = LIO_READ;
    nw.aio_lio_opcode = LIO_WRITE;
    struct aiocb *nlist[2] = {&nr, &nw};
    struct sigevent all;
    memset(&all, 0, sizeof all);
    all.sigev_notify = SIGEV_SIGNAL;
    all.sigev_signo = SIGRTMIN + 1;
    all.sigev_value.sival_int = 99;
    CHECK(lio_listio(LIO_NOWAIT, nlist, 2, &all) == 0);
    /* The read first (the write waits behind it on the descriptor). */
    CHECK(write(s, "st", 2) == 2);
    CHECK(recv(s, b, 2, MSG_WAITALL) == 2 && memcmp(b, "uv", 2) == 0);
    CHECK(sigtimedwait(&set, &si, &ten) == SIGRTMIN + 1 && si.si_value.sival_int == 99);
    CHECK(aio_error(&nr) == 0 && aio_return(&nr) == 2 && memcmp(lb, "st", 2) == 0);
    CHECK(aio_error(&nw) == 0 && aio_return(&nw) == 2);

    /* LIO_NOWAIT with an opcode glibc does not know: the call succeeds,
     * that entry fails with EINVAL. */
    struct aiocb bad = request(c, lb, 2);
    bad.aio_lio_opcode = 42;
    struct aiocb *blist[1] = {&bad};
    CHECK(lio_listio(LIO_NOWAIT, blist, 1, NULL) == 0);
    CHECK(finished(&bad) == -1 && aio_error(&bad) == EINVAL);

    /* A second socket: its requests never wait behind the first's (a
     * read that waits for bytes): a read there with its bytes in
     * completes while one here waits (the library's one worker took
     * either first). */
    int c2, s2;
    pair_unless_plain(plain, &c2, &s2);
    for (int i = 0; i < 4; i++) {
        char w1[2], w2[2];
        struct aiocb waits = request(c, w1, 2), ready = request(c2, w2, 2);
        CHECK(write(s2, "wx", 2) == 2);
        CHECK(aio_read(&waits) == 0 && aio_read(&ready) == 0);
        const struct aiocb *one[1] = {&ready};
        CHECK(aio_suspend(one, 1, &ten) == 0 && aio_return(&ready) == 2);
        CHECK(aio_error(&waits) == EINPROGRESS);
        CHECK(write(s, "yz", 2) == 2);
        CHECK(finished(&waits) == 2 && memcmp(w1, "yz", 2) == 0);
    }

    /* A list's notification once its last request completes, though the
     * program reused the block of one that completed before (POSIX lets
     * it once aio_return took its result): A (bytes in) on c, B on c2;
     * A's block reused for a read on c that waits; B's bytes come; the
     * list's signal comes, with the reused A still waiting. */
    char ab[2], bb[2];
    struct aiocb la = request(c, ab, 2), lbk = request(c2, bb, 2);
    la.aio_lio_opcode = LIO_READ;
    lbk.aio_lio_opcode = LIO_READ;
    CHECK(write(s, "AA", 2) == 2);
    struct aiocb *pair_list[2] = {&la, &lbk};
    all.sigev_value.sival_int = 77;
    CHECK(lio_listio(LIO_NOWAIT, pair_list, 2, &all) == 0);
    CHECK(finished(&la) == 2 && memcmp(ab, "AA", 2) == 0);
    la = request(c, ab, 2);
    CHECK(aio_read(&la) == 0);
    CHECK(write(s2, "BB", 2) == 2);
    CHECK(finished(&lbk) == 2 && memcmp(bb, "BB", 2) == 0);
    CHECK(sigtimedwait(&set, &si, &ten) == SIGRTMIN + 1 && si.si_value.sival_int == 77);
    CHECK(aio_error(&la) == EINPROGRESS);
    CHECK(write(s, "CC", 2) == 2);
    CHECK(finished(&la) == 2 && memcmp(ab, "CC", 2) == 0);

    close(c2);
    close(s2);
    close(c);
    close(s);
    printf("aioddp: ok\n");
    return 0;
}
