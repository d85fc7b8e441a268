/* The program's own TCP sockets and UDP to excluded ports (53) are not
 * touched: a TCP echo over loopback works and keeps the system's default
 * congestion control, UDP to port 53 goes out as kernel UDP. Prints the
 * congestion control of its TCP socket. Port: p (TCP). */
#include "common.h"
#include <netinet/tcp.h>
#include <pthread.h>

static int lfd;

static void *echo(void *arg) {
    (void)arg;
    int c = accept(lfd, NULL, NULL);
    CHECK(c >= 0);
    char b[4096];
    ssize_t k;
    while ((k = read(c, b, sizeof b)) > 0) CHECK(write(c, b, (size_t)k) == k);
    close(c);
    return NULL;
}

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(lfd >= 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = lo(port);
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, echo, NULL) == 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0);
    char cc[32] = {0};
    socklen_t l = sizeof cc;
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_CONGESTION, cc, &l) == 0);
    static char out[100000], in[100000];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (char)(i * 13);
    CHECK(write(c, out, sizeof out) == (ssize_t)sizeof out);
    size_t got = 0;
    while (got < sizeof in) {
        ssize_t k = read(c, in + got, sizeof in - got);
        CHECK(k > 0);
        got += (size_t)k;
    }
    CHECK(memcmp(in, out, sizeof in) == 0);
    shutdown(c, SHUT_WR);
    pthread_join(t, NULL);
    close(c);
    /* DNS port: kernel UDP even under the preload (nobody listens; a sendto
     * on an unconnected socket succeeds). */
    int u = udp_new();
    send_to(u, 53, "q", 1);
    printf("cc=%s\n", cc);
    return 0;
}
