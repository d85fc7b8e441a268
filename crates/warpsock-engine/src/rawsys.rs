//! Raw system calls (`libc::syscall`), never libc's cancellation-point
//! wrappers, shared by the crates above the engine (the xsock layer and
//! the preload write none of their own for these): an application thread
//! runs them inside its call of a DDP-mode socket, where glibc's wrappers
//! act on a pending `pthread_cancel` with a forced unwind from inside the
//! library's frames (the process aborted: "FATAL: exception not
//! rethrown"; issue 12, review r25-a item 12). Each returns as libc's
//! function does: the result, or -1 with the thread's `errno` set.
#![allow(unsafe_code)]

use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// `sendto`/`recvfrom` (`nr`: `SYS_sendto` or `SYS_recvfrom`) of `len`
/// bytes at `ptr` with `flags` and no address (null address, zero length:
/// both calls take that as none).
///
/// # Safety
/// `ptr` is valid for `len` bytes: readable for `sendto`, writable for
/// `recvfrom`.
pub unsafe fn socket_io(
    nr: libc::c_long,
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
) -> isize {
    debug_assert!(nr == libc::SYS_sendto || nr == libc::SYS_recvfrom);
    // Every argument as a `long`, as `syscall` reads them.
    let null = 0 as libc::c_long;
    // SAFETY: the caller vouches for `ptr`/`len`; the address is null.
    unsafe {
        libc::syscall(
            nr,
            libc::c_long::from(fd),
            ptr,
            len,
            libc::c_long::from(flags),
            null,
            null,
        ) as isize
    }
}

/// [`socket_io`] (`nr`: `SYS_sendto` or `SYS_recvfrom`) made with the
/// `syscall` instruction itself, not libc's `syscall` (its shuffle of
/// seven arguments and its store of `errno`, ~25 instructions a busy
/// poller's empty spin, and as many every small write: issue 12): the
/// result, or the error as `-errno` (the kernel's own return; `errno` is
/// not set). Not a cancellation point, as [`socket_io`]. The engine's
/// idle read (`sys::recv_dontwait_errno`) and its one-buffer write
/// (`sys::send_one`) both go through it.
///
/// # Safety
/// `ptr` is valid for `len` bytes: readable for `sendto`, writable for
/// `recvfrom`.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn socket_io_kernel(
    nr: libc::c_long,
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    flags: libc::c_int,
) -> isize {
    debug_assert!(nr == libc::SYS_sendto || nr == libc::SYS_recvfrom);
    let r: isize;
    // SAFETY: the x86-64 Linux system call convention (number and result
    // in rax, arguments in rdi, rsi, rdx, r10, r8, r9; rcx and r11
    // clobbered); the kernel reads or writes at most `len` bytes at
    // `ptr`, which the caller vouches for; the address and its length
    // are null.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => r,
            in("rdi") fd as isize,
            in("rsi") ptr,
            in("rdx") len,
            in("r10") flags as isize,
            in("r8") 0usize,
            in("r9") 0usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    r
}

/// `write(fd, buf, len)`.
///
/// # Safety
/// `buf` is readable for `len` bytes.
pub unsafe fn write(fd: RawFd, buf: *const u8, len: usize) -> isize {
    // SAFETY: the caller vouches for `buf`/`len`.
    unsafe { libc::syscall(libc::SYS_write, libc::c_long::from(fd), buf, len) as isize }
}

/// Sleeps for `d` (`nanosleep`; `std::thread::sleep` is libc's, a
/// cancellation point). A signal ends the sleep early.
pub fn nanosleep(d: Duration) {
    let ts = timespec(d);
    // SAFETY: a sleep of a local time; the remainder is not wanted.
    unsafe {
        libc::syscall(
            libc::SYS_nanosleep,
            &ts as *const libc::timespec,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
}

/// `ppoll(fds, n, timeout, mask)`: `timeout` copied (the kernel writes
/// what is left into it; `None`: no limit), `mask` the caller's (null:
/// none).
///
/// # Safety
/// `fds` is a live, writable array of `n` pollfds; `mask` null or valid.
pub unsafe fn ppoll(
    fds: *mut libc::pollfd,
    n: usize,
    timeout: Option<libc::timespec>,
    mask: *const libc::sigset_t,
) -> libc::c_int {
    let mut ts = timeout;
    let tsp = ts
        .as_mut()
        .map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
    // The kernel's sigset size (`_NSIG / 8`), as glibc passes it.
    const SIGSET: libc::size_t = 8;
    // SAFETY: the caller vouches for `fds` and `mask`; `tsp` is null or a
    // live, writable copy. (`ppoll`: arm64 has no `poll`.)
    unsafe {
        libc::syscall(libc::SYS_ppoll, fds, n as libc::c_ulong, tsp, mask, SIGSET) as libc::c_int
    }
}

/// `epoll_pwait(epfd, events, ms, no mask)`: `epoll_wait` as a raw system
/// call — libc's `epoll_wait` is a cancellation point, and arm64 has no
/// `epoll_wait` — filling `events` (its length the most); `ms` -1 waits
/// with no limit. The count, or -1 with `errno` (`EINTR` after a
/// handler).
pub fn epoll_pwait(epfd: RawFd, events: &mut [libc::epoll_event], ms: libc::c_int) -> libc::c_int {
    // SAFETY: `events` is writable for its length; no signal mask (the
    // size argument is ignored with none).
    unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait,
            libc::c_long::from(epfd),
            events.as_mut_ptr(),
            events.len().min(libc::c_int::MAX as usize) as libc::c_long,
            libc::c_long::from(ms),
            std::ptr::null::<libc::sigset_t>(),
            8usize,
        ) as libc::c_int
    }
}

/// `futex(word, FUTEX_WAIT_PRIVATE, expected, timeout)`: sleeps while
/// `word` holds `expected`, until a [`futex_wake`] of it, `timeout` or a
/// signal's handler: 0 when woken, else -1 with `errno` — `EAGAIN` (`word`
/// no longer held `expected`), `ETIMEDOUT`, or `EINTR`: a handler ran. A
/// timed wait is never restarted after a handler, `SA_RESTART` or not
/// (the kernel's `-ERESTART_RESTARTBLOCK`), where std's waits (`Condvar`,
/// `Mutex`) go back to sleep; a signal that runs no handler (ignored, a
/// stop and continue) restarts it inside the kernel. A spurious return is
/// possible (a wake meant for an earlier value): callers look again.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> libc::c_int {
    let ts = timespec(timeout);
    // SAFETY: `word` is a live, aligned 32-bit word the kernel only reads;
    // `ts` is a local time (relative: FUTEX_WAIT's timeout is).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        ) as libc::c_int
    }
}

/// `futex(word, FUTEX_WAKE_PRIVATE, n)`: wakes up to `n` threads asleep
/// in [`futex_wait`] on `word`: how many it woke, or -1 with `errno`.
pub fn futex_wake(word: &AtomicU32, n: i32) -> libc::c_int {
    // SAFETY: `word` is a live, aligned 32-bit word; only its address is
    // used.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        ) as libc::c_int
    }
}

/// `d` as a `timespec`, its seconds clamped to `time_t` (the kernel
/// saturates a timeout that long).
pub fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timespec_keeps_its_parts_and_clamps_its_seconds() {
        let t = timespec(Duration::new(3, 250));
        assert_eq!((t.tv_sec, t.tv_nsec), (3, 250));
        assert_eq!(timespec(Duration::MAX).tv_sec, libc::time_t::MAX);
    }

    fn errno() -> Option<i32> {
        std::io::Error::last_os_error().raw_os_error()
    }

    #[test]
    fn a_futex_wait_on_a_changed_word_returns_at_once_and_times_out() {
        let w = AtomicU32::new(1);
        assert_eq!(futex_wait(&w, 0, Duration::from_secs(60)), -1);
        assert_eq!(errno(), Some(libc::EAGAIN));
        assert_eq!(futex_wait(&w, 1, Duration::from_millis(1)), -1);
        assert_eq!(errno(), Some(libc::ETIMEDOUT));
        // Nobody waits: nobody woken.
        assert_eq!(futex_wake(&w, i32::MAX), 0);
    }

    /// A waiter asleep on the word (its thread seen in the `futex` call on
    /// the word's address, /proc/self/task/TID/syscall) is woken by the
    /// store and wake after it; a lost wake-up is its full 30 s and
    /// `ETIMEDOUT`.
    #[test]
    fn a_futex_wake_ends_a_wait() {
        use std::sync::atomic::{AtomicI32, Ordering};
        static W: AtomicU32 = AtomicU32::new(0);
        static TID: AtomicI32 = AtomicI32::new(0);
        let t = std::thread::spawn(|| {
            // SAFETY: gettid takes nothing.
            TID.store(unsafe { libc::gettid() }, Ordering::Release);
            let r = futex_wait(&W, 0, Duration::from_secs(30));
            (r, errno())
        });
        let asleep = format!("{} {:#x} ", libc::SYS_futex, W.as_ptr() as usize);
        loop {
            let tid = TID.load(Ordering::Acquire);
            let now = (tid != 0)
                .then(|| std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok())
                .flatten();
            if now.is_some_and(|s| s.starts_with(&asleep)) {
                break;
            }
            // The waiter returned before a look saw it asleep (its 30 s
            // passed on a starved machine, or the wait failed): fail with
            // its result rather than look for ever (review r26-b item 10).
            if t.is_finished() {
                let (r, e) = t.join().unwrap();
                panic!("the waiter returned unseen asleep: {r} {e:?}");
            }
            std::thread::yield_now();
        }
        W.store(1, Ordering::Relaxed);
        assert_eq!(futex_wake(&W, i32::MAX), 1);
        let (r, e) = t.join().unwrap();
        assert_eq!(r, 0, "{e:?}");
    }

    #[test]
    fn socket_io_moves_bytes_and_reports_errno() {
        let mut sp = [0; 2];
        // SAFETY: a new socket pair of this test's.
        let made =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sp.as_mut_ptr()) };
        assert_eq!(made, 0);
        let mut b = *b"abc";
        // SAFETY: a live local buffer of its length.
        let n = unsafe { socket_io(libc::SYS_sendto, sp[0], b.as_mut_ptr(), 3, 0) };
        assert_eq!(n, 3);
        let mut r = [0u8; 8];
        // SAFETY: as above.
        let n = unsafe { socket_io(libc::SYS_recvfrom, sp[1], r.as_mut_ptr(), 8, 0) };
        assert_eq!(&r[..n as usize], b"abc");
        // SAFETY: as above.
        let n = unsafe {
            socket_io(
                libc::SYS_recvfrom,
                sp[1],
                r.as_mut_ptr(),
                8,
                libc::MSG_DONTWAIT,
            )
        };
        assert_eq!(n, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EAGAIN)
        );
        for fd in sp {
            // SAFETY: the test's descriptors.
            unsafe { libc::close(fd) };
        }
    }
}
