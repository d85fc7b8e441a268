//! Staged interleavings and observations for the tests.

use std::cell::RefCell;
use std::sync::atomic::AtomicUsize;

/// Scans' freed entries not yet dropped: a scan by another test's
/// thread drops what it freed only after letting the lock go.
pub(super) static IN_DROP: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The reclaims (scans) the thread made: a test tells its own
    /// thread's reclaim from another test's change of the table, whose
    /// scan frees the same entries.
    pub(super) static RECLAIMS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// Run once in `read_map` after the hold is counted, before the
    /// lock's try (a handler there, staged).
    pub(super) static BEFORE_LOCK: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

pub(super) fn before_lock() {
    if let Some(f) = BEFORE_LOCK
        .try_with(|b| b.borrow_mut().take())
        .ok()
        .flatten()
    {
        f();
    }
}

thread_local! {
    /// Run once in the wait for the lock, the wait counted, before a
    /// sleep (a signal raised there, staged).
    pub(super) static BEFORE_WAIT: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

thread_local! {
    /// Run once in the wait for the lock right after a failed try, before
    /// anything else (the holder's release there, staged).
    pub(super) static AFTER_TRY: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

pub(super) fn after_try() {
    if let Some(f) = AFTER_TRY.try_with(|b| b.borrow_mut().take()).ok().flatten() {
        f();
    }
}

thread_local! {
    /// The wake-up syscalls the thread's hold's ends made.
    pub(super) static WOKE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

pub(super) fn woke() {
    let _ = WOKE.try_with(|w| w.set(w.get() + 1));
}

thread_local! {
    /// Run once in `copy` under its write hold, before the change (a
    /// handler there, staged).
    pub(crate) static IN_COPY: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

pub(super) fn in_copy() {
    if let Some(f) = IN_COPY.try_with(|b| b.borrow_mut().take()).ok().flatten() {
        f();
    }
}

thread_local! {
    /// Run once in `fork_prepare` after a refused try, before its pause
    /// (another thread's release there, staged).
    pub(super) static BEFORE_FORK_RETRY: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

pub(super) fn before_fork_retry() {
    if let Some(f) = BEFORE_FORK_RETRY
        .try_with(|b| b.borrow_mut().take())
        .ok()
        .flatten()
    {
        f();
    }
}

pub(super) fn before_wait() {
    if let Some(f) = BEFORE_WAIT
        .try_with(|b| b.borrow_mut().take())
        .ok()
        .flatten()
    {
        f();
    }
}

thread_local! {
    /// Run once in `held::defer_close` right after its slot's reservation,
    /// before its checks and its fill (a nested handler's close there,
    /// staged).
    pub(super) static IN_DEFER_CLOSE: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

pub(super) fn in_defer_close() {
    if let Some(f) = IN_DEFER_CLOSE
        .try_with(|b| b.borrow_mut().take())
        .ok()
        .flatten()
    {
        f();
    }
}
