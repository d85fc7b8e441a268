/* dup, dup2, fcntl(F_DUPFD), close of one of the names, fork (a child sends
 * to the parent), and exec (an inherited socket is a working UDP socket in
 * the new program). Ports: a b. */
#include "common.h"
#include <sys/wait.h>

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "exec-child") == 0) {
        /* After exec: argv[2] is an inherited UDP socket, argv[3] a port. */
        int fd = atoi(argv[2]), v;
        socklen_t l = sizeof v;
        CHECK(getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) == 0 && v == SOCK_DGRAM);
        l = sizeof v;
        CHECK(getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) == 0 && v == AF_INET);
        send_to(fd, atoi(argv[3]), "from-exec", 9);
        return 0;
    }
    int pa = port_arg(argc, argv, 1), pb = port_arg(argc, argv, 2);
    int r = udp_bound(pa);
    int s = udp_new();
    char buf[64];

    send_to(s, pa, "1", 1);
    int d = dup(r);
    CHECK(d >= 0 && d != r);
    CHECK(recv(d, buf, sizeof buf, 0) == 1 && buf[0] == '1');
    int d2 = 40;
    CHECK(dup2(r, d2) == d2);
    int d3 = fcntl(r, F_DUPFD_CLOEXEC, 50);
    CHECK(d3 >= 50);
    send_to(s, pa, "2", 1);
    CHECK(recv(d2, buf, sizeof buf, 0) == 1 && buf[0] == '2');
    CHECK(close(r) == 0);
    send_to(s, pa, "3", 1);
    CHECK(recv(d3, buf, sizeof buf, 0) == 1 && buf[0] == '3');
    /* dup2 over a name of the socket leaves the others working. */
    int devnull = open("/dev/null", O_RDONLY);
    CHECK(dup2(devnull, d2) == d2);
    send_to(s, pa, "4", 1);
    CHECK(recv(d, buf, sizeof buf, 0) == 1 && buf[0] == '4');
    CHECK(read(d2, buf, 1) == 0); /* d2 is /dev/null now */
    close(d2);
    close(d3);

    /* fork: the child opens its own socket and sends to the parent. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int c = udp_new();
        for (int i = 0; i < 5; i++) send_to(c, pa, "child", 5);
        /* The inherited sender works in the child too (as plain UDP). */
        send_to(s, pa, "child-inherited", 15);
        exit(0); /* not _exit: queued datagrams get flushed at exit */
    }
    int st;
    for (int i = 0; i < 6; i++) {
        ssize_t k = recv(d, buf, sizeof buf, 0);
        CHECK(k == 5 || k == 15);
    }
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* The parent's sockets still work after the fork. */
    send_to(s, pa, "5", 1);
    CHECK(recv(d, buf, sizeof buf, 0) == 1 && buf[0] == '5');

    /* exec: an inherited (non-CLOEXEC) socket is a UDP socket in the new
     * image. The child offloads a fresh socket, then execs. */
    int rb = udp_bound(pb);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int e = udp_new();
        send_to(e, pa, "e", 1); /* offloaded now, if the preload is active */
        char fdarg[16], portarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", e);
        snprintf(portarg, sizeof portarg, "%d", pb);
        char *args[] = {argv[0], "exec-child", fdarg, portarg, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    CHECK(recv(d, buf, sizeof buf, 0) == 1 && buf[0] == 'e');
    CHECK(recv(rb, buf, sizeof buf, 0) == 9 && memcmp(buf, "from-exec", 9) == 0);
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    puts("dupfork: ok");
    return 0;
}
