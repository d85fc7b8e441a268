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
    char b[64], ctl[256];
    struct iovec iov = {.iov_base = b, .iov_len = sizeof b};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t r = recvmsg(c, &m, MSG_ERRQUEUE);
    CHECK(r == -1 && errno == EAGAIN);
    r = recvmsg(c, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    CHECK(r == -1 && errno == EAGAIN);
    CHECK(read(c, b, 8) == 8 && !memcmp(b, "abcdefgh", 8));
    printf("errqueue: ok\n");
    return 0;
}
