/* The send buffer of a DDP-mode socket through the calls TCP programs use
 * (issue 12), one switched pair in one process, a window of 4 slots of
 * 1 KiB (WARPSOCK_DDP_SLOTS=4 WARPSOCK_DDP_SLOT_KB=1, set by
 * tests/ddp_sndbuf.rs):
 *
 *   sndbuf on    WARPSOCK_DDP_SNDBUF=65536: getsockopt(SO_SNDBUF) is the
 *                buffer's bound and setsockopt sets it (clamped); bytes
 *                past the window wait in the buffer and SIOCOUTQ /
 *                SIOCOUTQNSD count them; the progress thread sends them
 *                while the program makes no call on the socket (its reader
 *                gets them all); a non-blocking send into the nearly full
 *                buffer returns a partial count, then EAGAIN; SIOCOUTQ is
 *                0 once everything was read and acknowledged.
 *   sndbuf off   WARPSOCK_DDP_SNDBUF=0: no buffer — SO_SNDBUF reads the
 *                credit window whatever is set, a non-blocking send stops
 *                at the window,
 *                SIOCOUTQ goes to 0 once it was read.
 *   sndbuf before  WARPSOCK_DDP_SNDBUF=65536: SO_SNDBUF set while the
 *                sockets were plain TCP — on a listener in DDP mode (its
 *                accepted connection inherits it, as the kernel's does) and
 *                on the connecting socket before connect — is the bound
 *                after the switch, clamped as a set after it (1: the
 *                least, 4096).
 *   sndbuf plain WARPSOCK_DDP_SNDBUF=65536: SO_SNDBUF set on a plain
 *                listener (not in DDP mode) is the bound of an accepted
 *                connection the program switches later, as Linux's
 *                accepted socket inherits it; another listener's value
 *                (another port) is not taken, and the connecting end,
 *                with none set, keeps the starting bound. A value set on
 *                the listener after the connection was made is not
 *                carried (the connection never had it: the starting
 *                bound). A v6-only listener on the same port, whose
 *                value the kernel clamps to the v4 listener's (both above
 *                net.core.wmem_max), is not taken for a v4 connection.
 *   sndbuf sendfile  WARPSOCK_DDP_SNDBUF=65536: sendfile with no offset
 *                on a non-blocking socket whose peer reads only after
 *                EAGAIN: the file position moves by the bytes sent only
 *                (unchanged at EAGAIN), and the peer gets the file whole.
 *   sndbuf zcopy WARPSOCK_DDP_SNDBUF=65536: a blocking send of 64 KiB or
 *                more (WARPSOCK_ZCOPY_MIN) goes from the program's buffer
 *                and never into the send buffer: with a peer that does
 *                not read it returns (SO_SNDTIMEO, 300 ms) with the credit
 *                window's bytes at most, where TCP's would return once the
 *                rest fit its socket buffer — a documented bound, not a
 *                stall (task xstall); copied sends after it still take the
 *                send buffer's bytes past the window, and the reader gets
 *                everything.
 *
 * Exit 0 if every check holds. */
#include "ddppair.h"

#include <linux/sockios.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>

static int c, s;
static unsigned char stream[1 << 20];
static size_t sent, got;

static void *switch_peer(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

static int outq(int fd, unsigned long req) {
    int q = -1;
    CHECK(ioctl(fd, req, &q) == 0 && q >= 0);
    return q;
}

/* One non-blocking send of the stream's next n bytes: the count, or -1
 * with EAGAIN. */
static ssize_t send_next(size_t n) {
    ssize_t r = send_nb(c, stream + sent, n);
    if (r > 0) sent += (size_t)r;
    return r;
}

static void same_as_sent(const unsigned char *b, size_t n, size_t at) {
    CHECK(memcmp(b, stream + at, n) == 0);
}

/* The reader takes everything sent, blocking (10 s bound each), with no
 * call on the writer's socket. */
static void read_all(void) { recv_until(s, &got, sent, same_as_sent); }

/* SIOCOUTQ (and SIOCOUTQNSD) reach 0: nothing held, everything
 * acknowledged (each look is a round; bounded). */
static void drains(void) {
    for (int k = 0; outq(c, SIOCOUTQ) > 0; k++) {
        CHECK(k < 1000);
        CHECK(poll(NULL, 0, 10) == 0);
    }
    CHECK(outq(c, SIOCOUTQNSD) == 0);
}

static void *switch_client(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

static int before(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    set_sol_int(l, SO_SNDBUF, 20000);
    struct sockaddr_in a = lo(0);
    socklen_t alen = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    ddp_mode(l);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(k >= 0);
    set_sol_int(k, SO_SNDBUF, 1);
    CHECK(connect(k, (struct sockaddr *)&a, sizeof a) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_client, &k) == 0);
    int n = accept(l, NULL, NULL); /* switches (the listener's mode) */
    CHECK(n >= 0);
    CHECK(pthread_join(t, NULL) == 0);
    int mode = 0;
    socklen_t ml = sizeof mode;
    CHECK(getsockopt(n, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &mode, &ml) == 0 && mode == 1);
    CHECK(sol_int(k, SO_SNDBUF) == 4096);
    CHECK(sol_int(n, SO_SNDBUF) == 20000);
    puts("sndbuf before: ok");
    return 0;
}

static int listener(int v, struct sockaddr_in *a) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    set_sol_int(l, SO_SNDBUF, v);
    *a = lo(0);
    socklen_t alen = sizeof *a;
    CHECK(bind(l, (struct sockaddr *)a, sizeof *a) == 0);
    CHECK(listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)a, &alen) == 0);
    return l;
}

/* A connection to listener l at a, both ends switched by the program:
 * *n the accepted end. */
static int switched_pair(int l, struct sockaddr_in *a, int *n) {
    int k = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(k >= 0);
    CHECK(connect(k, (struct sockaddr *)a, sizeof *a) == 0);
    *n = accept(l, NULL, NULL);
    CHECK(*n >= 0);
    return k;
}

static void switch_both(int k, int n) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_client, &k) == 0);
    ddp_mode(n);
    CHECK(pthread_join(t, NULL) == 0);
    int mode = 0;
    socklen_t ml = sizeof mode;
    CHECK(getsockopt(n, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &mode, &ml) == 0 && mode == 1);
}

static long wmem_max(void) {
    FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
    CHECK(f);
    long w = 0;
    CHECK(fscanf(f, "%ld", &w) == 1);
    fclose(f);
    return w;
}

static int plain(void) {
    struct sockaddr_in other, a;
    int l2 = listener(30000, &other);
    int l = listener(20000, &a);
    int n, k = switched_pair(l, &a, &n);
    switch_both(k, n);
    CHECK(sol_int(n, SO_SNDBUF) == 20000);
    CHECK(sol_int(k, SO_SNDBUF) == 65536);
    /* Changed on the listener after the connection was made. */
    int n2, k2 = switched_pair(l, &a, &n2);
    set_sol_int(l, SO_SNDBUF, 40000);
    switch_both(k2, n2);
    CHECK(sol_int(n2, SO_SNDBUF) == 65536);
    /* A v4 listener and a v6-only one on one port, values the kernel
     * clamps alike. */
    long w = wmem_max();
    if (w + 16384 <= (64 << 20)) {
        /* Both wildcards (a listener on the connection's own address
         * would be taken first). */
        int l4 = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(l4 >= 0);
        set_sol_int(l4, SO_SNDBUF, (int)w + 8192);
        struct sockaddr_in a4 = lo(0);
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        socklen_t a4len = sizeof a4;
        CHECK(bind(l4, (struct sockaddr *)&a4, sizeof a4) == 0);
        CHECK(listen(l4, 1) == 0);
        CHECK(getsockname(l4, (struct sockaddr *)&a4, &a4len) == 0);
        a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int l6 = socket(AF_INET6, SOCK_STREAM, 0);
        CHECK(l6 >= 0);
        int one = 1;
        CHECK(setsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0);
        set_sol_int(l6, SO_SNDBUF, (int)w + 16384);
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = a4.sin_port};
        a6.sin6_addr = in6addr_any;
        CHECK(bind(l6, (struct sockaddr *)&a6, sizeof a6) == 0);
        CHECK(listen(l6, 1) == 0);
        CHECK(sol_int(l4, SO_SNDBUF) == sol_int(l6, SO_SNDBUF)); /* the kernel's, both clamped */
        int n4, k4 = switched_pair(l4, &a4, &n4);
        switch_both(k4, n4);
        CHECK(sol_int(n4, SO_SNDBUF) == (int)w + 8192);
        CHECK(close(l4) == 0 && close(l6) == 0);
    }
    CHECK(close(l2) == 0 && close(l) == 0);
    puts("sndbuf plain: ok");
    return 0;
}

/* The zcopy case (see the top). SO_SNDTIMEO ends the send's wait once
 * the window went; it is no window the checks depend on (issue 12): the
 * credits come in the peer's Hello, taken at the switch, and send_call
 * posts them before it first looks at its deadline (only when blocked),
 * so r > 0 holds with any timeout (1 us passed too, 30 of 30 runs under
 * two CPU hogs and taskset -c 0), and r <= 4096 holds however long the
 * wait: credits come back only as s reads. A zero-copy send buffered as
 * a copied one fails the check (r past the window). */
static int zcopy(void) {
    struct timeval tv = {0, 300 * 1000};
    CHECK(setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    /* 256 KiB from the program's buffer: the window (4 slots of 1 KiB),
     * then the timeout; nothing went into the send buffer. */
    ssize_t r = send(c, stream, 256 << 10, MSG_NOSIGNAL);
    CHECK(r > 0 && r <= 4096);
    sent = (size_t)r;
    /* Copied sends take the send buffer, past the window. */
    size_t before = sent;
    while (send_next(1000) > 0) CHECK(sent < 200000);
    CHECK(sent - before > 32768);
    read_all();
    drains();
    printf("sndbuf zcopy: ok (the zero-copy send returned %zd of 262144 bytes, the copied "
           "ones %zu)\n",
           r, sent - before);
    return 0;
}

/* The stream's first 256 KiB from a file, by sendfile with no offset,
 * the peer reading only when the writer met EAGAIN. */
static int sendfile_whole(void) {
    char path[] = "/tmp/sndbuf-sendfile-XXXXXX";
    int f = mkstemp(path);
    CHECK(f >= 0 && unlink(path) == 0);
    const size_t size = 256 << 10;
    CHECK(write(f, stream, size) == (ssize_t)size);
    CHECK(lseek(f, 0, SEEK_SET) == 0);
    CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) == 0);
    static unsigned char b[65536];
    int eagain = 0;
    while (sent < size) {
        CHECK(eagain < 100000);
        ssize_t r = sendfile(c, f, NULL, size - sent);
        if (r > 0) {
            sent += (size_t)r;
            continue;
        }
        /* 0: the file ended early (its position skipped bytes). */
        CHECK(r < 0 && errno == EAGAIN);
        eagain++;
        CHECK(lseek(f, 0, SEEK_CUR) == (off_t)sent);
        ssize_t n = read(s, b, sizeof b);
        CHECK(n > 0);
        same_as_sent(b, (size_t)n, got);
        got += (size_t)n;
    }
    CHECK(eagain > 0);
    read_all();
    CHECK(got == size);
    puts("sndbuf sendfile: ok");
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    if (strcmp(argv[1], "before") == 0) return before();
    if (strcmp(argv[1], "plain") == 0) return plain();
    int on = strcmp(argv[1], "on") == 0;
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_peer, &c) == 0);
    ddp_mode(s);
    CHECK(pthread_join(t, NULL) == 0);
    set_rcvtimeo(s, 10000);
    for (size_t i = 0; i < sizeof stream; i++) stream[i] = (unsigned char)(i * 131 + (i >> 9));
    if (strcmp(argv[1], "sendfile") == 0) return sendfile_whole();
    if (strcmp(argv[1], "zcopy") == 0) return zcopy();

    if (!on) {
        /* No buffer: the credit window is reported (4 slots of 1 KiB),
         * never 0, and a set changes nothing (off stays off). */
        CHECK(sol_int(c, SO_SNDBUF) == 4096);
        set_sol_int(c, SO_SNDBUF, 65536);
        CHECK(sol_int(c, SO_SNDBUF) == 4096);
        while (send_next(1000) > 0) CHECK(sent < 100000);
        /* Only the window went: nothing held past it (framing on top). */
        CHECK(sent > 0 && (size_t)outq(c, SIOCOUTQ) <= sent + 1024);
        read_all();
        drains();
        puts("sndbuf off: ok");
        return 0;
    }

    CHECK(sol_int(c, SO_SNDBUF) == 65536);
    set_sol_int(c, SO_SNDBUF, 1);
    CHECK(sol_int(c, SO_SNDBUF) == 4096); /* the least */
    set_sol_int(c, SO_SNDBUF, 20500);
    CHECK(sol_int(c, SO_SNDBUF) == 20500);

    /* Past the window, under the bound (no EAGAIN): some bytes wait in
     * the buffer, and the queue counts them. */
    for (int i = 0; i < 12; i++) CHECK(send_next(1000) == 1000);
    int q = outq(c, SIOCOUTQ), nsd = outq(c, SIOCOUTQNSD);
    CHECK(q >= 12000 - 4 * 1024 && (size_t)q <= sent + 1024);
    CHECK(nsd >= 12000 - 4 * 1024 && nsd <= q);
    /* The progress thread sends them: no call on the writer from now. */
    read_all();
    drains();

    /* Into the bound: whole calls, then part of one, then EAGAIN (the
     * bound charges each call's run a little bookkeeping besides its
     * bytes, so the part is under 500 of 20,500); every byte past the
     * window waits in the buffer, and the queue counts it. */
    ssize_t last = 0, r;
    while ((r = send_next(1000)) > 0) {
        CHECK(sent < 100000);
        CHECK(last == 0 || last == 1000);
        last = r;
    }
    CHECK(last > 0 && last < 1000);
    q = outq(c, SIOCOUTQ);
    CHECK((size_t)q >= sent - got - 4 * 1024 && (size_t)q <= sent - got + 1024);
    CHECK(sent - got > 20500 / 2);
    read_all();
    drains();
    puts("sndbuf on: ok");
    return 0;
}
