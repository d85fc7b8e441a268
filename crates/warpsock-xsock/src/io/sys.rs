//! The system calls the I/O side makes on the application's TCP socket
//! during a switch: urgent data, the mark, peeking; and the look at the
//! signal dispositions after a wait a signal ended
//! ([`restart_after_signal`]).
//!
//! Every call is the raw system call, never libc's cancellation-point
//! wrapper: those act on a pending `pthread_cancel` with a forced unwind
//! from inside the library's frames (see `crate::cancel`). (Elsewhere the
//! crate calls libc only for socket options — `io/sndbuf.rs`,
//! `io/handshake.rs`: `getsockopt`/`setsockopt`, no cancellation points.)
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use warpsock_engine::rawsys::socket_io;

fn check(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Sends one urgent byte (`MSG_OOB`), waiting for room in the send
/// buffer up to `deadline` (`None`: for as long as it takes). Whether it
/// was sent: `false` once the deadline passed without room. Never the
/// socket's own blocking send, which waits for room with no bound (or
/// the program's `SO_SNDTIMEO`) — a peer that reads nothing held a
/// switch's mark, and the call that asked for it, for good (helper 73).
pub(crate) fn send_urgent(fd: RawFd, b: u8, deadline: Option<Instant>) -> io::Result<bool> {
    loop {
        // SAFETY: a one-byte buffer on the stack.
        let r = unsafe {
            socket_io(
                libc::SYS_sendto,
                fd,
                (&b as *const u8).cast_mut(),
                1,
                libc::MSG_OOB | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        match check(r) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
                wait(fd, libc::POLLOUT, deadline)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The file status flags of `fd` (`F_GETFL`), as the raw system call (the
/// preload interposes libc's `fcntl`).
pub(crate) fn file_flags(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL takes no argument and writes no memory.
    let r = unsafe { libc::syscall(libc::SYS_fcntl, libc::c_long::from(fd), libc::F_GETFL) };
    check(r as isize).map(|v| v as libc::c_int)
}

/// Sets the file status flags of `fd` (`F_SETFL`), as the raw system call.
pub(crate) fn set_file_flags(fd: RawFd, fl: libc::c_int) {
    // SAFETY: F_SETFL takes an int by value and writes no memory.
    unsafe {
        libc::syscall(
            libc::SYS_fcntl,
            libc::c_long::from(fd),
            libc::F_SETFL,
            libc::c_long::from(fl),
        )
    };
}

/// Sleeps for `d` (a pause between looks), as the raw `nanosleep` system
/// call: `std::thread::sleep` is libc's `nanosleep`, a cancellation point.
/// A signal ends it early.
pub(crate) fn pause(d: Duration) {
    warpsock_engine::rawsys::nanosleep(d);
}

/// Writes `line` to standard error (`XSOCK_DEBUG`'s reports) as raw
/// `write` system calls: `eprintln!` is libc's `write`, a cancellation
/// point, and a report is made inside a program's call.
pub(crate) fn debug_line(mut line: &[u8]) {
    while !line.is_empty() {
        // SAFETY: `line` is a live, readable slice of its length.
        let r = unsafe {
            warpsock_engine::rawsys::write(libc::STDERR_FILENO, line.as_ptr(), line.len())
        };
        // `r == 0` (nothing written) ends it too: errno is not set then,
        // and a stale `EINTR` in it looped for ever (review r25-a item 11).
        match r {
            n if n > 0 => line = &line[n as usize..],
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

/// `SIOCATMARK` (asm-generic/sockios.h; the libc crate lacks it).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// Whether the read position is at the urgent mark (`SIOCATMARK`).
pub(crate) fn at_mark(fd: RawFd) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int.
    let r = unsafe { libc::ioctl(fd, SIOCATMARK, &mut v) };
    check(r as isize).map(|_| v != 0)
}

/// Whether a peek of `fd` that found `peeked` bytes (into a buffer of
/// `cap`) stopped short at the peer's urgent byte, ahead of the read
/// position: out of band, a peek of it finds it; inline
/// (`SO_OOBINLINE`), the bytes queued before the peek (`queued`,
/// [`readable`]'s count then, which goes past the mark inline) are more
/// than it found. Linux's peek stops at the urgent mark, while `poll`
/// (and `SO_RCVLOWAT`) count the bytes past it: a wait for more than the
/// peek found returns at once, every time. A warpsock initiator sends its
/// MPA Request whole, after its mark, with no urgent byte inside: a
/// prefix with one ahead is no Request (helper 73: the residue's watch
/// rang the program's doorbell for good, an event loop reading `EAGAIN`
/// at a full CPU). An urgent byte passed by the read position is
/// forgotten by the kernel (`tcp_recvmsg`), and a switch's own mark is
/// consumed: neither counts.
pub fn urgent_ahead(fd: RawFd, queued: usize, peeked: usize, cap: usize) -> bool {
    (peeked < cap && peeked < queued) || matches!(peek_oob(fd), Ok(Some(_)))
}

/// A peek at `fd`'s urgent byte out of band (`MSG_OOB`): `None` if it
/// has not arrived yet (`EAGAIN`, or a zero count).
fn peek_oob(fd: RawFd) -> io::Result<Option<u8>> {
    let mut b = 0u8;
    // SAFETY: a one-byte buffer on the stack.
    let r = unsafe {
        socket_io(
            libc::SYS_recvfrom,
            fd,
            &mut b,
            1,
            libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match check(r) {
        Ok(1) => Ok(Some(b)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bytes readable now (`FIONREAD`; the urgent byte is not counted).
pub fn readable(fd: RawFd) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut v) };
    check(r as isize).map(|_| v.max(0) as usize)
}

/// Whether this end has written nothing yet on the TCP socket `fd`: no
/// byte acknowledged (`TCP_INFO`'s `tcpi_bytes_acked`, the `u64` at byte
/// 120, Linux 4.1) and none queued (`SIOCOUTQ`). `false` if the socket
/// cannot say.
pub(crate) fn sent_nothing(fd: RawFd) -> bool {
    let mut info = [0u8; 128];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: getsockopt into a buffer on the stack, its size given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 || len < 128 {
        return false;
    }
    let mut acked = [0u8; 8];
    acked.copy_from_slice(&info[120..128]);
    let mut q: libc::c_int = -1;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut q) };
    u64::from_ne_bytes(acked) == 0 && r == 0 && q == 0
}

/// Whether the TCP socket `fd` has received its peer's FIN: `POLLRDHUP`,
/// which Linux shows as soon as the FIN arrives, bytes still queued before
/// it (`tcp_poll`: `RCV_SHUTDOWN`), or a reset (`POLLHUP`: the
/// peer cannot send either). False if the socket cannot say.
pub(crate) fn fin_received(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, timeout 0.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    // Not POLLERR: poll reports it for an error-queue entry as well, and
    // the Stream's mark stays for good (review r28-d item 2); a reset
    // shows POLLHUP.
    r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// `SIOCOUTQNSD` (linux/sockios.h; the libc crate lacks it).
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// The kernel's send queue of a TCP socket: bytes not yet acknowledged
/// (`SIOCOUTQ`), or if `unsent` not yet sent (`SIOCOUTQNSD`). 0 if the
/// socket cannot say (closed under us).
pub(crate) fn out_queue(fd: RawFd, unsent: bool) -> usize {
    let req = if unsent { SIOCOUTQNSD } else { libc::TIOCOUTQ };
    let mut v: libc::c_int = 0;
    // SAFETY: both requests write one int.
    let r = unsafe { libc::ioctl(fd, req, &mut v) };
    if r < 0 {
        0
    } else {
        v.max(0) as usize
    }
}

/// Whether urgent bytes stay in `fd`'s stream (`SO_OOBINLINE`, which an
/// accepted socket takes from its listener): the urgent byte is then the
/// stream's byte at the mark, and a `MSG_OOB` read fails with `EINVAL`
/// (`tcp_recv_urg`), as with no urgent byte at all.
pub(crate) fn urgent_inline(fd: RawFd) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt of one int into the stack, its size given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_OOBINLINE,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    r == 0 && v != 0
}

/// The urgent byte, peeked (left for the application if it is not ours).
/// `None` while it has not arrived. At the mark (the callers look first:
/// [`at_mark`]); with `SO_OOBINLINE` the byte is the stream's next one
/// ([`urgent_inline`]): a socket that had it on answered `EINVAL` here
/// with the byte there, `POLLPRI` up, and a wait for the byte spun until
/// its bound (helper 66's review).
pub(crate) fn peek_urgent(fd: RawFd) -> io::Result<Option<u8>> {
    match peek_oob(fd) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && urgent_inline(fd) => {
            let mut b = 0u8;
            match recv(fd, std::slice::from_mut(&mut b), true) {
                Ok(1) => Ok(Some(b)),
                Ok(_) => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        r => r,
    }
}

/// Consumes the urgent byte (so the socket stops reporting `POLLPRI`), at
/// the mark: with `SO_OOBINLINE` the stream's next byte
/// ([`urgent_inline`]), which the program would otherwise read as data.
pub(crate) fn take_urgent(fd: RawFd) {
    let mut b = 0u8;
    let oob = if urgent_inline(fd) { 0 } else { libc::MSG_OOB };
    // SAFETY: a one-byte buffer on the stack.
    unsafe { socket_io(libc::SYS_recvfrom, fd, &mut b, 1, oob | libc::MSG_DONTWAIT) };
}

/// Takes the urgent byte `MARK` out of a stream that holds urgent bytes
/// inline ([`urgent_inline`]): its one byte read while the read position
/// is still at the mark. Whether it was taken (and was the mark).
pub(crate) fn take_inline_mark(fd: RawFd) -> bool {
    let mut b = 0u8;
    at_mark(fd).unwrap_or(false)
        && recv(fd, std::slice::from_mut(&mut b), false).is_ok_and(|n| n == 1)
        && b == crate::switch::MARK
}

/// `recv` without blocking; `Ok(0)` is end of stream.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], peek: bool) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | if peek { libc::MSG_PEEK } else { 0 };
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let r = unsafe { socket_io(libc::SYS_recvfrom, fd, buf.as_mut_ptr(), buf.len(), flags) };
        match check(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Waits until `fd` reports one of `events` (or an error/hang-up), or
/// until `deadline`. Returns the events seen (0 on timeout).
pub(crate) fn wait(fd: RawFd, events: i16, deadline: Option<Instant>) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ts = match deadline {
        None => None,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(0);
            }
            Some(warpsock_engine::rawsys::timespec(left))
        }
    };
    // SAFETY: one pollfd on the stack; no mask.
    let r = unsafe {
        warpsock_engine::rawsys::ppoll(&mut p as *mut libc::pollfd, 1, ts, std::ptr::null())
    } as isize;
    match check(r as isize) {
        Ok(0) => Ok(0),
        Ok(_) => Ok(p.revents),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// The kernel's `struct sigaction` as `rt_sigaction` fills it in: the
/// handler and the flags first on the 64-bit ports (x86-64, arm64,
/// riscv64; a restorer and the mask follow, or the mask alone), room for
/// the longest layout.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    rest: [u64; 2],
}

/// The signals that had a handler with `SA_RESETHAND` (glibc's
/// `sysv_signal`: `SA_ONESHOT`, the same bit) and without `SA_RESTART`
/// when the dispositions were last read (bit `sig - 1`): by the first
/// switch of the process ([`note_dispositions`]), then by each
/// [`restart_after_signal`]. Only these count as "reset itself as it ran"
/// once their handler is gone: a handler the program removed on purpose
/// (`signal(sig, SIG_DFL)` after an `alarm`-bounded `connect`) made a
/// later `SA_RESTART` interruption fail with `EINTR` where TCP restarts
/// (review r22-d item 3).
static ONESHOT: AtomicU64 = AtomicU64::new(0);

/// The dispositions of every signal, bit `sig - 1`.
struct Dispositions {
    /// A handler without `SA_RESTART`.
    no_restart: u64,
    /// A handler.
    handled: u64,
    /// A handler without `SA_RESTART`, with `SA_RESETHAND`.
    oneshot: u64,
}

/// Reads the dispositions of every signal. 64 raw system calls (see
/// [`restart_after_signal`]).
fn dispositions() -> Dispositions {
    let (mut no_restart, mut handled, mut oneshot) = (0u64, 0u64, 0u64);
    for sig in (1..=64).filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP) {
        let mut old = KernelSigaction::default();
        // SAFETY: reads signal `sig`'s disposition into `old`, which has
        // room for the kernel's structure; no new one is given.
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KernelSigaction>(),
                &mut old as *mut KernelSigaction,
                SIGSET,
            )
        };
        if r == 0 && old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN {
            handled |= 1 << (sig - 1);
            if old.flags & libc::SA_RESTART as libc::c_ulong == 0 {
                no_restart |= 1 << (sig - 1);
                if old.flags & libc::SA_RESETHAND as libc::c_ulong != 0 {
                    oneshot |= 1 << (sig - 1);
                }
            }
        }
    }
    Dispositions {
        no_restart,
        handled,
        oneshot,
    }
}

/// Takes the first reading of the dispositions ([`ONESHOT`]), once per
/// process, at its first switch: a handler that the kernel resets as it
/// runs (`SA_RESETHAND`, `sysv_signal`) reads as none by the time
/// [`restart_after_signal`] looks, and is known by this earlier reading
/// (review r22-b item 3). A handler that sets `SIG_DFL` itself cannot be
/// told from one the program removed on purpose, and is not counted
/// (review r22-d item 3). 64 system calls, once.
pub(crate) fn note_dispositions() {
    static NOTED: Once = Once::new();
    NOTED.call_once(|| ONESHOT.store(dispositions().oneshot, Ordering::Relaxed));
}

/// The kernel's sigset size for `rt_sigaction` and `rt_sigprocmask`.
const SIGSET: libc::size_t = 8;

/// Whether a wait of this thread that a signal ended should go on, as
/// the kernel restarts a socket call whose signal's handler has
/// `SA_RESTART` (signal(7)) — answered without knowing which signal it
/// was (it cannot be told after the handler ran, and nothing interposes
/// `sigaction`): true only if every signal that could have ended it and
/// has a handler has `SA_RESTART`, and none that had an `SA_RESETHAND`
/// handler without it at the last reading (`ONESHOT`) has lost its
/// handler since (the kernel reset it as it ran). A stop and
/// continue (Ctrl-Z then `fg`, a debugger's or `strace`'s attach) ends the
/// sleep with no handler run and is taken as any signal: the call fails if
/// the program has a handler without `SA_RESTART` (where Linux restarts a
/// socket call with no timeout; review r22-b item 4, README). Not counted:
/// signals this thread blocks;
/// SIGKILL and SIGSTOP; the synchronous faults (SIGSEGV, SIGBUS, SIGFPE,
/// SIGILL, SIGTRAP, SIGSYS), whose handlers run on the faulting
/// instruction, not in a sleep — sanitizers and Rust's runtime install
/// them without `SA_RESTART`; and glibc's internal 32 and 33 (cancellation
/// and set*id, restarting since glibc 2.34). Raw system calls: the
/// program's own `sigaction` may be interposed by another library, and
/// the preload's calls must never re-enter an interposer. 65 system
/// calls, made only after a wait a signal ended (issue 12).
#[cold]
pub fn restart_after_signal() -> bool {
    // `KernelSigaction` is the layout of these ports; elsewhere (mips64
    // and sparc64 put the flags first, alpha differs too) the reading
    // could fail and every interrupted wait would restart: stop there
    // (review r22-b item 9).
    if cfg!(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    ))) {
        return false;
    }
    let mut mask: u64 = 0;
    // SAFETY: reads the thread's mask into a live u64 (the kernel's
    // sigset of 64 signals); no new mask is given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            std::ptr::null::<u64>(),
            &mut mask as *mut u64,
            SIGSET,
        )
    };
    if r != 0 {
        mask = 0;
    }
    let mut not_counted = mask;
    for sig in [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
        32,
        33,
    ] {
        not_counted |= 1 << (sig - 1);
    }
    let now = dispositions();
    // Had a one-shot handler without SA_RESTART, has none now: the kernel
    // reset it as it ran, maybe in this wait.
    let reset = ONESHOT.load(Ordering::Relaxed) & !now.handled;
    // The evidence this thread's answer uses is used up; a reset of a
    // signal this thread blocks is kept for the thread it may have ended
    // (a `fetch_and`, not a store of this reading: review r22-d item 3).
    // Two threads that read at once may still both count one reset.
    ONESHOT.fetch_and(!(reset & !not_counted), Ordering::Relaxed);
    ONESHOT.fetch_or(now.oneshot, Ordering::Relaxed);
    (now.no_restart | reset) & !not_counted == 0
}

#[cfg(test)]
mod tests {
    use super::restart_after_signal;

    /// Installs `SIGUSR2`'s handler with `flags` (the crate's tests use
    /// no other handler; the runtime's fault handlers are not counted).
    fn handle_usr2(flags: libc::c_int) {
        extern "C" fn h(_: libc::c_int) {}
        // SAFETY: a zeroed sigaction with a handler that does nothing.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = h as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = flags;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
    }

    /// A handler without `SA_RESTART` makes an interrupted wait stop; with
    /// it, or blocked in this thread, or back to the default, the wait
    /// goes on (issue 12).
    #[test]
    fn only_an_unblocked_handler_without_sa_restart_stops_a_wait() {
        assert!(restart_after_signal(), "no handler yet");
        handle_usr2(0);
        assert!(!restart_after_signal());
        // Blocked in this thread (a thread of its own: the mask is the
        // thread's): it cannot have interrupted the wait.
        std::thread::spawn(|| {
            // SAFETY: blocks SIGUSR2 in this thread only.
            unsafe {
                let mut m: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut m);
                libc::sigaddset(&mut m, libc::SIGUSR2);
                libc::pthread_sigmask(libc::SIG_BLOCK, &m, std::ptr::null_mut());
            }
            assert!(restart_after_signal());
        })
        .join()
        .unwrap();
        handle_usr2(libc::SA_RESTART);
        assert!(restart_after_signal());
        // SAFETY: the default disposition again.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
        assert!(restart_after_signal());
    }
}
