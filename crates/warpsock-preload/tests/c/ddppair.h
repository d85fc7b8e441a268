/* Helpers of the one-process DDP-mode test programs (ddpbulk.c,
 * riobulk.c, eintr.c, sockopt.c): a connected loopback TCP pair, the
 * switch, and whether a thread sleeps in a wait. */
#include "common.h"

#include "../../include/warpsock_sockets.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>

/* Switches fd into DDP mode (the peer does the same, in another thread). */
static void ddp_mode(int fd) {
    int one = 1;
    CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == 0);
}

/* A connected pair on 127.0.0.1: *c the connecting end, *s the accepted
 * one (the listener is closed), both with SO_RCVBUF rcvbuf (0: the
 * kernel's; set before the window is announced: on the listener, whose
 * connection inherits it). */
static void tcp_pair_small(int *c, int *s, int rcvbuf) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    if (rcvbuf > 0) CHECK(setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
    struct sockaddr_in a = lo(0);
    socklen_t alen = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    *c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(*c >= 0);
    if (rcvbuf > 0) CHECK(setsockopt(*c, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
    CHECK(connect(*c, (struct sockaddr *)&a, sizeof a) == 0);
    *s = accept(l, NULL, NULL);
    CHECK(*s >= 0);
    close(l);
}

/* tcp_pair_small with the kernel's receive buffer. */
static void tcp_pair(int *c, int *s) {
    tcp_pair_small(c, s, 0);
}

/* Installs h for SIGSEGV and SIGBUS: a thread's receive into a buffer it
 * cannot write faults in the library's copy in DDP mode (over TCP the
 * kernel returns EFAULT instead). */
static inline void on_fault(void (*h)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0 && sigaction(SIGBUS, &sa, NULL) == 0);
}

/* ddp_mode of the int at arg: the peer end's switch, in a thread. */
static inline void *ddp_mode_thread(void *arg) {
    ddp_mode(*(int *)arg);
    return NULL;
}

/* A connected pair switched at both ends: *c's switch in a thread of its
 * own (the handshake needs both ends at once), *s's in this one. */
static inline void ddp_switch(int *c, int *s) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, ddp_mode_thread, c) == 0);
    ddp_mode(*s);
    CHECK(pthread_join(t, NULL) == 0);
}

/* tcp_pair switched at both ends (ddp_switch). */
static inline void ddp_pair(int *c, int *s) {
    tcp_pair(c, s);
    ddp_switch(c, s);
}

/* tcp_pair, switched (ddp_pair) unless plain: the programs that pass
 * against kernel TCP with "plain" and run preloaded otherwise. */
static inline void pair_unless_plain(int plain, int *c, int *s) {
    if (plain)
        tcp_pair(c, s);
    else
        ddp_pair(c, s);
}

/* After a child's work: s still carries a byte to c, and s's close reads
 * as end of stream (0) at c, within 10 s each (deadlines, not sleeps); c
 * is closed. 0, or 1 with a message naming `who`. */
static inline int parent_pair_ends_cleanly(int c, int s, const char *who) {
    char b;
    CHECK(send(s, "d", 1, MSG_NOSIGNAL) == 1);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    CHECK(recv(c, &b, 1, 0) == 1 && b == 'd');
    CHECK(close(s) == 0);
    if (poll(&p, 1, 10000) != 1) {
        fprintf(stderr, "%s: the parent's close of its DDP socket read no end of stream at "
                        "the peer within 10 s\n", who);
        return 1;
    }
    ssize_t r = recv(c, &b, 1, 0);
    if (r != 0) {
        fprintf(stderr, "%s: the parent's close read %zd (errno %d) at the peer, not 0\n", who,
                r, errno);
        return 1;
    }
    CHECK(close(c) == 0);
    return 0;
}

/* A non-blocking send of n bytes at b: the count, or -1 with EAGAIN (any
 * other error fails the check). */
static inline ssize_t send_nb(int fd, const void *b, size_t n) {
    ssize_t r = send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
        CHECK(errno == EAGAIN);
        return -1;
    }
    return r;
}

/* Writes the n bytes at b to fd, blocking (every write must take some). */
static inline void write_every(int fd, const void *b, size_t n) {
    size_t sent = 0;
    while (sent < n) {
        ssize_t k = write(fd, (const unsigned char *)b + sent, n - sent);
        CHECK(k > 0);
        sent += (size_t)k;
    }
}

/* Reads from fd, blocking, until *got reaches want; each read's bytes go
 * to check (NULL: not checked) with the stream offset they start at. */
static inline void recv_until(int fd, size_t *got, size_t want,
                              void (*check)(const unsigned char *, size_t, size_t)) {
    static unsigned char buf[4096];
    while (*got < want) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        CHECK(r > 0);
        if (check) check(buf, (size_t)r, *got);
        *got += (size_t)r;
    }
}

/* fd's int option `name` at SOL_SOCKET (its length checked). */
static inline int sol_int(int fd, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, SOL_SOCKET, name, &v, &len) == 0 && len == sizeof v);
    return v;
}

static inline void set_sol_int(int fd, int name, int v) {
    CHECK(setsockopt(fd, SOL_SOCKET, name, &v, sizeof v) == 0);
}

/* Reads /proc/self/task/TID/<file> into buf (len bytes, NUL-terminated
 * after what was read): the count read, or -1 if the thread is gone (a
 * thread that returned from its call and ended since the caller looked:
 * its task's directory goes with it). */
static inline ssize_t task_file(pid_t tid, const char *file, char *buf, size_t len) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, file);
    int fd = open(path, O_RDONLY);
    if (fd < 0 && (errno == ENOENT || errno == ESRCH)) return -1;
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n > 0) buf[n] = 0;
    return n;
}

/* The number of the system call thread tid is in, from
 * /proc/self/task/TID/syscall (which names the call a sleeping thread is
 * in); -1 if nothing could be read or the thread is running (the file
 * says "running": read as a number it was 0, SYS_read, and a running
 * thread counted as asleep in read — xdup23's report). */
static inline long thread_syscall(pid_t tid) {
    char buf[128];
    if (task_file(tid, "syscall", buf, sizeof buf) <= 0) return -1;
    char *end;
    long nr = strtol(buf, &end, 10);
    return end == buf ? -1 : nr;
}

/* Whether thread tid is asleep in a system call a wait of the engine, of
 * the library or of TCP sleeps in (a blocking read's recvfrom, a parked
 * call's epoll or poll). */
static inline int thread_asleep(pid_t tid) {
    long nr = thread_syscall(tid);
    return nr == SYS_recvfrom || nr == SYS_epoll_pwait || nr == SYS_ppoll
#ifdef SYS_epoll_wait
           || nr == SYS_epoll_wait
#endif
#ifdef SYS_poll
           || nr == SYS_poll
#endif
        ;
}

/* The extended call `name` of the preloaded library (a program not linked
 * with it: its plain runs go without it); exits 2 if it is not there. */
static inline void *preload_sym(const char *prog, const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p) {
        fprintf(stderr, "%s: %s not found (run under the preload)\n", prog, name);
        exit(2);
    }
    return p;
}

/* recvmsg(fd, MSG_ERRQUEUE | flags) into buffers of its own (an entry's
 * bytes and control messages are not looked at): its result. */
static inline ssize_t recv_errqueue(int fd, int flags) {
    char b[256], ctl[512];
    struct iovec iov = {.iov_base = b, .iov_len = sizeof b};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    return recvmsg(fd, &m, MSG_ERRQUEUE | flags);
}

/* The accepted end of sent_pair's pair: switches (unless plain) and sends
 * its bytes, in a thread of its own (the switch needs both ends at once). */
struct sent_pair_peer {
    int fd, plain;
    const char *msg;
    size_t n;
};

static inline void *sent_pair_send(void *arg) {
    struct sent_pair_peer *p = arg;
    if (!p->plain) ddp_mode(p->fd);
    CHECK(write(p->fd, p->msg, p->n) == (ssize_t)p->n);
    return NULL;
}

/* A connected pair, switched into DDP mode unless plain, whose accepted
 * end *s has sent the n bytes at msg to *c (returned once they were
 * written). */
static inline void sent_pair(int *c, int *s, int plain, const char *msg, size_t n) {
    tcp_pair(c, s);
    struct sent_pair_peer p = {*s, plain, msg, n};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sent_pair_send, &p) == 0);
    if (!plain) ddp_mode(*c);
    CHECK(pthread_join(t, NULL) == 0);
}
