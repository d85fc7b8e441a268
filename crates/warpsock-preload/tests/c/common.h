/* Shared helpers for the UDP-semantics test programs. Each program checks
 * one area of UDP behaviour on 127.0.0.1 and exits 0 only if every check
 * holds. They pass against the kernel's own UDP (run without the preload),
 * which is what makes them a specification for the offload layer. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s (errno %d: %s)\n", __FILE__, __LINE__, \
                    #c, errno, strerror(errno));                                          \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static inline struct sockaddr_in lo(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* A TCP listener on 127.0.0.1, port 0 (the kernel's pick: no race for a
 * free port), its backlog `backlog`; its port into *port. */
static inline int tcp_listener_lo(int backlog, int *port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in a = lo(0);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, backlog) == 0);
    socklen_t al = sizeof a;
    CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
    *port = ntohs(a.sin_port);
    return l;
}

/* tcp_listener_lo, then "ready PORT" printed for the test that started
 * the program; returns the listener. */
static inline int tcp_listener_ready(int backlog) {
    int port;
    int l = tcp_listener_lo(backlog, &port);
    printf("ready %d\n", port);
    fflush(stdout);
    return l;
}

static inline void set_rcvtimeo(int fd, int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
}

/* A UDP socket bound to 127.0.0.1:port, with a 5 s receive timeout so a
 * missing datagram fails the test instead of hanging it. */
static inline int udp_bound(int port) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    struct sockaddr_in a = lo(port);
    CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    set_rcvtimeo(s, 5000);
    return s;
}

static inline int udp_new(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    set_rcvtimeo(s, 5000);
    return s;
}

static inline void send_to(int s, int port, const void *buf, size_t len) {
    struct sockaddr_in a = lo(port);
    CHECK(sendto(s, buf, len, 0, (struct sockaddr *)&a, sizeof a) == (ssize_t)len);
}

static inline int port_arg(int argc, char **argv, int i) {
    if (argc <= i) {
        fprintf(stderr, "usage: %s port...\n", argv[0]);
        exit(2);
    }
    return atoi(argv[i]);
}

static inline long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static inline void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* A kernel UDP sender that bypasses libc (and so the preload): its
 * datagrams reach the receiver's kernel socket, never a TCP connection. */
static inline int raw_udp(void) {
    int s = (int)syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    return s;
}

static inline void raw_send(int s, int port, const void *buf, size_t len) {
    struct sockaddr_in a = lo(port);
    CHECK(syscall(SYS_sendto, s, buf, len, 0, (struct sockaddr *)&a, sizeof a) == (long)len);
}

/* Whether `fd` polls readable within `ms`. */
static inline int poll_readable(int fd, int ms) {
    struct pollfd p = {fd, POLLIN, 0};
    int n = poll(&p, 1, ms);
    CHECK(n >= 0);
    return n == 1 && (p.revents & POLLIN);
}

/* Whether select() finds `fd` readable within `ms`. */
static inline int select_readable(int fd, int ms) {
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(fd, &rd);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    int n = select(fd + 1, &rd, NULL, NULL, &tv);
    CHECK(n >= 0);
    return n == 1 && FD_ISSET(fd, &rd);
}
