//! The reaper's table of the engines' sockets its closes hold that still
//! send: what an `_exit` whose reaper does not answer resets itself
//! (`super::reset_sending_unanswered`). No lock: a hand-over may come from
//! a signal handler's `close`.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use libc::c_int;

use crate::shim::real;

/// Descriptors with their inodes, -1 in the free places: a table with no
/// lock (a hand-over may come from a signal handler's `close`). One met
/// when it is full is not in it (nor reset so). The inode is checked
/// before a reset: a number closed and reused since is not touched.
pub(super) struct FdTable<const N: usize> {
    fds: [AtomicI32; N],
    inos: [AtomicU64; N],
}

impl<const N: usize> FdTable<N> {
    pub(super) const fn new() -> Self {
        Self {
            fds: [const { AtomicI32::new(-1) }; N],
            inos: [const { AtomicU64::new(0) }; N],
        }
    }

    /// `fd` in the table (if a place is free).
    pub(super) fn note(&self, fd: c_int) {
        let ino = super::super::inode(fd);
        for (s, i) in self.fds.iter().zip(&self.inos) {
            if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                i.store(ino, Ordering::Release);
                return;
            }
        }
    }

    /// `fd` out of the table (before its socket closes).
    pub(super) fn forget(&self, fd: c_int) {
        for (s, i) in self.fds.iter().zip(&self.inos) {
            if s.load(Ordering::Acquire) == fd {
                i.store(0, Ordering::Release);
                if s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return;
                }
            }
        }
    }

    /// Every place freed (a forked child: the parent's sockets).
    pub(super) fn clear(&self) {
        for (s, i) in self.fds.iter().zip(&self.inos) {
            s.store(-1, Ordering::Release);
            i.store(0, Ordering::Release);
        }
    }

    /// `SO_LINGER` {1, 0} set on each socket still named by its number
    /// (the inode noted); how many.
    pub(super) fn reset(&self) -> usize {
        let zero = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let mut n = 0;
        for (s, i) in self.fds.iter().zip(&self.inos) {
            let fd = s.load(Ordering::Acquire);
            let ino = i.load(Ordering::Acquire);
            if fd >= 0 && ino != 0 && super::super::inode(fd) == ino {
                // SAFETY: a `linger` from the stack, of the declared size.
                let r = unsafe {
                    real::setsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&zero as *const libc::linger).cast(),
                        size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                n += usize::from(r == 0);
            }
        }
        n
    }
}
