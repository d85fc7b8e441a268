// The benchmark's busy 8 B calls, counted per call with callgrind (issue 12;
// BENCHMARKS.md section 6): O_NONBLOCK sockets, `writev` and `readv` of one
// iovec — what `warpsock bench --busy-poll` makes on both transports — each
// through a function of its own (not inlined), so that callgrind's
// inclusive cost of `wr`, `rd_ans` and `rd_spin` per call is the library's
// call (ddp_pingpong.c and ddp_spin.c count `write`/`recv(MSG_DONTWAIT)`).
// Usage: ddp_vcount ROUNDS busy|delay|spin   (DDP=1 in the environment
// switches both ends to DDP mode; NAP_US: the nap of `delay`, 2000)
//  busy:  both sides spin `rd_spin` until the 8 B arrive, then `wr`
//  delay: the client naps after each `wr` (the answer is there by then), then
//         reads it with one `rd_ans` — an answering receive alone; a miss
//         (the answer not there yet) is counted and spun for with `rd_spin`
//  spin:  the client spins ROUNDS times with `rd_spin` on its empty socket
//         after a write the server does not answer yet: the exact empty spin
//         is (incl(rd_spin) at N2 - at N1) / (calls at N2 - at N1)
// 200 busy round trips come first (warm-up) in every mode.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define SOL_WARPSOCK 0x57530000
#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #x, strerror(errno)); exit(1);} } while (0)
__attribute__((noinline)) ssize_t wr(int fd, void *b) { struct iovec v = {b, 8}; return writev(fd, &v, 1); }
__attribute__((noinline)) ssize_t rd_spin(int fd, void *b) { struct iovec v = {b, 8}; return readv(fd, &v, 1); }
__attribute__((noinline)) ssize_t rd_ans(int fd, void *b) { struct iovec v = {b, 8}; return readv(fd, &v, 1); }
static long misses;
static void get(int fd, void *b, int first) {
  ssize_t r = first ? rd_ans(fd, b) : rd_spin(fd, b);
  if (first && r < 0) misses++;
  while (r < 0 && errno == EAGAIN) r = rd_spin(fd, b);
  CHECK(r == 8);
}
static void nap(void) {
  static long us = -1;
  if (us < 0) us = getenv("NAP_US") ? atol(getenv("NAP_US")) : 2000;
  struct timespec t = {0, us * 1000};
  nanosleep(&t, 0);
}
int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s ROUNDS busy|delay|spin\n", argv[0]); return 2; }
  long n = atol(argv[1]);
  int mode = !strcmp(argv[2], "busy") ? 0 : !strcmp(argv[2], "delay") ? 1 : 2;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof a;
  CHECK(bind(l, (void*)&a, len) == 0 && listen(l, 1) == 0 && getsockname(l, (void*)&a, &len) == 0);
  pid_t pid = fork(); int server = pid == 0; int fd;
  if (server) fd = accept(l, 0, 0); else { fd = socket(AF_INET, SOCK_STREAM, 0); CHECK(connect(fd, (void*)&a, len) == 0); }
  CHECK(fd >= 0);
  int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (getenv("DDP") && atoi(getenv("DDP"))) CHECK(setsockopt(fd, SOL_WARPSOCK, 1, &one, sizeof one) == 0);
  CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
  uint64_t m = 7, got;
  for (long i = 0; i < 200; i++) { if (!server) CHECK(wr(fd, &m) == 8); get(fd, &got, 0); if (server) CHECK(wr(fd, &got) == 8); }
  if (mode == 2) {
    if (!server) { CHECK(wr(fd, &m) == 8); for (long i = 0; i < n; i++) CHECK(rd_spin(fd, &got) < 0 && errno == EAGAIN); CHECK(wr(fd, &m) == 8); get(fd, &got, 0); }
    else { get(fd, &got, 0); nap(); nap(); get(fd, &got, 0); CHECK(wr(fd, &got) == 8); }
  } else {
    for (long i = 0; i < n; i++) {
      if (!server) { CHECK(wr(fd, &m) == 8); if (mode == 1) nap(); get(fd, &got, mode == 1); }
      else { get(fd, &got, 0); CHECK(wr(fd, &got) == 8); if (mode == 1) nap(); }
    }
  }
  if (mode == 1) fprintf(stderr, "%s misses %ld\n", server ? "server" : "client", misses);
  close(fd); if (!server) waitpid(pid, 0, 0); return 0;
}
