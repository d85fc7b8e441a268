//! Calls over the calling thread's own hold of the table's lock (a signal
//! handler that interrupted `close`, `dup2` or a locked look-up; staged
//! here by the thread holding the lock itself): they never wait for it
//! (`held`'s module docs; review r19-lead-haz note 5). Each would deadlock
//! the thread on itself without it (`within_a_minute` then ends the run).

use super::super::hazard;
use super::holds::within_a_minute;
use super::look_ups::serial;
use super::*;
use crate::shim::sys::{errno, set_errno};

/// The errno a call left, cleared first.
fn errno_of<T>(f: impl FnOnce() -> T) -> (T, c_int) {
    set_errno(0);
    let r = f();
    (r, errno())
}

/// Whether the slot borrowed first (the last) is free.
fn last_slot_free() -> bool {
    !hazard::tests::state(&hazard::HAZARDS[hazard::SLOTS - 1]).2
}

/// Over the thread's write hold (a handler over `close`'s removal): a
/// look-up of a low descriptor finds its socket with no lock, by the
/// thread's slot or, the slot in use (a call inside a call), a borrowed
/// one, given back after; a high descriptor's gets the socket that
/// refuses (`EDEADLK`); changes and the listing are refused; after the
/// hold all is as it was.
#[test]
fn look_ups_over_the_threads_write_hold_take_no_lock() {
    let _serial = serial();
    prepare();
    let (low, high) = (60_071, BITS as c_int + 71);
    let (a, b) = (dummy(), dummy());
    assert!(insert(low, a.clone()).unwrap().is_none());
    assert!(insert(high, b.clone()).unwrap().is_none());
    assert!(last_slot_free());
    let (a2, b2) = (a.clone(), b.clone());
    let r = within_a_minute("a look-up over its thread's write hold", move || {
        let (a, _b) = (a2, b2);
        let held = write_map().expect("not over a hold");
        let by_get = get(low).is_some_and(|s| Arc::ptr_eq(&s, &a));
        // The thread's slot in use: the nested look-up borrows one (for
        // the moment of an `Arc`'s clone).
        let nested = with_marked(
            low,
            || false,
            |_| with_marked(low, || false, |s| Arc::ptr_eq(s, &a)),
        );
        let given_back = last_slot_free();
        let high_refused = errno_of(|| {
            // SAFETY: an empty send to the refusing socket.
            get(high).map(|s| unsafe { s.send_one(std::ptr::null(), 0, 0) })
        });
        let changes = (remove(low).err(), insert(low, dummy()).err(), all().len());
        drop(held);
        (by_get, nested, given_back, high_refused, changes)
    });
    let (by_get, nested, given_back, high_refused, changes) = r;
    assert!(by_get, "get: not the socket");
    assert!(nested, "a nested look-up: not the socket");
    assert!(given_back, "the borrowed slot was kept");
    assert_eq!(high_refused, (Some(-1), libc::EDEADLK), "a high descriptor");
    assert_eq!(
        changes,
        (Some(libc::EDEADLK), Some(libc::EDEADLK), 0),
        "changes or the listing over the hold"
    );
    assert!(same(&get(low), &a) && same(&get(high), &b), "changed");
    assert!(same(&remove(low).unwrap(), &a));
    assert!(same(&remove(high).unwrap(), &b));
}

/// Over the thread's read hold (a handler over `setsockopt`'s look-up),
/// with no writer queued, a look-up takes the read lock too (free for the
/// asking): a high descriptor's socket is found (review r20-xhaz2b 6a:
/// retried past another test's queued writer).
#[test]
fn a_look_up_over_the_threads_read_hold_reads_too() {
    let _serial = serial();
    prepare();
    let high = BITS as c_int + 73;
    let b = dummy();
    assert!(insert(high, b.clone()).unwrap().is_none());
    // A writer of another test's queued meanwhile makes the read refused
    // (std's lock takes no new reader then): a few tries, one must read.
    let found = within_a_minute("a look-up over its thread's read hold", move || {
        (0..20).any(|_| {
            let held = read_map().expect("not over a hold");
            let found = get(high).is_some_and(|s| Arc::ptr_eq(&s, &b));
            drop(held);
            found
        })
    });
    assert!(found);
    assert!(remove(high).unwrap().is_some());
}
