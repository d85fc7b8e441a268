//! Small safe wrappers: errno, socket addresses, descriptors.

use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{c_int, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use warpsock_engine::rawsys;

use super::real;

mod descriptors;
pub(crate) use descriptors::descriptors_free;

/// Locks `m`, going on with the data if a panicking thread poisoned it (a
/// panic is caught at the boundary and the state stays usable).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `getpid(2)`: a system call each time (glibc >= 2.25 caches nothing).
/// Counted per thread in unit tests ([`getpids`]): the close path's cost
/// (review r29-a item 3).
#[inline]
pub(crate) fn getpid() -> libc::pid_t {
    #[cfg(test)]
    GETPIDS.with(|n| n.set(n.get() + 1));
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

#[cfg(test)]
thread_local! {
    static GETPIDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The calling thread's [`getpid`] calls so far (unit tests).
#[cfg(test)]
pub(crate) fn getpids() -> u64 {
    GETPIDS.with(std::cell::Cell::get)
}

/// The calling thread's errno (read as `set_errno` writes it: no
/// `io::Error` to build and drop per failed call).
pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// `recv(fd, buf, len, MSG_DONTWAIT)` on a socket of the library's own, as
/// the raw `recvfrom` system call: libc's `recv` is a cancellation point
/// (two calls around the system call), which a read that never blocks
/// does not need. Returns as libc's does (-1 and errno on failure).
///
/// # Safety
/// `buf` must be writable for `len` bytes.
pub(crate) unsafe fn recv_dontwait(fd: c_int, buf: *mut u8, len: usize) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`; no address is asked for.
    unsafe { rawsys::socket_io(libc::SYS_recvfrom, fd, buf, len, libc::MSG_DONTWAIT) }
}

/// `sendmsg(fd, msg, flags)` on a socket of the library's own, as the raw
/// system call (see [`recv_dontwait`]; `flags` carries `MSG_DONTWAIT`).
///
/// # Safety
/// `msg` must be a valid msghdr whose buffers are readable.
pub(crate) unsafe fn sendmsg_nowait(fd: c_int, msg: &libc::msghdr, flags: c_int) -> isize {
    debug_assert!(flags & libc::MSG_DONTWAIT != 0);
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    // SAFETY: the caller vouches for `msg`.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg as *const libc::msghdr, flags) as isize }
}

/// `send(fd, buf, len, flags)` on a socket of the library's own (its
/// doorbells), as the raw `sendto` system call: never a cancellation point
/// (a program thread rings inside its call of a DDP-mode socket, where
/// libc's would act on a pending `pthread_cancel`: `warpsock_xsock::cancel`).
///
/// # Safety
/// `buf` must be readable for `len` bytes.
pub(crate) unsafe fn send_raw(fd: c_int, buf: *const u8, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller vouches for `buf`/`len` (only read: a send);
    // no address is given.
    unsafe { rawsys::socket_io(libc::SYS_sendto, fd, buf.cast_mut(), len, flags) }
}

/// `recv(fd, buf, len, flags)` as the raw `recvfrom` system call (see
/// [`send_raw`]).
///
/// # Safety
/// `buf` must be writable for `len` bytes.
pub(crate) unsafe fn recv_raw(fd: c_int, buf: *mut u8, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`; no address is asked for.
    unsafe { rawsys::socket_io(libc::SYS_recvfrom, fd, buf, len, flags) }
}

/// `recvmsg(fd, msg, flags)` as the raw system call (see [`send_raw`]):
/// the library's reads of its own sockets and of the program's kernel
/// sockets it reads for a call. Returns as libc's does.
///
/// # Safety
/// `msg` must be a valid msghdr whose buffers are writable.
pub(crate) unsafe fn recvmsg_raw(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    // SAFETY: the caller vouches for `msg`.
    unsafe { libc::syscall(libc::SYS_recvmsg, fd, msg, flags) as isize }
}

/// `sendmsg(fd, msg, flags)` as the raw system call (see [`send_raw`]),
/// any flags (a wait the caller's `flags` ask for included).
///
/// # Safety
/// `msg` must be a valid msghdr whose buffers are readable.
pub(crate) unsafe fn sendmsg_raw(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    // SAFETY: the caller vouches for `msg`.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as isize }
}

/// `recvfrom(fd, buf, len, flags, addr, alen)` as the raw system call
/// (see [`send_raw`]).
///
/// # Safety
/// `buf` writable for `len` bytes; `addr`/`alen` null or valid.
pub(crate) unsafe fn recvfrom_raw(
    fd: c_int,
    buf: *mut u8,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    // SAFETY: the caller vouches for the pointers.
    unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as isize }
}

/// `sendto(fd, buf, len, flags, addr, alen)` as the raw system call (see
/// [`send_raw`]).
///
/// # Safety
/// `buf` readable for `len` bytes; `addr` null or `alen` readable bytes.
pub(crate) unsafe fn sendto_raw(
    fd: c_int,
    buf: *const u8,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> isize {
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    let alen = libc::c_long::from(alen);
    // SAFETY: the caller vouches for the pointers.
    unsafe { libc::syscall(libc::SYS_sendto, fd, buf, len, flags, addr, alen) as isize }
}

/// `connect(fd, addr, len)` as the raw system call (see [`send_raw`]).
///
/// # Safety
/// `addr` must be readable for `len` bytes.
pub(crate) unsafe fn connect_raw(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let (fd, len) = (libc::c_long::from(fd), libc::c_long::from(len));
    // SAFETY: the caller vouches for `addr`.
    unsafe { libc::syscall(libc::SYS_connect, fd, addr, len) as c_int }
}

/// `accept4(fd, addr, len, flags)` as the raw system call (see
/// [`send_raw`]).
///
/// # Safety
/// `addr`/`len` null or valid for the kernel to write.
pub(crate) unsafe fn accept4_raw(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let (fd, flags) = (libc::c_long::from(fd), libc::c_long::from(flags));
    // SAFETY: the caller vouches for the pointers.
    unsafe { libc::syscall(libc::SYS_accept4, fd, addr, len, flags) as c_int }
}

/// `read(fd, buf, len)` as the raw system call (see [`send_raw`]).
///
/// # Safety
/// `buf` must be writable for `len` bytes.
pub(crate) unsafe fn read_raw(fd: c_int, buf: *mut u8, len: usize) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`.
    unsafe { libc::syscall(libc::SYS_read, libc::c_long::from(fd), buf, len) as isize }
}

/// `pread(fd, buf, len, off)` as the raw `pread64` system call (see
/// [`send_raw`]).
///
/// # Safety
/// `buf` must be writable for `len` bytes.
pub(crate) unsafe fn pread_raw(fd: c_int, buf: *mut u8, len: usize, off: libc::off_t) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`.
    unsafe {
        libc::syscall(
            libc::SYS_pread64,
            libc::c_long::from(fd),
            buf,
            len,
            off as libc::c_long,
        ) as isize
    }
}

/// `write(fd, buf, len)` as the raw system call (see [`send_raw`]).
///
/// # Safety
/// `buf` must be readable for `len` bytes.
pub(crate) unsafe fn write_raw(fd: c_int, buf: *const u8, len: usize) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`.
    unsafe { rawsys::write(fd, buf, len) }
}

/// `getrandom(buf, len, flags)` as the raw system call: glibc's is a
/// cancellation point (see [`send_raw`]).
pub(crate) fn getrandom(buf: &mut [u8], flags: libc::c_uint) -> isize {
    // SAFETY: `buf` is a live, writable slice of its length.
    unsafe { libc::syscall(libc::SYS_getrandom, buf.as_mut_ptr(), buf.len(), flags) as isize }
}

/// `ppoll(fds, n, timeout, mask)` as the raw system call (see
/// [`send_raw`]): `timeout` is copied (the kernel writes what is left into
/// it), `mask` the caller's (null: none).
///
/// # Safety
/// `fds` is a live, writable array of `n` pollfds; `mask` null or valid.
pub(crate) unsafe fn ppoll_raw(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: Option<libc::timespec>,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller vouches for `fds` and `mask`.
    unsafe { rawsys::ppoll(fds, n as usize, timeout, mask) }
}

/// Sets the calling thread's errno.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Reads a socket address the application passed in.
///
/// # Safety
/// `p` must be null or point to `len` readable bytes.
pub(crate) unsafe fn addr_from_raw(p: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if p.is_null() || (len as usize) < size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked above).
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_INET if len as usize >= size_of::<sockaddr_in>() => {
            // SAFETY: AF_INET with enough bytes is a sockaddr_in; read unaligned
            // because the application's buffer may be any alignment.
            let sin = unsafe { p.cast::<sockaddr_in>().read_unaligned() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let s6 = unsafe { p.cast::<sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s6.sin6_addr.s6_addr),
                u16::from_be(s6.sin6_port),
                s6.sin6_flowinfo,
                s6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Encodes `a` as a C socket address.
pub(crate) fn addr_to_raw(a: &SocketAddr) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut sockaddr_storage).cast::<sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let s6 = unsafe { &mut *(&mut ss as *mut sockaddr_storage).cast::<sockaddr_in6>() };
            s6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s6.sin6_port = v6.port().to_be();
            s6.sin6_flowinfo = v6.flowinfo();
            s6.sin6_addr.s6_addr = v6.ip().octets();
            s6.sin6_scope_id = v6.scope_id();
            size_of::<sockaddr_in6>()
        }
    };
    (ss, len as socklen_t)
}

/// Writes `a` to an application buffer of `*len` bytes, truncating as the
/// kernel does, and stores the full length in `*len`.
///
/// # Safety
/// `out` null, or `out` writable for `*len` bytes and `len` valid.
pub(crate) unsafe fn addr_write(a: &SocketAddr, out: *mut sockaddr, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    let (ss, full) = addr_to_raw(a);
    // SAFETY: `len` is valid per the contract.
    let room = unsafe { *len } as usize;
    let n = room.min(full as usize);
    // SAFETY: `out` is writable for `room >= n` bytes; `ss` holds `full >= n`.
    unsafe {
        std::ptr::copy_nonoverlapping((&ss as *const sockaddr_storage).cast::<u8>(), out.cast(), n);
        *len = full;
    }
}

/// `a` in the form a socket of `family` reports it: IPv4 peers of IPv6
/// sockets appear IPv4-mapped.
pub(crate) fn for_family(a: SocketAddr, family: c_int) -> SocketAddr {
    match (a, family) {
        (SocketAddr::V4(v4), libc::AF_INET6) => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        (a, _) => a,
    }
}

/// The local address of a socket.
pub(crate) fn local_addr(fd: c_int) -> Option<SocketAddr> {
    // SAFETY: zeroed storage is valid; getsockname writes at most `len` bytes.
    let mut ss: sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: valid out pointers.
    let r = unsafe { real::getsockname(fd, (&mut ss as *mut sockaddr_storage).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of address.
    unsafe { addr_from_raw((&ss as *const sockaddr_storage).cast(), len) }
}

/// The peer address of a connected socket.
pub(crate) fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    // SAFETY: zeroed storage is valid; getpeername writes at most `len` bytes.
    let mut ss: sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: valid out pointers.
    let r = unsafe { real::getpeername(fd, (&mut ss as *mut sockaddr_storage).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of address.
    unsafe { addr_from_raw((&ss as *const sockaddr_storage).cast(), len) }
}

/// getsockopt of an `int`.
pub(crate) fn get_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: valid out pointers of the declared size.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// setsockopt of an `int`; returns whether it succeeded.
pub(crate) fn set_int(fd: c_int, level: c_int, name: c_int, v: c_int) -> bool {
    // SAFETY: valid pointer to an int of the declared size.
    let r = unsafe {
        real::setsockopt(
            fd,
            level,
            name,
            (&v as *const c_int).cast(),
            size_of::<c_int>() as _,
        )
    };
    r == 0
}

/// A socket's SO_RCVTIMEO/SO_SNDTIMEO as a duration (`None`: no timeout).
pub(crate) fn get_timeo(fd: c_int, name: c_int) -> Option<std::time::Duration> {
    // SAFETY: timeval is plain data.
    let mut tv: libc::timeval = unsafe { zeroed() };
    let mut len = size_of::<libc::timeval>() as socklen_t;
    // SAFETY: valid out pointers of the declared size.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    timeval_to_dur(r, &tv)
}

/// Converts a timeval option value (after a call returning `r`) to a timeout.
pub(crate) fn timeval_to_dur(r: c_int, tv: &libc::timeval) -> Option<std::time::Duration> {
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) || tv.tv_sec < 0 {
        return None;
    }
    Some(std::time::Duration::new(
        tv.tv_sec as u64,
        (tv.tv_usec.max(0) as u32) * 1000,
    ))
}

/// Closes an internal descriptor (ignoring errors), as the raw system
/// call: libc's `close` is a cancellation point (see [`send_raw`]).
pub(crate) fn close(fd: c_int) {
    if fd >= 0 {
        // SAFETY: closing a descriptor this library owns.
        unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(fd)) };
    }
}

/// Sets or clears O_NONBLOCK on a descriptor.
pub(crate) fn set_nonblocking(fd: c_int, on: bool) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we were handed; no pointers.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let nfl = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            if nfl != fl {
                real::fcntl(fd, libc::F_SETFL, nfl as usize);
            }
        }
    }
}

/// poll(2) over `fds` for at most `timeout_ms` (negative: forever), as
/// the raw `ppoll` system call ([`ppoll_raw`]: libc's `poll` is a
/// cancellation point, whose `pthread_cancel` unwound through the library
/// and aborted the process). Returns the poll result (-1 with errno set
/// on error; `EINTR` when a signal ended it, whatever `SA_RESTART` says).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> c_int {
    let timeout = (timeout_ms >= 0).then(|| libc::timespec {
        tv_sec: libc::time_t::from(timeout_ms / 1000),
        tv_nsec: libc::c_long::from(timeout_ms % 1000) * 1_000_000,
    });
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd; no
    // mask.
    unsafe {
        ppoll_raw(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            timeout,
            std::ptr::null(),
        )
    }
}

/// What `fd` shows now for `events` (a [`poll`] that does not wait; 0 if
/// nothing, or if it cannot be asked).
pub(crate) fn ready_now(fd: c_int, events: i16) -> i16 {
    let mut p = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    if poll(&mut p, 0) > 0 {
        p[0].revents
    } else {
        0
    }
}

/// Sleeps for `d` as the raw `nanosleep` system call (`std::thread::sleep`
/// is libc's `nanosleep`, a cancellation point; see [`send_raw`]). A
/// signal ends the sleep early.
pub(crate) fn sleep(d: std::time::Duration) {
    rawsys::nanosleep(d);
}

/// Blocks every asynchronous signal of the calling thread (added to its
/// mask; the faults — SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS,
/// SIGABRT — are the thread's own and never blocked) and returns the mask
/// before, for the caller to put back. Async-signal-safe (a handler's
/// `close` may call it).
pub(crate) fn block_async_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; the sig* calls only write the sets
    // given; pthread_sigmask changes the calling thread's mask only.
    unsafe {
        let mut all: libc::sigset_t = zeroed();
        let mut old: libc::sigset_t = zeroed();
        libc::sigfillset(&mut all);
        for s in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
            libc::SIGABRT,
        ] {
            libc::sigdelset(&mut all, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

/// Runs `spawn` (which starts one of the library's own threads) with every
/// asynchronous signal blocked, so the new thread starts with them blocked
/// and keeps them so; the caller's mask is restored after. A
/// process-directed signal (SIGTERM, SIGINT, SIGALRM...) is then always
/// delivered to one of the program's threads: run on ours, the program's
/// handler would leave the program's own threads blocked in their calls,
/// never interrupted (a preloaded iperf server took seconds to exit at
/// SIGTERM, and was killed before printing its counters).
pub(crate) fn with_async_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    /// Restores the caller's mask, on return and on unwind (a panic in
    /// `spawn` left every asynchronous signal blocked; review r21-haz
    /// item 6a).
    struct Restore(libc::sigset_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the saved set; the calling thread's mask only.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
        }
    }
    // Added to the caller's: a fault signal it blocked stays blocked
    // (SIG_SETMASK unblocked it meanwhile; review r21-haz item 6b).
    let _restore = Restore(block_async_signals());
    spawn()
}

/// Starts one of the library's own threads, named `name`, with every
/// asynchronous signal blocked ([`with_async_signals_blocked`]).
pub(crate) fn spawn_library_thread(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    with_async_signals_blocked(|| std::thread::Builder::new().name(name.into()).spawn(f))
}

/// Disables the calling thread's cancellation for good: the start of the
/// library's own threads (the reactor's), which run library code all
/// their life: a `pthread_cancel` of one (a program that cancels every
/// thread it finds) would otherwise be acted on at a libc cancellation
/// point inside it, a forced unwind through frames that cannot take it
/// (the process aborts), or through its loop.
pub(crate) fn no_cancel() {
    // SAFETY: sets this thread's state; the old one is not wanted.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, std::ptr::null_mut()) };
}

unsafe extern "C" {
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

/// `PTHREAD_CANCEL_DISABLE` (glibc's pthread.h; the libc crate lacks it).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

/// Runs `f` with the calling thread's cancellation disabled, then puts
/// its state back: for a libc call that is a cancellation point and has
/// no raw system call to stand for it (`getifaddrs`: netlink `sendto` and
/// `recvmsg` inside). A cancel that comes meanwhile stays pending, acted
/// on at the thread's next cancellation point.
pub(crate) fn without_cancel<T>(f: impl FnOnce() -> T) -> T {
    let _off = CancelOff::new();
    f()
}

/// The calling thread's cancellation disabled while this lives; its state
/// put back as it drops (on return and on a panic's unwind).
pub(crate) struct CancelOff(c_int);

impl CancelOff {
    pub(crate) fn new() -> Self {
        let mut old = PTHREAD_CANCEL_DISABLE;
        // SAFETY: sets this thread's state, the old one into `old`.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        Self(old)
    }
}

impl Drop for CancelOff {
    fn drop(&mut self) {
        // SAFETY: sets this thread's state back; no cancellation point.
        unsafe { pthread_setcancelstate(self.0, std::ptr::null_mut()) };
    }
}

/// After a wait of a program's call that a signal ended (`EINTR`):
/// whether the call ends with `EINTR`, as the UDP kind's waits end for any
/// signal — not for the one the preload's `pthread_cancel` sent with a
/// cancel this thread does not act on now (its cancellation disabled):
/// that wait goes on, as over kernel UDP, where glibc's handler of it
/// restarts the call (`warpsock_xsock::cancel::after_signal`). A pending
/// cancel ends it: the entry point acts on it.
#[cold]
pub(crate) fn signal_ends_call() -> bool {
    warpsock_xsock::cancel::after_signal() != Some(false)
}

/// Waits until the kernel socket `fd` reports one of `events` (or an
/// error or hang-up), at most `timeout` (`None`: no limit), for a
/// program's blocking call on it that the library makes (a residue
/// socket's, `xsock::residue`): raw `ppoll`, never a cancellation point.
/// A signal that ended the sleep ends the wait with `EINTR` if this
/// thread has a `pthread_cancel` to act on (its entry point acts on it:
/// `warpsock_xsock::cancel`), if `timeout` is given (the kernel never
/// restarts a socket call with a timeout) or if not every handler asked
/// for a restart (`warpsock_xsock::io::restart_after_signal`); the wait
/// goes on for the signal the preload's `pthread_cancel` sent with a
/// cancel this thread does not act on now, and for handlers with
/// `SA_RESTART`. Returns the events seen, or the errno (`EAGAIN` once
/// `timeout` passed, as `SO_RCVTIMEO`).
pub(crate) fn wait_fd(
    fd: c_int,
    events: i16,
    timeout: Option<std::time::Duration>,
) -> Result<i16, c_int> {
    wait_fd_part(fd, events, timeout, timeout.is_none())
}

/// [`wait_fd`] for a part of a call's wait: `timeout` bounds this part
/// only, and `restartable` says whether the call itself has no timeout
/// (then a signal whose handlers all asked for a restart does not end it,
/// as in [`wait_fd`] without one). `EAGAIN` once `timeout` passed.
pub(crate) fn wait_fd_part(
    fd: c_int,
    events: i16,
    timeout: Option<std::time::Duration>,
    restartable: bool,
) -> Result<i16, c_int> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Err(libc::EAGAIN);
        }
        let mut p = [libc::pollfd {
            fd,
            events,
            revents: 0,
        }];
        // SAFETY: one live pollfd; no mask.
        let n = unsafe { ppoll_raw(p.as_mut_ptr(), 1, left.map(timespec), std::ptr::null()) };
        if n > 0 {
            return Ok(p[0].revents);
        }
        if n < 0 {
            let e = errno();
            if e != libc::EINTR {
                return Err(e);
            }
            match warpsock_xsock::cancel::after_signal() {
                Some(true) => return Err(libc::EINTR),
                Some(false) => {}
                None if restartable && warpsock_xsock::io::restart_after_signal() => {}
                None => return Err(libc::EINTR),
            }
        }
    }
}

/// A pause of a bounded retry with no wake-up (`fdtable`'s fork_prepare):
/// round `round` (from 0) yields the processor for the first 16 rounds,
/// then sleeps 1 µs doubling to 1,024 µs. A signal ends the sleep early.
pub(crate) fn pause(round: u32) {
    const YIELDS: u32 = 16;
    if round < YIELDS {
        // SAFETY: no arguments.
        unsafe { libc::sched_yield() };
        return;
    }
    sleep(std::time::Duration::from_micros(
        1 << (round - YIELDS).min(10),
    ));
}

/// Sleeps while `word` is `seen` (`FUTEX_WAIT`, process-private), at
/// most `bound`: returns at a [`futex_wake`], a signal, the bound, or at
/// once if `word` is no longer `seen`. The errno may change.
pub(crate) fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    seen: u32,
    bound: Option<std::time::Duration>,
) {
    let ts = bound.map(timespec);
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the futex word is a live atomic; the timeout a local or null.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            tp,
        )
    };
}

/// Wakes every thread in [`futex_wait`] on `word`.
pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: the futex word is a live atomic; no other pointer.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// `d` as a `timespec` (for the calls that take one).
pub(crate) fn timespec(d: std::time::Duration) -> libc::timespec {
    rawsys::timespec(d)
}

/// `shutdown(2)`'s `how` as the ways it shuts (read, write); `None`, with
/// errno `EINVAL`, for any other value (Linux's `inet_shutdown` checks it
/// before the socket's state).
pub(crate) fn shutdown_ways(how: c_int) -> Option<(bool, bool)> {
    match how {
        libc::SHUT_RD => Some((true, false)),
        libc::SHUT_WR => Some((false, true)),
        libc::SHUT_RDWR => Some((true, true)),
        _ => {
            set_errno(libc::EINVAL);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's mask: which of signals 1..=64 are blocked.
    fn mask() -> Vec<bool> {
        // SAFETY: sigset_t is plain data; a query of the thread's mask.
        unsafe {
            let mut cur: libc::sigset_t = zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            (1..=64).map(|s| libc::sigismember(&cur, s) == 1).collect()
        }
    }

    /// Inside, the asynchronous signals are blocked besides the caller's
    /// own blocked ones (a fault signal it blocked stays so; the others
    /// stay unblocked); after, on return and after a panic inside, the
    /// caller's mask is back exactly (review r21-haz item 6).
    #[test]
    fn the_spawn_mask_adds_to_the_callers_and_is_restored_on_unwind() {
        std::thread::spawn(|| {
            // SAFETY: sigset_t is plain data; this test thread's mask.
            unsafe {
                let mut set: libc::sigset_t = zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGABRT);
                libc::sigaddset(&mut set, libc::SIGUSR1);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            let mine = mask();
            let inside = with_async_signals_blocked(mask);
            let at = |m: &[bool], s: c_int| m[s as usize - 1];
            assert!(at(&inside, libc::SIGABRT), "the caller's SIGABRT unblocked");
            assert!(!at(&inside, libc::SIGSEGV), "a fault blocked");
            assert!(at(&inside, libc::SIGTERM) && at(&inside, libc::SIGUSR1));
            assert_eq!(mask(), mine, "not restored on return");
            let r = std::panic::catch_unwind(|| with_async_signals_blocked(|| panic!("inside")));
            assert!(r.is_err());
            assert_eq!(mask(), mine, "not restored on unwind");
        })
        .join()
        .unwrap();
    }
}
