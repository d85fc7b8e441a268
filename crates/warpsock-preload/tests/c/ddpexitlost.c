/* A writer that leaves with bytes in its send buffer while its reader
 * does not read (it reads only after the writer is gone): the bytes
 * cannot leave, and the reader must not take the end of the connection
 * for the end of the stream — it gets every byte and then 0, or the bytes
 * sent and then ECONNRESET, never 0 after a short stream.
 *
 *   ddpexitlost exit|close    the writer exit()s without close, or
 *                             closes and _exit()s
 * exit 0 if the reader saw no silent loss */
#include "ddppair.h"

#include <sys/wait.h>

#define WRITES 60
#define SIZE 8192

int main(int argc, char **argv) {
    CHECK(argc == 2);
    int close_first = strcmp(argv[1], "close") == 0;
    CHECK(close_first || strcmp(argv[1], "exit") == 0);
    int c, s;
    tcp_pair(&c, &s);
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
        close(s);
        ddp_mode(c);
        static unsigned char b[SIZE];
        for (int i = 0; i < WRITES; i++) {
            memset(b, i & 0xff, sizeof b);
            CHECK(write(c, b, sizeof b) == (ssize_t)sizeof b);
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
    CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    long got = 0;
    static unsigned char buf[65536];
    for (;;) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n < 0) {
            CHECK(errno == ECONNRESET);
            printf("ddpexitlost %s: %ld bytes, then ECONNRESET\n", argv[1], got);
            return 0;
        }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++) CHECK(buf[k] == (unsigned char)(((got + k) / SIZE) & 0xff));
        got += n;
    }
    if (got != (long)WRITES * SIZE) {
        fprintf(stderr, "ddpexitlost %s: a clean end after %ld of %d bytes\n", argv[1], got, WRITES * SIZE);
        return 1;
    }
    printf("ddpexitlost %s: every byte\n", argv[1]);
    return 0;
}
