//! A cap on the residue bytes that switches under way hold together
//! ([`ResidueBudget`], given to a switch in [`Options::residue_budget`]).
//!
//! Why (helper 73's review, item 8): a switch reads the peer's bytes
//! before its mark into a residue, up to `Limits::residue_max` (64 MiB)
//! per connection. A program that switches N connections at once (each
//! an explicit `setsockopt` of its own thread) against peers that write
//! without marking held N × 64 MiB, bounded only by its threads. With a
//! budget each read into a residue is charged first: past the budget's
//! bound the switch fails as at its own bound
//! ([`SwitchError::ResidueFull`](crate::SwitchError::ResidueFull)), the
//! connection plain TCP, the residue read so far delivered first.
//!
//! The charge is the switch's: given back when the switch ends, however
//! it ends, as the residue leaves it for the program's stream (the
//! preload's residue socket, or the DDP socket's first reads). The bytes
//! a program leaves unread after that are its own, as an unread TCP
//! socket's receive buffer is: the budget bounds what peers make the
//! switches under way hold, not what the program keeps.
//!
//! The sans-IO core ([`crate::switch`]) knows nothing of it: the socket
//! layer charges before it reads ([`Charge::grant`]) and tells the switch
//! when nothing is granted (`Switch::on_residue_refused`).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

#[cfg(doc)]
use super::Options;

/// Residue bytes held by the switches that were given this budget, and
/// their bound. A `static` (the budget outlives every switch).
#[derive(Debug)]
pub struct ResidueBudget {
    max: AtomicUsize,
    held: AtomicUsize,
    /// Bumped in a forked child ([`Self::forget`]): charges made before
    /// are the parent's switches' and give nothing back.
    epoch: AtomicU32,
}

/// Two budgets are the same budget (not two with equal counts): what
/// `Options`' comparison needs.
impl PartialEq for ResidueBudget {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for ResidueBudget {}

impl ResidueBudget {
    /// A budget of `max` bytes, none held.
    pub const fn new(max: usize) -> Self {
        Self {
            max: AtomicUsize::new(max),
            held: AtomicUsize::new(0),
            epoch: AtomicU32::new(0),
        }
    }

    /// Sets the bound (the configuration's, read once). Charges held past
    /// a lowered bound stay; no more is granted until they are given back.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Release);
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    /// Bytes held now by switches under way.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// In a child made by `fork` (its fork handler, the only thread): the
    /// parent's switches under way are not here (their threads are not),
    /// so nothing is held; a charge made before the fork and dropped in
    /// the child (a switch a handler's fork returned into) gives nothing
    /// back.
    pub fn forget(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.held.store(0, Ordering::Release);
    }

    /// A switch's charge, none yet.
    pub(crate) fn charge(&'static self) -> Charge {
        Charge {
            of: Some(self),
            n: 0,
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }
}

/// What one switch holds of a [`ResidueBudget`] (none without a budget);
/// given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    of: Option<&'static ResidueBudget>,
    n: usize,
    epoch: u32,
}

impl Charge {
    /// A charge of no budget: every grant whole.
    pub(crate) fn unbounded() -> Self {
        Self {
            of: None,
            n: 0,
            epoch: 0,
        }
    }

    /// Up to `want` more bytes, as many as the budget has room for (all
    /// of them without a budget); 0 when it is full.
    pub(crate) fn grant(&mut self, want: usize) -> usize {
        let Some(b) = self.of else {
            return want;
        };
        let max = b.max();
        // Exact (compare-and-swap): two switches racing for the last room
        // never hold more than the bound together.
        let mut got = 0;
        let _ = b
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                got = want.min(max.saturating_sub(h));
                (got > 0).then_some(h + got)
            });
        self.n += got;
        got
    }

    /// `n` granted bytes were not read after all (a short read): given
    /// back at once.
    pub(crate) fn unused(&mut self, n: usize) {
        let n = n.min(self.n);
        self.n -= n;
        self.give_back(n);
    }

    fn give_back(&self, n: usize) {
        if let Some(b) = self
            .of
            .filter(|b| b.epoch.load(Ordering::Acquire) == self.epoch)
        {
            let _ = b
                .held
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                    Some(h.saturating_sub(n))
                });
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.give_back(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants up to the bound, across charges; what a charge held comes
    /// back when it drops, unused bytes at once; without a budget,
    /// everything.
    #[test]
    fn grants_stay_within_the_bound_and_come_back() {
        static B: ResidueBudget = ResidueBudget::new(1000);
        let mut a = B.charge();
        let mut b = B.charge();
        assert_eq!(a.grant(600), 600);
        assert_eq!(b.grant(600), 400, "only the room left");
        assert_eq!(b.grant(1), 0, "full");
        assert_eq!(B.held(), 1000);
        a.unused(100);
        assert_eq!(B.held(), 900);
        assert_eq!(b.grant(500), 100);
        drop(a);
        assert_eq!(B.held(), 500);
        drop(b);
        assert_eq!(B.held(), 0);
        assert_eq!(Charge::unbounded().grant(usize::MAX), usize::MAX);
    }

    /// In a forked child nothing is held, and a charge of the parent's
    /// gives nothing back there (the count would underflow).
    #[test]
    fn a_forked_childs_budget_starts_empty() {
        static B: ResidueBudget = ResidueBudget::new(1000);
        let mut parents = B.charge();
        assert_eq!(parents.grant(700), 700);
        B.forget();
        assert_eq!(B.held(), 0);
        let mut own = B.charge();
        assert_eq!(own.grant(800), 800);
        drop(parents);
        assert_eq!(B.held(), 800);
        drop(own);
        assert_eq!(B.held(), 0);
    }
}
