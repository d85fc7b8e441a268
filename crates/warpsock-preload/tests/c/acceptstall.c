/* A one-thread TCP echo server on a non-blocking listener (poll loop), as
 * event-loop servers are: it binds 127.0.0.1 port 0 itself (a policy-mode
 * candidate must be the preloaded process's own socket), prints
 * "ready PORT", echoes every connection's bytes and, on "quit", prints the
 * longest any one accept4 call took ("accept_max_ms N") and exits 0.
 * Bounded: it exits 1 after 120 s. */
#include "common.h"

#define MAXC 256

int main(void) {
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
    printf("ready %d\n", ntohs(a.sin_port));
    fflush(stdout);
    struct pollfd p[MAXC + 1];
    int n = 0;
    long worst = 0, end = now_ms() + 120000;
    p[n++] = (struct pollfd){.fd = l, .events = POLLIN};
    while (now_ms() < end) {
        CHECK(poll(p, (nfds_t)n, 1000) >= 0);
        for (int i = n - 1; i >= 0; i--) {
            if (!p[i].revents)
                continue;
            if (p[i].fd == l) {
                long t0 = now_ms();
                int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
                long took = now_ms() - t0;
                if (took > worst)
                    worst = took;
                if (c >= 0 && n <= MAXC)
                    p[n++] = (struct pollfd){.fd = c, .events = POLLIN};
                else if (c >= 0)
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
