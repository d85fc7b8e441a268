//! The process's budget of live DDP-mode sockets
//! (`WARPSOCK_DDP_SOCKETS_MAX`, [`super::config::Config::sockets_max`]).
//!
//! Why: each DDP socket maps its receive slots (`WARPSOCK_DDP_SLOTS` ×
//! `WARPSOCK_DDP_SLOT_KB`, 4 MiB by default) for as long as it lives, and
//! a peer that fills them once leaves every page resident. Without a
//! bound, peers a policy-mode server accepts could make it commit ~4 MiB
//! per connection, up to its descriptor limit (200 connections: 785 MB);
//! kernel TCP bounds all its sockets together (`tcp_mem`), and so does
//! this (the project rule: every allocation a peer can drive has a
//! bound).
//!
//! Contract:
//! * A switch takes its [`Place`] ([`admit`]) before it begins — before
//!   anything is noted or sent — and holds it while it runs. A switch
//!   that fails drops it (given back). One that succeeds moves it into
//!   its `XSocket` (`XSocket::keep_until_dropped`), which drops it after
//!   its slot memory is unmapped: whichever path drops the socket last —
//!   the program's close, the reaper's close with its linger, an exit's
//!   — gives the place back, and the lingering closes keep theirs until
//!   then (their memory is still mapped).
//! * Beyond the budget ([`admit`] gives `None`, counted in [`OVER`],
//!   `ddp_budget_over`): policy mode leaves the connection plain TCP,
//!   nothing lost, as when no switching place is free
//!   (`switching::start`); an explicit switch fails with `ENOBUFS`, the
//!   socket an ordinary TCP socket, nothing sent and not its one try (it
//!   may be asked again once a DDP socket is gone).
//! * A forked child's sockets are its own ([`forget_after_fork`]): it
//!   starts at none; a place made before the fork and dropped in the child
//!   (a switch a handler's fork returned into) gives nothing back there.
//! * The cost: one atomic read-modify-write per switch and one per socket's
//!   drop; nothing on the data path.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use warpsock_xsock::io::ResidueBudget;

/// Switches refused beyond the budget (`ddp_budget_over`).
pub(crate) static OVER: AtomicU64 = AtomicU64::new(0);

/// The budget the residues of the process's switches under way share
/// (`WARPSOCK_DDP_RESIDUE_MAX`, [`super::config::Config`] sets its bound;
/// `warpsock_xsock::io::ResidueBudget`): every switch's options name it,
/// and one that finds it full fails as at its own residue bound
/// (`ResidueFull`), the connection plain TCP, every byte delivered
/// (helper 73's review, item 8: N explicit switches against flooding
/// peers held N × 64 MiB). Unbounded until the configuration is read.
pub(super) static RESIDUE: ResidueBudget = ResidueBudget::new(usize::MAX);

/// The process's budget.
static BUDGET: Budget = Budget::new();

/// Live places of a budget, and the fork generation they were taken in.
pub(super) struct Budget {
    live: AtomicUsize,
    /// Bumped in a forked child ([`Budget::forget`]): places of an older
    /// generation are the parent's and give nothing back.
    epoch: AtomicU32,
}

/// One live DDP socket (or switch under way) of a [`Budget`], given back
/// when dropped.
pub(super) struct Place {
    of: &'static Budget,
    epoch: u32,
}

impl Budget {
    pub(super) const fn new() -> Self {
        Self {
            live: AtomicUsize::new(0),
            epoch: AtomicU32::new(0),
        }
    }

    /// A place, if fewer than `max` are taken.
    pub(super) fn take(&'static self, max: usize) -> Option<Place> {
        // Exact (compare-and-swap), not an add taken back when over: a
        // racing taker's transient overshoot refused an explicit switch
        // with a place free.
        let epoch = self.epoch.load(Ordering::Acquire);
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place { of: self, epoch })
    }

    /// Places taken now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// In a forked child: none taken; the parent's places give nothing
    /// back here.
    fn forget(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.live.store(0, Ordering::Release);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.of.epoch.load(Ordering::Acquire) == self.epoch {
            self.of.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A place in the process's budget for a switch about to begin, or `None`
/// (counted in [`OVER`]) beyond `WARPSOCK_DDP_SOCKETS_MAX`.
pub(super) fn admit() -> Option<Place> {
    let p = BUDGET.take(super::config::get().sockets_max);
    if p.is_none() {
        OVER.fetch_add(1, Ordering::Relaxed);
    }
    p
}

/// In a child made by `fork` (its fork handler, the only thread): the
/// parent's sockets are not the child's (their copies are forgotten, never
/// dropped: `sock/close.rs`'s `forget_forked_copy`), nor its switches
/// under way (their threads are not here), nor their residues' charges.
pub(super) fn forget_after_fork() {
    BUDGET.forget();
    RESIDUE.forget();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Places up to the bound, none past it; one given back (dropped) makes
    /// room for exactly one more.
    #[test]
    fn places_are_bounded_and_given_back_when_dropped() {
        static B: Budget = Budget::new();
        let a = B.take(2).expect("the first place");
        let b = B.take(2).expect("the second place");
        assert!(B.take(2).is_none(), "a third place under a bound of 2");
        assert_eq!(B.live(), 2, "a refused take kept a place");
        drop(a);
        assert_eq!(B.live(), 1);
        let c = B.take(2).expect("the place given back");
        assert!(B.take(2).is_none());
        drop((b, c));
        assert_eq!(B.live(), 0);
        assert!(B.take(0).is_none(), "a bound of 0 gave a place");
    }

    /// A place kept by the object that owns the memory (as the `XSocket`
    /// keeps it: a boxed token) is given back when that object drops,
    /// however far it was moved.
    #[test]
    fn a_place_kept_as_a_token_is_given_back_with_its_keeper() {
        static B: Budget = Budget::new();
        let kept: Box<dyn std::any::Any + Send + Sync> = Box::new(B.take(1).unwrap());
        let moved = vec![kept];
        assert!(B.take(1).is_none());
        drop(moved);
        assert!(B.take(1).is_some());
    }

    /// In a forked child the count starts at none, and a place taken
    /// before the fork gives nothing back (the count would underflow and
    /// the bound be lifted for good).
    #[test]
    fn a_forked_childs_budget_starts_empty_and_ignores_the_parents_places() {
        static B: Budget = Budget::new();
        let parents = B.take(2).unwrap();
        let _other = B.take(2).unwrap();
        B.forget();
        assert_eq!(B.live(), 0);
        let own = B.take(2).unwrap();
        drop(parents);
        assert_eq!(B.live(), 1, "a parent's place was given back in the child");
        drop(own);
        assert_eq!(B.live(), 0);
    }
}
