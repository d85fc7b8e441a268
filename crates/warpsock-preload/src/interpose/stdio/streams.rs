//! The list of the library's streams ([`Streams`], `stdio::STREAMS`): a
//! set of cookies that a forked child keeps whole and usable, whatever a
//! thread of the parent's was doing with it at the fork.
//!
//! The child needs the list (its `freopen` of a copy of the parent's
//! stream is refused, as the parent's own would be, only if it finds the
//! stream there: `reopen_refused`; review r26-c item 4), so it cannot
//! start an empty one; and a thread of the parent's may hold the list's
//! lock at the fork for any time (preempted inside an `fdopen`'s record
//! or an `fclose`'s removal; the exit flush holds it across blocking
//! sends), which the child must neither wait for (that thread is not the
//! child's: its first `fclose` of a stream hung, issue 12, as review r29-c
//! item 7 found for the epoll sets' list) nor read half changed. So, as
//! `shim::epollcarry`'s list: the set readers see ([`Streams::cur`]) is
//! never changed in place; a change is made to the other one, the spare,
//! which is then published with one atomic store, and the same change
//! made to the set it replaced (now the spare); all under a [`ForkLock`]
//! that the child's fork handler forgets ([`Streams::fork_child`]). The
//! child's copy of the index names a whole set (the one before a change
//! under way at the fork, or the one after it), and its next lock is a
//! new one; its spare, which that change may have left half made, is made
//! again from the whole set by the child's first change. Two sets rather
//! than a new copy published by each change (as the epoll sets' list): a
//! change stays O(log n) (a server's thousands of streams, each `fdopen`
//! and `fclose` copying the set, were quadratic: review r26-c item 9).
//! The fork handlers take no lock for it, so a signal handler's `fork`
//! over its own thread's `fdopen` or `fclose` waits for nothing.
//!
//! Not supported (as for the epoll sets' list, review r30-c items 1, 2):
//! a child forked by a signal handler over its own thread's change that
//! changes the list while still in that handler (`fdopen` and `fclose`
//! are not async-signal-safe; the interrupted change, resumed after it,
//! changes the sets under the parent's lock, not the child's new one),
//! and another library's child fork handler registered before ours that
//! takes the list (its `fclose` of one of the library's streams) while a
//! parent's thread held the lock at the fork: it waits for that lock
//! (ours has not forgotten it yet); and a child forked by a signal
//! handler over its own thread's *read* (`reopen_refused`'s look, the
//! exit flush's loop) that changes the list while still in that handler:
//! the change (under the new lock) mutates the set the interrupted read
//! still borrows (review r30-d item 2; before, that child hung on the
//! inherited lock).
//!
//! Cost: a change is two O(log n) changes, a release store and a fence;
//! a forked child's first change clones the whole set once (O(n), its
//! spare made again), and leaves the old spare leaked (copy-on-write
//! memory of the parent's).

use std::cell::UnsafeCell;
use std::collections::BTreeSet;
use std::mem::ManuallyDrop;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::MutexGuard;

use warpsock_xsock::io::ForkLock;

use crate::shim::sys;

/// A set of cookies (`Box<Stream>` pointers as `usize`), kept as two
/// copies (module docs). A set is never dropped: one the child cannot
/// trust (half changed at the fork) is leaked.
type Set = ManuallyDrop<BTreeSet<usize>>;

/// The library's streams' list (module docs).
pub(super) struct Streams {
    /// Held by a change across both sets' changes and the publication,
    /// and by a reader across its use of the set ([`Listed`]); a
    /// poisoned lock is taken as it is (`ForkLock::lock`: a panic is
    /// caught at the boundary and the list stays usable, [`Streams::stale`]
    /// makes the spare again).
    lock: ForkLock<()>,
    /// The two copies: `sets[cur]` is whole at every instant, readers
    /// read it; the other is the spare, changed first.
    sets: [UnsafeCell<Set>; 2],
    /// The index of the published set, changed under the lock by one
    /// store, after the spare's change is complete (a release store,
    /// then a full fence before the other set's change: a fork's copy of
    /// the process never has the other set's change without this store).
    cur: AtomicUsize,
    /// The spare is not known to be a copy of the published set: set by
    /// the child's fork handler (a parent's thread may have been changing
    /// it) and across a change (one that unwound left it), cleared when a
    /// change has made both alike; the next change makes it again from
    /// the published set.
    stale: AtomicBool,
    /// This process recorded a stream since it began or forked: else it
    /// has none of its own (a forked child's list holds its parent's),
    /// and the exit flush looks for none ([`Streams::trying`]).
    own: AtomicBool,
}

// SAFETY: the sets are read and changed only under `lock` (a reader's
// guard, `Listed`, holds it), and by a forked child's only thread.
unsafe impl Sync for Streams {}

/// The published set, read under the list's lock (held as long as this
/// guard lives).
pub(super) struct Listed {
    _held: MutexGuard<'static, ()>,
    set: &'static BTreeSet<usize>,
}

impl std::ops::Deref for Listed {
    type Target = BTreeSet<usize>;
    fn deref(&self) -> &BTreeSet<usize> {
        self.set
    }
}

impl Streams {
    /// An empty list.
    pub(super) const fn new() -> Self {
        Self {
            lock: ForkLock::new(),
            sets: [
                UnsafeCell::new(ManuallyDrop::new(BTreeSet::new())),
                UnsafeCell::new(ManuallyDrop::new(BTreeSet::new())),
            ],
            cur: AtomicUsize::new(0),
            stale: AtomicBool::new(false),
            own: AtomicBool::new(false),
        }
    }

    /// The published set, under the held lock `held`.
    fn listed(&'static self, held: MutexGuard<'static, ()>) -> Listed {
        let cur = self.cur.load(Ordering::Acquire);
        // SAFETY: the lock is held (no change meanwhile); a published set
        // is whole (module docs), never dropped.
        let set = unsafe { &**self.sets[cur].get() };
        Listed { _held: held, set }
    }

    /// The set, locked.
    pub(super) fn locked(&'static self) -> Listed {
        self.listed(self.lock.lock())
    }

    /// The set, locked, if its lock is had within about 2 ms
    /// (`sys::pause`'s 26 rounds, as `fdtable`'s fork_prepare), for the
    /// exit flush: `None` if still held — by this thread (a signal
    /// handler's `exit` over an `fdopen` or `fclose` of its own) or by
    /// another that holds it that long — and at once if this process
    /// recorded no stream ([`Streams::own`]: none of its own to flush;
    /// its lock may not be made, `ForkLock::try_lock` answering `None`
    /// each time).
    pub(super) fn trying(&'static self) -> Option<Listed> {
        if !self.own.load(Ordering::Acquire) {
            return None;
        }
        for round in 0..26 {
            if let Some(held) = self.lock.try_lock() {
                return Some(self.listed(held));
            }
            sys::pause(round);
        }
        None
    }

    /// Adds `cookie` (a stream of this process's).
    pub(super) fn insert(&self, cookie: usize) {
        self.change(|s| {
            s.insert(cookie);
        });
        self.own.store(true, Ordering::Release);
    }

    /// Removes `cookie` (listed or not).
    pub(super) fn remove(&self, cookie: usize) {
        self.change(|s| {
            s.remove(&cookie);
        });
    }

    /// Makes `op` to both sets (module docs): the spare, the publication,
    /// the other.
    fn change(&self, op: impl Fn(&mut BTreeSet<usize>)) {
        let _held = self.lock.lock();
        let cur = self.cur.load(Ordering::Relaxed);
        // SAFETY: the lock is held: no reader nor other change meanwhile
        // (a forked child's copy is read by its only thread); two
        // distinct cells.
        let (whole, spare) =
            unsafe { (&mut *self.sets[cur].get(), &mut *self.sets[1 - cur].get()) };
        if self.stale.swap(true, Ordering::Relaxed) {
            // Leaked, not dropped: it may be half changed. (Written over
            // whatever its header holds: any bit pattern of a `BTreeSet`'s
            // fields is valid to overwrite, and `ManuallyDrop` drops
            // nothing.)
            *spare = ManuallyDrop::new(BTreeSet::clone(whole));
        }
        op(spare);
        #[cfg(test)]
        tests::at(tests::Point::BeforePublish);
        self.cur.store(1 - cur, Ordering::Release);
        fence(Ordering::SeqCst);
        #[cfg(test)]
        tests::at(tests::Point::AfterPublish);
        op(whole);
        self.stale.store(false, Ordering::Relaxed);
    }

    /// The atfork child handler's part: the list's lock, which a thread
    /// of the parent's may have held at the fork, starts afresh; the
    /// published set (the parent's streams) is kept, the spare made again
    /// at the first change ([`Streams::stale`]); none of the streams is
    /// this process's ([`Streams::own`]). Three stores: no lock, no
    /// allocation.
    pub(super) fn fork_child(&self) {
        self.lock.forget();
        self.stale.store(true, Ordering::Relaxed);
        self.own.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
