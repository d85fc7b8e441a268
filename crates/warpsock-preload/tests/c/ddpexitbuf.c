/* A writer that exits without closing its DDP-mode socket while its last
 * writes wait in the send buffer (the reader was slow: the window full):
 * over TCP the kernel sends them after the process; here the preload's
 * exit waits for them (up to WARPSOCK_LINGER_MS) while the progress
 * thread sends them as the reader's credits come back. The reader (the
 * parent, reading meanwhile) gets every byte and then the end of stream,
 * or the bytes sent and then ECONNRESET (the exit's close of a socket
 * holding unread input resets it) — never a clean end after a short
 * stream.
 *
 *   ddpexitbuf    exit 0 if every byte arrived */
#include "ddppair.h"

#include <sys/wait.h>

#define WRITES 2000

int main(void) {
    int c, s;
    tcp_pair(&c, &s);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        close(s);
        ddp_mode(c);
        for (int i = 0; i < WRITES; i++) {
            unsigned char b[8];
            memset(b, i & 0xff, sizeof b);
            CHECK(write(c, b, sizeof b) == (ssize_t)sizeof b);
        }
        exit(0); /* no close: the exit sends what is buffered */
    }
    close(c);
    ddp_mode(s);
    long got = 0;
    unsigned char buf[4096];
    for (;;) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n < 0) {
            /* The writer's exit reset the connection (its kernel socket
             * held unread input, our credit returns: Linux resets then) —
             * an error, not a silent loss. */
            CHECK(errno == ECONNRESET);
            printf("ddpexitbuf: %ld bytes, then ECONNRESET\n", got);
            CHECK(waitpid(p, NULL, 0) == p);
            return 0;
        }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++) CHECK(buf[k] == (unsigned char)(((got + k) / 8) & 0xff));
        got += n;
    }
    int st;
    CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (got != WRITES * 8) {
        fprintf(stderr, "ddpexitbuf: the reader got %ld of %d bytes\n", got, WRITES * 8);
        return 1;
    }
    printf("ddpexitbuf: ok\n");
    return 0;
}
