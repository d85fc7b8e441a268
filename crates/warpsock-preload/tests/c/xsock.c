/*
 * DDP-mode sockets under libwarpsock_preload.so: every call and flag of
 * warpsock_sockets.h and the sockets semantics of issue 12, as server/client
 * pairs.
 *
 *   xsock CASE local                      both ends here (fork), loopback
 *   xsock CASE server ADDR PORTFILE       listen on ADDR, write the port
 *   xsock CASE client ADDR PORT           connect
 *
 * Exit status 0 on success; a failure prints what and where.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "warpsock_sockets.h"

#include <stddef.h>
_Static_assert(sizeof(struct warpsock_aio_completion) == 32, "completion size");
_Static_assert(offsetof(struct warpsock_aio_completion, result) == 16, "completion layout");
_Static_assert(offsetof(struct warpsock_aio_completion, flags) == 24, "completion layout");

static const char *role = "?";
#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "xsock %s: %s:%d: check failed: %s (errno %d %s)\n", role,    \
                    __FILE__, __LINE__, #c, errno, strerror(errno));                      \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Deterministic bytes: byte i of stream `seed`. */
static uint8_t pat(uint64_t seed, uint64_t i) {
    uint64_t x = (i ^ (seed * 0x9E3779B97F4A7C15ull)) * 0x2545F4914F6CDD1Dull;
    return (uint8_t)(x >> 56);
}

static void fill(uint8_t *b, size_t n, uint64_t seed, uint64_t at) {
    for (size_t i = 0; i < n; i++) b[i] = pat(seed, at + i);
}

static void send_all(int fd, const void *b, size_t n) {
    const uint8_t *p = b;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        CHECK(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

static void recv_all(int fd, void *b, size_t n) {
    uint8_t *p = b;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        CHECK(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

static void expect_pattern(int fd, size_t n, uint64_t seed) {
    uint8_t *b = malloc(n ? n : 1);
    CHECK(b);
    recv_all(fd, b, n);
    for (size_t i = 0; i < n; i++)
        if (b[i] != pat(seed, i)) {
            fprintf(stderr, "xsock %s: byte %zu of stream %llu differs\n", role, i,
                    (unsigned long long)seed);
            exit(1);
        }
    free(b);
}

static void send_pattern(int fd, size_t n, uint64_t seed) {
    uint8_t *b = malloc(n ? n : 1);
    CHECK(b);
    fill(b, n, seed, 0);
    send_all(fd, b, n);
    free(b);
}

static int ddp(int fd) {
    int one = 1;
    return setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
}

static int getopt_int(int fd, int level, int name) {
    int v = -1;
    socklen_t l = sizeof v;
    CHECK(getsockopt(fd, level, name, &v, &l) == 0);
    return v;
}

static void sync_byte(int fd, char c) {
    send_all(fd, &c, 1);
}

static void wait_byte(int fd, char c) {
    char got = 0;
    recv_all(fd, &got, 1);
    CHECK(got == c);
}

/* ---- cases: each has a server half and a client half on a connected fd. */

/* Pre-switch bytes, the switch, options, bad values. */
static void switch_common(int fd, int server) {
    send_pattern(fd, server ? 70000 : 3, server ? 1 : 2);
    CHECK(ddp(fd) == 0);
    CHECK(getopt_int(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE) == 1);
    const char *crc = getenv("WARPSOCK_CRC");
    CHECK(getopt_int(fd, SOL_WARPSOCK, WARPSOCK_CRC) == (crc && !strcmp(crc, "0") ? 0 : 1));
    int bad = 7;
    CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &bad, sizeof bad) == -1 &&
          errno == EINVAL);
    CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_MSG_MODE, &bad, sizeof bad) == -1 &&
          errno == EINVAL);
    CHECK(setsockopt(fd, SOL_WARPSOCK, 99, &bad, sizeof bad) == -1 && errno == ENOPROTOOPT);
    char tiny = 1;
    CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &tiny, 1) == -1 && errno == EINVAL);
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    CHECK(getpeername(fd, (struct sockaddr *)&a, &al) == 0);
    al = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    /* The peer's pre-switch bytes come first, then what it sends after. */
    expect_pattern(fd, server ? 3 : 70000, server ? 2 : 1);
    send_pattern(fd, 100000, server ? 3 : 4);
    expect_pattern(fd, 100000, server ? 4 : 3);
}

/* A socket that is non-blocking when it switches (an event loop's socket,
 * policy mode's accept4(SOCK_NONBLOCK)) stays non-blocking for the program,
 * although the engine puts the kernel socket (whose open file description
 * the program's descriptor shares) in blocking mode for its own reads; once
 * the program clears O_NONBLOCK, its calls block. */
static void nbswitch_server(int fd) {
    int fl = fcntl(fd, F_GETFL);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
    CHECK(ddp(fd) == 0);
    CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
    char b[8];
    CHECK(recv(fd, b, 1, 0) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK));
    CHECK(fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0);
    sync_byte(fd, 'N');
    CHECK(recv(fd, b, 5, 0) > 0);
    CHECK(!memcmp(b, "h", 1));
}

static void nbswitch_client(int fd) {
    CHECK(ddp(fd) == 0);
    wait_byte(fd, 'N');
    send_all(fd, "hello", 5);
}

/* Every data call and flag, readiness, timeouts, shutdown. */
static void calls_server(int fd) {
    /* The marker programs probe for policy mode (the apps benchmark). */
    CHECK(dlsym(RTLD_DEFAULT, "warpsock_feature_ddp_ports") != NULL);
    CHECK(ddp(fd) == 0);
    char b[64];
    /* read/readv/recvmsg of what the client sends with write/writev/sendmsg */
    CHECK(read(fd, b, 5) == 5 && !memcmp(b, "write", 5));
    char x[3], y[4];
    struct iovec iv[2] = {{x, 3}, {y, 4}};
    CHECK(readv(fd, iv, 2) == 7 && !memcmp(x, "wri", 3) && !memcmp(y, "tev!", 4));
    struct msghdr m = {0};
    struct iovec one = {b, 7};
    m.msg_iov = &one;
    m.msg_iovlen = 1;
    CHECK(recvmsg(fd, &m, MSG_WAITALL) == 7 && !memcmp(b, "sendmsg", 7));
    /* MSG_PEEK leaves the bytes, MSG_WAITALL waits for all of them. */
    CHECK(recv(fd, b, 4, MSG_PEEK) == 4 && !memcmp(b, "peek", 4));
    CHECK(recv(fd, b, 8, MSG_WAITALL) == 8 && !memcmp(b, "peekwait", 8));
    CHECK(recv(fd, b, 6, MSG_WAITALL) == 6 && !memcmp(b, "allall", 6));
    /* MSG_DONTWAIT and O_NONBLOCK on an empty socket. */
    CHECK(recv(fd, b, 1, MSG_DONTWAIT) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK));
    int fl = fcntl(fd, F_GETFL);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
    CHECK(read(fd, b, 1) == -1 && errno == EAGAIN);
    CHECK(fcntl(fd, F_SETFL, fl) == 0);
    /* SO_RCVTIMEO */
    struct timeval tv = {0, 200000};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    double t0 = now();
    CHECK(recv(fd, b, 1, 0) == -1 && errno == EAGAIN);
    CHECK(now() - t0 >= 0.15);
    tv.tv_usec = 0;
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    sync_byte(fd, 'A'); /* client: now send for the readiness checks */
    /* poll, ppoll, select, pselect, epoll (level and edge) */
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
    struct timespec ts = {10, 0};
    CHECK(ppoll(&p, 1, &ts, NULL) == 1);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv2 = {10, 0};
    CHECK(select(fd + 1, &rs, NULL, NULL, &tv2) == 1 && FD_ISSET(fd, &rs));
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    CHECK(pselect(fd + 1, &rs, NULL, NULL, &ts, NULL) == 1);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN}, out;
    ev.data.fd = fd;
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    CHECK(epoll_wait(ep, &out, 1, 10000) == 1 && (out.events & EPOLLIN));
    int n = 0;
    CHECK(ioctl(fd, FIONREAD, &n) == 0 && n == 5);
    CHECK(recv(fd, b, 5, 0) == 5 && !memcmp(b, "ready", 5));
    CHECK(epoll_wait(ep, &out, 1, 0) == 0); /* level: nothing left */
    ev.events = EPOLLIN | EPOLLET;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) == 0);
    sync_byte(fd, 'B'); /* client: send two bursts */
    CHECK(epoll_wait(ep, &out, 1, 10000) == 1);
    CHECK(recv(fd, b, 2, MSG_WAITALL) == 2 && !memcmp(b, "e1", 2));
    CHECK(epoll_wait(ep, &out, 1, 10000) == 1); /* a new edge for the second */
    CHECK(recv(fd, b, 2, MSG_WAITALL) == 2 && !memcmp(b, "e2", 2));
    close(ep);
    /* POLLOUT: writable */
    p.events = POLLOUT;
    CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLOUT));
    /* dup / dup2 name the same socket */
    int d = dup(fd);
    CHECK(d >= 0);
    send_all(d, "dup", 3);
    int d2 = dup2(fd, 100);
    CHECK(d2 == 100);
    send_all(100, "dup2", 4);
    close(d);
    close(100);
    /* shutdown(SHUT_WR): the client reads 0; we still read its bytes */
    CHECK(shutdown(fd, SHUT_WR) == 0);
    CHECK(send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE);
    expect_pattern(fd, 300000, 9);
    CHECK(recv(fd, b, 1, 0) == 0); /* then the client's end of stream */
}

static void calls_client(int fd) {
    CHECK(ddp(fd) == 0);
    CHECK(write(fd, "write", 5) == 5);
    struct iovec iv[2] = {{"wri", 3}, {"tev!", 4}};
    CHECK(writev(fd, iv, 2) == 7);
    struct msghdr m = {0};
    struct iovec one = {"sendmsg", 7};
    m.msg_iov = &one;
    m.msg_iovlen = 1;
    CHECK(sendmsg(fd, &m, 0) == 7);
    send_all(fd, "peek", 4);
    usleep(50000);
    send_all(fd, "wait", 4);
    send_all(fd, "all", 3);
    usleep(50000);
    send_all(fd, "all", 3);
    wait_byte(fd, 'A');
    send_all(fd, "ready", 5);
    wait_byte(fd, 'B');
    send_all(fd, "e1", 2);
    usleep(100000);
    send_all(fd, "e2", 2);
    char b[8];
    recv_all(fd, b, 3);
    CHECK(!memcmp(b, "dup", 3));
    recv_all(fd, b, 4);
    CHECK(!memcmp(b, "dup2", 4));
    CHECK(recv(fd, b, 1, 0) == 0); /* the server shut its sending side */
    send_pattern(fd, 300000, 9);
    /* close: orderly, the server gets every byte and then end of stream */
}

/* Random-sized writes and reads, 1 B to 4 MiB, both ways, with a reader
 * that stops for 2 s in the middle. */
#define STREAM_TOTAL (24u << 20)
static void stream_side(int fd, int server) {
    CHECK(ddp(fd) == 0);
    srand(server ? 11 : 12);
    uint8_t *buf = malloc(4u << 20);
    CHECK(buf);
    uint64_t sent = 0, got = 0;
    uint64_t sseed = server ? 21 : 22, rseed = server ? 22 : 21;
    int fl = fcntl(fd, F_GETFL);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
    int stalled = 0;
    double t0 = now();
    while (sent < STREAM_TOTAL || got < STREAM_TOTAL) {
        CHECK(now() - t0 < 120);
        struct pollfd p = {fd, 0, 0};
        if (sent < STREAM_TOTAL) p.events |= POLLOUT;
        if (got < STREAM_TOTAL) p.events |= POLLIN;
        CHECK(poll(&p, 1, 10000) >= 0);
        if (sent < STREAM_TOTAL && (p.revents & POLLOUT)) {
            size_t n = 1 + (size_t)rand() % ((size_t)1 << (rand() % 23));
            if (n > STREAM_TOTAL - sent) n = STREAM_TOTAL - sent;
            fill(buf, n, sseed, sent);
            ssize_t r = send(fd, buf, n, 0);
            CHECK(r > 0 || errno == EAGAIN);
            if (r > 0) sent += (uint64_t)r;
        }
        if (server && !stalled && got > STREAM_TOTAL / 3) {
            /* The stalled reader: the peer's sends block, nothing is lost. */
            stalled = 1;
            sleep(2);
        }
        if (got < STREAM_TOTAL && (p.revents & (POLLIN | POLLHUP))) {
            size_t n = 1 + (size_t)rand() % ((size_t)1 << (rand() % 23));
            if (n > STREAM_TOTAL - got) n = STREAM_TOTAL - got;
            ssize_t r = recv(fd, buf, n, 0);
            CHECK(r > 0 || errno == EAGAIN);
            for (ssize_t i = 0; i < r; i++)
                if (buf[i] != pat(rseed, got + (uint64_t)i)) {
                    fprintf(stderr, "xsock %s: stream byte %llu differs\n", role,
                            (unsigned long long)(got + (uint64_t)i));
                    exit(1);
                }
            if (r > 0) got += (uint64_t)r;
        }
    }
    CHECK(fcntl(fd, F_SETFL, fl) == 0);
    sync_byte(fd, 'Z');
    wait_byte(fd, 'Z');
    free(buf);
}

static void aio_wait(int fd, int ep, struct warpsock_aio_completion *c);

/* Message mode: one read per send, MSG_EOR; an asynchronous receive's
 * completion carries MSG_EOR as recvmsg does. */
static void msg_server(int fd) {
    int one = 1;
    CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_MSG_MODE, &one, sizeof one) == 0);
    CHECK(ddp(fd) == 0);
    CHECK(getopt_int(fd, SOL_WARPSOCK, WARPSOCK_MSG_MODE) == 1);
    static const size_t sizes[] = {1, 100, 4096, 70000, 3};
    static char b[200000];
    for (size_t i = 0; i < 5; i++) {
        struct iovec v = {b, sizeof b};
        struct msghdr m = {0};
        m.msg_iov = &v;
        m.msg_iovlen = 1;
        ssize_t n = recvmsg(fd, &m, 0);
        CHECK(n == (ssize_t)sizes[i]);
        CHECK(m.msg_flags & MSG_EOR);
        for (size_t k = 0; k < sizes[i]; k++) CHECK((uint8_t)b[k] == pat(30 + i, k));
    }
    /* A 3000-byte message into 1000-byte asynchronous receives: two parts
     * without MSG_EOR, then its end with it. */
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(warpsock_aio_recv(fd, b, 1000, 90 + (uint64_t)i) == 0);
        struct warpsock_aio_completion c;
        aio_wait(fd, ep, &c);
        CHECK(c.cookie == 90 + (uint64_t)i && c.op == WARPSOCK_AIO_RECV && c.error == 0);
        CHECK(c.result == 1000 && c.flags == (i == 2 ? MSG_EOR : 0) && c.reserved == 0);
        for (size_t k = 0; k < 1000; k++) CHECK((uint8_t)b[k] == pat(35, 1000 * (size_t)i + k));
    }
    close(ep);
    sync_byte(fd, 'M');
}

static void msg_client(int fd) {
    CHECK(ddp(fd) == 0);
    static const size_t sizes[] = {1, 100, 4096, 70000, 3};
    for (size_t i = 0; i < 5; i++) send_pattern(fd, sizes[i], 30 + i);
    send_pattern(fd, 3000, 35);
    wait_byte(fd, 'M');
}

/* riomap / riowrite / rioread, and their errors. */
static void rio_server(int fd) {
    CHECK(ddp(fd) == 0);
    uint8_t *mem = calloc(1, 1 << 20);
    CHECK(mem);
    CHECK(warpsock_riomap(fd, mem, 1 << 20, PROT_READ | PROT_WRITE, 0, 4096) == 4096);
    CHECK(warpsock_riomap(fd, mem, 16, PROT_READ, 7, -1) == -1 && errno == EINVAL);
    fill(mem + 500000, 1000, 41, 0);
    sync_byte(fd, 'R'); /* mapped: tell the client through the stream */
    wait_byte(fd, 'W'); /* the client wrote; bytes after it arrive after it */
    for (int i = 0; i < 300000; i++) CHECK(mem[1000 + i] == pat(40, (uint64_t)i));
    /* Stay in a receive while the client reads (our engine answers). */
    wait_byte(fd, 'D');
    CHECK(warpsock_riounmap(fd, mem, 1 << 20) == 0);
    free(mem);
}

static void rio_client(int fd) {
    /* The library loaded is of this header's ABI (the program's check). */
    CHECK(warpsock_sockets_abi() == WARPSOCK_SOCKETS_ABI);
    CHECK(ddp(fd) == 0);
    wait_byte(fd, 'R');
    uint8_t *src = malloc(300000);
    CHECK(src);
    fill(src, 300000, 40, 0);
    CHECK(warpsock_riowrite(fd, src, 300000, 4096 + 1000, 0) == 300000);
    sync_byte(fd, 'W');
    uint8_t back[1000];
    CHECK(warpsock_rioread(fd, back, 1000, 4096 + 500000, 0) == 1000);
    for (int i = 0; i < 1000; i++) CHECK(back[i] == pat(41, (uint64_t)i));
    CHECK(warpsock_riowrite(fd, src, 10, 4096 + (1 << 20) - 5, 0) == -1 && errno == EINVAL);
    CHECK(warpsock_riowrite(fd, src, 10, 1, 0) == -1 && errno == EINVAL);
    CHECK(warpsock_riowrite(0, src, 10, 4096, 0) == -1 && errno == ENOTSOCK);
    sync_byte(fd, 'D');
    free(src);
}

/* Asynchronous operations, completions waited for with epoll. */
static void aio_wait(int fd, int ep, struct warpsock_aio_completion *c) {
    for (;;) {
        int n = warpsock_aio_poll(fd, c, 1);
        CHECK(n >= 0);
        if (n == 1) return;
        struct epoll_event out;
        CHECK(epoll_wait(ep, &out, 1, 10000) == 1);
    }
}

static void aio_server(int fd) {
    CHECK(ddp(fd) == 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    size_t total = 3u << 20, got = 0;
    uint8_t *buf = malloc(1 << 20);
    CHECK(buf);
    while (got < total) {
        CHECK(warpsock_aio_recv(fd, buf, 1 << 20, 77) == 0);
        struct warpsock_aio_completion c;
        aio_wait(fd, ep, &c);
        CHECK(c.cookie == 77 && c.op == WARPSOCK_AIO_RECV && c.error == 0 && c.result > 0);
        CHECK(c.flags == 0); /* a stream has no message ends */
        for (int64_t i = 0; i < c.result; i++) CHECK(buf[i] == pat(50, got + (uint64_t)i));
        got += (size_t)c.result;
    }
    uint8_t *mem = calloc(1, 65536);
    CHECK(warpsock_riomap(fd, mem, 65536, PROT_READ | PROT_WRITE, 0, -1) >= 0);
    uint64_t off = (uint64_t)(uintptr_t)mem;
    send_all(fd, &off, sizeof off);
    wait_byte(fd, 'a');
    for (int i = 0; i < 65536; i++) CHECK(mem[i] == pat(51, (uint64_t)i));
    sync_byte(fd, 'A'); /* checked: the peer may overwrite it */
    wait_byte(fd, 'c');
    for (int i = 0; i < 65536; i++) CHECK(mem[i] == pat(52, (uint64_t)i));
    wait_byte(fd, 'b');
    close(ep);
    free(mem);
    free(buf);
}

static void aio_client(int fd) {
    CHECK(ddp(fd) == 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    uint8_t *src = malloc(3u << 20);
    CHECK(src);
    fill(src, 3u << 20, 50, 0);
    CHECK(warpsock_aio_send(fd, src, 3u << 20, 5) == 0);
    struct warpsock_aio_completion c;
    aio_wait(fd, ep, &c);
    CHECK(c.cookie == 5 && c.op == WARPSOCK_AIO_SEND && c.error == 0 && c.result == (3 << 20));
    uint64_t off;
    recv_all(fd, &off, sizeof off);
    uint8_t *w = malloc(65536), *r = malloc(65536);
    fill(w, 65536, 51, 0);
    CHECK(warpsock_aio_write(fd, w, 65536, (off_t)off, 6) == 0);
    aio_wait(fd, ep, &c);
    CHECK(c.cookie == 6 && c.op == WARPSOCK_AIO_WRITE && c.result == 65536);
    sync_byte(fd, 'a');
    CHECK(warpsock_aio_read(fd, r, 65536, (off_t)off, 7) == 0);
    aio_wait(fd, ep, &c);
    CHECK(c.cookie == 7 && c.op == WARPSOCK_AIO_READ && c.result == 65536);
    CHECK(!memcmp(r, w, 65536));
    /* Vectored: three separate buffers gathered into one Write, one
     * completion for the lot (once the peer checked the first Write). */
    wait_byte(fd, 'A');
    uint8_t head[8], tail[8], *body = malloc(65536 - 16);
    CHECK(body);
    fill(head, 8, 52, 0);
    fill(body, 65536 - 16, 52, 8);
    fill(tail, 8, 52, 65536 - 8);
    struct iovec iov[3] = {{head, 8}, {body, 65536 - 16}, {tail, 8}};
    CHECK(warpsock_aio_writev(fd, iov, 3, (off_t)off, 8) == 0);
    aio_wait(fd, ep, &c);
    CHECK(c.cookie == 8 && c.op == WARPSOCK_AIO_WRITE && c.error == 0 && c.result == 65536);
    CHECK(warpsock_aio_poll(fd, &c, 1) == 0);
    /* Wrong arguments: EINVAL, nothing posted. */
    struct iovec empty[2] = {{head, 8}, {tail, 0}}, null_base[1] = {{NULL, 8}};
    CHECK(warpsock_aio_writev(fd, NULL, 1, (off_t)off, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, iov, 0, (off_t)off, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, iov, -1, (off_t)off, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, iov, WARPSOCK_IOV_MAX + 1, (off_t)off, 9) == -1 &&
          errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, empty, 2, (off_t)off, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, null_base, 1, (off_t)off, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, iov, 3, -1, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_writev(fd, iov, 3, (off_t)off + 8, 9) == -1 && errno == EINVAL);
    CHECK(warpsock_aio_poll(fd, &c, 1) == 0);
    sync_byte(fd, 'c');
    sync_byte(fd, 'b');
    close(ep);
    free(body);
    free(src);
    free(w);
    free(r);
}

/* Two threads on one socket: one blocked in recv (it drives the
 * connection, so it processes the credits the peer returns), the other
 * sending with MSG_DONTWAIT and waiting for POLLOUT. The blocked call must
 * tell the poller (no poll may wait 10 s), and the bytes arrive in order. */
#define THREADS_TOTAL (8u << 20)
static void *threads_reader(void *arg) {
    int fd = *(int *)arg;
    wait_byte(fd, 'E');
    return NULL;
}

static void threads_server(int fd) {
    CHECK(ddp(fd) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, threads_reader, &fd) == 0);
    uint8_t *b = malloc(THREADS_TOTAL);
    CHECK(b);
    fill(b, THREADS_TOTAL, 40, 0);
    size_t off = 0;
    while (off < THREADS_TOTAL) {
        ssize_t r = send(fd, b + off, THREADS_TOTAL - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        CHECK(r < 0 && errno == EAGAIN);
        struct pollfd p = {fd, POLLOUT, 0};
        CHECK(poll(&p, 1, 10000) == 1);
    }
    CHECK(pthread_join(t, NULL) == 0);
    free(b);
}

static void threads_client(int fd) {
    CHECK(ddp(fd) == 0);
    expect_pattern(fd, THREADS_TOTAL, 40);
    sync_byte(fd, 'E');
}

/* The client is killed mid-stream: the server gets the end of the stream
 * (the kernel's FIN) or ECONNRESET (its RST), as over TCP — never a
 * protocol error, never a hang. */
static void kill_server(int fd) {
    CHECK(ddp(fd) == 0);
    static uint8_t b[65536];
    double t0 = now();
    for (;;) {
        CHECK(now() - t0 < 30);
        ssize_t r = recv(fd, b, sizeof b, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) break;
        CHECK(r > 0);
    }
}

static void kill_client(int fd) {
    CHECK(ddp(fd) == 0);
    static uint8_t b[65536];
    for (int i = 0; i < 30; i++) send_all(fd, b, sizeof b);
    kill(getpid(), SIGKILL);
}

/* fork: a child's copy of a DDP-mode socket is refused (documented: end of
 * stream on read, EPIPE on write); the parent's connection is unharmed. */
static void fork_server(int fd) {
    CHECK(ddp(fd) == 0);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        char b[4];
        int ok = read(fd, b, 4) == 0 && send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE;
        _exit(ok ? 0 : 3);
    }
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    send_all(fd, "parent", 6);
    wait_byte(fd, 'F');
}

static void fork_client(int fd) {
    CHECK(ddp(fd) == 0);
    char b[6];
    recv_all(fd, b, 6);
    CHECK(!memcmp(b, "parent", 6));
    sync_byte(fd, 'F');
}

/* A peer that never switches: ECONNREFUSED, and the connection stays an
 * intact TCP connection. */
static void plain_server(int fd) {
    send_all(fd, "hello", 5);
    char b[5];
    recv_all(fd, b, 5);
    CHECK(!memcmp(b, "world", 5));
    send_pattern(fd, 200000, 60);
}

static void plain_client(int fd) {
    double t0 = now();
    CHECK(ddp(fd) == -1 && errno == ECONNREFUSED);
    CHECK(now() - t0 < 20);
    CHECK(getopt_int(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE) == 0);
    CHECK(ddp(fd) == -1 && errno == EALREADY); /* one attempt per connection */
    char b[5];
    recv_all(fd, b, 5);
    CHECK(!memcmp(b, "hello", 5));
    send_all(fd, "world", 5);
    expect_pattern(fd, 200000, 60);
}

/* epoll: a registration the program made before the switch follows its
 * descriptor, whose number comes to name a doorbell (DDP mode) or, after a
 * refused switch has delivered the peer's early bytes, the TCP socket again
 * (an event loop such as redis's registers first and reads later). Every
 * receive below waits in epoll_wait only: a registration left on the old
 * file never wakes, and the 20 s bound fails the case. */
static int epoll_watching(int fd) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    return ep;
}

/* The epoll set's registration of fd watches the file fd names now (the
 * kernel lists each registration's inode in the set's fdinfo). */
static void check_registration_follows(int ep, int fd) {
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", ep);
    FILE *f = fopen(path, "r");
    CHECK(f);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        int tfd;
        const char *ino = strstr(line, "ino:");
        if (sscanf(line, "tfd: %d", &tfd) == 1 && tfd == fd && ino) {
            found = 1;
            if (strtoull(ino + 4, NULL, 16) != (unsigned long long)st.st_ino) {
                fprintf(stderr, "xsock %s: epoll watches inode %llx, the descriptor names %llx\n",
                        role, strtoull(ino + 4, NULL, 16), (unsigned long long)st.st_ino);
                exit(1);
            }
        }
    }
    fclose(f);
    CHECK(found);
}

static void epoll_recv_all(int ep, int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        struct epoll_event ev;
        int k = epoll_wait(ep, &ev, 1, 20000);
        if (k != 1) {
            fprintf(stderr, "xsock %s: epoll_wait gave %d with %zu of %zu bytes in: the "
                    "registration did not follow the descriptor\n", role, k, got, n);
            exit(1);
        }
        CHECK(ev.data.fd == fd && (ev.events & EPOLLIN));
        ssize_t r = recv(fd, (char *)buf + got, n - got, MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
        else
            CHECK(r < 0 && errno == EAGAIN); /* a spurious wake-up is allowed */
    }
}

static void epoll_expect_pattern(int ep, int fd, size_t n, uint64_t seed) {
    uint8_t *b = malloc(n);
    CHECK(b);
    epoll_recv_all(ep, fd, b, n);
    for (size_t i = 0; i < n; i++) CHECK(b[i] == pat(seed, i));
    free(b);
}

static void epoll_side(int fd, int server) {
    int ep = epoll_watching(fd);
    CHECK(ddp(fd) == 0);
    check_registration_follows(ep, fd);
    send_pattern(fd, 100000, server ? 80 : 81);
    epoll_expect_pattern(ep, fd, 100000, server ? 81 : 80);
    close(ep);
}

static void epoll_server(int fd) { epoll_side(fd, 1); }
static void epoll_client(int fd) { epoll_side(fd, 0); }

/* The refused switch of the plain case, waited on with epoll. */
static void epollplain_client(int fd) {
    int ep = epoll_watching(fd);
    CHECK(ddp(fd) == -1 && errno == ECONNREFUSED);
    char b[5];
    epoll_recv_all(ep, fd, b, 5);
    CHECK(!memcmp(b, "hello", 5));
    send_all(fd, "world", 5);
    epoll_expect_pattern(ep, fd, 200000, 60);
    check_registration_follows(ep, fd);
    close(ep);
}

/* DDP mode requested on the listening socket and before connect(). */
static void early_side(int fd, int server) {
    (void)server;
    CHECK(getopt_int(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE) == 1);
    send_pattern(fd, 5000, server ? 70 : 71);
    expect_pattern(fd, 5000, server ? 71 : 70);
}

/* An 8-byte ping-pong: blocking calls, then a poll before every receive.
 * Neither needs the progress thread (scripts/test-xsock.sh checks its
 * rounds, ddp_bg_rounds, against a bound that does not grow with the round
 * trips): the blocking receive reads the socket itself, and poll watches
 * the engine's socket next to the doorbell. */
#define PINGPONG_ROUNDS 2000
static void pingpong_side(int fd, int server) {
    CHECK(ddp(fd) == 0);
    for (int phase = 0; phase < 2; phase++) {
        for (uint64_t i = 0; i < PINGPONG_ROUNDS; i++) {
            uint64_t m = i, got;
            if (!server) send_all(fd, &m, 8);
            if (phase == 1) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                CHECK(poll(&p, 1, 20000) == 1 && (p.revents & POLLIN));
            }
            recv_all(fd, &got, 8);
            CHECK(got == i);
            if (server) send_all(fd, &got, 8);
        }
    }
}
static void pingpong_server(int fd) { pingpong_side(fd, 1); }
static void pingpong_client(int fd) { pingpong_side(fd, 0); }

/* ---- plumbing ----------------------------------------------------------- */

struct tcase {
    const char *name;
    void (*server)(int);
    void (*client)(int);
    int early; /* request DDP mode on the listener and before connect() */
};

static void switch_server(int fd) { switch_common(fd, 1); }
static void switch_client(int fd) { switch_common(fd, 0); }
static void stream_server(int fd) { stream_side(fd, 1); }
static void stream_client(int fd) { stream_side(fd, 0); }
static void early_server(int fd) { early_side(fd, 1); }
static void early_client(int fd) { early_side(fd, 0); }

static const struct tcase cases[] = {
    {"switch", switch_server, switch_client, 0},
    {"calls", calls_server, calls_client, 0},
    {"nbswitch", nbswitch_server, nbswitch_client, 0},
    {"stream", stream_server, stream_client, 0},
    {"msgmode", msg_server, msg_client, 0},
    {"rio", rio_server, rio_client, 0},
    {"aio", aio_server, aio_client, 0},
    {"kill", kill_server, kill_client, 0},
    {"fork", fork_server, fork_client, 0},
    {"plain", plain_server, plain_client, 0},
    {"early", early_server, early_client, 1},
    {"threads", threads_server, threads_client, 0},
    {"epoll", epoll_server, epoll_client, 0},
    {"epollplain", plain_server, epollplain_client, 0},
    {"pingpong", pingpong_server, pingpong_client, 0},
};

static int listener(const char *addr, int early, int *port) {
    int l = socket(strchr(addr, ':') ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (strchr(addr, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        CHECK(inet_pton(AF_INET6, addr, &a->sin6_addr) == 1);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        CHECK(inet_pton(AF_INET, addr, &a->sin_addr) == 1);
        len = sizeof *a;
    }
    CHECK(bind(l, (struct sockaddr *)&ss, len) == 0);
    CHECK(listen(l, 8) == 0);
    if (early) CHECK(ddp(l) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&ss, &len) == 0);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return l;
}

static int dial(const char *addr, int port, int early) {
    int v6 = strchr(addr, ':') != NULL;
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    if (early) CHECK(ddp(fd) == 0);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        CHECK(inet_pton(AF_INET6, addr, &a->sin6_addr) == 1);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        CHECK(inet_pton(AF_INET, addr, &a->sin_addr) == 1);
        len = sizeof *a;
    }
    double t0 = now();
    while (connect(fd, (struct sockaddr *)&ss, len) != 0) {
        CHECK(errno == ECONNREFUSED && now() - t0 < 20);
        close(fd);
        usleep(50000);
        fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
        if (early) CHECK(ddp(fd) == 0);
    }
    return fd;
}

static void run_server(const struct tcase *c, int l) {
    int fd = accept(l, NULL, NULL);
    CHECK(fd >= 0);
    close(l);
    c->server(fd);
    CHECK(close(fd) == 0);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: xsock CASE local | server ADDR PORTFILE | client ADDR PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct tcase *c = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(cases[i].name, argv[1])) c = &cases[i];
    if (!c) {
        fprintf(stderr, "xsock: unknown case %s\n", argv[1]);
        return 2;
    }
    if (!strcmp(argv[2], "local")) {
        int port;
        int l = listener("127.0.0.1", c->early, &port);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            role = "client";
            close(l);
            int fd = dial("127.0.0.1", port, c->early);
            c->client(fd);
            CHECK(close(fd) == 0);
            return 0;
        }
        role = "server";
        run_server(c, l);
        int st;
        CHECK(waitpid(pid, &st, 0) == pid);
        if (!strcmp(c->name, "kill")) {
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        } else {
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
        printf("xsock %s: ok\n", c->name);
        return 0;
    }
    if (!strcmp(argv[2], "server") && argc == 5) {
        role = "server";
        int port;
        int l = listener(argv[3], c->early, &port);
        FILE *f = fopen(argv[4], "w");
        CHECK(f);
        fprintf(f, "%d\n", port);
        fclose(f);
        run_server(c, l);
        printf("xsock %s server: ok\n", c->name);
        return 0;
    }
    if (!strcmp(argv[2], "client") && argc == 5) {
        role = "client";
        int fd = dial(argv[3], atoi(argv[4]), c->early);
        c->client(fd);
        CHECK(close(fd) == 0);
        printf("xsock %s client: ok\n", c->name);
        return 0;
    }
    fprintf(stderr, "xsock: bad arguments\n");
    return 2;
}
