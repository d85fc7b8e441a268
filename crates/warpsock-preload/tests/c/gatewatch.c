/* The write gate and the progress thread's watch (issue 12; session 21,
 * review r21-send items 2 and 5), one switched pair in one process, a
 * window of 4 slots of 1 KiB and no send buffer (WARPSOCK_DDP_SLOTS=4
 * WARPSOCK_DDP_SLOT_KB=1 WARPSOCK_DDP_SNDBUF=0, set by tests/ddp_gate.rs):
 *
 *   A non-blocking send that meets EAGAIN shuts the program's writability
 *   (the doorbell's write gate), and the credits that open it come back
 *   with input, which the progress thread must then process while the
 *   program waits in poll(POLLOUT): the progress thread's watch of the
 *   writer's engine socket (its epoll set's entry, read from
 *   /proc/self/fdinfo) includes EPOLLIN. Without it the gate stayed shut
 *   with the peer's credit unread (the stream case's hang).
 *   Once the reader has read everything, poll(POLLOUT) returns; the wait is
 *   over, and after one more round the watch is off again (left on, the
 *   progress thread would wake for every arrival of the connection's life).
 *   shutdown(SHUT_WR) over a shut gate reports POLLOUT at once, as TCP's
 *   poll does, and the send fails with EPIPE.
 *
 * Exit 0 if every check holds. */
#include "ddppair.h"

#include <dirent.h>
#include <sys/epoll.h>
#include <pthread.h>

static int c, s;
static size_t sent, got;

static void *switch_peer(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

static unsigned short local_port(int fd) {
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &l) != 0 || a.sin_family != AF_INET) return 0;
    return ntohs(a.sin_port);
}

/* The events the progress thread watches the engine socket of local port
 * `port` for: the entry of an epoll set in /proc/self/fdinfo whose target
 * is a TCP socket of that port (the only such entry: the engine's socket
 * is the connection's own). */
static unsigned watch_of(unsigned short port) {
    DIR *d = opendir("/proc/self/fdinfo");
    CHECK(d);
    unsigned found = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[320], line[256];
        snprintf(path, sizeof path, "/proc/self/fdinfo/%s", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        while (fgets(line, sizeof line, f)) {
            int tfd;
            unsigned ev;
            if (sscanf(line, "tfd: %d events: %x", &tfd, &ev) == 2 && local_port(tfd) == port) {
                found = ev;
                n++;
            }
        }
        fclose(f);
    }
    closedir(d);
    CHECK(n == 1);
    return found;
}

/* The stream's next n bytes, non-blocking: the count, or -1 with EAGAIN. */
static ssize_t send_next(size_t n) {
    static unsigned char b[1000];
    memset(b, (int)(sent & 0xff), sizeof b);
    ssize_t r = send_nb(c, b, n);
    if (r > 0) sent += (size_t)r;
    return r;
}

static void read_all(void) { recv_until(s, &got, sent, NULL); }

/* The writer's watch goes off within a bounded number of rounds (each
 * non-blocking receive is one; 10 ms apart, 10 s in all). */
static void watch_goes_off(unsigned short port) {
    char b;
    for (int k = 0;; k++) {
        CHECK(recv(c, &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
        if ((watch_of(port) & EPOLLIN) == 0) return;
        CHECK(k < 1000);
        CHECK(poll(NULL, 0, 10) == 0);
    }
}

/* Sends until the window is spent (EAGAIN: the gate shuts). */
static void fill_window(void) {
    while (send_next(1000) > 0) CHECK(sent < 100000);
}

int main(void) {
    tcp_pair(&c, &s);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, switch_peer, &c) == 0);
    ddp_mode(s);
    CHECK(pthread_join(t, NULL) == 0);
    set_rcvtimeo(s, 10000);
    set_rcvtimeo(c, 10000);
    unsigned short port = local_port(c);
    CHECK(port != 0);

    /* A round trip, blocking: the connection is established, nothing is
     * owed, the writer's watch is off (the baseline the checks below
     * need: the test could not tell a wait from an idle watch without). */
    char b1 = 'p';
    CHECK(send(c, &b1, 1, 0) == 1);
    CHECK(recv(s, &b1, 1, 0) == 1);
    CHECK(send(s, &b1, 1, 0) == 1);
    CHECK(recv(c, &b1, 1, 0) == 1);
    CHECK(recv(c, &b1, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN); /* a round */
    CHECK((watch_of(port) & EPOLLIN) == 0);

    /* The gate shuts; the credits must be watched for. */
    fill_window();
    CHECK((watch_of(port) & EPOLLIN) != 0);
    struct pollfd p = {c, POLLOUT, 0};
    CHECK(poll(&p, 1, 0) == 0); /* not writable: no credit */

    /* The reader takes everything: its credits open the gate, with no call
     * of the writer but its poll on the doorbell. */
    read_all();
    p.revents = 0;
    CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLOUT));
    /* The wait is over: the watch goes off within a few rounds (each
     * non-blocking receive is one; a control message the writer owes the
     * reader, a credit return for the CREDITs it took in, keeps the watch
     * on until it has gone). Left on, it never goes off. */
    watch_goes_off(port);

    /* Shut again, then shutdown(SHUT_WR): POLLOUT at once, the send fails
     * with EPIPE. */
    fill_window();
    p.revents = 0;
    CHECK(poll(&p, 1, 0) == 0);
    CHECK(shutdown(c, SHUT_WR) == 0);
    p.revents = 0;
    CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLOUT));
    char z = 'z';
    CHECK(send(c, &z, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EPIPE);

    /* The reader gets every byte, then the end of the stream; the wait
     * for writability ended with the shutdown, so once the end of stream
     * has gone the watch goes off (left on, the progress thread woke for
     * every arrival for the rest of the connection). */
    read_all();
    static unsigned char rest[16];
    CHECK(recv(s, rest, sizeof rest, 0) == 0);
    watch_goes_off(port);
    puts("gatewatch: ok");
    return 0;
}
