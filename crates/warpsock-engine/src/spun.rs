//! A wait whose busy poll its caller made already (issue 12): inside
//! [`after_spin`], the calling thread's waits on a queue (`Cq`)
//! spin no more for the context's `busy_poll`
//! (`ContextOptions::busy_poll`) — they sleep at once, as a wait
//! without busy polling does. For a caller that spun its own way first
//! (a DDP socket's blocking receive spins on the engine's quiet read, much
//! shorter per spin than the wait's rounds): without the mark the wait
//! would spin the whole busy poll again before it sleeps, each idle
//! blocking call spinning twice the time asked.
//!
//! The mark is thread-local (no destructor, nothing registered), set for
//! the closure and put back after it, also when it unwinds.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static SPENT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a wait, or a call that waits) with the calling thread's busy
/// poll spent.
#[inline]
pub fn after_spin<R>(f: impl FnOnce() -> R) -> R {
    with_spent(true, f)
}

/// Runs `f` with the calling thread's busy poll not spent, whatever
/// [`after_spin`] around it (library code nested over a wait — the
/// engine's `awake` — also after a `siglongjmp` out of such a wait left
/// the mark set).
#[inline]
pub(crate) fn unspent<R>(f: impl FnOnce() -> R) -> R {
    with_spent(false, f)
}

/// Runs `f` with the mark `spent`, the mark from before put back after
/// (also when `f` unwinds).
#[inline]
fn with_spent<R>(spent: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SPENT.set(self.0);
        }
    }
    let _restore = Restore(SPENT.replace(spent));
    f()
}

/// The busy poll a wait of the calling thread makes: the context's
/// `busy_poll`, or none inside [`after_spin`].
#[inline]
pub(crate) fn busy_poll(configured: Duration) -> Duration {
    if configured.is_zero() || SPENT.get() {
        Duration::ZERO
    } else {
        configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_holds_inside_the_closure_only_and_nests() {
        let d = Duration::from_micros(50);
        assert_eq!(busy_poll(d), d);
        after_spin(|| {
            assert_eq!(busy_poll(d), Duration::ZERO);
            after_spin(|| assert_eq!(busy_poll(d), Duration::ZERO));
            assert_eq!(busy_poll(d), Duration::ZERO);
        });
        assert_eq!(busy_poll(d), d);
        let r = std::panic::catch_unwind(|| after_spin(|| panic!("unwinds")));
        assert!(r.is_err());
        assert_eq!(busy_poll(d), d, "the mark outlived an unwinding closure");
        // Library code nested over such a wait spins as configured.
        after_spin(|| {
            unspent(|| assert_eq!(busy_poll(d), d));
            assert_eq!(busy_poll(d), Duration::ZERO);
        });
    }
}
