/* readyrace PORT_A PORT_B: a datagram that reaches a connection while a
 * receive call is serving it off the ready list must still wake an
 * edge-triggered epoll_wait. The preload built with the test hooks is told
 * (WARPSOCK_TEST_SERVE_GAP_FD) to stop the first receive call that drains a
 * ready connection just before it takes the connection off the list, and
 * to cue this program's sender thread, which then sends one more datagram
 * over the same connection; the hook lets the progress thread see it
 * before the call goes on. A sends COUNT numbered datagrams to B one at a
 * time; B waits with edge-triggered epoll and drains with MSG_DONTWAIT
 * until EAGAIN after every wake-up; every datagram, the cued one too, must
 * arrive exactly once. Against kernel UDP the cue never comes.
 * Prints "cued N" (1: the race was staged). */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>

#define COUNT 40

static int cue[2], sender, port_b;
static atomic_int cued;

static void *send_on_cue(void *arg) {
    (void)arg;
    char c;
    if (read(cue[0], &c, 1) == 1) {
        int seq = COUNT;
        char buf[100];
        memset(buf, 'y', sizeof buf);
        memcpy(buf, &seq, sizeof seq);
        atomic_store(&cued, 1);
        send_to(sender, port_b, buf, sizeof buf);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int pa = port_arg(argc, argv, 1);
    port_b = port_arg(argc, argv, 2);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cue) == 0);
    char fdnum[16];
    snprintf(fdnum, sizeof fdnum, "%d", cue[1]);
    CHECK(setenv("WARPSOCK_TEST_SERVE_GAP_FD", fdnum, 1) == 0);
    sender = udp_bound(pa);
    int b = udp_bound(port_b);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data = {.fd = b}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, send_on_cue, NULL) == 0);
    char seen[COUNT + 1] = {0};
    char buf[256];
    int got = 0, sent = 0;
    while (sent < COUNT || got < sent + atomic_load(&cued)) {
        if (sent < COUNT && got == sent + atomic_load(&cued)) {
            memset(buf, 'x', 100);
            memcpy(buf, &sent, sizeof sent);
            send_to(sender, port_b, buf, 100);
            sent++;
        }
        struct epoll_event out;
        int n = epoll_wait(ep, &out, 1, 5000);
        CHECK(n == 1);
        for (;;) {
            ssize_t k = recv(b, buf, sizeof buf, MSG_DONTWAIT);
            if (k < 0) {
                CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
                break;
            }
            CHECK(k == 100);
            int seq;
            memcpy(&seq, buf, sizeof seq);
            CHECK(seq >= 0 && seq <= COUNT);
            CHECK(seq < sent || (seq == COUNT && atomic_load(&cued)));
            CHECK(!seen[seq]);
            seen[seq] = 1;
            got++;
        }
    }
    /* Ends the sender thread if the cue never came. */
    CHECK(shutdown(cue[1], SHUT_WR) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    struct pollfd p = {.fd = b, .events = POLLIN};
    CHECK(poll(&p, 1, 0) == 0);
    printf("cued %d\n", atomic_load(&cued));
    return 0;
}
