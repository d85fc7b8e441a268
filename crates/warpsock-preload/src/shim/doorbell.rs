//! Readiness for managed sockets: the doorbell pair.
//!
//! The descriptor number the program holds is one end of an AF_UNIX stream
//! socketpair ([`Doorbell::app`]). Whoever makes data available to the
//! program (the progress thread, or a receive call that read more than it
//! returns) writes a doorbell byte to the other end ([`Doorbell::ring`]); a
//! receive call that finds nothing left drains them ([`Doorbell::drain`]). So
//! poll, ppoll, select, pselect and epoll (level and edge triggered: one
//! wake-up per rung batch) work on the program's own descriptor set,
//! unchanged. The count of bytes outstanding is kept by the caller, under
//! the lock that also guards what the bells announce, so that a drain never
//! races a ring.

use std::sync::atomic::{AtomicU64, Ordering};

use libc::c_int;

use super::{real, sys};

/// Forks the process made (its atfork parent handler counts them,
/// [`forked`]): a doorbell made before one may have its library end held
/// by a child too ([`Doorbell::fail`]).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// In the parent, after a `fork`: the child holds a copy of every
/// descriptor made before it.
pub(crate) fn forked() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// Doorbell bytes outstanding at most: the descriptor is readable anyway,
/// and below this every arrival writes one, so edge-triggered waiters wake.
pub(crate) const MAX_BELLS: usize = 4096;

/// The two ends of a doorbell pair.
pub(crate) struct Doorbell {
    /// The end the program's descriptor number is made to name (our own
    /// handle on it stays open as long as the socket lives).
    pub(crate) app: c_int,
    /// The end bells are written to (non-blocking).
    tx: c_int,
    /// [`FORKS`] before the pair was made.
    forks: u64,
}

impl Doorbell {
    /// A new pair; the program's end is non-blocking if `nonblocking`.
    pub(crate) fn new(nonblocking: bool) -> Result<Self, c_int> {
        // Read before the pair is made: a fork whose count is not in it
        // came after the pair (its parent handler counts after the fork).
        let forks = FORKS.load(Ordering::Acquire);
        let mut sv = [-1; 2];
        // SAFETY: socketpair writes two descriptors into `sv`.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        } != 0
        {
            return Err(sys::errno());
        }
        sys::set_nonblocking(sv[1], true);
        sys::set_nonblocking(sv[0], nonblocking);
        Ok(Self {
            app: sv[0],
            tx: sv[1],
            forks,
        })
    }

    /// Writes one bell unless `*count` reached [`MAX_BELLS`]; counts it.
    /// Returns whether a byte was written.
    pub(crate) fn ring(&self, count: &mut usize) -> bool {
        if *count >= MAX_BELLS {
            return false;
        }
        // SAFETY: a one-byte write to our own nonblocking socket.
        let r = unsafe {
            sys::send_raw(
                self.tx,
                b"!".as_ptr(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            *count += 1;
        }
        r == 1
    }

    /// Reads every outstanding bell; `*count` becomes 0.
    pub(crate) fn drain(&self, count: &mut usize) {
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reading into a local buffer from our own socket.
            let r = unsafe { sys::recv_dontwait(self.app, buf.as_mut_ptr(), buf.len()) };
            if r <= 0 {
                break;
            }
        }
        *count = 0;
    }
}

impl Doorbell {
    /// Makes the program's end report (`on`) or not report `POLLOUT`: a
    /// socket whose sends would block fills the program end's send buffer
    /// with filler bytes (read back out here, never delivered), so its
    /// poll/select/epoll wait for writability like a full TCP socket's.
    /// Returns whether the state changed.
    pub(crate) fn set_writable(&self, on: bool) -> bool {
        let mut buf = [0u8; 4096];
        if on {
            let mut any = false;
            loop {
                // SAFETY: reading into a local buffer from our own socket.
                let r = unsafe { sys::recv_dontwait(self.tx, buf.as_mut_ptr(), buf.len()) };
                if r <= 0 {
                    return any;
                }
                any = true;
            }
        }
        let mut any = false;
        loop {
            // SAFETY: a write from a local buffer to our own socket.
            let r = unsafe {
                sys::send_raw(
                    self.app,
                    buf.as_ptr(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r <= 0 {
                return any;
            }
            any = true;
        }
    }

    /// The socket is finished both ways: the program's end reports
    /// `POLLHUP` (and `POLLIN`, `POLLRDHUP`).
    pub(crate) fn hang_up(&self) {
        // SAFETY: shutting down our own socket.
        unsafe { real::shutdown(self.tx, libc::SHUT_RDWR) };
    }

    /// The connection failed, its error pending: the program's end reports
    /// `POLLERR` beside the hang-up ([`Self::hang_up`]'s `POLLHUP`,
    /// `POLLIN`, `POLLRDHUP`, and `POLLOUT`), as Linux's `tcp_poll` shows a
    /// pending `sk_err` — in one wake-up, so an edge-triggered `epoll`
    /// gets one edge with all of it, as TCP's reset gives. The library's
    /// end is released with a byte the program's end sent it unread: AF_UNIX's
    /// `unix_release_sock` then shuts its peer both ways and sets its
    /// `sk_err` (`ECONNRESET`, never read as such: the program's
    /// `SO_ERROR` is the library's) until [`Self::clear_error`] reads it.
    /// The descriptor number stays, on a socket whose peer is gone (a ring
    /// fails, a read of it ends). No bell rings and none is drained after
    /// this (a drain's read of the program's end would take `sk_err`).
    ///
    /// A forked child may hold a copy of the library's end (the pair was
    /// made before a fork): the release would not reach the socket, and a
    /// later one, the child's exit, would set `sk_err` after the program
    /// took the error. There, the hang-up alone, as before (no `POLLERR`).
    pub(crate) fn fail(&self) {
        if FORKS.load(Ordering::Acquire) != self.forks {
            self.hang_up();
            return;
        }
        // Fails (`EAGAIN`) while a closed write gate's filler fills the
        // program end's buffer: that filler is unread too.
        // SAFETY: a one-byte write to our own nonblocking socket.
        unsafe {
            sys::send_raw(
                self.app,
                b"!".as_ptr(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        let mut sv = [-1; 2];
        // SAFETY: socketpair writes two descriptors into `sv`; dup3 over
        // our own descriptor (the number stays ours); closing our own.
        unsafe {
            if libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            ) != 0
            {
                self.hang_up();
                return;
            }
            sys::close(sv[1]);
            if real::dup3(sv[0], self.tx, libc::O_CLOEXEC) < 0 {
                self.hang_up();
            }
            sys::close(sv[0]);
        }
    }

    /// The program took the connection's error: the program's end's
    /// `POLLERR` ([`Self::fail`]) goes (`SO_ERROR` read, which clears it;
    /// the hang-up stays).
    pub(crate) fn clear_error(&self) {
        let _ = sys::get_int(self.app, libc::SOL_SOCKET, libc::SO_ERROR);
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        sys::close(self.app);
        sys::close(self.tx);
    }
}
