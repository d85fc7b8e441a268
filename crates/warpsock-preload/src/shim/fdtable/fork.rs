//! The table's lock across `fork` (the library's atfork handlers).

use std::sync::RwLockWriteGuard;

#[cfg(test)]
use super::hooks;
use super::{hazard, held, write_map, Held, Map};

thread_local! {
    pub(super) static FORK_GUARD: std::cell::RefCell<Option<Held<RwLockWriteGuard<'static, Map>>>> =
        const { std::cell::RefCell::new(None) };
}

/// pthread_atfork "prepare": hold the map lock across fork so the child gets
/// a consistent copy (not over the thread's own hold: [`held`]; over a
/// wait of its thread's, it waits too: [`super::wait`]).
///
/// Refused (a handler over its thread's count), it tries again for about
/// 2 ms ([`FORK_TRIES`]) before it forks holding nothing: the count may
/// be no hold of its thread's but the instructions before a try or after
/// an unlock (a contended unlock's wake-up syscall, where a pending
/// signal is handled), with the lock another thread's then, which lets
/// it go soon — taken, the child gets it free, where it got it held by a
/// thread it does not have (review r21-haz item 3). Over a real hold of
/// its thread's the fork waits that bound.
pub(crate) fn fork_prepare() {
    for round in 0..FORK_TRIES {
        if let Ok(g) = write_map() {
            FORK_GUARD.with(|f| *f.borrow_mut() = Some(g));
            return;
        }
        #[cfg(test)]
        hooks::before_fork_retry();
        super::super::sys::pause(round);
    }
}

/// [`fork_prepare`]'s tries over its thread's count: 16 yields, then
/// sleeps of 1 µs doubling to 512 µs (`sys::pause`; about 2 ms in all).
const FORK_TRIES: u32 = 26;

/// pthread_atfork "parent": release the lock taken in prepare.
pub(crate) fn fork_release() {
    FORK_GUARD.with(|f| drop(f.borrow_mut().take()));
}

/// pthread_atfork "child": as [`fork_release`], and the retired entries
/// are forgotten, not freed by the child's first removal: an entry's drop
/// may be a socket's last reference, whose state a thread that did not
/// follow the fork may hold locked (the policy of `demote_all`). The
/// hazard slots of those threads are given back (cleared). So are the
/// objects of the closes the thread left to a hold's end (forgotten, not
/// released; [`held::closes_forget`]).
pub(crate) fn fork_release_child() {
    // The parent's entries are forgotten next (`demote_all`): the table is
    // the child's, none of its own yet ([`super::borrowed`]).
    super::owner::OWNER.store(0, std::sync::atomic::Ordering::Release);
    super::owner::BORROWER.store(0, std::sync::atomic::Ordering::Release);
    held::closes_forget();
    // The parent's other waiters are not in the child: its thread's own
    // waits only (before the hold's end below looks).
    super::wait::child_waiters();
    FORK_GUARD.with(|f| {
        if let Some(mut g) = f.borrow_mut().take() {
            g.retired.forget();
            hazard::release_lost();
        }
    });
}
