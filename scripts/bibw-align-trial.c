// Host-TCP bidirectional trial (issue 15, BENCHMARKS.md §3 session 10): two
// processes over 127.0.0.1, one connection, each side a non-blocking +
// poll loop that writes and reads 1 MiB at a time for T seconds (no
// verification). OFF=n places both user buffers n bytes past a page
// boundary: the stream's bytes then sit at a different alignment in user
// memory than in the socket buffers. Prints GB/s (both ways together) and
// CPU seconds per GB of both processes.
//   gcc -O2 -Wall -o /tmp/ba scripts/bibw-align-trial.c
//   for o in 0 8 0 8 0 8; do OFF=$o /tmp/ba 2; done
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SZ (1 << 20)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu(struct rusage *r) {
  return r->ru_utime.tv_sec + r->ru_utime.tv_usec * 1e-6 + r->ru_stime.tv_sec +
         r->ru_stime.tv_usec * 1e-6;
}

// Writes and reads until T seconds are over; returns bytes received.
static long run(int fd, double t, long off) {
  char *tx = (char *)aligned_alloc(4096, SZ + 4096) + off;
  char *rx = (char *)aligned_alloc(4096, SZ + 4096) + off;
  memset(tx, 1, SZ);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  long woff = 0, roff = 0, got = 0;
  double end = now() + t;
  while (now() < end) {
    int moved = 0;
    for (;;) {
      ssize_t n = write(fd, tx + woff, SZ - woff);
      if (n <= 0) break;
      moved = 1;
      woff = (woff + n) % SZ;
    }
    for (;;) {
      ssize_t n = read(fd, rx + roff, SZ - roff);
      if (n <= 0) break;
      moved = 1;
      got += n;
      roff = (roff + n) % SZ;
    }
    if (!moved) {
      struct pollfd p = {fd, POLLIN | POLLOUT, 0};
      poll(&p, 1, 100);
    }
  }
  return got;
}

int main(int argc, char **argv) {
  double t = argc > 1 ? atof(argv[1]) : 2;
  long off = getenv("OFF") ? atol(getenv("OFF")) : 0;
  int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t al = sizeof a;
  if (bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &al)) {
    perror("listen");
    return 1;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (void *)&a, sizeof a)) {
    perror("connect");
    return 1;
  }
  int s = accept(l, 0, 0);
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int pfd[2];
  if (pipe(pfd)) return 1;
  pid_t p = fork();
  if (p == 0) {
    long got = run(s, t, off);
    if (write(pfd[1], &got, sizeof got) != sizeof got) _exit(1);
    _exit(0);
  }
  long mine = run(c, t, off), theirs = 0;
  shutdown(c, SHUT_WR);
  if (read(pfd[0], &theirs, sizeof theirs) != sizeof theirs) return 1;
  waitpid(p, 0, 0);
  struct rusage me, ch;
  getrusage(RUSAGE_SELF, &me);
  getrusage(RUSAGE_CHILDREN, &ch);
  double gb = (mine + theirs) / 1e9, c_s = cpu(&me) + cpu(&ch);
  printf("OFF=%ld: %.2f + %.2f GB in %.1f s = %.2f GB/s; CPU %.2f s = %.2f s/GB\n", off,
         mine / 1e9, theirs / 1e9, t, gb / t, c_s, c_s / gb);
  return 0;
}
