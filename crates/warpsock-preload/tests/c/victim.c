/* victim NOFILE SLEEP_MS [CONNECT_PORT]: the program under attack in
 * tests/attacks.rs. Binds a UDP port on 127.0.0.1 (port 0: the kernel picks
 * one) and prints "ready PORT". With NOFILE > 0 its descriptor limit is
 * lowered to that first; with CONNECT_PORT it connects its socket there
 * (then only that peer may be heard). After SLEEP_MS without reading, it
 * serves until "quit" or 20 s of silence:
 *   "to:PORT:TEXT"  sends TEXT to 127.0.0.1:PORT (a fresh destination),
 *   "quit"          exits 0,
 *   anything else   is echoed to its source.
 * Every datagram is reported on stdout as "got LEN from PORT: TEXT" (TEXT:
 * up to 32 printable bytes), so the test sees exactly what was delivered;
 * except datagrams of 0 or 1 byte (floods), which are only counted and
 * neither echoed nor reported. */
#include "common.h"
#include <sys/resource.h>

int main(int argc, char **argv) {
    CHECK(argc >= 3);
    int nofile = atoi(argv[1]), sleep_for = atoi(argv[2]);
    if (nofile > 0) {
        struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    /* A port the kernel picks, whose TCP twin our offload listener got
     * (another socket may hold that TCP port): checked by connecting to it. */
    int s = -1;
    struct sockaddr_in a;
    for (int attempt = 0; attempt < 50 && s < 0; attempt++) {
        s = socket(AF_INET, SOCK_DGRAM, 0);
        CHECK(s >= 0);
        a = lo(0);
        CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
        socklen_t al = sizeof a;
        CHECK(getsockname(s, (struct sockaddr *)&a, &al) == 0);
        int t = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(t >= 0);
        set_rcvtimeo(t, 2000);
        char hello[4];
        /* Our listener says hello, or closes at once if its policy refuses
         * us (WARPSOCK_UDP_ADDRS). */
        ssize_t h = connect(t, (struct sockaddr *)&a, sizeof a) == 0
                        ? recv(t, hello, sizeof hello, MSG_WAITALL)
                        : -1;
        if (!(h == 0 || (h == 4 && memcmp(hello, "WSUA", 4) == 0))) {
            close(s);
            s = -1;
        }
        close(t);
    }
    CHECK(s >= 0);
    if (argc > 3) {
        struct sockaddr_in p = lo(atoi(argv[3]));
        CHECK(connect(s, (struct sockaddr *)&p, sizeof p) == 0);
    }
    printf("ready %d\n", ntohs(a.sin_port));
    fflush(stdout);
    sleep_ms(sleep_for);
    set_rcvtimeo(s, 20000);
    static char buf[65536];
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(s, buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &fl);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            puts("silence");
            return 2;
        }
        CHECK(n >= 0);
        if (n <= 1) continue;
        buf[n] = 0;
        char text[33];
        int k = 0;
        for (; k < n && k < 32; k++) text[k] = (buf[k] >= 32 && buf[k] < 127) ? buf[k] : '.';
        text[k] = 0;
        printf("got %zd from %d: %s\n", n, ntohs(from.sin_port), text);
        fflush(stdout);
        if (n == 4 && memcmp(buf, "quit", 4) == 0) return 0;
        if (n > 3 && memcmp(buf, "to:", 3) == 0) {
            int port = atoi(buf + 3);
            char *msg = strchr(buf + 3, ':');
            CHECK(msg != NULL);
            msg++;
            struct sockaddr_in d = lo(port);
            CHECK(sendto(s, msg, strlen(msg), 0, (struct sockaddr *)&d, sizeof d) == (ssize_t)strlen(msg));
            continue;
        }
        if (argc > 3)
            CHECK(send(s, buf, (size_t)n, 0) == n);
        else
            CHECK(sendto(s, buf, (size_t)n, 0, (struct sockaddr *)&from, fl) == n);
    }
}
