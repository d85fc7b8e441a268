//! Hazard pointers for the descriptor table's look-up of a data call
//! ([`super::with_marked`]): the entry a call uses is kept alive by the
//! calling thread's published pointer, not by a reference count taken and
//! dropped per call (three `lock`-prefixed instructions, with the read
//! lock's two more, on every data call of a managed socket).
//!
//! Each thread that makes a managed data call claims one slot of
//! [`HAZARDS`] for its life ([`mine`]; released by a thread-local
//! destructor). A look-up publishes the entry's address in the slot, then
//! reads the table again: if the entry is still there, a writer that
//! removes it later sees the slot when it retires the entry ([`retire`],
//! after its swap: both sides are sequentially consistent, so one of the
//! two sees the other), and keeps it until the slot no longer names it.
//! Retired entries wait in a list scanned at every retirement; each one in
//! it is named by some slot at the last scan, so the list holds at most
//! one entry per slot.
//!
//! A call that finds its thread's slot in use — a signal handler that
//! interrupted a call between its look-up and its end — and a thread that
//! found every slot taken use the locked look-up with a reference count
//! instead ([`super::get_marked`]).
//!
//! After `fork` the child's slots of threads that did not follow it stay
//! owned (and an entry one of them named stays retired): at most all of
//! them, after which the child's threads take the locked look-up.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, Ordering};

use super::super::guard;
use super::Entry;

/// Slots: threads making managed data calls at once with the fast look-up.
pub(super) const SLOTS: usize = 256;

/// A slot's published entry (null: none).
pub(super) static HAZARDS: [AtomicPtr<Entry>; SLOTS] =
    [const { AtomicPtr::new(null_mut()) }; SLOTS];
/// Whether a live thread owns the slot.
static OWNED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];

/// The thread-local value of a thread that may not take a slot (a slot's
/// address is never 1).
const NONE: usize = 1;

/// Gives the thread's slot back when it exits.
struct Claim(Cell<usize>);

impl Drop for Claim {
    fn drop(&mut self) {
        let i = self.0.get();
        if i < SLOTS {
            // Calls made by later destructors of this thread take the
            // locked path.
            guard::slot().set(NONE);
            HAZARDS[i].store(null_mut(), Ordering::Release);
            OWNED[i].store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static CLAIM: Claim = const { Claim(Cell::new(usize::MAX)) };
}

/// The calling thread's slot for a look-up, if it has one free for it.
#[inline]
pub(super) fn mine() -> Option<&'static AtomicPtr<Entry>> {
    let h = match guard::slot().get() {
        0 => claim()?,
        NONE => return None,
        // SAFETY: a slot's address (`claim`): a static.
        a => unsafe { &*(a as *const AtomicPtr<Entry>) },
    };
    // In use: this thread is inside a call that looked its entry up (a
    // signal handler interrupted it). That entry stays protected.
    h.load(Ordering::Relaxed).is_null().then_some(h)
}

/// Claims a free slot for the calling thread (its first managed data
/// call), or marks the thread as one that takes none.
#[cold]
#[inline(never)]
fn claim() -> Option<&'static AtomicPtr<Entry>> {
    let slot = guard::slot();
    for (i, owned) in OWNED.iter().enumerate() {
        if owned
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // Given back at the thread's exit; a thread whose destructors run
        // already cannot register one: it keeps no slot.
        if CLAIM.try_with(|c| c.0.set(i)).is_err() {
            owned.store(false, Ordering::Release);
            break;
        }
        let h = &HAZARDS[i];
        slot.set(h as *const AtomicPtr<Entry> as usize);
        return Some(h);
    }
    slot.set(NONE);
    None
}

/// Publishes the entry `at` holds in `h` (the caller's slot, empty) and
/// returns it, still in the table after publication; or returns null (the
/// slot left empty) if the table holds none.
#[inline]
pub(super) fn protect(h: &AtomicPtr<Entry>, at: &AtomicPtr<Entry>) -> *mut Entry {
    let mut p = at.load(Ordering::Acquire);
    loop {
        if p.is_null() {
            h.store(null_mut(), Ordering::Release);
            return p;
        }
        #[cfg(test)]
        tests::between();
        h.store(p, Ordering::SeqCst);
        let q = at.load(Ordering::SeqCst);
        if q == p {
            return p;
        }
        p = q;
    }
}

/// Ends a look-up's protection (its call is over).
#[inline]
pub(super) fn clear(h: &AtomicPtr<Entry>) {
    h.store(null_mut(), Ordering::Release);
}

/// Entries taken out of the table whose memory a slot may still name.
pub(super) struct Retired(Vec<RetiredEntry>);

struct RetiredEntry(*mut Entry);

// SAFETY: the pointer is an owned `Box<Entry>` (`Entry` is `Send + Sync`),
// only moved between threads under the table's lock.
unsafe impl Send for RetiredEntry {}
// SAFETY: as above (shared only as the table's, under its lock).
unsafe impl Sync for RetiredEntry {}

impl Retired {
    pub(super) const fn new() -> Self {
        Self(Vec::new())
    }

    /// Retires `p` (an entry the caller has just swapped out of the table,
    /// under its lock) and every earlier one no slot names any more; the
    /// entries returned may be dropped — after the table's lock is let go:
    /// an entry's drop may be its socket's last reference, whose drop may
    /// come back to the table.
    pub(super) fn retire(&mut self, p: *mut Entry) -> Vec<Entry> {
        self.0.push(RetiredEntry(p));
        // Against each look-up's publish-then-read: the swap before this
        // and the scan after it (module docs).
        fence(Ordering::SeqCst);
        let mut free = Vec::new();
        self.0.retain(|e| {
            if HAZARDS.iter().any(|h| h.load(Ordering::SeqCst) == e.0) {
                return true;
            }
            // SAFETY: out of the table, named by no slot: no look-up can
            // reach it any more (a later one reads the table, which no
            // longer holds it); made by `Box::into_raw`, retired once.
            free.push(*unsafe { Box::from_raw(e.0) });
            false
        });
        free
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;

    thread_local! {
        /// Run once between a look-up's read of the table and its
        /// publication (a staged race).
        pub(in super::super) static BETWEEN: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    pub(super) fn between() {
        if let Some(f) = BETWEEN.with(|b| b.borrow_mut().take()) {
            f();
        }
    }
}
