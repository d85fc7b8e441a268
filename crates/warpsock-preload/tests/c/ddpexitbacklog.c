/* A writer that leaves with bytes in its engine's backlog: posted to the
 * engine (credits were there) but behind a full kernel send buffer, the
 * reader not reading. Run with WARPSOCK_DDP_SNDBUF=0: no send buffer, so
 * every byte a write returned for is in the engine or the kernel (the
 * buffer's own case is ddpexitlost.c). The writer's kernel SO_SNDBUF is
 * small (set before the switch), so most of the stream waits in the
 * backlog, which the writer checks (SIOCOUTQNSD) before it exits without
 * close. The reader is a process of its own, stopped (SIGSTOP, all its
 * threads) while the writer writes: its progress thread would otherwise
 * take the stream into its receive slots, leaving no backlog. Over TCP the kernel sends the bytes after the process; here the
 * preload's exit waits for the progress thread to write the backlog as
 * the kernel drains (up to WARPSOCK_LINGER_MS without progress), and
 * resets the connection if it gives up. The reader gets every byte and
 * then 0, or the bytes sent and then ECONNRESET — never 0 after a short
 * stream (review r21-b #4: the exit waited for the send buffers alone,
 * and the kernel ended the stream after the bytes it held).
 *
 *   ddpexitbacklog live|exit|exec|execveat|fexecve|execl|execle|execlp
 *     live: the reader goes on once the writer is about to exit
 *     exit: the reader goes on only after the writer is gone
 *     exec: as exit, but the writer execs (this program again, which
 *           exits at once): the exec's wait gives up, and the exec's
 *           close of the connection resets it (it ended it cleanly)
 *     execveat, fexecve, execl, execle, execlp: as exec, through those
 *           calls (glibc's call its internal execve, not the interposed one)
 * exit 0 if the reader saw no silent loss (live: and got every byte) */
#include "ddppair.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

#ifndef SIOCOUTQNSD
#define SIOCOUTQNSD 0x894B
#endif

/* Large writes: each is a few messages (a message per receive slot's
 * payload), well inside the credit window, so no write waits for one. */
#define WRITES 4
#define SIZE (512 << 10)

static int reader(int s, int live, const char *mode) {
    ddp_mode(s);
    /* Stopped until the parent lets it go on (see the top). */
    CHECK(raise(SIGSTOP) == 0);
    long got = 0;
    static unsigned char buf[65536];
    for (;;) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n < 0) {
            CHECK(errno == ECONNRESET);
            printf("ddpexitbacklog %s: %ld bytes, then ECONNRESET\n", mode, got);
            /* live: the exit waited for the bytes (the reader reads), so
             * all arrived before the reset — the kernel's, of a socket
             * closed with unread input (the reader's credit returns), as
             * in ddpexitlost.c. */
            if (live) CHECK(got == (long)WRITES * SIZE);
            return 0;
        }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++) CHECK(buf[k] == (unsigned char)((got + k) / SIZE + 1));
        got += n;
    }
    if (got != (long)WRITES * SIZE) {
        fprintf(stderr, "ddpexitbacklog %s: a clean end after %ld of %d bytes\n", mode, got,
                WRITES * SIZE);
        return 1;
    }
    printf("ddpexitbacklog %s: every byte\n", mode);
    return 0;
}

extern char **environ;

static void writer(int c, int go, int bye, char *self, const char *how) {
    int small = 4096;
    CHECK(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    ddp_mode(c);
    char g;
    CHECK(read(go, &g, 1) == 1);
    static unsigned char b[SIZE];
    for (int i = 0; i < WRITES; i++) {
        memset(b, i + 1, sizeof b);
        CHECK(write(c, b, sizeof b) == (ssize_t)sizeof b);
    }
    /* Most of the stream is unsent: beyond the kernel's small buffer,
     * the engine holds it. */
    int unsent = 0;
    CHECK(ioctl(c, SIOCOUTQNSD, &unsent) == 0);
    CHECK(unsent >= WRITES * SIZE / 2);
    CHECK(write(bye, "b", 1) == 1);
    if (self) {
        char *args[] = {self, "done", NULL};
        if (strcmp(how, "execveat") == 0) {
            execveat(AT_FDCWD, "/proc/self/exe", args, environ, 0);
        } else if (strcmp(how, "fexecve") == 0) {
            int x = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
            CHECK(x >= 0);
            fexecve(x, args, environ);
        } else if (strcmp(how, "execl") == 0) {
            execl("/proc/self/exe", self, "done", (char *)NULL);
        } else if (strcmp(how, "execle") == 0) {
            execle("/proc/self/exe", self, "done", (char *)NULL, environ);
        } else if (strcmp(how, "execlp") == 0) {
            execlp("/proc/self/exe", self, "done", (char *)NULL);
        } else {
            execv("/proc/self/exe", args);
        }
        CHECK(!"exec");
    }
    exit(0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    if (strcmp(argv[1], "done") == 0) return 0; /* the exec'd image */
    int live = strcmp(argv[1], "live") == 0;
    int exec_ok = strcmp(argv[1], "exec") == 0 || strcmp(argv[1], "execveat") == 0 ||
                  strcmp(argv[1], "fexecve") == 0 || strcmp(argv[1], "execl") == 0 ||
                  strcmp(argv[1], "execle") == 0 || strcmp(argv[1], "execlp") == 0;
    CHECK(live || exec_ok || strcmp(argv[1], "exit") == 0);
    int c, s, go[2], bye[2];
    CHECK(pipe(go) == 0 && pipe(bye) == 0);
    tcp_pair(&c, &s);
    pid_t r = fork();
    CHECK(r >= 0);
    if (r == 0) {
        close(c);
        exit(reader(s, live, argv[1]));
    }
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(s);
        writer(c, go[0], bye[1], exec_ok ? argv[0] : NULL, argv[1]);
    }
    close(c);
    close(s);
    int st;
    CHECK(waitpid(r, &st, WUNTRACED) == r && WIFSTOPPED(st));
    CHECK(write(go[1], "g", 1) == 1);
    char b;
    CHECK(read(bye[0], &b, 1) == 1);
    if (!live) CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(kill(r, SIGCONT) == 0);
    if (live) CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(waitpid(r, &st, 0) == r && WIFEXITED(st));
    return WEXITSTATUS(st);
}
