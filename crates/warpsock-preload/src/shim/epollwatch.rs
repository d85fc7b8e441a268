//! The program's epoll sets watch managed sockets' connections themselves.
//!
//! A managed socket's number names its doorbell end ([`super::doorbell`]):
//! an epoll set hears of the socket's input only once someone rings. While
//! the program waited in `epoll_wait` that was the progress thread: woken
//! for each arrival, it made the socket's round and rang, and only then
//! was the program's wait woken — two wake-ups in series per message, and
//! a bell written, collected and drained (an 8 B ping-pong in an epoll
//! loop took ~1.2× the round trip of the same loop in `poll`, which
//! watches the connection itself: `interpose::wait`).
//!
//! Here, when the program registers a managed socket whose kind names a
//! descriptor to watch ([`Socket::direct_watch`]: a DDP socket's TCP
//! connection) in an epoll set it made ([`super::epollcarry`]'s list),
//! that descriptor is registered in the same set, edge-triggered for
//! input, with a *tag* as its data: the process's random base and the
//! place of the registration's entry here. Input on the connection wakes
//! the program's own `epoll_wait` with the tag. The interposed call
//! (`interpose::wait::epoll`) takes the tag out of its results and
//! makes the socket's round on its own thread ([`Socket::direct_arrival`]).
//! When the program's one registration of the socket, in that set alone
//! (an idle watch elsewhere, below, does not count),
//! is a plain one for input (level- or edge-triggered, not one-shot, not
//! exclusive: [`Reg::reported`]), the round rings no bell and the call
//! reports the program's event itself in the tag's place, with the
//! program's data: the system calls of a plain TCP socket's wake-up. Any
//! other registration gets the bell, and the call collects what the
//! kernel then reports, without waiting, so that one-shot and exclusive
//! wake-ups keep the kernel's rules — and so do the socket's other
//! registrations (a `dup`'s, another set's): the round took the input
//! from under their watches, whose edges then found nothing to report. A wake-up that turns out to be
//! nothing for the program waits again for the rest of its time. A socket
//! so covered needs no progress thread for input ([`Socket::direct_cover`]).
//!
//! The registrations are followed through the interposed `epoll_ctl` (ADD
//! covers, MOD changes what is reported, DEL of the last registration
//! in a set leaves the watch idle there until the process's next epoll
//! wait, which ends it — an event loop that moves a connection between
//! reading and writing with a `DEL` and an `ADD` per message keeps it
//! watched: [`Table::uncover`]), the registrations
//! a swap carries onto a new managed socket
//! ([`super::epollcarry::dup3_carrying_sets`]), the socket's end
//! ([`forget`]), and the set's close ([`set_closed`]). A covered socket
//! found registered again after its set's number was closed behind the
//! interposer (`close_range`) is looked at again: the set's own
//! registration of the watched descriptor is asked for (`EPOLL_CTL_MOD`)
//! — except for an entry idle since before the process last made a set
//! through the interposer (the `ADD` after a `DEL`): its number would
//! name another set only if the set was closed behind the interposer
//! (`close_range`, a raw `close`) and another took the number by a
//! system call that makes no set through it (`dup`, `F_DUPFD`,
//! `SCM_RIGHTS`, a raw `epoll_create1`) before the `ADD` — that set would
//! not watch the socket. An idle watch (after a `DEL`) is the socket's
//! only epoll watch until the next wait: the progress thread's is off
//! meanwhile, so a raw `epoll_wait`'s set (below) hears nothing of its
//! input in between (its sends, one-sided operations, `select` and
//! `poll` keep the progress thread as before).
//!
//! Where this cannot follow, the socket falls back to the progress thread
//! ([`Socket::direct_failed`]): a set this process did not make (inherited
//! from a parent, made by a raw system call), a registration the kernel
//! refuses (`max_user_watches`), more than [`ENTRIES_MAX`] registrations.
//! After a `fork` the parent's sets may be waited on by the child too,
//! which could take a tag's edge meant for the parent: from then on the
//! parent's epoll waits use the progress thread as well ([`fallback`]),
//! and the child leaves its parent's tags out of its results unprocessed
//! ([`FOREIGN`]).
//!
//! Tags: the base has its top bit set (no user-space address, descriptor
//! number or small count has it) and 31 random bits, chosen at the first
//! registration of a socket to watch (a process without DDP sockets
//! never makes one). A registration of the program's whose data has
//! the base (~one chance in 2^31 for data with the top bit set) turns the
//! process's epoll waits to the progress thread from then on
//! ([`program_data`]), but its own events are still taken for tags (not
//! reported, or reported as another registration's): a program that
//! keeps such values (hashes, tagged pointers with the top bit) as data
//! should run with `WARPSOCK_DDP_EPOLL_DIRECT=0`.
//!
//! Not covered: a registration made by a raw `epoll_ctl` system call, and a
//! raw `epoll_wait` system call. A socket registered only that way is
//! watched by no set here and stays on the progress thread
//! (`XSocket::set_epoll_background`); one also registered through libc
//! is taken as covered, and the raw registration's set may then miss its
//! input. A raw wait returns the tags to the program as its data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use libc::c_int;
use smallvec::SmallVec;
use warpsock_xsock::io::ForkLock;

use super::socket::Socket;

mod table;

use table::address;
pub(crate) use table::{Arrival, Changes, Levels, Table};

/// Bits of a tag that name the entry's place and its generation (the
/// rest is the process's base).
const PLACE_BITS: u32 = 20;
const GEN_BITS: u32 = 12;

/// The most registrations watched at once (places of [`Table`]).
pub(crate) const ENTRIES_MAX: usize = 1 << PLACE_BITS;

/// The mask of a tag's base.
const BASE_MASK: u64 = !((1u64 << (PLACE_BITS + GEN_BITS)) - 1);

/// The events a watched descriptor is registered for in the program's
/// set: edge-triggered input (a connection that stays readable because
/// its socket's round is bounded or its reader is parked wakes no one
/// twice for the same bytes).
const WATCH_EVENTS: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// This process's tag base (0: none chosen yet).
static BASE: AtomicU64 = AtomicU64::new(0);

/// The tag bases of the processes this one was forked from (0: none):
/// their tags are left out of results here, unprocessed. The oldest goes
/// when a fourth generation forks.
pub(crate) static FOREIGN: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Whether a result of `epoll_wait` may hold a tag: a registration was
/// made, here or in a parent. One load per wait otherwise.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The process forked with registrations made (a child may wait on its
/// sets), or a registration of the program's looked like a tag: its epoll
/// waits use the progress thread for every socket ([`fallback`]).
static FALLBACK: AtomicBool = AtomicBool::new(false);

/// Events the interposed `epoll_wait` reported itself for a watched
/// connection's input, with no bell (`ddp_epoll_direct` of
/// `WARPSOCK_STATS`).
pub(crate) static REPORTED: AtomicU64 = AtomicU64::new(0);

/// Whether [`Table::levels`] may hold something (a wait's one load).
static LEVELS: AtomicBool = AtomicBool::new(false);

/// Whether the table may hold idle entries ([`Table::uncover`]; a wait's
/// one load).
static IDLE: AtomicBool = AtomicBool::new(false);

/// Epoll sets the program made through the interposer ([`set_made`]).
static SETS_MADE: AtomicU64 = AtomicU64::new(0);

/// The program made an epoll set (through the interposer).
pub(crate) fn set_made() {
    SETS_MADE.fetch_add(1, Ordering::AcqRel);
}

/// The process's watched registrations. A forked child starts an empty
/// one ([`fork_child`]).
static TABLE: ForkLock<Table> = ForkLock::new();

/// The system calls the table makes, so that its books are tested without
/// a kernel.
pub(crate) trait Kernel {
    /// `epoll_ctl(epfd, op, fd, {events, data})`.
    fn ctl(&self, epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), c_int>;
}

/// The real system call.
struct Real;

impl Kernel for Real {
    fn ctl(&self, epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), c_int> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: a valid event for the call's duration.
        if unsafe { super::real::epoll_ctl(epfd, op, fd, &mut ev) } == 0 {
            Ok(())
        } else {
            Err(super::sys::errno())
        }
    }
}

/// One registration of the program's: its number, events and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reg {
    pub(crate) fd: c_int,
    pub(crate) events: u32,
    pub(crate) data: u64,
}

impl Reg {
    /// Whether a wake-up of the watched descriptor may be reported for
    /// this registration by the interposed call itself (no bell): it asks
    /// for input, and is neither one-shot (the kernel disarms it: a second
    /// report would break the one-thread-per-event rule) nor exclusive.
    pub(crate) fn reported(&self) -> bool {
        self.events & libc::EPOLLIN as u32 != 0
            && self.events & (libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE) as u32 == 0
    }
}

/// Whether `data` is a tag: `Some(true)` this process's, `Some(false)` a
/// parent's, `None` the program's own.
#[inline]
pub(crate) fn tag_kind(data: u64) -> Option<bool> {
    let b = data & BASE_MASK;
    if b & (1 << 63) == 0 {
        return None;
    }
    if b == BASE.load(Ordering::Relaxed) {
        return Some(true);
    }
    FOREIGN
        .iter()
        .any(|f| f.load(Ordering::Relaxed) == b)
        .then_some(false)
}

/// Whether a wait's results may hold tags.
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Whether this process's epoll waits must use the progress thread for
/// every socket: it forked with registrations made, or a registration of
/// the program's looked like a tag (module docs).
pub(crate) fn fallback() -> bool {
    FALLBACK.load(Ordering::Acquire)
}

/// The process's tag base, chosen at the first call: the top bit set, 31
/// random bits.
pub(crate) fn base() -> u64 {
    match BASE.load(Ordering::Acquire) {
        0 => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let b = (h.finish() & BASE_MASK) | 1 << 63;
            match BASE.compare_exchange(0, b, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => b,
                Err(theirs) => theirs,
            }
        }
        b => b,
    }
}

/// Applies coverage changes to their sockets (outside the table's lock:
/// a socket's cover takes its own locks and rings its doorbell).
fn apply(changes: Changes) {
    for (s, on) in changes {
        s.direct_cover(on);
    }
}

/// The program registered `sock` in its epoll set `epfd` as `reg`:
/// watched there if the socket's kind names a descriptor to watch; a
/// socket that cannot be watched falls back to the progress thread.
pub(crate) fn registered(epfd: c_int, sock: &Arc<dyn Socket>, reg: Reg) {
    let Some(watch) = sock.direct_watch() else {
        return;
    };
    if fallback() || !super::epollcarry::made_here(epfd) {
        sock.direct_failed();
        return;
    }
    let base = base();
    ACTIVE.store(true, Ordering::Release);
    outer_used(epfd);
    let covered = held(|t| {
        t.sets_made = SETS_MADE.load(Ordering::Acquire);
        let r = t.cover(&Real, base, epfd, sock, watch, reg);
        IDLE.store(t.has_idle(), Ordering::Release);
        r
    });
    match covered {
        Some(Ok(changes)) => apply(changes),
        Some(Err(_)) | None => sock.direct_failed(),
    }
}

/// The program's `epoll_ctl` `op` of its registration `reg` of `sock` in
/// its set `epfd` (for `EPOLL_CTL_DEL` only `reg.fd` counts).
pub(crate) fn follow(epfd: c_int, op: c_int, reg: Reg, sock: &Arc<dyn Socket>) {
    match op {
        libc::EPOLL_CTL_ADD => registered(epfd, sock, reg),
        libc::EPOLL_CTL_MOD => modified(epfd, sock, reg),
        libc::EPOLL_CTL_DEL => unregistered(epfd, sock, reg.fd),
        _ => return,
    }
    if op != libc::EPOLL_CTL_DEL {
        // The kernel looks at readiness when a registration is added or
        // changed: input a wait reported itself rang no bell, so the
        // registration (a new one, another set's, one re-armed by MOD)
        // would not see it.
        sock.direct_look();
    }
}

/// The program changed its registration `reg` of `sock` in `epfd`.
pub(crate) fn modified(epfd: c_int, sock: &Arc<dyn Socket>, reg: Reg) {
    if active() {
        held(|t| t.modify(epfd, address(sock), reg));
    }
}

/// The program removed its registration by number `fd` of `sock` from
/// its set `epfd` (the set's watch stays until the next wait:
/// [`Table::uncover`]).
pub(crate) fn unregistered(epfd: c_int, sock: &Arc<dyn Socket>, fd: c_int) {
    if !active() {
        return;
    }
    held(|t| {
        t.sets_made = SETS_MADE.load(Ordering::Acquire);
        t.uncover(epfd, address(sock), fd);
        IDLE.store(t.has_idle(), Ordering::Release);
    });
}

/// Before an epoll wait of the process's: the watches that registrations
/// left since ([`Table::uncover`]) end, and their sockets go back to
/// the progress thread. One load while there are none.
pub(crate) fn release_idle() {
    if !IDLE.load(Ordering::Acquire) {
        return;
    }
    let changes = held(|t| {
        let c = t.release_idle(&Real);
        IDLE.store(false, Ordering::Release);
        c
    });
    if let Some(changes) = changes {
        apply(changes);
    }
}

/// A registration of the program's with data `data`: one that looks like
/// one of this process's tags turns its epoll waits to the progress thread
/// before it can be reported (module docs).
pub(crate) fn program_data(data: u64) {
    if BASE.load(Ordering::Relaxed) != 0 && tag_kind(data) == Some(true) {
        FALLBACK.store(true, Ordering::Release);
    }
}

/// The program closes its number `fd` of `sock` (a `dup`'s may live on).
pub(crate) fn number_closed(sock: &Arc<dyn Socket>, fd: c_int) {
    if active() {
        let changes = held(|t| t.number_closed(&Real, address(sock), fd)).unwrap_or_default();
        apply(changes);
    }
}

/// The socket object at `key` ended: no set watches it.
pub(crate) fn forget(key: usize) {
    if active() {
        held(|t| t.forget(&Real, key));
    }
}

/// The program closes its descriptor `fd`: if it is one of its epoll sets
/// that watches sockets, they lose it.
///
/// A plain descriptor's `close` costs a load or two: only a number some
/// entry was made for takes the table's lock ([`OUTERS`]), and not over
/// this thread's own hold of it (a signal handler's `close`: its sockets
/// keep a stale entry, which the next registration there looks at again).
pub(crate) fn set_closed(fd: c_int) {
    if !active() || !outer_seen(fd) {
        return;
    }
    if let Some(changes) = held(|t| t.set_closed(&Real, fd)) {
        apply(changes);
    }
}

/// Numbers of the program's sets that an entry was made for (a bit per
/// number below [`OUTERS_LOW`]; [`OUTERS_HIGH`] for any above): a bit
/// stays until the number's close.
static OUTERS: [AtomicU64; OUTERS_LOW / 64] = [const { AtomicU64::new(0) }; OUTERS_LOW / 64];
const OUTERS_LOW: usize = 4096;
static OUTERS_HIGH: AtomicBool = AtomicBool::new(false);

/// Records that an entry was made for set `outer`.
fn outer_used(outer: c_int) {
    match usize::try_from(outer) {
        Ok(o) if o < OUTERS_LOW => {
            OUTERS[o / 64].fetch_or(1 << (o % 64), Ordering::AcqRel);
        }
        _ => OUTERS_HIGH.store(true, Ordering::Release),
    }
}

/// Whether an entry may have been made for set `fd` (taken off for a
/// low number: it is closing).
fn outer_seen(fd: c_int) -> bool {
    match usize::try_from(fd) {
        Ok(o) if o < OUTERS_LOW => {
            OUTERS[o / 64].fetch_and(!(1 << (o % 64)), Ordering::AcqRel) & (1 << (o % 64)) != 0
        }
        Ok(_) => OUTERS_HIGH.load(Ordering::Acquire),
        Err(_) => false,
    }
}

thread_local! {
    /// This thread holds [`TABLE`]'s lock (a signal handler's call over
    /// the hold must not wait for it). No destructor: read from signal
    /// handlers.
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f` of the table under its lock, `None` over this thread's own hold.
fn held<T>(f: impl FnOnce(&mut Table) -> T) -> Option<T> {
    if HOLDING.with(std::cell::Cell::get) {
        return None;
    }
    let mut g = TABLE.lock();
    HOLDING.with(|h| h.set(true));
    let r = f(&mut g);
    HOLDING.with(|h| h.set(false));
    Some(r)
}

/// What this process's tag `tag` names now.
pub(crate) fn arrival(tag: u64) -> Option<Arrival> {
    held(|t| t.arrival(tag)).flatten()
}

/// A wait reported tag `tag`'s socket itself for a level-triggered
/// registration ([`Table::mark_level`]).
pub(crate) fn mark_level(tag: u64) {
    held(|t| {
        t.mark_level(tag);
        LEVELS.store(!t.levels.is_empty(), Ordering::Release);
    });
}

/// Set `epfd`'s sockets reported at a wait for a level-triggered
/// registration and not looked at since ([`Table::levels`]): each with
/// its registration and tag. One load while there are none.
pub(crate) fn levels(epfd: c_int) -> Levels {
    if !LEVELS.load(Ordering::Acquire) {
        return SmallVec::new();
    }
    held(|t| {
        let out = t.levels(epfd);
        LEVELS.store(!t.levels.is_empty(), Ordering::Release);
        out
    })
    .unwrap_or_default()
}

/// The set of tag `tag` looks at its watched descriptor again
/// (`EPOLL_CTL_MOD` with the same interest: epoll reports a readiness
/// still there at once, an edge for the next wait).
pub(crate) fn look_again(tag: u64) {
    held(|t| {
        if let Some(e) = t.placed(tag) {
            let _ = Real.ctl(e.outer, libc::EPOLL_CTL_MOD, e.watch, WATCH_EVENTS, tag);
        }
    });
}

/// The atfork parent handler's part: a child may wait on the sets the
/// program made, and take a tag's edge meant for this process. One
/// store, no lock.
pub(crate) fn fork_parent() {
    // Also a set made before any registration: the child may wait on it
    // while this process registers in it later (review 43 item 3).
    if active() || super::epollcarry::made_any() {
        FALLBACK.store(true, Ordering::Release);
    }
}

/// The atfork child handler's part: the parent's tags are foreign here
/// (left out of results), the table starts afresh (its registrations are
/// the parent's). No allocation, no lock.
pub(crate) fn fork_child() {
    let b = BASE.swap(0, Ordering::AcqRel);
    if b != 0 {
        let slot = FOREIGN
            .iter()
            .position(|f| f.load(Ordering::Relaxed) == 0)
            .unwrap_or_else(|| {
                // The oldest goes.
                for i in 1..FOREIGN.len() {
                    FOREIGN[i - 1].store(FOREIGN[i].load(Ordering::Relaxed), Ordering::Relaxed);
                }
                FOREIGN.len() - 1
            });
        FOREIGN[slot].store(b, Ordering::Release);
    }
    FALLBACK.store(false, Ordering::Release);
    LEVELS.store(false, Ordering::Release);
    IDLE.store(false, Ordering::Release);
    TABLE.forget();
}

#[cfg(test)]
mod tests;
