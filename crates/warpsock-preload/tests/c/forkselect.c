/* A forked child's first select (issue 12): the parent, which never waited
 * in select or epoll_wait, has a DDP-mode socket with a byte processed and
 * not read (a MSG_PEEK read took it in; no bell rung: nobody could wait
 * on the doorbell). The child's first select (its first doorbell wait)
 * must leave the parent's socket alone: before, it walked the parent's
 * sockets and rang that socket's bell on the doorbell pair the two
 * processes share, a byte the parent's books did not count. Once the
 * parent read the byte, its own select then still found its socket
 * readable (the stale bell, never drained), and a non-blocking read
 * failed with EAGAIN: an event loop spun on it.
 * Exits 0 if every check holds. */
#include "ddppair.h"

#include <sys/wait.h>

/* Whether select sees fd readable now. */
static int selected(int fd) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(fd, &r);
    struct timeval tv = {0, 0};
    int n = select(fd + 1, &r, NULL, NULL, &tv);
    CHECK(n >= 0);
    return n == 1 && FD_ISSET(fd, &r);
}

int main(void) {
    int c, s;
    ddp_pair(&c, &s);
    CHECK(send(c, "x", 1, 0) == 1);
    char b;
    CHECK(recv(s, &b, 1, MSG_PEEK) == 1 && b == 'x');

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The child's first select: on nothing of the parent's. */
        struct timeval tv = {0, 0};
        _exit(select(0, NULL, NULL, NULL, &tv) == 0 ? 0 : 1);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    CHECK(recv(s, &b, 1, MSG_DONTWAIT) == 1 && b == 'x');
    /* Nothing left: select says so, and a read fails with EAGAIN. */
    if (selected(s)) {
        fprintf(stderr, "forkselect: the parent's socket selects readable with nothing to "
                        "read after the child's first select (a bell of the child's)\n");
        return 1;
    }
    CHECK(recv(s, &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    /* And the socket still works: a byte more comes through. */
    CHECK(send(c, "y", 1, 0) == 1);
    CHECK(recv(s, &b, 1, 0) == 1 && b == 'y');
    CHECK(selected(s) == 0);
    return 0;
}
