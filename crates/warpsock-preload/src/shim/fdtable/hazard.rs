//! Hazard pointers for the descriptor table's look-up of a data call
//! ([`super::with_marked`]): the entry a call uses is kept alive by the
//! calling thread's published pointer, not by a reference count taken and
//! dropped per call (three `lock`-prefixed instructions, with the read
//! lock's two more, on every data call of a managed socket).
//!
//! Each thread that makes a managed data call claims one slot of
//! [`HAZARDS`] for its life ([`mine`]; given back by the destructor of a
//! POSIX thread-specific key made once, [`prepare`]). A look-up publishes the entry's address in the slot, then
//! reads the table again: if the entry is still there, a writer that
//! removes it later sees the slot when it retires the entry
//! ([`Retired::retire`], after its swap: both sides are sequentially
//! consistent, so one of the two sees the other), and keeps it until the
//! slot no longer names it. Retired entries wait in a list scanned at
//! every change of the table; each one in it was named by some slot at the
//! last scan, so after a scan the list holds at most one entry per slot
//! (plus, during a change, the one being retired). The list is linked
//! through the entries' own [`Node`]s, and a scan hands what it frees back
//! the same way ([`Freed`]).
//!
//! A look-up's end, its reclaim, and a thread's first claim allocate
//! nothing (no `malloc`, `calloc` or `realloc`; review r18-xhaz 4a, 4c).
//! The claim records the slot with `pthread_setspecific`, not a Rust
//! thread-local with a destructor, whose registration callocs. glibc
//! stores a key below `PTHREAD_KEY_2NDLEVEL_SIZE` (32) in the thread's
//! own descriptor; a higher key's first store in a thread callocs, so a
//! key of 32 or more (libraries loaded before this one made 32 keys) is
//! not used: every thread then takes the locked look-up ([`prepare`]).
//! The key is made when the library is loaded, among a process's first.
//!
//! A reclaim does *free*: the nodes it takes out of the list, and a
//! socket whose last reference one of them held (its drop closes and
//! frees) — as the call's own last `Arc` did on the locked path — and it
//! may take out entries kept for other threads' calls too. A signal
//! handler that interrupted `malloc` or `free` and whose call's socket
//! another thread closed meanwhile can therefore still deadlock in
//! `free` (r20-xhaz2a item 1: open).
//!
//! The call that kept an entry frees it when it ends, as the `Arc` it
//! used to hold would have: a writer that keeps an entry because a slot
//! names it raises the slot's `nudge` and reads the slot again; the call
//! clears its slot (a swap) and then reads the nudge ([`end`]). Of the
//! writer's nudge-then-read and the call's clear-then-read, one sees the
//! other: either the writer finds the slot cleared and frees the entry
//! itself, or the call sees the nudge and scans the list ([`reclaim`],
//! cold). So a socket closed or demoted while a call is inside it — in
//! that call (the last residue byte's `recv`), or by another thread — is
//! dropped when the call returns, not at some later change of the table
//! — or, for a call made by a signal handler over its thread's hold of
//! the table's lock (or the instructions before its try), when that hold
//! ends: the scan needs the lock ([`super::defer_reclaim`]).
//!
//! A call that finds its thread's slot in use — a signal handler that
//! interrupted a call between its look-up and its end — and a thread that
//! found every slot taken use the locked look-up with a reference count
//! instead ([`super::get_marked`]); so does a handler that interrupts a
//! thread's first claim of a slot (the thread's value is [`NONE`] until
//! the claim is complete).
//!
//! After `fork` the child gives back the slots of the threads that did not
//! follow it ([`release_lost`]): one of them may name an address freed in
//! the parent, which a new entry of the child's may reuse (and would then
//! be kept for good when removed), and they would stay owned. The list
//! the parent left is forgotten in the child ([`Retired::forget`]).

use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, Ordering};

use libc::c_void;

use super::super::guard;
use super::Entry;

/// A table entry as the low table holds it (a `Box`'s pointer): the
/// object and the link of the retired list ([`Retired`], [`Freed`]).
pub(super) struct Node {
    /// The descriptor's object.
    pub(super) entry: Entry,
    /// The next node of the list this one is in: written and read under
    /// the table's write lock, or by the [`Freed`] that owns the node.
    next: AtomicPtr<Self>,
}

impl Node {
    /// A new node of `entry`, owned by the returned pointer
    /// (`Box::into_raw`).
    pub(super) fn new(entry: Entry) -> *mut Self {
        Box::into_raw(Box::new(Self {
            entry,
            next: AtomicPtr::new(null_mut()),
        }))
    }
}

/// Slots: threads making managed data calls at once with the fast look-up.
pub(super) const SLOTS: usize = 256;

/// One thread's hazard: its published entry and the writers' nudge, alone
/// in their cache line pair (a thread writes its slot twice per call: no
/// other thread's slot shares the line, nor the adjacent-line prefetch).
#[repr(C, align(128))]
pub(super) struct Slot {
    /// The entry a call of the owning thread uses (null: none).
    hazard: AtomicPtr<Node>,
    /// Raised by a writer that kept an entry this slot named: the call
    /// scans the retired list at its end ([`end`]).
    nudge: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            hazard: AtomicPtr::new(null_mut()),
            nudge: AtomicBool::new(false),
        }
    }
}

/// The slots (32 KiB of `.bss`).
pub(super) static HAZARDS: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// Whether a live thread owns the slot.
static OWNED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];

/// The thread-local value of a thread that may not take a slot (a slot's
/// address is never 1).
const NONE: usize = 1;

/// [`KEY`] before it is made.
const NO_KEY: u32 = u32::MAX;

/// The thread-specific key whose value is a thread's slot number plus
/// one, and whose destructor gives the slot back ([`release`]).
static KEY: AtomicU32 = AtomicU32::new(NO_KEY);

/// [`KEY`] when the key made was [`KEY_LIMIT`] or more: no thread claims
/// a slot.
const UNUSABLE: u32 = u32::MAX - 1;

/// glibc's `PTHREAD_KEY_2NDLEVEL_SIZE`: a key below it is stored in the
/// thread's descriptor; a higher one's first store in a thread callocs
/// (module docs).
const KEY_LIMIT: libc::pthread_key_t = 32;

/// `k` if a claim may record a slot with it (no allocation).
pub(super) fn usable(k: libc::pthread_key_t) -> Option<libc::pthread_key_t> {
    (k < KEY_LIMIT).then_some(k)
}

/// Makes [`KEY`] (when the library is loaded; else at the first claim);
/// `None` while it cannot be made, or for good if it is not [`usable`].
#[cold]
pub(super) fn prepare() -> Option<libc::pthread_key_t> {
    let k = KEY.load(Ordering::Acquire);
    if k != NO_KEY {
        return usable(k);
    }
    let mut new: libc::pthread_key_t = 0;
    // SAFETY: a key with a plain extern "C" destructor that never unwinds.
    if unsafe { libc::pthread_key_create(&mut new, Some(release)) } != 0 {
        return None;
    }
    let mine = match usable(new) {
        Some(k) => k,
        None => {
            // SAFETY: our own key, never used.
            unsafe { libc::pthread_key_delete(new) };
            UNUSABLE
        }
    };
    match KEY.compare_exchange(NO_KEY, mine, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => usable(mine),
        Err(won) => {
            if mine != UNUSABLE {
                // SAFETY: our own key, never used.
                unsafe { libc::pthread_key_delete(new) };
            }
            usable(won)
        }
    }
}

/// [`KEY`]'s destructor: the thread exits; its slot (`v`, the number plus
/// one) is given back.
extern "C" fn release(v: *mut c_void) {
    let i = (v as usize).wrapping_sub(1);
    if i < SLOTS {
        // Calls made by later destructors of this thread take the locked
        // path.
        guard::slot().set(NONE);
        end(&HAZARDS[i]);
        OWNED[i].store(false, Ordering::Release);
    }
}

/// The slot number the thread claimed (its [`KEY`] value), if any.
fn own_slot() -> Option<usize> {
    let k = usable(KEY.load(Ordering::Acquire))?;
    // SAFETY: a key made by `prepare`.
    let v = unsafe { libc::pthread_getspecific(k) } as usize;
    v.checked_sub(1).filter(|&i| i < SLOTS)
}

/// The calling thread's slot for a look-up, if it has one free for it.
#[inline]
pub(super) fn mine() -> Option<&'static Slot> {
    let h = match guard::slot().get() {
        0 => claim()?,
        NONE => return None,
        // SAFETY: a slot's address (`claim`): a static.
        a => unsafe { &*(a as *const Slot) },
    };
    // In use: this thread is inside a call that looked its entry up (a
    // signal handler interrupted it). That entry stays protected.
    h.hazard.load(Ordering::Relaxed).is_null().then_some(h)
}

/// Claims a free slot for the calling thread (its first managed data
/// call), or marks the thread as one that takes none.
#[cold]
#[inline(never)]
fn claim() -> Option<&'static Slot> {
    // First: a signal handler that interrupts the claim takes the locked
    // look-up (it claims no second slot). The address is written last.
    guard::slot().set(NONE);
    claim_with(prepare())
}

/// [`claim`] with `key` ([`prepare`]'s; none: the thread takes no slot).
#[cold]
#[inline(never)]
pub(super) fn claim_with(key: Option<libc::pthread_key_t>) -> Option<&'static Slot> {
    let slot = guard::slot();
    let key = key?;
    for (i, owned) in OWNED.iter().enumerate() {
        // Before the slot is owned: a `fork` made by a signal handler
        // between here and the key's store keeps it in the child
        // ([`release_lost`]; review r20-xhaz2a item 9).
        CLAIMING.set(i);
        if owned
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        #[cfg(test)]
        tests::owned_in_claim(i);
        // Given back at the thread's exit (after its thread-locals'
        // destructors, whose calls may still use it).
        // SAFETY: `prepare`'s key; the value is a number, not a pointer.
        if unsafe { libc::pthread_setspecific(key, (i + 1) as *const c_void) } != 0 {
            owned.store(false, Ordering::Release);
            CLAIMING.set(usize::MAX);
            return None;
        }
        CLAIMING.set(usize::MAX);
        #[cfg(test)]
        tests::during_claim();
        let h = &HAZARDS[i];
        slot.set(h as *const Slot as usize);
        return Some(h);
    }
    CLAIMING.set(usize::MAX);
    None
}

thread_local! {
    /// The slot the thread is claiming (`usize::MAX`: none): a slot owned
    /// but not yet recorded under the key. No destructor: no registration,
    /// and the library's static TLS block holds it.
    static CLAIMING: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// A slot for one look-up of a call that may neither take the table's
/// lock nor use its thread's slot ([`super::held`]): any slot no thread
/// owns (the last first: threads claim the first), owned until
/// [`give_back`].
pub(super) fn borrow() -> Option<&'static Slot> {
    let i = OWNED.iter().rposition(|o| {
        o.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    Some(&HAZARDS[i])
}

/// Ends [`borrow`]'s look-up (as [`end`]) and gives its slot back.
pub(super) fn give_back(h: &'static Slot) {
    end(h);
    let i = (h as *const Slot as usize - HAZARDS.as_ptr() as usize) / size_of::<Slot>();
    OWNED[i].store(false, Ordering::Release);
}

/// A forked child (its only thread, the table's lock held): gives back
/// every slot but the calling thread's, cleared. Their threads did not
/// follow the fork; no look-up of the child uses them.
pub(super) fn release_lost() {
    let own = own_slot().unwrap_or(usize::MAX);
    // A claim the fork interrupted (a signal handler's) owns its slot.
    let claiming = CLAIMING.get();
    for (i, (h, owned)) in HAZARDS.iter().zip(&OWNED).enumerate() {
        if i != own && i != claiming {
            h.hazard.store(null_mut(), Ordering::Relaxed);
            h.nudge.store(false, Ordering::Relaxed);
            owned.store(false, Ordering::Release);
        }
    }
}

/// Publishes the entry `at` holds in `h` (the caller's slot, empty) and
/// returns it, still in the table after publication; or returns null (the
/// slot empty again) if the table holds none.
#[inline]
pub(super) fn protect(h: &Slot, at: &AtomicPtr<Node>) -> *mut Node {
    let mut p = at.load(Ordering::Acquire);
    if p.is_null() {
        return p;
    }
    loop {
        #[cfg(test)]
        tests::between();
        h.hazard.store(p, Ordering::SeqCst);
        #[cfg(test)]
        tests::after_publish();
        let q = at.load(Ordering::SeqCst);
        if q == p {
            return p;
        }
        // A writer may have seen `p` here and kept it: as a call's end,
        // before `q` (if any) is published — not when the call on `q` ends
        // (review r18 item 1).
        end(h);
        if q.is_null() {
            return q;
        }
        p = q;
    }
}

thread_local! {
    /// The entry whose protection the calling thread's [`end`] ended, while
    /// its reclaim runs: the one entry of what that reclaim frees that the
    /// thread had a call on ([`Freed`]'s drop). No destructor: nothing
    /// registered.
    static ENDING: std::cell::Cell<*mut Node> = const { std::cell::Cell::new(null_mut()) };
}

/// Ends a look-up's protection (its call is over); frees what a writer
/// kept for it meanwhile.
#[inline]
pub(super) fn end(h: &Slot) {
    // A swap (`xchg`: a full barrier), not a plain store: the nudge's load
    // below must not pass it (against the writer's nudge-then-read,
    // `Retired::named`).
    let p = h.hazard.swap(null_mut(), Ordering::SeqCst);
    #[cfg(test)]
    tests::after_end();
    if h.nudge.load(Ordering::SeqCst) {
        nudged(h, p);
    }
}

#[cold]
#[inline(never)]
fn nudged(h: &Slot, p: *mut Node) {
    // Reset before the scan: a writer that nudges again after this holds
    // the table's lock before or after the scan, and either way the entry
    // it keeps is seen by one of the two.
    h.nudge.store(false, Ordering::SeqCst);
    // A call made in a signal or atfork handler over code of this thread
    // that holds the map's lock, or is about to try it, would deadlock on
    // `reclaim`'s write lock: the scan runs when that hold ends instead
    // (review r18-xhaz item 2).
    if !super::defer_reclaim() {
        // (A reclaim deferred to the end of a hold knows no call's entry:
        // whatever it frees is dropped as another thread's.)
        struct Back(*mut Node);
        impl Drop for Back {
            fn drop(&mut self) {
                ENDING.set(self.0);
            }
        }
        let _back = Back(ENDING.replace(p));
        super::reclaim();
    }
}

/// Entries taken out of the table whose memory a slot may still name: a
/// list linked through the nodes.
pub(super) struct Retired(*mut Node);

// SAFETY: the nodes are owned `Box<Node>`s (`Entry` is `Send + Sync`),
// reached only under the table's lock.
unsafe impl Send for Retired {}
// SAFETY: as above (shared only as the table's, under its lock).
unsafe impl Sync for Retired {}

/// Nodes a scan freed (a list, owned): dropped, after the table's lock is
/// let go, with their entries.
pub(super) struct Freed(*mut Node);

impl Freed {
    /// No node.
    pub(super) const fn none() -> Self {
        Self(null_mut())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_null()
    }
}

impl Drop for Freed {
    #[inline(never)]
    fn drop(&mut self) {
        // The rest on a local: if one entry's drop panics, unwinding drops
        // the rest (review r20-xhaz2a item 4), as a `Vec`'s would.
        if self.0.is_null() {
            return;
        }
        let mut rest = Self(std::mem::replace(&mut self.0, null_mut()));
        let own = ENDING.get();
        while !rest.0.is_null() {
            let mine = rest.0 == own;
            // SAFETY: a node of this list, owned by it (`Retired::scan`).
            let n = unsafe { Box::from_raw(rest.0) };
            rest.0 = n.next.load(Ordering::Relaxed);
            // Only the entry of the call this thread just ended is a drop
            // of its own: the others were kept for other threads' calls
            // (or for none), and their sockets' closes must not wait in
            // this thread (`without_close_waits`, review r26-b item 1).
            if mine {
                drop(n);
            } else {
                super::without_close_waits(|| drop(n));
            }
        }
    }
}

impl Retired {
    pub(super) const fn new() -> Self {
        Self(null_mut())
    }

    /// Retires `p` (an entry the caller has just swapped out of the table,
    /// under its lock) and frees as [`Retired::scan`].
    pub(super) fn retire(&mut self, p: *mut Node) -> Freed {
        // SAFETY: `p` is out of the table and in no list: the caller's.
        unsafe { (*p).next.store(self.0, Ordering::Relaxed) };
        self.0 = p;
        self.scan()
    }

    /// Takes out every retired entry no slot names any more (under the
    /// table's lock); the entries returned may be dropped — after the
    /// lock is let go: an entry's drop may be its socket's last
    /// reference, whose drop may come back to the table. Allocates
    /// nothing (relinks the nodes).
    pub(super) fn scan(&mut self) -> Freed {
        if self.0.is_null() {
            return Freed::none();
        }
        // Against each look-up's publish-then-read: the swap before this
        // and the scan after it (module docs).
        fence(Ordering::SeqCst);
        let (mut kept, mut free) = (null_mut(), null_mut());
        let mut p = self.0;
        while !p.is_null() {
            // SAFETY: a node of the list, owned by it (under the lock).
            let n = unsafe { &*p };
            let next = n.next.load(Ordering::Relaxed);
            // Out of the table and named by no slot: no look-up can reach
            // it any more (a later one reads the table, which no longer
            // holds it); retired once.
            let to = if Self::named(p) { &mut kept } else { &mut free };
            n.next.store(*to, Ordering::Relaxed);
            *to = p;
            p = next;
        }
        self.0 = kept;
        #[cfg(test)]
        if !free.is_null() {
            super::hooks::IN_DROP.fetch_add(1, Ordering::SeqCst);
        }
        Freed(free)
    }

    /// Whether a slot names `p`, nudged so that its call frees `p` at its
    /// end: the nudge is raised before the slot is read again, and the
    /// call reads it after clearing the slot ([`end`]).
    fn named(p: *mut Node) -> bool {
        HAZARDS.iter().any(|h| {
            if h.hazard.load(Ordering::SeqCst) != p {
                return false;
            }
            #[cfg(test)]
            tests::in_named();
            h.nudge.store(true, Ordering::SeqCst);
            h.hazard.load(Ordering::SeqCst) == p
        })
    }

    /// Forgets every retired entry (a forked child: the parent's
    /// sockets' references, never dropped there).
    pub(super) fn forget(&mut self) {
        self.0 = null_mut();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;
    use std::sync::atomic::Ordering;

    thread_local! {
        /// Run once between a look-up's read of the table and its
        /// publication (a staged race).
        pub(in super::super) static BETWEEN: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    thread_local! {
        /// Run once inside a thread's first claim of a slot, after its
        /// registration (a signal handler there, staged).
        pub(in super::super) static DURING_CLAIM: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    thread_local! {
        /// Run once between a look-up's publication and its second read
        /// of the table (a staged race).
        pub(in super::super) static AFTER_PUBLISH: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    pub(super) fn after_publish() {
        if let Some(f) = AFTER_PUBLISH
            .try_with(|b| b.borrow_mut().take())
            .ok()
            .flatten()
        {
            f();
        }
    }

    thread_local! {
        /// Run once in a scan between its first read of a slot naming
        /// the entry and the nudge (a staged race).
        pub(in super::super) static IN_NAMED: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    thread_local! {
        /// Run once in a look-up's end between the clearing of its slot
        /// and its look at the nudge (a staged race).
        pub(in super::super) static AFTER_END: RefCell<Option<Box<dyn FnOnce()>>> =
            const { RefCell::new(None) };
    }

    pub(super) fn after_end() {
        if let Some(f) = AFTER_END.try_with(|b| b.borrow_mut().take()).ok().flatten() {
            f();
        }
    }

    pub(super) fn in_named() {
        if let Some(f) = IN_NAMED.try_with(|b| b.borrow_mut().take()).ok().flatten() {
            f();
        }
    }

    /// A [`super::Freed`] list of `entries`, in order.
    pub(in super::super) fn freed(entries: Vec<super::Entry>) -> super::Freed {
        let mut head = std::ptr::null_mut();
        for e in entries.into_iter().rev() {
            let p = super::Node::new(e);
            // SAFETY: a new node of this list's.
            unsafe { (*p).next.store(head, Ordering::Relaxed) };
            head = p;
        }
        super::Freed(head)
    }

    /// Clears `h` without its end's reclaim (as if a scan had freed what
    /// a removal kept for it first).
    pub(in super::super) fn clear(h: &super::Slot) {
        h.hazard.store(std::ptr::null_mut(), Ordering::SeqCst);
        h.nudge.store(false, Ordering::SeqCst);
    }

    /// The slot `h`'s published pointer, nudge, and whether it is owned.
    pub(in super::super) fn state(h: &super::Slot) -> (usize, bool, bool) {
        let i = super::HAZARDS
            .iter()
            .position(|x| std::ptr::eq(x, h))
            .expect("a slot");
        (
            h.hazard.load(Ordering::SeqCst) as usize,
            h.nudge.load(Ordering::SeqCst),
            super::OWNED[i].load(Ordering::SeqCst),
        )
    }

    pub(super) fn between() {
        if let Some(f) = BETWEEN.try_with(|b| b.borrow_mut().take()).ok().flatten() {
            f();
        }
    }

    thread_local! {
        /// Run once inside a thread's claim right after the slot's
        /// ownership, before the key's store (a signal handler there,
        /// staged), with the slot's number.
        pub(in super::super) static OWNED_IN_CLAIM: RefCell<Option<OnSlot>> =
            const { RefCell::new(None) };
    }

    /// A staged step given a slot's number.
    pub(in super::super) type OnSlot = Box<dyn FnOnce(usize)>;

    pub(super) fn owned_in_claim(i: usize) {
        if let Some(f) = OWNED_IN_CLAIM
            .try_with(|b| b.borrow_mut().take())
            .ok()
            .flatten()
        {
            f(i);
        }
    }

    pub(super) fn during_claim() {
        if let Some(f) = DURING_CLAIM
            .try_with(|b| b.borrow_mut().take())
            .ok()
            .flatten()
        {
            f();
        }
    }
}
