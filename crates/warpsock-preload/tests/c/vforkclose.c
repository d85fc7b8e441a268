/* A vforked child's close of an inherited DDP-mode descriptor (review
 * r29-a item 1): the child shares its parent's memory (the descriptor
 * table's entries, the sockets, the engine) but not its descriptors. Its
 * close(s) and dup2(devnull, c) must close its own descriptor numbers and
 * nothing else: before, the close removed the parent's table entry,
 * deregistered the socket from the parent's engine and ran its drop
 * (Qp::drop: an end of stream on the connection the parent still uses),
 * and the dup2 released the parent's socket the same way.
 * argv[1]: "exit" (the child _exits) or "exec" (it execs /bin/true),
 * or "reuse" (review r29-c item 2: the child's close(s) leaves the
 * number's mark and entry, the parent's; it opens /dev/null, given the
 * same number, writes "zz" to it and _exits: the parent's peer must not
 * read the child's bytes, which went to the parent's DDP socket).
 * The parent then sends both ways on the pair and closes it cleanly.
 * Exits 0 if every check holds. */
#include "ddppair.h"

#include <fcntl.h>
#include <sys/wait.h>

/* One byte from fd within 10 s (a deadline: a connection the child ended
 * leaves the parent's descriptor a doorbell nobody rings), or -1. */
static int recv1(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return -1;
    unsigned char b;
    return recv(fd, &b, 1, MSG_DONTWAIT) == 1 ? b : -1;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    int exec = strcmp(argv[1], "exec") == 0;
    int reuse = strcmp(argv[1], "reuse") == 0;
    int c, s;
    ddp_pair(&c, &s);
    /* The pair carries a byte each way before the vfork. */
    char b;
    CHECK(send(c, "a", 1, 0) == 1);
    CHECK(recv(s, &b, 1, 0) == 1 && b == 'a');
    CHECK(send(s, "b", 1, 0) == 1);
    CHECK(recv(c, &b, 1, 0) == 1 && b == 'b');
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    CHECK(null >= 0);

    pid_t pid = vfork();
    if (pid == 0) {
        /* The child: its copies of the two DDP descriptors go, one by
         * close, one by dup2 over it (a shell's redirection). */
        if (close(s) != 0) _exit(2);
        if (reuse) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd != s) _exit(5);
            if (write(fd, "zz", 2) != 2) _exit(6);
            if (close(fd) != 0) _exit(7);
        }
        if (dup2(null, c) != c) _exit(3);
        if (exec) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(4);
        }
        _exit(0);
    }
    CHECK(pid > 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "vforkclose: the vforked child ended with status %#x\n", st);
        return 1;
    }
    close(null);

    /* The parent's pair still carries data both ways. */
    if (send(c, "c", 1, MSG_NOSIGNAL) != 1 || recv1(s) != 'c') {
        fprintf(stderr,
                "vforkclose: after the vforked child's close, the parent's 'c' from c to s "
                "did not arrive (10 s at most; errno %d: the child's close ended the parent's connection)\n",
                errno);
        return 1;
    }
    if (send(s, "d", 1, MSG_NOSIGNAL) != 1) {
        fprintf(stderr, "vforkclose: the parent's send of 'd' failed (errno %d)\n", errno);
        return 1;
    }
    int got = recv1(c);
    if (got == 'z') {
        fprintf(stderr,
                "vforkclose: the parent's peer read 'z', the vforked child's write to its "
                "own /dev/null under the number it closed (the parent's DDP socket took it)\n");
        return 1;
    }
    if (got != 'd') {
        fprintf(stderr,
                "vforkclose: after the vforked child's close, the parent's 'd' from s to c "
                "did not arrive (10 s at most; errno %d: the child's close ended the parent's connection)\n",
                errno);
        return 1;
    }
    /* And closes cleanly: the peer reads the end of stream, no error. */
    CHECK(close(s) == 0);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1);
    ssize_t r = recv(c, &b, 1, 0);
    if (r != 0) {
        fprintf(stderr, "vforkclose: the parent's close read %zd (errno %d) at the peer, not 0\n",
                r, errno);
        return 1;
    }
    CHECK(close(c) == 0);
    return 0;
}
