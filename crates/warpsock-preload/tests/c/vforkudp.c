/* A vforked child's close of inherited offloaded UDP sockets (review
 * r29-a item 1, the UDP kind): the child shares its parent's memory (the
 * descriptor table's entries, the sockets, the engine) but not its
 * descriptors. Its close(a) and dup2(devnull, b) must close its own
 * descriptor numbers and nothing else: before, the close marked the
 * parent's socket closed, dropped its queues, deregistered it from the
 * parent's engine and closed its connections. Ports: a b. The parent's
 * connected pair then carries a datagram each way (each awaited by poll,
 * 10 s at most). Exits 0 if every check holds. */
#include "common.h"

#include <sys/wait.h>

/* A datagram from fd within 10 s: its length, or -1. */
static ssize_t recv_within(int fd, char *buf, size_t n) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return -1;
    return recv(fd, buf, n, MSG_DONTWAIT);
}

int main(int argc, char **argv) {
    int pa = port_arg(argc, argv, 1), pb = port_arg(argc, argv, 2);
    int a = udp_bound(pa), b = udp_bound(pb);
    struct sockaddr_in aa = lo(pa), ba = lo(pb);
    CHECK(connect(a, (struct sockaddr *)&ba, sizeof ba) == 0);
    CHECK(connect(b, (struct sockaddr *)&aa, sizeof aa) == 0);
    char buf[100];
    CHECK(send(a, "one", 3, 0) == 3);
    CHECK(recv_within(b, buf, sizeof buf) == 3 && memcmp(buf, "one", 3) == 0);
    CHECK(send(b, "two", 3, 0) == 3);
    CHECK(recv_within(a, buf, sizeof buf) == 3 && memcmp(buf, "two", 3) == 0);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    CHECK(null >= 0);

    pid_t pid = vfork();
    if (pid == 0) {
        if (close(a) != 0) _exit(2);
        if (dup2(null, b) != b) _exit(3);
        _exit(0);
    }
    CHECK(pid > 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "vforkudp: the vforked child ended with status %#x\n", st);
        return 1;
    }
    close(null);
    if (send(a, "three", 5, 0) != 5 || recv_within(b, buf, sizeof buf) != 5 ||
        memcmp(buf, "three", 5) != 0) {
        fprintf(stderr, "vforkudp: after the vforked child's close, the parent's datagram from "
                        "a to b did not arrive (10 s at most; errno %d: the child's close ended "
                        "the parent's socket)\n",
                errno);
        return 1;
    }
    if (send(b, "four", 4, 0) != 4 || recv_within(a, buf, sizeof buf) != 4 ||
        memcmp(buf, "four", 4) != 0) {
        fprintf(stderr, "vforkudp: after the vforked child's close, the parent's datagram from "
                        "b to a did not arrive (10 s at most; errno %d: the child's close ended "
                        "the parent's socket)\n",
                errno);
        return 1;
    }
    CHECK(close(a) == 0 && close(b) == 0);
    return 0;
}
