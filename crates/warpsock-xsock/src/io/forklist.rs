//! A process-wide lock that a child made by `fork` starts afresh
//! ([`ForkLock`], and [`ForkList`], one holding a list): `sndbuf`'s
//! holders, the preload's exec marks, its table of DDP sockets, the
//! UDP kind's lists, and (a `ForkLock<()>` guarding a list kept outside
//! it, published whole) the preload's list of epoll sets and of its stdio
//! streams.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// A `Mutex<T>` allocated on first use, behind a pointer so that a
/// forked child can start one of its own ([`ForkLock::forget`]): the
/// parent's lock may have been held by a thread the child does not have,
/// and a lock of the copy would block for good (review r21-send #8, r22-a
/// item 4; issue 12). Each value is leaked, never freed: a thread of the
/// parent may still hold the old one's guard, and its contents are the
/// parent's objects, which the child must not drop. A vforked child runs
/// no fork handler: it shares the parent's memory, and its lock.
pub struct ForkLock<T> {
    /// Null, or a leaked `Box` published by [`ForkLock::lock`] (the only
    /// store of anything but null).
    at: AtomicPtr<Mutex<T>>,
}

/// A [`ForkLock`] of a list.
pub type ForkList<T> = ForkLock<Vec<T>>;

// `T: Send`: the value is shared by every thread of the process (the
// pointer alone would make any `ForkLock` `Sync`); `'static`: it is leaked.
impl<T: Default + Send + 'static> ForkLock<T> {
    /// The default value (allocated by the first [`ForkLock::lock`]).
    pub const fn new() -> Self {
        Self {
            at: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The value, locked (a poisoned lock's value is taken as it is: a
    /// panic is caught at the boundary and the value stays usable).
    pub fn lock(&self) -> MutexGuard<'static, T> {
        let mut p = self.at.load(Ordering::Acquire);
        if p.is_null() {
            let fresh = Box::into_raw(Box::new(Mutex::new(T::default())));
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
        // SAFETY: a published value is a leaked `Box` (`at` is private and
        // only this function stores a non-null pointer in it), never freed.
        #[allow(unsafe_code)]
        let m: &'static Mutex<T> = unsafe { &*p };
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, locked, if its lock is free now, else `None` — also for
    /// a value not made yet (the default: nothing to look at), which this
    /// does not make: one try, allocating nothing (an exit that may have
    /// interrupted its own thread inside a call holding the lock, or
    /// inside `malloc`).
    pub fn try_lock(&self) -> Option<MutexGuard<'static, T>> {
        let p = self.at.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: as `lock`: a published value is never freed.
        #[allow(unsafe_code)]
        let m: &'static Mutex<T> = unsafe { &*p };
        match m.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// In a child made by `fork`, from its fork handler (its only thread):
    /// leaves the parent's value (leaked, its lock as the parent's threads
    /// left it) so that the next [`ForkLock::lock`] starts a new one.
    pub fn forget(&self) {
        self.at.store(std::ptr::null_mut(), Ordering::Release);
    }
}

impl<T: Default + Send + 'static> Default for ForkLock<T> {
    fn default() -> Self {
        Self::new()
    }
}
