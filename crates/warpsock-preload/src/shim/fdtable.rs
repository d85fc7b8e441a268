//! Which descriptors the layer manages.
//!
//! One byte per descriptor ([`mark`]) answers the hot question "is this
//! descriptor anything to us?" with one relaxed atomic load, so calls on
//! every other descriptor (files, pipes, the program's TCP sockets) pass
//! straight through:
//! - [`MANAGED`]: the program's descriptor number refers to a managed
//!   socket; the map holds its object.
//! - otherwise the low bits name the kind (1-based index into
//!   the interposer's `KINDS` table) whose *candidate* the descriptor is: a kernel
//!   socket that may become managed when it binds, connects or sends.
//!
//! The objects of managed descriptors below [`BITS`] are in a table
//! indexed by the number (a look-up is an index, no hash probe: every data
//! call of a managed socket makes one); those at or above [`BITS`] are in a
//! map (and never become candidates). Changes are made under one lock
//! ([`MAP`]). A data call's look-up ([`with_marked`]) takes no lock and
//! no reference: its entry is protected by a hazard pointer ([`hazard`]);
//! other look-ups ([`get`]) clone the object's `Arc` under the lock.
//!
//! A call made over its own thread's hold of the lock (a signal handler
//! that interrupted `close`, or another library's atfork handler inside
//! `fork_prepare`'s hold) never waits for the lock: its look-up takes no
//! lock, and a change it would make fails with `EDEADLK` ([`held`]: what
//! each call does then). A handler over a wait for the lock finds its
//! thread holding nothing: its calls wait as any thread's ([`wait`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};
use std::ptr::null_mut;
use std::sync::atomic::{compiler_fence, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use libc::c_int;

use super::socket::Socket;

mod hazard;

mod held;
pub(crate) use held::{defer_close, forget_at_hold_end, is_refused, over_hold};

mod fork;
#[cfg(test)]
use fork::FORK_GUARD;
pub(crate) use fork::{fork_prepare, fork_release, fork_release_child};

mod wait;
use wait::wait;

mod close_wait;
mod owner;
mod replace;
pub(crate) use close_wait::{close_may_wait, without_close_waits};
pub(crate) use owner::{borrowed, borrowed_here, first_owner};
pub(crate) use replace::replace_if;

/// A managed descriptor's object as the table holds it (in a boxed
/// [`hazard::Node`]: one thin pointer per descriptor, swapped atomically).
type Entry = Arc<dyn Socket>;

/// Descriptors below this have a mark byte.
pub(crate) const BITS: usize = 1 << 16;

/// Mark bit: the descriptor is managed.
pub(crate) const MANAGED: u8 = 0x80;
/// Mark bits naming the kind of a candidate (0: not a candidate).
const KIND_MASK: u8 = 0x7f;

static MARKS: [AtomicU8; BITS] = [const { AtomicU8::new(0) }; BITS];
/// Managed descriptors at or above [`BITS`].
static HIGH: AtomicU64 = AtomicU64::new(0);
static MAP: RwLock<Map> = RwLock::new(Map {
    high: None,
    retired: hazard::Retired::new(),
});

/// A hold of [`MAP`]'s lock, counted in the thread's [`guard::map_held`]
/// from before the lock's try until after it is let go: a call made in a
/// signal handler (or another library's atfork handler, which runs while
/// `fork_prepare`'s hold is kept) over such a hold, or over the few
/// instructions before the try, must not wait for the lock ([`held`]).
/// The end of its look-up then leaves its reclaim to the end of the hold
/// ([`defer_reclaim`]; review r18-xhaz item 2, r19 item 1). The count is
/// raised before the lock's acquiring instruction, so no handler finds
/// the lock taken by its thread and the count not raised; a wait, after a
/// try that failed, counts a [`WAIT`] while it sleeps ([`wait`]), so a
/// handler there finds its thread holding nothing (review r20-xhaz3 item
/// 1, r21-haz items 1, 2).
///
/// [`guard::map_held`]: super::guard::map_held
struct Held<G> {
    // Dropped before `_count` (declaration order): the lock is let go
    // while the count still says held.
    g: G,
    _count: HoldCount,
}

/// [`guard::map_held`]'s bit for a reclaim left by a look-up's end made
/// over a hold. The low bits are the work left to the end of the
/// thread's last hold ([`DEFERRED`]), the rest counts the holds (in
/// [`HOLD`]s): the end of a hold with nothing left and no other hold
/// (every locked look-up's, `poll`'s among them) tests one range.
///
/// [`guard::map_held`]: super::guard::map_held
const RECLAIM_DEFERRED: u32 = 1;

/// [`guard::map_held`]'s bit for closes made over a hold, left to its
/// end ([`held::defer_close`]).
///
/// [`guard::map_held`]: super::guard::map_held
const CLOSE_DEFERRED: u32 = 2;

/// [`guard::map_held`]'s bit for a forked child's demotion made over a
/// hold: every entry is forgotten at its end ([`held::forget_all`]).
///
/// [`guard::map_held`]: super::guard::map_held
const FORGET_DEFERRED: u32 = 4;

/// The bits of [`guard::map_held`] that are not the count.
///
/// [`guard::map_held`]: super::guard::map_held
const DEFERRED: u32 = RECLAIM_DEFERRED | CLOSE_DEFERRED | FORGET_DEFERRED;

/// One wait for the lock in [`guard::map_held`] (above the [`DEFERRED`]
/// bits; [`wait`]): a hold counted while its thread waits for the lock,
/// holding nothing. Up to 15 nested (a handler over a wait that waits).
///
/// [`guard::map_held`]: super::guard::map_held
const WAIT: u32 = DEFERRED + 1;

/// One hold in [`guard::map_held`] (above the [`WAIT`]s).
///
/// [`guard::map_held`]: super::guard::map_held
const HOLD: u32 = WAIT * 16;

/// The holds in `v` (a [`guard::map_held`] value) that are not waits: a
/// call made now is over its thread's hold (or the instructions before
/// its try) if it is above 0.
///
/// [`guard::map_held`]: super::guard::map_held
#[inline]
fn holding(v: u32) -> u32 {
    (v / HOLD).saturating_sub((v / WAIT) % (HOLD / WAIT))
}

/// One count of [`Held`]; never moves to another thread (its count is
/// this thread's).
struct HoldCount(std::marker::PhantomData<*const ()>);

impl HoldCount {
    fn new() -> Self {
        // One instruction: a handler's bit is never lost (review r21-b
        // item 7).
        super::guard::map_held_add::<HOLD>(super::guard::map_held());
        // The count is raised before the lock's acquiring instruction (a
        // handler in between sees it), not merely before the guard exists.
        compiler_fence(Ordering::SeqCst);
        Self(std::marker::PhantomData)
    }
}

impl Drop for HoldCount {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        let c = super::guard::map_held();
        super::guard::map_held_add::<{ HOLD.wrapping_neg() }>(c);
        // Read after the lowering: a handler from here on finds no hold
        // (if this was the last) and sets no bit.
        let v = c.get();
        // A thread waits for the lock (one load; the unlock was before:
        // `Held`'s field order). SeqCst and the fence keep the load after
        // the unlock's atomic ([`wait`]).
        compiler_fence(Ordering::SeqCst);
        if wait::WAITERS.load(Ordering::SeqCst) != 0 {
            wait::wake();
        }
        // No hold left, and work left to the end (one range test).
        if v.wrapping_sub(1) < DEFERRED {
            deferred_work(v);
        }
    }
}

/// The end of the thread's last hold with work left to it (`v`'s
/// [`DEFERRED`] bits): the closes, the child's forgetting and the reclaim
/// a handler left (the lock is free of this thread now). Out of line:
/// the common end stays small.
#[cold]
#[inline(never)]
fn deferred_work(v: u32) {
    if std::thread::panicking() {
        // Unwinding: the bits wait for the next hold's end.
        return;
    }
    super::guard::map_held().set(0);
    if v & CLOSE_DEFERRED != 0 {
        held::run_closes();
    }
    if v & FORGET_DEFERRED != 0 {
        held::forget_all();
    }
    if v & RECLAIM_DEFERRED != 0 {
        reclaim();
    }
}

/// Called by a look-up's end that a removal nudged: if the calling thread
/// holds [`MAP`]'s lock or is about to try it (a signal or atfork handler
/// over that code), marks the reclaim for the end of the thread's last hold and
/// returns true — taking the write lock here would deadlock the thread on
/// itself; otherwise returns false (reclaim now).
fn defer_reclaim() -> bool {
    if holding(super::guard::map_held().get()) == 0 {
        return false;
    }
    super::guard::map_held_or::<RECLAIM_DEFERRED>(super::guard::map_held());
    true
}

impl<G: Deref> Deref for Held<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.g
    }
}

impl<G: DerefMut> DerefMut for Held<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.g
    }
}

/// A call over its thread's hold of [`MAP`]'s lock, which is not free
/// for the asking ([`held`]): the errno it fails with.
const REFUSED: c_int = libc::EDEADLK;

/// [`MAP`]'s read lock, counted ([`Held`]); refused over the thread's
/// own hold unless the lock is free for the asking ([`held`]).
#[inline]
fn read_map() -> Result<Held<RwLockReadGuard<'static, Map>>, c_int> {
    let _count = HoldCount::new();
    #[cfg(test)]
    hooks::before_lock();
    // Free: the one atomic `read` takes too. Only a lock that is not
    // tests the hold (the count is this hold's 1, or more).
    let g = match MAP.try_read() {
        Ok(g) => g,
        Err(e) => read_contended(e)?,
    };
    Ok(Held { g, _count })
}

/// [`read_map`]'s lock when it is not free.
#[cold]
#[inline(never)]
fn read_contended(
    e: TryLockError<RwLockReadGuard<'static, Map>>,
) -> Result<RwLockReadGuard<'static, Map>, c_int> {
    match e {
        TryLockError::Poisoned(e) => Ok(e.into_inner()),
        TryLockError::WouldBlock if guard_count() > 1 => Err(REFUSED),
        TryLockError::WouldBlock => Ok(wait(|| match MAP.try_read() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        })),
    }
}

/// [`MAP`]'s write lock, counted ([`Held`]); refused as [`read_map`].
fn write_map() -> Result<Held<RwLockWriteGuard<'static, Map>>, c_int> {
    let _count = HoldCount::new();
    let g = match MAP.try_write() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) if guard_count() > 1 => return Err(REFUSED),
        Err(TryLockError::WouldBlock) => wait(|| match MAP.try_write() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }),
    };
    Ok(Held { g, _count })
}

/// The calling thread's count of holds of [`MAP`]'s lock (a hold about
/// to try the lock included; its waits not: [`wait`]).
fn guard_count() -> u32 {
    holding(super::guard::map_held().get())
}

/// Drops entries a scan freed (after the map's lock is let go): under the
/// guard, as the sockets' drops are library code whose own calls must not
/// come back through the interposer (review r18-xhaz item 7).
fn drop_freed(free: hazard::Freed) {
    if free.is_empty() {
        return;
    }
    if super::guard::busy() {
        drop(free);
    } else {
        super::guard::enter((), || drop(free));
    }
    #[cfg(test)]
    hooks::IN_DROP.fetch_sub(1, Ordering::SeqCst);
}

/// Staged interleavings and observations for the tests.
#[cfg(test)]
mod hooks;

/// The low table: each descriptor's entry (a [`hazard::Node`]), or
/// null. Written under [`MAP`]'s write lock. Zero-initialised (`.bss`):
/// only the pages of the numbers a process manages are ever touched.
static LOW: [AtomicPtr<hazard::Node>; BITS] = [const { AtomicPtr::new(null_mut()) }; BITS];

/// Above the highest low number ever managed ([`all`]'s bound, read
/// without the lock over a hold: [`held::all`]). Written under [`MAP`]'s
/// write lock.
static LOW_TOP: AtomicUsize = AtomicUsize::new(0);

/// What changes under [`MAP`]'s lock besides the low table.
struct Map {
    /// At or above [`BITS`].
    high: Option<HashMap<c_int, Arc<dyn Socket>, BuildHasherDefault<FdHasher>>>,
    /// Entries out of the low table that a look-up may still use.
    retired: hazard::Retired,
}

impl Map {
    /// Under the read lock (no entry is swapped out meanwhile).
    fn get(&self, fd: c_int) -> Option<Arc<dyn Socket>> {
        match low_index(fd) {
            Some(i) => {
                let p = LOW[i].load(Ordering::Acquire);
                // SAFETY: an entry in the table; writers swap it out only
                // under the write lock.
                (!p.is_null()).then(|| unsafe { (*p).entry.clone() })
            }
            None => self.high.as_ref()?.get(&fd).cloned(),
        }
    }

    /// Puts `new` (None: nothing) at `fd`; returns the object that was
    /// there, and the retired entries the caller drops after letting the
    /// lock go.
    fn swap(&mut self, fd: c_int, new: Option<Entry>) -> (Option<Entry>, hazard::Freed) {
        let Some(i) = low_index(fd) else {
            let old = match new {
                Some(s) => self.high.get_or_insert_with(HashMap::default).insert(fd, s),
                None => self.high.as_mut().and_then(|m| m.remove(&fd)),
            };
            return (old, hazard::Freed::none());
        };
        let at = &LOW[i];
        if new.is_some() {
            // Under the write lock: no other writer.
            LOW_TOP.store(
                LOW_TOP.load(Ordering::Relaxed).max(i + 1),
                Ordering::Release,
            );
        }
        let new = new.map_or(null_mut(), hazard::Node::new);
        let old = at.swap(new, Ordering::SeqCst);
        if old.is_null() {
            return (None, self.retired.scan());
        }
        // SAFETY: the entry just swapped out: alive until retired below.
        let sock = unsafe { (*old).entry.clone() };
        (Some(sock), self.retired.retire(old))
    }
}

impl Map {
    /// [`Map::swap`] and `fd`'s mark (and [`HIGH`]'s count) with it.
    fn put(&mut self, fd: c_int, new: Option<Entry>) -> (Option<Entry>, hazard::Freed) {
        let managed = new.is_some();
        let (old, free) = self.swap(fd, new);
        match MARKS.get(fd as usize) {
            Some(b) if managed => b.store(MANAGED, Ordering::Relaxed),
            Some(b) if old.is_some() => b.store(0, Ordering::Relaxed),
            Some(_) => {}
            None if managed && old.is_none() => {
                HIGH.fetch_add(1, Ordering::Relaxed);
            }
            None if !managed && old.is_some() => {
                HIGH.fetch_sub(1, Ordering::Relaxed);
            }
            None => {}
        }
        (old, free)
    }
}

/// The address of `s`'s object (its identity).
fn address(s: &Arc<dyn Socket>) -> usize {
    Arc::as_ptr(s).cast::<()>() as usize
}

/// The index of `fd` in [`LOW`], if it has one.
#[inline]
fn low_index(fd: c_int) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < BITS)
}

/// Hashes a descriptor number with one multiplication (Fibonacci
/// hashing): the map is looked up on every data call of a managed socket,
/// and the default SipHash cost more than the rest of the lookup.
/// Descriptor numbers are the program's, not a peer's, so there is no
/// flooding to resist.
#[derive(Default)]
pub(crate) struct FdHasher(u64);

impl Hasher for FdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_i32(&mut self, fd: i32) {
        self.0 = u64::from(fd as u32).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The mark of `fd`: 0 for a descriptor the layer ignores (one relaxed
/// load; high descriptors read [`MANAGED`] while any is managed).
#[inline]
pub(crate) fn mark(fd: c_int) -> u8 {
    if fd < 0 {
        return 0;
    }
    match MARKS.get(fd as usize) {
        Some(m) => m.load(Ordering::Relaxed),
        None if HIGH.load(Ordering::Relaxed) != 0 => MANAGED,
        None => 0,
    }
}

/// A number at and above which no descriptor is managed: above the
/// highest low number ever managed, or `c_int::MAX` while a number at or
/// above [`BITS`] is (0: none ever was). Two relaxed loads.
#[inline]
pub(crate) fn managed_below() -> c_int {
    if HIGH.load(Ordering::Relaxed) != 0 {
        return c_int::MAX;
    }
    LOW_TOP.load(Ordering::Relaxed) as c_int
}

/// Whether `fd` may be managed (cheap; may say yes for high descriptors).
#[inline]
pub(crate) fn maybe_managed(fd: c_int) -> bool {
    mark(fd) & MANAGED != 0
}

/// The kind (1-based) whose candidate `fd` is, from its mark.
#[inline]
pub(crate) fn candidate_kind(mark: u8) -> Option<usize> {
    let k = mark & KIND_MASK;
    (mark & MANAGED == 0 && k != 0).then_some(usize::from(k))
}

/// Makes `fd` a candidate of kind `kind` (1-based), or no candidate (0).
pub(crate) fn set_candidate(fd: c_int, kind: usize) {
    if let Some(m) = usize::try_from(fd).ok().and_then(|i| MARKS.get(i)) {
        // Never demotes a managed descriptor: candidates are kernel sockets.
        let _ = m.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            (v & MANAGED == 0).then_some(kind as u8 & KIND_MASK)
        });
    }
}

/// The object of managed descriptor `fd`.
pub(crate) fn get(fd: c_int) -> Option<Arc<dyn Socket>> {
    if !maybe_managed(fd) || borrowed_here(fd) {
        return None;
    }
    get_marked(fd)
}

/// [`get`] of a descriptor whose mark the caller has just read as
/// [`MANAGED`], without loading the mark again.
#[inline]
pub(crate) fn get_marked(fd: c_int) -> Option<Arc<dyn Socket>> {
    match read_map() {
        Ok(m) => m.get(fd),
        Err(_) => held::get(fd),
    }
}

/// The data calls' dispatch: `f` of the object of managed descriptor `fd`
/// (whose mark the caller has just read as [`MANAGED`]), or `none()` if it
/// has none. Below [`BITS`] the object is reached with no lock and no
/// reference count: the calling thread's hazard slot protects it until
/// `f` returns ([`hazard`]); otherwise, or when the thread has no slot
/// free for it, as [`get_marked`].
#[inline]
pub(crate) fn with_marked<R>(
    fd: c_int,
    none: impl FnOnce() -> R,
    f: impl FnOnce(&Arc<dyn Socket>) -> R,
) -> R {
    // A slot is claimed only for a descriptor with an index: not by a
    // thread that only ever calls on high ones (review r18-xhaz 4b).
    if let Some(i) = low_index(fd) {
        if let Some(h) = hazard::mine() {
            let p = hazard::protect(h, &LOW[i]);
            if p.is_null() {
                return none();
            }
            /// Clears the slot when the call is over (a panic included), and
            /// frees what a removal meanwhile kept for it.
            struct Done(&'static hazard::Slot);
            impl Drop for Done {
                fn drop(&mut self) {
                    hazard::end(self.0);
                }
            }
            let _done = Done(h);
            // SAFETY: published in this thread's slot and still in the table
            // after that: a writer that swaps it out keeps it until the slot
            // is cleared (`_done`, after `f`).
            return f(unsafe { &(*p).entry });
        }
    }
    match get_marked(fd) {
        Some(s) => f(&s),
        None => none(),
    }
}

/// Frees the retired entries no look-up uses any more: run at the end of
/// a call whose slot a removal found naming its entry
/// ([`hazard`]'s nudge), so that the socket is dropped when that call
/// returns. Under the guard: the sockets' drops are library code. The
/// call's errno is kept: its return value and errno are set already.
#[cold]
fn reclaim() {
    let errno = super::sys::errno();
    match write_map() {
        Ok(mut m) => {
            #[cfg(test)]
            hooks::RECLAIMS.with(|r| r.set(r.get() + 1));
            let free = m.retired.scan();
            drop(m);
            drop_freed(free);
        }
        // Over a hold (`defer_reclaim` said no: not reached): at its end.
        Err(_) => super::guard::map_held_or::<RECLAIM_DEFERRED>(super::guard::map_held()),
    }
    super::sys::set_errno(errno);
}

/// Records that `fd` refers to `sock`; returns the object `fd` referred to
/// before (whose reference the caller releases). Over the thread's hold
/// of the table's lock, fails with `EDEADLK` ([`held`]) and changes
/// nothing.
pub(crate) fn insert(fd: c_int, sock: Arc<dyn Socket>) -> Result<Option<Arc<dyn Socket>>, c_int> {
    // The first socket put in (a switch's, an adoption's: never per
    // call) sets [`owner::OWNER`], [`borrowed`]'s fast path: the owner of each
    // entry is the entry's own.
    if owner::OWNER.load(Ordering::Acquire) == 0 {
        let _ = owner::OWNER.compare_exchange(
            0,
            super::sys::getpid(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    let mut m = write_map()?;
    // (An atomic count of the kind's: nothing that takes a lock.)
    sock.add_ref();
    let (old, free) = m.put(fd, Some(sock));
    drop(m);
    drop_freed(free);
    Ok(old)
}

/// Whether descriptors `a` and `b` of the process name one open file: the
/// same device and inode. For the files compared here that is the same
/// open file — `a` is a managed socket's (a kernel socket or a doorbell,
/// a socket pair's end), and a socket's inode belongs to one file, which
/// no `open` by path can give a second time. `copy`'s undo: `F_GETFD`
/// said only that the number was open, and another thread's `open` may
/// have been given it after a handler's close (review r21-b item 6).
/// Not `kcmp`: a seccomp filter that kills on unlisted calls (containers)
/// would end the program at its first managed `dup` (review r21-c).
fn same_file(a: c_int, b: c_int) -> bool {
    let id = |fd| {
        // SAFETY: fstat of a descriptor of the process, into a local.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
        }
    };
    matches!((id(a), id(b)), (Some(x), Some(y)) if x == y)
}

/// What [`copy`] did.
pub(crate) enum Copied {
    /// `new` names `old`'s object now; the object it named before (whose
    /// reference the caller releases).
    Managed(Option<Arc<dyn Socket>>),
    /// `old` is not managed: `new` is not either now; the object it named
    /// before.
    Plain(Option<Arc<dyn Socket>>),
}

/// After a `dup` of the program's onto `new` (the interposer's
/// `propagate`): `new` names what `old` names, under one write hold. A
/// signal handler over the hold that closed `new` (left to the hold's
/// end: it named a managed socket) closes what `new` names now, not the
/// object it named before, which this change let go (review r21-haz item
/// 4: the close, made at the end of the look-up's hold, closed the
/// duplicate and the insert then made a closed number managed; the next
/// descriptor the program opened there reached the socket). One closed
/// before the change (a plain close: `new` was not managed) undoes it:
/// `new` no longer names `old`'s file ([`same_file`]; closed, or another
/// file opened there since). Over the thread's hold, fails with `EDEADLK` ([`held`]).
pub(crate) fn copy(old: c_int, new: c_int) -> Result<Copied, c_int> {
    let mut m = write_map()?;
    #[cfg(test)]
    hooks::in_copy();
    let s = m.get(old);
    if let Some(s) = &s {
        s.add_ref();
    }
    let (prev, free) = m.put(new, s.clone());
    let carried = held::carry_close(new, s.as_ref());
    let mut undone = hazard::Freed::none();
    if s.is_some() && !same_file(old, new) {
        let (me, f) = m.put(new, None);
        undone = f;
        if let Some(me) = me {
            me.release();
        }
    }
    drop(m);
    drop_freed(free);
    drop_freed(undone);
    if let Some(c) = carried {
        // Not the last reference (the caller's `prev`): under the guard
        // all the same, as every drop of an object.
        if super::guard::busy() {
            drop(c);
        } else {
            super::guard::enter((), || drop(c));
        }
    }
    Ok(match s {
        Some(_) => Copied::Managed(prev),
        None => Copied::Plain(prev),
    })
}

/// Makes the program's descriptor number `fd` name `target` (a descriptor
/// of ours, e.g. a doorbell end) and records that it refers to `sock`; the
/// close-on-exec flag of `fd` and its epoll registrations are kept. On
/// failure nothing changes and the errno is returned.
pub(crate) fn swap_in(fd: c_int, target: c_int, sock: Arc<dyn Socket>) -> Result<(), c_int> {
    // SAFETY: fcntl/dup3 on the program's descriptor and one of ours.
    let fdfl = unsafe { super::real::fcntl(fd, libc::F_GETFD, 0) };
    if fdfl < 0 {
        return Err(super::sys::errno());
    }
    // Publish before the swap: the kind's paths never use `fd` itself.
    let watched = Arc::clone(&sock);
    let hide = hide_of(&*sock);
    if let Some(old) = insert(fd, sock)? {
        old.release();
    }
    let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // The program may have registered `fd` in an epoll set already (a
    // switch on a connected socket): the registration follows the swap.
    let (n, regs) = super::epollcarry::dup3_carrying_sets(target, fd, cloexec, hide);
    if n < 0 {
        let e = super::sys::errno();
        // Not over a hold: `insert` was not refused.
        if let Ok(Some(me)) = remove(fd) {
            me.release();
        }
        return Err(e);
    }
    for r in regs {
        super::epollwatch::registered(r.epfd, &watched, r.watched(fd));
    }
    Ok(())
}

/// The epoll events `sock`'s kind never shows
/// ([`Socket::never_shows`]), not asked of its descriptor.
pub(crate) fn hide_of(sock: &dyn Socket) -> u32 {
    sock.never_shows() as u16 as u32
}

/// Forgets `fd`; returns its object (whose reference the caller releases).
/// Over the thread's hold of the table's lock, fails with `EDEADLK`
/// ([`held`]) and changes nothing.
pub(crate) fn remove(fd: c_int) -> Result<Option<Arc<dyn Socket>>, c_int> {
    remove_if(fd, None)
}

/// [`remove`], if `fd`'s object is the one at address `only` (if given:
/// [`held::run_closes`]); else nothing changes and `Ok(None)`.
fn remove_if(fd: c_int, only: Option<usize>) -> Result<Option<Arc<dyn Socket>>, c_int> {
    if !maybe_managed(fd) {
        return Ok(None);
    }
    let mut m = write_map()?;
    if only.is_some() && m.get(fd).map(|s| address(&s)) != only {
        return Ok(None);
    }
    let (old, free) = m.put(fd, None);
    drop(m);
    drop_freed(free);
    Ok(old)
}

/// Every managed descriptor and its object (none over the thread's hold
/// of the table's lock, unless it is free for the asking: [`held`]; a
/// residue socket's demotion relies on it, its removal being refused
/// there).
pub(crate) fn all() -> Vec<(c_int, Arc<dyn Socket>)> {
    all_or(Vec::new)
}

/// [`all`] for `exec`'s and a forked child's demotion: over the thread's
/// hold, the descriptors below [`BITS`] are listed with no lock
/// ([`held::all`]; review r20-xhaz3 item 3).
pub(crate) fn all_to_demote() -> Vec<(c_int, Arc<dyn Socket>)> {
    all_or(held::all)
}

/// [`all`], or `over_hold()` over the thread's hold.
fn all_or(
    over_hold: impl FnOnce() -> Vec<(c_int, Arc<dyn Socket>)>,
) -> Vec<(c_int, Arc<dyn Socket>)> {
    let Ok(m) = read_map() else {
        return over_hold();
    };
    let low =
        (0..LOW_TOP.load(Ordering::Acquire)).filter_map(|i| Some((i as c_int, m.get(i as c_int)?)));
    let high = m.high.iter().flatten().map(|(k, v)| (*k, v.clone()));
    low.chain(high).collect()
}

/// When the library is loaded: makes what a thread's first managed data
/// call would otherwise make (the hazard slots' thread-specific key), so
/// that the key is one of the process's first (module docs of `hazard`).
pub(crate) fn prepare() {
    hazard::prepare();
    held::prepare();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `Socket` for a test object that only lives and dies: no data
    /// calls, references not counted; its kernel descriptor -1, or `$fd`
    /// of it.
    macro_rules! inert_socket {
        ($t:ty) => {
            inert_socket!($t, |_: &$t| -1);
        };
        ($t:ty, $fd:expr) => {
            impl Socket for $t {
                fn kernel_fd(&self) -> c_int {
                    ($fd)(self)
                }
                fn add_ref(&self) {}
                fn release(&self) {}
                fn nonblocking(&self) -> bool {
                    false
                }
                fn set_nonblocking(&self, _: bool) {}
                unsafe fn recvmsg(&self, _: &mut libc::msghdr, _: c_int) -> isize {
                    -1
                }
                unsafe fn sendmsg(&self, _: &libc::msghdr, _: c_int) -> isize {
                    -1
                }
            }
        };
    }

    /// The data calls' look-up ([`with_marked`], [`hazard`]).
    mod look_ups;

    /// Look-ups over holds of the map's lock; drops under the guard.
    mod holds;

    /// The handler paths allocate nothing.
    mod allocs;

    /// Calls over the thread's own hold of the lock.
    mod held;

    /// Marks, and objects by number below and above `BITS`.
    mod table;

    /// What the interposer's tests of calls over a hold need of the
    /// table's (`interpose`'s `held_calls`; the table's tests never use
    /// the layers above it).
    pub(crate) mod support {
        pub(crate) use super::held::{inode, Kernel};
        pub(crate) use super::holds::within_a_minute;
        pub(crate) use super::look_ups::serial;
        use super::*;
        pub(crate) use super::{dummy, same};
        pub(crate) use crate::shim::fdtable::hooks::IN_COPY;

        /// The calling thread's hold of the table's write lock (as a
        /// handler over `close`'s removal would find it), until dropped.
        pub(crate) struct WriteHold(#[allow(dead_code)] Held<RwLockWriteGuard<'static, Map>>);

        /// Takes the write hold; panics if the thread is over one already.
        pub(crate) fn hold_write() -> WriteHold {
            WriteHold(write_map().expect("not over a hold"))
        }
    }

    /// A socket of no kind: only its references are counted.
    struct Dummy(std::sync::atomic::AtomicIsize);

    impl Socket for Dummy {
        fn kernel_fd(&self) -> c_int {
            -1
        }
        fn add_ref(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn release(&self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
        fn nonblocking(&self) -> bool {
            false
        }
        fn set_nonblocking(&self, _: bool) {}
        unsafe fn recvmsg(&self, _: &mut libc::msghdr, _: c_int) -> isize {
            -1
        }
        unsafe fn sendmsg(&self, _: &libc::msghdr, _: c_int) -> isize {
            -1
        }
    }

    pub(crate) fn dummy() -> Arc<dyn Socket> {
        Arc::new(Dummy(std::sync::atomic::AtomicIsize::new(0)))
    }

    pub(crate) fn same(a: &Option<Arc<dyn Socket>>, b: &Arc<dyn Socket>) -> bool {
        a.as_ref().is_some_and(|a| Arc::ptr_eq(a, b))
    }
}
