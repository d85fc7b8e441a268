//! The few system calls std does not offer: epoll, eventfd, `poll`,
//! `sendmsg` with `MSG_NOSIGNAL`, `recv`/`recvmsg` with explicit flags, TCP
//! socket options and `mlock`.
//!
//! This is one of the few modules of the crate allowed to use `unsafe`
//! (see [`crate::mem`]). Every function here wraps one libc call on
//! file descriptors the caller owns, and checks its result.
//!
//! None of them is a cancellation point: each blocking or I/O call is the
//! raw system call (`libc::syscall`), not libc's wrapper. An application
//! thread runs these inside its own call of a DDP-mode socket (issue 12),
//! and glibc's wrappers act on a pending `pthread_cancel` there — a forced
//! unwind from inside the library's frames, which cannot cross their
//! `extern "C"` entry points (the process aborted: "FATAL: exception not
//! rethrown"). Raw, a pending cancel is only a mark; the preload acts on
//! it at its outermost frame (`warpsock_xsock::cancel`).
#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Converts a libc `-1` return into the thread's `errno`.
fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A timeout in milliseconds for epoll/poll: `None` blocks, anything else
/// is rounded up so that a short timeout never becomes a busy spin.
pub(crate) fn timeout_ms(t: Option<Duration>) -> libc::c_int {
    match t {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    }
}

/// An epoll instance.
#[derive(Debug)]
pub(crate) struct Epoll {
    fd: OwnedFd,
}

/// Readiness reported by [`Epoll::wait`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    /// The token given to [`Epoll::add`].
    pub(crate) token: u64,
}

/// Interest flags for [`Epoll::add`] / [`Epoll::modify`].
pub(crate) const EP_IN: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Write readiness.
pub(crate) const EP_OUT: u32 = libc::EPOLLOUT as u32;

impl Epoll {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned fd is checked and then owned.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // Out of the program's numbers (`crate::fds`).
        let fd = crate::fds::lift(fd);
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    pub(crate) fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    pub(crate) fn modify(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    pub(crate) fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout` (None: forever) and appends ready tokens to
    /// `out`. `EINTR` counts as "nothing ready": `Ok(false)` (a signal
    /// ended the wait; `Ok(true)` otherwise), which a caller's wait may
    /// pass on ([`crate::Cq::wait_news`]).
    pub(crate) fn wait(&self, out: &mut Vec<Ready>, timeout: Option<Duration>) -> io::Result<bool> {
        const MAX: usize = 256;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX];
        let r = crate::rawsys::epoll_pwait(self.fd.as_raw_fd(), &mut evs, timeout_ms(timeout));
        match cvt(r) {
            Ok(n) => {
                out.extend(evs[..n as usize].iter().map(|e| Ready { token: e.u64 }));
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A non-blocking eventfd used as a level-triggered flag.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned fd is checked and then owned.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // Out of the program's numbers (`crate::fds`).
        let fd = crate::fds::lift(fd);
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Makes the fd readable.
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN)
        // still leaves the fd readable, which is all we want.
        unsafe { crate::rawsys::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the fd unreadable again.
    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN (already clear) is fine.
        unsafe {
            libc::syscall(
                libc::SYS_read,
                libc::c_long::from(self.fd.as_raw_fd()),
                &mut v as *mut u64,
                8usize,
            )
        };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `poll(2)` on `fds` (each entry's `revents` is filled in) for up to
/// `timeout` (`None`: forever). Returns how many are ready; `EINTR` counts
/// as none.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    // SAFETY: `fds` is a live, writable array of `fds.len()` pollfds for
    // the duration of the call.
    let r = unsafe { raw_poll(fds.as_mut_ptr(), fds.len(), timeout_ms(timeout)) };
    match cvt(r) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// `poll(2)` for input on the one socket `fd`, up to `timeout`: its
/// `revents` (0: the timeout passed; `POLLIN`, `POLLHUP` or `POLLERR`:
/// bytes, EOF or an error to read — or, `POLLERR` alone, an entry in the
/// socket's error queue, which a read does not take), or `Interrupted`
/// when a signal ended the sleep (unlike [`poll`]). `poll` checks for a
/// pending signal before its timeout (Linux `do_poll`), so one that wakes
/// it is not lost to the timeout (see `ParkedRead::read_polled`). Raw, not
/// a cancellation point (see the module's comment).
pub(crate) fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one live, writable pollfd for the duration of the call.
    let r = unsafe { raw_poll(&mut p, 1, timeout_ms(Some(timeout))) };
    cvt(r).map(|n| if n > 0 { p.revents } else { 0 })
}

/// `poll(2)` as the raw `ppoll` system call (arm64 has no `poll`): `n`
/// pollfds at `fds`, up to `ms` milliseconds (negative: no limit; as
/// [`timeout_ms`] gives them, rounded up), no mask. Like
/// `poll`, it fails with `EINTR` when a handled signal wakes it, whatever
/// `SA_RESTART` says, and looks for a pending signal before its timeout.
///
/// # Safety
/// `fds` is a live, writable array of `n` pollfds for the call.
pub(crate) unsafe fn raw_poll(fds: *mut libc::pollfd, n: usize, ms: libc::c_int) -> libc::c_int {
    let ts = (ms >= 0).then(|| libc::timespec {
        tv_sec: libc::time_t::from(ms / 1000),
        tv_nsec: libc::c_long::from(ms % 1000) * 1_000_000,
    });
    // SAFETY: the caller vouches for `fds`; no mask.
    unsafe { crate::rawsys::ppoll(fds, n, ts, std::ptr::null()) }
}

/// Gathers of at most this many bytes in all are copied into one buffer
/// and go out with `send` (see [`send_vectored`]).
pub(crate) const COALESCE_MAX: usize = 512;

/// `sendmsg(fd, iov, MSG_NOSIGNAL | MSG_DONTWAIT)`: a gathered write that
/// reports a dead peer as `EPIPE` instead of raising `SIGPIPE`.
///
/// A single buffer, or a gather of at most [`COALESCE_MAX`] bytes copied
/// into one, goes out with plain `send`: the kernel's `sendmsg` entry
/// (copying in the header, importing the iovec, one copy loop per entry)
/// costs more per call than copying a few hundred bytes here, and the
/// latency path is made of such writes (an RDMA Write followed by its
/// zero-byte notifying Send is two FPDUs, two entries).
pub(crate) fn send_vectored(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    if let [one] = bufs {
        return send_one(fd, one);
    }
    let total = bufs.iter().map(|b| b.len()).sum::<usize>();
    if total <= COALESCE_MAX {
        let mut joined = [0u8; COALESCE_MAX];
        let mut at = 0;
        for b in bufs {
            joined[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        return send_one(fd, &joined[..at]);
    }
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with `struct iovec` on Unix.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(IOV_MAX) as _;
    // SAFETY: `msg` points at `bufs`, which are live, readable slices.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sendmsg,
            libc::c_long::from(fd),
            &msg as *const libc::msghdr,
            libc::c_long::from(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `send(fd, buf, MSG_NOSIGNAL | MSG_DONTWAIT)`, made as the raw `sendto`
/// system call: libc's `send` is a cancellation point (it brackets the call
/// with `__pthread_enable_asynccancel`/`..._disable_...`) and, under the
/// preload, resolves to the interposed `send` first (its guard check, then
/// the real one) — about 60 instructions per small write (callgrind, the
/// 8 B ping-pong) that a non-blocking write of our own socket needs none
/// of. The engine's writes so never re-enter the interposer at all. On
/// x86-64 the `syscall` instruction itself ([`kernel_socket_io`]).
#[inline]
fn send_one(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    // SAFETY: `buf` is a live, readable slice of `buf.len()` bytes.
    unsafe {
        kernel_socket_io(
            libc::SYS_sendto,
            fd,
            buf.as_ptr().cast_mut(),
            buf.len(),
            flags,
        )
    }
}

/// `write_all` of `buf` to the socket `fd` (the MPA exchange's messages)
/// as raw `sendto` system calls with `MSG_NOSIGNAL`: std's
/// `TcpStream::write_all` is libc's `send`, a cancellation point, and the
/// exchange runs in the application's thread, inside its `setsockopt`,
/// `connect` or `accept` (a switch to DDP mode; see the module's comment:
/// a `pthread_cancel` during the switch aborted the process). Blocks as
/// the socket's mode says (`WouldBlock` on a non-blocking one, or at its
/// `SO_SNDTIMEO`), goes on after `EINTR` as std's does, and fails with
/// `WriteZero` if the kernel took nothing.
pub(crate) fn send_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a live, readable slice of `buf.len()` bytes.
        let r = unsafe {
            raw_socket_io(
                libc::SYS_sendto,
                fd,
                buf.as_ptr().cast_mut(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        match r {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "failed to write whole buffer",
                ))
            }
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `sendto`/`recvfrom` (`nr`) of `len` bytes at `ptr` as a raw system
/// call, with no address (null address, zero length: both calls take that
/// as none).
///
/// # Safety
/// `ptr` is valid for `len` bytes: readable for `sendto`, writable for
/// `recvfrom`.
unsafe fn raw_socket_io(
    nr: libc::c_long,
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: the caller vouches for `ptr`/`len`.
    let r = unsafe { crate::rawsys::socket_io(nr, fd, ptr, len, flags) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// [`raw_socket_io`] made, on x86-64, with the `syscall` instruction itself
/// ([`crate::rawsys::socket_io_kernel`]): no libc `syscall` (its argument
/// shuffle, its `errno` store, its page of code), the error built from the
/// kernel's `-errno`. The small write ([`send_one`]) and the parked read
/// ([`recv_wait`]), on every round trip (issue 12).
///
/// # Safety
/// As [`raw_socket_io`].
#[inline]
unsafe fn kernel_socket_io(
    nr: libc::c_long,
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
) -> io::Result<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller vouches for `ptr`/`len`.
        let r = unsafe { crate::rawsys::socket_io_kernel(nr, fd, ptr, len, flags) };
        if r < 0 {
            Err(io::Error::from_raw_os_error(-r as i32))
        } else {
            Ok(r as usize)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller vouches for `ptr`/`len`.
    unsafe {
        raw_socket_io(nr, fd, ptr, len, flags)
    }
}

/// `recv(fd, buf, MSG_DONTWAIT)`: a read that never blocks, whatever the
/// socket's blocking mode (queue-pair sockets stay in blocking mode so that
/// a waiting caller can sleep in a blocking [`recv_wait`]).
///
/// Made as the raw `recvfrom` system call, as [`send_one`] is `sendto`:
/// libc's `recv` is a cancellation point and, under the preload, resolves
/// to the interposed `recv` (its guard check, then the real one) first — a
/// non-blocking read of our own socket needs neither. The blocking
/// [`recv_wait`] is raw too (see the module's comment).
pub(crate) fn recv_dontwait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
    unsafe {
        raw_socket_io(
            libc::SYS_recvfrom,
            fd,
            buf.as_mut_ptr(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    }
}

/// [`recv_dontwait`] with its error as the bare errno: a busy poller's
/// empty read (`EAGAIN`, the short idle round's usual answer) builds and
/// drops no `io::Error` (a call to its drop, ~20 instructions an empty
/// spin; issue 12). On x86-64 the `syscall` instruction itself
/// ([`crate::rawsys::socket_io_kernel`]): no `errno` at all.
#[inline]
pub(crate) fn recv_dontwait_errno(fd: RawFd, buf: &mut [u8]) -> Result<usize, i32> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
        let r = unsafe {
            crate::rawsys::socket_io_kernel(
                libc::SYS_recvfrom,
                fd,
                buf.as_mut_ptr(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            Err(-r as i32)
        } else {
            Ok(r as usize)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
        let r = unsafe {
            crate::rawsys::socket_io(
                libc::SYS_recvfrom,
                fd,
                buf.as_mut_ptr(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            // SAFETY: the calling thread's errno, which the failed call set.
            Err(unsafe { *libc::__errno_location() })
        } else {
            Ok(r as usize)
        }
    }
}

/// `recv(fd, buf, 0)` on a blocking socket: sleeps until bytes, EOF, an
/// error or the socket's `SO_RCVTIMEO` (then `WouldBlock`).
///
/// The parked read of every blocking receive (issue 12): on x86-64 the
/// `syscall` instruction itself ([`kernel_socket_io`]).
pub(crate) fn recv_wait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
    unsafe { kernel_socket_io(libc::SYS_recvfrom, fd, buf.as_mut_ptr(), buf.len(), 0) }
}

/// `recvmsg(fd, iov, MSG_DONTWAIT)`: a scattered read that never blocks.
pub(crate) fn recv_vectored_dontwait(fd: RawFd, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSliceMut is guaranteed ABI-compatible with `struct iovec` on Unix.
    msg.msg_iov = bufs.as_mut_ptr().cast();
    msg.msg_iovlen = bufs.len().min(IOV_MAX) as _;
    // SAFETY: `msg` points at `bufs`, which are live, writable slices.
    let r = unsafe {
        libc::syscall(
            libc::SYS_recvmsg,
            libc::c_long::from(fd),
            &mut msg as *mut libc::msghdr,
            libc::c_long::from(libc::MSG_DONTWAIT),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Most iovecs one `sendmsg`/`readv` takes (Linux `UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v`/`len` are live and sized for an int option.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// Keepalive probes: first after `idle`, then every `interval`, give up
/// after `count` unanswered probes.
pub(crate) fn set_keepalive(
    fd: RawFd,
    idle: Duration,
    interval: Duration,
    count: u32,
) -> io::Result<()> {
    let secs = |d: Duration| d.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1 as libc::c_int)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(idle))?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(interval))?;
    setsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPCNT,
        count.clamp(1, 127) as libc::c_int,
    )
}

/// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged before
/// the kernel resets the connection.
pub(crate) fn set_user_timeout(fd: RawFd, t: Duration) -> io::Result<()> {
    let ms = t.as_millis().min(u32::MAX as u128) as libc::c_uint;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)
}

/// `SO_SNDBUF`.
pub(crate) fn set_send_buffer(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)
}

/// `SO_RCVBUF`.
pub(crate) fn set_recv_buffer(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)
}

/// `TCP_MAXSEG` of a connected socket.
pub(crate) fn tcp_mss(fd: RawFd) -> io::Result<usize> {
    getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG).map(|v| v.max(0) as usize)
}

/// `SO_LINGER {on, 0}`: closing the socket sends RST (abortive close).
/// Exported for the socket layers above the engine (one place for it).
pub fn set_linger_zero(fd: RawFd) -> io::Result<()> {
    setsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_LINGER,
        libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
}

/// Resets the TCP connection on `fd` at once (an RST; the descriptor stays
/// valid): `SO_LINGER` 0, then `connect` to `AF_UNSPEC`, which disconnects
/// a TCP socket (Linux `tcp_disconnect`: an active reset from an
/// established state). The raw system call: libc's `connect` is a
/// cancellation point. Exported for the socket layers above the engine
/// (one place for it).
pub fn reset_now(fd: RawFd) {
    let _ = set_linger_zero(fd);
    // SAFETY: sockaddr is plain data; all-zero is a valid empty one.
    let mut a: libc::sockaddr = unsafe { std::mem::zeroed() };
    a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: reads a `sockaddr` from the stack.
    unsafe {
        libc::syscall(
            libc::SYS_connect,
            libc::c_long::from(fd),
            &a as *const libc::sockaddr,
            size_of::<libc::sockaddr>() as libc::c_long,
        )
    };
}

/// Most entries [`drain_error_queue`] takes in one call: far more than any
/// socket's error queue holds (each entry is charged to its receive buffer,
/// `sock_queue_err_skb`, at 576 B or more: 2^20 of them fill 576 MiB).
const ERRQUEUE_MAX: usize = 1 << 20;

/// Takes and drops the entries of `fd`'s error queue (`recvmsg` with
/// `MSG_ERRQUEUE | MSG_DONTWAIT` until `EAGAIN`): transmit stamps,
/// zero-copy notices, ICMP reports that options set on the socket made —
/// by a program before it handed the socket over (review r23-a item 2: its
/// `SO_TIMESTAMPING`'s stamps for bytes sent before come after the option
/// went off). Nobody reads them here, and each one makes `poll` and epoll
/// report `POLLERR` for as long as it stays (a wait for input then never
/// sleeps) and is charged to the receive buffer. Never takes the socket's
/// own error (`sk_err`): an empty queue answers `EAGAIN` without looking at
/// it. Returns how many it took (bounded: `ERRQUEUE_MAX`). Exported for
/// the socket layers above the engine (one place for it).
pub fn drain_error_queue(fd: RawFd) -> usize {
    let mut n = 0;
    for _ in 0..ERRQUEUE_MAX {
        // SAFETY: msghdr is plain data; all-zero is a valid empty header
        // (no buffer, no control space: the entry is taken truncated).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // SAFETY: `msg` is a live header naming no memory.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmsg,
                libc::c_long::from(fd),
                &mut msg as *mut libc::msghdr,
                libc::c_long::from(libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT),
            )
        };
        if r >= 0 {
            n += 1;
        } else if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    n
}

/// Fills `buf` from the kernel's random source (`getrandom`, which only
/// blocks before the pool is first initialised at boot), as the raw
/// system call: glibc's `getrandom` is a cancellation point, and a
/// switch's registrations draw their keys in the application's thread.
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let rest = &mut buf[at..];
        // SAFETY: `rest` is a live, writable slice of the length passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                rest.as_mut_ptr(),
                rest.len(),
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            at += r as usize;
        }
    }
    Ok(())
}

/// `mlock` of `[ptr, ptr + len)`.
pub(crate) fn mlock(ptr: *const u8, len: usize) -> io::Result<()> {
    // SAFETY: mlock only changes paging of the range; an invalid range
    // fails with ENOMEM and touches nothing.
    cvt(unsafe { libc::mlock(ptr.cast(), len) })?;
    Ok(())
}

/// `munlock` of `[ptr, ptr + len)`.
pub(crate) fn munlock(ptr: *const u8, len: usize) {
    // SAFETY: as for `mlock`; failure (e.g. never locked) is harmless.
    unsafe { libc::munlock(ptr.cast(), len) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// Every shape of gather — one buffer, a small gather that is joined
    /// into one `send`, one byte past the joining limit, and a large one
    /// that goes out by `sendmsg` — arrives as the exact concatenation.
    #[test]
    fn send_vectored_writes_the_concatenation() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let pattern = |n: usize, seed: u8| -> Vec<u8> {
            (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
        };
        let shapes: [&[usize]; 5] = [
            &[8],
            &[28, 24],
            &[0, 3, 0, 100],
            &[COALESCE_MAX / 2, COALESCE_MAX / 2 + 1],
            &[4000, 7, 9000],
        ];
        for (k, sizes) in shapes.iter().enumerate() {
            let parts: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(n, (k * 16 + i) as u8))
                .collect();
            let iov: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let want: Vec<u8> = parts.concat();
            let mut sent = 0;
            while sent < want.len() {
                // A short write leaves the rest: resend from there.
                let rest = IoSlice::new(&want[sent..]);
                let n = if sent == 0 {
                    send_vectored(tx.as_raw_fd(), &iov).unwrap()
                } else {
                    send_vectored(tx.as_raw_fd(), &[rest]).unwrap()
                };
                sent += n;
            }
            let mut got = vec![0u8; want.len()];
            rx.read_exact(&mut got).unwrap();
            assert_eq!(got, want, "shape {sizes:?}");
        }
    }

    /// A one-buffer write's errors are the kernel's errno (issue 12: on
    /// x86-64 it is the `syscall` instruction's `-errno`, no libc
    /// `errno`): `EAGAIN` once the socket's buffer is full (the write
    /// never blocks), `EPIPE` after our end is shut (no `SIGPIPE`:
    /// `MSG_NOSIGNAL`); a write that went returns its length.
    #[test]
    fn send_one_reports_the_kernels_errno() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_rx, _) = l.accept().unwrap();
        let fd = tx.as_raw_fd();
        assert_eq!(send_one(fd, b"12345678").unwrap(), 8);
        let big = vec![0u8; 1 << 16];
        let full = loop {
            match send_one(fd, &big) {
                Ok(n) => assert!(n > 0),
                Err(e) => break e,
            }
        };
        assert_eq!(full.raw_os_error(), Some(libc::EAGAIN), "{full:?}");
        tx.shutdown(std::net::Shutdown::Write).unwrap();
        let e = send_one(fd, b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e:?}");
    }
}
