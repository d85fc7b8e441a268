/* One-sided bulk writes through one DDP-mode socket pair in one process,
 * for the counters of the writer's wait (tests/ddp_bulk.rs reads them from
 * the WARPSOCK_STATS report at exit): the target maps a 1 MiB region and
 * sends its offset on the stream, then blocks in read(2) for the writer's
 * 8-byte "done"; the writer keeps WINDOW asynchronous 1 MiB writes
 * (warpsock_aio_write) in flight, waiting for completions in poll(2) on a
 * non-blocking socket as an event loop does, MIB of them in all; its send
 * buffer is small (64 KiB), so the engine holds a backlog at every wait.
 * The target checks that its region holds the writer's bytes.
 *
 *   riobulk MIB                      exit 0 if every write completed */
#include "ddppair.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#define MSG (1 << 20)
#define WINDOW 4

typedef off_t (*riomap_fn)(int, void *, size_t, int, int, off_t);
typedef int (*riounmap_fn)(int, void *, size_t);
typedef int (*aio_write_fn)(int, const void *, size_t, off_t, uint64_t);
typedef int (*aio_poll_fn)(int, struct warpsock_aio_completion *, int);

static int mib;

/* The extended calls of the preloaded library. */
static void *sym(const char *name) { return preload_sym("riobulk", name); }

static unsigned char byte_at(size_t i) { return (unsigned char)((i * 2654435761u) >> 11); }

static void *writer(void *arg) {
    int fd = *(int *)arg;
    int small = 64 << 10;
    CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    ddp_mode(fd);
    aio_write_fn aio_write = (aio_write_fn)sym("warpsock_aio_write");
    aio_poll_fn aio_poll = (aio_poll_fn)sym("warpsock_aio_poll");
    int64_t off;
    CHECK(read(fd, &off, sizeof off) == (ssize_t)sizeof off);
    CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
    unsigned char *buf = malloc(MSG);
    CHECK(buf != NULL);
    for (size_t i = 0; i < MSG; i++) buf[i] = byte_at(i);
    int posted = 0, done = 0, in_flight = 0;
    while (done < mib) {
        while (in_flight < WINDOW && posted < mib) {
            CHECK(aio_write(fd, buf, MSG, (off_t)off, (uint64_t)posted) == 0);
            posted++;
            in_flight++;
        }
        struct warpsock_aio_completion c[WINDOW];
        int n = aio_poll(fd, c, WINDOW);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) CHECK(c[i].error == 0 && c[i].result == MSG);
        done += n;
        in_flight -= n;
        if (n == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            CHECK(poll(&p, 1, 20000) == 1);
        }
    }
    CHECK(fcntl(fd, F_SETFL, 0) == 0);
    CHECK(write(fd, "done!!!!", 8) == 8);
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    mib = atoi(argv[1]);
    CHECK(mib > 0);
    int c, s;
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, writer, &c) == 0);
    ddp_mode(s);
    riomap_fn riomap = (riomap_fn)sym("warpsock_riomap");
    riounmap_fn riounmap = (riounmap_fn)sym("warpsock_riounmap");
    unsigned char *region = mmap(NULL, MSG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED);
    int64_t off = riomap(s, region, MSG, PROT_WRITE, 0, -1);
    CHECK(off >= 0);
    CHECK(write(s, &off, sizeof off) == (ssize_t)sizeof off);
    char fin[8];
    size_t got = 0;
    while (got < sizeof fin) {
        ssize_t n = read(s, fin + got, sizeof fin - got);
        CHECK(n > 0);
        got += (size_t)n;
    }
    CHECK(memcmp(fin, "done!!!!", 8) == 0);
    for (size_t i = 0; i < MSG; i++) {
        if (region[i] != byte_at(i)) {
            fprintf(stderr, "riobulk: byte %zu of the region differs\n", i);
            return 1;
        }
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(riounmap(s, region, MSG) == 0);
    close(c);
    close(s);
    munmap(region, MSG);
    return 0;
}
