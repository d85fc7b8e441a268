/* A one-thread TCP echo server on a non-blocking listener (an event loop
 * over poll, or over select or epoll with "select" or "epoll" as its first
 * argument; its waits' timeout in ms the second, default 1000, -1 for
 * none), as event-loop servers are: it binds 127.0.0.1 port 0 itself (a
 * policy-mode candidate must be the preloaded process's own socket),
 * prints "ready PORT", echoes every connection's bytes and, on "quit",
 * prints the longest any one accept4 call took ("accept_max_ms N") and
 * exits 0. The epoll loop registers each connection as it accepts it and
 * closes it registered (the close takes it out of the set), as redis's
 * and nginx's do. ACCEPTSTALL_FREE_FDS=N in the environment: once its
 * listener (and set) are made, it lowers its RLIMIT_NOFILE so that N
 * descriptor numbers are left free (a server at its limit).
 * ACCEPTSTALL_BATCH=K: the loop leaves the first K connections it
 * accepts alone (no call, no wait on them) until it holds all K, then
 * serves them, and the later ones at once.
 * Bounded: it exits 1 after 120 s. */
#include "common.h"
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#define MAXC 256

enum { POLL, SELECT, EPOLL };

/* The epoll loop's set: every descriptor of the loop's array in it. */
static int ep = -1;

/* A new descriptor of the loop's array (the epoll loop registers it). */
static void watch(int fd) {
    if (ep < 0)
        return;
    struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
}

/* poll(2) over p[0..n), or select(2) or epoll_wait(2) over the same
 * descriptors (the revents set as poll's would be, for input). */
static int wait_for(struct pollfd *p, int n, int ms, int mode) {
    if (mode == POLL)
        return poll(p, (nfds_t)n, ms);
    if (mode == EPOLL) {
        struct epoll_event ev[MAXC + 1];
        int k = epoll_wait(ep, ev, MAXC + 1, ms);
        for (int i = 0; i < n; i++) {
            p[i].revents = 0;
            for (int j = 0; j < k; j++)
                if (ev[j].data.fd == p[i].fd)
                    p[i].revents = POLLIN;
        }
        return k;
    }
    fd_set r;
    FD_ZERO(&r);
    int top = -1;
    for (int i = 0; i < n; i++) {
        CHECK(p[i].fd < FD_SETSIZE);
        FD_SET(p[i].fd, &r);
        if (p[i].fd > top)
            top = p[i].fd;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    int k = select(top + 1, &r, NULL, NULL, ms < 0 ? NULL : &tv);
    for (int i = 0; i < n; i++)
        p[i].revents = k > 0 && FD_ISSET(p[i].fd, &r) ? POLLIN : 0;
    return k;
}

int main(int argc, char **argv) {
    /* As servers do: an echo to a client that went away (a hostile one
     * that marked its switch and left with our mark unread, which makes
     * its close a reset) fails with EPIPE instead of ending the server. */
    signal(SIGPIPE, SIG_IGN);
    int mode = argc < 2 ? POLL : strcmp(argv[1], "select") == 0 ? SELECT
                                : strcmp(argv[1], "epoll") == 0  ? EPOLL
                                                                 : POLL;
    int wait_ms = argc > 2 ? atoi(argv[2]) : 1000;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    int one = 1;
    CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    struct sockaddr_in a = lo(0);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 128) == 0);
    CHECK(fcntl(l, F_SETFL, fcntl(l, F_GETFL) | O_NONBLOCK) == 0);
    socklen_t al = sizeof a;
    CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
    const char *free_fds = getenv("ACCEPTSTALL_FREE_FDS");
    if (free_fds) {
        /* The lowest free number: every number below it is open, so a
         * limit N above it leaves N free (none open above it: a fresh
         * process's descriptors are its lowest). */
        int low = fcntl(l, F_DUPFD_CLOEXEC, 0);
        CHECK(low >= 0 && close(low) == 0);
        struct rlimit r;
        CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
        r.rlim_cur = (rlim_t)(low + atoi(free_fds));
        CHECK(setrlimit(RLIMIT_NOFILE, &r) == 0);
    }
    printf("ready %d\n", ntohs(a.sin_port));
    fflush(stdout);
    struct pollfd p[MAXC + 1];
    int n = 0;
    long worst = 0, end = now_ms() + 120000;
    if (mode == EPOLL) {
        ep = epoll_create1(EPOLL_CLOEXEC);
        CHECK(ep >= 0);
    }
    p[n++] = (struct pollfd){.fd = l, .events = POLLIN};
    watch(l);
    const char *batch_env = getenv("ACCEPTSTALL_BATCH");
    int batch = batch_env ? atoi(batch_env) : 1, held[MAXC], nheld = 0;
    CHECK(batch >= 1 && batch <= MAXC);
    while (now_ms() < end) {
        CHECK(wait_for(p, n, wait_ms, mode) >= 0);
        for (int i = n - 1; i >= 0; i--) {
            if (!p[i].revents)
                continue;
            if (p[i].fd == l) {
                long t0 = now_ms();
                int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
                long took = now_ms() - t0;
                if (took > worst)
                    worst = took;
                if (c >= 0 && n + nheld <= MAXC) {
                    held[nheld++] = c;
                    if (nheld == batch) {
                        for (int k = 0; k < nheld; k++) {
                            p[n++] = (struct pollfd){.fd = held[k], .events = POLLIN};
                            watch(held[k]);
                        }
                        nheld = 0;
                        batch = 1;
                    }
                } else if (c >= 0)
                    close(c);
                continue;
            }
            char buf[512];
            ssize_t r = read(p[i].fd, buf, sizeof buf);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (r >= 4 && memcmp(buf, "quit", 4) == 0) {
                printf("accept_max_ms %ld\n", worst);
                fflush(stdout);
                return 0;
            }
            if (r <= 0) {
                close(p[i].fd);
                p[i] = p[--n];
                continue;
            }
            (void)!write(p[i].fd, buf, (size_t)r);
        }
    }
    fprintf(stderr, "acceptstall: no quit within 120 s\n");
    return 1;
}
