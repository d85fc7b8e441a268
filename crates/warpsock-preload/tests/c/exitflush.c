/* exitflush PORT COUNT SIZE: sends COUNT datagrams of SIZE bytes (sequence
 * number first, no pacing) to 127.0.0.1:PORT, then vforks and forks a child
 * each that calls _exit/_Exit at once, timing how long the parent waited
 * for each, prints "vfork_ms V fork_ms F" and leaves by _exit(0) itself:
 * without a flush there, datagrams still queued in the process are lost.
 * Children must neither wait for the parent's queues nor send them. */
#include "common.h"
#include <sys/wait.h>

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int count = atoi(argv[2]), size = atoi(argv[3]);
    CHECK(size >= 4 && size <= 65507 && count > 0);
    int s = udp_new();
    static char buf[65507];
    for (int i = 0; i < size; i++) buf[i] = (char)i;
    for (int i = 0; i < count; i++) {
        memcpy(buf, &i, sizeof i);
        send_to(s, port, buf, (size_t)size);
    }
    long t0 = now_ms();
    pid_t c = vfork();
    CHECK(c >= 0);
    if (c == 0) _exit(0);
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    long vf = now_ms() - t0;
    t0 = now_ms();
    c = fork();
    CHECK(c >= 0);
    if (c == 0) _Exit(0);
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    long f = now_ms() - t0;
    printf("vfork_ms %ld fork_ms %ld\n", vf, f);
    fflush(stdout);
    _exit(0);
}
