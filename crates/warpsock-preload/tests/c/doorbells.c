/* No stale readiness: once the only datagram has been read, the descriptor
 * must not poll readable, however the receive call and the arrival
 * interleaved.
 *  1. The datagram is already queued when the first receive call comes
 *     (the receiver was slow to get there, as under load): under the
 *     preload it arrived over TCP while the hidden kernel UDP socket had
 *     never been looked at.
 *  2. The same for every later datagram: send, let it land, then read.
 *  3. A blocking receive that takes a kernel UDP datagram itself (under the
 *     preload it waits on the hidden kernel socket too) before the progress
 *     thread handles that arrival (the test runs it with
 *     WARPSOCK_TEST_UDP_READY_DELAY_MS so that it always comes first).
 * Each read is followed by poll (50 ms), select and a non-blocking receive,
 * which must all find nothing. */
#include "common.h"
#include <pthread.h>
#include <sys/select.h>

static int r, raw, port;

static void *send_later(void *arg) {
    int tag = (int)(long)arg;
    sleep_ms(2);
    raw_send(raw, port, &tag, sizeof tag);
    return NULL;
}

static void quiet(const char *what, int i) {
    struct pollfd p = {r, POLLIN, 0};
    int n = poll(&p, 1, 50);
    CHECK(n >= 0);
    if (n != 0) {
        fprintf(stderr, "%s #%d: readable after the only datagram was read (revents %#x)\n",
                what, i, p.revents);
        exit(1);
    }
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(r, &rd);
    struct timeval tv = {0, 0};
    CHECK(select(r + 1, &rd, NULL, NULL, &tv) == 0);
    int v;
    CHECK(recv(r, &v, sizeof v, MSG_DONTWAIT) == -1 && errno == EAGAIN);
}

int main(int argc, char **argv) {
    port = port_arg(argc, argv, 1);
    r = udp_bound(port);
    int s = udp_new();
    raw = raw_udp();
    int v = 1;

    /* 1: the first datagram lands (connection set-up included) before the
     * first receive call. */
    send_to(s, port, &v, sizeof v);
    sleep_ms(300);
    v = 0;
    CHECK(recv(r, &v, sizeof v, 0) == sizeof v && v == 1);
    quiet("first datagram, read late", 1);

    /* 2: later datagrams over the established path, read late. */
    for (int i = 2; i < 7; i++) {
        send_to(s, port, &i, sizeof i);
        sleep_ms(30);
        v = 0;
        CHECK(recv(r, &v, sizeof v, 0) == sizeof v && v == i);
        quiet("datagram read late", i);
    }

    /* 3: a blocking receive already waiting when a kernel datagram arrives. */
    for (int i = 100; i < 120; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, send_later, (void *)(long)i) == 0);
        v = 0;
        CHECK(recv(r, &v, sizeof v, 0) == sizeof v && v == i);
        CHECK(pthread_join(t, NULL) == 0);
        quiet("kernel datagram taken by a blocking receive", i);
    }
    puts("doorbells: ok");
    return 0;
}
