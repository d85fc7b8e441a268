/* A DDP-mode socket's descriptor passed with SCM_RIGHTS (issue 12;
 * interpose/io.rs `passes_managed`): its number names a file of the
 * library's (the doorbell's end) and its state is this process's memory,
 * so a receiver would read the doorbell's wake-up bytes as the stream.
 * sendmsg refuses it with EOPNOTSUPP and sends nothing; sendmmsg sends
 * the entries before the first that passes one and returns their count;
 * a pipe's descriptor beside it still passes (the receiver reads through
 * it), and the DDP pair still works after the refusals. With "plain"
 * (no preload: a TCP pair) the same sends pass the socket, and the
 * received copy reads the peer's bytes: the kernel's answer, which the
 * library cannot give. Both: a control header longer than the control
 * data, before an unmapped page, is the kernel's EINVAL. Prints
 * "passfd: ok". */
#include "ddppair.h"

#include <sys/mman.h>
#include <sys/un.h>

/* sendmsg of one byte 'x' on u carrying the descriptors fds[0..n). */
static ssize_t send_fds(int u, const int *fds, int n) {
    char byte = 'x';
    struct iovec v = {&byte, 1};
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = ctl.buf;
    m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    return sendmsg(u, &m, 0);
}

/* Receives one byte and the descriptors passed with it on u (at most 2)
 * into fds; returns how many came. */
static int recv_fds(int u, int *fds) {
    char byte;
    struct iovec v = {&byte, 1};
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof ctl.buf;
    CHECK(recvmsg(u, &m, 0) == 1 && byte == 'x');
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c) return 0;
    CHECK(c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS);
    int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    memcpy(fds, CMSG_DATA(c), (size_t)n * sizeof(int));
    return n;
}

int main(int argc, char **argv) {
    int plain = argc == 2 && strcmp(argv[1], "plain") == 0;
    int c, s, u[2], p[2];
    pair_unless_plain(plain, &c, &s);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, u) == 0);
    CHECK(pipe(p) == 0);
    int got[2];
    if (plain) {
        /* The kernel passes a TCP socket: its copy reads the peer's bytes. */
        CHECK(send_fds(u[0], &c, 1) == 1);
        CHECK(recv_fds(u[1], got) == 1);
        CHECK(write(s, "tcp", 3) == 3);
        char b[4];
        CHECK(read(got[0], b, sizeof b) == 3 && memcmp(b, "tcp", 3) == 0);
        close(got[0]);
    } else {
        /* Alone, or beside a pipe: refused, nothing sent. */
        errno = 0;
        CHECK(send_fds(u[0], &c, 1) == -1 && errno == EOPNOTSUPP);
        int both[2] = {p[0], s};
        errno = 0;
        CHECK(send_fds(u[0], both, 2) == -1 && errno == EOPNOTSUPP);
        /* sendmmsg: the entry before the refused one goes, its count
         * returned; a first entry refused fails the call. */
        char x0 = '0', x1 = '1';
        struct iovec v0 = {&x0, 1}, v1 = {&x1, 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct mmsghdr mm[2];
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &v0;
        mm[0].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr.msg_iov = &v1;
        mm[1].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr.msg_control = ctl.buf;
        mm[1].msg_hdr.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mm[1].msg_hdr);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &c, sizeof(int));
        CHECK(sendmmsg(u[0], mm, 2, 0) == 1);
        char b0;
        CHECK(read(u[1], &b0, 1) == 1 && b0 == '0');
        errno = 0;
        CHECK(sendmmsg(u[0], &mm[1], 1, 0) == -1 && errno == EOPNOTSUPP);
        /* Nothing of the refused sends came: the next byte is this one. */
        CHECK(send_fds(u[0], &p[0], 1) == 1);
        CHECK(recv_fds(u[1], got) == 1);
        CHECK(write(p[1], "pipe", 4) == 4);
        char b[8];
        CHECK(read(got[0], b, sizeof b) == 4 && memcmp(b, "pipe", 4) == 0);
        close(got[0]);
        /* The pair still carries bytes both ways. */
        CHECK(write(s, "ddp", 3) == 3);
        CHECK(read(c, b, sizeof b) == 3 && memcmp(b, "ddp", 3) == 0);
        CHECK(write(c, "back", 4) == 4);
        CHECK(read(s, b, sizeof b) == 4 && memcmp(b, "back", 4) == 0);
    }
    /* A header that claims more than the control data holds, its page
     * followed by an unmapped one: the kernel's EINVAL (the library's
     * look read past the buffer and faulted). */
    long page = sysconf(_SC_PAGESIZE);
    char *two = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(two != MAP_FAILED);
    CHECK(mprotect(two + page, (size_t)page, PROT_NONE) == 0);
    size_t clen = CMSG_SPACE(sizeof(int));
    struct cmsghdr *bad = (struct cmsghdr *)(two + page - clen);
    bad->cmsg_level = SOL_SOCKET;
    bad->cmsg_type = SCM_RIGHTS;
    bad->cmsg_len = 1 << 20;
    memcpy(CMSG_DATA(bad), &p[0], sizeof(int));
    char byte = 'x';
    struct iovec bv = {&byte, 1};
    struct msghdr bm;
    memset(&bm, 0, sizeof bm);
    bm.msg_iov = &bv;
    bm.msg_iovlen = 1;
    bm.msg_control = bad;
    bm.msg_controllen = clen;
    errno = 0;
    CHECK(sendmsg(u[0], &bm, 0) == -1 && errno == EINVAL);
    munmap(two, (size_t)page * 2);
    close(p[0]);
    close(p[1]);
    close(u[0]);
    close(u[1]);
    close(c);
    close(s);
    printf("passfd: ok\n");
    return 0;
}
