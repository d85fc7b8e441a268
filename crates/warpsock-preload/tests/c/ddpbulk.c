/* A bulk stream over one DDP-mode socket pair in one process, for the
 * counters of its data path (tests/ddp_bulk.rs reads them from the
 * WARPSOCK_STATS report at exit): a writer thread sends MIB messages of
 * 1 MiB with blocking write(2), the main thread reads them with blocking
 * read(2)s framed as a program reads records — a 16-byte header, then up
 * to 1 MiB of body — and checks every byte. Mode "poll": the reader
 * polls for POLLIN before each read (a waiter the doorbell must wake).
 * Mode "epoll": the reader's first read is blocking, the others wait in
 * epoll_wait first — the first such wait finds bytes queued that no bell
 * announced (nobody could wait on the descriptor before), while the
 * writer may be blocked for credits: only a bell for what is queued then
 * wakes it.
 *
 *   ddpbulk MIB block|poll|epoll    exit 0 if every byte arrived intact */
#include "ddppair.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/epoll.h>

#define MSG (1 << 20)

static int mib;

static unsigned char byte_at(uint64_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static void *writer(void *arg) {
    int fd = *(int *)arg;
    ddp_mode(fd);
    unsigned char *buf = malloc(MSG);
    CHECK(buf != NULL);
    uint64_t at = 0;
    for (int m = 0; m < mib; m++) {
        for (size_t i = 0; i < MSG; i++) buf[i] = byte_at(at + i);
        size_t off = 0;
        while (off < MSG) {
            ssize_t n = write(fd, buf + off, MSG - off);
            CHECK(n > 0);
            off += (size_t)n;
        }
        at += MSG;
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    mib = atoi(argv[1]);
    int use_poll = strcmp(argv[2], "poll") == 0;
    int use_epoll = strcmp(argv[2], "epoll") == 0;
    CHECK(mib > 0 && (use_poll || use_epoll || strcmp(argv[2], "block") == 0));
    int c, s;
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, writer, &c) == 0);
    ddp_mode(s);
    int ep = -1;
    if (use_epoll) {
        ep = epoll_create1(EPOLL_CLOEXEC);
        CHECK(ep >= 0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    }
    unsigned char *buf = malloc(MSG);
    CHECK(buf != NULL);
    uint64_t got = 0, total = (uint64_t)mib * MSG;
    for (int k = 0; got < total; k++) {
        if (use_poll) {
            struct pollfd p = {.fd = s, .events = POLLIN};
            CHECK(poll(&p, 1, 20000) == 1 && (p.revents & POLLIN));
        }
        if (use_epoll && k > 0) {
            struct epoll_event ev;
            CHECK(epoll_wait(ep, &ev, 1, 20000) == 1 && (ev.events & EPOLLIN));
        }
        ssize_t n = read(s, buf, k % 2 == 0 ? 16 : MSG);
        CHECK(n > 0);
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != byte_at(got + (uint64_t)i)) {
                fprintf(stderr, "ddpbulk: byte %llu differs\n", (unsigned long long)(got + i));
                return 1;
            }
        }
        got += (uint64_t)n;
    }
    CHECK(pthread_join(t, NULL) == 0);
    free(buf);
    close(c);
    close(s);
    if (ep >= 0) close(ep);
    return 0;
}
