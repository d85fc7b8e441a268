// MSG_ZEROCOPY trial (issue 3: "measure and keep what pays"): one TCP
// stream over loopback moving 4000 x 1 MiB, sent with plain send() or with
// SO_ZEROCOPY + MSG_ZEROCOPY, the receiver draining in a child process.
// Prints GB/s and how many zerocopy completions carried
// SO_EE_CODE_ZEROCOPY_COPIED (the kernel copied after all: it always does
// for loopback, see Documentation/networking/msg_zerocopy.rst).
//
//   gcc -O2 -Wall -o /tmp/zc scripts/zerocopy-trial.c && /tmp/zc 0 && /tmp/zc 1
//
// The send buffer is reused before its completions arrive: fine for a
// throughput trial (contents are not checked), not for real use.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <linux/errqueue.h>
#include <arpa/inet.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static long reap(int fd){ // drain completion notifications; returns count of "copied" notes
  long copied=0; char ctrl[128]; struct msghdr m={0}; m.msg_control=ctrl; m.msg_controllen=sizeof ctrl;
  while(recvmsg(fd,&m,MSG_ERRQUEUE|MSG_DONTWAIT)>=0){ struct cmsghdr*c=CMSG_FIRSTHDR(&m); if(c){struct sock_extended_err*e=(void*)CMSG_DATA(c); if(e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) copied++;} m.msg_controllen=sizeof ctrl; }
  return copied;}
int main(int argc,char**argv){int zc=atoi(argv[1]); size_t SZ=1<<20; int N=4000;
 int l=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in a={.sin_family=AF_INET,.sin_addr.s_addr=htonl(0x7f000001)};
 bind(l,(void*)&a,sizeof a);listen(l,1);socklen_t al=sizeof a;getsockname(l,(void*)&a,&al);
 if(fork()==0){int c=accept(l,0,0);char*b=malloc(SZ);long t=0;for(;;){ssize_t r=read(c,b,SZ);if(r<=0)break;t+=r;}_exit(0);}
 int c=socket(AF_INET,SOCK_STREAM,0);connect(c,(void*)&a,sizeof a);int one=1;
 if(zc&&setsockopt(c,SOL_SOCKET,SO_ZEROCOPY,&one,sizeof one)){perror("SO_ZEROCOPY");return 1;}
 char*buf=malloc(SZ);memset(buf,7,SZ);long copied=0;
 double t0=now();
 for(int i=0;i<N;i++){size_t off=0;while(off<SZ){ssize_t r=send(c,buf+off,SZ-off,zc?MSG_ZEROCOPY:0); if(r<0){if(errno==ENOBUFS||errno==EAGAIN){copied+=reap(c);continue;}perror("send");return 1;} off+=r;} if(zc)copied+=reap(c);}
 double t=now()-t0; shutdown(c,SHUT_WR); wait(0);
 printf("%s: %.2f GB/s (%ld completions said 'copied')\n",zc?"MSG_ZEROCOPY":"plain     ",N*(double)SZ/t/1e9,copied);}
