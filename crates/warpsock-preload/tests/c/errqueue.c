/* recvmsg(MSG_ERRQUEUE) on a DDP-mode socket whose peer sent 8 bytes:
 * EAGAIN, as TCP's empty error queue, and the 8 bytes are read next.
 * Review r22-e item 2: the flag was ignored and the call took the
 * stream's bytes as an ordinary read. Usage: errqueue [plain]. */
#include "ddppair.h"

int main(int argc, char **argv) {
    int plain = argc > 1 && !strcmp(argv[1], "plain");
    int c, s;
    sent_pair(&c, &s, plain, "abcdefgh", 8);
    /* The bytes are there: a poll sees them. */
    struct pollfd p = {.fd = c, .events = POLLIN};
    CHECK(poll(&p, 1, 10000) == 1);
    char b[64];
    CHECK(recv_errqueue(c, 0) == -1 && errno == EAGAIN);
    CHECK(recv_errqueue(c, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    CHECK(read(c, b, 8) == 8 && !memcmp(b, "abcdefgh", 8));
    printf("errqueue: ok\n");
    return 0;
}
