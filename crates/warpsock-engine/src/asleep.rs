//! Whether the calling thread is asleep in a system call with no lock of
//! the library held: a caller's wait (the parked read, `epoll`) or a
//! sleep of the engine's user ([`unlocked`]). A signal handler that calls
//! `exit` over such a sleep interrupted no locked stretch: the exit's
//! closes may take the locks (an exit over a locked stretch must not: the
//! preload's `at_exit`, issue 12). And a parked read so interrupted never
//! comes back to take its socket's reading side back: [`abandon`] and
//! [`crate::Cq::abandon_park`] give it back, for the exit's closes to read
//! the peer's credits and FIN.
//!
//! The mark is thread-local, stored before and after each sleep (not on a
//! busy-polling path, which never sleeps). The engine's user may name what
//! waits ([`owned`]: a word of its own), for its exit to undo that wait's
//! marks too.

use std::cell::Cell;

/// A sleep, as [`abandon`] reports it: a parked read's context (its key,
/// [`crate::Cq::context_key`]), queue pair and slot, for
/// [`crate::Cq::abandon_park`], and the word of the user's [`owned`]
/// around it ([`Self::owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slept {
    pub(crate) key: usize,
    pub(crate) qi: usize,
    pub(crate) slot_id: u64,
    owner: usize,
}

impl Slept {
    /// The word of the innermost [`owned`] around the sleep (0: none).
    pub fn owner(&self) -> usize {
        self.owner
    }
}

/// `key` 0: not asleep; 1 with no slot: a sleep that is no parked read.
const NONE: Slept = Slept {
    key: 0,
    qi: 0,
    slot_id: 0,
    owner: 0,
};
const PLAIN: Slept = Slept {
    key: 1,
    qi: 0,
    slot_id: 0,
    owner: 0,
};

thread_local! {
    static MARK: Cell<Slept> = const { Cell::new(NONE) };
}

/// Runs `f` (a sleep in a system call) marked as [`asleep`]. The caller
/// holds no lock of the library (nor `malloc`'s) across `f`.
#[inline]
pub fn unlocked<R>(f: impl FnOnce() -> R) -> R {
    mark_while(PLAIN, f)
}

/// Runs the parked read's sleep `f` marked with `park`.
#[inline]
pub(crate) fn parked<R>(park: Slept, f: impl FnOnce() -> R) -> R {
    mark_while(park, f)
}

/// Runs `f`, a wait that may sleep, its sleeps' marks naming `owner` (a
/// word of the caller's: [`Slept::owner`]). Not itself a mark of sleep.
#[inline]
pub fn owned<R>(owner: usize, f: impl FnOnce() -> R) -> R {
    let prev = MARK.with(|c| {
        let prev = c.get();
        c.set(Slept { owner, ..prev });
        prev
    });
    let _restore = Restore(prev);
    f()
}

/// `f` marked `m` (the owner kept).
#[inline]
fn mark_while<R>(m: Slept, f: impl FnOnce() -> R) -> R {
    let prev = MARK.with(|c| {
        let prev = c.get();
        c.set(Slept {
            owner: prev.owner,
            ..m
        });
        prev
    });
    let _restore = Restore(prev);
    f()
}

/// Puts the mark from before a [`mark_while`] or [`owned`] back when it
/// ends, normally or by a panic (the preload's `enter` catches one and
/// the thread goes on: a mark left would name a sleep, and a socket, that
/// are over; review r26-d item 3). A `siglongjmp` out of the sleep skips
/// this drop too (no unwinding): the mark stays; [`awake`] is the
/// library's later code's cover.
struct Restore(Slept);

impl Drop for Restore {
    #[inline]
    fn drop(&mut self) {
        let prev = self.0;
        MARK.with(|c| c.set(prev));
    }
}

/// Runs `f`, code that may take the library's locks, marked as in no
/// sleep; the mark from before is put back when it ends (normally or by a
/// panic). For library code that runs over a marked sleep of its own
/// thread: an exit's flush or closes from a signal handler over that
/// sleep (the sleep's mark still set, and an exit from a signal nested in
/// that code would be taken for an exit over the sleep, which holds no
/// lock), or after a `siglongjmp` out of a marked sleep (its mark never
/// put back: review r26-d item 3); the program's own calls there reach
/// no library code (the preload passes a call made inside the library to
/// the real function). Not itself a mark of sleep; the owner is cleared
/// too: a sleep inside `f` marks itself alone, and an exit over it gives
/// back only that sleep's wait, not the outer one's (review r27-b item
/// 5). The busy poll a wait around it spent ([`crate::spun::after_spin`])
/// is not spent for `f` either.
#[inline]
pub fn awake<R>(f: impl FnOnce() -> R) -> R {
    let prev = MARK.with(|c| c.replace(NONE));
    let _restore = Restore(prev);
    // Nor over a spent busy poll: `f`'s waits spin as configured (a
    // `siglongjmp` out of a wait inside `spun::after_spin` left its mark
    // set too).
    crate::spun::unspent(f)
}

/// Whether the calling thread is inside a sleep [`unlocked`] marks (or the
/// engine's own: a caller's wait), holding no lock of the library: what a
/// signal handler running now interrupted.
pub fn asleep() -> bool {
    MARK.with(Cell::get).key != 0
}

/// The sleep the calling thread is in ([`asleep`]), its mark left as it
/// is (an `_exit`'s look: a child made by `vfork` shares its parent's
/// thread's mark, which must stay as it was).
pub fn slept() -> Option<Slept> {
    let m = MARK.with(Cell::get);
    (m.key != NONE.key).then_some(m)
}

/// For an exit in a signal handler over this thread's sleep ([`asleep`]),
/// which never returns: the sleep, for [`crate::Cq::abandon_park`] if it
/// was a parked read (the bytes of a read the signal cut are the kernel's
/// still) and its owner's undo ([`Slept::owner`]). The mark is cleared.
pub fn abandon() -> Option<Slept> {
    let m = MARK.with(|c| c.replace(NONE));
    (m.key != NONE.key).then_some(m)
}

impl Slept {
    /// A parked read's mark.
    pub(crate) fn park(key: usize, qi: usize, slot_id: u64) -> Self {
        Self {
            key,
            qi,
            slot_id,
            owner: 0,
        }
    }

    /// Whether it was a parked read.
    pub(crate) fn is_park(&self) -> bool {
        self.key > PLAIN.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic out of a marked sleep (the preload's `enter` catches it and
    /// the thread goes on) leaves no mark: neither the sleep's nor the
    /// owner's (review r26-d item 3).
    #[test]
    fn a_panic_out_of_a_marked_sleep_leaves_no_mark() {
        let r = std::panic::catch_unwind(|| {
            owned(0x1000 | 1, || {
                unlocked(|| {
                    assert!(asleep());
                    panic!("in the sleep");
                });
            });
        });
        assert!(r.is_err());
        assert!(!asleep());
        assert_eq!(abandon(), None);
        // A later sleep with no owner of its own names none.
        let m = unlocked(|| MARK.with(Cell::get));
        assert_eq!(m.owner(), 0);
        assert_eq!(m, PLAIN);
    }

    /// Code [`awake`] runs over a marked sleep sees no sleep and no
    /// owner, and the sleep's mark is back after it (normally or by a
    /// panic).
    #[test]
    fn awake_code_over_a_sleep_sees_none_and_gives_the_mark_back() {
        owned(0x3000, || {
            unlocked(|| {
                let inside = awake(|| (asleep(), MARK.with(Cell::get)));
                assert_eq!(inside, (false, NONE));
                assert!(asleep());
                let r = std::panic::catch_unwind(|| awake(|| panic!("awake (this test's)")));
                assert!(r.is_err());
                assert_eq!(
                    MARK.with(Cell::get),
                    Slept {
                        owner: 0x3000,
                        ..PLAIN
                    }
                );
            });
        });
    }

    /// Library code run awake over a wait whose busy poll was spent
    /// (`spun::after_spin`) spins as configured; the mark is back after.
    #[test]
    fn awake_code_over_a_spent_busy_poll_spins_as_configured() {
        let d = std::time::Duration::from_micros(50);
        crate::spun::after_spin(|| {
            awake(|| assert_eq!(crate::spun::busy_poll(d), d));
            assert!(crate::spun::busy_poll(d).is_zero());
        });
    }

    /// Nested marks come back in order on normal returns.
    #[test]
    fn nested_marks_are_restored_in_order() {
        owned(0x2000, || {
            unlocked(|| assert_eq!(MARK.with(Cell::get).owner(), 0x2000));
            assert!(!asleep());
            assert_eq!(MARK.with(Cell::get).owner(), 0x2000);
        });
        assert_eq!(MARK.with(Cell::get), NONE);
    }
}
