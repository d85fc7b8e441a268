//! Signal-driven I/O (fcntl(2): `O_ASYNC`, `F_SETOWN`/`F_SETOWN_EX`,
//! `F_SETSIG`) of a program's descriptor number across the library's swaps
//! of the file it names.
//!
//! All three live on the open file description, not on the number. When a
//! switch makes the number name a doorbell end instead of the TCP socket
//! (or a switching socket's outcome, or the TCP socket again after a
//! residue), the program's `SIGIO` settings stayed on the old file: the
//! doorbell, whose bells are the program's readiness, sent no signal, and
//! the TCP socket, now the engine's, kept signalling the program for the
//! engine's own traffic (credits, a Read's response) — each `SIGIO` a
//! readiness the program could not find. [`Owner::take`] reads them off
//! the number's file and turns `O_ASYNC` off there; [`Owner::give`] sets
//! them on the file the number names after the swap (the order of
//! `F_SETFL` after `F_SETOWN`, as a program sets them, so the first signal
//! has its owner).
//!
//! A file with none of them set (the common case) costs three `fcntl`s a
//! swap and nothing more.
//!
//! Not covered: another thread's `fcntl` of the number between the read
//! and the swap (a few system calls) lands on the old file, and stays
//! there (review 56).
//!
//! The readiness signalled is the doorbell's: a DDP socket rings it for
//! every arrival once `O_ASYNC` is on (`Socket::set_async`).

use libc::{c_int, pid_t};

use super::real;

/// `F_SETSIG`, `F_GETSIG`, `F_SETOWN_EX`, `F_GETOWN_EX` (asm-generic
/// fcntl.h, x86-64 and AArch64; the libc crate has them for musl only).
const F_SETSIG: c_int = 10;
const F_GETSIG: c_int = 11;
const F_SETOWN_EX: c_int = 15;
const F_GETOWN_EX: c_int = 16;

/// `struct f_owner_ex` (linux/fcntl.h): the owner's kind (thread, process,
/// process group) and id.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct OwnerEx {
    kind: c_int,
    pid: pid_t,
}

/// The signal-driven I/O settings of one file ([`Owner::take`]).
pub(crate) struct Owner {
    owner: OwnerEx,
    sig: c_int,
    on: bool,
}

impl Owner {
    /// The settings of the file `fd` names, with `O_ASYNC` turned off
    /// there (the file is about to leave the number); `None` if there are
    /// none (no owner, no signal, `O_ASYNC` off).
    pub(crate) fn take(fd: c_int) -> Option<Self> {
        let mut owner = OwnerEx::default();
        // SAFETY: fcntl queries of the caller's descriptor; F_GETOWN_EX
        // writes one `f_owner_ex` into `owner`.
        let (fl, sig) = unsafe {
            (
                real::fcntl(fd, libc::F_GETFL, 0),
                real::fcntl(fd, F_GETSIG, 0),
            )
        };
        // SAFETY: as above.
        let got = unsafe { real::fcntl(fd, F_GETOWN_EX, &mut owner as *mut OwnerEx as usize) };
        let on = fl >= 0 && fl & libc::O_ASYNC != 0;
        let owned = got == 0 && owner.pid != 0;
        let sig = sig.max(0);
        if !on && !owned && sig == 0 {
            return None;
        }
        if on {
            // SAFETY: F_SETFL of the caller's descriptor, no pointer.
            unsafe { real::fcntl(fd, libc::F_SETFL, (fl & !libc::O_ASYNC) as usize) };
        }
        Some(Self {
            owner: if owned { owner } else { OwnerEx::default() },
            sig,
            on,
        })
    }

    /// Sets these settings on the file `fd` names (the number after its
    /// swap, or the old file again if the swap failed).
    pub(crate) fn give(&self, fd: c_int) {
        // SAFETY: fcntl of the caller's descriptor; F_SETOWN_EX reads one
        // `f_owner_ex`.
        unsafe {
            if self.owner.pid != 0 {
                real::fcntl(fd, F_SETOWN_EX, &self.owner as *const OwnerEx as usize);
            }
            if self.sig != 0 {
                real::fcntl(fd, F_SETSIG, self.sig as usize);
            }
            if self.on {
                let fl = real::fcntl(fd, libc::F_GETFL, 0);
                if fl >= 0 && fl & libc::O_ASYNC == 0 {
                    real::fcntl(fd, libc::F_SETFL, (fl | libc::O_ASYNC) as usize);
                }
            }
        }
    }
}

/// Whether signal-driven I/O is on for the file `fd` names (`O_ASYNC`).
pub(crate) fn is_on(fd: c_int) -> bool {
    // SAFETY: an F_GETFL query, no pointer.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_ASYNC != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> [c_int; 2] {
        let mut sv = [-1; 2];
        // SAFETY: socketpair writes two descriptors.
        let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) };
        assert_eq!(r, 0);
        sv
    }

    #[test]
    fn a_file_without_signal_driven_io_gives_nothing() {
        let [a, b] = pair();
        assert!(Owner::take(a).is_none());
        // SAFETY: closing the pair made here.
        unsafe {
            libc::close(a);
            libc::close(b);
        }
    }

    #[test]
    fn owner_signal_and_o_async_move_to_the_other_file() {
        // The signal is this test binary's, ignored: an event on a file
        // with O_ASYNC on (a hang-up, if another test of the binary ever
        // closed a number it no longer owned and it was `d`) raised it,
        // and its default action killed every test with it (a CI run
        // ended "signal: 35" a third into the lib tests). This test looks
        // at the settings, not at a delivery.
        // SAFETY: sets the disposition of a real-time signal nothing else
        // in this binary uses (the select tests use SIGRTMIN + 3).
        unsafe { libc::signal(libc::SIGRTMIN() + 1, libc::SIG_IGN) };
        let [a, b] = pair();
        let [c, d] = pair();
        // SAFETY: fcntl on the pairs made here; F_SETOWN_EX reads one struct.
        unsafe {
            let me = OwnerEx {
                kind: 1, // F_OWNER_PID
                pid: libc::getpid(),
            };
            assert_eq!(libc::fcntl(a, F_SETOWN_EX, &me as *const OwnerEx), 0);
            assert_eq!(libc::fcntl(a, F_SETSIG, libc::SIGRTMIN() + 1), 0);
            let fl = libc::fcntl(a, libc::F_GETFL);
            assert_eq!(libc::fcntl(a, libc::F_SETFL, fl | libc::O_ASYNC), 0);
        }
        let o = Owner::take(a).expect("settings");
        assert!(!is_on(a), "O_ASYNC left on the old file");
        o.give(c);
        assert!(is_on(c));
        // SAFETY: fcntl queries; F_GETOWN_EX writes one struct.
        unsafe {
            assert_eq!(libc::fcntl(c, libc::F_GETOWN), libc::getpid());
            assert_eq!(libc::fcntl(c, F_GETSIG), libc::SIGRTMIN() + 1);
            for fd in [a, b, c, d] {
                libc::close(fd);
            }
        }
    }
}
