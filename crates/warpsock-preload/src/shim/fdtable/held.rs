//! Calls made over the calling thread's own hold of the table's lock: a
//! signal handler that interrupted the thread while it held [`super::MAP`]
//! (inside `close`, `dup2`, a look-up of `setsockopt`, `sendto` or
//! `poll`, a switch) or was about to try it, or another library's atfork
//! handler inside `fork_prepare`'s hold. Taking the lock again there
//! would deadlock the thread on itself (review r19-lead-haz note 5), so
//! such a call never waits for it. A thread that waits for the lock (its
//! try failed) blocks the asynchronous signals meanwhile: a handler runs
//! over its hold once it has the lock, never over the wait, where
//! `fork_prepare` would have taken nothing and left the child the lock
//! held by a thread it does not have (review r20-xhaz3 item 1). Over a
//! hold:
//!
//! - A look-up takes the lock only if it is free for the asking
//!   (`try_read`). Otherwise a descriptor below [`super::BITS`] is looked
//!   up with no lock, under a hazard slot borrowed for the moment (any
//!   slot no thread owns, [`super::hazard::borrow`]): the call gets the
//!   right socket. With no slot free, or for a higher descriptor, it gets
//!   [`refused`]: a socket every call of which fails with `EDEADLK`; so
//!   do, before they change the program's descriptor, `fcntl(F_SETFL)`,
//!   `ioctl(FIONBIO)` and the names on it ([`is_refused`]).
//! - A change of the table (`close`, the `dup` family, a switch or an
//!   adoption) is made only if the write lock is free for the asking;
//!   otherwise it fails with `EDEADLK` and changes nothing (`close`
//!   leaves the descriptor open; the `dup` calls check before they
//!   duplicate). A program that closes a socket from a signal handler
//!   expects the close to be done or to fail, never to hang; a close that
//!   failed can be retried once the handler has returned.
//! - Listing the table (`exec`'s demotion, a residue socket's) sees
//!   nothing unless the lock is free for the asking (over a read hold);
//!   `fork_prepare` holds nothing unless the write lock is free for the
//!   asking (a handler before the try): the child's lock is as the
//!   parent's threads left it. Its own thread's interrupted hold ends in
//!   the child too (the handler returns there); a read hold of another
//!   thread's at the fork (the interrupted hold a read one too) never
//!   ends there, and the child's first change of the table waits for it
//!   for good; so does the child of a fork from a handler over the few
//!   instructions between the count's raise and the try, the lock held
//!   by another thread then.
//! - No kind acts on a candidate (`interpose::acting_kind`): no adoption
//!   at `connect`/`sendto`, no hook at `bind`/`accept`, and a switch
//!   (`setsockopt` at the kinds' level) fails with `EDEADLK` — each would
//!   have its side effects (a handshake on the wire, a registration)
//!   before the table refused the new socket. The call stays a plain one
//!   on the kernel socket.
//!
//! Only the table's lock is covered: a handler over its thread's hold of
//! another of the library's locks (a kind's socket state, the adoption
//! lock) can still deadlock there. Known gaps (review r20-xhaz2b): a
//! refused `close` leaves the descriptor open (programs do not retry
//! `close`); a fork or exec from such a handler demotes nothing; a
//! `siglongjmp` out of a handler over the instructions before the try
//! leaves the count raised (the thread's calls are then refused changes
//! for good). Signals the wait blocks: all but the faults
//! (`sys::with_async_signals_blocked`); a handler of `SIGABRT` or
//! `SIGTRAP` sent by another process over a wait is refused as over a
//! hold.
//!
//! A data call on a managed descriptor in a handler that interrupted no
//! such hold (the common case: a handler over a blocked `recv`) is not
//! affected: its look-up takes its thread's slot, or the lock.

use std::sync::{Arc, OnceLock};

use libc::{c_int, c_ulong, c_void, msghdr, sockaddr, socklen_t};

use super::super::socket::Socket;
use super::super::sys::set_errno;
use super::{hazard, low_index, LOW};

/// Whether the calling thread holds the table's lock, or is about to try
/// it (it is a handler over such code, or that code itself).
#[inline]
pub(crate) fn over_hold() -> bool {
    super::super::guard::map_held().get() & !super::RECLAIM_DEFERRED != 0
}

/// The object of managed descriptor `fd` for a look-up over its thread's
/// hold (module docs): by a borrowed slot, or [`refused`].
#[cold]
pub(super) fn get(fd: c_int) -> Option<Arc<dyn Socket>> {
    if let Some(i) = low_index(fd) {
        if let Some(h) = hazard::borrow() {
            let p = hazard::protect(h, &LOW[i]);
            // SAFETY: published in the borrowed slot and still in the
            // table after that (as `with_marked`'s fast path).
            let s = (!p.is_null()).then(|| unsafe { (*p).entry.clone() });
            hazard::give_back(h);
            return s;
        }
    }
    refused()
}

/// The socket whose every call fails with `EDEADLK` (made when the library
/// is loaded: a handler must not allocate).
static REFUSED: OnceLock<Arc<dyn Socket>> = OnceLock::new();

/// Makes [`REFUSED`].
pub(super) fn prepare() {
    REFUSED.get_or_init(|| Arc::new(Refused));
}

/// [`REFUSED`], if made.
pub(super) fn refused() -> Option<Arc<dyn Socket>> {
    REFUSED.get().cloned()
}

/// Whether `s` is [`REFUSED`]: a call whose effect is outside the socket
/// (the program's descriptor's flags: `fcntl(F_SETFL)`, `FIONBIO`) fails
/// before it is made rather than succeed half (review r20-xhaz2b item 4).
pub(crate) fn is_refused(s: &Arc<dyn Socket>) -> bool {
    REFUSED.get().is_some_and(|r| Arc::ptr_eq(r, s))
}

/// See [`REFUSED`].
struct Refused;

/// Fails the call: `EDEADLK`, -1.
fn deadlock() -> c_int {
    set_errno(libc::EDEADLK);
    -1
}

impl Socket for Refused {
    fn kernel_fd(&self) -> c_int {
        -1
    }
    fn add_ref(&self) {}
    fn release(&self) {}
    fn nonblocking(&self) -> bool {
        false
    }
    fn set_nonblocking(&self, _: bool) {}
    unsafe fn recvmsg(&self, _: &mut msghdr, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn sendmsg(&self, _: &msghdr, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn recv_one(&self, _: *mut c_void, _: usize, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn send_one(&self, _: *const c_void, _: usize, _: c_int) -> isize {
        deadlock() as isize
    }
    fn connect(&self, _: *const sockaddr, _: socklen_t) -> c_int {
        deadlock()
    }
    fn bind(&self, _: *const sockaddr, _: socklen_t) -> c_int {
        deadlock()
    }
    fn setsockopt(&self, _: c_int, _: c_int, _: *const c_void, _: socklen_t) -> c_int {
        deadlock()
    }
    fn shutdown(&self, _: c_int) -> c_int {
        deadlock()
    }
    fn ioctl(&self, _: c_ulong, _: usize) -> c_int {
        deadlock()
    }
    fn getsockopt(&self, _: c_int, _: c_int, _: *mut c_void, _: *mut socklen_t) -> c_int {
        deadlock()
    }
}
