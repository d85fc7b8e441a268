//! Calls made over the calling thread's own hold of the table's lock: a
//! signal handler that interrupted the thread while it held [`super::MAP`]
//! (inside `close`, `dup2`, a look-up of `setsockopt`, `sendto` or
//! `poll`, a switch) or was about to try it, or another library's atfork
//! handler inside `fork_prepare`'s hold. Taking the lock again there
//! would deadlock the thread on itself (review r19-lead-haz note 5), so
//! such a call never waits for it. A thread that waits for the lock (its
//! try failed) counts a wait besides the hold while it sleeps between
//! tries (`super::wait`): a handler there finds its thread holding
//! nothing and its calls are plain ones, which wait for the lock as any
//! thread's (a `fork_prepare` there takes the lock, and the child gets it
//! free: review r20-xhaz3 item 1; signals are not blocked, review r21-haz
//! items 1, 2). Over a hold:
//!
//! - A look-up takes the lock only if it is free for the asking
//!   (`try_read`). Otherwise a descriptor below [`super::BITS`] is looked
//!   up with no lock, under a hazard slot borrowed for the moment (any
//!   slot no thread owns, [`super::hazard::borrow`]): the call gets the
//!   right socket. With no slot free, or for a higher descriptor, it gets
//!   [`refused`]: a socket every call of which fails with `EDEADLK`; so
//!   do, before they change the program's descriptor, `fcntl(F_SETFL)`,
//!   `ioctl(FIONBIO)` and the names on it ([`is_refused`]).
//! - A change of the table (the `dup` family, a switch or an adoption) is
//!   made only if the write lock is free for the asking; otherwise it
//!   fails with `EDEADLK` and changes nothing (the `dup` calls check
//!   before they duplicate).
//! - `close` of a managed descriptor returns 0 at once and is made when
//!   the thread's last hold ends ([`defer_close`], [`run_closes`]):
//!   programs do not retry a `close` that failed, and one that failed
//!   left the descriptor open for good (review r20-xhaz3 item 2). Until
//!   then the number stays open and managed: the handler's calls on it
//!   still reach the socket (a closed number would give `EBADF`), a
//!   second `close` of it fails with `EBADF`, `dup`s onto or from it
//!   fail with `EDEADLK` as above, no descriptor the handler opens gets
//!   its number, and it is close-on-exec from the `close` on (an exec
//!   from the handler does not pass it on; a fork's child makes the
//!   close too, its object forgotten, as `demote_all` does). The
//!   interrupted call goes on with what it looked up; the close is made
//!   as it lets the lock go, before it returns — as another thread's
//!   `close` made then would be (a socket a call is inside stays alive
//!   until the call ends, [`super::hazard`]). At the end the close is
//!   made only if the number still names the socket it named (another
//!   thread may have closed it, or put another there, meanwhile), or
//!   what the interrupted call itself put there: a `dup` onto the number
//!   ([`super::copy`], one hold) carries the close to the duplicate, and
//!   undoes its change of a number a handler closed plainly before it
//!   (review r21-haz item 4: the close, made at the end of the dup's
//!   look-up, closed the duplicate, and the dup then made the closed
//!   number managed, where the program's next descriptor reached the
//!   socket). The
//!   release runs wherever the hold ends, as a deferred reclaim's drops
//!   do: the kinds call the table holding none of their own locks (only
//!   `interpose`'s adoption lock, which no kind, below it, takes). Refused
//!   with `EDEADLK` as before, the descriptor left open: a number at or
//!   above [`super::BITS`] or with no hazard slot free (its socket is not
//!   found without the lock), or more than [`CLOSES`] in one hold.
//! - Listing the table takes the lock if it is free for the asking (over
//!   a read hold); otherwise a residue socket's demotion lists nothing
//!   (its removal would be refused), and `exec`'s and a forked child's
//!   list the descriptors below [`super::BITS`] with no lock, under one
//!   borrowed hazard slot ([`all`]; nothing with no slot free; the higher
//!   ones never: their map is under the lock).
//!   So a handler's `exec` puts each listed socket's kernel socket at its
//!   number (its removal is refused, moot once the exec is made; an exec
//!   that fails leaves those numbers on the kernel sockets and still in
//!   the table). A forked child's demotion does the same at once and its
//!   removals when the child's hold ends ([`forget_at_hold_end`], where
//!   the numbers the listing missed are demoted too):
//!   until the handler returns, the child's calls on those numbers still
//!   reach the parent's sockets' objects (review r20-xhaz3 item 3). The
//!   listing allocates (as any `exec` or fork demotion does).
//! - `fork_prepare` holds nothing unless the write lock is free for the
//!   asking within about 2 ms of tries (a handler before the try, or
//!   after an unlock, the lock another thread's that lets it go: review
//!   r21-haz item 3): the child's lock is as the parent's threads left
//!   it. Its own thread's interrupted hold ends in the child too (the
//!   handler returns there); a read hold of another thread's at the fork
//!   (the interrupted hold a read one too) never ends there, and the
//!   child's first change of the table waits for it for good; so does the
//!   child of a fork from a handler over the few instructions between the
//!   count's raise (or a wait's sleep's end) and the try, or between an
//!   unlock and the count's lowering, the lock held by another thread for
//!   longer than the tries: the handler cannot tell them from its
//!   thread's hold.
//! - No kind acts on a candidate (`interpose::acting_kind`): no adoption
//!   at `connect`/`sendto`, no hook at `bind`/`accept`, and a switch
//!   (`setsockopt` at the kinds' level) fails with `EDEADLK` — each would
//!   have its side effects (a handshake on the wire, a registration)
//!   before the table refused the new socket. The call stays a plain one
//!   on the kernel socket.
//!
//! Only the table's lock is covered: a handler over its thread's hold of
//! another of the library's locks (a kind's socket state, the adoption
//! lock) can still deadlock there. A handler over the library's own code
//! (the guard set: a kind's call, an adoption, a residue socket's
//! demotion) makes plain calls: a `close` there of a managed number
//! closes the program's descriptor and leaves the table's entry; a
//! demotion forgets such a number rather than open it again (review
//! r21-haz item 4), but an adoption's or a switch's `dup3` over a number
//! closed so after its check opens it again, unmanaged. Known gaps
//! (review r20-xhaz2b): an exec from such a handler demotes no
//! descriptor at or above [`super::BITS`] (nor any, with every hazard
//! slot owned); a fork's child demotes those only when the handler
//! returns. A `siglongjmp` out of a handler over a hold leaves the
//! lock held for good (every change of the table then waits, as any
//! library's lock left so); out of one over the instructions before the
//! try, or over a wait, it leaves the count (and the wait) raised: over
//! the count the thread's calls are refused changes for good, and the
//! work left to a hold's end is never made (closes, reclaims) while
//! either stays raised. Over a wait the lock itself is not held: the
//! alarm-and-`siglongjmp` idiom over a contended look-up leaves the
//! process working (review r21-haz item 2).
//!
//! A data call on a managed descriptor in a handler that interrupted no
//! such hold (the common case: a handler over a blocked `recv`) is not
//! affected: its look-up takes its thread's slot, or the lock.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use libc::{c_int, c_ulong, c_void, msghdr, sockaddr, socklen_t};

use super::super::socket::Socket;
use super::super::sys::{self, errno, set_errno};
use super::super::{guard, real};
use super::{hazard, low_index, Ordering, LOW};

/// Whether the calling thread holds the table's lock, or is about to try
/// it (it is a handler over such code, or that code itself).
#[inline]
pub(crate) fn over_hold() -> bool {
    super::holding(guard::map_held().get()) != 0
}

/// Closes over a hold a thread keeps for its end (a handler's; more
/// nested in one hold than this are refused).
const CLOSES: usize = 8;

/// A reference of an object's kept in [`Closes`] (`Arc::into_raw`: no
/// allocation); `None`: the number alone is closed ([`carry_close`]).
type Kept = Option<NonNull<dyn Socket>>;

/// `s`'s reference, kept.
fn keep(s: Arc<dyn Socket>) -> NonNull<dyn Socket> {
    // SAFETY: `Arc::into_raw` is never null.
    unsafe { NonNull::new_unchecked(Arc::into_raw(s).cast_mut()) }
}

/// The reference [`keep`] kept, back.
fn unkeep(p: NonNull<dyn Socket>) -> Arc<dyn Socket> {
    // SAFETY: made by `keep` (`Arc::into_raw`), taken back once: each
    // kept entry leaves the list as it is taken back.
    unsafe { Arc::from_raw(p.as_ptr()) }
}

/// A thread's closes left to the end of its hold ([`defer_close`]).
struct Closes {
    /// Each descriptor and a reference of its object (its identity at
    /// the end: the object, kept alive, cannot be another at the same
    /// address; review r21-haz item 7).
    fds: [Cell<(c_int, Kept)>; CLOSES],
    /// How many of `fds` are reserved (a slot is reserved by one RMW
    /// before it is filled: [`defer_close`]); a reserved slot not filled
    /// holds `(-1, None)`, which [`run_closes`] skips.
    len: AtomicUsize,
    /// The objects are forgotten, not released (a forked child's).
    forget: Cell<bool>,
}

thread_local! {
    /// No destructor, constant: nothing is allocated or registered at a
    /// handler's first use; the library's static TLS block holds it.
    static LEFT: Closes = const {
        Closes {
            fds: [const { Cell::new((-1, None)) }; CLOSES],
            len: AtomicUsize::new(0),
            forget: Cell::new(false),
        }
    };
}

/// `close(fd)` over the thread's hold (its removal refused): made at the
/// end of the hold, when the lock is free of this thread (module docs,
/// review r20-xhaz3 item 2). `Ok(true)`: left to the end, the close
/// returns 0; `Ok(false)`: `fd` is not managed (a plain close); `Err`:
/// the errno (`EBADF`: already closed so; `EDEADLK`: the socket not
/// found without the lock, or [`CLOSES`] left already).
pub(crate) fn defer_close(fd: c_int) -> Result<bool, c_int> {
    LEFT.with(|d| {
        // The slot is reserved first, in one instruction (a relaxed RMW
        // of the thread's own word: signal-atomic on every target): a
        // nested handler's close over this one (another signal, not
        // blocked in a handler) reserves the next. A load here and a
        // store after the look-up and the syscalls below let it take the
        // same slot, which this call then overwrote: its close, which
        // returned 0, was never made and its kept object leaked (review
        // r21-c item 5, the word's bug of r21-b item 7 one level down).
        let n = d.len.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        super::hooks::in_defer_close();
        let r = fill(d, n, fd);
        if r != Ok(true) {
            // Given back if it is still the last (a nested close made
            // after it holds the next: the slot stays empty, skipped).
            let _ = d
                .len
                .compare_exchange(n + 1, n, Ordering::Relaxed, Ordering::Relaxed);
        }
        r
    })
}

/// [`defer_close`]'s work, with slot `n` reserved.
fn fill(d: &Closes, n: usize, fd: c_int) -> Result<bool, c_int> {
    // The slots below: a nested close's of the same number made while an
    // outer one is between its reservation and its fill is not seen here
    // (both return 0; the end closes the number once).
    if d.fds[..n.min(CLOSES)].iter().any(|e| e.get().0 == fd) {
        return Err(libc::EBADF);
    }
    let Some(s) = super::get(fd) else {
        return Ok(false);
    };
    if is_refused(&s) || n >= CLOSES {
        return Err(libc::EDEADLK);
    }
    // An exec before the hold's end does not pass it on.
    // SAFETY: fcntl on the program's descriptor; no pointers.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFD, 0);
        if fl >= 0 {
            real::fcntl(fd, libc::F_SETFD, (fl | libc::FD_CLOEXEC) as usize);
        }
    }
    d.fds[n].set((fd, Some(keep(s))));
    guard::map_held_or::<{ super::CLOSE_DEFERRED }>(guard::map_held());
    Ok(true)
}

/// The thread's own change of `fd` under its write hold, made by the
/// call a handler's close of `fd` interrupted (a `dup` onto it,
/// [`super::copy`]): the close left to the hold's end follows what `fd`
/// names now (`to`; `None`: nothing, the program's descriptor alone is
/// closed), not what it named before the change (review r21-haz item 4).
/// Another thread's change is not carried: the list is this thread's.
/// Returns the reference kept of the object it named before, which the
/// caller drops after letting the lock go (under the guard).
pub(super) fn carry_close(fd: c_int, to: Option<&Arc<dyn Socket>>) -> Option<Arc<dyn Socket>> {
    if guard::map_held().get() & super::CLOSE_DEFERRED == 0 {
        return None;
    }
    LEFT.with(|d| {
        let n = d.len.load(Ordering::Relaxed).min(CLOSES);
        let e = d.fds[..n].iter().find(|e| e.get().0 == fd)?;
        let before = e.get().1;
        e.set((fd, to.cloned().map(keep)));
        before.map(unkeep)
    })
}

/// At the end of the thread's last hold: each close left to it, if the
/// number still names the object it named (another thread may have
/// closed it since, or put another there); as `close` makes it: the
/// removal, the program's descriptor's close, the object's release
/// (under the guard). A close carried to no object ([`carry_close`])
/// closes the program's descriptor if the number is still not managed.
/// The errno is kept.
pub(super) fn run_closes() {
    let e = errno();
    while let Some((fd, kept, forget)) = LEFT.with(|d| {
        // No hold here (a handler's close is a plain one), but a handler
        // between the slot's read and its emptying (several loads, then
        // several stores) could take a hold of its own, a nested one defer
        // a close, and that hold's end drain the same slot: the kept
        // reference taken back twice (review r22-a item 12). Cold: the
        // take is made with the asynchronous signals blocked.
        let n = d.len.load(Ordering::Relaxed).checked_sub(1)?;
        let (fd, kept) = sys::with_async_signals_blocked(|| {
            let e = d.fds[n.min(CLOSES - 1)].replace((-1, None));
            d.len.store(n, Ordering::Relaxed);
            e
        });
        Some((fd, kept, d.forget.get()))
    }) {
        if fd < 0 {
            // A slot reserved and not filled (its close refused).
            continue;
        }
        let Some(kept) = kept else {
            if super::get(fd).is_none() {
                // The program's descriptor, which it closed (raw: no
                // cancellation point inside the library), with its epoll
                // registrations (as the interposed `close`).
                super::super::epollcarry::before_close(fd, false);
                sys::close(fd);
            }
            continue;
        };
        let kept = unkeep(kept);
        let removed = match super::remove_if(fd, Some(super::address(&kept))) {
            Ok(Some(s)) => {
                // The program's descriptor, which it closed (raw: no
                // cancellation point inside the library), with its epoll
                // registrations (as the interposed `close`).
                super::super::epollcarry::before_close(fd, true);
                sys::close(fd);
                Some(s)
            }
            _ => None,
        };
        if forget {
            std::mem::forget(removed);
            std::mem::forget(kept);
        } else {
            // The kept reference may be the last: dropped under the
            // guard, as the object's release.
            let end = move || {
                if let Some(s) = removed {
                    s.release();
                }
                drop(kept);
            };
            if guard::busy() {
                end();
            } else {
                guard::enter((), end);
            }
        }
    }
    LEFT.with(|d| d.forget.set(false));
    set_errno(e);
}

/// How many slots of the thread's list are reserved.
#[cfg(test)]
pub(super) fn left_len() -> usize {
    LEFT.with(|d| d.len.load(Ordering::Relaxed))
}

/// A forked child: the closes its thread left are made there too (the
/// program closed before it forked), their objects forgotten (a thread
/// that did not follow the fork may hold their state locked).
pub(super) fn closes_forget() {
    // Filled slots only: a reservation not filled yet (a fork from a
    // handler inside a close's update) may be given back in the child,
    // with no close left to run and clear the flag, and the child's next
    // close would have forgotten its object (review r22-a item 11).
    LEFT.with(|d| {
        let n = d.len.load(Ordering::Relaxed).min(CLOSES);
        d.forget.set(d.fds[..n].iter().any(|e| e.get().0 >= 0));
    });
}

/// [`super::all_to_demote`] over the thread's hold: the descriptors below
/// [`super::BITS`], each looked up with no lock under one borrowed hazard
/// slot (none with no slot free); those above are not listed (their map
/// is under the lock). For `exec`'s and a forked child's demotion from a
/// handler (review r20-xhaz3 item 3).
#[cold]
pub(super) fn all() -> Vec<(c_int, Arc<dyn Socket>)> {
    let Some(h) = hazard::borrow() else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for (i, at) in LOW[..super::LOW_TOP.load(Ordering::Acquire)]
        .iter()
        .enumerate()
    {
        let p = hazard::protect(h, at);
        if !p.is_null() {
            // SAFETY: published in the borrowed slot and still in the
            // table after that (as `get`).
            v.push((i as c_int, unsafe { (*p).entry.clone() }));
        }
        hazard::end(h);
    }
    hazard::give_back(h);
    v
}

/// A forked child's demotion over the thread's hold (`demote_all`, its
/// removals refused): every entry is taken out of the table and forgotten
/// when the hold ends ([`forget_all`]).
pub(crate) fn forget_at_hold_end() {
    guard::map_held_or::<{ super::FORGET_DEFERRED }>(guard::map_held());
}

/// [`forget_at_hold_end`]'s work, at the end of the thread's last hold:
/// as `demote_all` (the lock free now): each entry's kernel descriptor
/// is put at its number (again, for those the handler's listing put
/// there), then removed, the objects forgotten (their state may be
/// locked by a thread that did not follow the fork). A number the
/// listing over the hold missed (at or above [`super::BITS`], or with no
/// hazard slot free) was left naming the doorbell's end, unmanaged, its
/// calls reaching the doorbell (review r21-haz item 5).
pub(super) fn forget_all() {
    for (fd, s) in super::all() {
        // SAFETY: fcntl/dup3 on the program's descriptors and the
        // socket's; no pointers.
        unsafe {
            let fdfl = real::fcntl(fd, libc::F_GETFD, 0);
            if fdfl >= 0 {
                sys::set_nonblocking(s.demote_fd(), s.nonblocking());
                let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
                    libc::O_CLOEXEC
                } else {
                    0
                };
                real::dup3(s.demote_fd(), fd, cloexec);
            }
        }
        if let Ok(Some(old)) = super::remove_if(fd, Some(super::address(&s))) {
            std::mem::forget(old);
        }
        std::mem::forget(s);
    }
}

/// The object of managed descriptor `fd` for a look-up over its thread's
/// hold (module docs): by a borrowed slot, or [`refused`].
#[cold]
pub(super) fn get(fd: c_int) -> Option<Arc<dyn Socket>> {
    if let Some(i) = low_index(fd) {
        if let Some(h) = hazard::borrow() {
            let p = hazard::protect(h, &LOW[i]);
            // SAFETY: published in the borrowed slot and still in the
            // table after that (as `with_marked`'s fast path).
            let s = (!p.is_null()).then(|| unsafe { (*p).entry.clone() });
            hazard::give_back(h);
            return s;
        }
    }
    refused()
}

/// The socket whose every call fails with `EDEADLK` (made when the library
/// is loaded: a handler must not allocate).
static REFUSED: OnceLock<Arc<dyn Socket>> = OnceLock::new();

/// Makes [`REFUSED`].
pub(super) fn prepare() {
    REFUSED.get_or_init(|| Arc::new(Refused));
}

/// [`REFUSED`], if made.
pub(super) fn refused() -> Option<Arc<dyn Socket>> {
    REFUSED.get().cloned()
}

/// Whether `s` is [`REFUSED`]: a call whose effect is outside the socket
/// (the program's descriptor's flags: `fcntl(F_SETFL)`, `FIONBIO`) fails
/// before it is made rather than succeed half (review r20-xhaz2b item 4).
pub(crate) fn is_refused(s: &Arc<dyn Socket>) -> bool {
    REFUSED.get().is_some_and(|r| Arc::ptr_eq(r, s))
}

/// See [`REFUSED`].
struct Refused;

/// Fails the call: `EDEADLK`, -1.
fn deadlock() -> c_int {
    set_errno(libc::EDEADLK);
    -1
}

impl Socket for Refused {
    fn kernel_fd(&self) -> c_int {
        -1
    }
    fn add_ref(&self) {}
    fn release(&self) {}
    fn nonblocking(&self) -> bool {
        false
    }
    fn set_nonblocking(&self, _: bool) {}
    unsafe fn recvmsg(&self, _: &mut msghdr, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn sendmsg(&self, _: &msghdr, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn recv_one(&self, _: *mut c_void, _: usize, _: c_int) -> isize {
        deadlock() as isize
    }
    unsafe fn send_one(&self, _: *const c_void, _: usize, _: c_int) -> isize {
        deadlock() as isize
    }
    fn connect(&self, _: *const sockaddr, _: socklen_t) -> c_int {
        deadlock()
    }
    fn bind(&self, _: *const sockaddr, _: socklen_t) -> c_int {
        deadlock()
    }
    fn setsockopt(&self, _: c_int, _: c_int, _: *const c_void, _: socklen_t) -> c_int {
        deadlock()
    }
    fn shutdown(&self, _: c_int) -> c_int {
        deadlock()
    }
    fn ioctl(&self, _: c_ulong, _: usize) -> c_int {
        deadlock()
    }
    fn getsockopt(&self, _: c_int, _: c_int, _: *mut c_void, _: *mut socklen_t) -> c_int {
        deadlock()
    }
}
