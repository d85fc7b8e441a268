/*
 * The plumbing of the DDP-mode server/client test programs under
 * libwarpsock_preload.so (xsock.c: the extended calls of
 * warpsock_sockets.h and the data paths; xsockswitch.c: the switch and the
 * sockets semantics of issue 12 around it), each case a server half and a
 * client half on a connected descriptor:
 *
 *   PROG CASE local                      both ends here (fork), loopback
 *   PROG CASE server ADDR PORTFILE       listen on ADDR, write the port
 *   PROG CASE client ADDR PORT           connect
 *
 * Exit status 0 on success; a failure prints what and where. Built with
 * -Icrates/warpsock-preload/include and linked with the library
 * (scripts/test-xsock.sh).
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

static const char *role = "?";
#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "xsock %s: %s:%d: check failed: %s (errno %d %s)\n", role,    \
                    __FILE__, __LINE__, #c, errno, strerror(errno));                      \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Deterministic bytes: byte i of stream `seed`. */
static inline uint8_t pat(uint64_t seed, uint64_t i) {
    uint64_t x = (i ^ (seed * 0x9E3779B97F4A7C15ull)) * 0x2545F4914F6CDD1Dull;
    return (uint8_t)(x >> 56);
}

static inline void fill(uint8_t *b, size_t n, uint64_t seed, uint64_t at) {
    for (size_t i = 0; i < n; i++) b[i] = pat(seed, at + i);
}

static inline void send_all(int fd, const void *b, size_t n) {
    const uint8_t *p = b;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        CHECK(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

static inline void recv_all(int fd, void *b, size_t n) {
    uint8_t *p = b;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        CHECK(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

static inline void expect_pattern(int fd, size_t n, uint64_t seed) {
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

static inline void send_pattern(int fd, size_t n, uint64_t seed) {
    uint8_t *b = malloc(n ? n : 1);
    CHECK(b);
    fill(b, n, seed, 0);
    send_all(fd, b, n);
    free(b);
}

static inline int ddp(int fd) {
    int one = 1;
    return setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
}

static inline int getopt_int(int fd, int level, int name) {
    int v = -1;
    socklen_t l = sizeof v;
    CHECK(getsockopt(fd, level, name, &v, &l) == 0);
    return v;
}

static inline void sync_byte(int fd, char c) {
    send_all(fd, &c, 1);
}

static inline void wait_byte(int fd, char c) {
    char got = 0;
    recv_all(fd, &got, 1);
    CHECK(got == c);
}

struct tcase {
    const char *name;
    void (*server)(int);
    void (*client)(int);
    int early; /* request DDP mode on the listener and before connect() */
};

static inline int listener(const char *addr, int early, int *port) {
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

static inline int dial(const char *addr, int port, int early) {
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

static inline void run_server(const struct tcase *c, int l) {
    int fd = accept(l, NULL, NULL);
    CHECK(fd >= 0);
    close(l);
    c->server(fd);
    CHECK(close(fd) == 0);
}

/* The program's main: the case argv[1] of `cases` (n of them), run as
 * argv[2] says (see the top); `prog` names the program in its messages. */
static inline int xsock_main(int argc, char **argv, const char *prog, const struct tcase *cases,
                             size_t n) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CASE local | server ADDR PORTFILE | client ADDR PORT\n", prog);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct tcase *c = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(cases[i].name, argv[1])) c = &cases[i];
    if (!c) {
        fprintf(stderr, "%s: unknown case %s\n", prog, argv[1]);
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
        printf("%s %s: ok\n", prog, c->name);
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
        printf("%s %s server: ok\n", prog, c->name);
        return 0;
    }
    if (!strcmp(argv[2], "client") && argc == 5) {
        role = "client";
        int fd = dial(argv[3], atoi(argv[4]), c->early);
        c->client(fd);
        CHECK(close(fd) == 0);
        printf("%s %s client: ok\n", prog, c->name);
        return 0;
    }
    fprintf(stderr, "%s: bad arguments\n", prog);
    return 2;
}
