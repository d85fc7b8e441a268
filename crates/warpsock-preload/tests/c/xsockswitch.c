/*
 * DDP-mode sockets under libwarpsock_preload.so: the switch and the
 * sockets semantics of issue 12 around it, as server/client pairs (the
 * extended calls and the data paths: xsock.c; the plumbing, usage and
 * helpers: xsockcase.h).
 *
 *   switch    pre-switch bytes, the switch, options, bad values;
 *   calls     every data call and flag, readiness, timeouts, dup/dup2,
 *             shutdown, orderly close;
 *   nbswitch  a socket non-blocking when it switches stays so; blocking
 *             once the program clears O_NONBLOCK;
 *   kill      the client killed mid-stream: the server reads the end or
 *             ECONNRESET, as over TCP;
 *   fork      a child's copy of a DDP-mode socket is refused; the
 *             parent's connection is unharmed;
 *   plain     a peer that never switches: ECONNREFUSED, the connection an
 *             intact TCP connection;
 *   early     DDP mode requested on the listening socket and before
 *             connect();
 *   epoll     an epoll registration made before the switch follows the
 *             descriptor;
 *   epollplain  the plain case's refused switch, waited on with epoll.
 *
 *   xsockswitch CASE local | server ADDR PORTFILE | client ADDR PORT
 */
#include "xsockcase.h"

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

/* fork: a child's copy of a DDP-mode socket is refused with an error
 * (documented: ENOTCONN on read, EPIPE on write); the parent's connection
 * is unharmed. */
static void fork_server(int fd) {
    CHECK(ddp(fd) == 0);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        char b[4];
        int ok = read(fd, b, 4) == -1 && errno == ENOTCONN && send(fd, "x", 1, MSG_NOSIGNAL) == -1 &&
                 errno == EPIPE;
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

static void switch_server(int fd) { switch_common(fd, 1); }
static void switch_client(int fd) { switch_common(fd, 0); }
static void early_server(int fd) { early_side(fd, 1); }
static void early_client(int fd) { early_side(fd, 0); }

static const struct tcase cases[] = {
    {"switch", switch_server, switch_client, 0},
    {"calls", calls_server, calls_client, 0},
    {"nbswitch", nbswitch_server, nbswitch_client, 0},
    {"kill", kill_server, kill_client, 0},
    {"fork", fork_server, fork_client, 0},
    {"plain", plain_server, plain_client, 0},
    {"early", early_server, early_client, 1},
    {"epoll", epoll_server, epoll_client, 0},
    {"epollplain", plain_server, epollplain_client, 0},
};

int main(int argc, char **argv) {
    return xsock_main(argc, argv, "xsockswitch", cases, sizeof cases / sizeof cases[0]);
}
