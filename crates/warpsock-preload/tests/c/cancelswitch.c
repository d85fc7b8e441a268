/* pthread_cancel of a thread in a DDP-mode switch, in a read of a socket
 * whose switch failed (a residue socket watching for a late MPA Request),
 * and what such a socket's other calls and a connect's wait do with the
 * cancel's signals (issue 12; cancel.c: the blocked calls of a switched
 * pair; helpers: cancelpair.h). No case switches the pair first: each
 * switches it itself (or a peer marks by hand), or leaves it TCP.
 * One case per run: cancelswitch CASE [plain].
 *
 *   switch    setsockopt(WARPSOCK_DDP_MODE) of the connecting end while
 *             the peer does not switch yet: cancelled while the switch
 *             waits for the peer's mark, then the peer switches (late):
 *             the switch goes on to the end (its MPA exchange, its
 *             waits: no libc cancellation point in them; the process
 *             aborted, "FATAL: exception not rethrown"), the setsockopt
 *             returns 0 and the thread is cancelled at its next
 *             cancellation point, a read of the switched socket (plain:
 *             the setsockopt fails, the read is cancelled);
 *   switchpeer  the same with the roles swapped (the accepted end's
 *             switch: the other role of the handshake);
 *   watch     a read of a socket whose switch the peer answered with its
 *             mark and no MPA Request (a peer without the library that
 *             sends the mark's urgent byte by hand): the switch fails and
 *             the socket watches the bytes behind the mark for a late
 *             Request (xsock/residue.rs); the read waits for them there
 *             (its wait was libc's poll inside the library: the cancel
 *             aborted the process) and is cancelled; the peer's bytes
 *             then are read as data (plain: no switch, a TCP read);
 *   watchflags  (not a cancel) the watch case's socket, blocking, whose
 *             switch failed (plain: a TCP socket, no mark): calls the
 *             kernel answers at once return at once, as over TCP (review
 *             r25-a item 2: the library's wait before each blocked them):
 *             recvmsg(MSG_ERRQUEUE) EAGAIN, recv(MSG_OOB) EINVAL (the
 *             switch took the mark; TCP has no urgent byte), recv
 *             (MSG_DONTWAIT) EAGAIN, sends with MSG_DONTWAIT until EAGAIN
 *             (the peer not reading); a zero-length recv blocks, as TCP's
 *             (then cancelled); a blocking 1 MiB send (SO_SNDBUF 16 KiB)
 *             returns 1 MiB once the peer reads everything, and an 8 B MSG_WAITALL recv of
 *             bytes that come in two writes returns all 8;
 *   watchpartial  (not a cancel) the watch case's socket, whose peer
 *             then sends 10 bytes of the MPA Request's key and nothing
 *             more: a blocking read with SO_RCVTIMEO 1 s fails with
 *             EAGAIN after it, the reading thread's CPU time a small part
 *             of the wait (review r25-a item 9: the peeked prefix stayed
 *             readable, the wait returned at once, the loop spun a CPU
 *             and SO_RCVTIMEO never expired) and its sleeps fewer than 60
 *             (review r26-b item 9: pauses capped at 5 ms made about 200
 *             a second; they grow to 100 ms now); then the peer's end: the
 *             prefix can no longer complete, a read returns its 10 bytes
 *             and the next 0 (the loop spun for ever). Plain: no switch,
 *             no timed read (TCP returns the bytes), the end's reads;
 *   watchnb   (not a cancel) the watch case's socket, whose peer then
 *             sends 10 bytes of the MPA Request's key and nothing more:
 *             a thread's blocking read waits watching them (until
 *             cancelled), and meanwhile another thread's recv with
 *             MSG_DONTWAIT, then a recv with the descriptor O_NONBLOCK,
 *             each returns -1 EAGAIN while the first still waits (review
 *             r26-b item 7: they blocked on the socket's lock, held by
 *             the watching read, for as long as the peer stayed silent;
 *             Linux's reader sleeps without the socket lock). Then the
 *             reader is cancelled, and after the peer's end the prefix is
 *             read as data, then the end. Plain: the same with nothing
 *             sent before the cancel (TCP returns the bytes);
 *   watchreq  (not a cancel) the watch case's socket, whose peer then
 *             sends a whole warpsock MPA Request (its hello's version
 *             unknown: one the watch must not deliver as data): the
 *             responder's read fails with ECONNRESET, its next read
 *             returns 0 and a send fails with EPIPE, and the peer's read
 *             fails with ECONNRESET — a reset, not a clean end (the watch
 *             set SO_LINGER {1, 0} and called shutdown: a FIN, the peer
 *             read 0, and the Request's bytes stayed queued for the
 *             responder's next read). Plain: the responder's abortive
 *             close (SO_LINGER {1, 0}, close) after the same bytes: the
 *             peer's read fails with ECONNRESET;
 *   connectwait  (not a cancel) a non-blocking connect of a socket
 *             asked for DDP mode (the preload waits for the connection in
 *             the call, at most WARPSOCK_CONNECT_TIMEOUT_MS, 1 s here) to
 *             a listener whose accept queue is full (its SYN dropped), by
 *             a thread with cancellation disabled, while main cancels it
 *             every 50 ms (each the preload's signal, which the wait
 *             ignores): the connect returns -1 EINPROGRESS after about
 *             1 s (review r25-a item 10: each signal restarted the full
 *             timeout, and the connect never returned while they came).
 *             Plain: EINPROGRESS at once;
 *   switchfail  the switch case on the initiator (the end with the lower
 *             port), whose peer, a plain socket, sends the mark by hand
 *             and never the MPA Reply: cancelled while the switch waits,
 *             the switch then fails (its MPA timeout) and setsockopt
 *             returns -1 (it dropped descriptors with libc's close, a
 *             cancellation point: the process aborted, review r25-a item
 *             3); the thread is cancelled at its next cancellation point,
 *             a read (plain: the setsockopt fails at once).
 *
 * `plain`: the same over TCP (no switch), the behaviour to match. */
#include "cancelpair.h"

#include <sys/resource.h>

/* switch: the thread's setsockopt(WARPSOCK_DDP_MODE) of the victim, its
 * result kept; then a read of it, where it is cancelled. */
static atomic_int switch_r = -2, switch_errno;
static void *block_switch(void *a) {
    (void)a;
    started();
    static int one = 1;
    int r = setsockopt(victim, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
    atomic_store(&switch_errno, errno);
    atomic_store(&switch_r, r);
    static char b[8];
    return returned(read(victim, b, sizeof b));
}

/* watch: the end that responds (its address, port, the greater: the
 * switch's roles, warpsock_xsock::switch::role) switches; the other, a
 * plain socket, sends the mark (0xD7, urgent) and never the MPA Request. */
static void *switch_victim(void *a) {
    (void)a;
    static int one = 1;
    int r = setsockopt(victim, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
    atomic_store(&switch_errno, errno);
    atomic_store(&switch_r, r);
    return NULL;
}

static int local_port(int fd) {
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    return ntohs(a.sin_port);
}

/* The responder switches (switch_victim) while `other`, a plain socket,
 * has sent the mark and nothing more: the switch fails (-1). */
static void failed_switch(int responder, int other) {
    static const unsigned char mark = 0xD7;
    CHECK(send(other, &mark, 1, MSG_OOB) == 1);
    victim = responder;
    pthread_t p;
    CHECK(pthread_create(&p, NULL, switch_victim, NULL) == 0);
    CHECK(pthread_join(p, NULL) == 0);
    CHECK(atomic_load(&switch_r) == -1);
}

static void cancel_watch(void) {
    int responder = local_port(c) > local_port(s) ? c : s;
    int other = responder == c ? s : c;
    failed_switch(responder, other);
    cancel_blocked(block_read);
    CHECK(write(other, "notmpa!!", 8) == 8);
    char b[8];
    CHECK(recv(responder, b, 8, MSG_WAITALL) == 8 && memcmp(b, "notmpa!!", 8) == 0);
    still_works(responder, other);
}

static int flag_case;
static size_t filled_bytes; /* watchflags: what the MSG_DONTWAIT sends took */
static void *flag_call(void *a) {
    (void)a;
    started();
    static char b[8];
    static struct iovec v;
    static struct msghdr m;
    static char chunk[32 << 10];
    long r = -1;
    switch (flag_case) {
    case 0:
        v = (struct iovec){b, sizeof b};
        m = (struct msghdr){.msg_iov = &v, .msg_iovlen = 1};
        r = recvmsg(victim, &m, MSG_ERRQUEUE);
        break;
    case 1:
        r = recv(victim, b, 1, MSG_OOB);
        break;
    case 2:
        r = recv(victim, b, sizeof b, MSG_DONTWAIT);
        break;
    case 3:
        r = recv(victim, b, 0, 0);
        break;
    case 4:
        memset(chunk, 'f', sizeof chunk);
        for (long i = 0; i < 100000; i++) {
            r = send(victim, chunk, sizeof chunk, MSG_DONTWAIT);
            if (r < 0) break;
            filled_bytes += (size_t)r;
        }
        break;
    }
    return call_end(r);
}

/* Runs flag_call case k: it must return at once with r (and errno e if
 * r < 0). */
static void flag_at_once(int k, long r, int e) {
    flag_case = k;
    int quick = at_once(flag_call);
    if (!quick) fprintf(stderr, "flag case %d slept\n", k);
    CHECK(quick);
    long got = atomic_load(&call_r);
    if (got != r || (r < 0 && atomic_load(&call_errno) != e))
        fprintf(stderr, "flag case %d returned %ld (errno %ld)\n", k, got,
                atomic_load(&call_errno));
    CHECK(got == r && (r >= 0 || atomic_load(&call_errno) == e));
}

#define BIG (1u << 20)
static void *big_send(void *a) {
    (void)a;
    started();
    static unsigned char big[BIG];
    memset(big, 'g', sizeof big);
    return returned(send(victim, big, sizeof big, 0));
}

static void cancel_watch_flags(int plain) {
    int responder = local_port(c) > local_port(s) ? c : s;
    int other = responder == c ? s : c;
    victim = responder;
    if (!plain) {
        failed_switch(responder, other);
    }
    /* A small send buffer: the 1 MiB send below goes in many parts. */
    int sndbuf = 16 << 10;
    CHECK(setsockopt(victim, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) == 0);
    flag_at_once(0, -1, EAGAIN);
    flag_at_once(1, -1, EINVAL);
    flag_at_once(2, -1, EAGAIN);
    flag_case = 3;
    CHECK(!at_once(flag_call)); /* blocks, as TCP's; cancelled */
    flag_at_once(4, -1, EAGAIN);
    CHECK(filled_bytes > 0);
    /* A blocking send of 1 MiB: all of it once the peer reads. */
    pthread_t t = start_victim(big_send, 0);
    set_rcvtimeo(other, 10000);
    static unsigned char b[1 << 16];
    size_t want = filled_bytes + BIG, got = 0;
    while (got < want) {
        ssize_t r = recv(other, b, sizeof b, 0);
        if (r <= 0) fprintf(stderr, "peer read %zu of %zu bytes, then %zd\n", got, want, r);
        CHECK(r > 0);
        got += (size_t)r;
    }
    void *res;
    CHECK(pthread_join(t, &res) == 0 && res == (void *)1);
    if (atomic_load(&ret_r) != BIG) fprintf(stderr, "the 1 MiB send returned %ld\n", atomic_load(&ret_r));
    CHECK(atomic_load(&ret_r) == BIG);
    /* An 8 B MSG_WAITALL recv of bytes that come in two writes. */
    CHECK(write(other, "notm", 4) == 4);
    t = start_victim(block_waitall, 0);
    asleep_for_good(0);
    CHECK(write(other, "pa!!", 4) == 4);
    CHECK(pthread_join(t, &res) == 0 && res == (void *)1);
    if (atomic_load(&ret_r) != 8) fprintf(stderr, "the MSG_WAITALL recv returned %ld\n", atomic_load(&ret_r));
    CHECK(atomic_load(&ret_r) == 8);
    still_works(responder, other);
}

/* watchpartial: a read of the victim of at most 64 bytes, its wall and
 * CPU time (the calling thread's) kept. */
static atomic_long part_wall_ns, part_cpu_ns, part_waits;
static long ns_of(const struct timespec *a, const struct timespec *b) {
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}
static void *timed_read(void *a) {
    (void)a;
    started();
    static char b[64];
    struct timespec w0, w1, c0, c1;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &w0) == 0);
    CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0) == 0);
    struct rusage u0, u1;
    CHECK(getrusage(RUSAGE_THREAD, &u0) == 0);
    long r = recv(victim, b, sizeof b, 0);
    int e = errno;
    CHECK(getrusage(RUSAGE_THREAD, &u1) == 0);
    atomic_store(&part_waits, u1.ru_nvcsw - u0.ru_nvcsw);
    CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1) == 0);
    CHECK(clock_gettime(CLOCK_MONOTONIC, &w1) == 0);
    atomic_store(&part_wall_ns, ns_of(&w0, &w1));
    atomic_store(&part_cpu_ns, ns_of(&c0, &c1));
    errno = e;
    return returned(r);
}

static void watch_partial(int plain) {
    int responder = local_port(c) > local_port(s) ? c : s;
    int other = responder == c ? s : c;
    victim = responder;
    if (!plain) {
        failed_switch(responder, other);
    }
    static const char prefix[] = "MPA ID Req"; /* of "MPA ID Req Frame" */
    CHECK(write(other, prefix, 10) == 10);
    if (!plain) {
        set_rcvtimeo(responder, 1000);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, timed_read, NULL) == 0);
        struct timespec until;
        CHECK(clock_gettime(CLOCK_REALTIME, &until) == 0);
        until.tv_sec += 20;
        void *res;
        int j = pthread_timedjoin_np(t, &res, &until);
        if (j != 0) fprintf(stderr, "the read of a partial Request never timed out\n");
        CHECK(j == 0 && res == (void *)1);
        long r = atomic_load(&ret_r), e = atomic_load(&ret_errno);
        long wall = atomic_load(&part_wall_ns), cpu = atomic_load(&part_cpu_ns);
        long waits = atomic_load(&part_waits);
        fprintf(stderr,
                "partial Request read: %ld (errno %ld) after %ld us, %ld us of CPU, %ld sleeps\n",
                r, e, wall / 1000, cpu / 1000, waits);
        CHECK(r == -1 && e == EAGAIN);
        CHECK(wall >= 950000000L);
        CHECK(cpu * 4 < wall); /* a spin takes (nearly) all of it */
        /* Pauses that grow to 100 ms: about 20 in the second (a 5 ms cap
         * made about 200). */
        CHECK(waits < 60);
    }
    /* The peer's end behind the prefix: its bytes, then the end. */
    set_rcvtimeo(responder, 10000);
    CHECK(shutdown(other, SHUT_WR) == 0);
    char b[64];
    ssize_t n = recv(responder, b, sizeof b, 0);
    if (n != 10) fprintf(stderr, "the read after the peer's end returned %zd (errno %d)\n", n, errno);
    CHECK(n == 10 && memcmp(b, prefix, 10) == 0);
    CHECK(recv(responder, b, sizeof b, 0) == 0);
    CHECK(write(responder, "back", 4) == 4);
    CHECK(recv(other, b, 4, MSG_WAITALL) == 4 && memcmp(b, "back", 4) == 0);
}

/* watchnb: a non-blocking recv of the victim in a thread of its own
 * (nb_flags: MSG_DONTWAIT, or none with the descriptor O_NONBLOCK). */
static int nb_flags;
static void *nb_recv(void *a) {
    (void)a;
    static char b[64];
    return call_end(recv(victim, b, sizeof b, nb_flags));
}

/* Runs nb_recv while the watching read waits (thread w): it must return
 * -1 EAGAIN, and w must still wait then. Bounded: 10 s for the call (it
 * blocked for as long as the peer stayed silent: for good here). */
static void nb_while_watched(pthread_t w, int flags) {
    nb_flags = flags;
    atomic_store(&call_done, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, nb_recv, NULL) == 0);
    struct timespec until;
    CHECK(clock_gettime(CLOCK_REALTIME, &until) == 0);
    until.tv_sec += 10;
    int j = pthread_timedjoin_np(t, NULL, &until);
    if (j != 0) fprintf(stderr, "the non-blocking recv (flags %#x) blocked\n", flags);
    CHECK(j == 0);
    long r = atomic_load(&call_r), e = atomic_load(&call_errno);
    if (r != -1 || e != EAGAIN)
        fprintf(stderr, "the non-blocking recv (flags %#x) returned %ld (errno %ld)\n", flags, r, e);
    CHECK(r == -1 && e == EAGAIN);
    CHECK(pthread_tryjoin_np(w, NULL) == EBUSY);
}

static void watch_nonblocking(int plain) {
    int responder = local_port(c) > local_port(s) ? c : s;
    int other = responder == c ? s : c;
    victim = responder;
    static const char prefix[] = "MPA ID Req"; /* of "MPA ID Req Frame" */
    if (!plain) {
        failed_switch(responder, other);
        CHECK(write(other, prefix, 10) == 10);
    }
    pthread_t w = start_victim(block_read, 0);
    asleep_for_good(0);
    nb_while_watched(w, MSG_DONTWAIT);
    int fl = fcntl(responder, F_GETFL);
    CHECK(fl >= 0 && fcntl(responder, F_SETFL, fl | O_NONBLOCK) == 0);
    nb_while_watched(w, 0);
    CHECK(fcntl(responder, F_SETFL, fl) == 0);
    CHECK(pthread_cancel(w) == 0);
    joined_cancelled(w, "watching read");
    if (plain) CHECK(write(other, prefix, 10) == 10);
    /* The peer's end behind the prefix: its bytes, then the end. */
    set_rcvtimeo(responder, 10000);
    CHECK(shutdown(other, SHUT_WR) == 0);
    char b[64];
    ssize_t n = recv(responder, b, sizeof b, 0);
    if (n != 10) fprintf(stderr, "the read after the peer's end returned %zd (errno %d)\n", n, errno);
    CHECK(n == 10 && memcmp(b, prefix, 10) == 0);
    CHECK(recv(responder, b, sizeof b, 0) == 0);
}

/* watchreq: a late MPA Request (see the top) resets the connection. */
static void watch_request(int plain) {
    int responder = local_port(c) > local_port(s) ? c : s;
    int other = responder == c ? s : c;
    /* "MPA ID Req Frame", flags 0, revision 1, private data 16 bytes: a
     * warpsock hello ("WSXS") of version 99. */
    static const unsigned char req[36] = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'q',
                                          ' ', 'F', 'r', 'a', 'm', 'e', 0, 1, 0, 16,
                                          'W', 'S', 'X', 'S', 99};
    if (!plain) {
        failed_switch(responder, other);
    }
    CHECK(write(other, req, sizeof req) == (ssize_t)sizeof req);
    set_rcvtimeo(responder, 10000);
    set_rcvtimeo(other, 10000);
    char b[64];
    if (plain) {
        /* The bytes arrive before the close (a close with them unread
         * resets whatever SO_LINGER says; the linger makes sure). */
        CHECK(recv(responder, b, 1, MSG_PEEK) == 1);
        struct linger l = {1, 0};
        CHECK(setsockopt(responder, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
        CHECK(close(responder) == 0);
    } else {
        ssize_t n = recv(responder, b, sizeof b, 0);
        if (n != -1 || errno != ECONNRESET)
            fprintf(stderr, "the responder's read of the Request returned %zd (errno %d)\n", n, errno);
        CHECK(n == -1 && errno == ECONNRESET);
        n = recv(responder, b, sizeof b, 0);
        if (n != 0) fprintf(stderr, "the responder's next read returned %zd (errno %d)\n", n, errno);
        CHECK(n == 0);
        CHECK(send(responder, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE);
    }
    ssize_t n = recv(other, b, sizeof b, 0);
    if (n != -1 || errno != ECONNRESET)
        fprintf(stderr, "the peer's read returned %zd (errno %d)\n", n, errno);
    CHECK(n == -1 && errno == ECONNRESET);
    if (plain) {
        /* main closes both: a descriptor in the closed one's place. */
        CHECK(dup2(other, responder) == responder);
    }
}

/* connectwait: cw_fd's connect to cw_to by a thread with cancellation
 * disabled; its result, time and end kept. */
static int cw_fd;
static struct sockaddr_in cw_to;
static atomic_int cw_done;
static atomic_long cw_ms;
static void *connect_disabled(void *a) {
    (void)a;
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL) == 0);
    started();
    struct timespec t0, t1;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t0) == 0);
    int r = connect(cw_fd, (struct sockaddr *)&cw_to, sizeof cw_to);
    int e = errno;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t1) == 0);
    atomic_store(&cw_ms, ns_of(&t0, &t1) / 1000000);
    atomic_store(&ret_r, r);
    atomic_store(&ret_errno, e);
    atomic_store(&cw_done, 1);
    return (void *)1;
}

static void connect_wait(int plain) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in la = lo(0);
    CHECK(bind(l, (struct sockaddr *)&la, sizeof la) == 0);
    CHECK(listen(l, 0) == 0);
    socklen_t alen = sizeof cw_to;
    CHECK(getsockname(l, (struct sockaddr *)&cw_to, &alen) == 0);
    /* Fills the accept queue (backlog 0: one); the next SYN is dropped. */
    int filler = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(filler >= 0);
    CHECK(connect(filler, (struct sockaddr *)&cw_to, sizeof cw_to) == 0);
    cw_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    CHECK(cw_fd >= 0);
    if (!plain) {
        static int one = 1;
        CHECK(setsockopt(cw_fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == 0);
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, connect_disabled, NULL) == 0);
    /* Cancels, each with the preload's signal, until the connect returned
     * (15 s at most: a wait that each restarts never ends). */
    for (int k = 0; !atomic_load(&cw_done); k++) {
        if (k >= 300) fprintf(stderr, "the connect did not return in 15 s of signals\n");
        CHECK(k < 300);
        CHECK(pthread_cancel(t) == 0);
        CHECK(poll(NULL, 0, 50) == 0);
    }
    void *res;
    CHECK(pthread_join(t, &res) == 0 && res == (void *)1);
    long r = atomic_load(&ret_r), e = atomic_load(&ret_errno), ms = atomic_load(&cw_ms);
    fprintf(stderr, "connect: %ld (errno %ld) after %ld ms\n", r, e, ms);
    CHECK(r == -1 && e == EINPROGRESS);
    if (!plain) CHECK(ms >= 900 && ms < 5000);
    close(cw_fd);
    close(filler);
    close(l);
}

/* switchfail: the initiator's switch with a peer that marks by hand and
 * never answers its MPA Request: cancelled while it waits, it fails, and
 * its read is cancelled. */
static void cancel_switch_fail(void) {
    int initiator = local_port(c) < local_port(s) ? c : s;
    int other = initiator == c ? s : c;
    static const unsigned char mark = 0xD7;
    CHECK(send(other, &mark, 1, MSG_OOB) == 1);
    victim = initiator;
    pthread_t t = start_victim(block_switch, 0);
    asleep_for_good(0);
    CHECK(pthread_cancel(t) == 0);
    joined_cancelled(t, "read after the failed switch");
    int r = atomic_load(&switch_r);
    if (r != -1) fprintf(stderr, "the switch returned %d\n", r);
    CHECK(r == -1);
}

/* switch: the thread switches `mine` and waits for the peer's mark; it
 * is cancelled there, then the peer, `theirs`, switches: the thread's
 * switch completes (plain: fails at once) and its read is cancelled. */
static void cancel_switch(int mine, int theirs, int plain) {
    victim = mine;
    pthread_t t = start_victim(block_switch, 0);
    asleep_for_good(0);
    CHECK(pthread_cancel(t) == 0);
    if (!plain) {
        /* The cancel's signal taken (the switch's wait goes on: it is not
         * a cancellation point), then the peer switches, late. */
        asleep_for_good(1);
        ddp_mode(theirs);
    }
    joined_cancelled(t, "read after the switch");
    int r = atomic_load(&switch_r);
    if (r != (plain ? -1 : 0))
        fprintf(stderr, "the switch returned %d (errno %d)\n", r, atomic_load(&switch_errno));
    CHECK(r == (plain ? -1 : 0));
}

int main(int argc, char **argv) {
    int plain = cancel_start(argc, argv, 1);
    const char *cs = argv[1];
    if (!strcmp(cs, "switch")) {
        cancel_switch(c, s, plain);
        still_works(c, s);
    } else if (!strcmp(cs, "switchpeer")) {
        cancel_switch(s, c, plain);
        still_works(c, s);
    } else if (!strcmp(cs, "watch")) {
        cancel_watch();
    } else if (!strcmp(cs, "watchflags")) {
        cancel_watch_flags(plain);
    } else if (!strcmp(cs, "watchpartial")) {
        watch_partial(plain);
    } else if (!strcmp(cs, "watchnb")) {
        watch_nonblocking(plain);
    } else if (!strcmp(cs, "watchreq")) {
        watch_request(plain);
    } else if (!strcmp(cs, "connectwait")) {
        connect_wait(plain);
    } else if (!strcmp(cs, "switchfail")) {
        cancel_switch_fail();
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    close(c);
    close(s);
    printf("cancelswitch %s%s: ok\n", cs, plain ? " (plain)" : "");
    return 0;
}
