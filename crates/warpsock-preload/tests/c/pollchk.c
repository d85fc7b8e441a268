/* poll and ppoll as a program built with _FORTIFY_SOURCE calls them
 * (glibc's bits/poll2.h: a count that is not a constant and an array of
 * known size make the call __poll_chk / __ppoll_chk; Debian's memcached is
 * built so) on a DDP-mode socket whose peer has sent 8 bytes: the poll
 * must report them. Review r22-e item 1: nothing interposed the _chk
 * entry points, so such a poll waited on the socket's doorbell alone and
 * timed out. Usage: pollchk poll|ppoll [plain] (plain: no switch, over
 * TCP). tests/ddp_fortify.rs checks with nm that the calls are there. */
#undef _FORTIFY_SOURCE
#define _FORTIFY_SOURCE 2
#include "ddppair.h"

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    int use_ppoll = !strcmp(argv[1], "ppoll");
    int plain = argc > 2 && !strcmp(argv[2], "plain");
    int c, s;
    sent_pair(&c, &s, plain, "abcdefgh", 8);
    struct pollfd p[4];
    memset(p, 0, sizeof p);
    p[0].fd = c;
    p[0].events = POLLIN;
    /* A count the compiler cannot bound: the fortified header calls the
     * _chk entry point (argv[3], never given, would add to it). */
    nfds_t n = 1 + (argc > 3 ? (nfds_t)strtoul(argv[3], NULL, 10) : 0);
    CHECK(n <= 4);
    int r;
    if (use_ppoll) {
        struct timespec ts = {10, 0};
        r = ppoll(p, n, &ts, NULL);
    } else {
        r = poll(p, n, 10000);
    }
    CHECK(r == 1 && (p[0].revents & POLLIN));
    char b[8];
    CHECK(read(c, b, sizeof b) == 8 && !memcmp(b, "abcdefgh", 8));
    printf("pollchk %s: ok\n", argv[1]);
    return 0;
}
