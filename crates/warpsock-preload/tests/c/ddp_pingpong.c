// An 8-byte ping-pong over loopback TCP, optionally switched into DDP mode on
// both ends: the program whose user-space instructions per round trip
// BENCHMARKS.md section 6 counts with callgrind (session 11), at two round
// counts so that the difference excludes the set-up; tests/ddp_latency.rs
// counts its heap allocations the same way.
// Usage: ddp_pingpong ROUNDS DDP(0|1) block|poll|busy|vbusy|vblock|epoll|ae|select
// (epoll: an event loop's — the socket non-blocking in an epoll set,
// level-triggered, `epoll_wait` before each receive; ae: redis's event
// loop's — the socket in the set for output before each send and for
// input before each receive, taken out after each, as `ae` does when a
// mask falls to nothing: an EPOLL_CTL_ADD and a DEL per send and per receive;
// select: a select loop's — `select` for input before each non-blocking receive;
// vblock: blocking `readv`/`writev` of one iovec, as the benchmark's event
// mode calls them; vbusy: busy with `readv`/`writev` of one iovec on an O_NONBLOCK socket, as
// the benchmark's busy mode calls them.) TIMEO=1 in the environment sets
// SO_RCVTIMEO and SO_SNDTIMEO of 5 s on both ends, as the benchmark's blocking
// sockets carry (BENCHMARKS.md section 6, session 30). PIN=1 puts the client
// on CPU 0 and the server on CPU 1 (session 35).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#define SOL_WARPSOCK 0x57530000
#define WARPSOCK_DDP_MODE 1
#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #x, strerror(errno)); exit(1);} } while (0)
static int mode; // 0 block 1 poll 2 busy 3 vbusy 4 vblock 5 epoll 6 ae 7 select
static int ep = -1;
/* ae: fd in the set for `events` alone (the caller then waits). */
static void ae_add(int fd, uint32_t events) {
  struct epoll_event e = {.events = events, .data.u64 = 7};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
}
static void ae_del(int fd) { CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL) == 0); }
static void xsend(int fd, void *b, int n) {
  if (mode == 3 || mode == 4) { struct iovec v = {b, n}; CHECK(writev(fd, &v, 1) == n); return; }
  if (mode == 6) {
    ae_add(fd, EPOLLOUT);
    struct epoll_event e;
    CHECK(epoll_wait(ep, &e, 1, 20000) == 1 && e.data.u64 == 7 && (e.events & EPOLLOUT));
  }
  CHECK(write(fd, b, n) == n);
  if (mode == 6) ae_del(fd);
}
static void xrecv(int fd, void *b, int n) {
  int got = 0;
  if (mode == 6) ae_add(fd, EPOLLIN);
  while (got < n) {
    if (mode == 5 || mode == 6) { struct epoll_event e; CHECK(epoll_wait(ep, &e, 1, 20000) == 1 && e.data.u64 == 7 && (e.events & EPOLLIN)); }
    if (mode == 1) { struct pollfd p = {.fd = fd, .events = POLLIN}; CHECK(poll(&p, 1, 20000) == 1); }
    if (mode == 7) {
      fd_set rs; FD_ZERO(&rs); FD_SET(fd, &rs);
      struct timeval tv = {20, 0};
      CHECK(select(fd + 1, &rs, NULL, NULL, &tv) == 1 && FD_ISSET(fd, &rs));
    }
    struct iovec v = {(char*)b + got, n - got};
    ssize_t r = (mode == 3 || mode == 4) ? readv(fd, &v, 1) : (mode == 2 || mode >= 5) ? recv(fd, (char*)b + got, n - got, MSG_DONTWAIT) : read(fd, (char*)b + got, n - got);
    if (r < 0 && errno == EAGAIN && (mode == 2 || mode == 3 || mode >= 5)) continue;
    CHECK(r > 0);
    got += r;
  }
  if (mode == 6) ae_del(fd);
}
int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s ROUNDS DDP(0|1) block|poll|busy|vbusy|vblock|epoll|ae|select\n", argv[0]); return 2; }
  long rounds = atol(argv[1]); int ddp = atoi(argv[2]);
  mode = !strcmp(argv[3], "poll") ? 1 : !strcmp(argv[3], "busy") ? 2 : !strcmp(argv[3], "vbusy") ? 3 : !strcmp(argv[3], "vblock") ? 4 : !strcmp(argv[3], "epoll") ? 5 : !strcmp(argv[3], "ae") ? 6 : !strcmp(argv[3], "select") ? 7 : 0;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof a;
  CHECK(bind(l, (void*)&a, len) == 0 && listen(l, 1) == 0 && getsockname(l, (void*)&a, &len) == 0);
  pid_t pid = fork();
  int server = pid == 0;
  if (getenv("PIN")) {
    // PIN=1: the client on CPU 0, the server on CPU 1 (a busy-polling
    // pair on CPUs of their own, as the benchmark's busy row places them).
    cpu_set_t c;
    CPU_ZERO(&c);
    CPU_SET(server ? 1 : 0, &c);
    CHECK(sched_setaffinity(0, sizeof c, &c) == 0);
  }
  int fd;
  if (server) { fd = accept(l, 0, 0); } else { fd = socket(AF_INET, SOCK_STREAM, 0); CHECK(connect(fd, (void*)&a, len) == 0); }
  CHECK(fd >= 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (getenv("TIMEO") && atoi(getenv("TIMEO"))) {
    struct timeval tv = {5, 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
  }
  if (ddp) CHECK(setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one) == 0);
  if (mode == 3) CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  if (mode == 5 || mode == 6) {
    ep = epoll_create1(0);
    CHECK(ep >= 0);
  }
  if (mode == 5) {
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 7};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
  }
  if (mode == 6) CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  uint64_t m, got;
  // warm-up
  for (long i = 0; i < 200; i++) { m = i; if (!server) xsend(fd, &m, 8); xrecv(fd, &got, 8); CHECK(got == (uint64_t)i); if (server) xsend(fd, &got, 8); }
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < rounds; i++) { m = i; if (!server) xsend(fd, &m, 8); xrecv(fd, &got, 8); CHECK(got == (uint64_t)i); if (server) xsend(fd, &got, 8); }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!server) { double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / rounds; fprintf(stderr, "rtt %.2f us\n", us); }
  close(fd);
  if (!server) waitpid(pid, 0, 0);
  return 0;
}
