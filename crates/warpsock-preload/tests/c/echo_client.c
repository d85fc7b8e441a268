/* echo_client PORT COUNT [TRIES]: a legitimate peer. Sends "legit N" to
 * 127.0.0.1:PORT COUNT times and waits for each echo, sending it again
 * after each second of silence, TRIES times in all (default 3). Exits 0
 * once every echo came back intact; otherwise prints, for the datagram
 * that got none, every attempt's outcome (elapsed time, the receive
 * call's errno, datagrams that were not the echo). */
#include "common.h"

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1), count = atoi(argv[2]);
    int tries = argc > 3 ? atoi(argv[3]) : 3;
    CHECK(tries > 0);
    int s = udp_new();
    set_rcvtimeo(s, 1000);
    long start = now_ms();
    for (int i = 0; i < count; i++) {
        char msg[32], buf[64], log[4096];
        int len = snprintf(msg, sizeof msg, "legit %d", i);
        int ok = 0, used = 0;
        long t0 = now_ms();
        for (int attempt = 0; attempt < tries && !ok; attempt++) {
            send_to(s, port, msg, (size_t)len);
            int others = 0;
            ssize_t n;
            while ((n = recv(s, buf, sizeof buf, 0)) >= 0) {
                if (n == len && memcmp(buf, msg, (size_t)len) == 0) {
                    ok = 1;
                    break;
                }
                others++;
            }
            int e = errno;
            if (used < (int)sizeof log - 128)
                used += snprintf(log + used, sizeof log - (size_t)used,
                                 "  attempt %d at %ld ms: %s (errno %d: %s), %d other datagrams\n",
                                 attempt, now_ms() - t0, ok ? "echoed" : "no echo", ok ? 0 : e,
                                 ok ? "-" : strerror(e), others);
        }
        if (!ok) {
            fprintf(stderr,
                    "echo_client: no echo of \"%s\" (datagram %d of %d, %ld ms into the run, %d tries):\n%s",
                    msg, i, count, now_ms() - start, tries, log);
            return 1;
        }
    }
    printf("echoed %d\n", count);
    return 0;
}
