/*
 * DDP-mode sockets under libwarpsock_preload.so: the extended calls of
 * warpsock_sockets.h and the data paths, as server/client pairs (the switch
 * and the sockets semantics around it: xsockswitch.c; the plumbing, usage
 * and helpers: xsockcase.h).
 *
 *   stream    random-sized writes and reads, 1 B to 4 MiB, both ways, with
 *             a reader that stops for 2 s in the middle;
 *   msgmode   message mode: one read per send, MSG_EOR; an asynchronous
 *             receive's completion carries MSG_EOR as recvmsg does;
 *   rio       riomap / riowrite / rioread, and their errors;
 *   aio       asynchronous operations, completions waited for with epoll;
 *   threads   two threads on one socket: one blocked in recv, the other
 *             sending with MSG_DONTWAIT and waiting for POLLOUT;
 *   pingpong  an 8-byte ping-pong, blocking calls then a poll before every
 *             receive (scripts/test-xsock.sh counts the progress thread's
 *             rounds).
 *
 *   xsock CASE local | server ADDR PORTFILE | client ADDR PORT
 */
#include "xsockcase.h"

#include <stddef.h>
_Static_assert(sizeof(struct warpsock_aio_completion) == 32, "completion size");
_Static_assert(offsetof(struct warpsock_aio_completion, result) == 16, "completion layout");
_Static_assert(offsetof(struct warpsock_aio_completion, flags) == 24, "completion layout");

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
    /* -1: the library chooses the offset (not the buffer's address). */
    off_t mapped = warpsock_riomap(fd, mem, 65536, PROT_READ | PROT_WRITE, 0, -1);
    CHECK(mapped >= 0 && (uintptr_t)mapped != (uintptr_t)mem);
    uint64_t off = (uint64_t)mapped;
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

static void stream_server(int fd) { stream_side(fd, 1); }
static void stream_client(int fd) { stream_side(fd, 0); }

static const struct tcase cases[] = {
    {"stream", stream_server, stream_client, 0},
    {"msgmode", msg_server, msg_client, 0},
    {"rio", rio_server, rio_client, 0},
    {"aio", aio_server, aio_client, 0},
    {"threads", threads_server, threads_client, 0},
    {"pingpong", pingpong_server, pingpong_client, 0},
};

int main(int argc, char **argv) {
    return xsock_main(argc, argv, "xsock", cases, sizeof cases / sizeof cases[0]);
}
