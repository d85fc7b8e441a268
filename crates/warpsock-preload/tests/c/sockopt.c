/* Socket options and the busy-polling fast path on DDP-mode sockets
 * (issue 12; review r22-c). One case per run: sockopt CASE [plain]
 * ("plain": both ends stay TCP, to check the case against Linux's TCP).
 *
 *   rcvlowat    SO_RCVLOWAT 1024 set before and after the switch (read
 *               back as 1024); 100 round trips of 8 B whose reader
 *               busy-polls with MSG_DONTWAIT: each answer arrives (a
 *               non-blocking TCP read ignores the low-water mark). The
 *               option set on the engine's TCP socket (the same kernel
 *               socket) made its readiness check report nothing below the
 *               mark, and the spin answered EAGAIN for ever (r22-c item 1).
 *   blockafter  three MSG_DONTWAIT reads fail with EAGAIN (the socket
 *               becomes quiet: the lock-free EAGAIN), then a blocking read
 *               must wait for the peer's 8 B, which it sends only after a
 *               pipe byte written just before that read, once the read
 *               sleeps (/proc/self/task/TID/syscall) (r22-c item 3).
 *   soerror     the peer (a forked child) is killed with the program's 8 B
 *               unread in its kernel socket (a reset, no FIN) while the
 *               program makes no call; once the program's kernel socket
 *               has left ESTABLISHED (/proc/net/tcp), getsockopt(SO_ERROR)
 *               gives ECONNRESET, a second one 0, and recv 0 (Linux's TCP:
 *               sock_error clears sk_err as it reports it; the socket is
 *               shut both ways). Then send fails with EPIPE.
 *   soerrpoll   the same after a poll (POLLIN: the library's round takes
 *               the reset in before SO_ERROR): reported once, as above.
 *   soerrrecv   after a poll, recv fails with ECONNRESET, then SO_ERROR
 *               gives 0, recv 0, send EPIPE.
 *   soerrhup    as soerrrecv with a zero-timeout poll (POLLIN|POLLRDHUP)
 *               before and after the read: TCP shows POLLIN|POLLERR|
 *               POLLHUP|POLLRDHUP, then without POLLERR once the read took
 *               the error (review r22-e item 6); a DDP-mode socket the
 *               same.
 *   abort       SO_LINGER {1, 0} then close() after one echoed message: the
 *               peer's blocking read fails with ECONNRESET at once, as
 *               TCP's abortive close resets the connection (no end of
 *               stream first: the read got 0, the reset came after).
 *   abortdup    abort's close on one of two descriptors (dup) of the socket:
 *               nothing reaches the peer (a message sent through the other
 *               arrives after it); the close of the second resets (review
 *               r23-a item 8).
 *   abortbefore SO_LINGER {1, 0} set before the switch, then abort's close.
 *   abortunread the peer's 8 B received and never read, then abort's close:
 *               the peer's read fails with ECONNRESET.
 *   abortshut   shutdown(SHUT_WR) (the peer reads 8 B, then end of stream),
 *               then SO_LINGER {1, 0} and close: once the peer's kernel
 *               socket has left CLOSE_WAIT, Linux's peer reads 0 (its
 *               stream ended before the reset) and its send fails with EPIPE
 *               (tcp_reset in CLOSE_WAIT sets EPIPE).
 *   abortblocked  a thread blocked in recv(c), then SO_LINGER {1, 0} and
 *               close(c) from another: as Linux (the blocked read holds the
 *               file; the close acts as it returns), the read goes on and
 *               returns the 8 B the peer sends after the close, and only
 *               then is the connection reset (the peer's read:
 *               ECONNRESET). Review r23-a item 4: the reset came at once,
 *               and the blocked read failed.
 *   closeblocked  the same with an orderly close: the read returns the
 *               peer's 8 B, then the peer reads end of stream.
 *   execarmed   (a test-hooks build: WARPSOCK_TEST_EXEC_ARMED_FD; not in
 *               test-xsock.sh) a send buffer the peer does not read, an
 *               exec that fails (its wait gives up, WARPSOCK_LINGER_MS, and
 *               marks the connection SO_LINGER {1, 0} for its close),
 *               and, in that window, an orderly close from another thread:
 *               once the exec returned the peer reads every byte, then end
 *               of stream (review r23-a item 10: the close took the
 *               library's mark for the program's abortive close and reset
 *               the connection).
 *   closeunread an orderly close() (no SO_LINGER) with the peer's 8 B
 *               received (poll said POLLIN) and never read: the peer's
 *               blocking read fails with ECONNRESET, as TCP's close resets
 *               when data was left unread (RFC 2525 2.17; review r23-a
 *               item 9: the DDP close ended the stream cleanly, read 0).
 *   closeheld   the same, this end in message mode (WARPSOCK_MSG_MODE)
 *               and the peer's bytes the start of a message larger than
 *               the window (its end has not come), seen by FIONREAD: the
 *               part held in the receive slots is received bytes, as in
 *               TCP's receive queue: the close resets.
 *   stamps      SO_TIMESTAMPING (TX_SOFTWARE|SOFTWARE) and IP_RECVERR set
 *               before the switch, SO_TIMESTAMPING (| OPT_TSONLY) and
 *               SO_TIMESTAMPNS after it, each read back; 2,000 8 B sends
 *               the peer reads. Over TCP the socket's error queue then
 *               holds transmit stamps (the kernel makes them as each
 *               packet passes loopback's device). A DDP-mode socket keeps
 *               the options without applying them (r22-e item 2):
 *               recvmsg(MSG_ERRQUEUE) fails with EAGAIN, and the engine's
 *               TCP socket (found among the process's descriptors: the
 *               one with the DDP socket's addresses) has them off and an
 *               empty error queue (set there, stamps filled it, charged to
 *               the engine's receive space).
 *   latestamps  on the switch's initiator (the end with the lower port),
 *               stamps (TX_SOFTWARE|TX_ACK|OPT_ID|OPT_TSONLY) on, then
 *               1 KiB sends until EAGAIN into a peer that reads nothing
 *               (both SO_RCVBUF small): most wait unsent behind its closed
 *               window, their stamps to come. Then both ends switch: the
 *               peer's switch reads them (its residue) before it marks,
 *               the window opens and their stamps reach the initiator's
 *               kernel socket while it waits for that mark, after the
 *               options went off (review r23-a item 2). The switch must
 *               succeed (that wait took POLLERR with nothing to read for
 *               the end of stream: ECONNREFUSED), the engine's TCP
 *               socket's error queue must be empty right after it (left,
 *               POLLERR for good: the progress thread spun), and the peer
 *               reads every byte. Over TCP the error queue holds stamps.
 *   emfile      after one switched pair: pairs whose peer (a forked child)
 *               switches and sends 8 B, switched here with RLIMIT_NOFILE
 *               leaving k = 0, 3, 6... descriptor numbers free, until one
 *               switches (its 8 B read). A switch that could run out of
 *               descriptors is declined before its handshake (session
 *               39): it fails with EMFILE and the connection is a working
 *               TCP socket — the peer's 8 B (sent after its own switch
 *               timed out) arrive, and our answer is sent. Before, it ran
 *               out after it committed and had to reset the connection
 *               (review r23-a item 3: never the peer's framing as bytes).
 *   emfilecommit  an initiator whose table fills after its mark (RLIMIT_NOFILE
 *               leaving 3 numbers free, its forked peer told to switch
 *               only then) withdraws before its MPA Request: EMFILE, and
 *               the connection is a working TCP socket both ways. Before,
 *               it committed, ran out and reset the connection.
 *   stampopts   a sequence of SO_TIMESTAMP(NS)(_NEW), SO_TIMESTAMPING(_NEW),
 *               IP_RECVERR and IPV6_RECVERR sets, each followed by every
 *               one's read-back (SO_ZEROCOPY's too), printed: the DDP-mode
 *               socket's lines must be plain TCP's (ddp_sockopt.rs).
 *   stampsbefore  sets of SO_TIMESTAMP(NS)(_NEW) and SO_TIMESTAMPING(_NEW)
 *               made before the switch, each on a pair of its own, then
 *               every option's read-back after it printed (stampopts makes
 *               its sets after the switch); the last two's switch fails
 *               (the peer ends its stream instead) and the read-backs are
 *               the TCP socket's again, the values put back: the lines
 *               must be plain TCP's (review r23-a item 5: a
 *               SO_TIMESTAMPING_NEW alone read 0 after the switch, and a
 *               failed switch turned the _NEW forms into the old ones).
 *   stampstruct SO_TIMESTAMPING(_NEW) sets after the switch as an int and
 *               as struct so_timestamping (8 bytes: flags, bind_phc), with
 *               flags Linux refuses (EINVAL: a bit beyond its mask,
 *               OPT_ID_TCP without OPT_ID, OPT_STATS without OPT_TSONLY, a
 *               length under 4; BIND_PHC unbound: EOPNOTSUPP), then OPT_ID
 *               turned on after the peer reset the connection (EINVAL: the
 *               socket is TCP_CLOSE; kept on, accepted), each followed by
 *               both names' read-backs at lengths 4, 8 and 12: the lines
 *               must be plain TCP's.
 *   stampkey    on the responder (the higher port), SO_TIMESTAMPING with
 *               OPT_ID|TX_ACK before any byte; 8 B sent and acknowledged
 *               (their stamp's key 7), then a switch the peer does not
 *               make (it ends its stream: the switch fails, the options
 *               are put back), then 8 B more: their key must be 15, as
 *               over TCP (the key was not started again at the put-back).
 *   errqueueopts  IP_RECVERR and SO_TIMESTAMPING without transmit flags
 *               on, round trips, then the peer's 8 B unread:
 *               recvmsg(MSG_ERRQUEUE) answers EAGAIN and poll shows POLLIN
 *               without POLLERR, as TCP's (no entry of the program's can
 *               reach the engine's socket: see read_polled in
 *               warpsock-engine's driver/rx.rs); the lines must be TCP's.
 *   zerocopy    SO_ZEROCOPY after the switch: TCP takes it and each of 3
 *               MSG_ZEROCOPY sends gets its notice (ids 0..2, POLLERR
 *               first); a DDP-mode socket, which would never give one,
 *               refuses it with EOPNOTSUPP as a socket without zero copy
 *               (reads 0), and its MSG_ZEROCOPY sends are plain ones.
 *               Then a second pair with SO_ZEROCOPY set before the switch:
 *               the switch is refused (EOPNOTSUPP) and the connection,
 *               plain TCP, gets the notices (review r23-a item 1).
 *   oobinline   SO_OOBINLINE on: the switch is refused (EOPNOTSUPP) before
 *               anything is sent, the connection plain TCP both ways.
 *
 * Synchronised on events (pipes, the peer's bytes), no sleeps; every loop
 * bounded. */
#include "ddppair.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>

static int c, s;
static int plain;
static int gpipe[2]; /* main -> peer: go */

#define ROUNDS 100
/* A spin's bound: far beyond any wait for a scheduled peer (it yields
 * between tries), reached only if the answer never comes. */
#define SPINS 20000000L

static void switch_end(int fd) {
    if (!plain) ddp_mode(fd);
}

static void read8(int fd, char *b) {
    size_t got = 0;
    while (got < 8) {
        ssize_t r = read(fd, b + got, 8 - got);
        CHECK(r > 0);
        got += (size_t)r;
    }
}

static void *peer_echo(void *a) {
    (void)a;
    switch_end(s);
    char b[8];
    for (int i = 0; i < ROUNDS; i++) {
        read8(s, b);
        CHECK(write(s, b, 8) == 8);
    }
    return NULL;
}

static void case_rcvlowat(void) {
    set_sol_int(c, SO_RCVLOWAT, 1024);
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_echo, NULL) == 0);
    switch_end(c);
    CHECK(sol_int(c, SO_RCVLOWAT) == 1024);
    set_sol_int(c, SO_RCVLOWAT, 1024);
    CHECK(sol_int(c, SO_RCVLOWAT) == 1024);
    for (int i = 0; i < ROUNDS; i++) {
        char m[8], b[8];
        memset(m, 'a' + i % 26, 8);
        CHECK(write(c, m, 8) == 8);
        size_t got = 0;
        long k = 0;
        while (got < 8) {
            CHECK(k++ < SPINS);
            ssize_t r = recv(c, b + got, 8 - got, MSG_DONTWAIT);
            if (r < 0) {
                CHECK(errno == EAGAIN);
                sched_yield();
                continue;
            }
            CHECK(r > 0);
            got += (size_t)r;
        }
        CHECK(memcmp(m, b, 8) == 0);
    }
    CHECK(sol_int(c, SO_RCVLOWAT) == 1024);
    pthread_join(pt, NULL);
}

static pid_t main_tid;
static atomic_int main_done; /* the blocking read returned */

static void *peer_after_go(void *a) {
    (void)a;
    switch_end(s);
    char b[8];
    read8(s, b); /* the first message */
    CHECK(write(s, b, 8) == 8);
    char g;
    CHECK(read(gpipe[0], &g, 1) == 1);
    /* Only once the blocking read sleeps (or returned: a read that did
     * not block fails its check). */
    for (long k = 0; !thread_asleep(main_tid) && !atomic_load(&main_done); k++) {
        CHECK(k < 10000000);
        sched_yield();
    }
    CHECK(write(s, "abcdefgh", 8) == 8);
    return NULL;
}

static void case_blockafter(void) {
    CHECK(pipe(gpipe) == 0);
    main_tid = (pid_t)syscall(SYS_gettid);
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_after_go, NULL) == 0);
    switch_end(c);
    char b[8];
    CHECK(write(c, "12345678", 8) == 8);
    read8(c, b);
    CHECK(memcmp(b, "12345678", 8) == 0);
    for (int i = 0; i < 3; i++) CHECK(recv(c, b, 8, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    char g = 1;
    CHECK(write(gpipe[1], &g, 1) == 1);
    ssize_t r = recv(c, b, 8, 0);
    atomic_store(&main_done, 1);
    CHECK(r > 0);
    size_t got = (size_t)r;
    while (got < 8) {
        r = recv(c, b + got, 8 - got, 0);
        CHECK(r > 0);
        got += (size_t)r;
    }
    CHECK(memcmp(b, "abcdefgh", 8) == 0);
    pthread_join(pt, NULL);
}

/* The kernel's TCP socket of local port `lport` and remote port `rport`
 * in /proc/net/tcp: its state (0: none), and its receive queue's bytes. */
static int tcp_entry(int lport, int rport, unsigned *rxq) {
    FILE *f = fopen("/proc/net/tcp", "r");
    CHECK(f != NULL);
    char line[512];
    int state = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned lp, rp, st, tx, rx;
        if (sscanf(line, " %*d: %*8x:%x %*8x:%x %x %x:%x", &lp, &rp, &st, &tx, &rx) == 5 &&
            (int)lp == lport && (int)rp == rport) {
            state = (int)st;
            if (rxq) *rxq = rx;
        }
    }
    fclose(f);
    return state;
}

static int port_of(int fd, int peer) {
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    CHECK((peer ? getpeername : getsockname)(fd, (struct sockaddr *)&a, &alen) == 0);
    return ntohs(a.sin_port);
}

#define TCP_ESTABLISHED_ 1

/* first: 0 nothing before SO_ERROR; 1 a poll first (the library's round
 * takes the reset in); 2 a poll, then the reads report it. */
static void case_soerror(int first) {
    int cport = port_of(c, 0), sport = port_of(c, 1);
    int hold[2];
    CHECK(pipe(hold) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The peer: switches, echoes one message, then makes no call on
         * the socket (what arrives stays unread) until it is killed. */
        close(c);
        close(hold[1]);
        switch_end(s);
        char b[8];
        read8(s, b);
        CHECK(write(s, b, 8) == 8);
        char k;
        (void)!read(hold[0], &k, 1);
        _exit(3);
    }
    close(hold[0]);
    close(s);
    s = -1;
    switch_end(c);
    char b[8];
    CHECK(write(c, "12345678", 8) == 8);
    read8(c, b);
    CHECK(sol_int(c, SO_ERROR) == 0);
    /* Unread at the peer when it dies: its kernel resets the connection
     * (tcp_close with unread data), no FIN first. */
    CHECK(write(c, "unread!!", 8) == 8);
    unsigned rxq = 0;
    for (long k = 0; tcp_entry(sport, cport, &rxq) == TCP_ESTABLISHED_ && rxq == 0; k++) {
        CHECK(k < 1000000);
        sched_yield();
    }
    CHECK(kill(pid, SIGKILL) == 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    for (long k = 0; tcp_entry(cport, sport, NULL) == TCP_ESTABLISHED_; k++) {
        CHECK(k < 1000000);
        sched_yield();
    }
    ssize_t r;
    if (first > 0) {
        struct pollfd p = {c, POLLIN, 0};
        CHECK(poll(&p, 1, -1) == 1 && (p.revents & POLLIN));
    }
    if (first == 3) {
        struct pollfd p = {c, POLLIN | POLLRDHUP, 0};
        CHECK(poll(&p, 1, 0) == 1);
        fprintf(stderr, "soerror: poll before the read 0x%x\n", p.revents);
        /* POLLERR until the error is taken (a DDP-mode socket too). */
        CHECK(p.revents == (POLLIN | POLLERR | POLLHUP | POLLRDHUP));
    }
    if (first >= 2) {
        r = recv(c, b, 8, 0);
        fprintf(stderr, "soerror: recv %zd errno %d\n", r, r < 0 ? errno : 0);
        CHECK(r == -1 && errno == ECONNRESET);
    } else {
        int e = sol_int(c, SO_ERROR);
        fprintf(stderr, "soerror: SO_ERROR %d\n", e);
        CHECK(e == ECONNRESET);
    }
    if (first == 3) {
        struct pollfd p = {c, POLLIN | POLLRDHUP, 0};
        CHECK(poll(&p, 1, 0) == 1);
        fprintf(stderr, "soerror: poll after the read 0x%x\n", p.revents);
        CHECK(p.revents == (POLLIN | POLLHUP | POLLRDHUP));
    }
    CHECK(sol_int(c, SO_ERROR) == 0);
    r = recv(c, b, 8, 0);
    fprintf(stderr, "soerror: recv %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(r == 0);
    CHECK(sol_int(c, SO_ERROR) == 0);
    r = send(c, "x", 1, MSG_NOSIGNAL);
    fprintf(stderr, "soerror: send %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(r == -1 && errno == EPIPE);
    close(hold[1]);
}


/* Another descriptor of the process on the TCP socket under fd: the one
 * whose local and peer addresses are fd's (a DDP-mode socket's names are
 * its TCP socket's, which the engine holds); -1 if none (plain TCP). */
static int tcp_under(int fd) {
    struct sockaddr_in a, pa;
    socklen_t alen = sizeof a, plen = sizeof pa;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    CHECK(getpeername(fd, (struct sockaddr *)&pa, &plen) == 0);
    /* Up to the soft limit: the library's descriptors live from half of
     * it up (warpsock_engine::fds). */
    struct rlimit l;
    CHECK(getrlimit(RLIMIT_NOFILE, &l) == 0);
    int end = l.rlim_cur > 65536 ? 65536 : (int)l.rlim_cur;
    for (int k = 3; k < end; k++) {
        struct stat st;
        struct sockaddr_in b, pb;
        socklen_t blen = sizeof b, pblen = sizeof pb;
        if (k == fd || fstat(k, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        if (getsockname(k, (struct sockaddr *)&b, &blen) == 0 && blen == alen &&
            !memcmp(&a, &b, sizeof a) && getpeername(k, (struct sockaddr *)&pb, &pblen) == 0 &&
            pblen == plen && !memcmp(&pa, &pb, sizeof pa))
            return k;
    }
    return -1;
}

static int opt_int(int fd, int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, level, name, &v, &len) == 0 && len == sizeof v);
    return v;
}

/* One entry of fd's error queue taken without waiting: 1, or 0 if empty
 * (EAGAIN). */
static int errqueue_entry(int fd) {
    if (recv_errqueue(fd, MSG_DONTWAIT) < 0) {
        CHECK(errno == EAGAIN);
        return 0;
    }
    return 1;
}

#define STAMP_SENDS 2000

static void *peer_switch(void *a) {
    (void)a;
    switch_end(s);
    return NULL;
}

/* Both ends switched (unless plain): c here, s in a thread. */
static void switch_both(void) {
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_switch, NULL) == 0);
    switch_end(c);
    CHECK(pthread_join(pt, NULL) == 0);
}

/* Non-blocking sends of `chunk` (n bytes) on fd until one finds no room
 * (EAGAIN): the bytes sent. */
static size_t fill_send(int fd, const char *chunk, size_t n) {
    size_t sent = 0;
    for (int i = 0;; i++) {
        CHECK(i < 100000);
        ssize_t r = send_nb(fd, chunk, n);
        if (r < 0) return sent;
        sent += (size_t)r;
    }
}

static void *peer_sink8(void *a) {
    (void)a;
    switch_end(s);
    size_t got = 0;
    recv_until(s, &got, STAMP_SENDS * 8, NULL);
    return NULL;
}

#include "sockopt_switch.h"

/* The peer's next read must fail with ECONNRESET (`what`: the case, in
 * its line). */
static void peer_read_reset(const char *what) {
    char b[8];
    ssize_t r = read(s, b, 8);
    fprintf(stderr, "%s: the peer's read %zd errno %d\n", what, r, r < 0 ? errno : 0);
    CHECK(r == -1 && errno == ECONNRESET);
}

/* The peer of abort and abortbefore: switches, reads 8 B and echoes them,
 * then its read must fail with ECONNRESET. */
static void *peer_abort_read(void *a) {
    (void)a;
    switch_end(s);
    char b[8];
    read8(s, b);
    CHECK(write(s, b, 8) == 8);
    peer_read_reset("abort");
    return NULL;
}

/* The peer of closeunread and abortunread (`a`: the case's name in its
 * line): switches and sends 8 B, never read, then its read must fail with
 * ECONNRESET. */
static void *peer_unread(void *a) {
    switch_end(s);
    CHECK(write(s, "unread!!", 8) == 8);
    peer_read_reset(a);
    return NULL;
}

static void linger_abortive(int fd) {
    struct linger l = {1, 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
}

static void abort_close(int fd) {
    linger_abortive(fd);
    CHECK(close(fd) == 0);
}

/* close(fd), abortive (abort_close) or orderly. */
static void close_as(int fd, int abortive) {
    if (abortive) {
        abort_close(fd);
    } else {
        CHECK(close(fd) == 0);
    }
}

/* closeunread (orderly) and abortunread: the close with the peer's 8 B
 * received (poll said POLLIN) and never read. */
static void case_unread(int abortive) {
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_unread, abortive ? "abort" : "closeunread") == 0);
    switch_end(c);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, -1) == 1 && (p.revents & POLLIN));
    close_as(c, abortive);
    c = -1;
    CHECK(pthread_join(pt, NULL) == 0);
}

/* The peer of closeheld: switches and sends, non-blocking, the start of
 * a message larger than the window (and the send buffer), never read;
 * then its read must fail with ECONNRESET. */
static void *peer_held(void *a) {
    (void)a;
    switch_end(s);
    static unsigned char big[4 << 20];
    CHECK(send_nb(s, big, sizeof big) > 0);
    peer_read_reset("closeheld");
    return NULL;
}

/* closeheld: an orderly close with a message's part received (FIONREAD
 * counts it; no poll need say POLLIN for it) and never read. */
static void case_closeheld(void) {
    if (!plain) {
        int one = 1;
        CHECK(setsockopt(c, SOL_WARPSOCK, WARPSOCK_MSG_MODE, &one, sizeof one) == 0);
    }
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_held, NULL) == 0);
    switch_end(c);
    /* A look every millisecond, 20 s at most. */
    int n = 0;
    for (int k = 0; n == 0; k++) {
        CHECK(k < 20000);
        CHECK(ioctl(c, FIONREAD, &n) == 0);
        if (n == 0) poll(NULL, 0, 1);
    }
    CHECK(close(c) == 0);
    c = -1;
    CHECK(pthread_join(pt, NULL) == 0);
}

static void *peer_dup(void *a) {
    (void)a;
    switch_end(s);
    /* Its switch is done (a reset during it would fail it). */
    CHECK(write(s, "switched", 8) == 8);
    char b[8];
    read8(s, b);
    CHECK(memcmp(b, "afterdup", 8) == 0);
    peer_read_reset("abortdup");
    return NULL;
}

static void case_abortdup(void) {
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_dup, NULL) == 0);
    switch_end(c);
    char b[8];
    read8(c, b);
    int d = dup(c);
    CHECK(d >= 0);
    abort_close(c);
    c = -1;
    /* The connection lives on through d: the peer reads this first. */
    CHECK(write(d, "afterdup", 8) == 8);
    CHECK(close(d) == 0);
    CHECK(pthread_join(pt, NULL) == 0);
}

/* abort, and abortbefore (`before`: SO_LINGER {1, 0} set before the
 * switch): the abortive close after one echoed message. */
static void case_abort(int before) {
    if (before) linger_abortive(c);
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_abort_read, NULL) == 0);
    switch_end(c);
    char b[8];
    CHECK(write(c, "12345678", 8) == 8);
    read8(c, b);
    close_as(c, !before);
    c = -1;
    CHECK(pthread_join(pt, NULL) == 0);
}

#define TCP_CLOSE_WAIT_ 8

static void case_abortshut(void) {
    int cport = port_of(c, 0), sport = port_of(c, 1);
    int go[2];
    CHECK(pipe(go) == 0);
    switch_both();
    CHECK(write(c, "12345678", 8) == 8);
    CHECK(shutdown(c, SHUT_WR) == 0);
    char b[8];
    read8(s, b);
    CHECK(read(s, b, 8) == 0);
    /* TCP: the peer's kernel socket in CLOSE_WAIT (the FIN came; a DDP
     * stream's end is a message), then the reset, which takes it out of
     * the table (CLOSE). */
    for (long k = 0; plain && tcp_entry(sport, cport, NULL) != TCP_CLOSE_WAIT_; k++) {
        CHECK(k < 100000);
        sched_yield();
    }
    abort_close(c);
    c = -1;
    for (long k = 0; tcp_entry(sport, cport, NULL) != 0; k++) {
        CHECK(k < 100000);
        sched_yield();
    }
    ssize_t r = read(s, b, 8);
    fprintf(stderr, "abortshut: the peer's read %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(r == 0);
    r = send(s, "x", 1, MSG_NOSIGNAL);
    fprintf(stderr, "abortshut: the peer's send %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(r == -1 && errno == EPIPE);
    close(go[0]);
    close(go[1]);
}

static pid_t blocked_tid;
static int blocked_go[2]; /* main -> peer: the close is made */

static void *blocked_reader(void *a) {
    (void)a;
    blocked_tid = (pid_t)syscall(SYS_gettid);
    char b[8];
    /* recv: a recvfrom system call over TCP too (thread_asleep). */
    ssize_t r = recv(c, b, 8, 0);
    fprintf(stderr, "blocked: the blocked read %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(r > 0 && memcmp(b, "wakeup!!", (size_t)r) == 0);
    return NULL;
}

static void *peer_after_close(void *a) {
    int abortive = *(int *)a;
    switch_end(s);
    CHECK(write(s, "switched", 8) == 8);
    char g, b[8];
    CHECK(read(blocked_go[0], &g, 1) == 1);
    CHECK(write(s, "wakeup!!", 8) == 8);
    ssize_t r = read(s, b, 8);
    fprintf(stderr, "blocked: the peer's read %zd errno %d\n", r, r < 0 ? errno : 0);
    CHECK(abortive ? r == -1 && errno == ECONNRESET : r == 0);
    return NULL;
}

static void case_blocked(int abortive) {
    CHECK(pipe(blocked_go) == 0);
    pthread_t pt, bt;
    CHECK(pthread_create(&pt, NULL, peer_after_close, &abortive) == 0);
    switch_end(c);
    char b[8];
    read8(c, b);
    CHECK(pthread_create(&bt, NULL, blocked_reader, NULL) == 0);
    for (long k = 0; !blocked_tid || !thread_asleep(blocked_tid); k++) {
        CHECK(k < 10000000);
        sched_yield();
    }
    close_as(c, abortive);
    CHECK(write(blocked_go[1], "g", 1) == 1);
    CHECK(pthread_join(bt, NULL) == 0);
    c = -1;
    CHECK(pthread_join(pt, NULL) == 0);
}

static int exec_hook[2]; /* the library's hook <-> the closing thread */
static int exec_go[2];   /* main -> peer: read now */
static size_t exec_sent;

static void *closer_in_exec(void *a) {
    (void)a;
    char g;
    CHECK(read(exec_hook[0], &g, 1) == 1);
    CHECK(close(c) == 0);
    CHECK(write(exec_hook[0], "g", 1) == 1);
    return NULL;
}

static void *peer_exec(void *a) {
    (void)a;
    switch_end(s);
    CHECK(write(s, "switched", 8) == 8);
    char g, b[8];
    CHECK(read(exec_go[0], &g, 1) == 1);
    size_t got = 0;
    recv_until(s, &got, exec_sent, NULL);
    ssize_t r = read(s, b, 8);
    fprintf(stderr, "execarmed: the peer read %zu, then %zd errno %d\n", got, r, r < 0 ? errno : 0);
    CHECK(r == 0);
    return NULL;
}

static void case_execarmed(void) {
    CHECK(pipe(exec_go) == 0);
    pthread_t pt, ct;
    CHECK(pthread_create(&pt, NULL, peer_exec, NULL) == 0);
    switch_end(c);
    char b[8];
    read8(c, b);
    static char chunk[4096];
    memset(chunk, 'e', sizeof chunk);
    exec_sent += fill_send(c, chunk, sizeof chunk);
    if (!plain) {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, exec_hook) == 0);
        char v[16];
        snprintf(v, sizeof v, "%d", exec_hook[1]);
        CHECK(setenv("WARPSOCK_TEST_EXEC_ARMED_FD", v, 1) == 0);
        CHECK(pthread_create(&ct, NULL, closer_in_exec, NULL) == 0);
    }
    char *argv[] = {"/nonexistent/warpsock-exec", NULL};
    CHECK(execv(argv[0], argv) == -1 && errno == ENOENT);
    if (plain) {
        CHECK(close(c) == 0);
    } else {
        CHECK(pthread_join(ct, NULL) == 0);
    }
    c = -1;
    CHECK(write(exec_go[1], "g", 1) == 1);
    CHECK(pthread_join(pt, NULL) == 0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE [plain]\n", argv[0]);
        return 2;
    }
    plain = argc > 2 && !strcmp(argv[2], "plain");
    if (!strcmp(argv[1], "latestamps")) {
        tcp_pair_small(&c, &s, 4096);
    } else {
        tcp_pair(&c, &s);
    }
    const char *cs = argv[1];
    if (!strcmp(cs, "rcvlowat")) {
        case_rcvlowat();
    } else if (!strcmp(cs, "soerror")) {
        case_soerror(0);
    } else if (!strcmp(cs, "soerrpoll")) {
        case_soerror(1);
    } else if (!strcmp(cs, "soerrrecv")) {
        case_soerror(2);
    } else if (!strcmp(cs, "soerrhup")) {
        case_soerror(3);
    } else if (!strcmp(cs, "abortdup")) {
        case_abortdup();
    } else if (!strcmp(cs, "abortbefore")) {
        case_abort(1);
    } else if (!strcmp(cs, "abortunread")) {
        case_unread(1);
    } else if (!strcmp(cs, "abortshut")) {
        case_abortshut();
    } else if (!strcmp(cs, "abortblocked")) {
        case_blocked(1);
    } else if (!strcmp(cs, "closeblocked")) {
        case_blocked(0);
    } else if (!strcmp(cs, "execarmed")) {
        case_execarmed();
    } else if (!strcmp(cs, "closeunread")) {
        case_unread(0);
    } else if (!strcmp(cs, "closeheld")) {
        case_closeheld();
    } else if (!strcmp(cs, "abort")) {
        case_abort(0);
    } else if (!strcmp(cs, "stampopts")) {
        case_stampopts();
    } else if (!strcmp(cs, "emfile")) {
        case_emfile();
    } else if (!strcmp(cs, "emfilecommit")) {
        case_emfilecommit();
    } else if (!strcmp(cs, "latestamps")) {
        case_latestamps();
    } else if (!strcmp(cs, "stampstruct")) {
        case_stampstruct();
    } else if (!strcmp(cs, "errqueueopts")) {
        case_errqueueopts();
    } else if (!strcmp(cs, "stampkey")) {
        case_stampkey();
    } else if (!strcmp(cs, "stampsbefore")) {
        case_stampsbefore();
    } else if (!strcmp(cs, "zerocopy")) {
        case_zerocopy();
    } else if (!strcmp(cs, "oobinline")) {
        case_oobinline();
    } else if (!strcmp(cs, "stamps")) {
        case_stamps();
    } else if (!strcmp(cs, "blockafter")) {
        case_blockafter();
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    if (c >= 0) close(c);
    if (s >= 0) close(s);
    printf("sockopt %s: ok\n", cs);
    return 0;
}
