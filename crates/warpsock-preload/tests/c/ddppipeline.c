/* A client that pipelines its requests over one DDP-mode socket pair in
 * one process (issue 12): the main thread writes N requests of 8-64 bytes
 * with blocking write(2)s before it reads any answer; a server thread
 * reads each request with blocking read(2)s and writes its answer (the
 * request's bytes reversed, each plus one), one at a time, then closes.
 * Over TCP this completes; over DDP it deadlocked once each side's 8 B
 * messages had filled the other's receive slots (one message per slot),
 * until a send that finds no credit went into the send buffer. Every
 * answer is checked by content, then the end of stream; alarm(50) turns
 * a hang into a failure.
 *
 *   ddppipeline N    exit 0 if every answer arrived intact */
#include "ddppair.h"

#include <pthread.h>
#include <stdint.h>

static int n_req;

static size_t request(int i, unsigned char *r) {
    size_t len = 8 + (size_t)(i * 7) % 57;
    r[0] = (unsigned char)len;
    for (size_t k = 1; k < len; k++) r[k] = (unsigned char)((i * 2654435761u + k * 40503u) >> 7);
    return len;
}

static size_t answer(const unsigned char *req, size_t len, unsigned char *a) {
    for (size_t k = 0; k < len; k++) a[k] = (unsigned char)(req[len - 1 - k] + 1);
    return len;
}

static void read_full(int fd, unsigned char *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        CHECK(r > 0);
        got += (size_t)r;
    }
}

static void write_full(int fd, const unsigned char *b, size_t n) {
    ssize_t w = write(fd, b, n);
    CHECK(w == (ssize_t)n); /* a blocking write takes all of it */
}

static void *server(void *arg) {
    int fd = *(int *)arg;
    ddp_mode(fd);
    unsigned char req[64], a[64];
    for (int i = 0; i < n_req; i++) {
        read_full(fd, req, 1);
        size_t len = req[0];
        CHECK(len >= 8 && len <= 64);
        read_full(fd, req + 1, len - 1);
        write_full(fd, a, answer(req, len, a));
    }
    CHECK(close(fd) == 0);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    n_req = atoi(argv[1]);
    CHECK(n_req > 0);
    alarm(50);
    int c, s;
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, server, &s) == 0);
    ddp_mode(c);
    unsigned char req[64], want[64], got[64];
    for (int i = 0; i < n_req; i++) write_full(c, req, request(i, req));
    for (int i = 0; i < n_req; i++) {
        size_t len = answer(req, request(i, req), want);
        read_full(c, got, len);
        if (memcmp(got, want, len) != 0) {
            fprintf(stderr, "ddppipeline: answer %d differs\n", i);
            return 1;
        }
    }
    CHECK(read(c, got, sizeof got) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    close(c);
    printf("ddppipeline %d: ok\n", n_req);
    return 0;
}
