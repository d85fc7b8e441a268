//! The program's epoll registrations follow its descriptor across a swap.
//!
//! A managed socket changes which open file the program's descriptor number
//! names (`dup3`): at adoption the number comes to name a doorbell end
//! ([`super::doorbell`]), at demotion the kernel socket again. epoll keys a
//! registration on the pair (number, open file) and keeps watching the file
//! it was given (epoll(7), "Questions and answers" 6), so a registration the
//! program made before a swap would go on watching the old file, and the
//! program, which believes its descriptor registered, would never hear of
//! the new one. (A plain client of a preloaded redis-server in policy mode
//! hung on its second request that way: the connection was demoted to the
//! kernel socket after the pre-switch bytes were read, and redis's epoll set
//! still watched the doorbell.)
//!
//! [`dup3_carrying`] therefore finds the registrations of the number in the
//! process's epoll sets, removes them while the number still names the old
//! file, swaps, and adds them again with the same events and data. ADD
//! reports a readiness already present at once (level and edge triggered
//! alike), so nothing that arrived meanwhile is missed; a waiter may see one
//! spurious wake-up, which epoll allows.
//!
//! The epoll sets are the ones the program made through the interposed
//! `epoll_create`/`epoll_create1` ([`created`]); their registrations are read
//! from `/proc/self/fdinfo/<epfd>` (the kernel's `ep_show_fdinfo` lines
//! `tfd: <fd> events: <hex> data: <hex> pos:<n> ino:<hex> sdev:<hex>`), and
//! only those whose file has the inode the number names now are carried.
//! Limits (documented in the crate docs): an epoll set made by a raw
//! `syscall(SYS_epoll_create1)` or inherited across `exec` is not known, and
//! without `/proc` nothing is carried; a swap costs one read of each known
//! set's fdinfo, so it is linear in the registrations of those sets.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, TryLockError};

use libc::c_int;

use super::real;
use super::sys::lock;

/// The epoll sets the program made (numbers; a stale one is harmless: its
/// fdinfo then lists nothing of ours, or it is no longer there).
static SETS: Mutex<BTreeSet<c_int>> = Mutex::new(BTreeSet::new());

thread_local! {
    /// [`SETS`], held by this thread's fork from [`fork_prepare`] to the
    /// parent's or the child's handler.
    static FORK_GUARD: RefCell<Option<MutexGuard<'static, BTreeSet<c_int>>>> =
        const { RefCell::new(None) };
}

/// The atfork prepare handler's part: [`SETS`] held across the fork, so
/// that the child's copy is free and whole. The sets stay the child's (it
/// holds the same epoll instances), unlike the parent's DDP sockets, so
/// the child cannot start an empty list of its own: a thread of the
/// parent's that held the lock at the fork (inside `epoll_create`'s
/// record, or a swap's copy of the list) left the child's copy held for
/// good, and the child's first `epoll_create`, switch or demotion hung
/// (issue 12). Tried, as `fdtable::fork_prepare` (the same bound, about
/// 2 ms): a signal handler's fork over its own thread's hold would wait
/// for ever; after the bound the fork goes on holding nothing, as before.
/// The holds are a few instructions, with no lock taken inside: taken
/// after the descriptor table's (which a swap holds no more when it
/// copies the list), no order is reversed.
pub(crate) fn fork_prepare() {
    for round in 0..FORK_TRIES {
        let g = match SETS.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                #[cfg(test)]
                tests::contended();
                super::sys::pause(round);
                continue;
            }
        };
        // A fork from a thread-local destructor (this thread's slot gone):
        // the fork goes on holding nothing, as after the bound, never a
        // panic in the atfork handler, an `extern "C"` frame (review
        // r29-c item 5).
        let mut g = Some(g);
        let _ = FORK_GUARD.try_with(|f| *f.borrow_mut() = g.take());
        drop(g);
        return;
    }
}

/// [`fork_prepare`]'s tries (`fdtable`'s bound).
const FORK_TRIES: u32 = 26;

/// The atfork parent and child handlers' part: [`SETS`] let go (in the
/// child, its copy, which the forking thread, the child's, held).
pub(crate) fn fork_release() {
    // (None held if this thread's slot is gone: [`fork_prepare`].)
    let _ = FORK_GUARD.try_with(|f| drop(f.borrow_mut().take()));
}

/// Records an epoll set the program made (`epfd` < 0: a failed call).
pub(crate) fn created(epfd: c_int) {
    if epfd >= 0 {
        lock(&SETS).insert(epfd);
    }
}

/// One registration of a descriptor in an epoll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) epfd: c_int,
    pub(crate) events: u32,
    pub(crate) data: u64,
}

/// The registrations of descriptor `fd` whose file has inode `ino`, from the
/// text of epoll set `epfd`'s fdinfo. Lines that do not parse are skipped.
pub(crate) fn parse_fdinfo(text: &str, epfd: c_int, fd: c_int, ino: u64) -> Vec<Registration> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut t = line.split_whitespace();
        if t.next() != Some("tfd:") {
            continue;
        }
        let parsed = (|| {
            let tfd: c_int = t.next()?.parse().ok()?;
            (t.next()? == "events:").then_some(())?;
            let events = u32::from_str_radix(t.next()?, 16).ok()?;
            (t.next()? == "data:").then_some(())?;
            let data = u64::from_str_radix(t.next()?, 16).ok()?;
            let file_ino = t
                .find_map(|w| w.strip_prefix("ino:"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())?;
            Some((tfd, events, data, file_ino))
        })();
        if let Some((tfd, events, data, file_ino)) = parsed {
            if tfd == fd && file_ino == ino {
                out.push(Registration { epfd, events, data });
            }
        }
    }
    out
}

/// The inode of the file descriptor `fd` names, if it names one.
fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: fstat writes into a zeroed local struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// The registrations of `fd` (as the file it names now) in the known sets.
fn registrations(fd: c_int) -> Vec<Registration> {
    let sets: Vec<c_int> = lock(&SETS).iter().copied().collect();
    if sets.is_empty() {
        return Vec::new();
    }
    let Some(ino) = inode(fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for epfd in sets {
        if epfd == fd {
            continue;
        }
        // With cancellation disabled: std's `open` and `read` are libc's
        // cancellation points, and this runs inside a program's call.
        let path = format!("/proc/self/fdinfo/{epfd}");
        if let Ok(text) = super::sys::without_cancel(|| std::fs::read_to_string(path)) {
            out.extend(parse_fdinfo(&text, epfd, fd, ino));
        }
    }
    out
}

/// `dup3(target, fd, flags)`, with the epoll registrations `fd` had carried
/// over to the file it names afterwards. Returns what `dup3` returned (its
/// errno is kept); on failure the registrations are restored as they were.
pub(crate) fn dup3_carrying(target: c_int, fd: c_int, flags: c_int) -> c_int {
    let regs: Vec<Registration> = registrations(fd)
        .into_iter()
        // SAFETY: EPOLL_CTL_DEL ignores the event argument.
        .filter(|r| unsafe {
            libc::epoll_ctl(r.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) == 0
        })
        .collect();
    // SAFETY: dup3 on descriptors the caller owns (the program's number and
    // one of ours).
    let n = unsafe { real::dup3(target, fd, flags) };
    let e = super::sys::errno();
    for r in &regs {
        let mut ev = libc::epoll_event {
            events: r.events,
            u64: r.data,
        };
        // SAFETY: ADD with a valid event on the program's epoll set.
        unsafe { libc::epoll_ctl(r.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }
    if n < 0 {
        super::sys::set_errno(e);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::mpsc;

    /// review r29-c item 5: the atfork handlers' part run from a
    /// thread-local destructor after [`FORK_GUARD`]'s slot is gone (a
    /// fork made there) does not panic: a panic in an `extern "C"`
    /// handler (and in a destructor) aborts the process. In a forked
    /// child (an abort there is its status): a thread touches `LATE`,
    /// then the handlers (`FORK_GUARD`'s destructor registered after
    /// `LATE`'s: run before it), and exits; `LATE`'s destructor runs the
    /// handlers again.
    #[test]
    fn the_fork_handlers_from_a_thread_local_destructor_do_not_panic() {
        struct Late;
        impl Drop for Late {
            fn drop(&mut self) {
                fork_prepare();
                fork_release();
            }
        }
        thread_local! {
            static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
        }
        let status = crate::shim::forktest::child_within(|| {
            let t = std::thread::spawn(|| {
                LATE.with(|l| *l.borrow_mut() = Some(Late));
                fork_prepare();
                fork_release();
            });
            i32::from(t.join().is_err())
        });
        assert_eq!(
            status,
            Some(0),
            "the fork handlers run from a thread-local destructor after FORK_GUARD's \
             (-1: the child aborted: a panic in the handler; 1: the thread panicked; None: hung)"
        );
    }

    thread_local! {
        /// Run when `fork_prepare` finds [`SETS`] held (once).
        static CONTENDED: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// `fork_prepare` found [`SETS`] held: this thread's hook, if set.
    pub(super) fn contended() {
        if let Some(f) = CONTENDED.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// A fork while another thread of the process holds [`SETS`] (inside
    /// `epoll_create`'s record, or a swap's copy of the list): the fork's
    /// prepare handler waits for it, and the child's first record (its
    /// `epoll_create`; a switch's or demotion's copy likewise) takes the
    /// lock and finds the parent's sets. Before, the fork copied the lock
    /// held by a thread the child does not have: the child hung. The
    /// holder lets go once the prepare handler found the lock held (or,
    /// without the handler's part, after the fork). Fails ("hung") with
    /// `fork_prepare` taking nothing.
    #[test]
    fn a_forked_child_records_a_set_while_a_parents_thread_held_the_list() {
        let _serial = super::super::fdtable::tests::support::serial();
        created(1 << 20);
        let (say, heard) = mpsc::channel();
        let (go, gone) = mpsc::channel::<()>();
        let (done, released) = mpsc::channel();
        let holder = std::thread::spawn(move || {
            let g = lock(&SETS);
            say.send(()).expect("the test waits");
            let _ = gone.recv();
            drop(g);
            let _ = done.send(());
        });
        heard.recv().expect("the holder holds");
        let let_go = go.clone();
        CONTENDED.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                let _ = let_go.send(());
                let _ = released.recv();
            }));
        });
        // The atfork handlers' parts, around the fork.
        fork_prepare();
        let status = crate::shim::forktest::child_within(|| {
            fork_release();
            created((1 << 20) + 1);
            i32::from(!lock(&SETS).contains(&(1 << 20)))
        });
        fork_release();
        CONTENDED.with(|h| h.borrow_mut().take());
        let _ = go.send(());
        holder.join().expect("the holder");
        lock(&SETS).remove(&(1 << 20));
        assert_eq!(
            status,
            Some(0),
            "the forked child's first epoll set record (None: hung, killed: the list's lock \
             held by a thread of the parent's at the fork; 1: the parent's set not listed)"
        );
    }

    /// The format of fs/eventpoll.c `ep_show_fdinfo` (Linux 4.x–6.x).
    const FDINFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
tfd:        8 events:       19 data:                8  pos:0 ino:5a3f1 sdev:8\n\
tfd:        9 events: 80000001 data:     7f00deadbeef  pos:0 ino:5a3f2 sdev:8\n\
tfd:        8 events:        1 data:                2  pos:0 ino:77 sdev:8\n";

    #[test]
    fn only_the_descriptor_naming_that_file_is_carried() {
        assert_eq!(
            parse_fdinfo(FDINFO, 5, 8, 0x5a3f1),
            vec![Registration {
                epfd: 5,
                events: 0x19,
                data: 8
            }]
        );
        // Edge-triggered: EPOLLET is part of the events carried.
        assert_eq!(
            parse_fdinfo(FDINFO, 5, 9, 0x5a3f2),
            vec![Registration {
                epfd: 5,
                events: 0x8000_0001,
                data: 0x7f00_dead_beef
            }]
        );
        assert!(parse_fdinfo(FDINFO, 5, 10, 0x5a3f1).is_empty());
        assert!(parse_fdinfo("tfd: x events: y\n", 5, 8, 1).is_empty());
    }

    #[test]
    fn a_level_triggered_registration_follows_the_swap() {
        // SAFETY: plain descriptor calls on pipes and an epoll set of our own.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            created(ep);
            let mut a = [0; 2];
            let mut b = [0; 2];
            assert_eq!(libc::pipe(a.as_mut_ptr()), 0);
            assert_eq!(libc::pipe(b.as_mut_ptr()), 0);
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 42,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, a[0], &mut ev), 0);
            // a[0] comes to name b's read end, which has a byte waiting.
            assert_eq!(libc::write(b[1], b"x".as_ptr().cast(), 1), 1);
            assert_eq!(dup3_carrying(b[0], a[0], 0), a[0]);
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
            let n = libc::epoll_wait(ep, out.as_mut_ptr(), 4, 5000);
            assert_eq!(n, 1, "the registration did not follow the swap");
            let got = out[0];
            assert_eq!({ got.u64 }, 42);
            for fd in [ep, a[0], a[1], b[0], b[1]] {
                libc::close(fd);
            }
        }
    }
}
