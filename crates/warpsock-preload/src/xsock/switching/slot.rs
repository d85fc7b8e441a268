//! The bound on switches under way ([`SWITCHING_MAX`]), and the ids a
//! `fork` waits for ([`settle_before_fork`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::SWITCHING_MAX;
use crate::shim::sys;

/// Switches under way (threads running).
static UNDER_WAY: AtomicUsize = AtomicUsize::new(0);

/// One place of [`RUNNING`] (and one of [`UNDER_WAY`]), given back when
/// dropped.
pub(super) struct Slot {
    pub(super) at: usize,
    pub(super) id: u64,
}

impl Slot {
    pub(super) fn take() -> Option<Self> {
        if UNDER_WAY.fetch_add(1, Ordering::AcqRel) >= SWITCHING_MAX {
            UNDER_WAY.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // A place is free: `UNDER_WAY` counts the places taken.
        let id = IDS.fetch_add(1, Ordering::Relaxed) + 1;
        loop {
            for (at, r) in RUNNING.iter().enumerate() {
                if r.compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Some(Self { at, id });
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        RUNNING[self.at].store(0, Ordering::Release);
        UNDER_WAY.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a switch can start now (a slot is free).
#[cfg(test)]
pub(super) fn room() -> bool {
    UNDER_WAY.load(Ordering::Acquire) < SWITCHING_MAX
}

/// Whether any switch is under way (a `select` then looks for numbers still
/// switching: `interpose::wait::select`).
/// None is: no switch thread holds a switching socket any more.
pub(in crate::xsock) fn under_way() -> bool {
    UNDER_WAY.load(Ordering::Acquire) > 0
}

/// In a forked child: the parent's switching threads are not its own.
pub(in crate::xsock) fn forget_after_fork() {
    UNDER_WAY.store(0, Ordering::Release);
    for r in &RUNNING {
        r.store(0, Ordering::Release);
    }
    LAST.with(|l| l.set(0));
}

/// Before a `fork` (the atfork prepare handler, before any lock of the
/// library is taken for the copy): the switches under way end first,
/// within their own deadlines, so that the child's copy of each such
/// connection is what it became — a plain one works in the child (a
/// forking server's child serves a client without warpsock), a DDP
/// socket's copy is refused as always — rather than a dead end. A
/// forking server pays the wait its `accept` paid before the switches
/// moved here; threaded and event-loop servers pay nothing. No lock is
/// taken (a polled count, yields and short sleeps): a handler's fork over
/// a thread that holds a lock a switch needs waits out the bound.
pub(in crate::xsock) fn settle_before_fork(bound: std::time::Duration) {
    // Only the connection this thread accepted last: a forking server
    // forks for it, and one connection a hostile peer holds in its switch
    // holds up no fork but its own accepter's (redis's BGSAVE is made by
    // the thread that accepts: it waits at most for its last client).
    // Async-signal-safe (a handler's fork): a thread-local id with no
    // destructor, and atomics.
    let id = LAST.with(std::cell::Cell::get);
    if id == 0 {
        return;
    }
    // Declined if its client's Request is still to be answered: the
    // switch then ends at once with the connection plain (the client falls
    // back at once), which the child can serve — a DDP socket's copy it
    // could not (socat's and inetd-style children read an empty stream
    // from preloaded clients; session 38). A switch past that point ends
    // as it would, and its DDP socket's copy is refused in the child.
    for (at, r) in RUNNING.iter().enumerate() {
        if r.load(Ordering::Acquire) == id {
            DECLINED[at].store(id, Ordering::Release);
        }
    }
    let deadline = std::time::Instant::now() + bound;
    let mut round = 0;
    while RUNNING.iter().any(|r| r.load(Ordering::Acquire) == id)
        && std::time::Instant::now() < deadline
    {
        sys::pause(round);
        round = round.saturating_add(1);
    }
}

thread_local! {
    /// The id of the switch of the connection this thread accepted last
    /// (0: none; [`settle_before_fork`]).
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The ids of the switches under way, one place each (0: free).
static RUNNING: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// The switch ids a fork declined ([`settle_before_fork`]), at their
/// places in [`RUNNING`] (ids are never reused: a stale one declines
/// nothing).
static DECLINED: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// Whether a fork declined switch `id` at place `at`.
pub(super) fn declined(at: usize, id: u64) -> bool {
    DECLINED[at].load(Ordering::Acquire) == id
}

/// The last switch id given.
static IDS: AtomicU64 = AtomicU64::new(0);

/// Notes the switch of the connection this thread accepted last (`id`;
/// 0: it stays plain), which its `fork` waits for.
pub(super) fn accepted_last(id: u64) {
    LAST.with(|l| l.set(id));
}
