/* A writer that leaves with bytes in its send buffer (the reader was
 * slow: the window full). Over TCP the kernel sends them after the
 * process; here the preload's exit waits for them (up to
 * WARPSOCK_LINGER_MS) while the progress thread sends them as the
 * reader's credits come back, and resets the connection if they cannot
 * leave. The reader gets every byte and then 0, or the bytes sent and
 * then ECONNRESET — never 0 after a short stream.
 *
 *   ddpexitlost live|exit|close|exec|execfail
 *     live:  the writer exit()s without close; the reader reads meanwhile
 *     exit:  the same, the reader reads only after the writer is gone
 *     close: the writer closes and _exit()s; the reader reads after
 *     exec:  the writer execs (this program again, which exits at once);
 *            the reader reads only after it is gone: the exec's wait gave
 *            up, and the connection is reset, not ended cleanly, when the
 *            exec closes it
 *     execfail: the writer's exec (close-on-exec socket, SO_LINGER set to
 *            on, 7 s) fails after its wait gave up: the socket is the
 *            writer's still, in DDP mode, its SO_LINGER as set; the reader
 *            then reads every byte, the writer closes, the reader reads
 *            0 — a failed exec neither resets the connection nor leaves
 *            it marked to be reset
 *     execfailinherit: the same with an inheritable socket, which the
 *            exec's demotion put on a dead socket: the failed exec puts
 *            it back
 * exit 0 if the reader saw no silent loss (live, execfail: and got every
 * byte) */
#include "ddppair.h"

#include <sys/wait.h>

/* live: many small writes (one message each: slow to drain); else
 * fewer large ones. */
static int writes, size;

/* execfail: the writer's side after its exec failed; `told` and `ack`
 * are pipes to and from the reader. */
static void after_failed_exec(int c, int told, int ack) {
    struct linger l = {0, 0};
    socklen_t ll = sizeof l;
    CHECK(getsockopt(c, SOL_SOCKET, SO_LINGER, &l, &ll) == 0);
    CHECK(l.l_onoff == 1 && l.l_linger == 7);
    int mode = 0;
    socklen_t ml = sizeof mode;
    CHECK(getsockopt(c, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &mode, &ml) == 0 && mode == 1);
    CHECK(write(told, "x", 1) == 1);
    char b;
    CHECK(read(ack, &b, 1) == 1);
    CHECK(close(c) == 0);
    exit(0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    if (strcmp(argv[1], "done") == 0) return 0; /* the exec'd image */
    int close_first = strcmp(argv[1], "close") == 0;
    int live = strcmp(argv[1], "live") == 0;
    int exec_ok = strcmp(argv[1], "exec") == 0;
    int inherit = strcmp(argv[1], "execfailinherit") == 0;
    int exec_fail = inherit || strcmp(argv[1], "execfail") == 0;
    CHECK(close_first || live || exec_ok || exec_fail || strcmp(argv[1], "exit") == 0);
    int told[2], ack[2];
    CHECK(pipe(told) == 0 && pipe(ack) == 0);
    writes = live ? 2000 : 60;
    size = live ? 8 : 8192;
    int c, s;
    tcp_pair(&c, &s);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        close(s);
        close(told[0]);
        close(ack[1]);
        ddp_mode(c);
        if (exec_fail) {
            if (!inherit) CHECK(fcntl(c, F_SETFD, FD_CLOEXEC) == 0);
            struct linger l = {1, 7};
            CHECK(setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
        }
        static unsigned char b[8192];
        for (int i = 0; i < writes; i++) {
            memset(b, i & 0xff, (size_t)size);
            CHECK(write(c, b, (size_t)size) == (ssize_t)size);
        }
        if (exec_ok) {
            char *args[] = {argv[0], "done", NULL};
            execv("/proc/self/exe", args);
            CHECK(!"exec");
        }
        if (exec_fail) {
            char *args[] = {argv[0], "done", NULL};
            CHECK(execv("/nonexistent/ddpexitlost", args) == -1 && errno == ENOENT);
            after_failed_exec(c, told[1], ack[0]);
        }
        if (close_first) {
            CHECK(close(c) == 0);
            _exit(0);
        }
        exit(0);
    }
    close(c);
    /* A writer that failed ends the reader's wait for it. */
    close(told[1]);
    close(ack[0]);
    ddp_mode(s);
    int st;
    if (exec_fail) {
        char x;
        CHECK(read(told[0], &x, 1) == 1);
    } else if (!live) {
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    long got = 0;
    static unsigned char buf[65536];
    for (;;) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n < 0) {
            CHECK(errno == ECONNRESET);
            printf("ddpexitlost %s: %ld bytes, then ECONNRESET\n", argv[1], got);
            /* live: the exit waited for the bytes (the reader reads), so
             * all arrived before the reset of a socket with unread input. */
            if (live) CHECK(got == (long)writes * size && waitpid(p, &st, 0) == p);
            CHECK(!exec_fail);
            return 0;
        }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++) CHECK(buf[k] == (unsigned char)(((got + k) / size) & 0xff));
        got += n;
        /* execfail: the writer closes once every byte was read. */
        if (exec_fail && got == (long)writes * size) CHECK(write(ack[1], "x", 1) == 1);
    }
    if (exec_fail) CHECK(got == (long)writes * size);
    if (live || exec_fail) CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (got != (long)writes * size) {
        fprintf(stderr, "ddpexitlost %s: a clean end after %ld of %d bytes\n", argv[1], got, writes * size);
        return 1;
    }
    printf("ddpexitlost %s: every byte\n", argv[1]);
    return 0;
}
