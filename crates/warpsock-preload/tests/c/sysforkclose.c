/* A child made by syscall(SYS_fork) (no fork handler runs: as _Fork, or
 * clone without CLONE_VM) keeps its parent's copy of the library's
 * memory, the descriptor table's owner among it (review r29-c item 1).
 * It switches a pair of its own, sends a byte and closes one end: that
 * close must be the library's (the peer reads the end of stream), not
 * the raw close a borrowed entry gets (the DDP socket stayed in the
 * table, the engine kept the TCP connection open: the peer's poll timed
 * out). The parent's own pair, switched before, is left alone.
 * Exits 0 if every check holds. */
#include "ddppair.h"

#include <sys/syscall.h>
#include <sys/wait.h>

/* The child: 0 if its own close ended its own stream, else a code. */
static int child(void) {
    int c, s;
    ddp_pair(&c, &s);
    if (send(c, "x", 1, MSG_NOSIGNAL) != 1) return 10;
    struct pollfd p = {s, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return 11;
    char b;
    if (recv(s, &b, 1, 0) != 1 || b != 'x') return 12;
    if (close(c) != 0) return 13;
    /* The end of stream within 10 s (a deadline, not a sleep). */
    if (poll(&p, 1, 10000) != 1) return 14;
    ssize_t r = recv(s, &b, 1, MSG_DONTWAIT);
    if (r != 0) return 15;
    if (close(s) != 0) return 16;
    return 0;
}

int main(void) {
    int c, s;
    ddp_pair(&c, &s);
    char b;
    CHECK(send(c, "a", 1, 0) == 1);
    CHECK(recv(s, &b, 1, 0) == 1 && b == 'a');
    fflush(NULL);
    long pid = syscall(SYS_fork);
    if (pid == 0) _exit(child());
    CHECK(pid > 0);
    int st;
    CHECK(waitpid((pid_t)pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr,
                "sysforkclose: the SYS_fork child's close of its own DDP socket (status %#x; "
                "exit 14: the peer read no end of stream within 10 s, the close was the raw "
                "system call of a borrowed entry)\n",
                st);
        return 1;
    }
    /* The parent's pair carries a byte and closes cleanly. */
    return parent_pair_ends_cleanly(c, s, "sysforkclose");
}
