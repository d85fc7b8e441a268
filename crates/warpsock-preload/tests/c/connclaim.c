/* Policy-mode connects of one process switch at once, not one after
 * another (issue 12, session 40). Run in policy mode for 127.0.0.1
 * (WARPSOCK_DDP_ADDRS=127.0.0.1/32) with a long WARPSOCK_DDP_FALLBACK_MS.
 *
 * Thread A connects to a listener nobody accepts from: the kernel
 * completes the connection, and A's switch marks and waits for an answer
 * that never comes (up to the fallback). Thread B then connects to a
 * listener this process accepts from (the library answers): its switch
 * must finish while A's still waits. A process-wide lock over adoptions
 * made B wait for A's whole fallback. A's wait is ended by closing its
 * peer's end, so the run stays short either way.
 *
 *   connclaim */
#include "ddppair.h"

#include <stdatomic.h>

static atomic_int a_done;
static int port_a, port_b;

static void *connect_a(void *arg) {
    (void)arg;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(s >= 0);
    struct sockaddr_in a = lo(port_a);
    /* Returns at once: the switch runs in the background (it ran here
     * before, under the process-wide lock); the descriptor becomes
     * writable when the switch is over — here, when its peer ends
     * (below). Either outcome is the end of A's wait. */
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
        struct pollfd p = {s, POLLOUT, 0};
        (void)poll(&p, 1, 60000);
    }
    atomic_store(&a_done, 1);
    close(s);
    return NULL;
}

static void *accept_b(void *arg) {
    int l = *(int *)arg;
    int c = accept(l, NULL, NULL);
    CHECK(c >= 0);
    char b;
    CHECK(recv(c, &b, 1, 0) == 1 && b == 'b');
    CHECK(send(c, "B", 1, MSG_NOSIGNAL) == 1);
    close(c);
    return NULL;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int la = tcp_listener_lo(4, &port_a), lb = tcp_listener_lo(4, &port_b);
    pthread_t ta, tb;
    CHECK(pthread_create(&tb, NULL, accept_b, &lb) == 0);
    CHECK(pthread_create(&ta, NULL, connect_a, NULL) == 0);
    /* A is inside its switch before B starts: its mark has come. The
     * connection is taken with the raw system call, out of the library's
     * sight (nothing here answers A's switch). */
    struct pollfd p = {la, POLLIN, 0};
    CHECK(poll(&p, 1, 30000) == 1);
    int sa = (int)syscall(SYS_accept4, la, NULL, NULL, 0);
    CHECK(sa >= 0);
    struct pollfd u = {sa, POLLPRI, 0};
    CHECK(poll(&u, 1, 30000) == 1 && (u.revents & POLLPRI));
    if (atomic_load(&a_done)) {
        fprintf(stderr, "connclaim: A's switch was over before B began "
                        "(is WARPSOCK_DDP_FALLBACK_MS long?)\n");
        return 1;
    }
    int b = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(b >= 0);
    struct sockaddr_in a = lo(port_b);
    CHECK(connect(b, (struct sockaddr *)&a, sizeof a) == 0);
    int mode = -1;
    socklen_t ml = sizeof mode;
    CHECK(getsockopt(b, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &mode, &ml) == 0);
    int a_was_done = atomic_load(&a_done);
    CHECK(send(b, "b", 1, MSG_NOSIGNAL) == 1);
    char r;
    CHECK(recv(b, &r, 1, 0) == 1 && r == 'B');
    close(b);
    CHECK(pthread_join(tb, NULL) == 0);
    /* End A's wait: its peer's end (A's switch sees the end of stream
     * where it waits for the answer's mark). */
    close(sa);
    close(la);
    CHECK(pthread_join(ta, NULL) == 0);
    close(lb);
    if (mode != 1) {
        fprintf(stderr, "connclaim: B's connection is not in DDP mode (%d)\n", mode);
        return 1;
    }
    if (a_was_done) {
        fprintf(stderr, "connclaim: B's switch finished only after A's was over: "
                        "the two connects' switches ran one after the other\n");
        return 1;
    }
    return 0;
}
