/* A vforked child's switch to DDP mode (review r29-c item 3): the child
 * shares its parent's memory, and a switch there wrote the census's owner
 * (SOCKS_OWNER) of the parent's memory: every close of the parent's own
 * DDP sockets then took the parent for a forked child and leaked the
 * socket, with no end of stream at the peer. The child's setsockopt
 * (SOL_WARPSOCK, WARPSOCK_DDP_MODE) on a plain connected socket of its
 * own must fail with EOPNOTSUPP (the socket stays plain TCP); the
 * parent's own DDP close must then read as 0 at its peer.
 * Exits 0 if every check holds. */
#include "ddppair.h"

#include <sys/wait.h>

/* The child's connection's other end: a thread of the parent's (it runs
 * while vfork suspends the parent's vforking thread) that accepts it and
 * switches as the peer would; its switch fails once the child's end is
 * closed (the child's _exit) when the child's was refused. */
static void *accept_peer(void *arg) {
    int a = accept(*(int *)arg, NULL, NULL);
    if (a < 0) return NULL;
    int one = 1;
    (void)setsockopt(a, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
    close(a);
    return NULL;
}

int main(void) {
    int c, s;
    ddp_pair(&c, &s);
    pthread_t t;
    char b;
    CHECK(send(c, "a", 1, 0) == 1);
    CHECK(recv(s, &b, 1, 0) == 1 && b == 'a');

    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in a = lo(0);
    socklen_t alen = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    CHECK(pthread_create(&t, NULL, accept_peer, &l) == 0);

    pid_t pid = vfork();
    if (pid == 0) {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        if (k < 0) _exit(2);
        if (connect(k, (struct sockaddr *)&a, sizeof a) != 0) _exit(3);
        int one = 1;
        int r = setsockopt(k, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
        if (r == 0) _exit(4);
        if (errno != EOPNOTSUPP) _exit(5);
        _exit(0);
    }
    CHECK(pid > 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(pthread_join(t, NULL) == 0);
    close(l);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr,
                "vforkswitch: the vforked child's switch of its own socket was not refused "
                "with EOPNOTSUPP (status %#x; exit 4: it succeeded, 5: another errno)\n",
                st);
        return 1;
    }
    /* The parent's own DDP socket still carries a byte and its close
     * reads as 0 at the peer (after the vforked child's switch). */
    return parent_pair_ends_cleanly(c, s, "vforkswitch");
}
