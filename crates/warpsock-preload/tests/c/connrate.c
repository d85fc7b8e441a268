/* Connection rate against an echo server on 127.0.0.1:PORT: COUNT times,
 * one after another, connect, write 8 bytes, read them back, close.
 * Prints "conns N secs S rate R" (connections a second). Bounded: stops
 * after LIMIT seconds (default 60) with whatever it made, and exits 1 if
 * any connection failed. Used by scripts/bench-ddp-accept.sh and tests/ddp_accept_stall.rs, both ends
 * preloaded in policy mode (each connection switches into DDP mode) or
 * neither (host TCP). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: conn-rate PORT COUNT [LIMIT_S]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    long count = atol(argv[2]);
    double limit = argc > 3 ? atof(argv[3]) : 60.0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    double t0 = now();
    long n = 0;
    for (; n < count && now() - t0 < limit; n++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
            fprintf(stderr, "conn-rate: connect %ld: %s\n", n, strerror(errno));
            return 1;
        }
        if (write(s, "pingpong", 8) != 8) {
            fprintf(stderr, "conn-rate: write %ld: %s\n", n, strerror(errno));
            return 1;
        }
        char b[8];
        size_t got = 0;
        while (got < sizeof b) {
            ssize_t r = read(s, b + got, sizeof b - got);
            if (r <= 0) {
                fprintf(stderr, "conn-rate: read %ld: %s\n", n, r ? strerror(errno) : "end of stream");
                return 1;
            }
            got += (size_t)r;
        }
        if (memcmp(b, "pingpong", 8) != 0) {
            fprintf(stderr, "conn-rate: echo %ld differs\n", n);
            return 1;
        }
        close(s);
    }
    double secs = now() - t0;
    printf("conns %ld secs %.3f rate %.1f\n", n, secs, (double)n / secs);
    return 0;
}
