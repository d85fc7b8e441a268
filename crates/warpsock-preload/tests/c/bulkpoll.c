/* Bursts of long datagrams received the way event loops and the benchmark
 * suite's fan-in receive: wait in poll(), then receive with MSG_DONTWAIT
 * until EAGAIN, poll again until the burst is in. Each round one side
 * sends BURST datagrams of 32 KiB (longer than the peek the preload's
 * poll looks with) and the other answers with a short acknowledgement,
 * received the same way. Checks every datagram arrives whole, in order
 * and intact. (Under the preload the counters of the run show what each
 * burst cost: see preload.rs.) Ports: a b. */
#include <pthread.h>

#include "common.h"

enum { ROUNDS = 200, BURST = 3, LEN = 32 << 10 };

static int pa, pb, sa, sb;

static unsigned char pattern(int round, int i, int k) {
    return (unsigned char)(round * 7 + i * 13 + k);
}

/* Receives one datagram from `s`: poll (bounded) and non-blocking receives
 * until one comes. */
static ssize_t take(int s, unsigned char *buf, size_t cap) {
    long end = now_ms() + 10000;
    for (;;) {
        ssize_t n = recv(s, buf, cap, MSG_DONTWAIT);
        if (n >= 0) {
            return n;
        }
        CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
        CHECK(now_ms() < end);
        struct pollfd p = {s, POLLIN, 0};
        CHECK(poll(&p, 1, 5000) == 1);
    }
}

static void *receiver(void *arg) {
    (void)arg;
    static unsigned char buf[LEN + 1];
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < BURST; i++) {
            ssize_t n = take(sb, buf, sizeof buf);
            CHECK(n == LEN);
            for (int k = 0; k < LEN; k += 997) {
                CHECK(buf[k] == pattern(r, i, k));
            }
        }
        char ack[16];
        int len = snprintf(ack, sizeof ack, "ack %d", r);
        send_to(sb, pa, ack, (size_t)len);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pa = port_arg(argc, argv, 1);
    pb = port_arg(argc, argv, 2);
    sa = udp_bound(pa);
    sb = udp_bound(pb);
    /* Room for a whole burst in the kernel's queue (the kernel UDP run). */
    int rcv = 1 << 20;
    CHECK(setsockopt(sb, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv) == 0);
    static unsigned char out[LEN];
    pthread_t t;
    CHECK(pthread_create(&t, NULL, receiver, NULL) == 0);
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < BURST; i++) {
            for (int k = 0; k < LEN; k++) {
                out[k] = pattern(r, i, k);
            }
            send_to(sa, pb, out, LEN);
        }
        unsigned char ack[64];
        char want[16];
        int len = snprintf(want, sizeof want, "ack %d", r);
        ssize_t n = take(sa, ack, sizeof ack);
        CHECK(n == len && memcmp(ack, want, (size_t)len) == 0);
    }
    CHECK(pthread_join(t, NULL) == 0);
    printf("ok %d rounds\n", ROUNDS);
    return 0;
}
