//! The wait for the table's lock when it is not free.

use std::sync::atomic::{compiler_fence, Ordering};

#[cfg(test)]
use super::hooks;
use super::WAIT;

/// The wait for [`super::MAP`]'s lock (the count raised, the lock not free):
/// `try_take` until it takes it, each failed try followed by a pause
/// during which the thread's word counts a [`WAIT`] (review r21-haz items
/// 1, 2). A signal handler over the pause finds as many waits as holds:
/// its thread holds nothing, so its calls, and `fork_prepare`, wait for
/// the lock as any thread's (a change by the handler waits for the
/// holder; a fork takes the lock first, so the child gets it free). The
/// signals stay unblocked: a handler that must run before the holder
/// goes on (a collector's stop-the-world acknowledgement, Boehm's
/// SIGPWR) runs, and one that `siglongjmp`s out leaves no lock held
/// (d935c18 blocked them for the wait: such a program deadlocked, and a
/// handler of a signal sent meanwhile ran over the hold, where a jump out
/// kept the lock for good). The wait mark is lowered before each try: a
/// handler between its lowering and the try's atomic finds a hold and is
/// refused (as over the few instructions before the first try), never a
/// wait over a lock its thread holds.
///
/// A loop of the library's own (std's blocking wait cannot tell when it
/// took the lock): the pause is `sched_yield` for the first rounds, then
/// a sleep doubling to about 1 ms; no wake-up, so a hold's end costs what
/// it did (the free path, one atomic, is unchanged). The lock's holds are
/// short (a change, a listing, a fork). As std's wait, it lasts as long
/// as the lock is held; unlike std's, a waiting writer does not stop new
/// readers (each read hold is a look-up).
#[cold]
#[inline(never)]
pub(super) fn wait<T>(mut try_take: impl FnMut() -> Option<T>) -> T {
    /// The thread's wait mark, lowered when the pause ends (a panic in a
    /// test hook included).
    struct Waiting(&'static std::cell::Cell<u32>);
    impl Drop for Waiting {
        fn drop(&mut self) {
            compiler_fence(Ordering::SeqCst);
            self.0.set(self.0.get() - WAIT);
            compiler_fence(Ordering::SeqCst);
        }
    }
    let c = super::super::guard::map_held();
    // A sleep a signal ended leaves `EINTR`: the caller's errno is kept.
    let errno = super::super::sys::errno();
    let mut round = 0u32;
    loop {
        if let Some(g) = try_take() {
            super::super::sys::set_errno(errno);
            return g;
        }
        compiler_fence(Ordering::SeqCst);
        c.set(c.get() + WAIT);
        compiler_fence(Ordering::SeqCst);
        let waiting = Waiting(c);
        #[cfg(test)]
        hooks::before_wait();
        super::super::sys::pause(round);
        drop(waiting);
        round = round.saturating_add(1);
    }
}
