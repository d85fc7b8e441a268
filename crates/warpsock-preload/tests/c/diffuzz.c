/* Differential sequence fuzzer: a DDP-mode socket pair against kernel TCP
 * (issue 12; helper 58's, run by tests/ddp_diffuzz.rs).
 *
 *   diffuzz plain SEED    (run without LD_PRELOAD: the specification)
 *   diffuzz ddp SEED      (LD_PRELOAD=libwarpsock_preload.so; both ends switched)
 *
 * One process, one connected loopback pair (c = end 0, s = end 1). SEED drives
 * a deterministic random sequence of sockets calls on either end; each call
 * prints one transcript line (op, arguments, result, errno, a checksum of the
 * bytes it read). Diff the two transcripts: any difference is a behaviour a
 * TCP program could notice (or a normalisation bug of this fuzzer).
 *
 * Timing is taken out of the answers: after every send the receiving end is
 * waited for (bounded polls) until it holds every byte sent to it (FIONREAD,
 * with a MSG_PEEK|MSG_TRUNC count as a fall-back: a sync that needed the
 * fall-back or timed out prints a line), after a shutdown or close until the
 * peer sees it. Bytes in flight per direction stay below CAP, which the
 * kernel's buffers take without a partial send.
 *
 * Ops covered: send/write/writev/sendmsg (blocking or MSG_DONTWAIT, MSG_MORE
 * groups, sizes 1 B .. 300 KiB), recv/read/readv/recvmsg/recvfrom with
 * MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL (when enough is queued or the stream
 * ended), MSG_TRUNC (buffer or NULL), O_NONBLOCK toggles, SO_RCVTIMEO'd
 * blocking reads on an empty queue, FIONREAD/SIOCINQ/SIOCOUTQ/SIOCOUTQNSD,
 * poll (random masks), select, epoll (level-triggered), SO_ERROR,
 * getpeername, shutdown(SHUT_WR/SHUT_RD/SHUT_RDWR) (and again), send after
 * the own SHUT_WR (EPIPE, MSG_NOSIGNAL), reads after the peer's end of
 * stream, close with and without unread bytes (reset / FIN) and the
 * survivor's reads, sends and readiness after it.
 *
 * FUZZ_SKIP=wrband,closedstate,rst,sendclosed,shutrdwr,outq,peerclose,credits
 * leaves out (or masks) the differences found (tests/ddp_diffuzz.rs says
 * which remain), so that a campaign finds new ones: POLLWRBAND asked (poll, epoll);
 * getpeername/shutdown once TCP's socket is CLOSED; closes with unread
 * bytes (drained first); sends to a closed peer; sends to a peer shut both
 * ways; SIOCOUTQ after the end; POLLHUP and getpeername after the peer's
 * close; more than 9 unread send calls in flight. Both runs of a
 * comparison need the same FUZZ_SKIP.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SOL_WARPSOCK 0x57530000
#define WARPSOCK_DDP_MODE 1

#define CAP (200 * 1024)      /* most bytes in flight per direction */
#define MAXSEND (300 * 1024)
#define BUFSZ (320 * 1024)

#define DIE(...) do { fprintf(stdout, "FATAL " __VA_ARGS__); fprintf(stdout, " (errno %d)\n", errno); fflush(stdout); exit(1); } while (0)

/* ---- deterministic random numbers (splitmix64) ---- */
static uint64_t rs;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static unsigned rn(unsigned n) { return n ? (unsigned)(rnd() % n) : 0; }
static int chance(unsigned pct) { return rn(100) < pct; }

/* FUZZ_SKIP=a,b: leave out the parts of ops named (known differences),
 * with the random sequence unchanged otherwise. */
static int skip(const char *what) {
    const char *v = getenv("FUZZ_SKIP");
    return v && strstr(v, what);
}

/* ---- state ---- */
static int fd[2];          /* end 0 = c (connector), end 1 = s (accepted) */
static int ep[2];          /* an epoll set per end, level-triggered */
static uint64_t txoff[2];  /* bytes end e sent */
static uint64_t rxoff[2];  /* bytes end e consumed */
static int wshut[2], rshut[2], closed[2], nonblock[2], rcvtimeo[2];
static int peer_reset[2];  /* end e's peer closed with unread bytes (RST) */
static int rst_back[2];    /* end e's send to a dead peer drew a reset */
static int opno;
static unsigned char *sbuf, *rbuf;

static int peer(int e) { return e ^ 1; }
/* the stream offsets where end e's send calls ended (the last 4096) */
static uint64_t txends[2][4096];
static unsigned ntx[2];
/* how many of end e's send calls still have bytes unread at the peer */
static unsigned unread_sends(int e) {
    unsigned n = 0;
    for (unsigned i = ntx[e]; i > 0 && n < 4096; i--, n++)
        if (txends[e][(i - 1) % 4096] <= rxoff[e ^ 1]) break;
    return n;
}
/* whether bytes sent to e get a reset back: e closed, or shut both ways */
static int dead_rx(int e) { return closed[e] || (rshut[e] && wshut[e]); }
static uint64_t pending(int e) { return txoff[peer(e)] - rxoff[e]; } /* bytes owed to e */

/* byte i of the stream end e sends */
static unsigned char pat(int e, uint64_t i) {
    uint64_t x = i * 0x9e3779b97f4a7c15ULL + (uint64_t)e * 0x632be59bd9b4e019ULL;
    x ^= x >> 29;
    return (unsigned char)(x ^ (x >> 17));
}

static uint32_t fnv(const unsigned char *b, size_t n, uint32_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static const char *en(int e) { return e ? "s" : "c"; }

static const char *errname(int err) {
    static char b[32];
    switch (err) {
    case 0: return "0";
    case EAGAIN: return "EAGAIN";
    case EPIPE: return "EPIPE";
    case ECONNRESET: return "ECONNRESET";
    case ENOTCONN: return "ENOTCONN";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case EBADF: return "EBADF";
    case EINTR: return "EINTR";
    case EPROTO: return "EPROTO";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ETIMEDOUT: return "ETIMEDOUT";
    default: snprintf(b, sizeof b, "E%d", err); return b;
    }
}

static void flagstr(char *out, int f) {
    out[0] = 0;
    if (f & MSG_PEEK) strcat(out, "|PEEK");
    if (f & MSG_DONTWAIT) strcat(out, "|DONTWAIT");
    if (f & MSG_WAITALL) strcat(out, "|WAITALL");
    if (f & MSG_TRUNC) strcat(out, "|TRUNC");
    if (f & MSG_MORE) strcat(out, "|MORE");
    if (f & MSG_NOSIGNAL) strcat(out, "|NOSIGNAL");
    if (f & MSG_EOR) strcat(out, "|EOR");
    if (f & MSG_CTRUNC) strcat(out, "|CTRUNC");
    if (!out[0]) strcpy(out, "|0");
}

static void evstr(char *out, int ev) {
    out[0] = 0;
    static const struct { int b; const char *n; } t[] = {
        {POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"},
        {POLLHUP, "HUP"}, {POLLNVAL, "NVAL"}, {POLLRDNORM, "RDNORM"},
        {POLLRDBAND, "RDBAND"}, {POLLWRNORM, "WRNORM"}, {POLLWRBAND, "WRBAND"},
        {POLLRDHUP, "RDHUP"}};
    for (unsigned i = 0; i < sizeof t / sizeof t[0]; i++)
        if (ev & t[i].b) { strcat(out, "|"); strcat(out, t[i].n); }
    if (!out[0]) strcpy(out, "|0");
}

#define OUT(...) do { printf("%04d ", opno); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

static void on_alarm(int sig) {
    (void)sig;
    char b[64];
    int n = snprintf(b, sizeof b, "%04d TIMEOUT (call blocked)\n", opno);
    (void)!write(1, b, (size_t)n);
    _exit(0);
}

/* ---- the pair ---- */
static int ddp;
static void ddp_mode(int f) {
    int one = 1;
    if (setsockopt(f, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) != 0) DIE("switch");
}
static void *switch_thread(void *a) { ddp_mode(*(int *)a); return NULL; }

static void make_pair(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int rb = 1 << 20; /* room for CAP at the receiver over TCP, no window stall */
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb) || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al)) DIE("listen");
    fd[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (fd[0] < 0 || setsockopt(fd[0], SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb) || connect(fd[0], (struct sockaddr *)&a, sizeof a)) DIE("connect");
    fd[1] = accept(l, NULL, NULL);
    if (fd[1] < 0) DIE("accept");
    close(l);
    if (ddp) {
        pthread_t t;
        if (pthread_create(&t, NULL, switch_thread, &fd[0])) DIE("thread");
        ddp_mode(fd[1]);
        pthread_join(t, NULL);
    }
    for (int e = 0; e < 2; e++) {
        ep[e] = epoll_create1(0);
        /* EPOLLWRBAND too: TCP never shows it, a doorbell would. */
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI |
                                           (skip("wrband") ? 0 : EPOLLWRBAND),
                                 .data.u32 = 7};
        if (ep[e] < 0 || epoll_ctl(ep[e], EPOLL_CTL_ADD, fd[e], &ev)) DIE("epoll");
    }
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* ---- waits (bounded; they take timing out of the answers) ---- */

static int fionread(int e) {
    int v = -1;
    if (ioctl(fd[e], FIONREAD, &v) < 0) return -1;
    return v;
}

/* Until end e holds every byte owed to it (10 s at most: a loaded
 * machine's bound, reached only where the bytes never come). */
static void sync_rx(int e, const char *why) {
    if (closed[e] || peer_reset[e]) return;
    uint64_t want = pending(e);
    long end = now_ms() + 10000;
    int v = -1;
    while (now_ms() < end) {
        v = fionread(e);
        if (v >= 0 && (uint64_t)v == want) return;
        if (v >= 0 && (uint64_t)v > want) break;
        struct pollfd p = {fd[e], POLLIN, 0};
        if (poll(&p, 1, 5) > 0) poll(NULL, 0, 1); /* readable already: wait for the rest */
    }
    ssize_t pk = recv(fd[e], NULL, BUFSZ, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    OUT("SYNC-%s %s fionread=%d want=%llu peektrunc=%zd", why, en(e), v,
        (unsigned long long)want, pk);
}

/* Until poll(e) shows one of mask (10 s at most); silent unless it never does. */
static void sync_ev(int e, short mask, const char *why) {
    if (closed[e]) return;
    struct pollfd p = {fd[e], mask, 0};
    if (poll(&p, 1, 10000) <= 0) {
        char b[128];
        evstr(b, mask);
        OUT("SYNC-%s %s never showed %s", why, en(e), b);
    }
}

/* Until getpeername(e) fails (10 s at most), once e's connection went to
 * TCP's CLOSE: the peer's FIN behind e's own, which a poll need not show
 * (POLLRDHUP is up already after e's own SHUT_RD). Loopback TCP is there at
 * once; a DDP end takes the peer's end of stream in with its next round of
 * progress, which a close's reaper may send a moment later. Silent unless
 * it never is. */
static void sync_closed(int e, const char *why) {
    if (closed[e] || skip("closedstate")) return;
    for (int i = 0; i < 2000; i++) {
        struct sockaddr_in a;
        socklen_t l = sizeof a;
        if (getpeername(fd[e], (struct sockaddr *)&a, &l) < 0) return;
        poll(NULL, 0, 5);
    }
    OUT("SYNC-%s %s never closed", why, en(e));
}

/* Until SIOCOUTQ of e reads 0 (10 s at most): the peer acknowledged everything. */
static void sync_outq(int e) {
    for (int i = 0; i < 2000; i++) {
        int v = -1;
        if (ioctl(fd[e], SIOCOUTQ, &v) < 0 || v == 0) return;
        poll(NULL, 0, 5);
    }
}

/* ---- ops ---- */

static void fill_send(int e, size_t n) {
    for (size_t i = 0; i < n; i++) sbuf[i] = pat(e, txoff[e] + i);
}

/* Splits n bytes at b into up to k iovecs (some empty). */
static int split(struct iovec *iov, int k, unsigned char *b, size_t n) {
    int cnt = 1 + (int)rn((unsigned)k);
    size_t left = n;
    for (int i = 0; i < cnt; i++) {
        size_t take = i == cnt - 1 ? left : (left ? rn((unsigned)left + 1) : 0);
        iov[i].iov_base = b;
        iov[i].iov_len = take;
        b += take;
        left -= take;
    }
    return cnt;
}

static size_t pick_size(size_t room) {
    size_t n;
    unsigned k = rn(100);
    if (k < 45) n = 1 + rn(100);
    else if (k < 75) n = 1 + rn(16384);
    else n = 1 + rn(MAXSEND);
    if (n > room) n = room;
    return n;
}

/* One send call of n bytes from end e; returns its result. */
static ssize_t do_send(int e, size_t n, int flags, int how) {
    struct iovec iov[8];
    struct msghdr m;
    const char *name;
    ssize_t r;
    char fs[96];
    fill_send(e, n);
    errno = 0;
    switch (how) {
    case 0: name = "send"; r = send(fd[e], sbuf, n, flags); break;
    case 1: name = "write"; r = write(fd[e], sbuf, n); flags = 0; break;
    case 2: {
        name = "writev";
        int cnt = split(iov, 8, sbuf, n);
        r = writev(fd[e], iov, cnt);
        flags = 0;
        break;
    }
    default: {
        name = "sendmsg";
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)split(iov, 8, sbuf, n);
        r = sendmsg(fd[e], &m, flags);
        break;
    }
    }
    int err = errno;
    flagstr(fs, flags);
    if (r > 0) { txoff[e] += (uint64_t)r; txends[e][ntx[e]++ % 4096] = txoff[e]; }
    OUT("%s %s n=%zu fl=%s -> %zd %s", name, en(e), n, fs, r, r < 0 ? errname(err) : "");
    return r;
}

static int can_block_send(int e) {
    /* a send may block only if it cannot: write-shut (EPIPE) or room */
    return !nonblock[e];
}

static void op_send(int e) {
    size_t room = CAP - pending(peer(e));
    if (room == 0 || closed[peer(e)]) return;
    int group = chance(15) ? 2 + (int)rn(3) : 1;  /* MSG_MORE group */
    for (int g = 0; g < group; g++) {
        room = CAP - pending(peer(e));
        if (room == 0) break;
        if (skip("credits") && unread_sends(e) >= 10) break;
        size_t n = pick_size(room);
        int how = (int)rn(4);
        int flags = MSG_NOSIGNAL;
        if (chance(50) || !can_block_send(e)) flags |= MSG_DONTWAIT;
        if (g < group - 1 && n < room && !(skip("credits") && unread_sends(e) >= 9)) flags |= MSG_MORE;
        else g = group;
        if (n == room) g = group; /* the group's last send: no MSG_MORE */
        /* write/writev take no flags: blocking as the descriptor is */
        if ((how == 1 || how == 2) && (flags & MSG_DONTWAIT) && !nonblock[e]) how = 0;
        ssize_t r = do_send(e, n, flags, how);
        if (r >= 0 && (size_t)r < n) OUT("NOTE partial send %zd/%zu", r, n);
    }
    sync_rx(peer(e), "send");
}

/* A receive at end e: buffer size, flags, call kind chosen at random, with
 * blocking only where it cannot block (bytes queued, or the stream over). */
static void op_recv(int e) {
    uint64_t pend = pending(e);
    int eof = wshut[peer(e)] || closed[peer(e)] || rshut[e];
    int flags = 0;
    size_t len;
    unsigned k = rn(100);
    if (k < 40) len = 1 + rn(64);
    else if (k < 75) len = 1 + rn(8192);
    else if (k < 90) len = 1 + rn(BUFSZ - 1);
    else len = pend ? pend : 1 + rn(100);
    if (len > BUFSZ) len = BUFSZ;
    if (chance(25)) flags |= MSG_PEEK;
    if (chance(20)) flags |= MSG_TRUNC;
    if (chance(30)) flags |= MSG_WAITALL;
    int blocking = !nonblock[e];
    if (chance(40)) { flags |= MSG_DONTWAIT; blocking = 0; }
    int timeo = 0;
    if (blocking && pend == 0 && !eof && !peer_reset[e]) {
        if (rcvtimeo[e]) timeo = 1; /* blocks for the timeout: EAGAIN */
        else { flags |= MSG_DONTWAIT; blocking = 0; }
    }
    if (blocking && (flags & MSG_WAITALL) && len > pend && !eof && !peer_reset[e]) {
        if (pend) len = (size_t)pend;        /* exactly what is queued */
        else if (rcvtimeo[e]) timeo = 1;     /* waits out the timeout */
        else { flags |= MSG_DONTWAIT; blocking = 0; }
    }
    int how = (int)rn(5); /* recv, read, readv, recvmsg, recvfrom */
    if ((how == 1 || how == 2) && (flags & ~MSG_DONTWAIT)) how = 0;
    if ((how == 1 || how == 2) && (flags & MSG_DONTWAIT) && !nonblock[e]) how = 0;
    int nullbuf = (flags & MSG_TRUNC) && !(flags & MSG_PEEK) && chance(30) && how != 1 && how != 2;
    unsigned char *b = nullbuf ? NULL : rbuf;
    struct iovec iov[8];
    struct msghdr m;
    memset(&m, 0, sizeof m);
    ssize_t r;
    const char *name;
    int mflags = -1;
    errno = 0;
    memset(rbuf, 0xee, len < BUFSZ ? len : BUFSZ);
    switch (how) {
    case 0: name = "recv"; r = recv(fd[e], b, len, flags); break;
    case 1: name = "read"; r = read(fd[e], b, len); break;
    case 2: name = "readv"; r = readv(fd[e], iov, split(iov, 8, b, len)); break;
    case 3:
        name = "recvmsg";
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)split(iov, 8, b, len);
        if (nullbuf) for (size_t i = 0; i < m.msg_iovlen; i++) iov[i].iov_base = NULL;
        r = recvmsg(fd[e], &m, flags);
        mflags = m.msg_flags;
        break;
    default: {
        name = "recvfrom";
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        r = recvfrom(fd[e], b, len, flags, (struct sockaddr *)&from, &fl);
        break;
    }
    }
    int err = errno;
    char fs[96], ms[96] = "";
    flagstr(fs, flags);
    if (mflags >= 0) { flagstr(ms + 7, mflags); memcpy(ms, " mflags", 7); }
    uint32_t h = 2166136261u;
    const char *bad = "";
    if (r > 0 && !(flags & MSG_TRUNC) && b) {
        h = fnv(rbuf, (size_t)r, h);
        for (ssize_t i = 0; i < r; i++)
            if (rbuf[i] != pat(peer(e), rxoff[e] + (uint64_t)i)) { bad = " BAD-BYTES"; break; }
    }
    if (r > 0 && !(flags & MSG_PEEK)) rxoff[e] += (uint64_t)r;
    if (r > (ssize_t)pend + 0 && !(flags & MSG_PEEK)) bad = " MORE-THAN-SENT";
    OUT("%s %s len=%zu%s fl=%s%s -> %zd %s chk=%08x%s%s", name, en(e), len, nullbuf ? " NULL" : "",
        fs, timeo ? " (timeo)" : "", r, r < 0 ? errname(err) : "", h, ms, bad);
    if (r < 0 && err == ECONNRESET) peer_reset[e] = 2;
}

static void op_poll(int e);

/* whether e's connection went to TCP's CLOSE: a reset, or both ends' FINs */
static int finished(int e) {
    int p = peer(e);
    return peer_reset[e] || peer_reset[p] || rst_back[e] || rst_back[p] ||
           (wshut[e] && (wshut[p] || closed[p]));
}

static void op_ioctl(int e) {
    static const struct { unsigned long req; const char *n; } t[] = {
        {FIONREAD, "FIONREAD"}, {SIOCINQ, "SIOCINQ"}, {SIOCOUTQ, "SIOCOUTQ"},
        {SIOCOUTQNSD, "SIOCOUTQNSD"}, {SIOCATMARK, "SIOCATMARK"}};
    int i = (int)rn(5);
    if ((t[i].req == SIOCOUTQ || t[i].req == SIOCOUTQNSD) && skip("outq") && finished(e)) {
        op_poll(e);
        return;
    }
    if (t[i].req == SIOCOUTQ || t[i].req == SIOCOUTQNSD) sync_outq(e);
    int v = -12345;
    errno = 0;
    int r = ioctl(fd[e], t[i].req, &v);
    OUT("ioctl %s %s -> %d %s v=%d", en(e), t[i].n, r, r < 0 ? errname(errno) : "", v);
}

static void op_poll(int e) {
    static const short bits[] = {POLLIN, POLLOUT, POLLRDHUP, POLLPRI, POLLRDNORM, POLLWRNORM,
                                 POLLRDBAND, POLLWRBAND};
    short mask = 0;
    for (unsigned i = 0; i < 8; i++)
        if (chance(40)) mask |= bits[i];
    if (skip("wrband")) mask &= ~POLLWRBAND;
    struct pollfd p = {fd[e], mask, 0};
    errno = 0;
    int r = poll(&p, 1, 0);
    if (skip("peerclose") && closed[peer(e)] && !wshut[e] && !peer_reset[e]) {
        p.revents &= ~POLLHUP; /* known: HUP from the peer's close on */
        r = p.revents != 0;
    }
    char a[128], b[128];
    evstr(a, mask);
    evstr(b, p.revents);
    OUT("poll %s ev=%s -> %d rev=%s", en(e), a, r, b);
}

static void op_select(int e) {
    fd_set r, w, x;
    FD_ZERO(&r); FD_ZERO(&w); FD_ZERO(&x);
    int ir = chance(70), iw = chance(60), ix = chance(30);
    if (ir) FD_SET(fd[e], &r);
    if (iw) FD_SET(fd[e], &w);
    if (ix) FD_SET(fd[e], &x);
    struct timeval tv = {0, 0};
    int n = select(fd[e] + 1, &r, &w, &x, &tv);
    OUT("select %s ask=%d%d%d -> %d r=%d w=%d x=%d", en(e), ir, iw, ix, n, FD_ISSET(fd[e], &r),
        FD_ISSET(fd[e], &w), FD_ISSET(fd[e], &x));
}

static void op_epoll(int e) {
    struct epoll_event ev[4];
    int n = epoll_wait(ep[e], ev, 4, 0);
    if (n == 1 && skip("peerclose") && closed[peer(e)] && !wshut[e] && !peer_reset[e])
        ev[0].events &= ~(uint32_t)EPOLLHUP;
    char b[128] = "-";
    if (n == 1) evstr(b, (int)ev[0].events);
    OUT("epoll %s -> %d ev=%s data=%u", en(e), n, b, n == 1 ? ev[0].data.u32 : 0);
}

static void op_soerror(int e) {
    int v = -1;
    socklen_t l = sizeof v;
    int r = getsockopt(fd[e], SOL_SOCKET, SO_ERROR, &v, &l);
    OUT("SO_ERROR %s -> %d v=%s", en(e), r, errname(v));
    if (v == ECONNRESET) peer_reset[e] = 2;
}

static void op_peername(int e) {
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    errno = 0;
    int r = getpeername(fd[e], (struct sockaddr *)&a, &l);
    OUT("getpeername %s -> %d %s", en(e), r, r < 0 ? errname(errno) : "");
}

static void op_nonblock(int e) {
    int fl = fcntl(fd[e], F_GETFL);
    nonblock[e] = !nonblock[e];
    int r = fcntl(fd[e], F_SETFL, nonblock[e] ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
    OUT("fcntl %s O_NONBLOCK=%d -> %d getfl_nb=%d", en(e), nonblock[e], r,
        !!(fcntl(fd[e], F_GETFL) & O_NONBLOCK));
}

static void op_rcvtimeo(int e) {
    rcvtimeo[e] = !rcvtimeo[e];
    struct timeval tv = {0, rcvtimeo[e] ? 20000 : 0};
    int r = setsockopt(fd[e], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    OUT("SO_RCVTIMEO %s %s -> %d", en(e), rcvtimeo[e] ? "20ms" : "off", r);
}

static void op_sendafter(int e) {
    /* a send after the own SHUT_WR: EPIPE, no signal */
    size_t n = 1 + rn(2000);
    fill_send(e, n);
    errno = 0;
    ssize_t r = send(fd[e], sbuf, n, MSG_NOSIGNAL | (chance(50) ? MSG_DONTWAIT : 0));
    OUT("send-after-shut %s n=%zu -> %zd %s", en(e), n, r, r < 0 ? errname(errno) : "");
    if (r > 0) txoff[e] += (uint64_t)r;
}

static void op_shutdown(int e, int how) {
    static const char *hn[] = {"SHUT_RD", "SHUT_WR", "SHUT_RDWR"};
    errno = 0;
    int r = shutdown(fd[e], how);
    OUT("shutdown %s %s -> %d %s", en(e), hn[how], r, r < 0 ? errname(errno) : "");
    if (r == 0) {
        if (how != SHUT_WR) rshut[e] = 1;
        if (how != SHUT_RD && !wshut[e]) {
            wshut[e] = 1;
            sync_rx(peer(e), "shut");
            sync_ev(peer(e), POLLRDHUP, "shut");
        }
    }
    for (int x = 0; x < 2; x++)
        if (finished(x)) sync_closed(x, "shut");
}

static void op_close(int e) {
    if (skip("rst") && pending(e) > 0 && !peer_reset[e]) { /* drain first: no reset */
        sync_rx(e, "drain");
        while (pending(e) > 0) {
            ssize_t r = recv(fd[e], rbuf, BUFSZ, MSG_DONTWAIT);
            if (r <= 0) break;
            rxoff[e] += (uint64_t)r;
        }
    }
    int unread = pending(e) > 0;
    int r = close(fd[e]);
    OUT("close %s unread=%d -> %d", en(e), unread, r);
    closed[e] = 1;
    close(ep[e]);
    int p = peer(e);
    if (unread && !closed[p]) {
        peer_reset[p] = 1;
        sync_ev(p, POLLERR, "close-rst");
    } else if (!closed[p]) {
        sync_ev(p, POLLRDHUP, "close-fin");
    }
    if (finished(p)) sync_closed(p, "close");
}

/* A send to a peer that closed: TCP takes it, the peer's kernel answers
 * with a reset; wait for it (POLLERR) before going on. */
static void op_send_to_closed(int e) {
    int p = peer(e);
    size_t n = 1 + rn(1000);
    fill_send(e, n);
    errno = 0;
    ssize_t r = send(fd[e], sbuf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    OUT("send-to-closed %s n=%zu -> %zd %s", en(e), n, r, r < 0 ? errname(errno) : "");
    if (r > 0) {
        txoff[e] += (uint64_t)r;
        rxoff[p] = txoff[e]; /* dropped by the reset */
        rst_back[e] = 1;
        sync_ev(e, POLLERR, "rst-back");
        if (!closed[p]) { peer_reset[p] = 1; sync_ev(p, POLLERR, "rst-there"); }
    }
}

static void any_op(int e) {
    unsigned k = rn(100);
    int p = peer(e);
    if (closed[e]) return;
    if (dead_rx(p) && !dead_rx(e) && k >= 40 && k < 50 && !wshut[e] && !peer_reset[e]) {
        if (skip("sendclosed") && closed[p]) { op_poll(e); return; }
        if (skip("shutrdwr") && !closed[p]) { op_poll(e); return; }
        op_send_to_closed(e);
        return;
    }
    if (dead_rx(p)) {
        /* the survivor */
        if (k < 40) op_recv(e);
        else if (k < 50) op_poll(e);
        else if (k < 60) op_poll(e);
        else if (k < 65) op_select(e);
        else if (k < 70) op_epoll(e);
        else if (k < 80) op_soerror(e);
        else if (k < 85) { if ((skip("closedstate") && finished(e)) || (skip("peerclose") && closed[p])) op_poll(e); else op_peername(e); }
        else if (k < 92) op_ioctl(e);
        else if (k < 96) { if (wshut[e]) op_sendafter(e); else op_poll(e); }
        else if (skip("closedstate") && finished(e)) op_poll(e);
        else op_shutdown(e, (int)rn(3));
        return;
    }
    if (k < 30 && skip("credits") && !wshut[e] && unread_sends(e) >= 10) op_recv(p);
    else if (k < 30) { if (!wshut[e]) op_send(e); else op_sendafter(e); }
    else if (k < 58) op_recv(e);
    else if (k < 66) op_ioctl(e);
    else if (k < 74) op_poll(e);
    else if (k < 77) op_select(e);
    else if (k < 80) op_epoll(e);
    else if (k < 83) op_soerror(e);
    else if (k < 86) op_nonblock(e);
    else if (k < 88) op_rcvtimeo(e);
    else if (k < 89) { if ((skip("closedstate") && finished(e)) || (skip("peerclose") && closed[p])) op_poll(e); else op_peername(e); }
    else op_recv(e);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "plain") && strcmp(argv[1], "ddp"))) {
        fprintf(stderr, "usage: %s plain|ddp SEED\n", argv[0]);
        return 2;
    }
    ddp = !strcmp(argv[1], "ddp");
    unsigned long seed = strtoul(argv[2], NULL, 0);
    rs = seed * 0x2545f4914f6cdd1dULL + 1;
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN);
    sbuf = malloc(BUFSZ);
    rbuf = malloc(BUFSZ);
    alarm(120);
    make_pair();
    printf("seed %lu\n", seed);

    int nops = 20 + (int)rn(80);
    for (opno = 0; opno < nops; opno++) any_op((int)rn(2));

    /* The end: shutdowns and closes, then more calls on what is left. */
    int e = (int)rn(2);
    unsigned k = rn(100);
    if (k < 30) {
        op_shutdown(e, SHUT_WR);
        if (chance(50)) op_shutdown(peer(e), SHUT_WR);
    } else if (k < 45) {
        op_shutdown(e, SHUT_RD);
    } else if (k < 55) {
        op_shutdown(e, SHUT_RDWR);
    } else if (k < 80) {
        op_close(e);
    } else {
        op_shutdown(e, SHUT_WR);
        for (int i = 0; i < 5; i++) any_op((int)rn(2)), opno++;
        op_close(peer(e));
    }
    opno++;
    int tail = 10 + (int)rn(30);
    for (int i = 0; i < tail; i++, opno++) any_op((int)rn(2));
    if (chance(50) && !closed[0] && !closed[1]) op_close((int)rn(2)), opno++;
    for (int i = 0; i < 8; i++, opno++) any_op((int)rn(2));
    printf("end\n");
    fflush(stdout);
    alarm(0);
    return 0;
}
