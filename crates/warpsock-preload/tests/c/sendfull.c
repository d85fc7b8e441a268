/* A non-blocking sender that outruns its receiver, the way the benchmark
 * suite's fan-in senders do: send until EAGAIN, then poll() for POLLOUT
 * and send again. Readiness for writing must be exact: a poll that says
 * POLLOUT is followed by a send that takes the datagram, so the sender
 * sleeps in poll instead of spinning. The receiver starts reading only
 * once the sender has waited (or after a bound), then takes everything.
 * A hello and its answer go first, so the burst starts on a connection
 * that is up.
 * Prints "sent N received R eagain E spurious S timeouts T": spurious
 * counts POLLOUT reports followed by EAGAIN (see preload.rs for what the
 * preloaded run must show; kernel UDP on loopback rarely says EAGAIN and
 * may drop datagrams, so the kernel run checks neither). Ports: a b. */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

enum { COUNT = 640, LEN = 32 << 10 };

static int pa, pb, sa, sb;
static atomic_int go, done;

static void *receiver(void *arg) {
    (void)arg;
    static unsigned char buf[LEN + 1];
    /* The hello first: its connection is set up before the burst. */
    CHECK(recv(sb, buf, sizeof buf, 0) == 5);
    send_to(sb, pa, "ack", 3);
    long end = now_ms() + 20000;
    while (!atomic_load(&go)) {
        CHECK(now_ms() < end);
        sleep_ms(1);
    }
    int got = 0;
    set_rcvtimeo(sb, 500);
    while (got < COUNT) {
        ssize_t n = recv(sb, buf, sizeof buf, 0);
        if (n < 0) {
            CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
            if (atomic_load(&done)) {
                break; /* kernel UDP lost the rest */
            }
            continue;
        }
        CHECK(n == LEN);
        got++;
    }
    return (void *)(long)got;
}

int main(int argc, char **argv) {
    pa = port_arg(argc, argv, 1);
    pb = port_arg(argc, argv, 2);
    sa = udp_bound(pa);
    sb = udp_bound(pb);
    struct sockaddr_in b = lo(pb);
    CHECK(connect(sa, (struct sockaddr *)&b, sizeof b) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, receiver, NULL) == 0);
    /* A hello answered: the offload's connection is up (a send during
     * its set-up may find the buffer full with nothing to wait on). */
    char ack[8];
    CHECK(send(sa, "hello", 5, 0) == 5);
    CHECK(recv(sa, ack, sizeof ack, 0) == 3);
    CHECK(fcntl(sa, F_SETFL, fcntl(sa, F_GETFL) | O_NONBLOCK) == 0);
    static unsigned char out[LEN];
    memset(out, 'x', sizeof out);
    long eagain = 0, spurious = 0, timeouts = 0, first_full = 0;
    long end = now_ms() + 30000;
    for (int i = 0; i < COUNT; i++) {
        int polled = 0;
        for (;;) {
            ssize_t n = send(sa, out, LEN, 0);
            if (n == LEN) {
                break;
            }
            CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
            CHECK(now_ms() < end);
            eagain++;
            spurious += polled;
            if (first_full == 0) {
                first_full = now_ms();
            }
            /* Start the receiver once the sender had to wait, or after a
             * bound when poll keeps saying writable. */
            if (timeouts > 0 || now_ms() - first_full > 300) {
                atomic_store(&go, 1);
            }
            struct pollfd p = {sa, POLLOUT, 0};
            int r = poll(&p, 1, 100);
            CHECK(r >= 0);
            if (r == 0) {
                timeouts++;
                polled = 0;
            } else {
                CHECK(p.revents & POLLOUT);
                polled = 1;
            }
        }
    }
    atomic_store(&go, 1);
    atomic_store(&done, 1);
    void *got;
    CHECK(pthread_join(t, &got) == 0);
    printf("sent %d received %ld eagain %ld spurious %ld timeouts %ld\n", COUNT, (long)got,
           eagain, spurious, timeouts);
    return 0;
}
