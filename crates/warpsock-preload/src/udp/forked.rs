//! Tests: a forked child's first `select`/`epoll_wait` and its parent's
//! UDP lists (UDP kind, issue 12): the parked connections
//! (`park::release_all`) and the sockets holding datagrams
//! (`recv::held::announce`), both through `Kind::before_wait`.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::{park, recv};
use crate::shim::forktest::within;
use crate::shim::reactor;

/// Which of the UDP kind's lists a thread of the parent holds locked at
/// the fork.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// `park::LIST`, a connection parked (`park::PARKED` above 0).
    Parked,
    /// `recv::held::LIST`, a socket listed (`recv::held::ANY`).
    Holding,
}

/// A thread of the parent holds `held` (the list not empty to the wait's
/// first look) while the process forks; the child runs the fork handlers'
/// work on the engine and the UDP kind, starts an engine of its own (its
/// first offload or switch would), then the UDP kind's part of its first
/// `select` (`Kind::before_wait`). Returns the child's status (`None`:
/// hung, killed after `HUNG`).
fn first_wait_in_a_child(held: Held) -> Option<i32> {
    let _serial = crate::shim::fdtable::tests::support::serial();
    let (took, taken) = mpsc::channel();
    let (go, free) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let g = match held {
            Held::Parked => (Some(park::LIST.lock()), None),
            Held::Holding => (None, Some(recv::held::LIST.lock())),
        };
        took.send(()).expect("the test waits");
        let _ = free.recv();
        drop(g);
    });
    taken.recv().expect("the holder's lock");
    match held {
        Held::Parked => park::PARKED.fetch_add(1, Ordering::Relaxed),
        Held::Holding => usize::from(recv::held::ANY.swap(true, Ordering::AcqRel)),
    };
    // SAFETY: the child runs the fork handlers' work and the wait's, then
    // `_exit`s, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        crate::kinds_after_fork_child();
        let own = reactor::get().is_some();
        park::release_all();
        recv::announce_held();
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(if own { 0 } else { 3 }) };
    }
    go.send(()).expect("the holder waits");
    holder.join().expect("the holder");
    if let Held::Parked = held {
        park::PARKED.fetch_sub(1, Ordering::Relaxed);
    }
    within(pid)
}

/// A thread of the parent held the list of parked connections at the
/// fork: the child's first `select` must not wait for it.
#[test]
fn a_forked_childs_first_select_never_locks_the_parents_parked_list() {
    let status = first_wait_in_a_child(Held::Parked);
    assert_eq!(
        status,
        Some(0),
        "the forked child's first select with an engine of its own (None: hung, killed: the \
         parent's thread held the UDP kind's list of parked connections at the fork; 3: no \
         engine)"
    );
}

/// A thread of the parent held the list of sockets holding datagrams at
/// the fork: the child's first `select` must not wait for it.
#[test]
fn a_forked_childs_first_select_never_locks_the_parents_holding_list() {
    let status = first_wait_in_a_child(Held::Holding);
    assert_eq!(
        status,
        Some(0),
        "the forked child's first select with an engine of its own (None: hung, killed: the \
         parent's thread held the UDP kind's list of sockets holding datagrams at the fork; 3: \
         no engine)"
    );
}

/// review r29-c item 5: an unpark in a forked child of a connection the
/// parent parked (its mark copied, the child's count at 0 after its fork
/// handler) leaves the count at 0: it wrapped to `usize::MAX`, and every
/// wait of the child's walked the list for good. In a forked child,
/// bounded by `forktest::child_within`.
#[test]
fn an_unpark_in_a_forked_child_never_takes_its_count_below_zero() {
    let _serial = crate::shim::fdtable::tests::support::serial();
    let status = crate::shim::forktest::child_within(|| {
        park::forget_after_fork();
        let mut mark = Some(std::time::Instant::now());
        park::clear(&mut mark);
        i32::from(park::PARKED.load(Ordering::Relaxed) != 0 || mark.is_some())
    });
    assert_eq!(
        status,
        Some(0),
        "the forked child's unpark of a connection its parent parked took its count of \
         parked connections below 0 (1; -1: the child died; None: hung)"
    );
}
