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
//! So the interposed `close` (and a `dup2`/`dup3` over a number, and a
//! close deferred past a signal handler's) removes the number's
//! registrations from the sets this process made before the system call
//! when the number is managed, or names a file the library holds
//! ([`Held`]). One difference from the kernel: if the program holds
//! another number of the same file, the kernel would keep the closed
//! number's registration (it reports the closed number); here it goes.
//! Not covered: a C library stream's `fclose`, and the unmanaged numbers
//! `close_range`/`closefrom` close (below the interposer;
//! `interpose/ranges.rs` closes the managed ones in their range as
//! `close`). A plain descriptor costs
//! one atomic load while the library holds no such file, and an `fstat`
//! and a scan of [`HELD_MAX`] places while it does.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use libc::c_int;

use super::SETS;

/// The most files registered at once; beyond, a hold is not registered
/// (its number's registration lasts until the library's descriptor
/// closes, as before). Switching sockets are at most
/// `xsock::switching::SWITCHING_MAX`; demoted residue sockets last as
/// long as the calls that demoted them.
const HELD_MAX: usize = 256;

/// Inodes of the sockets held (0: a free place).
static HELD: [AtomicU64; HELD_MAX] = [const { AtomicU64::new(0) }; HELD_MAX];

/// The process that took each place of [`HELD`].
static HELD_PID: [AtomicI32; HELD_MAX] = [const { AtomicI32::new(0) }; HELD_MAX];

/// How many places of [`HELD`] are taken (the plain `close`'s check).
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// The device of the sockets' file system (every socket's: sockfs), 0
/// until a hold records it: an inode of another file system is no
/// socket of ours.
static SOCK_DEV: AtomicU64 = AtomicU64::new(0);

/// The device and inode of the file `fd` names.
fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into a zeroed local struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// The library holds a descriptor of a socket the program's numbers may
/// name without the table knowing (it is plain to the program): while
/// this lives, the program's `close` of such a number takes its epoll
/// registrations with it. Dropped before the descriptor closes.
pub(crate) struct Held {
    /// The place taken, the inode put there, and the process that took
    /// it (a forked child's copy gives back nothing: its table was
    /// cleared, [`fork_child`]).
    at: Option<(usize, u64, i32)>,
}

impl Held {
    /// Registers the socket `fd` names (nothing for a number that names
    /// none, or once [`HELD_MAX`] are held).
    pub(crate) fn new(fd: c_int) -> Self {
        let Some((dev, ino)) = file_id(fd).filter(|&(_, i)| i != 0) else {
            return Self { at: None };
        };
        SOCK_DEV.store(dev, Ordering::Release);
        for (at, h) in HELD.iter().enumerate() {
            if h.compare_exchange(0, ino, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let me = crate::shim::sys::getpid();
                HELD_PID[at].store(me, Ordering::Release);
                TAKEN.fetch_add(1, Ordering::AcqRel);
                return Self {
                    at: Some((at, ino, me)),
                };
            }
        }
        Self { at: None }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((at, ino, pid)) = self.at {
            if pid == crate::shim::sys::getpid()
                && HELD[at]
                    .compare_exchange(ino, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                TAKEN.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// In a forked child (its fork handler: no lock, no allocation): the
/// parent's holds are not the child's (its copies of the objects are
/// never used; their drops give back nothing, [`Held`]).
pub(super) fn fork_child() {
    for h in &HELD {
        h.store(0, Ordering::Relaxed);
    }
    TAKEN.store(0, Ordering::Release);
}

/// Whether the library holds any file now (one atomic load: a caller's
/// cheap look before its own work for [`before_close`]).
pub(crate) fn holds_any() -> bool {
    TAKEN.load(Ordering::Acquire) != 0
}

/// Whether the file `fd` names is one this process's library holds (a
/// child made without the fork handlers, whose table was not cleared,
/// holds none of its parent's).
fn held(fd: c_int) -> bool {
    if !holds_any() {
        return false;
    }
    let Some((dev, ino)) = file_id(fd) else {
        return false;
    };
    if dev != SOCK_DEV.load(Ordering::Acquire) {
        return false;
    }
    let Some(at) = HELD.iter().position(|h| h.load(Ordering::Acquire) == ino) else {
        return false;
    };
    HELD_PID[at].load(Ordering::Acquire) == crate::shim::sys::getpid()
}

/// Before the program's `close` of `fd` (or a `dup2` over it): if it is
/// `managed`, or names a file the library holds, its registrations leave
/// the epoll sets this process made. A set a forked child inherited is
/// its parent's too: one registration of the two, which the parent may
/// still use (the kernel's close keeps it while the parent's copy of the
/// file is open), so it is left alone; so is everything in a child made
/// without the fork handlers (`_Fork`, a raw `clone`): its managed
/// closes are the system call alone (`fdtable::borrowed`), and it holds
/// no file ([`held`]). Allocates nothing; waits for the
/// sets' lock, except over this thread's own hold of it (a signal
/// handler's `close`: the registrations stay, as before).
pub(crate) fn before_close(fd: c_int, managed: bool) {
    if !managed {
        // One of the program's epoll sets, maybe, watching connections.
        super::super::epollwatch::set_closed(fd);
    }
    if !managed && !held(fd) {
        return;
    }
    SETS.each_own(|epfd| {
        if epfd != fd {
            // SAFETY: EPOLL_CTL_DEL ignores the event argument; ENOENT
            // (not registered there) and EBADF (a set closed) are fine.
            unsafe { super::real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
    });
}

/// What the tests of closes made here and by the interposer
/// (`interpose/tests/epoll_close.rs`) set up and look at.
#[cfg(test)]
pub(crate) mod testing {
    use libc::c_int;

    use super::Held;

    /// A readable socket number of the program's (`.0`) whose file the
    /// library holds too (`.1`, its `Held`), registered for input in a
    /// set this process made (`.3`); `.2` the peer end.
    pub(crate) fn held_and_registered() -> (c_int, (c_int, Held), c_int, c_int) {
        let mut sv = [0; 2];
        // SAFETY: new descriptors of the test's; ADD with a valid event.
        unsafe {
            assert_eq!(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()),
                0
            );
            assert_eq!(libc::write(sv[1], b"x".as_ptr().cast(), 1), 1);
            let lib = libc::dup(sv[0]);
            let held = Held::new(lib);
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            crate::shim::epollcarry::created(ep);
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: sv[0] as u64,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, sv[0], &mut ev), 0);
            (sv[0], (lib, held), sv[1], ep)
        }
    }

    /// How many events `ep` reports now.
    pub(crate) fn reported(ep: c_int) -> i32 {
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `ev` is ours, 4 entries.
        unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 0) }
    }

    pub(crate) fn close_all(fds: &[c_int]) {
        for &f in fds {
            crate::shim::sys::close(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{close_all, held_and_registered, reported};
    use super::*;

    /// A close while another thread holds the sets' lock (recording a
    /// set, or another close's clean-up) waits for it, then takes the
    /// number's registration: a try that gave up would leave the closed
    /// number reported (review 37; untested until session 38). The closer
    /// is seen asleep in the lock's `futex` before the lock is let go.
    #[test]
    fn a_close_waits_for_the_sets_lock_another_thread_holds() {
        use std::sync::atomic::AtomicBool;
        use std::sync::mpsc;
        use std::time::{Duration, Instant};
        let (a, (lib, held), b, ep) = held_and_registered();
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let g = super::super::SetsHeld::take();
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(g);
        });
        locked_rx.recv().unwrap();
        static DONE: AtomicBool = AtomicBool::new(false);
        DONE.store(false, Ordering::SeqCst);
        let (tid_tx, tid_rx) = mpsc::channel();
        let closer = std::thread::spawn(move || {
            // SAFETY: no arguments.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            before_close(a, false);
            DONE.store(true, Ordering::SeqCst);
        });
        let tid = tid_rx.recv().unwrap();
        // Asleep in a futex (202 on x86_64, 98 on aarch64), or done.
        let futex = if cfg!(target_arch = "aarch64") {
            "98 "
        } else {
            "202 "
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let sc = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
                .unwrap_or_default();
            if sc.starts_with(futex) || DONE.load(Ordering::SeqCst) {
                break;
            }
            assert!(Instant::now() < end, "the closer neither slept nor ended");
            std::thread::yield_now();
        }
        assert!(
            !DONE.load(Ordering::SeqCst),
            "the close's clean-up ended while another thread held the lock"
        );
        assert_eq!(reported(ep), 1);
        release_tx.send(()).unwrap();
        closer.join().unwrap();
        holder.join().unwrap();
        assert_eq!(reported(ep), 0, "the closed number is still reported");
        drop(held);
        close_all(&[a, lib, b, ep]);
    }
}
