/* threads PORT THREADS COUNT SIZE: THREADS threads send COUNT datagrams of
 * SIZE bytes each on ONE shared socket to 127.0.0.1:PORT, where this
 * program's receiver (another socket) checks that every datagram arrives
 * exactly once and intact: thread number, sequence number, and a pattern
 * that depends on both. Under the preload the sends race on one offloaded
 * socket's connection buffer or GSO batch. */
#include "common.h"
#include <pthread.h>

static int s, port, count, size;

static void fill(char *b, int t, int q) {
    memcpy(b, &t, 4);
    memcpy(b + 4, &q, 4);
    for (int i = 8; i < size; i++) b[i] = (char)(i * 7 + t * 13 + q);
}

static void *sender(void *arg) {
    int t = (int)(long)arg;
    char *b = malloc((size_t)size);
    CHECK(b != NULL);
    for (int q = 0; q < count; q++) {
        fill(b, t, q);
        send_to(s, port, b, (size_t)size);
        if (q % 64 == 63) {
            struct timespec ts = {0, 200 * 1000L};
            nanosleep(&ts, NULL);
        }
    }
    free(b);
    return NULL;
}

int main(int argc, char **argv) {
    port = port_arg(argc, argv, 1);
    int threads = atoi(argv[2]);
    count = atoi(argv[3]);
    size = atoi(argv[4]);
    CHECK(threads > 0 && threads <= 16 && count > 0 && size >= 8 && size <= 65507);
    int r = udp_bound(port);
    int want = 32 << 20;
    if (setsockopt(r, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0)
        CHECK(setsockopt(r, SOL_SOCKET, SO_RCVBUF, &want, sizeof want) == 0);
    s = udp_new();
    pthread_t th[16];
    for (int t = 0; t < threads; t++)
        CHECK(pthread_create(&th[t], NULL, sender, (void *)(long)t) == 0);
    char *seen = calloc((size_t)(threads * count), 1);
    char *buf = malloc(65536), *want_b = malloc((size_t)size);
    int got = 0, dup = 0, bad = 0;
    set_rcvtimeo(r, 5000);
    while (got < threads * count) {
        ssize_t k = recv(r, buf, 65536, 0);
        if (k < 0) break;
        int t, q;
        memcpy(&t, buf, 4);
        memcpy(&q, buf + 4, 4);
        int ok = k == size && t >= 0 && t < threads && q >= 0 && q < count;
        if (ok) {
            fill(want_b, t, q);
            ok = memcmp(buf, want_b, (size_t)size) == 0;
        }
        if (!ok) {
            bad++;
            continue;
        }
        if (seen[t * count + q]++) {
            dup++;
            continue;
        }
        got++;
    }
    for (int t = 0; t < threads; t++) CHECK(pthread_join(th[t], NULL) == 0);
    printf("received %d of %d dup %d bad %d\n", got, threads * count, dup, bad);
    return got == threads * count && dup == 0 && bad == 0 ? 0 : 1;
}
