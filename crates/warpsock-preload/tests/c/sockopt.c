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
 *               pipe byte written just before that read (r22-c item 3).
 *
 * Synchronised on events (pipes, the peer's bytes), no sleeps; every loop
 * bounded. */
#include "ddppair.h"

#include <pthread.h>
#include <sched.h>

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

static int lowat(int fd) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &len) == 0 && len == sizeof v);
    return v;
}

static void set_lowat(int fd, int v) {
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0);
}

static void case_rcvlowat(void) {
    set_lowat(c, 1024);
    pthread_t pt;
    CHECK(pthread_create(&pt, NULL, peer_echo, NULL) == 0);
    switch_end(c);
    CHECK(lowat(c) == 1024);
    set_lowat(c, 1024);
    CHECK(lowat(c) == 1024);
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
    CHECK(lowat(c) == 1024);
    pthread_join(pt, NULL);
}

static void *peer_after_go(void *a) {
    (void)a;
    switch_end(s);
    char b[8];
    read8(s, b); /* the first message */
    CHECK(write(s, b, 8) == 8);
    char g;
    CHECK(read(gpipe[0], &g, 1) == 1);
    CHECK(write(s, "abcdefgh", 8) == 8);
    return NULL;
}

static void case_blockafter(void) {
    CHECK(pipe(gpipe) == 0);
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE [plain]\n", argv[0]);
        return 2;
    }
    plain = argc > 2 && !strcmp(argv[2], "plain");
    tcp_pair(&c, &s);
    const char *cs = argv[1];
    if (!strcmp(cs, "rcvlowat")) {
        case_rcvlowat();
    } else if (!strcmp(cs, "blockafter")) {
        case_blockafter();
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    close(c);
    close(s);
    printf("sockopt %s: ok\n", cs);
    return 0;
}
