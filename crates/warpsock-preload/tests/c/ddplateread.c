/* A reader that reads only after its writer is gone (issue 12, task
 * xlate): the writer writes LEN bytes, closes and _exit()s; the reader,
 * blocked in waitpid meanwhile, then reads 4 KiB at a time. Over TCP the
 * kernel holds every byte and the FIN: the reader gets them all, then 0.
 * In DDP mode the reader's library returned credits (CREDIT messages are
 * TCP data) for the slots its first reads freed, before it reached the
 * writer's end of stream; they met the dead writer's closed socket, whose
 * reset dropped what the reader had not read: 36 KiB of 96, then
 * ECONNRESET.
 *
 *   ddplateread exit|kill [plain]
 *     exit: the writer closes and _exit()s
 *     kill: the writer kills itself (SIGKILL) after its write: no close,
 *           no end-of-stream message, only its kernel's FIN
 * exit 0 if the reader got every byte and then 0. */
#include "ddppair.h"

#include <sys/wait.h>

#define LEN (96 << 10)

static unsigned char at(size_t i) {
    return (unsigned char)((i * 131 + (i >> 12)) & 0xff);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    int kill_self = strcmp(argv[1], "kill") == 0;
    int plain = argc > 2 && strcmp(argv[2], "plain") == 0;
    int c, s;
    tcp_pair(&c, &s);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        close(s);
        if (!plain) ddp_mode(c);
        static unsigned char b[LEN];
        for (size_t i = 0; i < LEN; i++) b[i] = at(i);
        write_every(c, b, LEN);
        if (kill_self) kill(getpid(), SIGKILL);
        CHECK(close(c) == 0);
        _exit(0);
    }
    close(c);
    if (!plain) ddp_mode(s);
    int ws;
    CHECK(waitpid(w, &ws, 0) == w);
    CHECK(kill_self ? WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL
                    : WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    static unsigned char buf[4096];
    size_t got = 0;
    int e = 0;
    for (;;) {
        ssize_t k = read(s, buf, sizeof buf);
        if (k < 0) {
            e = errno;
            break;
        }
        if (k == 0) break;
        for (ssize_t j = 0; j < k; j++) CHECK(buf[j] == at(got + (size_t)j));
        got += (size_t)k;
    }
    if (e != 0 || got != LEN) {
        fprintf(stderr, "ddplateread %s%s: %zu of %d bytes, then %s\n", argv[1],
                plain ? " plain" : "", got, LEN, e ? strerror(e) : "0");
        return 1;
    }
    printf("ddplateread %s%s: every byte, then 0\n", argv[1], plain ? " plain" : "");
    return 0;
}
