/*
 * warpsock_sockets.h — extended sockets over DDP (iWARP) for programs run
 * under libwarpsock_preload.so.
 *
 * A connected TCP socket switches into DDP mode when both programs call
 *
 *     int one = 1;
 *     setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one);
 *
 * Bytes written before the switch arrive before anything written after it.
 * If the peer does not run warpsock or does not switch, the call fails
 * (ECONNREFUSED; EPROTO for an incompatible peer; ENOBUFS at once, nothing
 * sent, while the process holds WARPSOCK_DDP_SOCKETS_MAX DDP sockets) and
 * the socket stays a working TCP socket, nothing lost. Set on a listening socket, connections
 * it accepts switch; set before connect(), the connection switches when it
 * is established (connect then fails with ECONNREFUSED if the peer does not
 * switch; the connection itself is up and plain). Without the preload the
 * kernel answers ENOPROTOOPT.
 *
 * In DDP mode the usual calls keep TCP's meaning (send/recv/read/write/...,
 * MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL, O_NONBLOCK, SO_RCVTIMEO/SO_SNDTIMEO,
 * shutdown, orderly close, dup/dup2, poll/select/epoll); the calls below add
 * what RDDP offers. This header is checked against the library by its tests.
 */
#ifndef WARPSOCK_SOCKETS_H
#define WARPSOCK_SOCKETS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Option level of DDP mode: far above every kernel level (protocol numbers
 * below 256, SOL_* below 300). */
#define SOL_WARPSOCK 0x57530000

/* int. Write 1: switch into DDP mode (0 on a plain socket: cancel a pending
 * request). Read: 1 in DDP mode, else 0. Other values: EINVAL. On a
 * connection a policy-mode or DDP-mode listener accepted, still switching
 * in the background, this option (read or written), WARPSOCK_CRC and the
 * calls below wait for the switch's end, or fail with EAGAIN on a
 * non-blocking socket (it becomes writable at the end). */
#define WARPSOCK_DDP_MODE 1
/* int. 1: message mode — every read returns at most one of the peer's
 * sends (recvmsg sets MSG_EOR on the read that ends it); 0: stream mode
 * (default). May be set before the switch. Other values: EINVAL. */
#define WARPSOCK_MSG_MODE 2
/* int, read only: 1 if MPA CRC32c protects the connection (WARPSOCK_CRC
 * environment variable, default on; on if either side asks). */
#define WARPSOCK_CRC 3

/* Registers len bytes at buf for the peer's one-sided access and announces
 * them under offset (-1: one the library chooses; unlike rsockets', not the
 * buffer's address, which would tell the peer where the process's memory
 * is). prot: PROT_WRITE (the peer
 * may warpsock_riowrite) and/or PROT_READ (the peer may warpsock_rioread).
 * flags must be 0. The peer knows the mapping once it has read anything
 * sent after this call. Returns the offset, or -1 (errno; ENOBUFS: 4096
 * mappings of the socket live already, the most a peer holds). */
off_t warpsock_riomap(int fd, void *buf, size_t len, int prot, int flags, off_t offset);
/* Ends the mapping of buf (the peer must have stopped using it). close()
 * ends every mapping of the socket for the program: buf is its own again
 * when close() returns. The peer's later writes fail (a remote protection
 * error ends the connection); a mapping it may read goes on from a copy
 * until the connection's end. */
int warpsock_riounmap(int fd, void *buf, size_t len);
/* One-sided write of count bytes into the peer's mapping at offset; returns
 * when sent. The peer is not notified: bytes sent after it arrive after it
 * is placed, and it is placed after every byte sent before it. Bytes sent
 * before it that still wait in the send buffer (the peer not reading) go
 * first: the call waits for them — for the peer to read — or on a
 * non-blocking socket fails at once with EAGAIN (an asynchronous write is
 * queued behind them). The wait has no bound unless SO_SNDTIMEO is set:
 * past it the connection fails with ETIMEDOUT (a one-sided request cannot
 * be withdrawn). flags must be 0. Returns count, or -1 (EINVAL: not
 * mapped; EACCES: not writable; EAGAIN; ETIMEDOUT). */
ssize_t warpsock_riowrite(int fd, const void *buf, size_t count, off_t offset, int flags);
/* One-sided read of count bytes from the peer's mapping at offset; after
 * the bytes sent before it, as warpsock_riowrite (EAGAIN likewise; bounded
 * by SO_RCVTIMEO, ETIMEDOUT likewise). */
ssize_t warpsock_rioread(int fd, void *buf, size_t count, off_t offset, int flags);

/* Asynchronous operations: return at once (0, or -1 and errno); the buffer
 * belongs to the library until the completion is collected, or until
 * close(): every buffer is the program's again when close() returns.
 * Receives not completed are dropped (no completion comes); sends, writes
 * and reads go on from (or into) copies, and an orderly close still sends
 * what was queued before it. */
int warpsock_aio_send(int fd, const void *buf, size_t len, uint64_t cookie);
int warpsock_aio_recv(int fd, void *buf, size_t len, uint64_t cookie);
int warpsock_aio_write(int fd, const void *buf, size_t len, off_t offset, uint64_t cookie);
int warpsock_aio_read(int fd, void *buf, size_t len, off_t offset, uint64_t cookie);
/* Vectored one-sided write: the iovcnt buffers of iov, in order, into the
 * peer's mapping at offset and on, as ONE RDMA Write with that gather list:
 * one transmit round and one completion (WARPSOCK_AIO_WRITE, result = the
 * total length) for the lot, where a warpsock_aio_write per buffer
 * transmits each at once. The buffers (not the iov array) belong to the
 * library until the completion is collected. EINVAL: iov NULL, iovcnt
 * outside 1..WARPSOCK_IOV_MAX, a NULL or empty buffer, offset < 0, or the
 * range not mapped; EACCES: not writable. */
int warpsock_aio_writev(int fd, const struct iovec *iov, int iovcnt, off_t offset,
                        uint64_t cookie);
#define WARPSOCK_IOV_MAX 64

/* The layout of this header's structures, bumped with every change. 2:
 * struct warpsock_aio_completion grew from 24 to 32 bytes (flags, reserved):
 * a program built against the 24-byte struct must be rebuilt. */
#define WARPSOCK_SOCKETS_ABI 2
/* The WARPSOCK_SOCKETS_ABI of the library loaded (works on no socket, never
 * fails). A program compares it with the macro before its first
 * warpsock_aio_poll: under a library of another ABI it would misread every
 * completion silently. Libraries older than this call (ABI 1, and ABI 2
 * before it) do not export it: look it up with dlsym to tell them apart. */
int warpsock_sockets_abi(void);

#define WARPSOCK_AIO_SEND 1
#define WARPSOCK_AIO_RECV 2
#define WARPSOCK_AIO_WRITE 3
#define WARPSOCK_AIO_READ 4

struct warpsock_aio_completion {
    uint64_t cookie; /* as given */
    int32_t op;      /* WARPSOCK_AIO_* */
    int32_t error;   /* 0, or the errno of a failed operation */
    int64_t result;  /* bytes transferred (a receive: 0 = end of stream) */
    int32_t flags;   /* a receive: MSG_EOR if its bytes end a message
                        (message mode, as recvmsg's msg_flags); else 0 */
    int32_t reserved; /* 0 */
};

/* Collects up to max finished operations; returns how many (0: none yet) or
 * -1. The socket is readable (poll/select/epoll) while completions wait. */
int warpsock_aio_poll(int fd, struct warpsock_aio_completion *out, int max);

#ifdef __cplusplus
}
#endif

#endif /* WARPSOCK_SOCKETS_H */
