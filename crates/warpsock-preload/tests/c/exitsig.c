/* exitsig PORT: sends 64-byte datagrams to 127.0.0.1:PORT without pause,
 * printing "sending" after the first 100, for at most 20 s, until SIGTERM:
 * the handler calls exit(7). Most of the loop's time is inside the
 * library's send, so the signal mostly lands there (a stretch that may hold
 * a lock: the exit skips the linger), as when a busy UDP sender is stopped
 * (iperf3 -s -1 -R under test-preload.sh's SIGTERM). Its counters must be
 * printed at that exit all the same (tests/preload.rs). */
#include "common.h"
#include <signal.h>

static void on_term(int sig) {
    (void)sig;
    exit(7);
}

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    CHECK(sigaction(SIGTERM, &sa, NULL) == 0);
    int s = udp_new();
    char buf[64] = "exitsig";
    long end = now_ms() + 20000;
    struct sockaddr_in a = lo(port);
    for (long i = 0; now_ms() < end; i++) {
        /* Nothing need listen on the port: the sends go on either way. */
        (void)sendto(s, buf, sizeof buf, 0, (struct sockaddr *)&a, sizeof a);
        if (i == 100) {
            printf("sending\n");
            fflush(stdout);
        }
    }
    return 1; /* no SIGTERM within 20 s */
}
