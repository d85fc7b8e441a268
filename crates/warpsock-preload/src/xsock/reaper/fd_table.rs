//! The reaper's table of the engines' sockets its closes hold that still
//! send: what an `_exit` whose reaper does not answer resets itself
//! (`super::reset_sending_unanswered`). No lock: a hand-over may come from
//! a signal handler's `close`.
//!
//! The reset is made by descriptor number, from the exiting thread, while
//! the reaper (slow, not stuck) may close that descriptor, and another
//! thread's `accept` or `socket` take the number (review r28-e item 1):
//! between the exiter's inode check and its `setsockopt`, that would reset
//! an unrelated socket. So each place has a claim word:
//!
//! * the exiter claims a place (`OPEN` → `RESETTING`, compare-exchange)
//!   before its check and reset, and gives it back (`OPEN`) after; a place
//!   it cannot claim it skips (being forgotten: that close stops sending),
//!   and one it claims whose inode is 0 (being forgotten, or being noted:
//!   its inode not stored yet) it leaves alone;
//! * [`FdTable::forget`] — called before the close's socket is closed (the
//!   `Held`'s count given up, `reaper.rs`), with the place its `note`
//!   gave — claims the place for itself (`OPEN` → `FORGETTING`), waiting
//!   out a reset under way, zeroes its inode, gives the claim back, and
//!   only then frees the place (its number -1). In that order no `note`
//!   can take the place while its claim is held: freed under the claim, a
//!   `note` of another close landed there and a concurrent reset skipped
//!   that close as "being forgotten" (review r29-a item 2). A reset that
//!   claims the place between the claim's release and the free finds the
//!   inode 0 and leaves it.
//!
//! A noted descriptor is closed only after its `forget` returned, and
//! `forget` cannot return while a reset holds its place: the number still
//! names the noted socket from the exiter's check to its reset. The wait
//! is for two system calls of another thread (`fstat`, `setsockopt`),
//! never for this thread's own: the exiting thread has its asynchronous
//! signals blocked for good before its flush (`interpose`), so no handler
//! of its own (whose `close` might hand over and forget) runs over its
//! claim. Nothing blocks on a lock: each side spins on one word, and the
//! exiter never waits.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicU8, Ordering};

use libc::c_int;

use crate::shim::{real, sys};

/// A place's claim: nobody's.
const OPEN: u8 = 0;
/// An exiter's check and reset of the place's socket are under way.
const RESETTING: u8 = 1;
/// [`FdTable::forget`] is emptying the place.
const FORGETTING: u8 = 2;

/// One place: a descriptor (-1 when free), its inode, its claim (the
/// module's doc).
struct Place {
    fd: AtomicI32,
    ino: AtomicU64,
    claim: AtomicU8,
}

impl Place {
    fn free() -> Self {
        Self {
            fd: AtomicI32::new(-1),
            ino: AtomicU64::new(0),
            claim: AtomicU8::new(OPEN),
        }
    }
}

/// The places of a table grown by a `note` that found every place taken
/// ([`FdTable::note`]).
const SPILL: usize = 64;

/// The most places a reaper's first table has (16 bytes each): a setting
/// past it is met by the tables a full one grows, as closes need them,
/// not by memory taken up front.
pub(super) const FIRST_MAX: usize = 1 << 16;

/// Descriptors with their inodes, -1 in the free places, and each place's
/// claim (the module's doc): a table with no lock (a hand-over may come
/// from a signal handler's `close`). The reaper's first is allocated with
/// it (`super::new_reaper`), as many places as `WARPSOCK_DDP_CLOSING_MAX`
/// (review r29-a item 1; at most [`FIRST_MAX`]). One every place of which
/// is taken when a close is noted — a burst of hand-overs the reaper has
/// not taken (and trimmed to its bound) yet — grows a table of [`SPILL`]
/// places after it ([`Self::note`]; a hand-over allocates anyway: its
/// inbox node), never freed: every close still sending is noted from its
/// hand-over to its sending's end (review r29-a item 3: a close met when
/// the table was full was noted by a later round of the reaper, whose
/// freed places the hand-overs after its take could fill first). The
/// inode is checked before a reset: a number closed and reused without
/// its `forget` (none should be) is not touched.
pub(super) struct FdTable {
    places: Box<[Place]>,
    /// The table grown after this one (null: none yet), leaked with it.
    next: AtomicPtr<Self>,
    /// Test: run between a reset's inode check and its `setsockopt`.
    #[cfg(test)]
    pub(super) between: std::sync::OnceLock<Box<dyn Fn(c_int) + Send + Sync>>,
    /// Test: `forget` calls that met a reset under way.
    #[cfg(test)]
    pub(super) waited: std::sync::atomic::AtomicUsize,
    /// Test: run in `forget` before its last store.
    #[cfg(test)]
    pub(super) freeing: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl FdTable {
    /// A table of `n` places (at least 1), or `None` if the memory could
    /// not be had.
    pub(super) fn new(n: usize) -> Option<Self> {
        let mut places = Vec::new();
        places.try_reserve_exact(n.max(1)).ok()?;
        places.extend((0..n.max(1)).map(|_| Place::free()));
        Some(Self::of(places.into_boxed_slice()))
    }

    /// A table of `places`.
    fn of(places: Box<[Place]>) -> Self {
        Self {
            places,
            next: AtomicPtr::new(std::ptr::null_mut()),
            #[cfg(test)]
            between: std::sync::OnceLock::new(),
            #[cfg(test)]
            waited: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            freeing: std::sync::OnceLock::new(),
        }
    }

    /// This table's places.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.places.len()
    }

    /// The tables grown after this one, this one first.
    fn chain(&self) -> impl Iterator<Item = &Self> {
        std::iter::successors(Some(self), |t| {
            // SAFETY: a linked table is published whole and never freed.
            unsafe { t.next.load(Ordering::Acquire).as_ref() }
        })
    }

    /// `fd` in the table: the table (this one or one grown after it) and
    /// the index of its place, which its [`Self::forget`] takes. Every
    /// place taken, it grows a table of [`SPILL`] places (the type's
    /// doc).
    pub(super) fn note(&'static self, fd: c_int) -> (&'static Self, usize) {
        let ino = super::super::inode(fd);
        let mut t = self;
        loop {
            if let Some(i) = t.note_here(fd, ino) {
                return (t, i);
            }
            let mut next = t.next.load(Ordering::Acquire);
            if next.is_null() {
                // (Out of memory, this aborts, as the hand-over's inbox
                // node does.)
                let places = (0..SPILL).map(|_| Place::free()).collect();
                let grown = Box::into_raw(Box::new(Self::of(places)));
                next = match t.next.compare_exchange(
                    std::ptr::null_mut(),
                    grown,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => grown,
                    Err(other) => {
                        // SAFETY: ours, never published: another `note`
                        // linked its table first.
                        drop(unsafe { Box::from_raw(grown) });
                        other
                    }
                };
            }
            // SAFETY: a linked table is published whole and never freed.
            t = unsafe { &*next };
        }
    }

    /// `fd` (inode `ino`) in a free place of this table: its index.
    fn note_here(&self, fd: c_int, ino: u64) -> Option<usize> {
        for (i, p) in self.places.iter().enumerate() {
            // A load before the exchange: a taken place costs no write.
            if p.fd.load(Ordering::Relaxed) == -1
                && p.fd
                    .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                p.ino.store(ino, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Place `i` (its [`Self::note`]'s) freed: before its socket closes,
    /// and it returns only once no reset of it is under way (the module's
    /// doc). No scan: the place is the close's.
    pub(super) fn forget(&self, i: usize) {
        let p = &self.places[i];
        let mut round = 0;
        while p
            .claim
            .compare_exchange(OPEN, FORGETTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            #[cfg(test)]
            if round == 0 {
                self.waited.fetch_add(1, Ordering::AcqRel);
            }
            sys::pause(round);
            round = round.saturating_add(1);
        }
        // The inode first (a reset from now on leaves the place alone),
        // the claim given back, then the number freed: a `note` can take
        // the place only once no claim of ours is on it (the module's
        // doc; a `note` stores its inode after its number).
        p.ino.store(0, Ordering::Release);
        p.claim.store(OPEN, Ordering::Release);
        #[cfg(test)]
        if let Some(f) = self.freeing.get() {
            f();
        }
        p.fd.store(-1, Ordering::Release);
    }

    /// Every place freed (a forked child, its only thread: the parent's
    /// sockets).
    pub(super) fn clear(&self) {
        for p in self.chain().flat_map(|t| t.places.iter()) {
            p.fd.store(-1, Ordering::Release);
            p.ino.store(0, Ordering::Release);
            p.claim.store(OPEN, Ordering::Release);
        }
    }

    /// `SO_LINGER` {1, 0} set on each socket still named by its number
    /// (the inode noted), each under its place's claim; how many. Every
    /// place is looked at: an `_exit`'s, once.
    pub(super) fn reset(&self) -> usize {
        let zero = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let mut n = 0;
        for p in self.chain().flat_map(|t| t.places.iter()) {
            if p.fd.load(Ordering::Acquire) < 0
                || p.claim
                    .compare_exchange(OPEN, RESETTING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                // Free, or being forgotten (its close no longer sends) or
                // reset by another exiting thread.
                continue;
            }
            let fd = p.fd.load(Ordering::Acquire);
            let ino = p.ino.load(Ordering::Acquire);
            // Inode 0: being forgotten (its claim given back before its
            // number is freed) or noted (its inode not stored yet).
            if fd >= 0 && ino != 0 && super::super::inode(fd) == ino {
                #[cfg(test)]
                if let Some(f) = self.between.get() {
                    f(fd);
                }
                // SAFETY: a `linger` from the stack, of the declared size.
                let r = unsafe {
                    real::setsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&zero as *const libc::linger).cast(),
                        size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                n += usize::from(r == 0);
            }
            p.claim.store(OPEN, Ordering::Release);
        }
        n
    }
}
