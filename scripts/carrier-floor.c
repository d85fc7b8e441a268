// The TCP carrier's floor (issues 12 and 13, session 17): the system calls
// of one 8-byte ping-pong round trip, made with no library at all, once as
// the host baseline makes them and once as the offloaded path makes them
// over its TCP connection. What the offloaded path costs above the second
// is library time; what the second costs above the first is the carrier's.
//
//   cc -O2 -Wall -Wextra -Werror -pthread -o /tmp/cf scripts/carrier-floor.c
//   /tmp/cf SHAPE ROUND_TRIPS [PAD_NS]
//                     (prints "SHAPE <us per round trip> <round trips>")
//
// PAD_NS (carried shapes only; default 0): each side spins PAD_NS
// nanoseconds between reading a whole message and sending the next one,
// where the library's answer runs (the read's tail and the send's head: the
// critical path scripts/bench-critical-path.sh counts). The largest pad
// whose ratio still meets the row's target is the library's time budget
// per hop on this machine (bench-carrier-floor.sh --budget). The spin reads
// the time-stamp counter (x86-64; calibrated against CLOCK_MONOTONIC) or
// the clock elsewhere, and holds the CPU as library code would.
//
// scripts/bench-carrier-floor.sh runs every shape in interleaved rounds and
// prints medians and ratios. Each shape copies the calls `strace -f` shows
// for `warpsock bench --tests lat --sizes 8` (session 17, main 6163139):
//
//  udp-event      host UDP, as the suite's `udp` transport: per side a
//                 connected UDP socket (readv/writev of 8 bytes) and the
//                 companion TCP connection (a non-blocking 8-byte recv per
//                 pass); poll of [udp, companion]. The ping side reads until
//                 EAGAIN; the pong side stops at one datagram and echoes it.
//  offload-event  the UDP offload's calls for the same program: the data
//                 goes over a TCP connection (TCP_NODELAY, congestion control
//                 as the preload sets it: WARPSOCK_TCP_CONGESTION, default
//                 bbr, where the kernel has it), each datagram framed by a 4-byte big-endian length
//                 (sendmsg of [header, payload], MSG_DONTWAIT|MSG_NOSIGNAL),
//                 received by recv(MSG_DONTWAIT) into a 256 KiB buffer; the
//                 poll watches [program's descriptor, companion, connection]
//                 (the program's descriptor is the doorbell's end, an idle
//                 AF_UNIX stream socket: the preload moves the kernel UDP
//                 socket away from it); the progress thread's epoll set
//                 holds the hidden kernel UDP socket (bound and connected,
//                 idle; EPOLLIN|EPOLLET) and the parked connection (EPOLLET,
//                 no events), as the preload registers them (nobody waits on
//                 it: its thread sleeps).
//  udp-busy,      as above with the suite's busy mode: each side spins on its
//  offload-busy   passes (a clock read per pass) for up to 1000 us, then polls.
//  tcp-event      host TCP, as the suite's `tcp` transport: blocking
//                 readv/writev of 8 bytes on one connection (TCP_NODELAY).
//  ddp-event      the DDP socket's calls for the same program (CRC off): one
//                 40-byte FPDU per message (MPA length 34, untagged DDP +
//                 RDMAP Send header, the stream's 8-byte header, 8 bytes of
//                 payload, a zero CRC field), sent by send(MSG_DONTWAIT|
//                 MSG_NOSIGNAL), received by a blocking recv of up to 64 KiB.
//  tcp-busy,      as above, non-blocking: the host spins on readv, the DDP
//  ddp-busy       socket on recv(MSG_DONTWAIT); up to 1000 us, then poll.
//
// Placement as the suite's automatic pinning on one host: event shapes put
// both sides on the last CPU, busy shapes the client on the one before it.
// The two sides are two processes, as the suite's client and server are.
// Every payload is the round trip's number and the ping side checks the
// echo: a shape that lost or garbled a message fails (exit 1). Every wait
// is bounded (5 s without progress fails the run); nothing sleeps.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define STALL_MS 5000
#define SPIN_NS 1000000LL   /* the suite's --busy-poll default: 1000 us */
#define RXBUF (256 * 1024)  /* the offload connection's read size */
#define DDP_LEN 40          /* one 8-byte message as an FPDU, CRC off */
#define DDP_RX 65536        /* the DDP socket's read size */
#define FRAME_LEN 12        /* offload frame: 4-byte length + 8 bytes */

enum family { DGRAM, STREAM };

struct shape {
    const char *name;
    enum family fam;
    int carried; /* offload (TCP-carried datagrams) or DDP FPDUs */
    int busy;
};

static const struct shape SHAPES[] = {
    {"udp-event", DGRAM, 0, 0},     {"offload-event", DGRAM, 1, 0},
    {"udp-busy", DGRAM, 0, 1},      {"offload-busy", DGRAM, 1, 1},
    {"tcp-event", STREAM, 0, 0},    {"ddp-event", STREAM, 1, 0},
    {"tcp-busy", STREAM, 0, 1},     {"ddp-busy", STREAM, 1, 1},
};

struct side {
    const struct shape *sh;
    int ping;
    int data; /* UDP socket, offload connection or stream connection */
    int ctl;  /* the companion TCP connection (datagram shapes) */
    int hid;  /* offload: the hidden kernel UDP socket */
    int bell; /* offload: the program's descriptor, the doorbell's end */
    int ring; /* offload: the doorbell's other end (the library's) */
    int ep;   /* offload: the progress thread's epoll set */
    unsigned char *rx;
    size_t have;       /* carried bytes read and not yet a whole message */
    uint64_t last;     /* the last payload received */
    uint32_t msn;      /* DDP: the next message sequence number */
};

static void die(const char *what) {
    fprintf(stderr, "carrier-floor: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void fail(const char *what) {
    fprintf(stderr, "carrier-floor: %s\n", what);
    exit(1);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The pad (PAD_NS): nanoseconds per hop, and the time-stamp counter's ticks
 * per nanosecond (0: spin on the clock). */
static long pad_ns;
static double ticks_per_ns;

#if defined(__x86_64__)
#include <x86intrin.h>
/* Ticks per nanosecond over 20 ms of the clock (before the fork: both sides
 * use the same figure). */
static void calibrate(void) {
    long long t0 = now_ns();
    unsigned long long c0 = __rdtsc();
    long long t;
    while ((t = now_ns()) - t0 < 20000000LL) {
    }
    ticks_per_ns = (double)(__rdtsc() - c0) / (double)(t - t0);
}

static void pad(void) {
    unsigned long long end = __rdtsc() + (unsigned long long)((double)pad_ns * ticks_per_ns);
    while (__rdtsc() < end) {
    }
}
#else
static void calibrate(void) {}

static void pad(void) {
    long long end = now_ns() + pad_ns;
    while (now_ns() < end) {
    }
}
#endif

static void pin(int cpu) {
    cpu_set_t c;
    CPU_ZERO(&c);
    CPU_SET(cpu, &c);
    if (sched_setaffinity(0, sizeof c, &c) != 0) die("sched_setaffinity");
}

static void nonblock(int s) {
    int fl = fcntl(s, F_GETFL);
    if (fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl");
}

static void nodelay(int s) {
    int one = 1;
    if (setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
}

static void bounded(int s) {
    struct timeval tv = {STALL_MS / 1000, 0};
    if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) die("SO_RCVTIMEO");
}

static struct sockaddr_in loopback(void) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* A TCP connection on 127.0.0.1 (listener on port 0, closed after). */
static void tcp_pair(int *a, int *b) {
    struct sockaddr_in s = loopback();
    socklen_t l = sizeof s;
    int L = socket(AF_INET, SOCK_STREAM, 0);
    if (L < 0 || bind(L, (struct sockaddr *)&s, l) || listen(L, 1) ||
        getsockname(L, (struct sockaddr *)&s, &l))
        die("TCP listener");
    *a = socket(AF_INET, SOCK_STREAM, 0);
    if (*a < 0 || connect(*a, (struct sockaddr *)&s, l)) die("TCP connect");
    *b = accept(L, NULL, NULL);
    if (*b < 0) die("TCP accept");
    close(L);
    nodelay(*a);
    nodelay(*b);
}

/* Two UDP sockets on 127.0.0.1, each connected to the other. */
static void udp_pair(int *a, int *b) {
    struct sockaddr_in x = loopback(), y = loopback();
    socklen_t lx = sizeof x, ly = sizeof y;
    *a = socket(AF_INET, SOCK_DGRAM, 0);
    *b = socket(AF_INET, SOCK_DGRAM, 0);
    if (*a < 0 || *b < 0 || bind(*a, (struct sockaddr *)&x, lx) ||
        bind(*b, (struct sockaddr *)&y, ly) || getsockname(*a, (struct sockaddr *)&x, &lx) ||
        getsockname(*b, (struct sockaddr *)&y, &ly) || connect(*a, (struct sockaddr *)&y, ly) ||
        connect(*b, (struct sockaddr *)&x, lx))
        die("UDP pair");
}

/* The preload's congestion control for its connections: the preload's own
 * variable, WARPSOCK_TCP_CONGESTION (default bbr; empty: the kernel's),
 * where the kernel has it (the offload falls back to the kernel's alike). */
static void congestion(int s) {
    const char *cc = getenv("WARPSOCK_TCP_CONGESTION");
    if (!cc) cc = "bbr";
    if (*cc) (void)setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc));
}

static void epoll_add(int ep, int fd, uint32_t events) {
    struct epoll_event e = {.events = events, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) die("epoll_ctl");
}

/* Both sides' descriptors for `sh`, set up as the suite's sides have them. */
static void setup(const struct shape *sh, struct side *c, struct side *s) {
    memset(c, 0, sizeof *c);
    memset(s, 0, sizeof *s);
    c->sh = s->sh = sh;
    c->ping = 1;
    c->ctl = s->ctl = c->hid = s->hid = c->ep = s->ep = -1;
    c->bell = s->bell = c->ring = s->ring = -1;
    if (sh->fam == DGRAM) {
        tcp_pair(&c->ctl, &s->ctl);
        nonblock(c->ctl);
        nonblock(s->ctl);
        if (sh->carried) {
            tcp_pair(&c->data, &s->data);
            congestion(c->data);
            congestion(s->data);
            udp_pair(&c->hid, &s->hid);
            nonblock(c->hid);
            nonblock(s->hid);
            struct side *both[2] = {c, s};
            for (int i = 0; i < 2; i++) {
                int sv[2];
                if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
                both[i]->bell = sv[0];
                both[i]->ring = sv[1];
                nonblock(sv[0]);
                nonblock(sv[1]);
                both[i]->ep = epoll_create1(0);
                if (both[i]->ep < 0) die("epoll_create1");
                epoll_add(both[i]->ep, both[i]->hid, EPOLLIN | EPOLLET);
                epoll_add(both[i]->ep, both[i]->data, EPOLLET);
            }
        } else {
            udp_pair(&c->data, &s->data);
        }
        nonblock(c->data);
        nonblock(s->data);
    } else {
        tcp_pair(&c->data, &s->data);
        if (sh->busy) {
            nonblock(c->data);
            nonblock(s->data);
        } else {
            bounded(c->data);
            bounded(s->data);
        }
    }
    size_t rx = sh->fam == DGRAM ? RXBUF : DDP_RX;
    c->rx = malloc(rx);
    s->rx = malloc(rx);
    if (!c->rx || !s->rx) fail("out of memory");
}

/* Sends message `v`. */
static void send_msg(struct side *x, uint64_t v) {
    ssize_t n, want;
    if (x->sh->fam == DGRAM && !x->sh->carried) {
        struct iovec io = {&v, 8};
        n = writev(x->data, &io, 1);
        want = 8;
    } else if (x->sh->fam == DGRAM) {
        unsigned char hdr[4] = {0, 0, 0, 8};
        struct iovec io[2] = {{hdr, 4}, {&v, 8}};
        struct msghdr m = {.msg_iov = io, .msg_iovlen = 2};
        n = sendmsg(x->data, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        want = FRAME_LEN;
    } else if (!x->sh->carried) {
        struct iovec io = {&v, 8};
        n = writev(x->data, &io, 1);
        want = 8;
    } else {
        /* MPA length, DDP control (untagged, last), RDMAP Send, queue 0,
         * MSN, offset 0, the stream's header, the payload, CRC field 0. */
        unsigned char f[DDP_LEN] = {0, 34, 0x41, 0x43};
        uint32_t msn = htonl(++x->msn);
        static const unsigned char stream_hdr[8] = {1, 1, 0, 1, 0, 0, 0, 0};
        memcpy(f + 12, &msn, 4);
        memcpy(f + 20, stream_hdr, 8);
        memcpy(f + 28, &v, 8);
        n = send(x->data, f, DDP_LEN, MSG_DONTWAIT | MSG_NOSIGNAL);
        want = DDP_LEN;
    }
    if (n != want) {
        if (n < 0) die("send");
        fail("short send");
    }
}

/* One read of the data socket, as the shape's receive makes it: 1 when it
 * completed a message (its payload in x->last), 0 when it read part of
 * one, -1 on EAGAIN. */
static int read_msg(struct side *x, int dontwait) {
    ssize_t n;
    size_t whole;
    if (x->sh->fam == DGRAM && !x->sh->carried) {
        struct iovec io = {&x->last, 8};
        n = readv(x->data, &io, 1);
        if (n == 8) return 1;
        whole = 8;
    } else if (x->sh->fam == STREAM && !x->sh->carried) {
        struct iovec io = {x->rx + x->have, 8 - x->have};
        n = readv(x->data, &io, 1);
        whole = 8;
    } else {
        size_t cap = x->sh->fam == DGRAM ? RXBUF : DDP_RX;
        n = recv(x->data, x->rx + x->have, cap - x->have, dontwait ? MSG_DONTWAIT : 0);
        whole = x->sh->fam == DGRAM ? FRAME_LEN : DDP_LEN;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (x->sh->fam == STREAM && !x->sh->busy) fail("no message for 5 s");
            return -1;
        }
        die("receive");
    }
    if (n == 0) fail("the peer closed");
    if (x->sh->fam == DGRAM && !x->sh->carried) fail("a short datagram");
    x->have += (size_t)n;
    if (x->have < whole) return 0;
    if (x->have > whole) fail("more than one message in flight");
    x->have = 0;
    memcpy(&x->last, x->rx + whole - (x->sh->fam == STREAM && x->sh->carried ? 12 : 8), 8);
    return 1;
}

/* The suite's pass over a datagram flow: the ping side reads until EAGAIN,
 * the pong side stops at one message; then the companion's read. Returns
 * the messages read. */
static int pass(struct side *x) {
    int got = 0;
    for (int i = 0; i < 64; i++) {
        int r = read_msg(x, 1);
        if (r < 0) break;
        got += r;
        if (got && !x->ping) break;
    }
    char b[8];
    ssize_t n = recv(x->ctl, b, sizeof b, 0);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) fail("the companion moved");
    return got;
}

/* Waits for one message as the suite's endpoint does (datagram shapes: a
 * pass, then spin (busy) or poll and pass again; stream shapes: a blocking
 * read, or a spin with a poll after SPIN_NS). */
static void wait_msg(struct side *x) {
    long long start = now_ns(), spin_end = start + (x->sh->busy ? SPIN_NS : 0);
    if (x->sh->fam == STREAM && !x->sh->busy) {
        while (read_msg(x, 0) == 0) {
        }
        if (x->sh->carried && pad_ns > 0) pad();
        return;
    }
    struct pollfd p[3];
    int k = 0;
    if (x->sh->fam == DGRAM) {
        p[k++] = (struct pollfd){x->sh->carried ? x->bell : x->data, POLLIN, 0};
        p[k++] = (struct pollfd){x->ctl, POLLIN, 0};
        if (x->sh->carried) p[k++] = (struct pollfd){x->data, POLLIN, 0};
    } else {
        p[k++] = (struct pollfd){x->data, POLLIN, 0};
    }
    int got = x->sh->fam == DGRAM ? pass(x) : read_msg(x, 1) > 0;
    while (!got) {
        long long t = now_ns();
        if (t - start > STALL_MS * 1000000LL) fail("no message for 5 s");
        if (t >= spin_end && poll(p, (nfds_t)k, x->ping ? 49 : 29999) < 0 && errno != EINTR)
            die("poll");
        got = x->sh->fam == DGRAM ? pass(x) : read_msg(x, 1) > 0;
    }
    if (got > 1) fail("more than one message in flight");
    if (x->sh->carried && pad_ns > 0) pad();
}

static int cpus(void) {
    cpu_set_t c;
    if (sched_getaffinity(0, sizeof c, &c) != 0) return 1;
    return CPU_COUNT(&c) > 0 ? CPU_COUNT(&c) : 1;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s SHAPE ROUND_TRIPS [PAD_NS]\nshapes:", argv[0]);
        for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
            fprintf(stderr, " %s", SHAPES[i].name);
        fputc('\n', stderr);
        return 2;
    }
    const struct shape *sh = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
        if (!strcmp(argv[1], SHAPES[i].name)) sh = &SHAPES[i];
    long rounds = strtol(argv[2], NULL, 10);
    if (!sh || rounds < 1 || rounds > 100000000) fail("unknown shape or bad round count");
    if (argc == 4) {
        char *end;
        pad_ns = strtol(argv[3], &end, 10);
        if (*argv[3] == '\0' || *end != '\0' || pad_ns < 0 || pad_ns > 1000000)
            fail("the pad is a number of nanoseconds, 0 to 1000000");
        if (pad_ns > 0 && !sh->carried) fail("a pad is for a carried shape");
        calibrate();
    }
    long warm = rounds / 10 < 1000 ? rounds / 10 : 1000;
    int n = cpus(), server_cpu = n - 1, client_cpu = sh->busy && n > 1 ? n - 2 : n - 1;

    struct side c, s;
    setup(sh, &c, &s);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        /* The server: echo every message. */
        pin(server_cpu);
        for (long i = 0; i < warm + rounds; i++) {
            wait_msg(&s);
            send_msg(&s, s.last);
        }
        _exit(0);
    }
    pin(client_cpu);
    long long t0 = 0;
    for (long i = 0; i < warm + rounds; i++) {
        if (i == warm) t0 = now_ns();
        uint64_t v = (uint64_t)i * 0x9e3779b97f4a7c15ULL + 1;
        send_msg(&c, v);
        wait_msg(&c);
        if (c.last != v) fail("the echo is not what was sent");
    }
    long long t1 = now_ns();
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail("the server side failed");
    printf("%s %.3f %ld\n", sh->name, (double)(t1 - t0) / 1e3 / (double)rounds, rounds);
    return 0;
}
