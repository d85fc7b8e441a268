/* echo_client PORT COUNT: a legitimate peer. Sends "legit N" to
 * 127.0.0.1:PORT COUNT times and waits for each echo (resending twice
 * after a second of silence). Exits 0 once every echo came back intact. */
#include "common.h"

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1), count = atoi(argv[2]);
    int s = udp_new();
    set_rcvtimeo(s, 1000);
    for (int i = 0; i < count; i++) {
        char msg[32], buf[64];
        int len = snprintf(msg, sizeof msg, "legit %d", i);
        int ok = 0;
        for (int attempt = 0; attempt < 3 && !ok; attempt++) {
            send_to(s, port, msg, (size_t)len);
            ssize_t n;
            while ((n = recv(s, buf, sizeof buf, 0)) >= 0) {
                if (n == len && memcmp(buf, msg, (size_t)len) == 0) {
                    ok = 1;
                    break;
                }
            }
        }
        if (!ok) {
            fprintf(stderr, "echo_client: no echo of \"%s\"\n", msg);
            return 1;
        }
    }
    printf("echoed %d\n", count);
    return 0;
}
