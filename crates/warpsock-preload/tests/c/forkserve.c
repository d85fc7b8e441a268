/* A forking server, as inetd-style and pre-fork-per-connection servers
 * are: it binds 127.0.0.1 port 0 itself (a policy-mode candidate must be
 * the preloaded process's own socket), prints "ready PORT", accepts one
 * connection and forks; the child greets the client first ("hello\n"),
 * echoes the 4 bytes it answers and exits 0; the parent closes its copy,
 * waits for the child and prints "child N" (its exit status). With
 * "client-first" as its argument the child does not greet: the client
 * speaks first (an HTTP client), its bytes echoed (4, or the second
 * argument: connrate's 8). A third argument is a pause in microseconds
 * between the accept and the fork (a server's work there: a log line, a
 * reverse lookup). A fourth, "lookup", makes that work a connection of
 * the server's own, to a listener of its own nobody accepts from (in
 * policy mode a client's switch, still under way at the fork: an ident
 * or backend lookup), kept open across the fork. Bounded: the child's
 * reads time out after 30 s (status 1). */
#include "common.h"
#include <sys/wait.h>

int main(int argc, char **argv) {
    int greet = !(argc > 1 && strcmp(argv[1], "client-first") == 0);
    size_t len = argc > 2 ? (size_t)atoi(argv[2]) : 4;
    CHECK(len > 0 && len <= 64);
    int l = tcp_listener_ready(8);
    int c = accept(l, NULL, NULL);
    CHECK(c >= 0);
    if (argc > 3) {
        long us = atol(argv[3]);
        CHECK(us >= 0);
        struct timespec pause = {us / 1000000, us % 1000000 * 1000};
        CHECK(nanosleep(&pause, NULL) == 0);
    }
    int lookup = -1, lookup_l = -1;
    if (argc > 4 && strcmp(argv[4], "lookup") == 0) {
        int port;
        lookup_l = tcp_listener_lo(1, &port);
        lookup = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(lookup >= 0);
        struct sockaddr_in a = lo(port);
        CHECK(connect(lookup, (struct sockaddr *)&a, sizeof a) == 0);
    }
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        set_rcvtimeo(c, 30000);
        if (greet)
            CHECK(write(c, "hello\n", 6) == 6);
        char buf[64];
        size_t got = 0;
        while (got < len) {
            ssize_t r = read(c, buf + got, len - got);
            CHECK(r > 0);
            got += (size_t)r;
        }
        CHECK(write(c, buf, len) == (ssize_t)len);
        _exit(0);
    }
    close(c);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (lookup >= 0) {
        close(lookup);
        close(lookup_l);
    }
    printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);
    return 0;
}
