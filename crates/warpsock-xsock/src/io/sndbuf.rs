//! The process's view of the send buffers (`rio::buffer`): how many bytes
//! wait in them, and which connections hold some. Over TCP the kernel
//! sends a socket buffer after `close` and after the process; here the
//! bytes leave only while someone drives the socket, so a close or an
//! exit that gives up on them must not end the stream cleanly: the peer
//! would read a short stream and then a normal end. Such a connection is
//! reset instead (the peer gets `ECONNRESET`, as a TCP reader whose
//! peer's data was lost does; review r20-xbuf S2).
//!
//! The counts are the buffering process's: a child made by `fork` sees
//! none of its parent's (it neither waits for them at its exit nor
//! resets its parent's connections); its own buffered bytes are not
//! counted either (stated limit).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Bytes in the send buffers of the process's sockets.
static BUFFERED: AtomicUsize = AtomicUsize::new(0);
/// The engine sockets of the connections with bytes buffered.
static HOLDERS: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());
/// The process that buffered (0: none yet).
static OWNER: AtomicI32 = AtomicI32::new(0);

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::getpid()
    }
}

fn ours() -> bool {
    OWNER.load(Ordering::Acquire) == pid()
}

/// `n` bytes entered the send buffer of the connection on `fd`; `holder`
/// is its registration (set here when the buffer was empty).
pub(crate) fn add(holder: &mut Option<RawFd>, fd: RawFd, n: usize) {
    let _ = OWNER.compare_exchange(0, pid(), Ordering::AcqRel, Ordering::Acquire);
    BUFFERED.fetch_add(n, Ordering::AcqRel);
    if holder.is_none() {
        *holder = Some(fd);
        HOLDERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fd);
    }
}

/// `n` bytes left a send buffer (posted, dropped with the connection or
/// the socket); `empty`: none is left in it.
pub(crate) fn sub(holder: &mut Option<RawFd>, n: usize, empty: bool) {
    BUFFERED.fetch_sub(n, Ordering::AcqRel);
    if let Some(fd) = holder.filter(|_| empty) {
        *holder = None;
        let mut h = HOLDERS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = h.iter().position(|&f| f == fd) {
            h.swap_remove(i);
        }
    }
}

/// Bytes that send calls of this process left in the send buffers of its
/// sockets, not yet sent: a program that exits without closing waits for
/// them, up to a bound (the preload's exit), then
/// [`reset_buffered`].
pub fn buffered_bytes() -> usize {
    if ours() {
        BUFFERED.load(Ordering::Acquire)
    } else {
        0
    }
}

/// Resets every connection of this process that still holds buffered
/// bytes (at exit, once the wait for them ended): the peer gets
/// `ECONNRESET`, not a clean end after a short stream. Returns how many.
pub fn reset_buffered() -> usize {
    if !ours() {
        return 0;
    }
    let h = HOLDERS.lock().unwrap_or_else(PoisonError::into_inner);
    for &fd in h.iter() {
        reset(fd);
    }
    h.len()
}

/// Resets the TCP connection on `fd` at once (an RST; the descriptor stays
/// valid): `SO_LINGER` 0, then `connect` to `AF_UNSPEC`, which
/// disconnects a TCP socket (Linux `tcp_disconnect`, an active reset from
/// an established state).
pub(crate) fn reset(fd: RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: plain system calls on a socket descriptor, reading a
    // `linger` and a `sockaddr` from the stack.
    #[allow(unsafe_code)]
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        );
        let mut a: libc::sockaddr = std::mem::zeroed();
        a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(fd, &a, size_of::<libc::sockaddr>() as libc::socklen_t);
    }
}
