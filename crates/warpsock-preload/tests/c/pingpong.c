/* Blocking ping-pong between two threads (the latency pattern: each side
 * sleeps in recvfrom until the other's datagram arrives), then a burst
 * received by a blocking call while the descriptor's readiness is checked:
 * after the first datagram of the burst is taken the descriptor must poll
 * readable until the last one is taken, and not after. Ports: a b. */
#include <pthread.h>

#include "common.h"

enum { ROUNDS = 2000, BURST = 10, BURSTS = 5 };

static int pa, pb, sa, sb;

static void *echo(void *arg) {
    (void)arg;
    char buf[256];
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(sb, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        CHECK(n >= 0);
        CHECK(from.sin_port == htons((unsigned short)pa));
        if (n == 4 && memcmp(buf, "stop", 4) == 0) break;
        CHECK(sendto(sb, buf, (size_t)n, 0, (struct sockaddr *)&from, fl) == n);
    }
    return NULL;
}

static void *gather(void *arg) {
    (void)arg;
    char buf[BURST][64];
    ssize_t len[BURST];
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    for (int i = 0; i < BURST; i++) {
        len[i] = recvfrom(sb, buf[i], sizeof buf[i], 0, (struct sockaddr *)&from, &fl);
        CHECK(len[i] > 0);
    }
    sleep_ms(5); /* the main thread is asleep in recv by now */
    for (int i = 0; i < BURST; i++)
        CHECK(sendto(sb, buf[i], (size_t)len[i], 0, (struct sockaddr *)&from, fl) == len[i]);
    return NULL;
}

static int readable_within(int fd, int ms) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, ms) >= 0);
    return (p.revents & POLLIN) != 0;
}

static int readable(int fd) { return readable_within(fd, 0); }

int main(int argc, char **argv) {
    pa = port_arg(argc, argv, 1);
    pb = port_arg(argc, argv, 2);
    sa = udp_bound(pa);
    sb = udp_bound(pb);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, echo, NULL) == 0);
    char out[64], in[256];
    for (int i = 0; i < ROUNDS; i++) {
        int len = snprintf(out, sizeof out, "ping %d", i);
        send_to(sa, pb, out, (size_t)len);
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(sa, in, sizeof in, 0, (struct sockaddr *)&from, &fl);
        CHECK(n == len && memcmp(in, out, (size_t)len) == 0);
        CHECK(from.sin_port == htons((unsigned short)pb));
    }
    send_to(sa, pb, "stop", 4);
    CHECK(pthread_join(t, NULL) == 0);

    /* Bursts: the echo thread gathers BURST datagrams and sends them all
     * back while this thread is asleep in recv, so one wake-up can find
     * several (often all). Whoever read them, the rest must make the
     * descriptor readable, and once all are read it must not be. */
    for (int b = 0; b < BURSTS; b++) {
        CHECK(pthread_create(&t, NULL, gather, NULL) == 0);
        for (int i = 0; i < BURST; i++) {
            int len = snprintf(out, sizeof out, "burst %d", i);
            send_to(sa, pb, out, (size_t)len);
        }
        for (int i = 0; i < BURST; i++) {
            /* Bounded: under load the echo thread (and, under the preload,
             * a batch's tail) may still be on the way; a datagram that was
             * read but left the descriptor unreadable fails here. */
            if (i > 0) CHECK(readable_within(sa, 3000));
            int len = snprintf(out, sizeof out, "burst %d", i);
            ssize_t n = recv(sa, in, sizeof in - 1, 0);
            if (n != len || memcmp(in, out, (size_t)len) != 0) {
                in[n > 0 ? n : 0] = 0;
                fprintf(stderr, "burst: expected \"%s\", recv returned %zd \"%s\"\n", out, n, in);
                exit(1);
            }
        }
        CHECK(!readable(sa));
        CHECK(pthread_join(t, NULL) == 0);
    }
    printf("ok %d rounds\n", ROUNDS);
    return 0;
}
