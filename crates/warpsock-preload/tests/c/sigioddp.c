/* Signal-driven I/O on a DDP-mode stream socket (issue 12; shim/sigio.rs,
 * Socket::set_async): O_ASYNC, F_SETOWN, F_SETSIG and FIOASYNC as tcp(7)
 * and fcntl(2) answer them. The three live on the open file, and a DDP
 * socket's number names the doorbell's end: before, the doorbell signalled
 * nothing (the library rang no bell without a waiter in sight), settings
 * made before a switch stayed on the TCP socket (the engine's from then
 * on, which signalled the program for its own traffic: credits), and
 * FIOASYNC went to the TCP socket. Checked (also over TCP with "plain",
 * no preload), with the signals blocked and taken by sigtimedwait:
 *   - after: set after the switch, an arrival is a SIGIO, again after a
 *     read; with F_SETSIG an RT signal naming the number with POLLIN; a
 *     full send side that drains is one; the peer's shutdown is one;
 *     FIOASYNC off signals nothing, on again signals;
 *   - before: set before the switch, they are still set after it (owner,
 *     signal, O_ASYNC); 1 MiB sent and read (the peer's credits come back)
 *     makes no POLLIN signal; an arrival makes one;
 *   - accepted: set right after accept on a listener in DDP mode (the
 *     switch in the background), an arrival is signalled.
 * Prints "sigioddp: ok". */
#include "ddppair.h"

#include <fcntl.h>
#include <sys/ioctl.h>

#define BULK (1 << 20)

/* The next `sig` within ms (its info in *si), or -1. */
static int next_signal(int sig, int ms, siginfo_t *si) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    return sigtimedwait(&set, si, &ts);
}

/* Takes every SIGIO and SIGRTMIN pending now. */
static void flush_signals(void) {
    siginfo_t si;
    while (next_signal(SIGIO, 0, &si) > 0 || next_signal(SIGRTMIN, 0, &si) > 0) {
    }
}

/* Owner this process, O_ASYNC on (and F_SETSIG rt if nonzero). */
static void signal_driven(int fd, int rt) {
    CHECK(fcntl(fd, F_SETOWN, getpid()) == 0);
    if (rt) CHECK(fcntl(fd, F_SETSIG, rt) == 0);
    CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC) == 0);
}

static int is_async(int fd) {
    int fl = fcntl(fd, F_GETFL);
    CHECK(fl >= 0);
    return (fl & O_ASYNC) != 0;
}

/* Waits (10 s) for an RT signal naming fd with POLLIN after which fd is
 * readable (a signal with nothing to read, such as a switch's end, is
 * passed over), then reads want bytes. */
static void signalled_arrival(int fd, const char *want) {
    for (int k = 0;; k++) {
        CHECK(k < 10);
        siginfo_t si;
        CHECK(next_signal(SIGRTMIN, 10000, &si) == SIGRTMIN);
        CHECK(si.si_fd == fd);
        if (!(si.si_band & POLLIN)) continue;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) == 1) break;
    }
    char b[16];
    size_t n = strlen(want);
    CHECK(recv(fd, b, n, MSG_WAITALL) == (ssize_t)n && memcmp(b, want, n) == 0);
}

static void after(int plain) {
    int c, s;
    tcp_pair_small(&c, &s, 1 << 16);
    if (!plain) ddp_switch(&c, &s);
    siginfo_t si;
    signal_driven(c, 0);
    CHECK(fcntl(c, F_GETOWN) == getpid());
    CHECK(next_signal(SIGIO, 100, &si) == -1 && errno == EAGAIN);
    CHECK(write(s, "ab", 2) == 2);
    CHECK(next_signal(SIGIO, 10000, &si) == SIGIO);
    char b[16];
    CHECK(recv(c, b, 2, MSG_WAITALL) == 2 && memcmp(b, "ab", 2) == 0);
    CHECK(write(s, "cd", 2) == 2);
    CHECK(next_signal(SIGIO, 10000, &si) == SIGIO);
    CHECK(recv(c, b, 2, MSG_WAITALL) == 2 && memcmp(b, "cd", 2) == 0);
    /* F_SETSIG: a queued RT signal naming the number, band POLLIN. */
    CHECK(fcntl(c, F_SETSIG, SIGRTMIN) == 0);
    CHECK(fcntl(c, F_GETSIG) == SIGRTMIN);
    CHECK(write(s, "ef", 2) == 2);
    signalled_arrival(c, "ef");
    CHECK(fcntl(c, F_SETSIG, 0) == 0);
    /* FIOASYNC off: nothing; on: signalled. */
    int off = 0, on = 1;
    CHECK(ioctl(c, FIOASYNC, &off) == 0 && !is_async(c));
    flush_signals();
    CHECK(write(s, "gh", 2) == 2);
    CHECK(next_signal(SIGIO, 200, &si) == -1 && errno == EAGAIN);
    CHECK(recv(c, b, 2, MSG_WAITALL) == 2 && memcmp(b, "gh", 2) == 0);
    CHECK(ioctl(c, FIOASYNC, &on) == 0 && is_async(c));
    CHECK(write(s, "ij", 2) == 2);
    CHECK(next_signal(SIGIO, 10000, &si) == SIGIO);
    CHECK(recv(c, b, 2, MSG_WAITALL) == 2 && memcmp(b, "ij", 2) == 0);
    /* A full send side, drained by the peer: writable is signalled. */
    CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) == 0);
    static char big[1 << 16];
    size_t sent = 0;
    for (int k = 0;; k++) {
        CHECK(k < 100000);
        ssize_t n = send(c, big, sizeof big, MSG_DONTWAIT);
        if (n < 0) {
            CHECK(errno == EAGAIN);
            break;
        }
        sent += (size_t)n;
    }
    flush_signals();
    size_t got = 0;
    while (got < sent) {
        ssize_t n = read(s, big, sizeof big);
        CHECK(n > 0);
        got += (size_t)n;
    }
    CHECK(next_signal(SIGIO, 10000, &si) == SIGIO);
    /* The peer's end of stream. */
    flush_signals();
    CHECK(shutdown(s, SHUT_WR) == 0);
    CHECK(next_signal(SIGIO, 10000, &si) == SIGIO);
    CHECK(read(c, b, 1) == 0);
    close(c);
    close(s);
}

struct bulk {
    int fd;
    char *buf;
};

static void *bulk_writer(void *arg) {
    struct bulk *w = arg;
    write_every(w->fd, w->buf, BULK);
    return NULL;
}

static void before(int plain) {
    int c, s;
    tcp_pair(&c, &s);
    signal_driven(c, SIGRTMIN);
    if (!plain) ddp_switch(&c, &s);
    CHECK(is_async(c));
    CHECK(fcntl(c, F_GETOWN) == getpid());
    CHECK(fcntl(c, F_GETSIG) == SIGRTMIN);
    flush_signals();
    /* c sends 1 MiB, s reads it all: s's credits come back to c, which
     * has nothing to read — no POLLIN signal (the TCP socket under c, the
     * engine's, signalled each of them when it kept the settings). */
    static char buf[BULK];
    struct bulk w = {c, buf};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, bulk_writer, &w) == 0);
    static char sink[BULK];
    size_t got = 0;
    while (got < BULK) {
        ssize_t n = read(s, sink, BULK - got);
        CHECK(n > 0);
        got += (size_t)n;
    }
    CHECK(pthread_join(t, NULL) == 0);
    siginfo_t si;
    for (int k = 0;; k++) {
        CHECK(k < 10000);
        if (next_signal(SIGRTMIN, 200, &si) < 0) break;
        CHECK(!(si.si_band & POLLIN));
    }
    CHECK(write(s, "kl", 2) == 2);
    signalled_arrival(c, "kl");
    close(c);
    close(s);
}

static void *connect_ddp(void *arg) {
    int *c = arg;
    struct sockaddr_in a = lo(c[1]);
    CHECK(connect(c[0], (struct sockaddr *)&a, sizeof a) == 0);
    return NULL;
}

static void accepted(int plain) {
    int port;
    int l = tcp_listener_lo(4, &port);
    int c[2] = {socket(AF_INET, SOCK_STREAM, 0), port};
    CHECK(c[0] >= 0);
    if (!plain) {
        ddp_mode(l);
        ddp_mode(c[0]);
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, connect_ddp, c) == 0);
    int s = accept(l, NULL, NULL);
    CHECK(s >= 0);
    /* At once: the switch is likely still under way. */
    signal_driven(s, SIGRTMIN);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(write(c[0], "mn", 2) == 2);
    signalled_arrival(s, "mn");
    if (!plain) {
        int mode = 0;
        socklen_t len = sizeof mode;
        CHECK(getsockopt(s, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &mode, &len) == 0 && mode == 1);
    }
    CHECK(is_async(s) && fcntl(s, F_GETSIG) == SIGRTMIN);
    close(c[0]);
    close(s);
    close(l);
}

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGIO);
    sigaddset(&set, SIGRTMIN);
    CHECK(sigprocmask(SIG_BLOCK, &set, NULL) == 0);
    after(plain);
    before(plain);
    accepted(plain);
    printf("sigioddp: ok\n");
    return 0;
}
