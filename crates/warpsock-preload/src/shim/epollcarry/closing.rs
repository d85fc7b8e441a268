//! A number the program closes leaves its epoll sets, also while the
//! library holds its file.
//!
//! epoll drops a registration when the last descriptor of its file
//! closes (epoll(7), "Questions and answers" 6), not when the number
//! registered closes. The library holds descriptors of the program's
//! files of its own for a while: a managed socket's doorbell end, the
//! number's file until the object goes (an orderly close, a switch still
//! running), and the TCP socket of a connection that became plain again
//! (a background switch's outcome, `xsock::switching`; a residue
//! delivered, `xsock::residue`) until the object that switched it goes.
//! The closed number's registration then stayed and reported that
//! number: an epoll loop serving plain clients of a preloaded server
//! under load saw thousands of events for numbers it had closed, read
//! `EBADF`, and closed the connection that had taken the number next.
//!
//! So the interposed `close` (and a `dup2`/`dup3` over a number) removes
//! the number's registrations from the known sets before the system call
//! when the number is managed, or names a file the library holds
//! ([`Held`]). One difference from the kernel: if the program holds
//! another number of the same file, the kernel would keep the closed
//! number's registration (it reports the closed number); here it goes.
//! A plain descriptor costs one atomic load while the library holds no
//! such file, and an `fstat` while it does.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use libc::c_int;

use super::{inode, SETS};

/// The most files registered at once; beyond, a hold is not registered
/// (its number's registration lasts until the library's descriptor
/// closes, as before). Switching sockets are at most
/// `xsock::switching::SWITCHING_MAX`; demoted residue sockets last as
/// long as the calls that demoted them.
const HELD_MAX: usize = 256;

/// Inodes of the sockets held (0: a free place).
static HELD: [AtomicU64; HELD_MAX] = [const { AtomicU64::new(0) }; HELD_MAX];

/// How many places of [`HELD`] are taken (the plain `close`'s check).
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// The library holds a descriptor of a socket the program's numbers may
/// name without the table knowing (it is plain to the program): while
/// this lives, the program's `close` of such a number takes its epoll
/// registrations with it. Dropped before the descriptor closes.
pub(crate) struct Held(Option<usize>);

impl Held {
    /// Registers the socket `fd` names (nothing for a number that names
    /// none, or once [`HELD_MAX`] are held).
    pub(crate) fn new(fd: c_int) -> Self {
        let Some(ino) = inode(fd).filter(|&i| i != 0) else {
            return Self(None);
        };
        for (at, h) in HELD.iter().enumerate() {
            if h.compare_exchange(0, ino, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                TAKEN.fetch_add(1, Ordering::AcqRel);
                return Self(Some(at));
            }
        }
        Self(None)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(at) = self.0 {
            HELD[at].store(0, Ordering::Release);
            TAKEN.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether the file `fd` names is one the library holds.
fn held(fd: c_int) -> bool {
    if TAKEN.load(Ordering::Acquire) == 0 {
        return false;
    }
    inode(fd).is_some_and(|ino| HELD.iter().any(|h| h.load(Ordering::Acquire) == ino))
}

/// Before the program's `close` of `fd` (or a `dup2` over it): if it is
/// `managed`, or names a file the library holds, its registrations leave
/// the known epoll sets. Allocates nothing and waits for no lock (a
/// signal handler's `close` over a thread's record of a set: that set's
/// registrations stay, as before).
pub(crate) fn before_close(fd: c_int, managed: bool) {
    if !managed && !held(fd) {
        return;
    }
    let Some(_g) = SETS.lock.try_lock() else {
        return;
    };
    // SAFETY: a published list is a `Box`'s raw pointer, freed only by a
    // record's replacement, which the lock held keeps out.
    let Some(sets) = (unsafe { SETS.list.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    for &epfd in sets {
        if epfd != fd {
            // SAFETY: EPOLL_CTL_DEL ignores the event argument; ENOENT
            // (not registered there) and EBADF (a set closed) are fine.
            unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
    }
}
