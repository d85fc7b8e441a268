/* pthread_cancel of a thread blocked in a call of a DDP-mode socket ends
 * the thread with PTHREAD_CANCELED, as over TCP, and leaves the socket
 * working (issue 12: the process aborted, "FATAL: exception not
 * rethrown": glibc's forced unwind started inside the library's frames).
 * One case per run: cancel CASE [plain]. Here the calls blocked on a
 * switched pair; cancels in a switch, in a residue socket's wait and a
 * connect's wait: cancelswitch.c; exit, _exit and exec with a cancel
 * pending: cancelexit.c; their shared helpers: cancelpair.h.
 *
 *   read      an 8 B read of the connecting end;
 *   waitall   an 8 B recv with MSG_WAITALL;
 *   send      32 KiB writes while the peer does not read, until one blocks
 *             (on credits and send-buffer room);
 *   poll      poll(POLLIN, no timeout) of the socket, which has 4 KiB
 *             mapped for the peer's rioread (its input is watched, so the
 *             poll stands in for the progress thread, xsock/follow.rs: the
 *             cancel must end that first; review r22-e item 3): after it,
 *             with no call of the socket running, the peer's rioread of
 *             the mapping is answered;
 *   accepted  an 8 B read of the accepted end.
 *   select    select() of the socket (its doorbell, passed on to libc's);
 *   epoll     epoll_wait() of an epoll set holding the socket (likewise).
 *   accept    accept() of a listener (plain TCP: the preload passes it on;
 *             its entry point must let glibc's unwind through);
 *   close     close() of the socket by a thread with a cancel pending (it
 *             enabled cancellation after the cancel came): cancelled before
 *             anything changes — the socket stays open and works after, as
 *             over TCP (glibc acts before its system call);
 *   stream    1 B writes while the peer reads everything (the writes never
 *             wait, never fail): cancelled at a write's start, and the
 *             peer reads the stream in order up to a marker after;
 *   self      pthread_cancel(pthread_self()), then a read with the peer's
 *             8 B there: cancelled at the read's start, and the 8 B are
 *             still there for the main thread's read;
 *   disabled  the read case with the thread's cancellation disabled and a
 *             SIGUSR1 handler without SA_RESTART in the program: the
 *             cancel's signal (the preload's) does not end the read with
 *             EINTR (over TCP no signal comes); the read returns the
 *             peer's bytes, then the thread enables cancellation and
 *             reads again: cancelled there.
 *   pending   a thread with cancellation disabled is cancelled, then
 *             enables it and polls the socket: cancelled in the poll (the
 *             cancel's signal came before it; its raw sleep would never
 *             end).
 *   udprecv   recvfrom of an offloaded UDP socket (WARPSOCK_UDP_OFFLOAD,
 *             the run's environment): its wait, the library's poll of the
 *             socket's sources; a datagram sent after is received;
 *   dup2      dup2() of another socket over the socket by a thread with a
 *             cancel pending and enabled (as in close; dup2 is no
 *             cancellation point): the socket's last close runs in the
 *             call (it closed its descriptors with libc's close, a
 *             cancellation point: the process aborted), dup2 returns and
 *             the thread is cancelled at its next cancellation point
 *             (pthread_testcancel); the peer reads the end of the stream;
 *   dup2abort the same with SO_LINGER 0 set first (an abortive close: the
 *             reset's disconnect was libc's connect); the peer reads the
 *             reset (or the end);
 *   sendfile  sendfile() to the socket from an empty pipe (the preload's
 *             send path reads the pipe: it read it with libc's read, a
 *             cancellation point inside the library, and the cancel
 *             aborted the process): cancelled in its wait for the pipe;
 *             the pipe's bytes then go out by a sendfile of the main
 *             thread. Plain: Linux refuses a pipe (EINVAL), nothing to
 *             cancel;
 *   sendfilezero  sendfile() to the socket with count 0 from an empty
 *             pipe returns 0 and from a file 0, and with an offset from
 *             an empty pipe fails with ESPIPE, each at once (review r25-a
 *             item 8: the first and last waited for the pipe). Plain: a
 *             pipe is EINVAL (Linux refuses one), the file 0, ESPIPE;
 *   jump      not a cancel: the poll case's poll, left by a siglongjmp out
 *             of a signal handler that interrupted it (it never returns to
 *             the library: its stand-in stays counted); the peer's rioread
 *             is answered all the same once the stand-in lapsed (its lease,
 *             1 s; review r22-e item 3).
 *
 * The blocked threads keep what they pass by address in static storage:
 * ASan does not unpoison the redzones of stack frames a cancellation
 * unwinds (glibc's unwinder ends in its own longjmp), and its thread exit
 * then reported a stack-buffer-underflow where a later frame reused them.
 *
 * Each: a thread blocks in the call (seen asleep in a system call, from
 * /proc), is cancelled and joined: PTHREAD_CANCELED. Then, from the main
 * thread, the socket still works both ways and nothing is lost: the
 * peer's next bytes are read, a write reaches the peer (after a cancelled
 * send: the peer reads every byte in order — the cancelled call's own
 * bytes, some or none — then the marker written after it).
 * `plain`: the same over TCP (no switch), the behaviour to match. */
#include "cancelpair.h"

#include <setjmp.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/sendfile.h>

static atomic_size_t sent;      /* send: bytes of the writes that returned */

static unsigned char pat(size_t off) { return (unsigned char)('a' + off % 26); }

#define CHUNK (32u << 10)
#define SEND_MAX (64u << 20)
static unsigned char *sendbuf;
static void *block_send(void *a) {
    (void)a;
    started();
    size_t off = 0;
    while (off + CHUNK <= SEND_MAX) {
        ssize_t r = write(victim, sendbuf + off, CHUNK);
        if (r <= 0) return returned(r);
        off += (size_t)r;
        atomic_store(&sent, off);
    }
    return returned(0);
}

/* poll(POLLIN, no timeout) of the victim: the thread's result. */
static void *poll_victim(void) {
    static struct pollfd p;
    p = (struct pollfd){victim, POLLIN, 0};
    return returned(poll(&p, 1, -1));
}

static void *block_poll(void *a) {
    (void)a;
    started();
    return poll_victim();
}

static void *block_select(void *a) {
    (void)a;
    started();
    static fd_set r;
    FD_ZERO(&r);
    FD_SET(victim, &r);
    return returned(select(victim + 1, &r, NULL, NULL, NULL));
}

static int epfd;
static void *block_epoll(void *a) {
    (void)a;
    started();
    static struct epoll_event ev;
    return returned(epoll_wait(epfd, &ev, 1, -1));
}

static atomic_int read_once; /* disabled: the first read returned */
static void *block_read_disabled(void *a) {
    (void)a;
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL) == 0);
    started();
    static char b[8];
    ssize_t r = read(victim, b, sizeof b);
    atomic_store(&ret_r, r);
    atomic_store(&ret_errno, errno);
    if (r != 8 || memcmp(b, "abcdefgh", 8) != 0) return (void *)2;
    atomic_store(&read_once, 1);
    CHECK(pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL) == 0);
    return returned(read(victim, b, sizeof b));
}

/* udprecv: a blocking recvfrom of udp_rx. */
static int udp_rx;
static void *block_udp(void *a) {
    (void)a;
    started();
    static char b[64];
    static struct sockaddr_in from;
    static socklen_t fromlen;
    fromlen = sizeof from;
    return returned(recvfrom(udp_rx, b, sizeof b, 0, (struct sockaddr *)&from, &fromlen));
}

/* sendfile: sendfile(victim, pipe's read end) of 8 bytes. */
static int sfpipe[2];
static void *block_sendfile(void *a) {
    (void)a;
    started();
    return returned(sendfile(victim, sfpipe[0], NULL, 8));
}

static void cancel_sendfile(int plain) {
    CHECK(pipe(sfpipe) == 0);
    if (plain) {
        CHECK(sendfile(c, sfpipe[0], NULL, 8) < 0 && errno == EINVAL);
    } else {
        cancel_blocked(block_sendfile);
        CHECK(write(sfpipe[1], "pipedata", 8) == 8);
        CHECK(sendfile(c, sfpipe[0], NULL, 8) == 8);
        char b[8];
        CHECK(recv(s, b, 8, MSG_WAITALL) == 8 && memcmp(b, "pipedata", 8) == 0);
    }
    close(sfpipe[0]);
    close(sfpipe[1]);
}

/* sendfilezero: sendfile(victim, sfz_in, &sfz_off (none if negative),
 * sfz_count) in a thread, for at_once. */
static int sfz_in;
static off_t sfz_off;
static size_t sfz_count;
static void *sendfile_call(void *a) {
    (void)a;
    started();
    return call_end(sendfile(victim, sfz_in, sfz_off < 0 ? NULL : &sfz_off, sfz_count));
}
static void sendfile_at_once(int in, off_t off, size_t count, long r, int e) {
    sfz_in = in;
    sfz_off = off;
    sfz_count = count;
    CHECK(at_once(sendfile_call));
    long got = atomic_load(&call_r);
    if (got != r || (r < 0 && atomic_load(&call_errno) != e))
        fprintf(stderr, "sendfile(count %zu, offset %ld) returned %ld (errno %ld)\n", count,
                (long)off, got, atomic_load(&call_errno));
    CHECK(got == r && (r >= 0 || atomic_load(&call_errno) == e));
}
static void sendfile_zero(int plain) {
    CHECK(pipe(sfpipe) == 0);
    int f = open("/proc/self/exe", O_RDONLY);
    CHECK(f >= 0);
    if (plain)
        sendfile_at_once(sfpipe[0], -1, 0, -1, EINVAL);
    else
        sendfile_at_once(sfpipe[0], -1, 0, 0, 0);
    sendfile_at_once(f, -1, 0, 0, 0);
    sendfile_at_once(sfpipe[0], 0, 8, -1, ESPIPE);
    close(f);
    close(sfpipe[0]);
    close(sfpipe[1]);
}

static void *poll_pending(void *a) {
    (void)a;
    disabled_until_go();
    return poll_victim();
}

static int lfd;
static void *block_accept(void *a) {
    (void)a;
    started();
    return returned(accept(lfd, NULL, NULL));
}

static int spare; /* dup2: the socket dup2'd over the victim */
static void *dup2_pending(void *a) {
    (void)a;
    disabled_until_go();
    int r = dup2(spare, victim);
    atomic_store(&ret_r, r);
    atomic_store(&ret_errno, errno);
    if (r != victim) return (void *)2;
    pthread_testcancel();
    return (void *)1;
}

static void *close_pending(void *a) {
    (void)a;
    disabled_until_go();
    return returned(close(victim));
}

/* Starts fn (which disables cancellation, then waits for the go:
 * disabled_until_go), cancels it, lets it go: it must end cancelled in
 * its call, named `what`. */
static void cancel_then_go(void *(*fn)(void *), const char *what) {
    CHECK(pipe(go) == 0);
    pthread_t t = start_victim(fn, 0);
    CHECK(pthread_cancel(t) == 0);
    CHECK(write(go[1], "g", 1) == 1);
    joined_cancelled(t, what);
    close(go[0]);
    close(go[1]);
}

/* dup2: `abortive` sets SO_LINGER 0 on the victim first; the peer, s,
 * then reads the reset or the end of the stream (nothing else). */
static void cancel_dup2(int abortive) {
    if (abortive) {
        struct linger l = {1, 0};
        CHECK(setsockopt(victim, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
    }
    spare = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(spare >= 0);
    cancel_then_go(dup2_pending, "dup2");
    char b[8];
    ssize_t r = read(s, b, sizeof b);
    if (r > 0 || (r < 0 && !(abortive && errno == ECONNRESET)))
        fprintf(stderr, "the peer's read returned %zd (errno %d)\n", r, errno);
    CHECK(r == 0 || (abortive && r < 0 && errno == ECONNRESET));
    close(spare);
}

static atomic_long streamed; /* stream: 1 B writes that returned */
static void *write_stream(void *a) {
    (void)a;
    started();
    static char b = 'a';
    for (;;) {
        ssize_t r = write(victim, &b, 1);
        if (r != 1) return returned(r);
        atomic_fetch_add(&streamed, 1);
    }
}

/* The peer's side of the stream case: reads 'a's up to the marker. */
static void *read_stream(void *a) {
    (void)a;
    static unsigned char b[4096];
    long got = 0;
    for (;;) {
        ssize_t r = read(s, b, sizeof b);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++) {
            if (b[i] == 'Z') {
                CHECK(i == r - 1 && got >= atomic_load(&streamed));
                return NULL;
            }
            CHECK(b[i] == 'a');
            got++;
        }
    }
}

static void cancel_stream(void) {
    pthread_t rd, wr;
    CHECK(pthread_create(&rd, NULL, read_stream, NULL) == 0);
    atomic_store(&tid, 0);
    CHECK(pthread_create(&wr, NULL, write_stream, NULL) == 0);
    long spins = 0;
    while (atomic_load(&streamed) < 1000) {
        CHECK(spins++ < 1000000000);
        sched_yield();
    }
    CHECK(pthread_cancel(wr) == 0);
    joined_cancelled(wr, "write");
    CHECK(write(c, "Z", 1) == 1);
    CHECK(pthread_join(rd, NULL) == 0);
}

static void *self_read(void *a) {
    (void)a;
    started();
    CHECK(pthread_cancel(pthread_self()) == 0);
    static char b[8];
    return returned(read(victim, b, sizeof b));
}

static void on_usr1_plain(int sig) { (void)sig; }

static void cancel_disabled(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1_plain; /* no SA_RESTART */
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    pthread_t t = start_victim(block_read_disabled, 1);
    CHECK(pthread_cancel(t) == 0);
    /* The signal that may come with it was taken (its handler ran), and
     * the read sleeps again: five looks in a row. */
    asleep_for_good(1);
    CHECK(write(s, "abcdefgh", 8) == 8);
    void *res = NULL;
    CHECK(pthread_join(t, &res) == 0);
    if (res != PTHREAD_CANCELED)
        fprintf(stderr, "the read returned %ld (errno %ld), first read done %d\n", atomic_load(&ret_r),
                atomic_load(&ret_errno), atomic_load(&read_once));
    CHECK(res == PTHREAD_CANCELED && atomic_load(&read_once) == 1);
}

static sigjmp_buf jump_env;
static void on_usr1(int sig) {
    (void)sig;
    siglongjmp(jump_env, 1);
}

static void *jump_poll(void *a) {
    (void)a;
    if (sigsetjmp(jump_env, 1) == 0) {
        started();
        struct pollfd p = {victim, POLLIN, 0};
        return returned(poll(&p, 1, -1));
    }
    return NULL; /* jumped out */
}

/* Starts jump_poll and, once it sleeps, signals it: it jumps out. */
static void jump_out(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    pthread_t t = start_victim(jump_poll, 1);
    CHECK(pthread_kill(t, SIGUSR1) == 0);
    void *res = (void *)1;
    CHECK(pthread_join(t, &res) == 0);
    if (res != NULL)
        fprintf(stderr, "the poll returned %ld (errno %ld)\n", atomic_load(&ret_r), atomic_load(&ret_errno));
    CHECK(res == NULL);
}

/* udprecv: a blocking recvfrom of an offloaded UDP socket is cancelled;
 * a datagram sent after is received. */
static void cancel_udp_recv(void) {
    udp_rx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(udp_rx >= 0);
    struct sockaddr_in a = lo(0);
    socklen_t alen = sizeof a;
    CHECK(bind(udp_rx, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(udp_rx, (struct sockaddr *)&a, &alen) == 0);
    cancel_blocked(block_udp);
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(tx >= 0);
    CHECK(sendto(tx, "datagram", 8, 0, (struct sockaddr *)&a, sizeof a) == 8);
    char b[16];
    CHECK(recv(udp_rx, b, sizeof b, 0) == 8 && memcmp(b, "datagram", 8) == 0);
    close(tx);
    close(udp_rx);
}

static void *write_marker(void *a) {
    (void)a;
    CHECK(write(c, "\n", 1) == 1);
    return NULL;
}

/* After a cancelled send: another thread writes a marker ('\n', never in
 * the pattern; it waits for room, the send buffer full), and the peer
 * reads the stream in order up to it: at least what the returned writes
 * sent. */
static void drain_to_marker(void) {
    pthread_t w;
    CHECK(pthread_create(&w, NULL, write_marker, NULL) == 0);
    size_t got = 0;
    unsigned char *b = malloc(1 << 16);
    CHECK(b != NULL);
    for (;;) {
        ssize_t r = read(s, b, 1 << 16);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++) {
            if (b[i] == '\n') {
                CHECK(i == r - 1);
                CHECK(got >= atomic_load(&sent));
                fprintf(stderr, "peer read %zu bytes (%zu from returned writes), then the marker\n",
                        got, atomic_load(&sent));
                free(b);
                CHECK(pthread_join(w, NULL) == 0);
                return;
            }
            CHECK(b[i] == pat(got));
            got++;
        }
    }
}

/* The extended calls, of the preloaded library. */
static void *sym(const char *name) { return preload_sym("cancel", name); }

/* The poll case's mapping: 4 KiB of c's, the peer's rioread of it. */
#define MAP_OFF 4096
#define MAP_LEN 4096
static unsigned char *mapped;

static void map_for_peer(void) {
    mapped = malloc(MAP_LEN);
    CHECK(mapped != NULL);
    for (size_t i = 0; i < MAP_LEN; i++) mapped[i] = pat(i + 7);
    off_t (*riomap)(int, void *, size_t, int, int, off_t) = sym("warpsock_riomap");
    CHECK(riomap(c, mapped, MAP_LEN, PROT_READ, 0, MAP_OFF) == MAP_OFF);
    /* The peer knows the mapping once it read bytes sent after it. */
    CHECK(write(c, "M", 1) == 1);
    char b;
    CHECK(read(s, &b, 1) == 1 && b == 'M');
}

/* map_for_peer undone. */
static void unmap_for_peer(void) {
    int (*riounmap)(int, void *, size_t) = sym("warpsock_riounmap");
    CHECK(riounmap(c, mapped, MAP_LEN) == 0);
}

/* With no call of c running, the peer's rioread is answered by c's
 * progress thread, which watches c's input only if no standing poll is
 * counted: a cancelled poll that left its stand-in counted made this
 * wait for ever (review r22-e item 3; the run's timeout fails it). */
static void peer_reads_mapping(void) {
    unsigned char back[MAP_LEN];
    ssize_t (*rioread)(int, void *, size_t, off_t, int) = sym("warpsock_rioread");
    CHECK(rioread(s, back, MAP_LEN, MAP_OFF, 0) == MAP_LEN);
    for (size_t i = 0; i < MAP_LEN; i++) CHECK(back[i] == pat(i + 7));
}

int main(int argc, char **argv) {
    int plain = cancel_start(argc, argv, 0);
    const char *cs = argv[1];
    if (!strcmp(cs, "read")) {
        cancel_blocked(block_read);
        still_works(c, s);
    } else if (!strcmp(cs, "waitall")) {
        cancel_blocked(block_waitall);
        still_works(c, s);
    } else if (!strcmp(cs, "accepted")) {
        victim = s;
        cancel_blocked(block_read);
        still_works(s, c);
    } else if (!strcmp(cs, "send")) {
        sendbuf = malloc(SEND_MAX);
        CHECK(sendbuf != NULL);
        for (size_t i = 0; i < SEND_MAX; i++) sendbuf[i] = pat(i);
        cancel_blocked(block_send);
        drain_to_marker();
        free(sendbuf);
        still_works(c, s);
    } else if (!strcmp(cs, "select")) {
        cancel_blocked(block_select);
        still_works(c, s);
    } else if (!strcmp(cs, "epoll")) {
        epfd = epoll_create1(0);
        CHECK(epfd >= 0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
        CHECK(epoll_ctl(epfd, EPOLL_CTL_ADD, c, &ev) == 0);
        cancel_blocked(block_epoll);
        still_works(c, s);
        close(epfd);
    } else if (!strcmp(cs, "pending")) {
        cancel_then_go(poll_pending, "poll");
        still_works(c, s);
    } else if (!strcmp(cs, "accept")) {
        lfd = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(lfd >= 0);
        struct sockaddr_in la = lo(0);
        CHECK(bind(lfd, (struct sockaddr *)&la, sizeof la) == 0);
        CHECK(listen(lfd, 1) == 0);
        cancel_blocked(block_accept);
        close(lfd);
        still_works(c, s);
    } else if (!strcmp(cs, "close")) {
        cancel_then_go(close_pending, "call");
        still_works(c, s);
    } else if (!strcmp(cs, "stream")) {
        cancel_stream();
        still_works(c, s);
    } else if (!strcmp(cs, "self")) {
        CHECK(write(s, "selfself", 8) == 8);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, self_read, NULL) == 0);
        joined_cancelled(t, "read");
        char b[8];
        CHECK(recv(c, b, 8, MSG_WAITALL) == 8 && memcmp(b, "selfself", 8) == 0);
        /* And with nothing there: cancelled all the same. */
        CHECK(pthread_create(&t, NULL, self_read, NULL) == 0);
        joined_cancelled(t, "read");
        still_works(c, s);
    } else if (!strcmp(cs, "disabled")) {
        cancel_disabled();
        still_works(c, s);
    } else if (!strcmp(cs, "dup2") || !strcmp(cs, "dup2abort")) {
        cancel_dup2(!strcmp(cs, "dup2abort"));
    } else if (!strcmp(cs, "sendfile")) {
        cancel_sendfile(plain);
        still_works(c, s);
    } else if (!strcmp(cs, "sendfilezero")) {
        sendfile_zero(plain);
        still_works(c, s);
    } else if (!strcmp(cs, "udprecv")) {
        cancel_udp_recv();
        still_works(c, s);
    } else if (!strcmp(cs, "jump") || !strcmp(cs, "poll")) {
        if (!plain) map_for_peer();
        if (!strcmp(cs, "jump")) {
            jump_out();
        } else {
            cancel_blocked(block_poll);
        }
        if (!plain) peer_reads_mapping();
        still_works(c, s);
        if (!plain) unmap_for_peer();
        free(mapped);
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    close(c);
    close(s);
    printf("cancel %s%s: ok\n", cs, plain ? " (plain)" : "");
    return 0;
}
