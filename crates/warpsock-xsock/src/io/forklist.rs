//! A process-wide list that a child made by `fork` starts afresh
//! ([`ForkList`]): `sndbuf`'s holders, the preload's exec marks.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// A `Mutex<Vec<T>>` allocated on first use, behind a pointer so that a
/// forked child can start a list of its own ([`ForkList::forget`]): the
/// parent's lock may have been held by a thread the child does not have
/// (review r21-send #8, r22-a item 4). Each list is leaked, never freed:
/// a thread of the parent may still hold the old one's guard.
pub struct ForkList<T> {
    /// Null, or a leaked `Box` published by [`ForkList::lock`] (the only
    /// store of anything but null).
    at: AtomicPtr<Mutex<Vec<T>>>,
}

// `T: Send`: the list is shared by every thread of the process (the
// pointer alone would make any `ForkList` `Sync`); `'static`: it is leaked.
impl<T: Send + 'static> ForkList<T> {
    /// An empty list (allocated by its first [`ForkList::lock`]).
    pub const fn new() -> Self {
        Self {
            at: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The list, locked (a poisoned lock's data is taken as it is: a panic
    /// is caught at the boundary and the list stays usable).
    pub fn lock(&self) -> MutexGuard<'static, Vec<T>> {
        let mut p = self.at.load(Ordering::Acquire);
        if p.is_null() {
            let fresh = Box::into_raw(Box::new(Mutex::new(Vec::new())));
            p = match self.at.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` was never published.
                    #[allow(unsafe_code)]
                    drop(unsafe { Box::from_raw(fresh) });
                    theirs
                }
            };
        }
        // SAFETY: a published list is a leaked `Box` (`at` is private and
        // only this function stores a non-null pointer in it), never freed.
        #[allow(unsafe_code)]
        let m: &'static Mutex<Vec<T>> = unsafe { &*p };
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The list, locked, if its lock is free now, else `None` — also for
    /// a list not made yet (empty: nothing to look at), which this does
    /// not make: one try, allocating nothing (an exit that may have
    /// interrupted its own thread inside a call holding the lock, or
    /// inside `malloc`).
    pub fn try_lock(&self) -> Option<MutexGuard<'static, Vec<T>>> {
        let p = self.at.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: as `lock`: a published list is never freed.
        #[allow(unsafe_code)]
        let m: &'static Mutex<Vec<T>> = unsafe { &*p };
        match m.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// In a child made by `fork`, from its fork handler: drops the
    /// parent's list (leaked, its lock as the parent left it) so that the
    /// next [`ForkList::lock`] starts an empty one.
    pub fn forget(&self) {
        self.at.store(std::ptr::null_mut(), Ordering::Release);
    }
}

impl<T: Send + 'static> Default for ForkList<T> {
    fn default() -> Self {
        Self::new()
    }
}
