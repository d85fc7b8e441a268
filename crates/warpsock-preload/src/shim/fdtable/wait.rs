//! The wait for the table's lock when it is not free.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use super::super::guard::{map_held_add, map_waits};

#[cfg(test)]
use super::hooks;
use super::WAIT;

/// The wait for [`super::MAP`]'s lock (the count raised, the lock not free):
/// `try_take` until it takes it, each failed try followed by a sleep
/// during which the thread's word counts a [`WAIT`] (review r21-haz items
/// 1, 2). A signal handler over the sleep finds as many waits as holds:
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
/// took the lock): the thread registers in [`WAITERS`] before its tries
/// and sleeps on [`RELEASES`] between them; a hold's end that finds a
/// waiter advances the word and, if a waiter said it sleeps
/// ([`SLEEPING`]), wakes them all ([`wake`]: one load on every hold's
/// end; the word's RMW only with a waiter registered; the syscall only
/// with one asleep, review r21-c item 1). The sleep has a backstop of 10 ms
/// ([`BACKSTOP`]): a wake-up missed costs that much, never a hang. The
/// waiter's side is ordered by a fence (cold); the unlock's side is not
/// (the free path would pay it): std's unlock is an RMW, and the hold's
/// end's SeqCst load of the waiter count after it is ordered by the
/// hardware — x86's locked instruction; Arm's `stlxr` or `ldaddl`, then
/// `ldar` — an argument outside the language's model (review r21-c item
/// 4). As std's wait, it lasts as long as the lock is held; unlike
/// std's, a waiting writer does not stop new readers (each read hold is a
/// look-up; their ends make no syscall while the writer tries, only
/// while it sleeps). A `siglongjmp` out of a handler over the sleep
/// leaves the thread counted in [`WAITERS`]: every hold's end then makes
/// [`wake`]'s RMW of the word, but no syscall (review r21-b item 8: the
/// pause before had no wake-up, and a look-up behind a write hold slept
/// 50 µs or more of timer slack).
#[cold]
#[inline(never)]
pub(super) fn wait<T>(mut try_take: impl FnMut() -> Option<T>) -> T {
    /// The thread's wait mark, lowered when the sleep ends (a panic in a
    /// test hook included).
    struct Waiting;
    impl Drop for Waiting {
        fn drop(&mut self) {
            // One instruction (review r21-b item 7), a compiler barrier.
            map_held_add::<{ WAIT.wrapping_neg() }>(super::super::guard::map_held());
        }
    }
    /// The thread's registration in [`WAITERS`], until it has the lock.
    struct Registered;
    impl Drop for Registered {
        fn drop(&mut self) {
            let was = WAITERS.fetch_sub(1, Ordering::SeqCst);
            debug_assert_ne!(was, 0, "the lock's waiter count wrapped");
            // After the registration's end: a fork in between counts it in
            // the child ([`child_waiters`]: too many, never too few).
            map_held_add::<{ 1u32.wrapping_neg() }>(map_waits());
        }
    }
    // A sleep a signal ended leaves `EINTR`: the caller's errno is kept.
    let errno = super::super::sys::errno();
    // Before the registration: a fork from a handler in between counts it
    // in the child ([`child_waiters`]).
    map_held_add::<1>(map_waits());
    // Before the tries: a hold's end after a failed try sees the waiter.
    WAITERS.fetch_add(1, Ordering::SeqCst);
    // A store-buffering pair (review r21-c item 4): this registration then
    // the try's load of the lock's state, against the unlock's RMW then the
    // hold's end's load of `WAITERS`. The try's load is Relaxed (std's
    // failed `fetch_update`); the fence orders it after the registration
    // in the language's model, on every target, not through `seen` being
    // a SeqCst load (an `LDAR` after the `STLXR` on Arm; relaxed to
    // Acquire, an `LDAPR` would not be). Cold: the free path pays nothing.
    fence(Ordering::SeqCst);
    let _registered = Registered;
    // In the tests, a hook right after each failed try: a mutant that
    // reads `seen` after the try reads it after the hook (review r21-c
    // item 3).
    #[cfg(test)]
    let mut try_take = move || {
        let g = try_take();
        if g.is_none() {
            hooks::after_try();
        }
        g
    };
    loop {
        // Before the try: a hold's end between a failed try and the sleep
        // has advanced the word, and the sleep returns at once.
        let seen = RELEASES.load(Ordering::SeqCst);
        if let Some(g) = try_take() {
            super::super::sys::set_errno(errno);
            return g;
        }
        // One instruction: a handler between a load and a store of the
        // word set its bit, and the store lost it (review r21-b item 7).
        map_held_add::<WAIT>(super::super::guard::map_held());
        let waiting = Waiting;
        #[cfg(test)]
        hooks::before_wait();
        // Asks the hold's ends for the syscall: one that advances the word
        // after this sees the bit and wakes; one before this advanced the
        // word since `seen`, and the sleep returns at once.
        RELEASES.fetch_or(SLEEPING, Ordering::SeqCst);
        // Returns at a wake-up since `seen` (at once if one came between
        // the load and this), a signal, or the backstop.
        super::super::sys::futex_wait(&RELEASES, seen | SLEEPING, BACKSTOP);
        drop(waiting);
    }
}

/// Threads registered in [`wait`] (the hold's end's one load: none, no
/// wake-up). A forked child counts its own thread's only
/// ([`child_waiters`]).
pub(super) static WAITERS: Line<AtomicU32> = Line(AtomicU32::new(0));

/// The waiters' futex word: [`wake`] advances it by [`RELEASE`], above
/// the [`SLEEPING`] bit.
pub(super) static RELEASES: Line<AtomicU32> = Line(AtomicU32::new(0));

/// A value alone on its cache line, and on the line paired with it (aligned
/// and sized to 128 bytes: Intel's L2 spatial prefetcher fetches 64-byte
/// lines in pairs, and crossbeam's `CachePadded` uses 128 on x86-64 and
/// AArch64 for this; review r22-a item 13): nothing else the linker places
/// in `.bss` shares it. [`WAITERS`] is
/// read at every hold's end, the uncontended ones included (every locked
/// look-up: `poll`'s on the 8 B path); where the linker put it, it
/// shared a line with [`RELEASES`] and the hazard table's `OWNED` flags
/// (written as threads take and give back slots, and by a handler's
/// borrowed slot), and any static added later could be a hot written one
/// (review r21-c item 7): each such write would cost every thread's next
/// hold's end a coherence miss. Its own line is written only by a wait's
/// registration and its end. [`RELEASES`] has one too: its writes (a
/// [`wake`], a waiter's [`SLEEPING`]) are made only with a waiter
/// registered, and must not evict [`WAITERS`]' line from the readers'
/// caches either. Reached through `Deref`: the same instructions as the
/// bare atomic (the hold's end is 11 after the unlock, as before).
#[repr(align(128))]
pub(super) struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// [`RELEASES`]' bit: a waiter is about to sleep, or asleep (set before
/// its sleep; cleared by the [`wake`] that makes the syscall).
const SLEEPING: u32 = 1;

/// One hold's end in [`RELEASES`] (above [`SLEEPING`]).
const RELEASE: u32 = 2;

/// The futex word's address (a test tells a sleep on it in
/// `/proc/self/task/<tid>/syscall`).
#[cfg(test)]
pub(super) fn releases_addr() -> usize {
    RELEASES.as_ptr() as usize
}

/// The sleep's bound: a wake-up missed costs this. None in the tests,
/// where a missed wake-up hangs the run (`within_a_minute` ends it).
#[cfg(not(test))]
const BACKSTOP: Option<std::time::Duration> = Some(std::time::Duration::from_millis(10));
#[cfg(test)]
const BACKSTOP: Option<std::time::Duration> = None;

/// Wakes every thread sleeping in [`wait`] (a hold's end that found
/// [`WAITERS`]): each tries the lock again. The word advances at each
/// call (a waiter between its `seen` and its sleep returns at once); the
/// syscall only if a waiter set [`SLEEPING`] (review r21-c item 1: a
/// writer trying behind readers, or a registration a `siglongjmp` left,
/// made every hold's end a syscall). One RMW: the bit is cleared with the
/// advance, so no sleep's bit is cleared by a wake that did not see it.
#[cold]
#[inline(never)]
pub(super) fn wake() {
    let v = RELEASES
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            Some(v.wrapping_add(RELEASE) & !SLEEPING)
        })
        .unwrap_or_else(|v| v);
    if v & SLEEPING != 0 {
        #[cfg(test)]
        hooks::woke();
        super::super::sys::futex_wake(&RELEASES);
    }
}

/// In a forked child: the waiters are its thread's own registrations
/// (the fork made from a handler over a wait; [`map_waits`]), not the
/// parent's other threads', which would make every hold's end of the
/// child wake no one. Raised before a registration and lowered after its
/// end, the thread's count is never below its registrations: the
/// child's count is at worst one too many per wait a handler forked in
/// (each hold's end then pays [`wake`]'s RMW, no syscall), never too
/// few, where the wait marks were (a registration lasts longer than its
/// mark), and the count wrapped (review r21-c item 2).
pub(super) fn child_waiters() {
    WAITERS.store(map_waits().get(), Ordering::SeqCst);
}
