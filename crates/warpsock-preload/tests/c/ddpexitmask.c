/* A signal while `_exit` waits for a close's bytes: Linux's `_exit` runs
 * no more of the program's code, so no handler may run inside the
 * preload's wait (review r28-c item 5: a handler's exit(3) there ran the
 * exit handlers the program skipped and changed the exit status).
 *
 *   ddpexitmask [plain]
 *     The writer (a child; SO_SNDBUF 1 MiB, a SIGUSR1 handler calling
 *     exit(3)) writes LEN bytes in 16 KiB writes, more than the reader's
 *     credit window, closes and calls _exit(0); the reader (the parent)
 *     reads nothing, and once the writer said it calls _exit and sleeps
 *     (nanosleep: the preload's wait for the close), or ended, sends it
 *     SIGUSR1. The writer must end with status 0.
 *     plain: no switch, both ends TCP (the comparison: _exit at once).
 * exit 0 if every check held. */
#include "ddppair.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define LEN (256 << 10)

static void on_usr1(int sig) {
    (void)sig;
    exit(3);
}

/* The system call process pid's main thread sleeps in, or -1. */
static long syscall_of(pid_t pid) {
    char path[64], buf[128];
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    return end == buf ? -1 : nr;
}

int main(int argc, char **argv) {
    CHECK(argc == 1 || (argc == 2 && strcmp(argv[1], "plain") == 0));
    int plain = argc == 2;
    int c, s, told[2];
    CHECK(pipe(told) == 0);
    tcp_pair_small(&c, &s, 4096);
    pid_t parent = getpid();
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0) {
        /* Dies with the reader (a failed check, the test's kill). */
        CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL) == 0);
        CHECK(getppid() == parent);
        close(s);
        close(told[0]);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
        int big = 1 << 20;
        CHECK(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof big) == 0);
        if (!plain) ddp_mode(c);
        static unsigned char b[16 << 10];
        memset(b, 'w', sizeof b);
        for (size_t o = 0; o < LEN; o += sizeof b) write_every(c, b, sizeof b);
        CHECK(close(c) == 0);
        CHECK(write(told[1], "x", 1) == 1);
        _exit(0);
    }
    close(c);
    close(told[1]);
    if (!plain) ddp_mode(s);
    char x;
    CHECK(read(told[0], &x, 1) == 1);
    int ws = 0, ended = 0, slept = 0;
    for (int i = 0; i < 30000 && !ended && !slept; i++) {
        pid_t r = waitpid(w, &ws, WNOHANG);
        CHECK(r >= 0);
        ended = r == w;
        long nr = syscall_of(w);
        slept = nr == SYS_nanosleep || nr == SYS_clock_nanosleep;
        if (!ended && !slept) usleep(1000);
    }
    CHECK(ended || slept);
    if (!ended) {
        CHECK(kill(w, SIGUSR1) == 0);
        CHECK(waitpid(w, &ws, 0) == w);
    }
    printf("ddpexitmask%s: the writer %s, then ended with %s %d\n", plain ? " plain" : "",
           slept ? "slept in its _exit and got SIGUSR1" : "ended at once",
           WIFEXITED(ws) ? "status" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
    fflush(stdout);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (!plain) CHECK(slept);
    return 0;
}
