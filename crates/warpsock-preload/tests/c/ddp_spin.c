// The empty busy-polling spin, counted exactly (BENCHMARKS.md section 6, session 16): both
// ends switch to DDP mode and exchange one message, the client sends one more (its credits
// go back with it), then spins N non-blocking recvs on the empty socket through spin1 (not
// inlined: callgrind gives its inclusive cost per call); then one more message each way.
// Usage: ddp_spin N   (under LD_PRELOAD; per spin = (incl at N2 - incl at N1) / (N2 - N1))
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <errno.h>
#include <unistd.h>
#define SOL_WARPSOCK 0x57530000
#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #x, strerror(errno)); exit(1);} } while (0)
__attribute__((noinline)) ssize_t spin1(int fd, void *b) { return recv(fd, b, 8, MSG_DONTWAIT); }
static void rd(int fd, void *b) { int got = 0; while (got < 8) { ssize_t r = read(fd, (char*)b + got, 8 - got); CHECK(r > 0); got += r; } }
int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s SPINS\n", argv[0]); return 2; }
  long n = atol(argv[1]);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof a;
  CHECK(bind(l, (void*)&a, len) == 0 && listen(l, 1) == 0 && getsockname(l, (void*)&a, &len) == 0);
  pid_t pid = fork(); int server = pid == 0; int fd;
  if (server) fd = accept(l, 0, 0); else { fd = socket(AF_INET, SOCK_STREAM, 0); CHECK(connect(fd, (void*)&a, len) == 0); }
  int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  CHECK(setsockopt(fd, SOL_WARPSOCK, 1, &one, sizeof one) == 0);
  uint64_t m = 7, got;
  if (!server) { CHECK(write(fd, &m, 8) == 8); rd(fd, &got); CHECK(write(fd, &m, 8) == 8); for (long i = 0; i < n; i++) CHECK(spin1(fd, &got) < 0 && errno == EAGAIN); CHECK(write(fd, &m, 8) == 8); rd(fd, &got); }
  else { rd(fd, &got); CHECK(write(fd, &got, 8) == 8); rd(fd, &got); rd(fd, &got); CHECK(write(fd, &got, 8) == 8); }
  close(fd); if (!server) waitpid(pid, 0, 0); return 0;
}
