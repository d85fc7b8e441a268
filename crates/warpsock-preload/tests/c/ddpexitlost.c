/* A writer that leaves with bytes in its send buffer (the reader was
 * slow: the window full). Over TCP the kernel sends them after the
 * process; here the preload's exit waits for them (up to
 * WARPSOCK_LINGER_MS) while the progress thread sends them as the
 * reader's credits come back, and resets the connection if they cannot
 * leave. The reader gets every byte and then 0, or the bytes sent and
 * then ECONNRESET — never 0 after a short stream.
 *
 *   ddpexitlost live|exit|close
 *     live:  the writer exit()s without close; the reader reads meanwhile
 *     exit:  the same, the reader reads only after the writer is gone
 *     close: the writer closes and _exit()s; the reader reads after
 * exit 0 if the reader saw no silent loss (live: and got every byte) */
#include "ddppair.h"

#include <sys/wait.h>

/* live: many small writes (one message each: slow to drain); else
 * fewer large ones. */
static int writes, size;

int main(int argc, char **argv) {
    CHECK(argc == 2);
    int close_first = strcmp(argv[1], "close") == 0;
    int live = strcmp(argv[1], "live") == 0;
    CHECK(close_first || live || strcmp(argv[1], "exit") == 0);
    writes = live ? 2000 : 60;
    size = live ? 8 : 8192;
    int c, s;
    tcp_pair(&c, &s);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        close(s);
        ddp_mode(c);
        static unsigned char b[8192];
        for (int i = 0; i < writes; i++) {
            memset(b, i & 0xff, (size_t)size);
            CHECK(write(c, b, (size_t)size) == (ssize_t)size);
        }
        if (close_first) {
            CHECK(close(c) == 0);
            _exit(0);
        }
        exit(0);
    }
    close(c);
    ddp_mode(s);
    int st;
    if (!live) CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
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
            return 0;
        }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++) CHECK(buf[k] == (unsigned char)(((got + k) / size) & 0xff));
        got += n;
    }
    if (live) CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (got != (long)writes * size) {
        fprintf(stderr, "ddpexitlost %s: a clean end after %ld of %d bytes\n", argv[1], got, writes * size);
        return 1;
    }
    printf("ddpexitlost %s: every byte\n", argv[1]);
    return 0;
}
